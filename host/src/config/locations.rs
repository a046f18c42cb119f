//! Where the host keeps what decides its behaviour (the config, the database, the artifact
//! cache, the plugins, the model script), and the check that no plugin can write any of it.
//!
//! A plugin granted `fs.write` on a workspace can change anything under it. If the config
//! lay there it could grant itself more; if the cache or the plugins did, it could change
//! the code the host runs; if the database or the script did, it could rewrite what the
//! agent remembers or is told. So the host refuses to start when one of them lies inside a
//! workspace that plugins may write. Paths are compared resolved: symlinks are followed
//! (for a path not yet created, from its nearest existing ancestor), and a path is inside
//! the workspace when any directory it passes through is, since a plugin could replace
//! that entry.

use std::fmt;
use std::path::{Path, PathBuf};

use super::WritableWorkspaces;
use super::resolve::{inside_any, resolve};

/// One of the host's own locations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationKind {
    /// The config file.
    Config,
    /// Where the config is looked up (`./capstan.toml`) when there is none yet: a plugin
    /// must not be able to plant one there.
    ConfigLookup,
    /// `agent.data_dir`: the database.
    DataDir,
    /// `capstan.lock`, beside the config, whether or not it is there yet: a plugin that
    /// wrote it would pin itself in.
    LockFile,
    /// `store.spill_file`: the histories the store refused, written to it at the next
    /// start.
    SpillFile,
    /// The precompiled-component cache.
    CacheDir,
    /// The plugins directory.
    PluginsDir,
    /// `provider.script`: the scripted model's script.
    Script,
    /// `--record FILE`: where the model exchanges are saved.
    Recording,
    /// The record of workspaces plugins were let write ([`WritableWorkspaces`]).
    WorkspaceRecord,
    /// A file a secret's or a `capstan serve` token's value is read from: a plugin that
    /// wrote it would choose the key sent to a host, or a token that opens the service.
    SecretFile,
}

impl LocationKind {
    /// How it is named in messages, e.g. `the config file`.
    pub fn as_str(self) -> &'static str {
        match self {
            LocationKind::Config => "the config file",
            LocationKind::ConfigLookup => "the config lookup path (no file there yet)",
            LocationKind::DataDir => "the data dir",
            LocationKind::LockFile => "the lock file",
            LocationKind::SpillFile => "the spill file",
            LocationKind::CacheDir => "the component cache dir",
            LocationKind::PluginsDir => "the plugins dir",
            LocationKind::Script => "the provider script",
            LocationKind::Recording => "the recording (--record)",
            LocationKind::WorkspaceRecord => "the record of writable workspaces",
            LocationKind::SecretFile => "a secret's or token's file",
        }
    }

    /// What moves it out of a workspace an earlier command let plugins write.
    fn fix_when_recorded(self) -> &'static str {
        match self {
            LocationKind::Config | LocationKind::ConfigLookup => {
                "run capstan from outside that workspace, or pass --config FILE outside it"
            }
            other => other.fix(),
        }
    }

    /// What moves it elsewhere.
    fn fix(self) -> &'static str {
        match self {
            LocationKind::Config | LocationKind::ConfigLookup => {
                "keep the config outside the workspace and pass --config FILE, or set the \
                 workspace elsewhere (--workspace DIR, agent.workspace)"
            }
            LocationKind::DataDir => "set agent.data_dir to a directory outside the workspace",
            LocationKind::LockFile => {
                "keep the config, and capstan.lock beside it, outside the workspace and pass \
                 --config FILE"
            }
            LocationKind::SpillFile => "set store.spill_file to a file outside the workspace",
            LocationKind::SecretFile => {
                "keep the file outside the workspace (`file` in [secrets.NAME] or \
                 [serve.tokens.NAME]), or read the value from `env` instead"
            }
            LocationKind::CacheDir => {
                "pass --cache-dir DIR (or set CAPSTAN_CACHE_DIR) outside the workspace, or \
                 --no-cache"
            }
            LocationKind::PluginsDir => {
                "keep every plugins directory (agent.plugins_dir, --plugins-dir, \
                 CAPSTAN_PLUGINS_DIR for the first-party ones) outside the workspace"
            }
            LocationKind::Script => "set provider.script to a file outside the workspace",
            LocationKind::Recording => "record to a file outside the workspace",
            LocationKind::WorkspaceRecord => {
                "set CAPSTAN_STATE_DIR (or XDG_STATE_HOME) to a directory outside the workspace"
            }
        }
    }
}

impl fmt::Display for LocationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A location plugins could write: it lies inside a workspace granted `fs.write`, now or
/// by an earlier command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{kind} {} lies inside the workspace {}{}, {}, so a plugin could change what it is \
     granted or the code the host runs; {}{}",
    path.display(),
    workspace.display(),
    via(resolved, path),
    granted.who(),
    granted.fix(*kind),
    granted.alternative()
)]
pub struct InsideWorkspace {
    /// Which location.
    pub kind: LocationKind,
    /// The location as configured.
    pub path: PathBuf,
    /// The location with symlinks resolved.
    pub resolved: PathBuf,
    /// The workspace, resolved.
    pub workspace: PathBuf,
    /// Which command lets plugins write the workspace.
    pub granted: GrantedBy,
}

/// Which command lets plugins write a workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantedBy {
    /// This one is about to.
    ThisCommand {
        /// Another way out than moving the location, e.g. "call without fs.write".
        alternative: Option<String>,
    },
    /// An earlier one did, and recorded the workspace in `record`.
    EarlierCommand {
        /// The record that lists the workspace ([`WritableWorkspaces`]).
        record: PathBuf,
    },
}

