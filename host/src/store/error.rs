//! Store errors.

use std::path::PathBuf;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The data dir could not be created.
    #[error("{}: cannot create the data directory: {source}", path.display())]
    DataDir {
        /// The directory.
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
    #[error("{}: schema version {found} is newer than this capstan supports ({supported}); upgrade capstan", path.display())]
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
}
