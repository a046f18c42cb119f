//! [`ProcessInstances`]: the plugin instances one process keeps between its calls.
//!
//! A kept instance is the one a fresh call would have built, kept: it is reused only by
//! the same process, for the same plugin, with the same capabilities and workspace, so a
//! call never runs with more than a fresh instance would give it. It goes back to the
//! process only after a call that returned (a result or the tool's own error); a trap, a
//! deadline, a refused memory growth, a cancelled call or a failure of the host drops it,
//! and the next call builds a fresh one.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use capstan_caps::Capability;
use tokio::sync::OwnedSemaphorePermit;
use wasmtime::Store;

use super::bindings::Plugin;
use super::sandbox::{Sandbox, opens_workspace};

/// The instances one agent process (a worker, a branch, a channel) keeps for its calls of
/// plugins that reuse them. It belongs to that process alone: dropping it, when the
/// process ends, drops every instance in it and frees their slots.
///
/// ```
/// use capstan_host::plugin::ProcessInstances;
///
/// let mine = ProcessInstances::new();
/// assert_eq!(mine.len(), 0);
/// ```
#[derive(Default)]
pub struct ProcessInstances {
    idle: Mutex<HashMap<WarmKey, WarmInstance>>,
}

/// What makes two calls' sandboxes the same: the plugin as loaded, the caller (whom its
/// host imports act for), the capabilities the call runs with and the workspace its file
/// capabilities open.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WarmKey {
    plugin: u64,
    caller: String,
    capabilities: Vec<Capability>,
    workspace: Option<PathBuf>,
}

impl WarmKey {
    /// The key of a call of plugin `plugin` (its serial) by `caller` with `capabilities`,
    /// in `workspace`; the workspace counts only where the capabilities open it.
    pub(crate) fn new(
        plugin: u64,
        caller: &str,
        capabilities: &[Capability],
        workspace: Option<&Path>,
    ) -> Self {
        let mut capabilities = capabilities.to_vec();
        capabilities.sort_unstable();
        capabilities.dedup();
        let workspace = workspace
            .filter(|_| opens_workspace(&capabilities))
            .map(Path::to_owned);
        WarmKey {
            plugin,
            caller: caller.to_owned(),
            capabilities,
            workspace,
        }
    }
}

/// An instance and its store, between two calls.
pub(crate) struct WarmInstance {
    pub(crate) store: Store<Sandbox>,
    pub(crate) instance: Plugin,
    /// The resources its guest held after its first call: it is kept only while it holds
    /// no more.
    pub(crate) resources: usize,
    /// Its share of [`Limits::max_warm_instances`](super::Limits::max_warm_instances).
    pub(crate) slot: OwnedSemaphorePermit,
}

impl ProcessInstances {
    /// A process's empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many instances the process keeps now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the process keeps none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the instance kept for `key`, if any: a call owns it while it runs.
    pub(crate) fn take(&self, key: &WarmKey) -> Option<WarmInstance> {
        self.lock().remove(key)
    }

    /// Keeps `warm` for the next call with `key`. One is kept per key (a process makes its
    /// calls one after another); a second, from calls that overlapped, is dropped.
    pub(crate) fn keep(&self, key: WarmKey, warm: WarmInstance) {
        let surplus = match self.lock().entry(key) {
            Entry::Occupied(_) => Some(warm),
            Entry::Vacant(slot) => {
                slot.insert(warm);
                None
            }
        };
        // Dropped outside the lock: freeing an instance returns its pool slot.
        drop(surplus);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WarmKey, WarmInstance>> {
        // No code holding it panics; a poisoned map is still a valid map.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for ProcessInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessInstances")
            .field("kept", &self.len())
            .finish()
    }
}
