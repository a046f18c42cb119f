//! Every write's transaction, and the checkpoints of the write-ahead log.
//!
//! [`Store::write`] waits for a lock another process holds (the busy timeout, then
//! [`retry`]): it runs on a blocking thread. [`Store::write_now`] never waits: it gives up
//! at once when the connection is in use or another process holds the write lock, so it
//! may run on the caller's thread, where a commit costs a few microseconds of local I/O
//! (WAL mode with `synchronous = NORMAL` syncs nothing at commit).
//!
//! What does sync is a checkpoint, which copies the log back into the database. SQLite
//! runs one inside the commit that takes the log past 1000 pages; here the log's size is
//! only noted at each commit ([`note_wal_pages`] replaces that automatic checkpoint), and
//! the checkpoint runs after a blocking write, or on a blocking thread of its own after a
//! write that may not wait ([`Store::checkpoint`]).

use std::cell::Cell;
use std::os::raw::c_int;
use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError};
use std::time::Duration;

use rusqlite::hooks::Wal;
use rusqlite::{Connection, Transaction, TransactionBehavior};

use super::{Store, StoreError, retry};

/// Pages in the log past which a commit is followed by a checkpoint: SQLite's own default
/// for its automatic checkpoint.
const CHECKPOINT_PAGES: c_int = 1000;

thread_local! {
    /// Pages in the log after the last commit on this thread, from [`note_wal_pages`].
    static WAL_PAGES: Cell<c_int> = const { Cell::new(0) };
}

/// SQLite's WAL hook: called inside each commit, on the committing thread, with the
/// pages the log holds.
pub(super) fn note_wal_pages(_: &Wal, pages: c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(pages);
    Ok(())
}

/// Pages in the log after the last commit on this thread.
#[cfg(test)]
pub(super) fn wal_pages() -> c_int {
    WAL_PAGES.get()
}

/// Whether the commit just made on this thread left the log due for a checkpoint.
fn checkpoint_due() -> bool {
    WAL_PAGES.get() >= CHECKPOINT_PAGES
}

impl Store {
    /// Runs `body` in an immediate transaction and commits it, waiting (busy timeout, then
    /// retries) while another process holds the database; `body` may run more than once.
    /// A commit that leaves the log due is followed by a checkpoint.
    pub(crate) fn write<T>(
        &self,
        body: impl FnMut(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.write_within(retry::RETRY_FOR, body)
    }

    /// [`Store::write`], retrying while the database is busy for at most `limit`.
    pub(crate) fn write_within<T>(
        &self,
        limit: Duration,
        body: impl FnMut(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        WAL_PAGES.set(0);
        let value = retry::write(|| self.conn(), limit, body)?;
        if checkpoint_due() {
            checkpoint_on(&self.conn(), self);
        }
        Ok(value)
    }

    /// [`Store::write`] without waiting: `None` when the connection is in use or another
    /// process holds the write lock, with nothing written; otherwise the outcome. A commit
    /// that leaves the log due schedules a checkpoint on a blocking thread.
    pub(crate) fn write_now<T>(
        self: &Arc<Self>,
        body: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
    ) -> Option<Result<T, StoreError>> {
        let mut conn = match self.conn.try_lock() {
            Ok(conn) => conn,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        if conn.busy_timeout(Duration::ZERO).is_err() {
            return None;
        }
        WAL_PAGES.set(0);
        let written =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| commit_now(&mut conn, body)));
        // The connection's other users wait for locks as before, even after a panic.
        // (Setting a timeout does not fail on an open connection; if it did, their busy
        // errors are still retried.)
        let _ = conn.busy_timeout(retry::BUSY_TIMEOUT);
        drop(conn);
        let written = written.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match written {
            Err(err) if retry::is_busy(&err) => None,
            written => {
                if written.is_ok() && checkpoint_due() {
                    self.checkpoint_soon();
                }
                Some(written)
            }
        }
    }

    /// Checkpoints the log on a blocking thread, unless one is already on its way; outside
    /// a runtime, here.
    fn checkpoint_soon(self: &Arc<Self>) {
        if self.checkpoint_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let scheduled = Scheduled(self.clone());
                runtime.spawn_blocking(move || scheduled.0.checkpoint());
            }
            Err(_) => self.checkpoint(),
        }
    }

    /// Checkpoints the log (passive: it copies what no reader still needs, and waits for
    /// nobody). Blocks: call it where blocking is allowed. A failure is logged; the next
    /// checkpoint tries again.
    pub(crate) fn checkpoint(&self) {
        let conn = self.conn();
        checkpoint_on(&conn, self);
    }
}

/// A checkpoint scheduled on a blocking thread. If the task is dropped unrun (the runtime
/// shutting down), the next due commit schedules another.
struct Scheduled(Arc<Store>);

impl Drop for Scheduled {
    fn drop(&mut self) {
        self.0.checkpoint_scheduled.store(false, Ordering::Release);
    }
}

/// The immediate transaction of [`Store::write_now`].
fn commit_now<T>(
    conn: &mut Connection,
    body: impl FnOnce(&Transaction<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let value = body(&tx)?;
    tx.commit()?;
    Ok(value)
}

/// Checkpoints `store`'s log on `conn`, then lets the next checkpoint be scheduled.
fn checkpoint_on(conn: &Connection, store: &Store) {
    let done = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
    store.checkpoint_scheduled.store(false, Ordering::Release);
    if let Err(err) = done {
        tracing::warn!(
            database = %store.path().display(),
            "cannot checkpoint the write-ahead log: {err}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::temp_store;

    #[test]
    fn a_commit_that_panics_on_the_callers_thread_leaves_the_busy_timeout_in_force() {
        let (_dir, store) = temp_store();
        let store = Arc::new(store);
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.write_now(|_| -> Result<(), StoreError> { panic!("a write that panics") })
        }));
        assert!(panicked.is_err());
        let timeout: i64 = store
            .conn()
            .query_row("PRAGMA busy_timeout", [], |r| r.get(0))
            .unwrap();
        assert_eq!(timeout, retry::BUSY_TIMEOUT.as_millis() as i64);
    }

    #[test]
    fn a_checkpoint_dropped_unrun_lets_the_next_one_be_scheduled() {
        let (_dir, store) = temp_store();
        let store = Arc::new(store);
        // A runtime shut down: its blocking pool drops the checkpoint's task unrun.
        let dying = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handle = dying.handle().clone();
        drop(dying);
        handle.block_on(async { store.checkpoint_soon() });
        assert!(!store.checkpoint_scheduled.load(Ordering::SeqCst));
    }
}
