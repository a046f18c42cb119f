//! The audit log of tool calls and outbound requests.

use async_trait::async_trait;

use super::sessions::live_run;
use super::{Postgres, now};
use crate::services::Operation;
use crate::services::{
    AuditDestination, AuditEntry, AuditRecord, AuditSink, RequestDecision, RequestEntry,
    RequestRecord, ServiceError,
};

#[async_trait]
impl AuditSink for Postgres {
    async fn record(&self, call: AuditRecord) -> Result<(), ServiceError> {
        let client = self.client().await?;
        let sql = format!(
            "INSERT INTO audit (at, process, tool, grants, arguments, outcome, detail,
                                duration_us)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8 WHERE {}",
            live_run(9)
        );
        let written = client
            .execute(
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
            .query(
                "SELECT id, at, process, tool, grants, arguments, outcome, detail, duration_us
                 FROM audit WHERE id < $1 ORDER BY id DESC LIMIT $2",
                &[&before, &i64::from(limit)],
            )
            .await
            .map_err(|err| self.failed(Operation::AuditPage, err))?;
        Ok(rows
            .iter()
            .map(|row| AuditEntry {
                id: row.get::<_, i64>(0) as u64,
                at: row.get(1),
                process: row.get(2),
                tool: row.get(3),
                grants: row.get(4),
                arguments: row.get(5),
                outcome: row.get(6),
                detail: row.get(7),
                duration_us: row.get::<_, i64>(8) as u64,
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
            .execute(
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
            .query(
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