impl GrantedBy {
    fn fix(&self, kind: LocationKind) -> &'static str {
        match self {
            GrantedBy::ThisCommand { .. } => kind.fix(),
            GrantedBy::EarlierCommand { .. } => kind.fix_when_recorded(),
        }
    }

    fn who(&self) -> String {
        match self {
            GrantedBy::ThisCommand { .. } => "which plugins may write (fs.write)".to_owned(),
            GrantedBy::EarlierCommand { record } => format!(
                "which an earlier command let plugins write (fs.write; recorded in {})",
                record.display()
            ),
        }
    }

    fn alternative(&self) -> String {
        match self {
            GrantedBy::ThisCommand {
                alternative: Some(alternative),
            } => format!(", or {alternative}"),
            GrantedBy::ThisCommand { alternative: None } => String::new(),
            GrantedBy::EarlierCommand { record } => format!(
                ", or, once no plugin may write that workspace any more and you have checked \
                 what it holds, delete its line from {}",
                record.display()
            ),
        }
    }
}

fn via(resolved: &Path, path: &Path) -> String {
    if resolved == path {
        String::new()
    } else {
        format!(" (resolved: {})", resolved.display())
    }
}

/// The host's locations and the workspace plugins work in.
///
/// ```
/// use capstan_host::config::{GrantedBy, Locations, LocationKind, WritableWorkspaces};
///
/// let dir = tempfile::tempdir()?;
/// let mut locations = Locations::new(dir.path(), true);
/// locations.add(LocationKind::Config, dir.path().join("capstan.toml"));
/// let err = locations.check().unwrap_err();
/// assert_eq!(err.kind, LocationKind::Config);
///
/// let read_only = Locations { workspace_writable: false, ..locations.clone() };
/// assert!(read_only.check().is_ok());
///
/// // Once recorded as written by plugins, the workspace stays refused.
/// let mut recorded = WritableWorkspaces::load(&dir.path().join("state/writable-workspaces"))?;
/// recorded.add(dir.path())?;
/// let later = Locations { workspace_writable: false, recorded, ..locations };
/// let err = later.check().unwrap_err();
/// assert!(matches!(err.granted, GrantedBy::EarlierCommand { .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Locations {
    /// The workspace file tools work in.
    pub workspace: PathBuf,
    /// Whether some process or call may write it (`fs.write`).
    pub workspace_writable: bool,
    /// The host's own locations, in the order they were added.
    pub entries: Vec<(LocationKind, PathBuf)>,
    /// Said after the fix in an error, e.g. "call without fs.write".
    pub alternative: Option<String>,
    /// The workspaces earlier commands let plugins write; refused whether or not this
    /// one is writable.
    pub recorded: WritableWorkspaces,
}

impl Locations {
    /// No locations yet, for `workspace`.
    pub fn new(workspace: impl Into<PathBuf>, workspace_writable: bool) -> Self {
        Locations {
            workspace: workspace.into(),
            workspace_writable,
            entries: Vec::new(),
            alternative: None,
            recorded: WritableWorkspaces::default(),
        }
    }

    /// Adds one location.
    pub fn add(&mut self, kind: LocationKind, path: impl Into<PathBuf>) -> &mut Self {
        self.entries.push((kind, path.into()));
        self
    }

    /// Every location plugins could write, in order: inside this workspace when it is
    /// writable, or inside a recorded one.
    pub fn violations(&self) -> Vec<InsideWorkspace> {
        let workspace = self.workspace_writable.then(|| resolve(&self.workspace));
        self.entries
            .iter()
            .filter_map(|(kind, path)| {
                let (workspace, granted) = match &workspace {
                    Some(workspace) if inside_any(path, [workspace.as_path()]).is_some() => (
                        workspace.clone(),
                        GrantedBy::ThisCommand {
                            alternative: self.alternative.clone(),
                        },
                    ),
                    _ => (
                        self.recorded.containing(path)?.to_owned(),
                        GrantedBy::EarlierCommand {
                            record: self.recorded.file()?.to_owned(),
                        },
                    ),
                };
                Some(InsideWorkspace {
                    kind: *kind,
                    path: path.clone(),
                    resolved: resolve(path),
                    workspace,
                    granted,
                })
            })
            .collect()
    }

    /// The first location plugins could write, as an error.
    pub fn check(&self) -> Result<(), InsideWorkspace> {
        match self.violations().into_iter().next() {
            Some(violation) => Err(violation),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn symlinks_in_either_direction_do_not_dodge_the_check() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let ws = root.join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        // A link outside pointing in, a link inside pointing out, a link to the workspace.
        std::os::unix::fs::symlink(ws.join("sub"), root.join("in-link")).unwrap();
        std::os::unix::fs::symlink(root.join("outside"), ws.join("out-link")).unwrap();
        std::os::unix::fs::symlink(&ws, root.join("ws-link")).unwrap();
        let reachable_from =
            |path: &Path, workspace: &Path| inside_any(path, [workspace]).is_some();
        let inside = |path: PathBuf| reachable_from(&path, &resolve(&ws));
        assert!(inside(root.join("in-link/cache")));
        assert!(
            inside(ws.join("out-link/capstan.toml")),
            "the link can be replaced"
        );
        assert!(inside(ws.join("not/yet/created")));
        assert!(inside(ws.clone()));
        assert!(reachable_from(
            &root.join("ws-link/capstan.toml"),
            &resolve(&root.join("ws-link"))
        ));
        assert!(!inside(root.join("outside/capstan.toml")));
        assert!(!inside(root.join("ws/../outside/x")));
        assert!(
            !inside(root.join("wsx/capstan.toml")),
            "a sibling with a longer name"
        );
    }
}
