//! The errors of loading a plugin and of calling a tool.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::trust::{Change, Changes, SignatureError};

/// Why a tool call produced no result. The four kinds are the WIT `tool-error` cases; the
/// message is written for the model (and the person reading the log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", content = "message", rename_all = "kebab-case")]
pub enum ToolError {
    /// The arguments are not valid JSON, not an object, or do not match the schema.
    #[error("invalid-args: {0}")]
    InvalidArgs(String),
    /// A capability or scope check refused the call.
    #[error("denied: {0}")]
    Denied(String),
    /// No such tool, or the thing the tool was asked about does not exist.
    #[error("not-found: {0}")]
    NotFound(String),
    /// The tool failed, trapped, ran past its deadline or out of memory.
    #[error("failed: {0}")]
    Failed(String),
}

impl ToolError {
    /// The same kind of error with its message passed through `f`.
    pub(crate) fn map_message(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            ToolError::InvalidArgs(m) => ToolError::InvalidArgs(f(m)),
            ToolError::Denied(m) => ToolError::Denied(f(m)),
            ToolError::NotFound(m) => ToolError::NotFound(f(m)),
            ToolError::Failed(m) => ToolError::Failed(f(m)),
        }
    }

    /// The kind as the WIT spells it: `invalid-args`, `denied`, `not-found` or `failed`.
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::InvalidArgs(_) => "invalid-args",
            ToolError::Denied(_) => "denied",
            ToolError::NotFound(_) => "not-found",
            ToolError::Failed(_) => "failed",
        }
    }

    /// The text a model is shown for this error, `error[kind]: message`: the one place it
    /// is spelled, for plugin and host tools alike.
    ///
    /// ```
    /// use capstan_host::plugin::ToolError;
    ///
    /// let err = ToolError::Denied("`fs.write` is not granted".into());
    /// assert_eq!(err.for_model(), "error[denied]: `fs.write` is not granted");
    /// ```
    pub fn for_model(&self) -> String {
        format!("error[{}]: {}", self.kind(), self.message())
    }

    /// The message without the kind.
    pub fn message(&self) -> &str {
        match self {
            ToolError::InvalidArgs(m)
            | ToolError::Denied(m)
            | ToolError::NotFound(m)
            | ToolError::Failed(m) => m,
        }
    }
}

