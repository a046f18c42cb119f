//! What a long load says while it works: a component compiled for this machine.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A step of loading a component that takes long enough to show.
#[derive(Debug, Clone, Copy)]
pub enum LoadProgress<'a> {
    /// A component is being compiled: not in the artifact cache, or no cache.
    Compiling {
        /// The component file.
        path: &'a Path,
        /// Its size in bytes.
        bytes: usize,
    },
    /// That compile succeeded.
    Compiled {
        /// The component file.
        path: &'a Path,
        /// Its size in bytes.
        bytes: usize,
        /// How long it took.
        took: Duration,
    },
}

/// Told each [`LoadProgress`] of a host's loads: see
/// [`PluginHost::with_progress`](super::PluginHost::with_progress).
pub type ProgressFn = Arc<dyn Fn(LoadProgress<'_>) + Send + Sync>;
