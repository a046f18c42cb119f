//! Parked calls and their approvals, and the signed audit chain of decisions, in SQLite. The types and the rules are the services'
//! (`services::approvals`); each decision and each use of a lease is checked in the
//! write that makes it.

use rusqlite::{OptionalExtension, Row, Transaction, params};

use super::rows::{parsed, readable};
use super::{Store, StoreError, now};
use crate::flow::{ArgsDigest, CarriedList};
use crate::ids::ProcessId;
use crate::services::{
    APPROVALS_LIST_MAX, Approval, ApprovalId, ApprovalState, Endorsement, NewApproval, Verdict,
    already_decided, endorsements, no_approval,
};
use crate::services::{ChainEntry, ChainRecord, GENESIS, HostKey, hash_bytes, sealed};

const COLUMNS: &str = "id, process, tool, arguments, digest, reason, label, state, requested_at, \
                       decided_at, decided_by, expires_at, uses_left, handles, endorsed";

fn approval_from_row(row: &Row<'_>) -> rusqlite::Result<Approval> {
    Ok(Approval {
        id: ApprovalId::new(row.get::<_, i64>(0)? as u64),
        process: parsed(row, 1)?,
        tool: row.get(2)?,
        arguments: row.get(3)?,
        digest: parsed(row, 4)?,
        reason: row.get(5)?,
        label: row.get(6)?,
        state: parsed(row, 7)?,
        requested_at: row.get(8)?,
        decided_at: row.get(9)?,
        decided_by: row.get(10)?,
        expires_at: row.get(11)?,
        uses_left: row.get(12)?,
        handles: parsed::<CarriedList>(row, 13)?.0,
        endorsed: row.get(14)?,
    })
}

fn read(tx: &Transaction<'_>, id: ApprovalId) -> Result<Approval, StoreError> {
    tx.query_row(
        &format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"),
        [id.get() as i64],
        approval_from_row,
    )
    .optional()?
    .ok_or_else(|| StoreError::NotFound(no_approval(id).to_string()))
}

impl Store {
    /// Parks `call`, or returns the pending approval already asking for the same call.
    pub(crate) fn park_call(&self, call: &NewApproval) -> Result<Approval, StoreError> {
        let process = call.process.to_string();
        let digest = call.digest.to_string();
        self.write(|tx| {
            let waiting: Option<i64> = tx
                .query_row(
                    "SELECT id FROM approvals
                     WHERE process = ?1 AND tool = ?2 AND digest = ?3 AND state = 'pending'
                     ORDER BY id LIMIT 1",
                    params![process, call.tool, digest],
                    |row| row.get(0),
                )
                .optional()?;
            let id = match waiting {
                Some(id) => id,
                None => {
                    tx.execute(
                        "INSERT INTO approvals (process, tool, arguments, digest, reason, label,
                                                state, requested_at, handles)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7, ?8)",
                        params![
                            process,
                            call.tool,
                            call.arguments,
                            digest,
                            call.reason,
                            call.label,
                            now(),
                            CarriedList(call.handles.clone()).to_string()
                        ],
                    )?;
                    tx.last_insert_rowid()
                }
            };
            read(tx, ApprovalId::new(id as u64))
        })
    }

    /// Approval `id`.
    pub fn approval(&self, id: ApprovalId) -> Result<Approval, StoreError> {
        self.conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"),
                [id.get() as i64],
                approval_from_row,
            )
            .optional()?
            .ok_or_else(|| StoreError::NotFound(no_approval(id).to_string()))
    }

    /// At most `limit` approvals, newest first; only the pending ones if `pending_only`.
    pub fn approvals(&self, pending_only: bool, limit: u32) -> Result<Vec<Approval>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM approvals WHERE (?1 = 0 OR state = 'pending')
             ORDER BY id DESC LIMIT ?2"
        ))?;
        let limit = limit.clamp(1, APPROVALS_LIST_MAX);
        let rows = stmt.query_map(params![pending_only, limit], approval_from_row)?;
        Ok(readable("an approval", rows)?)
    }

    /// Decides pending approval `id`.
    pub(crate) fn decide_approval(
        &self,
        id: ApprovalId,
        verdict: Verdict,
        by: &str,
    ) -> Result<Approval, StoreError> {
        self.write(|tx| {
            let approval = read(tx, id)?;
            if approval.state != ApprovalState::Pending {
                return Err(StoreError::Invalid(
                    already_decided(id, approval.state).to_string(),
                ));
            }
            let at = now();
            let (state, expires, uses) = verdict.outcome(at);
            tx.execute(
                "UPDATE approvals SET state = ?2, decided_at = ?3, decided_by = ?4,
                                      expires_at = ?5, uses_left = ?6, endorsed = ?7
                 WHERE id = ?1 AND state = 'pending'",
                params![
                    id.get() as i64,
                    state.as_str(),
                    at,
                    by,
                    expires,
                    uses,
                    verdict.endorses()
                ],
            )?;
            read(tx, id)
        })
    }

    /// Takes one use of a live lease covering the call.
    pub(crate) fn take_lease(
        &self,
        process: &ProcessId,
        tool: &str,
        digest: ArgsDigest,
    ) -> Result<Option<Approval>, StoreError> {
        let (process, digest) = (process.to_string(), digest.to_string());
        self.write(|tx| {
            let lease: Option<i64> = tx
                .query_row(
                    "SELECT id FROM approvals
                     WHERE process = ?1 AND tool = ?2 AND digest = ?3 AND state = 'approved'
                       AND uses_left > 0 AND expires_at > ?4
                     ORDER BY id LIMIT 1",
                    params![process, tool, digest, now()],
                    |row| row.get(0),
                )
                .optional()?;
            let Some(id) = lease else {
                return Ok(None);
            };
            tx.execute(
                "UPDATE approvals SET uses_left = uses_left - 1 WHERE id = ?1",
                [id],
            )?;
            read(tx, ApprovalId::new(id as u64)).map(Some)
        })
    }

    /// The values a person endorsed for `process`, while their approvals hold.
    pub(crate) fn endorsed_handles(
        &self,
        process: &ProcessId,
    ) -> Result<Vec<Endorsement>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id, handles FROM approvals
             WHERE process = ?1 AND endorsed = 1 AND expires_at > ?2 ORDER BY id",
        )?;
        let rows = stmt.query_map(params![process.to_string(), now()], |row| {
            let id = ApprovalId::new(row.get::<_, i64>(0)? as u64);
            Ok((id, parsed::<CarriedList>(row, 1)?))
        })?;
        let lists: Vec<(ApprovalId, CarriedList)> = readable("an endorsement", rows)?;
        Ok(endorsements(lists))
    }

    /// Withdraws pending approval `id`: whether it was pending.
    pub(crate) fn withdraw_approval(&self, id: ApprovalId) -> Result<bool, StoreError> {
        self.write(|tx| {
            read(tx, id)?;
            let changed = tx.execute(
                "UPDATE approvals SET state = 'withdrawn', decided_at = ?2
                 WHERE id = ?1 AND state = 'pending'",
                params![id.get() as i64, now()],
            )?;
            Ok(changed == 1)
        })
    }
}