/// Why a component was refused at load. Each names the file and says what would fix it.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The plugin file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The path is not a regular file (a FIFO, a device, a directory): refused before any
    /// read, which could block or never end.
    #[error("{}: is {kind}, not a regular file; a plugin is a `.wasm` component file", path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is instead, e.g. `a FIFO (named pipe)`.
        kind: &'static str,
    },
    /// The component is valid but does not fit this host's engine: it exceeds one of its
    /// limits, or uses a feature the engine leaves off (the async component ABI).
    #[error("{}: cannot run in this host: {reason}", path.display())]
    OverLimit {
        /// The plugin file.
        path: PathBuf,
        /// The limit or the feature, and the setting that raises it or what to build
        /// instead.
        reason: String,
    },
    /// The file does not start with the WebAssembly magic bytes.
    #[error("{}: not a WebAssembly file (no `\\0asm` header); plugins are components built for wasm32-wasip2", path.display())]
    NotWasm {
        /// The plugin file.
        path: PathBuf,
    },
    /// A core module where a component was expected.
    #[error("{}: a core WebAssembly module, not a component; build it with `--target wasm32-wasip2` (or wrap it with `wasm-tools component new`)", path.display())]
    CoreModule {
        /// The plugin file.
        path: PathBuf,
    },
    /// The component is malformed (truncated, corrupt) or uses features this host lacks.
    #[error("{}: not a valid component: {reason}; rebuild the plugin", path.display())]
    Invalid {
        /// The plugin file.
        path: PathBuf,
        /// What wasmtime reported.
        reason: String,
    },
    /// The component exports no `capstan:plugin/tool`.
    #[error("{}: does not export `capstan:plugin/tool` (it exports: {exports}); export the tools with capstan-sdk's `export_plugin!`", path.display())]
    MissingToolExport {
        /// The plugin file.
        path: PathBuf,
        /// What it exports instead.
        exports: String,
    },
    /// The component targets another version of the WIT package.
    #[error("{}", wit_version_message(path, found, supported))]
    WitVersion {
        /// The plugin file.
        path: PathBuf,
        /// The version the component was built against.
        found: String,
        /// The version this host implements.
        supported: &'static str,
    },
    /// The component imports interfaces this host does not offer plugins.
    #[error("{}: imports {}, which this host does not provide to plugins (allowed: {allowed}); remove the dependency that pulls {} in, or build against the `plugin` or `plugin-wasi` world", path.display(), quoted(imports), if imports.len() == 1 { "it" } else { "them" })]
    ImportsNotProvided {
        /// The plugin file.
        path: PathBuf,
        /// Every import refused.
        imports: Vec<String>,
        /// The allow-list, for the reader.
        allowed: String,
    },
    /// Linking or pre-instantiating the component failed.
    #[error("{}: cannot be linked: {reason}", path.display())]
    Link {
        /// The plugin file.
        path: PathBuf,
        /// What wasmtime reported.
        reason: String,
    },
    /// `describe()` trapped, timed out or returned something unusable.
    #[error("{}: describe() failed: {reason}", path.display())]
    Describe {
        /// The plugin file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// `describe()` returned more tools than a plugin may offer.
    #[error("{}: describes {count} tools, over the limit of {max} per plugin; split it into several plugins", path.display())]
    TooManyTools {
        /// The plugin file.
        path: PathBuf,
        /// How many it described.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// One tool's spec is invalid.
    #[error("{}: tool `{tool}`: {reason}", path.display())]
    BadToolSpec {
        /// The plugin file.
        path: PathBuf,
        /// The tool's name as given.
        tool: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tool name another plugin also declares, with no preference settling it.
    #[error("{}", duplicate_message(path, tool, others, choices, preferred.as_deref()))]
    DuplicateTool {
        /// The plugin file refused.
        path: PathBuf,
        /// The tool name.
        tool: String,
        /// The other plugins that declare it.
        others: Vec<PathBuf>,
        /// The plugin names a preference may choose from.
        choices: Vec<String>,
        /// The plugin `plugins.prefer` names for this tool, when it declares no such tool.
        preferred: Option<String>,
    },
    /// The config requires signatures and this component's does not let it in.
    #[error("{}: {reason}", path.display())]
    Signature {
        /// The plugin file.
        path: PathBuf,
        /// What is wrong with the signature, naming its file and key.
        reason: SignatureError,
    },
    /// A lock is in force and does not pin this component as it is.
    #[error("{}", unpinned_message(path, plugin, lock, changes))]
    Unpinned {
        /// The plugin file.
        path: PathBuf,
        /// The plugin's name.
        plugin: String,
        /// The lock file.
        lock: PathBuf,
        /// What differs from its pin.
        changes: Changes,
    },
    /// The lock pins a plugin whose file is not in the plugins directory.
    #[error("{}: plugin `{plugin}` is pinned in {} but its file is missing, so its tools are not offered; `capstan plugins accept {plugin}` drops it from the lock", path.display(), lock.display())]
    PinnedMissing {
        /// Where its file would be.
        path: PathBuf,
        /// The plugin's name.
        plugin: String,
        /// The lock file.
        lock: PathBuf,
    },
}

fn unpinned_message(
    path: &std::path::Path,
    plugin: &str,
    lock: &std::path::Path,
    changes: &Changes,
) -> String {
    let accept = format!("`capstan plugins accept {plugin}` accepts it");
    if changes.iter().any(|change| *change == Change::NoLockFile) {
        return format!(
            "{}: plugin `{plugin}` is not offered: there is no {}, and the config requires one \
             (plugins.require_lock); `capstan plugins lock` writes it",
            path.display(),
            lock.display()
        );
    }
    if changes.iter().any(|change| *change == Change::NotLocked) {
        return format!(
            "{}: plugin `{plugin}` is not offered: it is not in {}; {accept}",
            path.display(),
            lock.display()
        );
    }
    format!(
        "{}: plugin `{plugin}` is not offered: it changed since {} was written: {changes}; {accept}",
        path.display(),
        lock.display()
    )
}

/// The config key that settles duplicate tool names, for messages.
pub const PREFER_KEY: &str = "plugins.prefer";

fn duplicate_message(
    path: &std::path::Path,
    tool: &str,
    others: &[PathBuf],
    choices: &[String],
    preferred: Option<&str>,
) -> String {
    let others: Vec<String> = others.iter().map(|p| p.display().to_string()).collect();
    let mut text = format!(
        "{}: tool `{tool}` is also declared by {}; a plugin never shadows another's tool, so \
         this one is refused. To choose the plugin that provides `{tool}`, set \
         `{PREFER_KEY}.{tool} = \"<plugin>\"` in capstan.toml (one of: {})",
        path.display(),
        others.join(", "),
        choices.join(", ")
    );
    if let Some(name) = preferred {
        text.push_str(&format!(
            "; `{PREFER_KEY}.{tool}` names `{name}`, which does not declare it"
        ));
    }
    text
}

impl LoadError {
    /// The plugin file this error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            LoadError::Read { path, .. }
            | LoadError::NotAFile { path, .. }
            | LoadError::OverLimit { path, .. }
            | LoadError::NotWasm { path }
            | LoadError::CoreModule { path }
            | LoadError::Invalid { path, .. }
            | LoadError::MissingToolExport { path, .. }
            | LoadError::WitVersion { path, .. }
            | LoadError::ImportsNotProvided { path, .. }
            | LoadError::Link { path, .. }
            | LoadError::Describe { path, .. }
            | LoadError::TooManyTools { path, .. }
            | LoadError::BadToolSpec { path, .. }
            | LoadError::DuplicateTool { path, .. }
            | LoadError::Signature { path, .. }
            | LoadError::Unpinned { path, .. }
            | LoadError::PinnedMissing { path, .. } => path,
        }
    }
}

