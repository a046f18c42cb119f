//! Parked calls and their approvals, and the signed audit chain of decisions, shared by
//! every host on the database. A call is
//! parked and a lease used only while the writing host's run is live (fenced as tasks
//! are); a decision and each use of a lease are one statement that re-checks the row, so
//! two hosts cannot both run a call approved once.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_postgres::Row;

use super::prepared::Prepared;
use super::rows::{parsed, readable};
use super::sessions::live_run;
use super::{Postgres, now};
use crate::flow::{ArgsDigest, CarriedList};
use crate::ids::ProcessId;
use crate::services::{
    APPROVALS_LIST_MAX, Approval, ApprovalId, Approvals, ChainEntry, ChainRecord, ChainStore,
    Endorsement, GENESIS, HostKey, NewApproval, Operation, ServiceError, Verdict, already_decided,
    endorsements, hash_bytes, no_approval, sealed,
};

const COLUMNS: &str = "id, process, tool, arguments, digest, reason, label, state, requested_at, \
                       decided_at, decided_by, expires_at, uses_left, handles, endorsed";

fn approval_from(row: &Row) -> Result<Approval, ServiceError> {
    Ok(Approval {
        id: ApprovalId::new(row.get::<_, i64>(0) as u64),
        process: parsed(row, 1)?,
        tool: row.get(2),
        arguments: row.get(3),
        digest: parsed(row, 4)?,
        reason: row.get(5),
        label: row.get(6),
        state: parsed(row, 7)?,
        requested_at: row.get(8),
        decided_at: row.get(9),
        decided_by: row.get(10),
        expires_at: row.get(11),
        uses_left: u32::try_from(row.get::<_, i64>(12)).unwrap_or(0),
        handles: parsed::<CarriedList>(row, 13)?.0,
        endorsed: row.get(14),
    })
}

#[async_trait]
impl Approvals for Postgres {
    async fn park(&self, call: NewApproval) -> Result<Approval, ServiceError> {
        let failed = |err| self.failed(Operation::ApprovalsPark, err);
        let client = self.client().await?;
        let (process, digest) = (call.process.to_string(), call.digest.to_string());
        let sql = format!(
            "INSERT INTO approvals (process, tool, arguments, digest, reason, label, state,
                                    requested_at, handles)
             SELECT $1, $2, $3, $4, $5, $6, 'pending', $7, $9 WHERE {}
             ON CONFLICT (process, tool, digest) WHERE state = 'pending' DO NOTHING",
            live_run(8)
        );
        let handles = CarriedList(call.handles.clone()).to_string();
        let inserted = client
            .execute_cached(
                &sql,
                &[
                    &process,
                    &call.tool,
                    &call.arguments,
                    &digest,
                    &call.reason,
                    &call.label,
                    &now(),
                    &self.writer_run(),
                    &handles,
                ],
            )
            .await
            .map_err(failed)?;
        let waiting = client
            .query_opt_cached(
                &format!(
                    "SELECT {COLUMNS} FROM approvals
                     WHERE process = $1 AND tool = $2 AND digest = $3 AND state = 'pending'"
                ),
                &[&process, &call.tool, &digest],
            )
            .await
            .map_err(failed)?;
        match waiting {
            Some(row) => approval_from(&row),
            None if inserted == 0 => Err(self.dropped(&format!("{process}'s parked call"))),
            // Decided between the insert and the read: the caller waits on nothing.
            None => Err(ServiceError::Invalid(format!(
                "{process}'s parked call of `{}` was decided as it was parked; call it again",
                call.tool
            ))),
        }
    }

    async fn get(&self, id: ApprovalId) -> Result<Approval, ServiceError> {
        let client = self.client().await?;
        let row = client
            .query_opt_cached(
                &format!("SELECT {COLUMNS} FROM approvals WHERE id = $1"),
                &[&(id.get() as i64)],
            )
            .await
            .map_err(|err| self.failed(Operation::ApprovalsGet, err))?;
        row.map_or_else(|| Err(no_approval(id)), |row| approval_from(&row))
    }

    async fn list(&self, pending_only: bool, limit: u32) -> Result<Vec<Approval>, ServiceError> {
        let client = self.client().await?;
        let limit = i64::from(limit.clamp(1, APPROVALS_LIST_MAX));
        let rows = client
            .query_cached(
                &format!(
                    "SELECT {COLUMNS} FROM approvals WHERE (NOT $1 OR state = 'pending')
                     ORDER BY id DESC LIMIT $2"
                ),
                &[&pending_only, &limit],
            )
            .await
            .map_err(|err| self.failed(Operation::ApprovalsList, err))?;
        Ok(readable("an approval", &rows, approval_from))
    }

    async fn decide(
        &self,
        id: ApprovalId,
        verdict: Verdict,
        by: &str,
    ) -> Result<Approval, ServiceError> {
        let at = now();
        let (state, expires, uses) = verdict.outcome(at);
        let uses = i64::from(uses);
        let client = self.client().await?;
        let row = client
            .query_opt_cached(
                &format!(
                    "UPDATE approvals SET state = $2, decided_at = $3, decided_by = $4,
                                          expires_at = $5, uses_left = $6, endorsed = $7
                     WHERE id = $1 AND state = 'pending' RETURNING {COLUMNS}"
                ),
                &[
                    &(id.get() as i64),
                    &state.as_str(),
                    &at,
                    &by,
                    &expires,
                    &uses,
                    &verdict.endorses(),
                ],
            )
            .await
            .map_err(|err| self.failed(Operation::ApprovalsDecide, err))?;
        match row {
            Some(row) => approval_from(&row),
            None => Err(already_decided(id, self.get(id).await?.state)),
        }
    }

    async fn take(
        &self,
        process: &ProcessId,
        tool: &str,
        digest: ArgsDigest,
    ) -> Result<Option<Approval>, ServiceError> {
        let client = self.client().await?;
        // The row lock and the outer re-check of `uses_left`: two hosts taking the last
        // use at once, one gets it.
        let sql = format!(
            "UPDATE approvals SET uses_left = uses_left - 1
             WHERE id = (SELECT id FROM approvals
                         WHERE process = $1 AND tool = $2 AND digest = $3
                           AND state = 'approved' AND uses_left > 0 AND expires_at > $4
                         ORDER BY id LIMIT 1 FOR UPDATE)
               AND uses_left > 0 AND {}
             RETURNING {COLUMNS}",
            live_run(5)
        );
        let row = client
            .query_opt_cached(
                &sql,
                &[
                    &process.to_string(),
                    &tool,
                    &digest.to_string(),
                    &now(),
                    &self.writer_run(),
                ],
            )
            .await
            .map_err(|err| self.failed(Operation::ApprovalsTake, err))?;
        row.map(|row| approval_from(&row)).transpose()
    }

    async fn withdraw(&self, id: ApprovalId) -> Result<bool, ServiceError> {
        let client = self.client().await?;
        let changed = client
            .execute_cached(
                "UPDATE approvals SET state = 'withdrawn', decided_at = $2
                 WHERE id = $1 AND state = 'pending'",
                &[&(id.get() as i64), &now()],
            )
            .await
            .map_err(|err| self.failed(Operation::ApprovalsWithdraw, err))?;
        if changed == 0 {
            self.get(id).await?;
        }
        Ok(changed == 1)
    }

    async fn endorsed(&self, process: &ProcessId) -> Result<Vec<Endorsement>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query_cached(
                "SELECT id, handles FROM approvals
                 WHERE process = $1 AND endorsed AND expires_at > $2 ORDER BY id",
                &[&process.to_string(), &now()],
            )
            .await
            .map_err(|err| self.failed(Operation::ApprovalsEndorsed, err))?;
        let lists = readable("an endorsement", &rows, |row| {
            let id = ApprovalId::new(row.get::<_, i64>(0) as u64);
            Ok((id, parsed::<CarriedList>(row, 1)?))
        });
        Ok(endorsements(lists))
    }
}

