//! The audit log in SQLite, one row per call. The types and the redaction are the
//! services' (`services::audit`).

use rusqlite::params;

use super::{Store, StoreError, now, retry};
use crate::services::{AuditEntry, AuditRecord, redact};

impl Store {
    /// Records one call.
    pub fn record_call(&self, record: &AuditRecord) -> Result<(), StoreError> {
        let arguments = redact(&record.arguments);
        let at = now();
        retry::write(&mut self.conn(), |tx| {
            tx.execute(
                "INSERT INTO audit (at, process, tool, grants, arguments, outcome, detail, duration_us)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    at,
                    record.process,
                    record.tool,
                    record.grants,
                    arguments,
                    record.outcome,
                    record.detail,
                    record.duration_us as i64
                ],
            )?;
            Ok(())
        })
    }

    /// The newest `limit` audit rows, newest first.
    pub fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT at, process, tool, grants, arguments, outcome, detail, duration_us
             FROM audit ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit], |row| {
            Ok(AuditEntry {
                at: row.get(0)?,
                process: row.get(1)?,
                tool: row.get(2)?,
                grants: row.get(3)?,
                arguments: row.get(4)?,
                outcome: row.get(5)?,
                detail: row.get(6)?,
                duration_us: row.get::<_, i64>(7)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
