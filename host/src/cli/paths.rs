//! Default locations of the plugins directory, the artifact cache and the host's state.

use std::path::PathBuf;

use anyhow::bail;

/// `$CAPSTAN_PLUGINS_DIR`; else `<build dir>/plugins` for a binary in `target/<profile>/`
/// (where `scripts/setup` installs the first-party plugins), so the binary finds them from
/// any working directory; else `./target/plugins`.
pub(crate) fn default_plugins_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CAPSTAN_PLUGINS_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let beside_binary = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("plugins")));
    let candidates = beside_binary
        .into_iter()
        .chain([PathBuf::from("target/plugins")]);
    let mut tried = Vec::new();
    for dir in candidates {
        if dir.is_dir() {
            return Ok(dir);
        }
        tried.push(dir.display().to_string());
    }
    bail!(
        "no plugins directory found (tried {}); build the plugins with `bash scripts/setup`, \
         or pass --plugins-dir DIR",
        tried.join(", ")
    )
}

/// Whether `a` and `b` name the same directory (by their canonical paths when both exist).
pub(crate) fn same_dir(a: &std::path::Path, b: &std::path::Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// `$CAPSTAN_CACHE_DIR`, else `$XDG_CACHE_HOME/capstan`, else `~/.cache/capstan`.
pub(crate) fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("CAPSTAN_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("capstan"));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/capstan"))
}

/// Where the host keeps what must outlive one command and stay out of plugins' reach (the
/// record of writable workspaces): `$CAPSTAN_STATE_DIR`, else `$XDG_STATE_HOME/capstan`,
/// else `~/.local/state/capstan`. A relative path would name another directory from each
/// working directory: `CAPSTAN_STATE_DIR` must be absolute, and a relative
/// `XDG_STATE_HOME` is ignored, as the XDG spec says.
pub(crate) fn default_state_dir() -> anyhow::Result<Option<PathBuf>> {
    if let Some(dir) = std::env::var_os("CAPSTAN_STATE_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        anyhow::ensure!(
            dir.is_absolute(),
            "CAPSTAN_STATE_DIR must be an absolute path, got {}",
            dir.display()
        );
        return Ok(Some(dir));
    }
    let xdg = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from);
    if let Some(dir) = xdg.filter(|dir| dir.is_absolute()) {
        return Ok(Some(dir.join("capstan")));
    }
    Ok(std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|home| home.is_absolute())
        .map(|home| home.join(".local/state/capstan")))
}
