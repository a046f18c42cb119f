//! Store errors.

use std::path::PathBuf;

use crate::services::ServiceError;

/// What every data-dir error ends with: how to point capstan elsewhere.
const ELSEWHERE: &str = "or set `data_dir` under `[agent]` in capstan.toml to another directory";

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The data dir could not be created or inspected.
    #[error("{}: cannot use this data directory: {source}; fix its permissions, {elsewhere}", path.display(), elsewhere = ELSEWHERE)]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The data dir is there but unusable.
    #[error("{}: the data directory {problem}; fix it, {elsewhere}", path.display(), elsewhere = ELSEWHERE)]
    DataDirUnusable {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        problem: DataDirProblem,
    },
    /// The database file or its `-wal`/`-shm` file is a symbolic link, which could point
    /// the host's writes anywhere; it is never followed.
    #[error("{}: is a symbolic link; the database and its -wal and -shm files must be regular files: move the link aside and put the database itself there, {elsewhere}", path.display(), elsewhere = ELSEWHERE)]
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// The file is not an SQLite database at all.
    #[error("{}: is not a capstan database (SQLite: file is not a database); it was left untouched: move it aside to start with a fresh database, or restore the right file from a backup", path.display())]
    NotADatabase {
        /// The file.
        path: PathBuf,
    },
    /// The integrity check found damage.
    #[error("{}: the database is damaged ({detail}); it was left untouched: restore it from a backup, or move it and its -wal and -shm files aside to start with a fresh database", path.display())]
    Damaged {
        /// The database file.
        path: PathBuf,
        /// What SQLite found.
        detail: String,
    },
    /// A stored history message cannot be read; the history is not returned short.
    #[error("{}: message {seq} of channel `{channel}`'s history cannot be read ({reason}); restore the database from a backup, or delete that channel's history to start it fresh", path.display())]
    UnreadableHistory {
        /// The database file.
        path: PathBuf,
        /// The channel.
        channel: String,
        /// The message's position in the history.
        seq: u64,
        /// Why it cannot be read.
        reason: String,
    },
    /// A run's lock file could not be created, locked or checked.
    #[error("{}: cannot use the run lock file: {source}; fix the data directory's permissions, {elsewhere}", path.display(), elsewhere = ELSEWHERE)]
    RunLock {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The lock that lets one process at a time open the database could not be taken.
    #[error("{}: cannot take the lock that lets one process at a time open the database: {source}; fix the data directory's permissions, {elsewhere}", path.display(), elsewhere = ELSEWHERE)]
    OpenLock {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The database could not be opened or configured.
    #[error("{}: cannot open the database: {source}", path.display())]
    Open {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// A migration failed; the database is left at the previous version.
    #[error("{}: migration {version} failed: {source}", path.display())]
    Migration {
        /// The database file.
        path: PathBuf,
        /// The migration's number.
        version: u32,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The database is newer than this binary.
    #[error("{}: schema version {found} is newer than this capstan supports ({supported}): run a newer capstan, {elsewhere}", path.display(), elsewhere = ELSEWHERE)]
    TooNew {
        /// The database file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// The newest this binary knows.
        supported: u32,
    },
    /// No such item.
    #[error("{0}")]
    NotFound(String),
    /// A request the store refuses: a bad transition, a bad value.
    #[error("{0}")]
    Invalid(String),
    /// SQLite failed.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// SQLite failed on the database at `path`, as a service call reports it.
    #[error("{}: database error: {source}; if it persists, check the file with `sqlite3 {} 'PRAGMA integrity_check'` or restore it from a backup", path.display(), path.display())]
    Query {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        source: rusqlite::Error,
    },
}

impl From<ServiceError> for StoreError {
    fn from(err: ServiceError) -> Self {
        match err {
            ServiceError::NotFound(message) => StoreError::NotFound(message),
            // The services' checks that the store runs refuse requests, nothing else.
            other => StoreError::Invalid(other.to_string()),
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound(message) => ServiceError::NotFound(message),
            StoreError::Invalid(message) => ServiceError::Invalid(message),
            StoreError::UnreadableHistory {
                path,
                channel,
                seq,
                reason,
            } => ServiceError::UnreadableHistory {
                location: path.display().to_string(),
                channel,
                seq,
                reason,
            },
            other => ServiceError::Backend(Box::new(other)),
        }
    }
}

/// What is wrong with a data dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirProblem {
    /// Something other than a directory is in its place.
    NotADirectory,
    /// This process may not list it.
    Unreadable,
    /// This process may not create files in it.
    NotWritable,
}

impl std::fmt::Display for DataDirProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataDirProblem::NotADirectory => "is not a directory (a file is in its place)",
            DataDirProblem::Unreadable => "cannot be read by this user",
            DataDirProblem::NotWritable => {
                "is not writable by this user (the database needs to create its -wal and -shm files there)"
            }
        })
    }
}
