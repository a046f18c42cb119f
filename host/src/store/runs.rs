//! Runs: one per host process using the store, so workers left "running" by a process that
//! is gone (killed, crashed) can be told from the workers of a run still alive.
//!
//! A run holds an exclusive advisory lock (`flock`) on `runs/<id>.lock` under the data dir
//! for its whole life. The kernel drops the lock when the process dies, however it dies,
//! so a free lock proves the run is over; no pid check can be fooled by pid reuse.

use std::fs::{DirBuilder, File, OpenOptions, TryLockError};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rusqlite::params;

use super::open_lock::{O_NOFOLLOW, open_lock_file};
use super::{Store, StoreError, now};
use crate::services::RunId;

/// The directory under the data dir that holds the runs' lock files.
const RUNS_DIR: &str = "runs";

/// A live run: holds the run's lock until dropped. Keep it for as long as the run's
/// workers may be running; dropping it says they are not.
#[derive(Debug)]
pub struct RunGuard {
    id: RunId,
    lock_path: PathBuf,
    // Held only for its lock; closing it releases the lock.
    _lock: File,
}

impl RunGuard {
    /// The run's id, for [`Store::insert_worker_in_run`].
    pub fn id(&self) -> RunId {
        self.id
    }

    /// The lock file held.
    pub fn lock_path(&self) -> &Path {
        &self.lock_path
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        // Best effort: a lock file left behind is only checked and found free later.
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

impl Store {
    /// Starts a run of this process: records it and takes its lock.
    ///
    /// ```
    /// use capstan_host::ids::{ProcessId, ProcessKind};
    /// use capstan_host::store::{Store, WorkerState};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path()).unwrap();
    /// let run = store.begin_run().unwrap();
    /// let worker = ProcessId::numbered(ProcessKind::Worker, 1);
    /// let main = ProcessId::channel("main");
    /// store.insert_worker_in_run(run.id(), &worker, &main, "sort").unwrap();
    /// // This run is alive: its worker is left alone.
    /// assert!(store.mark_interrupted_workers().unwrap().is_empty());
    /// drop(run);
    /// // Its guard is gone, so its still-running worker was interrupted.
    /// let marked = store.mark_interrupted_workers().unwrap();
    /// assert_eq!(marked[0].state, WorkerState::Interrupted);
    /// ```
    pub fn begin_run(&self) -> Result<RunGuard, StoreError> {
        let dir = self.data_dir.join(RUNS_DIR);
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|source| StoreError::RunLock {
                path: dir.clone(),
                source,
            })?;
        // The row and the lock are made in one immediate transaction, so no one checking
        // runs in between sees the row without its lock held.
        self.write(|tx| {
            tx.execute(
                "INSERT INTO runs (pid, started_at) VALUES (?1, ?2)",
                params![std::process::id(), now()],
            )?;
            let id = RunId::new(tx.last_insert_rowid() as u64);
            let lock_path = lock_file(&self.data_dir, id);
            let lock_err = |source| StoreError::RunLock {
                path: lock_path.clone(),
                source,
            };
            let lock = open_lock_file(&lock_path).map_err(lock_err)?;
            lock.try_lock().map_err(|err| match err {
                TryLockError::WouldBlock => lock_err(std::io::Error::new(
                    ErrorKind::WouldBlock,
                    "another process holds this new run's lock",
                )),
                TryLockError::Error(err) => lock_err(err),
            })?;
            Ok(RunGuard {
                id,
                lock_path,
                _lock: lock,
            })
        })
    }
}

fn lock_file(data_dir: &Path, run: RunId) -> PathBuf {
    data_dir.join(RUNS_DIR).join(format!("{}.lock", run.get()))
}

/// Whether `run`'s lock is free: no live process holds it.
pub(super) fn run_is_over(data_dir: &Path, run: RunId) -> Result<bool, StoreError> {
    let path = lock_file(data_dir, run);
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(O_NOFOLLOW)
        .open(&path)
    {
        Ok(file) => file,
        // A run that ended normally removed its lock file.
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(true),
        Err(source) => return Err(StoreError::RunLock { path, source }),
    };
    match file.try_lock() {
        // Closing `file` releases the lock again at once.
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(source)) => Err(StoreError::RunLock { path, source }),
    }
}
