//! Instances kept between calls: [`ProcessInstances`], the ones one process keeps, and
//! [`WarmPool`], the host-wide bound on all of them.
//!
//! A kept instance is the one a fresh call would have built, kept: it is reused only by
//! the same process, for the same plugin, with the same capabilities and workspace, so a
//! call never runs with more than a fresh instance would give it. It goes back to the
//! process only after a call that returned (a result or the tool's own error); a trap, a
//! deadline, a refused memory growth, a cancelled call or a failure of the host drops it,
//! and the next call builds a fresh one.
//!
//! The pool holds [`Limits::max_warm_instances`](super::Limits::max_warm_instances) slots.
//! When they are all taken, a call that would keep its instance drops the one that has
//! waited longest among those of processes not running a round of tool calls
//! ([`ProcessInstances::working`]): a conversation left open for hours does not hold a
//! slot that busy processes need, and processes in the middle of their rounds do not take
//! each other's instances in turn, each call paying for an instance and its drop.
//! Dropping an instance is always safe: its process's next call builds a fresh one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use capstan_caps::Capability;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::Store;

use super::bindings::Plugin;
use super::sandbox::{Sandbox, opens_workspace};
use crate::ids::Caller;

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
    idle: Arc<IdleInstances>,
    /// Rounds of tool calls under way ([`ProcessInstances::working`]): while any is, none
    /// of the instances makes room for another process's.
    working: Arc<AtomicUsize>,
}

/// A process's round of tool calls, from [`ProcessInstances::working`] until dropped.
#[must_use = "the process is working only while this is held"]
pub struct Working(Arc<AtomicUsize>);

impl Drop for Working {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A process's idle instances, one per key. Shared with the [`WarmPool`] only weakly, so
/// that the pool can evict one without keeping the process's set alive.
#[derive(Default)]
struct IdleInstances(Mutex<IdleSet>);

/// Idle instances by key, in a list: a process keeps a few (one per plugin and capability
/// set it calls), and comparing a few keys costs less than hashing one on every call.
#[derive(Default)]
struct IdleSet(Vec<(WarmKey, WarmInstance)>);

impl IdleSet {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn position(&self, key: &WarmKey) -> Option<usize> {
        self.0.iter().position(|(kept, _)| kept == key)
    }

    fn remove(&mut self, key: &WarmKey) -> Option<WarmInstance> {
        let at = self.position(key)?;
        Some(self.0.swap_remove(at).1)
    }

    /// Removes the instance that went idle at `stamp` (unique across pools), if it is
    /// still here.
    fn remove_stamped(&mut self, stamp: u64) -> Option<WarmInstance> {
        let at = self
            .0
            .iter()
            .position(|(_, warm)| warm.idle_since == stamp)?;
        Some(self.0.swap_remove(at).1)
    }

    fn values(&self) -> impl Iterator<Item = &WarmInstance> {
        self.0.iter().map(|(_, warm)| warm)
    }
}

/// What makes two calls' sandboxes the same: the plugin as loaded, the caller (whom its
/// host imports act for), the capabilities the call runs with and the workspace its file
/// capabilities open.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct WarmKey {
    plugin: u64,
    caller: Caller,
    capabilities: Vec<Capability>,
    workspace: Option<PathBuf>,
}

impl WarmKey {
    /// The key of a call of plugin `plugin` (its serial) by `caller` with `capabilities`,
    /// in `workspace`; the workspace counts only where the capabilities open it.
    pub(crate) fn new(
        plugin: u64,
        caller: &Caller,
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
            caller: caller.clone(),
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
    /// When it last went idle, in the pool's order: its entry in [`WarmPool`]'s index.
    idle_since: u64,
    /// That index, to leave it when its process ends.
    index: Weak<Mutex<IdleIndex>>,
}

impl WarmInstance {
    /// `store` and `instance`, holding `resources` and `slot`, about to be kept.
    pub(crate) fn new(
        store: Store<Sandbox>,
        instance: Plugin,
        resources: usize,
        slot: OwnedSemaphorePermit,
    ) -> Self {
        WarmInstance {
            store,
            instance,
            resources,
            slot,
            idle_since: 0,
            index: Weak::new(),
        }
    }
}

impl ProcessInstances {
    /// A process's empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many instances the process keeps now.
    pub fn len(&self) -> usize {
        self.idle.lock().len()
    }

