//! [`GroupCommit`]: writes that arrive together share one transaction.
//!
//! Each caller hands its row over and waits for the commit that holds it, so nothing is
//! acknowledged before it is in the database; what a burst of callers hands over while
//! one transaction commits goes into the next, together. A caller may also queue rows
//! and wait for them later ([`GroupCommit::enqueue`]): a round of tool calls queues its
//! audit rows and waits once, for one commit.
//!
//! A caller that waits while no write is under way commits what is queued at once, on
//! its own thread ([`Store::write_now`], which never waits for a lock): a hand-off to
//! another thread and back costs several times the commit. If the connection is in use or
//! another process holds the database, or rows queue up meanwhile, one writer thread
//! drains the queue: it is started by the caller that finds none running and stops when
//! the queue is empty.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::Transaction;
use tokio::sync::oneshot;

use super::{Store, StoreError};
use crate::services::Operation;
use crate::services::ServiceError;

/// The most rows one transaction takes; the rest wait for the next.
const MAX_BATCH: usize = 512;

/// The most rows a caller commits on its own thread at once: a bigger batch is left to a
/// writer thread, so no caller holds its thread for long.
const INLINE_BATCH: usize = 64;

/// Writes a batch of rows inside a transaction.
pub(super) type WriteRows<T> = fn(&Transaction<'_>, &[T]) -> Result<(), StoreError>;

/// Rows of one kind on their way into the store, and the writer that commits them.
pub(super) struct GroupCommit<T> {
    store: Arc<Store>,
    /// Writes one batch; the caller commits.
    write: WriteRows<T>,
    /// Names the write in the error a lost writer gives.
    what: Operation,
    /// How long a writer thread retries a batch while the database is busy.
    retry_for: Duration,
    pending: Mutex<Pending<T>>,
}

/// The queue, and who is writing.
struct Pending<T> {
    queue: Vec<(T, oneshot::Sender<Result<(), String>>)>,
    writing: Writing,
}

/// Who is writing rows now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writing {
    /// Nobody: the next row may be written at once by its caller.
    Idle,
    /// A caller, its own row on its own thread; rows that come meanwhile queue.
    Caller,
    /// A writer thread, draining the queue.
    Thread,
}

