//! What the hosts on one database are doing: their runs' leases, and which run owns each
//! session, for `capstan status`.

use std::time::SystemTime;

use super::Postgres;
use crate::services::Epoch;
use crate::services::Operation;
use crate::services::{RunId, ServiceError};

/// One host's run and its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStatus {
    /// The run.
    pub run: RunId,
    /// The machine it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: u64,
    /// Whether it is live: not ended, its lease unexpired by the database's clock.
    pub live: bool,
    /// When its lease expires (or expired).
    pub expires_at: SystemTime,
    /// When it ended, if its host recorded it.
    pub ended_at: Option<SystemTime>,
}

/// Which run owns a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionStatus {
    /// The session (channel).
    pub channel: String,
    /// The run that owns it (it may have ended: the next host to write takes it over).
    pub owner: RunId,
    /// The takeovers so far, plus one.
    pub epoch: Epoch,
}

impl Postgres {
    /// The newest `limit` runs, newest first, live or not.
    pub async fn runs(&self, limit: u32) -> Result<Vec<RunStatus>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, host, pid, ended_at IS NULL AND expires_at > now(), expires_at,
                        ended_at
                 FROM runs ORDER BY id DESC LIMIT $1",
                &[&i64::from(limit)],
            )
            .await
            .map_err(|err| self.failed(Operation::StatusRuns, err))?;
        Ok(rows
            .iter()
            .map(|row| RunStatus {
                run: RunId::new(row.get::<_, i64>(0) as u64),
                host: row.get(1),
                pid: row.get::<_, i64>(2) as u64,
                live: row.get(3),
                expires_at: row.get(4),
                ended_at: row.get(5),
            })
            .collect())
    }

    /// Every session and its owner, by channel.
    pub async fn sessions(&self) -> Result<Vec<SessionStatus>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT channel, owner_run, epoch FROM sessions ORDER BY channel COLLATE \"C\"",
                &[],
            )
            .await
            .map_err(|err| self.failed(Operation::StatusSessions, err))?;
        Ok(rows
            .iter()
            .map(|row| SessionStatus {
                channel: row.get(0),
                owner: RunId::new(row.get::<_, i64>(1) as u64),
                epoch: Epoch::new(row.get::<_, i64>(2) as u64),
            })
            .collect())
    }
}
