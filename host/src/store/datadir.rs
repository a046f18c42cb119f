//! The data dir: created owner-only, and checked before SQLite sees it, so an operator gets
//! the path and what to do instead of SQLite's "unable to open database file".

use std::fs::{DirBuilder, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::DataDirProblem;
use super::{DATABASE_FILE, StoreError};

/// The files SQLite keeps next to each other for one WAL-mode database.
pub(crate) const DATABASE_FILES: [&str; 3] = ["", "-wal", "-shm"];

/// Creates `dir` (owner-only) if it is missing, and checks that it is a directory this
/// process can list and write, and that the database files in it are not symbolic links.
pub(crate) fn prepare(dir: &Path) -> Result<(), StoreError> {
    let problem = |problem| StoreError::DataDirUnusable {
        path: dir.to_owned(),
        problem,
    };
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => return Err(problem(DataDirProblem::NotADirectory)),
        Ok(_) => {}
        Err(err) if err.kind() == ErrorKind::NotFound => {
            // Owner-only: the database holds conversations and tool arguments.
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| StoreError::DataDir {
                    path: dir.to_owned(),
                    source,
                })?;
        }
        Err(err) if err.kind() == ErrorKind::NotADirectory => {
            return Err(problem(DataDirProblem::NotADirectory));
        }
        Err(source) => {
            return Err(StoreError::DataDir {
                path: dir.to_owned(),
                source,
            });
        }
    }
    std::fs::read_dir(dir).map_err(|err| match err.kind() {
        ErrorKind::PermissionDenied => problem(DataDirProblem::Unreadable),
        _ => StoreError::DataDir {
            path: dir.to_owned(),
            source: err,
        },
    })?;
    probe_writable(dir).map_err(|err| match err.kind() {
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => {
            problem(DataDirProblem::NotWritable)
        }
        _ => StoreError::DataDir {
            path: dir.to_owned(),
            source: err,
        },
    })?;
    for suffix in DATABASE_FILES {
        let file = dir.join(format!("{DATABASE_FILE}{suffix}"));
        if std::fs::symlink_metadata(&file).is_ok_and(|meta| meta.file_type().is_symlink()) {
            return Err(StoreError::Symlink { path: file });
        }
    }
    Ok(())
}

/// Creates and removes a uniquely named file in `dir`: WAL mode must create the `-wal` and
/// `-shm` files there, and `access(2)` is not in std. `create_new` never follows a link.
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    // Unique among this process's threads by the counter, among processes by the pid.
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let probe = dir.join(format!(
        ".capstan-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    ));
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}