/// The advisory lock the chain's appends take, one at a time across hosts: "capchain".
const CHAIN_LOCK: i64 = 0x6361_7063_6861_696e;

const CHAIN_COLUMNS: &str =
    "seq, at, event, process, tool, digest, approval, by_whom, detail, key, prev, hash, signature";

fn chain_entry_from(row: &Row) -> Result<ChainEntry, ServiceError> {
    Ok(ChainEntry {
        seq: row.get::<_, i64>(0) as u64,
        at: row.get(1),
        event: parsed(row, 2)?,
        process: row.get(3),
        tool: row.get(4),
        digest: row.get(5),
        approval: row.get::<_, Option<i64>>(6).map(|n| n as u64),
        by: row.get(7),
        detail: row.get(8),
        key: row.get(9),
        prev: row.get(10),
        hash: row.get(11),
        signature: row.get(12),
    })
}

#[async_trait]
impl ChainStore for Postgres {
    async fn append(
        &self,
        record: ChainRecord,
        key: Arc<HostKey>,
    ) -> Result<ChainEntry, ServiceError> {
        let failed = |err| self.failed(Operation::ChainAppend, err);
        let mut client = self.client().await?;
        // One append at a time across hosts: the lock is held to the commit, and the
        // primary key refuses a second row at one place regardless.
        let tx = client.transaction().await.map_err(failed)?;
        tx.execute_cached("SELECT pg_advisory_xact_lock($1)", &[&CHAIN_LOCK])
            .await
            .map_err(failed)?;
        let last = tx
            .query_opt_cached(
                "SELECT seq, hash FROM audit_chain ORDER BY seq DESC LIMIT 1",
                &[],
            )
            .await
            .map_err(failed)?;
        let (seq, prev) = match last {
            Some(row) => {
                let (seq, hash): (i64, String) = (row.get(0), row.get(1));
                let prev = hash_bytes(&hash).ok_or_else(|| {
                    ServiceError::Invalid(format!(
                        "audit chain row {seq} has a damaged hash; `capstan audit verify` shows \
                         where the chain breaks"
                    ))
                })?;
                (seq as u64 + 1, prev)
            }
            None => (1, GENESIS),
        };
        let entry = sealed(&prev, seq, now(), record, &key);
        tx.execute_cached(
            &format!(
                "INSERT INTO audit_chain ({CHAIN_COLUMNS})
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
            ),
            &[
                &(entry.seq as i64),
                &entry.at,
                &entry.event.as_str(),
                &entry.process,
                &entry.tool,
                &entry.digest,
                &entry.approval.map(|n| n as i64),
                &entry.by,
                &entry.detail,
                &entry.key,
                &entry.prev,
                &entry.hash,
                &entry.signature,
            ],
        )
        .await
        .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        Ok(entry)
    }

    async fn entries(&self, after: u64, limit: u32) -> Result<Vec<ChainEntry>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query_cached(
                &format!(
                    "SELECT {CHAIN_COLUMNS} FROM audit_chain WHERE seq > $1 ORDER BY seq LIMIT $2"
                ),
                &[&(after as i64), &i64::from(limit.clamp(1, 1000))],
            )
            .await
            .map_err(|err| self.failed(Operation::ChainEntries, err))?;
        rows.iter().map(chain_entry_from).collect()
    }
}
