//! One opener at a time. Opening runs the integrity check, switches the journal to WAL and
//! applies migrations; two processes doing that at once on a new file can see each other's
//! schema half-built (SQLite reports an FTS5 table's constructor failing, not "busy"). A
//! file lock beside the database, held for the open only, puts openers in a line; once
//! open, processes share the database as usual.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{StoreError, retry};

/// The lock file's name in the data dir.
pub(crate) const OPEN_LOCK_FILE: &str = "capstan.db.open-lock";

/// A symlink planted where a lock file lies is refused, not followed.
pub(super) const O_NOFOLLOW: i32 = rustix::fs::OFlags::NOFOLLOW.bits() as i32;

/// Opens (creating it owner-only) the lock file at `path`, never through a symlink.
pub(super) fn open_lock_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(O_NOFOLLOW)
        .open(path)
}

/// Held while this process opens the database; released when dropped.
pub(crate) struct OpenLock {
    _file: File,
}

/// Waits (at most as long as a write retries) until no other process is opening the
/// database in `data_dir`, then holds the lock.
pub(crate) fn acquire(data_dir: &Path) -> Result<OpenLock, StoreError> {
    let path = data_dir.join(OPEN_LOCK_FILE);
    let lock_err = |source| StoreError::OpenLock {
        path: path.clone(),
        source,
    };
    let file = open_lock_file(&path).map_err(lock_err)?;
    let started = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(OpenLock { _file: file }),
            Err(TryLockError::WouldBlock) if started.elapsed() < retry::RETRY_FOR => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(TryLockError::WouldBlock) => {
                return Err(lock_err(std::io::Error::new(
                    ErrorKind::WouldBlock,
                    format!(
                        "another process has been opening this database for {} s",
                        retry::RETRY_FOR.as_secs()
                    ),
                )));
            }
            Err(TryLockError::Error(err)) => return Err(lock_err(err)),
        }
    }
}