impl<T: Send + 'static> GroupCommit<T> {
    /// A writer of `T` rows into `store` with `write`, retrying a batch while the database
    /// is busy as every write does.
    pub(super) fn new(store: Arc<Store>, what: Operation, write: WriteRows<T>) -> Arc<Self> {
        Self::with_retry(store, what, write, super::retry::RETRY_FOR)
    }

    /// [`GroupCommit::new`], retrying a batch for at most `retry_for`.
    pub(super) fn with_retry(
        store: Arc<Store>,
        what: Operation,
        write: WriteRows<T>,
        retry_for: Duration,
    ) -> Arc<Self> {
        Arc::new(GroupCommit {
            store,
            write,
            what,
            retry_for,
            pending: Mutex::new(Pending {
                queue: Vec::new(),
                writing: Writing::Idle,
            }),
        })
    }

    /// Hands `row` over and returns once the transaction holding it has committed (or
    /// failed, with the store's error).
    pub(super) async fn submit(self: &Arc<Self>, row: T) -> Result<(), ServiceError> {
        self.enqueue(row).wait().await
    }

    /// Queues `row` and returns at once; nothing is written until a caller waits for a
    /// row ([`Queued::wait`]) or drops one unwaited, so rows queued together can share a
    /// commit.
    pub(super) fn enqueue(self: &Arc<Self>, row: T) -> Queued<T> {
        let (done, answer) = oneshot::channel();
        self.lock().queue.push((row, done));
        Queued {
            rows: self.clone(),
            answer: Some(answer),
        }
    }

    /// Commits what is queued (up to [`INLINE_BATCH`] rows) on this thread if no write is
    /// under way and the database can be written without waiting; otherwise leaves the
    /// queue to the writer that is, or starts a writer thread.
    fn flush_now(self: &Arc<Self>) {
        let batch: Vec<_> = {
            let mut pending = self.lock();
            if pending.writing != Writing::Idle || pending.queue.is_empty() {
                return;
            }
            // Rows that come meanwhile queue for a writer thread, not for this one.
            pending.writing = Writing::Caller;
            let take = pending.queue.len().min(INLINE_BATCH);
            pending.queue.drain(..take).collect()
        };
        let (rows, waiters): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.store.write_now(|tx| (self.write)(tx, &rows))
        }));
        let written = match written {
            // Not now: the batch goes back to the front of the queue, for a writer thread.
            Ok(None) => {
                let mut pending = self.lock();
                let back: Vec<_> = rows.into_iter().zip(waiters).collect();
                pending.queue.splice(..0, back);
                pending.writing = Writing::Thread;
                drop(pending);
                self.start_writer();
                return;
            }
            Ok(Some(result)) => Ok(result),
            Err(panic) => Err(panic),
        };
        self.answer(waiters, written);
        self.flush_later(Writing::Caller);
    }

    /// Starts a writer thread if rows are queued and `was` (the state this caller left
    /// the queue in) is still in force; otherwise marks the queue idle.
    fn flush_later(self: &Arc<Self>, was: Writing) {
        let start = {
            let mut pending = self.lock();
            if pending.writing != was {
                return;
            }
            pending.writing = if pending.queue.is_empty() {
                Writing::Idle
            } else {
                Writing::Thread
            };
            pending.writing == Writing::Thread
        };
        if start {
            self.start_writer();
        }
    }

    /// Starts a writer thread to drain the queue (outside a runtime, drains it here); the
    /// caller set [`Writing::Thread`].
    fn start_writer(self: &Arc<Self>) {
        let writer = Writer {
            rows: self.clone(),
            finished: false,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || writer.run())),
            Err(_) => writer.run(),
        }
    }

    /// Tells each waiter of a batch how its write went: committed, the store's error
    /// (naming the database), or a panic (a bug).
    fn answer(
        &self,
        waiters: Vec<oneshot::Sender<Result<(), String>>>,
        written: std::thread::Result<Result<(), StoreError>>,
    ) {
        let result = match written {
            Ok(result) => result.map_err(|err| self.store.locate(err).to_string()),
            Err(_) => Err(self.unexpected()),
        };
        for waiter in waiters {
            // A caller that stopped waiting (dropped its row, its deadline) no longer
            // needs the answer.
            let _ = waiter.send(result.clone());
        }
    }

    /// The error of a write that panicked.
    fn unexpected(&self) -> String {
        format!(
            "{}: the write to {} failed unexpectedly (a bug); the call's row was not kept",
            self.what,
            self.store.path().display()
        )
    }

    /// Commits batches until the queue is empty, then stops.
    fn drain(&self) {
        loop {
            let batch: Vec<_> = {
                let mut pending = self.lock();
                if pending.queue.is_empty() {
                    pending.writing = Writing::Idle;
                    return;
                }
                let take = pending.queue.len().min(MAX_BATCH);
                pending.queue.drain(..take).collect()
            };
            let (rows, waiters): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
            // A write that panics fails its batch, not the writer: the rows after it still
            // have one (SQLite rolls the transaction back; the connection stays good).
            let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.store
                    .write_within(self.retry_for, |tx| (self.write)(tx, &rows))
            }));
            self.answer(waiters, written);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending<T>> {
        // Nothing panics while holding it; a poisoned queue is still a valid queue.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A row in the queue: [`Queued::wait`] returns once it is committed.
pub(super) struct Queued<T: Send + 'static> {
    rows: Arc<GroupCommit<T>>,
    /// Taken by `wait`; still here if the row is dropped unwaited.
    answer: Option<oneshot::Receiver<Result<(), String>>>,
}