    /// Whether the process keeps none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks the process as working (running a round of tool calls) until the returned
    /// guard drops: its instances are not dropped to make room for another process's
    /// meanwhile. Otherwise (waiting for a model, for input), the one idle longest of any
    /// process may be.
    ///
    /// ```
    /// use capstan_host::plugin::ProcessInstances;
    ///
    /// let mine = ProcessInstances::new();
    /// let round = mine.working();
    /// // ... the round's calls ...
    /// drop(round);
    /// ```
    pub fn working(&self) -> Working {
        self.working.fetch_add(1, Ordering::AcqRel);
        Working(self.working.clone())
    }
}

impl IdleInstances {
    fn lock(&self) -> MutexGuard<'_, IdleSet> {
        // No code holding it panics; a poisoned list is still a valid list.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The host's slots for kept instances, and every idle one in the order it went idle.
///
/// Lock order: the pool's index, then a process's idle set; instances are dropped outside
/// both (dropping one returns its memory to the allocator).
pub(crate) struct WarmPool {
    slots: Arc<Semaphore>,
    capacity: usize,
    index: Arc<Mutex<IdleIndex>>,
}

/// Idle instances, oldest first: which process keeps each and whether it is working.
#[derive(Default)]
struct IdleIndex {
    oldest: BTreeMap<u64, IdleEntry>,
}

/// The stamp of the next instance to go idle, unique across every pool: a process's set
/// may hold instances of two hosts' pools, and an eviction finds its instance by stamp.
static NEXT_STAMP: AtomicU64 = AtomicU64::new(0);

struct IdleEntry {
    owner: Weak<IdleInstances>,
    working: Arc<AtomicUsize>,
}

impl WarmPool {
    /// A pool of `capacity` slots.
    pub(crate) fn new(capacity: usize) -> Self {
        WarmPool {
            slots: Arc::new(Semaphore::new(capacity)),
            capacity,
            index: Arc::default(),
        }
    }

    /// Instances kept now, idle or running a call.
    pub(crate) fn held(&self) -> usize {
        self.capacity - self.slots.available_permits()
    }

    /// Takes the instance `instances` keeps for `key`, if any: a call owns it while it
    /// runs, and no other call can evict it meanwhile.
    pub(crate) fn take(&self, instances: &ProcessInstances, key: &WarmKey) -> Option<WarmInstance> {
        let mut index = self.lock();
        let warm = instances.idle.lock().remove(key)?;
        index.oldest.remove(&warm.idle_since);
        Some(warm)
    }

    /// Keeps `warm` in `instances` for the next call with `key`, as the newest idle
    /// instance. One is kept per key (a process makes its calls one after another); a
    /// second, from calls that overlapped, is dropped.
    pub(crate) fn keep(&self, instances: &ProcessInstances, key: WarmKey, mut warm: WarmInstance) {
        let surplus = {
            let mut index = self.lock();
            let mut idle = instances.idle.lock();
            if idle.position(&key).is_some() {
                Some(warm)
            } else {
                let stamp = NEXT_STAMP.fetch_add(1, Ordering::Relaxed);
                warm.idle_since = stamp;
                warm.index = Arc::downgrade(&self.index);
                let entry = IdleEntry {
                    owner: Arc::downgrade(&instances.idle),
                    working: instances.working.clone(),
                };
                index.oldest.insert(stamp, entry);
                idle.0.push((key, warm));
                None
            }
        };
        drop(surplus);
    }

    /// A slot for an instance to keep: a free one, or the one held by the instance idle
    /// longest among those of processes not working, which is dropped. `None` when no
    /// such instance is left (every slot is held by a call running or a process working),
    /// or there are no slots.
    pub(crate) fn slot(&self) -> Option<OwnedSemaphorePermit> {
        loop {
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                return Some(slot);
            }
            // Taken out under the locks, dropped outside them: its slot is then free.
            let evicted = self.evict_oldest()?;
            drop(evicted);
        }
    }

    /// Removes the instance idle longest of a process not working; `None` when there
    /// is none, `Some(None)` when the one found had gone meanwhile.
    fn evict_oldest(&self) -> Option<Option<WarmInstance>> {
        // The index is released before the owner is upgraded: that reference may be the
        // last to a process's set, whose drop takes the index lock.
        let (stamp, entry) = {
            let mut index = self.lock();
            let stamp = index
                .oldest
                .iter()
                .find(|(_, entry)| entry.working.load(Ordering::Acquire) == 0)
                .map(|(stamp, _)| *stamp)?;
            (stamp, index.oldest.remove(&stamp)?)
        };
        // A process that ended took its instances with it.
        let Some(owner) = entry.owner.upgrade() else {
            return Some(None);
        };
        // Taken (and perhaps kept again, newer) since it was listed: not this one.
        let evicted = owner.lock().remove_stamped(stamp);
        Some(evicted)
    }

    fn lock(&self) -> MutexGuard<'_, IdleIndex> {
        lock_index(&self.index)
    }
}

impl Drop for IdleInstances {
    /// The process ended: its instances leave their pools' index, then drop.
    fn drop(&mut self) {
        let idle = self
            .0
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for warm in idle.values() {
            if let Some(index) = warm.index.upgrade() {
                lock_index(&index).oldest.remove(&warm.idle_since);
            }
        }
    }
}

fn lock_index(index: &Mutex<IdleIndex>) -> MutexGuard<'_, IdleIndex> {
    // No code holding it panics; a poisoned index is still a valid index.
    index
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl std::fmt::Debug for ProcessInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessInstances")
            .field("kept", &self.len())
            .finish()
    }
}
