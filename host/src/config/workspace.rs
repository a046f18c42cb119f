//! Making the workspace directory, with an error that says what to change.

use std::path::{Path, PathBuf};

/// The workspace cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The path is a file (or something else that is not a directory).
    #[error(
        "the workspace {} is a file, not a directory (it, or a directory on its path); \
         point agent.workspace (or --workspace) at a directory, or move the file away",
        path.display()
    )]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The directory could not be created.
    #[error(
        "cannot create the workspace {}: {source}; check the permissions of its parent, or \
         choose another with agent.workspace (or --workspace)",
        path.display()
    )]
    Create {
        /// The path.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
}

/// Creates the workspace `path` (and its parents) if it is missing.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let file = dir.path().join("notes.txt");
/// std::fs::write(&file, "not a directory").unwrap();
/// let err = capstan_host::config::make_workspace(&file).unwrap_err();
/// assert!(err.to_string().contains("is a file, not a directory"));
/// capstan_host::config::make_workspace(&dir.path().join("ws")).unwrap();
/// ```
pub fn make_workspace(path: &Path) -> Result<(), WorkspaceError> {
    check_workspace(path)?;
    std::fs::create_dir_all(path).map_err(|source| match source.kind() {
        // A parent on the way that is a file.
        std::io::ErrorKind::NotADirectory | std::io::ErrorKind::AlreadyExists => {
            WorkspaceError::NotADirectory {
                path: path.to_owned(),
            }
        }
        _ => WorkspaceError::Create {
            path: path.to_owned(),
            source,
        },
    })
}

/// Refuses a workspace `path` that is there but is not a directory, as every command that
/// works in one does before it starts, whether or not it creates a missing one.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let file = dir.path().join("notes.txt");
/// std::fs::write(&file, "not a directory").unwrap();
/// let err = capstan_host::config::check_workspace(&file).unwrap_err();
/// assert!(err.to_string().contains("is a file, not a directory"));
/// capstan_host::config::check_workspace(dir.path()).unwrap();
/// ```
pub fn check_workspace(path: &Path) -> Result<(), WorkspaceError> {
    if path.exists() && !path.is_dir() {
        return Err(WorkspaceError::NotADirectory {
            path: path.to_owned(),
        });
    }
    Ok(())
}