const CHAIN_COLUMNS: &str =
    "seq, at, event, process, tool, digest, approval, by_whom, detail, key, prev, hash, signature";

fn chain_entry_from_row(row: &Row<'_>) -> rusqlite::Result<ChainEntry> {
    Ok(ChainEntry {
        seq: row.get::<_, i64>(0)? as u64,
        at: row.get(1)?,
        event: parsed(row, 2)?,
        process: row.get(3)?,
        tool: row.get(4)?,
        digest: row.get(5)?,
        approval: row.get::<_, Option<i64>>(6)?.map(|n| n as u64),
        by: row.get(7)?,
        detail: row.get(8)?,
        key: row.get(9)?,
        prev: row.get(10)?,
        hash: row.get(11)?,
        signature: row.get(12)?,
    })
}

impl Store {
    /// Appends `record` to the audit chain, signed by `key`, after the last row, in one
    /// write transaction.
    pub(crate) fn append_chain(
        &self,
        record: &ChainRecord,
        key: &HostKey,
    ) -> Result<ChainEntry, StoreError> {
        self.write(|tx| {
            let last: Option<(i64, String)> = tx
                .query_row(
                    "SELECT seq, hash FROM audit_chain ORDER BY seq DESC LIMIT 1",
                    [],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let (seq, prev) = match last {
                Some((seq, hash)) => {
                    let prev = hash_bytes(&hash).ok_or_else(|| {
                        StoreError::Invalid(format!(
                            "audit chain row {seq} has a damaged hash; `capstan audit verify` \
                             shows where the chain breaks"
                        ))
                    })?;
                    (seq as u64 + 1, prev)
                }
                None => (1, GENESIS),
            };
            let entry = sealed(&prev, seq, now(), record.clone(), key);
            tx.execute(
                &format!("INSERT INTO audit_chain ({CHAIN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"),
                params![
                    entry.seq as i64,
                    entry.at,
                    entry.event.as_str(),
                    entry.process,
                    entry.tool,
                    entry.digest,
                    entry.approval.map(|n| n as i64),
                    entry.by,
                    entry.detail,
                    entry.key,
                    entry.prev,
                    entry.hash,
                    entry.signature
                ],
            )?;
            Ok(entry)
        })
    }

    /// At most `limit` audit chain rows after `after`, oldest first.
    pub fn chain_entries(&self, after: u64, limit: u32) -> Result<Vec<ChainEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {CHAIN_COLUMNS} FROM audit_chain WHERE seq > ?1 ORDER BY seq LIMIT ?2"
        ))?;
        let rows = stmt.query_map(
            params![after as i64, limit.clamp(1, 1000)],
            chain_entry_from_row,
        )?;
        // Every row, damaged ones included: the verifier says where the chain breaks.
        Ok(rows.collect::<Result<_, _>>()?)
    }
}
