//! Why an agent could not be assembled.

use std::path::PathBuf;

use crate::llm::ProviderError;
use crate::plugin::HostError;
use crate::services::ServiceError;
use crate::store::StoreError;

/// Why [`AgentBuilder::build`](super::AgentBuilder::build) failed. Each names the file or
/// setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The workspace directory could not be created.
    #[error(transparent)]
    Workspace(#[from] crate::config::WorkspaceError),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run could not begin in the services' ledger.
    #[error(transparent)]
    Services(#[from] ServiceError),
    /// The plugin host could not be built.
    #[error(transparent)]
    Host(HostError),
    /// Traces were asked for and cannot be sent.
    #[error(transparent)]
    Traces(#[from] crate::telemetry::TraceError),
    /// A secret's value could not be read.
    #[error(transparent)]
    Secret(#[from] crate::secrets::LoadSecretError),
    /// `capstan.lock` could not be read.
    #[error(transparent)]
    Lock(#[from] crate::plugin::trust::LockError),
    /// A plugins directory could not be read.
    #[error("loading plugins: {source}")]
    Plugins {
        /// The directories searched.
        dirs: Vec<PathBuf>,
        /// Why, naming the directory.
        source: HostError,
    },
    /// A plugin named on its own (not from the directory) was refused.
    #[error("{message}")]
    Plugin {
        /// The plugin file.
        path: PathBuf,
        /// Why it was refused, naming the file and the fix.
        message: String,
    },
    /// The model provider could not be made from `[provider]`.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// `[provider]` plays a script but names none, and no default script was given.
    #[error(
        "[provider] kind = \"scripted\" names no script: set `script = \"path/to/script.toml\"`"
    )]
    NoScript,
}