impl<T: Send + 'static> Queued<T> {
    /// Commits what is queued, this row among it, unless a write is under way, and
    /// waits for the commit that holds this row.
    pub(super) async fn wait(mut self) -> Result<(), ServiceError> {
        let answer = self.answer.take().expect("waited for once");
        self.rows.flush_now();
        match answer.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(ServiceError::Backend(message.into())),
            // The writer went away before it said: its task was dropped unrun (the runtime
            // shutting down) or it failed outside a write.
            Err(_) => Err(ServiceError::Lost(self.rows.what)),
        }
    }
}

impl<T: Send + 'static> Drop for Queued<T> {
    /// A row dropped unwaited is written all the same: now, as [`Queued::wait`] would,
    /// or by the writer under way.
    fn drop(&mut self) {
        if self.answer.is_some() {
            self.rows.flush_now();
        }
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
            pending.writing = Writing::Idle;
            std::mem::take(&mut pending.queue)
        };
        // Each waiter hears `Lost`; a row nobody waits for any more is named here.
        let unheard = abandoned
            .iter()
            .filter(|(_, done)| done.is_closed())
            .count();
        if unheard > 0 {
            tracing::error!(
                database = %self.rows.store.path().display(),
                "{}: {unheard} row(s) not written: the writer stopped before it ran \
                 (the runtime shutting down)",
                self.rows.what
            );
        }
        drop(abandoned);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::services::AuditRecord;
    use crate::store::audit::insert_calls;
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
            conversation: None,
            receipt: crate::services::Receipt::default(),
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
        let writer = GroupCommit::new(Arc::new(store), Operation::AuditRecord, |tx, rows| {
            BATCHES.fetch_add(1, Ordering::SeqCst);
            insert_calls(tx, rows)
        });
        // Another connection holds the write lock: the first row cannot be written at
        // once, and the writer thread's transaction waits.
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
            pending.writing == Writing::Thread && pending.queue.is_empty()
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
        until(|| writer.lock().writing == Writing::Idle).await;
    }

    #[tokio::test]
    async fn rows_queued_together_share_the_commit_of_the_first_waited_for() {
        static BATCHES: AtomicUsize = AtomicUsize::new(0);
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let writer = GroupCommit::new(Arc::new(store), Operation::AuditRecord, |tx, rows| {
            BATCHES.fetch_add(1, Ordering::SeqCst);
            insert_calls(tx, rows)
        });
        let queued: Vec<_> = (0..3).map(|n| writer.enqueue(row(n))).collect();
        assert_eq!(
            rows_of(&path, "worker:0"),
            0,
            "nothing written before a wait"
        );
        for row in queued {
            row.wait().await.unwrap();
        }
        assert_eq!(BATCHES.load(Ordering::SeqCst), 1);
        for n in 0..3 {
            assert_eq!(rows_of(&path, &format!("worker:{n}")), 1);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_dropped_unwaited_is_written_all_the_same() {
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let writer = GroupCommit::new(Arc::new(store), Operation::AuditRecord, insert_calls);
        drop(writer.enqueue(row(7)));
        until(|| {
            let pending = writer.lock();
            pending.writing == Writing::Idle && pending.queue.is_empty()
        })
        .await;
        assert_eq!(rows_of(&path, "worker:7"), 1);
    }

    #[tokio::test]
    async fn a_failed_write_reaches_every_caller_with_the_database_named() {
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let writer =
            GroupCommit::<AuditRecord>::new(Arc::new(store), Operation::AuditRecord, |_, _| {
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
        let writer = GroupCommit::new(Arc::new(store), Operation::AuditRecord, |tx, rows| {
            if !PANICKED.swap(true, Ordering::SeqCst) {
                panic!("a write that panics");
            }
            insert_calls(tx, rows)
        });
        let failed = writer.submit(row(1)).await.unwrap_err().to_string();
        assert!(
            failed.contains(Operation::AuditRecord.as_str()) && failed.contains("(a bug)"),
            "{failed}"
        );
        writer.submit(row(2)).await.unwrap();
        assert_eq!(rows_of(&path, "worker:2"), 1);
    }

    #[test]
    fn a_row_whose_writer_never_runs_fails_as_lost_and_the_next_is_written() {
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let store = Arc::new(store);
        let writer = GroupCommit::new(store.clone(), Operation::AuditRecord, insert_calls);
        // A runtime shut down: its blocking pool drops the writer's task unrun. The
        // connection is in use, so the row cannot be written at once and needs the writer.
        let dying = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handle = dying.handle().clone();
        drop(dying);
        let in_use = store.conn();
        let lost = handle.block_on(writer.submit(row(1))).unwrap_err();
        drop(in_use);
        assert!(
            matches!(lost, ServiceError::Lost(Operation::AuditRecord)),
            "{lost}"
        );
        assert!(
            writer.lock().writing == Writing::Idle,
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
    fn a_row_with_no_write_under_way_is_committed_on_the_callers_thread() {
        static WRITER: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let writer = GroupCommit::new(Arc::new(store), Operation::AuditRecord, |tx, rows| {
            *WRITER.lock().unwrap() = Some(std::thread::current().id());
            insert_calls(tx, rows)
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(writer.submit(row(1))).unwrap();
        assert_eq!(rows_of(&path, "worker:1"), 1);
        assert_eq!(
            *WRITER.lock().unwrap(),
            Some(std::thread::current().id()),
            "no hand-off to a writer thread"
        );
        assert_eq!(writer.lock().writing, Writing::Idle);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_row_that_finds_the_connection_in_use_is_written_by_the_writer_thread() {
        static WRITER: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);
        let (_dir, store) = temp_store();
        let path = store.path().to_owned();
        let store = Arc::new(store);
        let writer = GroupCommit::new(store.clone(), Operation::AuditRecord, |tx, rows| {
            *WRITER.lock().unwrap() = Some(std::thread::current().id());
            insert_calls(tx, rows)
        });
        // A long read holds the connection on another thread: the row must not wait for
        // it on the caller's thread.
        let (held, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        let (held, release) = (Arc::new(held), Arc::new(release));
        let reader = std::thread::spawn({
            let (store, held, release) = (store.clone(), held.clone(), release.clone());
            move || {
                let _in_use = store.conn();
                held.wait();
                release.wait();
            }
        });
        held.wait();
        let submitted = tokio::spawn({
            let writer = writer.clone();
            async move {
                let caller = std::thread::current().id();
                writer.submit(row(1)).await.unwrap();
                caller
            }
        });
        until(|| writer.lock().writing == Writing::Thread).await;
        release.wait();
        reader.join().unwrap();
        let caller = submitted.await.unwrap();
        assert_eq!(rows_of(&path, "worker:1"), 1);
        assert_ne!(*WRITER.lock().unwrap(), Some(caller));
        until(|| writer.lock().writing == Writing::Idle).await;
    }

    #[test]
    fn writes_on_the_callers_thread_leave_the_log_to_a_checkpoint_off_it() {
        let (_dir, store) = temp_store();
        let store = Arc::new(store);
        let writer = GroupCommit::new(store.clone(), Operation::AuditRecord, insert_calls);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let pages = super::super::writes::wal_pages;
        // Rows one by one, each committed on this thread (nothing else uses the
        // connection yet), until a commit leaves the log due: it schedules a checkpoint.
        let mut n = 0;
        while pages() < 1000 {
            n += 1;
            assert!(n < 100_000, "the log never grew: {} pages", pages());
            runtime.block_on(writer.submit(row(n))).unwrap();
        }
        // The checkpoint runs on a blocking thread; once it has let go of the connection,
        // the next commit starts the log again from its beginning.
        while store.checkpoint_scheduled.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        drop(store.conn());
        runtime.block_on(writer.submit(row(0))).unwrap();
        assert!(pages() < 10, "{} pages", pages());
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