/// Why a host could not be set up at all (as opposed to one plugin being refused).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The wasmtime engine rejected the configuration.
    #[error("cannot configure the WebAssembly engine: {0}")]
    Engine(String),
    /// The plugins directory could not be listed.
    #[error("{}: cannot list the plugins directory: {source}", path.display())]
    PluginsDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The most names [`quoted`] lists before it counts the rest.
const MAX_QUOTED: usize = 10;

/// `a`, `b` and `c`, each in backquotes; past [`MAX_QUOTED`], the rest counted.
fn quoted(names: &[String]) -> String {
    let mut quoted: Vec<String> = names
        .iter()
        .take(MAX_QUOTED)
        .map(|name| format!("`{}`", crate::text::echo_name(name, 96)))
        .collect();
    if names.len() > MAX_QUOTED {
        quoted.push(format!("{} more", names.len() - MAX_QUOTED));
    }
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// What [`LoadError::WitVersion`] says: both versions, whether the plugin is older or newer,
/// and the one step that fixes it.
fn wit_version_message(path: &std::path::Path, found: &str, supported: &str) -> String {
    let newer = match (
        semver::Version::parse(found),
        semver::Version::parse(supported),
    ) {
        (Ok(theirs), Ok(ours)) => theirs > ours,
        _ => false,
    };
    let path = path.display();
    if newer {
        format!(
            "{path}: built for capstan:plugin@{found}, a newer contract than this host's \
             capstan:plugin@{supported}; run a capstan that speaks {found}, or rebuild the \
             plugin against {supported} with this capstan: `capstan plugins build DIR --update-wit`"
        )
    } else {
        format!(
            "{path}: built for capstan:plugin@{found}, but this host speaks \
             capstan:plugin@{supported} only; rebuild it against {supported}: \
             `capstan plugins build DIR --update-wit` in its project (the wit/ and SDK of this \
             capstan, then the build)"
        )
    }
}
