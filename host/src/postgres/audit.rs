//! The audit log of tool calls and outbound requests.

use async_trait::async_trait;

use super::prepared::Prepared;
use super::sessions::live_run;
use super::{Postgres, now};
use crate::services::Operation;
use crate::services::{
    AuditDestination, AuditEntry, AuditRecord, AuditSink, Costs, CostsBy, CostsOf, Receipt,
    RequestDecision, RequestEntry, RequestRecord, ServiceError,
};

#[async_trait]
impl AuditSink for Postgres {
    async fn record(&self, call: AuditRecord) -> Result<(), ServiceError> {
        let client = self.client().await?;
        let sql = format!(
            "INSERT INTO audit (at, process, tool, grants, arguments, outcome, detail,
                                duration_us, conversation, peak_memory_bytes, bytes_in,
                                bytes_out, requests, requests_refused, request_bytes_sent,
                                request_bytes_received, fuel)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17
             WHERE {}",
            live_run(18)
        );
        let r = &call.receipt;
        let written = client
            .execute_cached(
                &sql,
                &[
                    &now(),
                    &call.process,
                    &call.tool,
                    &call.grants,
                    &call.arguments,
                    &call.outcome,
                    &call.detail,
                    &(call.duration_us as i64),
                    &call.conversation,
                    &r.peak_memory_bytes.map(|n| n as i64),
                    &(r.bytes_in as i64),
                    &(r.bytes_out as i64),
                    &i64::from(r.requests),
                    &i64::from(r.requests_refused),
                    &(r.request_bytes_sent as i64),
                    &(r.request_bytes_received as i64),
                    &r.fuel.map(|n| n as i64),
                    &self.writer_run(),
                ],
            )
            .await
            .map_err(|err| self.failed(Operation::AuditRecord, err))?;
        if written == 0 {
            let what = format!("the audit row of {}'s {} call", call.process, call.tool);
            return Err(self.dropped(&what));
        }
        Ok(())
    }

    async fn page(&self, before: Option<u64>, limit: u32) -> Result<Vec<AuditEntry>, ServiceError> {
        let client = self.client().await?;
        let before = before.map_or(i64::MAX, |id| i64::try_from(id).unwrap_or(i64::MAX));
        let rows = client
            .query_cached(
                "SELECT id, at, process, tool, grants, arguments, outcome, detail, duration_us,
                        conversation, peak_memory_bytes, bytes_in, bytes_out, requests,
                        requests_refused, request_bytes_sent, request_bytes_received, fuel
                 FROM audit WHERE id < $1 ORDER BY id DESC LIMIT $2",
                &[&before, &i64::from(limit)],
            )
            .await
            .map_err(|err| self.failed(Operation::AuditPage, err))?;
        Ok(rows
            .iter()
            .map(|row| {
                let count = |i| row.get::<_, i64>(i) as u64;
                AuditEntry {
                    id: count(0),
                    at: row.get(1),
                    process: row.get(2),
                    tool: row.get(3),
                    grants: row.get(4),
                    arguments: row.get(5),
                    outcome: row.get(6),
                    detail: row.get(7),
                    duration_us: count(8),
                    conversation: row.get(9),
                    receipt: Receipt {
                        peak_memory_bytes: row.get::<_, Option<i64>>(10).map(|n| n as u64),
                        bytes_in: count(11),
                        bytes_out: count(12),
                        requests: count(13) as u32,
                        requests_refused: count(14) as u32,
                        request_bytes_sent: count(15),
                        request_bytes_received: count(16),
                        fuel: row.get::<_, Option<i64>>(17).map(|n| n as u64),
                    },
                }
            })
            .collect())
    }

    async fn costs(&self, by: CostsBy, of: &CostsOf) -> Result<Vec<Costs>, ServiceError> {
        let client = self.client().await?;
        let key = match by {
            CostsBy::Conversation => "conversation",
            CostsBy::Process => "process",
            CostsBy::Tool => "tool",
            CostsBy::Day => "to_char(to_timestamp(at) AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
        };
        // Spelled apart, so a conversation's sums search its index rather than scan it.
        let filter = match of.conversation {
            Some(_) => "conversation = $1",
            None => "$1::TEXT IS NULL",
        };
        // Sums as BIGINT (PostgreSQL sums BIGINTs as NUMERIC); byte order, as SQLite sorts.
        let sql = format!(
            "SELECT {key} COLLATE \"C\" AS k, count(*), count(*) FILTER (WHERE outcome <> 'ok'),
                    sum(duration_us)::BIGINT, max(peak_memory_bytes), sum(bytes_in)::BIGINT,
                    sum(bytes_out)::BIGINT, sum(requests)::BIGINT,
                    sum(requests_refused)::BIGINT, sum(request_bytes_sent)::BIGINT,
                    sum(request_bytes_received)::BIGINT, sum(fuel)::BIGINT
             FROM audit WHERE {filter}
             GROUP BY 1 ORDER BY 1 NULLS FIRST"
        );
        let rows = client
            .query_cached(&sql, &[&of.conversation])
            .await
            .map_err(|err| self.failed(Operation::AuditCosts, err))?;
        Ok(rows
            .iter()
            .map(|row| {
                let sum = |i| row.get::<_, i64>(i) as u64;
                Costs {
                    key: row.get(0),
                    calls: sum(1),
                    failed: sum(2),
                    duration_us: sum(3),
                    peak_memory_bytes: row.get::<_, Option<i64>>(4).map(|n| n as u64),
                    bytes_in: sum(5),
                    bytes_out: sum(6),
                    requests: sum(7),
                    requests_refused: sum(8),
                    request_bytes_sent: sum(9),
                    request_bytes_received: sum(10),
                    fuel: row.get::<_, Option<i64>>(11).map(|n| n as u64),
                }
            })
            .collect())
    }

    async fn record_request(&self, r: RequestRecord) -> Result<(), ServiceError> {
        let client = self.client().await?;
        let sql = format!(
            "INSERT INTO net_requests (at, process, tool, method, scheme, host, port,
                 address, status, bytes_sent, bytes_received, duration_us, decision,
                 grant_rule, detail)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 WHERE {}",
            live_run(16)
        );
        let written = client
            .execute_cached(
                &sql,
                &[
                    &now(),
                    &r.process,
                    &r.tool,
                    &r.method,
                    &r.scheme,
                    &r.host,
                    &i32::from(r.port),
                    &r.address,
                    &r.status.map(i32::from),
                    &(r.bytes_sent as i64),
                    &(r.bytes_received as i64),
                    &(r.duration_us as i64),
                    &r.decision.as_str(),
                    &r.grant,
                    &r.detail,
                    &self.writer_run(),
                ],
            )
            .await
            .map_err(|err| self.failed(Operation::AuditRecordRequest, err))?;
        if written == 0 {
            let what = format!("the audit row of {}'s request to {}", r.process, r.host);
            return Err(self.dropped(&what));
        }
        Ok(())
    }

    async fn recent_requests(&self, limit: u32) -> Result<Vec<RequestEntry>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query_cached(
                "SELECT at, process, tool, method, scheme, host, port, address, status,
                        bytes_sent, bytes_received, duration_us, decision, grant_rule, detail
                 FROM net_requests ORDER BY id DESC LIMIT $1",
                &[&i64::from(limit)],
            )
            .await
            .map_err(|err| self.failed(Operation::AuditRecentRequests, err))?;
        Ok(rows
            .iter()
            .map(|row| {
                let decision: String = row.get(12);
                RequestEntry {
                    at: row.get(0),
                    request: RequestRecord {
                        process: row.get(1),
                        tool: row.get(2),
                        method: row.get(3),
                        scheme: row.get(4),
                        host: row.get(5),
                        port: row.get::<_, i32>(6) as u16,
                        address: row.get(7),
                        status: row.get::<_, Option<i32>>(8).map(|s| s as u16),
                        bytes_sent: row.get::<_, i64>(9) as u64,
                        bytes_received: row.get::<_, i64>(10) as u64,
                        duration_us: row.get::<_, i64>(11) as u64,
                        decision: RequestDecision::parse(&decision)
                            .unwrap_or(RequestDecision::Failed),
                        grant: row.get(13),
                        detail: row.get(14),
                    },
                }
            })
            .collect())
    }

    fn destination(&self) -> AuditDestination {
        AuditDestination::Kept(format!("PostgreSQL at {}", self.location))
    }
}
