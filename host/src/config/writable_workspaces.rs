//! The record of every workspace the host has let plugins write.
//!
//! A plugin granted `fs.write` on a workspace may leave files there that outlive its call:
//! a `capstan.toml` that grants everything, a cache of code, a database. The check in
//! [`Locations`](super::Locations) keeps the host's own files out of the workspace it is
//! about to grant, but a later command started from inside an *earlier* command's
//! workspace would find that planted file. So before the host grants `fs.write` on a
//! workspace it appends the workspace to a file of its own (outside every such workspace),
//! and every later command refuses a config, cache, data dir, plugins dir or script that
//! lies inside any workspace listed there.
//!
//! The file holds one absolute, resolved path per line; lines starting with `#` are
//! comments. Deleting a line is how a person says that no plugin may write that directory
//! any more.

use std::ffi::OsStr;
use std::fs::{DirBuilder, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::resolve::{inside_any, resolve};

/// The file name of the record inside the state dir.
pub const WRITABLE_WORKSPACES_FILE: &str = "writable-workspaces";

/// The largest record read; a person's workspaces fit many times over.
const MAX_RECORD_BYTES: u64 = 4 << 20;

/// A symlink planted where the record lies is refused, not followed.
const O_NOFOLLOW: i32 = rustix::fs::OFlags::NOFOLLOW.bits() as i32;

/// A FIFO planted there does not block the open.
const O_NONBLOCK: i32 = rustix::fs::OFlags::NONBLOCK.bits() as i32;

/// The first lines of a new record.
const HEADER: &str = "# Workspaces capstan let plugins write (fs.write). A config, cache, data \
dir, plugins dir or script inside one is refused.\n# Delete a line only when no plugin may \
write that directory any more.\n";

/// Why the record cannot be read or added to. Each names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The file exists but cannot be read.
    #[error(
        "{}: cannot read the record of workspaces plugins were let write: {error}; fix the \
         file (removing it forgets every workspace recorded there), or set \
         CAPSTAN_STATE_DIR to another directory",
        path.display()
    )]
    Read {
        /// The record.
        path: PathBuf,
        /// What is wrong.
        error: std::io::Error,
    },
    /// The file cannot be created or appended to.
    #[error(
        "{}: cannot record the workspace {} that plugins may write: {error}; set \
         CAPSTAN_STATE_DIR to a directory of your own, or call without fs.write",
        path.display(),
        workspace.display()
    )]
    Write {
        /// The record.
        path: PathBuf,
        /// The workspace being recorded.
        workspace: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A workspace whose path holds a line break cannot be written as one line.
    #[error(
        "the workspace {} holds a line break in its path, which {} cannot record; choose \
         another workspace",
        workspace.escape_debug(),
        path.display()
    )]
    LineBreak {
        /// The record.
        path: PathBuf,
        /// The workspace.
        workspace: String,
    },
    /// There is nowhere to keep the record.
    #[error(
        "no directory to record the workspaces plugins may write in: set CAPSTAN_STATE_DIR, \
         XDG_STATE_HOME or HOME, or call without fs.write"
    )]
    NoStateDir,
}

/// The workspaces earlier commands let plugins write, as read from their record.
///
/// ```
/// use capstan_host::config::WritableWorkspaces;
///
/// let state = tempfile::tempdir()?;
/// let workspace = tempfile::tempdir()?;
/// let file = state.path().join("writable-workspaces");
///
/// let mut record = WritableWorkspaces::load(&file)?;
/// assert!(record.containing(&workspace.path().join("capstan.toml")).is_none());
/// record.add(workspace.path())?;
///
/// // A later command reads it back.
/// let later = WritableWorkspaces::load(&file)?;
/// let planted = workspace.path().join("capstan.toml");
/// assert_eq!(later.containing(&planted), Some(workspace.path().canonicalize()?.as_path()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WritableWorkspaces {
    /// The file they are recorded in; `None` when there is nowhere to keep one.
    file: Option<PathBuf>,
    /// The recorded workspaces, resolved when they were recorded.
    workspaces: Vec<PathBuf>,
}

impl WritableWorkspaces {
    /// Reads the record in `file`; a missing file is an empty record. The file must be a
    /// regular file (not a symlink, FIFO or directory) that only this user may write, and
    /// every line an absolute path.
    pub fn load(file: &Path) -> Result<Self, RecordError> {
        let bytes = read_record(file)?.unwrap_or_default();
        let mut workspaces = Vec::new();
        for (number, line) in bytes.split(|&b| b == b'\n').enumerate() {
            if line.is_empty() || line.starts_with(b"#") {
                continue;
            }
            let path = PathBuf::from(OsStr::from_bytes(line));
            if !path.is_absolute() {
                return Err(RecordError::Read {
                    path: file.to_owned(),
                    error: std::io::Error::other(format!(
                        "line {} is not an absolute path: {}",
                        number + 1,
                        path.display()
                    )),
                });
            }
            workspaces.push(path);
        }
        Ok(WritableWorkspaces {
            file: Some(file.to_owned()),
            workspaces,
        })
    }

