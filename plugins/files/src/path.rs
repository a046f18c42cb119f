//! Workspace-relative paths, checked for a clear message before the sandbox sees them.

use std::path::{Component, Path, PathBuf};

use capstan_sdk::ToolError;

/// Checks that `raw` names a place inside the workspace and returns it as a relative path.
///
/// The sandbox refuses escapes anyway (`..` above the root, absolute paths, symlinks out of
/// the workspace); this check only turns the common cases into messages a model can act on.
pub fn workspace_path(raw: &str) -> Result<PathBuf, ToolError> {
    if raw.contains('\0') {
        return Err(ToolError::invalid_args(format!(
            "path {:?} contains a NUL byte",
            shown(raw)
        )));
    }
    let path = Path::new(raw);
    if path.is_absolute() {
        return Err(ToolError::Denied(format!(
            "path `{}` is absolute; paths are relative to the workspace root",
            shown(raw)
        )));
    }
    let mut depth: usize = 0;
    for part in path.components() {
        match part {
            Component::ParentDir if depth == 0 => {
                return Err(ToolError::Denied(format!(
                    "path `{}` leaves the workspace; paths are relative to the workspace root",
                    shown(raw)
                )));
            }
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    if raw.is_empty() {
        return Ok(PathBuf::from("."));
    }
    Ok(path.to_path_buf())
}

/// Maps an I/O error on `path` to a tool error that names the path.
pub fn io_error(path: &str, err: std::io::Error) -> ToolError {
    ToolError::from(err).context(format!("`{}`", shown(path)))
}

/// The longest path quoted in a message; a model gains nothing from 4,000 characters of it.
const MAX_SHOWN_PATH: usize = 160;

/// `path`, cut to [`MAX_SHOWN_PATH`] bytes with an ellipsis.
pub fn shown(path: &str) -> String {
    if path.len() <= MAX_SHOWN_PATH {
        return path.to_owned();
    }
    let mut end = MAX_SHOWN_PATH;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &path[..end], path.len())
}
