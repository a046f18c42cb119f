//! [`GroupCommit`]: writes that arrive together share one transaction.
//!
//! Each writer hands its row over and waits for the commit that holds it, so nothing is
//! acknowledged before it is in the database; what a burst of callers hands over while
//! one transaction commits goes into the next, together. One writer thread at a time
//! drains the queue; it is started by the first row that finds none running and stops
//! when the queue is empty.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::{Store, StoreError};
use crate::services::ServiceError;

/// The most rows one transaction takes; the rest wait for the next.
const MAX_BATCH: usize = 512;

/// Rows of one kind on their way into the store, and the writer that commits them.
pub(super) struct GroupCommit<T> {
    store: Arc<Store>,
    /// Writes one batch in one transaction.
    write: fn(&Store, &[T]) -> Result<(), StoreError>,
    /// Names the write in the error a lost writer gives.
    what: &'static str,
    pending: Mutex<Pending<T>>,
}

/// The queue, and whether a writer is draining it.
struct Pending<T> {
    queue: Vec<(T, oneshot::Sender<Result<(), String>>)>,
    writing: bool,
}

impl<T: Send + 'static> GroupCommit<T> {
    /// A writer of `T` rows into `store` with `write`.
    pub(super) fn new(
        store: Arc<Store>,
        what: &'static str,
        write: fn(&Store, &[T]) -> Result<(), StoreError>,
    ) -> Arc<Self> {
        Arc::new(GroupCommit {
            store,
            write,
            what,
            pending: Mutex::new(Pending {
                queue: Vec::new(),
                writing: false,
            }),
        })
    }

    /// Hands `row` over and returns once the transaction holding it has committed (or
    /// failed, with the store's error).
    pub(super) async fn submit(self: &Arc<Self>, row: T) -> Result<(), ServiceError> {
        let (done, committed) = oneshot::channel();
        let start_writer = {
            let mut pending = self.lock();
            pending.queue.push((row, done));
            !std::mem::replace(&mut pending.writing, true)
        };
        if start_writer {
            let writer = Writer {
                rows: self.clone(),
                finished: false,
            };
            tokio::task::spawn_blocking(move || writer.run());
        }
        match committed.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(ServiceError::Backend(message.into())),
            // The writer went away before it said: its task was dropped unrun (the runtime
            // shutting down) or it failed outside a write.
            Err(_) => Err(ServiceError::Lost(self.what)),
        }
    }

    /// Commits batches until the queue is empty, then stops.
    fn drain(&self) {
        loop {
            let batch: Vec<_> = {
                let mut pending = self.lock();
                if pending.queue.is_empty() {
                    pending.writing = false;
                    return;
                }
                let take = pending.queue.len().min(MAX_BATCH);
                pending.queue.drain(..take).collect()
            };
            let (rows, waiters): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
            // A write that panics fails its batch, not the writer: the rows after it still
            // have one (SQLite rolls the transaction back; the connection stays good).
            let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                (self.write)(&self.store, &rows)
            }));
            let result = match written {
                Ok(result) => result.map_err(|err| self.store.locate(err).to_string()),
                Err(_) => Err(format!(
                    "{}: the write to {} failed unexpectedly (a bug); the call's row was not kept",
                    self.what,
                    self.store.path().display()
                )),
            };
            for waiter in waiters {
                // A caller that stopped waiting (its deadline) no longer needs the answer.
                let _ = waiter.send(result.clone());
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending<T>> {
        // Nothing panics while holding it; a poisoned queue is still a valid queue.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The writer's task. If it ends without draining the queue (dropped unrun because the
/// runtime shuts down, or unwinding), every row still waiting fails as lost and the next
/// row starts a writer of its own: no caller waits for a writer that is gone.
struct Writer<T> {
    rows: Arc<GroupCommit<T>>,
    finished: bool,
}

impl<T: Send + 'static> Writer<T> {
    fn run(mut self) {
        self.rows.drain();
        self.finished = true;
    }
}

impl<T> Drop for Writer<T> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let abandoned = {
            let mut pending = self
                .rows
                .pending
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            pending.writing = false;
            std::mem::take(&mut pending.queue)
        };
        drop(abandoned);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::services::AuditRecord;
    use crate::store::tests::temp_store;

    fn row(n: usize) -> AuditRecord {
        AuditRecord {
            process: format!("worker:{n}"),
            tool: "echo".into(),
            grants: String::new(),
            arguments: "{}".into(),
            outcome: "ok".into(),
            detail: String::new(),
            duration_us: 1,
        }
    }

    fn rows_of(path: &std::path::Path, process: &str) -> i64 {
        let db = rusqlite::Connection::open(path).unwrap();
        db.query_row(
            "SELECT count(*) FROM audit WHERE process = ?1",
            [process],
            |r| r.get(0),
        )
        .unwrap()
    }

    /// Yields until `done` holds: the writer runs on its own thread.
    async fn until(mut done: impl FnMut() -> bool) {
        while !done() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_shares_one_transaction_and_each_caller_hears_after_its_commit() {
        static BATCHES: AtomicUsize = AtomicUsize::new(0);
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let writer = GroupCommit::new(Arc::new(store), "audit.record", |store, rows| {
            BATCHES.fetch_add(1, Ordering::SeqCst);
            store.record_calls(rows)
        });
        // Another connection holds the write lock: the first row's transaction waits.
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let submit = |n: usize| {
            let writer = writer.clone();
            let path = path.clone();
            tokio::spawn(async move {
                writer.submit(row(n)).await.unwrap();
                // Heard only once the row is in the database, for any reader.
                assert_eq!(rows_of(&path, &format!("worker:{n}")), 1);
            })
        };
        let first = submit(0);
        until(|| {
            let pending = writer.lock();
            pending.writing && pending.queue.is_empty()
        })
        .await;
        let rest: Vec<_> = (1..100).map(submit).collect();
        until(|| writer.lock().queue.len() == 99).await;
        holder.execute_batch("COMMIT").unwrap();
        first.await.unwrap();
        for task in rest {
            task.await.unwrap();
        }
        assert_eq!(
            BATCHES.load(Ordering::SeqCst),
            2,
            "one for the first, one for the rest"
        );
        let db = rusqlite::Connection::open(&path).unwrap();
        let all: i64 = db
            .query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
            .unwrap();
        assert_eq!(all, 100);
        until(|| !writer.lock().writing).await;
    }

    #[tokio::test]
    async fn a_failed_write_reaches_every_caller_with_the_database_named() {
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let writer = GroupCommit::<AuditRecord>::new(Arc::new(store), "audit.record", |_, _| {
            Err(StoreError::Sqlite(rusqlite::Error::InvalidQuery))
        });
        let (a, b) = tokio::join!(writer.submit(row(1)), writer.submit(row(2)));
        for err in [a.unwrap_err(), b.unwrap_err()] {
            assert!(
                err.to_string().contains(&path.display().to_string()),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn a_write_that_panics_fails_its_batch_and_the_next_row_is_written() {
        static PANICKED: AtomicBool = AtomicBool::new(false);
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let writer = GroupCommit::new(Arc::new(store), "audit.record", |store, rows| {
            if !PANICKED.swap(true, Ordering::SeqCst) {
                panic!("a write that panics");
            }
            store.record_calls(rows)
        });
        let failed = writer.submit(row(1)).await.unwrap_err().to_string();
        assert!(
            failed.contains("audit.record") && failed.contains("(a bug)"),
            "{failed}"
        );
        writer.submit(row(2)).await.unwrap();
        assert_eq!(rows_of(&path, "worker:2"), 1);
    }

    #[test]
    fn a_row_whose_writer_never_runs_fails_as_lost_and_the_next_is_written() {
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let writer = GroupCommit::new(Arc::new(store), "audit.record", Store::record_calls);
        // A runtime shut down: its blocking pool drops the writer's task unrun.
        let dying = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handle = dying.handle().clone();
        drop(dying);
        let lost = handle.block_on(writer.submit(row(1))).unwrap_err();
        assert!(matches!(lost, ServiceError::Lost("audit.record")), "{lost}");
        assert!(
            !writer.lock().writing,
            "no writer is left marked as running"
        );
        assert!(writer.lock().queue.is_empty());
        let alive = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        alive.block_on(writer.submit(row(2))).unwrap();
        assert_eq!(rows_of(&path, "worker:2"), 1);
    }

    #[test]
    fn appends_batched_in_one_transaction_keep_each_channel_in_order() {
        let (_dir, store) = temp_store();
        let text = |t: &str| serde_json::to_string(t).unwrap();
        store
            .append_histories(&[
                ("channel:a".into(), vec![text("a1"), text("a2")]),
                ("channel:b".into(), vec![text("b1")]),
                ("channel:a".into(), vec![text("a3")]),
            ])
            .unwrap();
        let a: Vec<(u64, String)> = store
            .load_history("channel:a")
            .unwrap()
            .into_iter()
            .map(|entry| (entry.seq, entry.message))
            .collect();
        let expected: Vec<(u64, String)> = (0..).zip(["a1", "a2", "a3"].map(text)).collect();
        assert_eq!(a, expected);
        assert_eq!(store.load_history("channel:b").unwrap().len(), 1);
    }
}
