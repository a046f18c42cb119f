//! Write transactions that survive other processes writing the same database.
//!
//! Every write runs in a `BEGIN IMMEDIATE` transaction, so it takes the write lock before it
//! reads: a read transaction that later upgrades can fail with `SQLITE_BUSY` at once in WAL
//! mode (the busy timeout does not cover it), losing the write. What busy or locked errors
//! remain (the busy timeout ran out under a burst of writers) are retried with a bounded,
//! growing backoff; anything else, or running out of attempts, is returned to the caller.

use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, Transaction, TransactionBehavior};

use super::StoreError;

/// How long each statement waits for a lock held by another connection.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a write keeps retrying while the database stays busy, in all.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(120);

/// How long a write of a conversation's history waits while the database stays busy: one
/// busy timeout. A conversation keeps a history the store refused in memory (and in the
/// spill file) and writes it again, so it goes on answering rather than wait on a lock
/// another process keeps; a busy write has written nothing, so nothing lands twice.
pub(crate) const HISTORY_RETRY_FOR: Duration = BUSY_TIMEOUT;

/// The longest pause between two attempts.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// Whether `err` says another connection holds a lock we need.
pub(crate) fn is_busy(err: &StoreError) -> bool {
    let (StoreError::Sqlite(err) | StoreError::Open { source: err, .. }) = err else {
        return false;
    };
    matches!(
        err.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Runs `op` until it succeeds, fails with something other than busy, or [`RETRY_FOR`]
/// has passed.
pub(crate) fn retry_busy<T>(op: impl FnMut() -> Result<T, StoreError>) -> Result<T, StoreError> {
    retry_busy_for(RETRY_FOR, op)
}

/// [`retry_busy`] for at most `limit`.
pub(crate) fn retry_busy_for<T>(
    limit: Duration,
    mut op: impl FnMut() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match op() {
            Err(err) if is_busy(&err) && started.elapsed() < limit => {
                // Jitter from the clock keeps processes that collided from colliding again.
                let jitter =
                    Duration::from_micros(u64::from(started.elapsed().subsec_micros()) % 1000);
                std::thread::sleep(pause + jitter);
                pause = (pause * 2).min(MAX_PAUSE);
            }
            other => return other,
        }
    }
}

/// Runs `body` in an immediate transaction on the connection `conn` gives and commits it,
/// retrying the whole transaction while the database is busy, for at most `limit`. The
/// connection is taken anew for each attempt, so a write waiting on another process's
/// lock leaves it to this process's other writers between attempts. `body` may run more
/// than once.
pub(crate) fn write<C: std::ops::DerefMut<Target = Connection>, T>(
    mut conn: impl FnMut() -> C,
    limit: Duration,
    mut body: impl FnMut(&Transaction<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    retry_busy_for(limit, || {
        let mut conn = conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let value = body(&tx)?;
        tx.commit()?;
        Ok(value)
    })
}
