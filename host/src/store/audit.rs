//! The audit log in SQLite, one row per call. The types are the services' (`services::audit`),
//! and the arguments arrive redacted (`services::checked`).

use rusqlite::{Transaction, params};

use super::{Store, StoreError, now};
use crate::services::{
    AuditEntry, AuditRecord, Costs, CostsBy, CostsOf, Receipt, RequestDecision, RequestEntry,
    RequestRecord,
};

impl Store {
    /// Records one call as given (the services redact its arguments before it gets here).
    #[cfg(test)]
    pub(crate) fn record_call(&self, record: &AuditRecord) -> Result<(), StoreError> {
        self.record_calls(std::slice::from_ref(record))
    }

    /// Records calls, all in one transaction.
    #[cfg(test)]
    pub(crate) fn record_calls(&self, records: &[AuditRecord]) -> Result<(), StoreError> {
        self.write(|tx| insert_calls(tx, records))
    }

    /// The newest `limit` audit rows, newest first.
    pub fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        self.audit_page(None, limit)
    }

    /// Up to `limit` entries older than entry `before` (all, without it), newest first.
    pub fn audit_page(
        &self,
        before: Option<u64>,
        limit: u32,
    ) -> Result<Vec<AuditEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id, at, process, tool, grants, arguments, outcome, detail, duration_us,
                    conversation, peak_memory_bytes, bytes_in, bytes_out, requests,
                    requests_refused, request_bytes_sent, request_bytes_received, fuel
             FROM audit WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
        )?;
        let before = before.map_or(i64::MAX, |id| i64::try_from(id).unwrap_or(i64::MAX));
        let rows = stmt.query_map(params![before, limit], |row| {
            let count = |i| row.get::<_, i64>(i).map(|n| n as u64);
            Ok(AuditEntry {
                id: count(0)?,
                at: row.get(1)?,
                process: row.get(2)?,
                tool: row.get(3)?,
                grants: row.get(4)?,
                arguments: row.get(5)?,
                outcome: row.get(6)?,
                detail: row.get(7)?,
                duration_us: count(8)?,
                conversation: row.get(9)?,
                receipt: Receipt {
                    peak_memory_bytes: row.get::<_, Option<i64>>(10)?.map(|n| n as u64),
                    bytes_in: count(11)?,
                    bytes_out: count(12)?,
                    requests: count(13)? as u32,
                    requests_refused: count(14)? as u32,
                    request_bytes_sent: count(15)?,
                    request_bytes_received: count(16)?,
                    fuel: row.get::<_, Option<i64>>(17)?.map(|n| n as u64),
                },
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The receipts of the calls `of` holds, summed by `by` where the rows are.
    pub fn audit_costs(&self, by: CostsBy, of: &CostsOf) -> Result<Vec<Costs>, StoreError> {
        let conn = self.conn();
        let key = match by {
            CostsBy::Conversation => "conversation",
            CostsBy::Process => "process",
            CostsBy::Tool => "tool",
            CostsBy::Day => "date(at, 'unixepoch')",
        };
        // Spelled apart, so a conversation's sums search its index rather than scan it.
        let filter = match of.conversation {
            Some(_) => "conversation = ?1",
            None => "?1 IS NULL",
        };
        let sql = format!(
            "SELECT {key} AS k, count(*), sum(outcome <> 'ok'), sum(duration_us),
                    max(peak_memory_bytes), sum(bytes_in), sum(bytes_out), sum(requests),
                    sum(requests_refused), sum(request_bytes_sent), sum(request_bytes_received),
                    sum(fuel)
             FROM audit WHERE {filter}
             GROUP BY k ORDER BY k"
        );
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map([&of.conversation], |row| {
            let sum = |i| row.get::<_, i64>(i).map(|n| n as u64);
            Ok(Costs {
                key: row.get(0)?,
                calls: sum(1)?,
                failed: sum(2)?,
                duration_us: sum(3)?,
                peak_memory_bytes: row.get::<_, Option<i64>>(4)?.map(|n| n as u64),
                bytes_in: sum(5)?,
                bytes_out: sum(6)?,
                requests: sum(7)?,
                requests_refused: sum(8)?,
                request_bytes_sent: sum(9)?,
                request_bytes_received: sum(10)?,
                fuel: row.get::<_, Option<i64>>(11)?.map(|n| n as u64),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Records one outbound request.
    pub fn record_request(&self, request: &RequestRecord) -> Result<(), StoreError> {
        self.record_requests(std::slice::from_ref(request))
    }

    /// Records outbound requests, all in one transaction.
    pub fn record_requests(&self, requests: &[RequestRecord]) -> Result<(), StoreError> {
        self.write(|tx| insert_requests(tx, requests))
    }

    /// The newest `limit` outbound requests, newest first.
    pub fn request_log(&self, limit: u32) -> Result<Vec<RequestEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT at, process, tool, method, scheme, host, port, address, status, bytes_sent,
                    bytes_received, duration_us, decision, grant_rule, detail
             FROM net_requests ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit], |row| {
            let decision: String = row.get(12)?;
            Ok(RequestEntry {
                at: row.get(0)?,
                request: RequestRecord {
                    process: row.get(1)?,
                    tool: row.get(2)?,
                    method: row.get(3)?,
                    scheme: row.get(4)?,
                    host: row.get(5)?,
                    port: row.get(6)?,
                    address: row.get(7)?,
                    status: row.get(8)?,
                    bytes_sent: row.get::<_, i64>(9)? as u64,
                    bytes_received: row.get::<_, i64>(10)? as u64,
                    duration_us: row.get::<_, i64>(11)? as u64,
                    decision: RequestDecision::parse(&decision).unwrap_or(RequestDecision::Failed),
                    grant: row.get(13)?,
                    detail: row.get(14)?,
                },
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// Inserts `records` inside `tx`.
#[cfg(test)]
pub(super) fn insert_calls(
    tx: &Transaction<'_>,
    records: &[AuditRecord],
) -> Result<(), StoreError> {
    let at = now();
    insert_each(tx, records.iter().map(|record| (at, record)))
}

/// A call to record, stamped when it was handed over: its row may be committed later, with
/// its round's.
pub(super) struct StampedCall {
    at: i64,
    call: AuditRecord,
}

impl StampedCall {
    /// `call`, stamped now.
    pub(super) fn now(call: AuditRecord) -> Self {
        StampedCall { at: now(), call }
    }
}

/// Inserts `calls` inside `tx`, each with its own time.
pub(super) fn insert_stamped(
    tx: &Transaction<'_>,
    calls: &[StampedCall],
) -> Result<(), StoreError> {
    insert_each(tx, calls.iter().map(|stamped| (stamped.at, &stamped.call)))
}

fn insert_each<'r>(
    tx: &Transaction<'_>,
    records: impl Iterator<Item = (i64, &'r AuditRecord)>,
) -> Result<(), StoreError> {
    let mut insert = tx.prepare_cached(
        "INSERT INTO audit (at, process, tool, grants, arguments, outcome, detail, duration_us,
             conversation, peak_memory_bytes, bytes_in, bytes_out, requests, requests_refused,
             request_bytes_sent, request_bytes_received, fuel)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)",
    )?;
    for (at, record) in records {
        let r = &record.receipt;
        insert.execute(params![
            at,
            record.process,
            record.tool,
            record.grants,
            record.arguments,
            record.outcome,
            record.detail,
            record.duration_us as i64,
            record.conversation,
            r.peak_memory_bytes.map(|n| n as i64),
            r.bytes_in as i64,
            r.bytes_out as i64,
            r.requests,
            r.requests_refused,
            r.request_bytes_sent as i64,
            r.request_bytes_received as i64,
            r.fuel.map(|n| n as i64)
        ])?;
    }
    Ok(())
}

/// Inserts `requests` inside `tx`.
pub(super) fn insert_requests(
    tx: &Transaction<'_>,
    requests: &[RequestRecord],
) -> Result<(), StoreError> {
    let at = now();
    let mut insert = tx.prepare_cached(
        "INSERT INTO net_requests (at, process, tool, method, scheme, host, port, address,
             status, bytes_sent, bytes_received, duration_us, decision, grant_rule, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?;
    for r in requests {
        insert.execute(params![
            at,
            r.process,
            r.tool,
            r.method,
            r.scheme,
            r.host,
            r.port,
            r.address,
            r.status,
            r.bytes_sent as i64,
            r.bytes_received as i64,
            r.duration_us as i64,
            r.decision.as_str(),
            r.grant,
            r.detail
        ])?;
    }
    Ok(())
}
