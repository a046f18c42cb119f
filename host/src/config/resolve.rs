//! Paths as the file system will resolve them, and whether a directory a plugin may write
//! can change what a path names.

use std::path::{Component, Path, PathBuf};

/// `path` made absolute with symlinks resolved; for a path not yet created, its nearest
/// existing ancestor resolved and the rest appended, `..` taken lexically there (nothing
/// beyond a missing directory can be a symlink).
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let real = dir.path().canonicalize()?;
/// let resolved = capstan_host::config::resolve(&dir.path().join("not/yet"));
/// assert_eq!(resolved, real.join("not/yet"));
/// let back = capstan_host::config::resolve(&dir.path().join("missing/../ws"));
/// assert_eq!(back, real.join("ws"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn resolve(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    if let Ok(real) = absolute.canonicalize() {
        return real;
    }
    let mut resolved = PathBuf::new();
    // Once a component is missing, what follows is taken as written.
    let mut exists = true;
    for component in absolute.components() {
        match component {
            Component::ParentDir => {
                resolved.pop();
                if !exists {
                    exists = resolved.exists();
                }
            }
            Component::CurDir => {}
            Component::Normal(name) => {
                resolved.push(name);
                if exists {
                    match resolved.canonicalize() {
                        Ok(real) => resolved = real,
                        Err(_) => exists = false,
                    }
                }
            }
            other => resolved.push(other),
        }
    }
    resolved
}

/// The first of `workspaces` (resolved) from which a plugin that can write it could change
/// what `path` names: the path itself resolves inside it, or a directory it is looked up in
/// does (so the entry could be replaced, a symlink included).
pub(crate) fn inside_any<'a>(
    path: &Path,
    workspaces: impl IntoIterator<Item = &'a Path>,
) -> Option<&'a Path> {
    let lookups = lookups(path);
    workspaces
        .into_iter()
        .find(|workspace| lookups.iter().any(|seen| seen.starts_with(workspace)))
}

/// `path` resolved, and each directory it is looked up in, resolved.
fn lookups(path: &Path) -> Vec<PathBuf> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let mut seen = vec![resolve(&absolute)];
    let mut prefix = PathBuf::new();
    for component in absolute.components() {
        if matches!(component, Component::Normal(_)) && !prefix.as_os_str().is_empty() {
            seen.push(resolve(&prefix));
        }
        prefix.push(component);
    }
    seen
}
