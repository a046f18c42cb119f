//! The store: SQLite in WAL mode, behind this one module.
//!
//! One database file (`capstan.db` in the data dir) holds the taskboard, memories (with
//! FTS5 recall), working memory, conversation history, worker records and the audit log of
//! tool calls. Schema changes are numbered migrations (`store/migrations.rs`) applied at open.
//! Nothing outside this module writes SQL. The agent and the plugins reach it only through
//! the [services](crate::services) it implements ([`Store::services`]), whose calls run
//! its blocking work on tokio's blocking threads.
//!
//! Several processes may share one database: opening is safe to race (`store/migrations.rs`),
//! every write is an immediate transaction retried while busy (`store/retry.rs`), process
//! numbers come from persisted counters (`store/counters.rs`), and each run holds a lock
//! that tells its workers from those of a run that died (`store/runs.rs`). A database that
//! is damaged, not a database, a symbolic link, or in an unusable data dir is refused at
//! open with its path and the fix (`store/integrity.rs`, `store/datadir.rs`), and left as
//! it was.
//!
//! ```
//! use std::sync::Arc;
//! use capstan_host::ids::{Caller, ProcessId, ProcessKind};
//! use capstan_host::store::{NewTask, Store};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let store = Arc::new(Store::open(dir.path()).unwrap());
//! // Written through the services, which check what goes in; read back from the file.
//! let worker = Caller::from(ProcessId::numbered(ProcessKind::Worker, 1));
//! let services = store.clone().services();
//! let task = services.tasks.create(&worker, NewTask::titled("Write the report")).await.unwrap();
//! assert_eq!(store.get_task(task.number).unwrap().title, "Write the report");
//! # });
//! ```

mod approvals;
mod audit;
mod counters;
mod datadir;
mod error;
mod file_labels;
mod group_commit;
mod history;
mod integrity;
mod memory;
mod migrations;
mod open_lock;
mod retry;
mod rows;
mod runs;
mod services;
mod tasks;
mod workers;
mod writes;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OpenFlags};

pub(crate) use crate::services::now;

pub use error::{DataDirProblem, StoreError};
pub use migrations::SCHEMA_VERSION;
pub use runs::RunGuard;
// The types are the services'; named here too, for code that uses the store directly.
pub use crate::services::{
    AuditEntry, AuditRecord, HistoryEntry, MemoryItem, NewMemory, NewTask, Priority, RunId, Task,
    TaskFilter, TaskPatch, TaskStatus, WorkerRecord, WorkerState,
};

/// The database file name inside the data dir.
pub const DATABASE_FILE: &str = "capstan.db";

/// A handle on the database. Cheap operations take a short lock on one connection; SQLite
/// in WAL mode keeps readers of other processes unblocked.
pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
    data_dir: PathBuf,
    /// A checkpoint is on its way to a blocking thread (`store/writes.rs`).
    checkpoint_scheduled: AtomicBool,
}

