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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_recorded_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for (tool, outcome) in [("file_read", "ok"), ("file_write", "denied")] {
            store
                .record_call(&AuditRecord {
                    process: "branch:1".into(),
                    tool: tool.into(),
                    grants: "fs.read".into(),
                    arguments: r#"{"path":"x","password":"hunter2"}"#.into(),
                    outcome: outcome.into(),
                    detail: String::new(),
                    duration_us: 42,
                })
                .unwrap();
        }
        let log = store.audit_log(10).unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(
            (log[0].tool.as_str(), log[0].outcome.as_str()),
            ("file_write", "denied")
        );
        assert!(
            !log[0].arguments.contains("hunter2"),
            "{}",
            log[0].arguments
        );
    }
}