    /// The record in `state_dir` (see [`WRITABLE_WORKSPACES_FILE`]), or an empty one that
    /// cannot be added to when there is no state dir.
    pub fn in_state_dir(state_dir: Option<&Path>) -> Result<Self, RecordError> {
        match state_dir {
            Some(dir) => Self::load(&dir.join(WRITABLE_WORKSPACES_FILE)),
            None => Ok(Self::default()),
        }
    }

    /// The file the record is kept in.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The recorded workspaces.
    pub fn workspaces(&self) -> &[PathBuf] {
        &self.workspaces
    }

    /// The recorded workspace a plugin could have changed `path` from, if any: `path` or a
    /// directory it is looked up in lies inside it (see [`Locations`](super::Locations)).
    pub fn containing(&self, path: &Path) -> Option<&Path> {
        inside_any(path, self.workspaces.iter().map(PathBuf::as_path))
    }

    /// Records `workspace` (resolved) before plugins are let write it, unless a recorded
    /// workspace already holds it. The line is appended in one write, so commands that
    /// record at once do not mix their lines.
    pub fn add(&mut self, workspace: &Path) -> Result<(), RecordError> {
        let Some(file) = self.file.clone() else {
            return Err(RecordError::NoStateDir);
        };
        let workspace = resolve(workspace);
        let covered = self
            .workspaces
            .iter()
            .any(|recorded| workspace.starts_with(recorded));
        if covered {
            return Ok(());
        }
        let mut line = workspace.as_os_str().as_bytes().to_vec();
        if line.contains(&b'\n') {
            return Err(RecordError::LineBreak {
                path: file,
                workspace: workspace.display().to_string(),
            });
        }
        line.push(b'\n');
        let write_error = |error| RecordError::Write {
            path: file.clone(),
            workspace: workspace.clone(),
            error,
        };
        if let Some(dir) = file.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(write_error)?;
        }
        let mut opened = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(O_NOFOLLOW | O_NONBLOCK)
            .open(&file)
            .map_err(write_error)?;
        let metadata = opened.metadata().map_err(write_error)?;
        check_private(&metadata).map_err(write_error)?;
        let empty = metadata.len() == 0;
        if empty {
            line.splice(0..0, HEADER.bytes());
        }
        opened.write_all(&line).map_err(write_error)?;
        self.workspaces.push(workspace);
        Ok(())
    }
}

/// The record's bytes, `None` when there is none yet.
fn read_record(file: &Path) -> Result<Option<Vec<u8>>, RecordError> {
    let read_error = |error| RecordError::Read {
        path: file.to_owned(),
        error,
    };
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(O_NOFOLLOW | O_NONBLOCK)
        .open(file);
    let opened = match opened {
        Ok(opened) => opened,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
        Err(err) if err.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) => {
            return Err(read_error(std::io::Error::other(
                "it is a symbolic link, which the host never follows there",
            )));
        }
        Err(err) => return Err(read_error(err)),
    };
    let metadata = opened.metadata().map_err(read_error)?;
    check_private(&metadata).map_err(read_error)?;
    let mut bytes = Vec::new();
    opened
        .take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(read_error(std::io::Error::other(format!(
            "larger than {} MiB",
            MAX_RECORD_BYTES >> 20
        ))));
    }
    Ok(Some(bytes))
}

/// Refuses a record that is not a regular file, or that another user owns or may write:
/// whoever can write it can strike a workspace off.
fn check_private(metadata: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    if !metadata.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let user = rustix::process::geteuid().as_raw();
    if metadata.uid() != user {
        return Err(std::io::Error::other(format!(
            "owned by uid {}, not by this user (uid {user}); `chown {user}` it",
            metadata.uid()
        )));
    }
    let mode = metadata.mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(std::io::Error::other(format!(
            "mode {mode:03o} lets others write it; `chmod 600` it"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_inside_a_recorded_one_is_not_recorded_twice() {
        let state = tempfile::tempdir().unwrap();
        let ws = tempfile::tempdir().unwrap();
        let file = state.path().join("sub/writable-workspaces");
        let mut record = WritableWorkspaces::load(&file).unwrap();
        record.add(ws.path()).unwrap();
        record.add(&ws.path().join("inner")).unwrap();
        record.add(ws.path()).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with("# Workspaces capstan let plugins write"));
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines, [ws.path().canonicalize().unwrap().to_str().unwrap()]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_symlink_where_the_record_lies_is_refused() {
        let state = tempfile::tempdir().unwrap();
        let target = state.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        let file = state.path().join(WRITABLE_WORKSPACES_FILE);
        std::os::unix::fs::symlink(&target, &file).unwrap();
        let err = WritableWorkspaces::load(&file).unwrap_err();
        assert!(matches!(err, RecordError::Read { .. }), "{err}");
    }

    #[test]
    fn with_no_state_dir_nothing_is_recorded_and_granting_fails() {
        let mut record = WritableWorkspaces::in_state_dir(None).unwrap();
        let err = record.add(Path::new("/tmp")).unwrap_err();
        assert!(err.to_string().contains("CAPSTAN_STATE_DIR"), "{err}");
    }
}