impl Store {
    /// Opens (creating if needed) `capstan.db` in `data_dir` and applies migrations.
    ///
    /// A missing data dir is created owner-only. Any number of processes may open the same
    /// database at once. The open is refused, with the path and what to do, when the data
    /// dir is not a directory, cannot be read or written, when the database or its `-wal`
    /// or `-shm` file is a symbolic link, when the file is not a database or fails SQLite's
    /// integrity check (the damaged file is left as it was), or when it comes from a newer
    /// capstan.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        datadir::prepare(data_dir)?;
        let _opening = open_lock::acquire(data_dir)?;
        let path = data_dir.join(DATABASE_FILE);
        let open_err = |source| StoreError::Open {
            path: path.clone(),
            source,
        };
        // NOFOLLOW refuses a link planted between the check above and this open; SQLite
        // opens the -wal and -shm files with O_NOFOLLOW itself.
        let flags = OpenFlags::default() | OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let mut conn = Connection::open_with_flags(&path, flags).map_err(open_err)?;
        // First, so every statement after it, even the journal-mode switch, waits for
        // another process opening the same new database instead of failing.
        conn.busy_timeout(retry::BUSY_TIMEOUT).map_err(open_err)?;
        // Before anything writes: switching to WAL rewrites the header of a damaged file.
        retry::retry_busy(|| integrity::check(&conn, &path))?;
        retry::retry_busy(|| {
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(open_err)
        })?;
        let setup = |conn: &mut Connection| -> rusqlite::Result<()> {
            conn.pragma_update(None, "synchronous", "NORMAL")?;
            conn.pragma_update(None, "foreign_keys", "ON")?;
            Ok(())
        };
        setup(&mut conn).map_err(open_err)?;
        // Instead of SQLite's checkpoint inside a commit (which syncs), the log's size is
        // noted and the checkpoint runs where blocking is allowed (`store/writes.rs`).
        conn.wal_hook(Some(writes::note_wal_pages));
        migrations::apply(&mut conn, &path)?;
        Ok(Store {
            conn: Mutex::new(conn),
            path,
            data_dir: data_dir.to_owned(),
            checkpoint_scheduled: AtomicBool::new(false),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version in force.
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        let conn = self.conn();
        Ok(conn.pragma_query_value(None, "user_version", |row| row.get(0))?)
    }

    /// The SQLite journal mode (`wal` once open).
    pub fn journal_mode(&self) -> Result<String, StoreError> {
        let conn = self.conn();
        Ok(conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?)
    }

    /// `err`, an error from SQLite itself naming this database, for the model and the log.
    pub(crate) fn locate(&self, err: StoreError) -> StoreError {
        match err {
            StoreError::Sqlite(source) => StoreError::Query {
                path: self.path.clone(),
                source,
            },
            other => other,
        }
    }

    fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves no half-done transaction behind (SQLite
        // rolls it back), so the connection is still good.
        self.conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A store in a fresh temporary directory (kept alive by the returned guard).
    pub(crate) fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn a_reopened_store_keeps_tasks_memories_history_and_workers() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.journal_mode().unwrap(), "wal");
            assert_eq!(store.schema_version().unwrap(), migrations::SCHEMA_VERSION);
            store
                .create_task(
                    &crate::ids::testing::by("worker:1"),
                    &NewTask::titled("persist me"),
                )
                .unwrap();
            let memory = NewMemory {
                kind: "fact".into(),
                content: "sqlite keeps this".into(),
                importance: None,
                label: crate::flow::Label::trusted(),
            };
            store
                .save_memory(&crate::ids::testing::by("branch:1"), &memory)
                .unwrap();
            store
                .append_history(
                    "channel:main",
                    &[r#"{"role":"user","content":"hi"}"#.into()],
                )
                .unwrap();
            store
                .insert_worker(
                    &crate::ids::testing::pid("worker:1"),
                    &crate::ids::testing::pid("channel:main"),
                    "gather items",
                )
                .unwrap();
            store
                .set_worker_state(
                    &crate::ids::testing::pid("worker:1"),
                    WorkerState::Done,
                    Some("3 items"),
                )
                .unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.get_task(1).unwrap().title, "persist me");
        assert_eq!(store.recall("sqlite", 5).unwrap().len(), 1);
        assert_eq!(store.load_history("channel:main").unwrap().len(), 1);
        let worker = store
            .get_worker(&crate::ids::testing::pid("worker:1"))
            .unwrap()
            .unwrap();
        assert_eq!(
            (worker.state, worker.outcome.as_deref()),
            (WorkerState::Done, Some("3 items"))
        );
    }

    #[test]
    fn a_database_from_a_newer_capstan_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        let conn = Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
        conn.pragma_update(None, "user_version", 99).unwrap();
        drop(conn);
        let err = Store::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("capstan.db") && err.contains("schema version 99"),
            "{err}"
        );
    }
}
