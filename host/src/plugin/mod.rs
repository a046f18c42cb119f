//! Plugins: loading WebAssembly components and running their tools in sandboxes.
//!
//! - [`PluginHost`] owns the engine: compile (through the [`ArtifactCache`]), check and
//!   link a component, and run each call in a fresh pooled instance under [`Limits`], or
//!   in an instance of the calling process's own ([`ProcessInstances`]) where its policy
//!   reuses them.
//! - [`Registry`] loads a directory of plugins and routes a [`CallRequest`] by tool name,
//!   after the grant check of [`crate::policy`].
//!
//! Nothing here knows about conversations or prompts: a plugin can reach only what its
//! call's sandbox holds.

pub mod adapter;
mod admission;
mod bindings;
mod cache;
mod call_log;
mod capture;
mod channel;
pub mod contract;
mod engine;
mod error;
mod external;
mod failure;
mod file_access;
mod file_streams;
mod host;
mod imports;
mod inspect;
mod limits;
mod loaded;
mod memory_image;
mod offline;
mod progress;
mod registry;
mod sandbox;
mod schema;
mod settle;
mod special_files;
mod touched;
pub mod trust;
mod warm;

pub use cache::{ArtifactCache, CacheError, CacheOutcome};
pub use call_log::CallLog;
pub use error::{HostError, LoadError, PREFER_KEY, ToolError};
pub use external::ExternalTools;
pub use host::PluginHost;
pub use limits::Limits;
pub use loaded::{LoadedPlugin, ToolInfo};
pub(crate) use loaded::{MAX_TOOLS_PER_PLUGIN, check_description, parse_args_schema};
#[doc(hidden)]
pub use loaded::{RawToolSpec, check_describe_output};
pub use progress::{LoadProgress, ProgressFn};
pub use registry::{CallRequest, Recorded, Registry, check_args_object, committed};
pub use settle::{Preferences, Shadowed};
pub use touched::Touched;
pub(crate) use touched::{CallTrace, ReadLabels};
pub use warm::{ProcessInstances, Working};
