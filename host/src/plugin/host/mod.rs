//! [`PluginHost`]: loads components and runs each call in a fresh, bounded instance.
//!
//! `loading.rs` checks, compiles and describes a component; `calling.rs` runs a call in a
//! sandbox under its deadline and limits. This file holds what both share.

mod calling;
mod loading;

use std::sync::Arc;

use tokio::sync::Semaphore;
use wasmtime::Engine;
use wasmtime::component::Linker;

use crate::net::NetHost;
use crate::plugin::cache::ArtifactCache;
use crate::plugin::engine::{build_engine, build_linker, start_epoch_ticker};
use crate::plugin::error::HostError;
use crate::plugin::limits::Limits;
use crate::plugin::progress::ProgressFn;
use crate::plugin::sandbox::Sandbox;
use crate::plugin::trust::Trust;
use crate::plugin::warm::WarmPool;
use crate::services::{AuditSink, Services};

pub(crate) use calling::{Invocation, Linked, impl_linked};

/// Loads plugin components and runs tool calls, each in a fresh sandboxed instance.
///
/// One `PluginHost` owns the wasmtime engine (with its pooling allocator and epoch ticker),
/// the linker and the artifact cache. Most users want a
/// [`Registry`](super::Registry), which loads a directory of plugins into a host and routes
/// calls by tool name.
pub struct PluginHost {
    engine: Engine,
    /// WASI and the Capstan imports: what every call links.
    linker: Linker<Sandbox>,
    /// The same and `wasi:http`: what a call with a network grant links.
    online_linker: Linker<Sandbox>,
    limits: Limits,
    cache: ArtifactCache,
    /// One permit per pooling-allocator slot for calls: callers beyond it wait instead of
    /// failing.
    slots: Semaphore,
    /// The slots for instances kept between calls ([`Limits::max_warm_instances`]); with
    /// none left, the one idle longest makes room, or a call's instance is not kept.
    warm: WarmPool,
    /// Backs the `tasks` and `memory` imports; without it they answer "not available".
    services: Option<Services>,
    /// Where every call is recorded: the services' log, or an explicit
    /// `AuditSink::disabled`(crate::services::AuditSink) that says it keeps nothing.
    audit: Arc<dyn AuditSink>,
    /// The limits and secrets of outbound requests.
    network: Arc<NetHost>,
    /// The signers components must be signed by and the lock their tools must match.
    trust: Arc<Trust>,
    /// Told when a load compiles a component, to show a long compile.
    progress: Option<ProgressFn>,
}

impl PluginHost {
    /// A host with `limits`, caching compiled components in `cache`.
    pub fn new(limits: Limits, cache: ArtifactCache) -> Result<Self, HostError> {
        let engine = build_engine(&limits)?;
        let linker = build_linker(&engine, false)?;
        let online_linker = build_linker(&engine, true)?;
        start_epoch_ticker(&engine);
        let slots = Semaphore::new(limits.max_concurrent_calls.max(1) as usize);
        let warm = WarmPool::new(limits.max_warm_instances as usize);
        Ok(PluginHost {
            engine,
            linker,
            online_linker,
            limits,
            cache,
            slots,
            warm,
            services: None,
            audit: <dyn AuditSink>::disabled(),
            network: Arc::default(),
            trust: Arc::default(),
            progress: None,
        })
    }

    /// Loads only components `trust` lets in: signed by its signers where it requires
    /// it (checked as each file is read), and matching its lock (checked by the
    /// [`Registry`](crate::plugin::Registry) before any tool is offered, MCP tools
    /// included).
    ///
    /// ```
    /// use capstan_host::plugin::trust::{Signers, Trust};
    /// use capstan_host::plugin::{ArtifactCache, Limits, PluginHost};
    ///
    /// let trust = Trust { signers: Signers::required(vec![]), pins: None };
    /// let host = PluginHost::new(Limits::default(), ArtifactCache::disabled())?.with_trust(trust);
    /// assert!(host.trust().signers.are_required());
    /// # Ok::<(), capstan_host::plugin::HostError>(())
    /// ```
    pub fn with_trust(mut self, trust: Trust) -> Self {
        self.trust = Arc::new(trust);
        self
    }

    /// Tells `progress` when a load compiles a component (not in the cache, or no cache)
    /// and when that compile ends, so a long one can be shown.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use capstan_host::plugin::{ArtifactCache, Limits, LoadProgress, PluginHost};
    ///
    /// let host = PluginHost::new(Limits::default(), ArtifactCache::disabled())?
    ///     .with_progress(Arc::new(|step: LoadProgress<'_>| {
    ///         if let LoadProgress::Compiling { path, bytes } = step {
    ///             eprintln!("compiling {} ({bytes} bytes)", path.display());
    ///         }
    ///     }));
    /// # drop(host);
    /// # Ok::<(), capstan_host::plugin::HostError>(())
    /// ```
    pub fn with_progress(mut self, progress: ProgressFn) -> Self {
        self.progress = Some(progress);
        self
    }

    /// What the host trusts: see [`PluginHost::with_trust`].
    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// Runs outbound requests under `network`'s limits, with its secrets.
    pub fn with_network(mut self, network: NetHost) -> Self {
        self.network = Arc::new(network);
        self
    }

    /// The limits and secrets of outbound requests.
    pub fn network(&self) -> &NetHost {
        &self.network
    }

    /// The network, shared: for a client of the host's own (an MCP server at a URL) whose
    /// requests take the egress a plugin's take.
    pub(crate) fn network_handle(&self) -> Arc<NetHost> {
        self.network.clone()
    }

    /// Backs the `tasks` and `memory` imports, and the audit log of calls, with
    /// `services`. Without them, calls are recorded by an `AuditSink::disabled`, which
    /// [`PluginHost::audit`] shows.
    pub fn with_services(mut self, services: Services) -> Self {
        self.audit = services.audit.clone();
        self.services = Some(services);
        self
    }

    /// Where this host records its calls and requests.
    ///
    /// ```
    /// use capstan_host::plugin::{ArtifactCache, Limits, PluginHost};
    /// use capstan_host::services::{AuditDestination, Services};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let host = PluginHost::new(Limits::default(), ArtifactCache::new(dir.path())).unwrap();
    /// assert!(matches!(host.audit().destination(), AuditDestination::Disabled(_)));
    /// let host = host.with_services(Services::in_memory());
    /// assert!(matches!(host.audit().destination(), AuditDestination::Kept(_)));
    /// ```
    pub fn audit(&self) -> &Arc<dyn AuditSink> {
        &self.audit
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The services behind the `tasks` and `memory` imports and the audit log, if any.
    pub fn services(&self) -> Option<&Services> {
        self.services.as_ref()
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Instances kept between calls now, over all processes, idle or running a call; at
    /// most [`Limits::max_warm_instances`].
    ///
    /// ```
    /// use capstan_host::plugin::{ArtifactCache, Limits, PluginHost};
    ///
    /// let host = PluginHost::new(Limits::default(), ArtifactCache::disabled()).unwrap();
    /// assert_eq!(host.kept_instances(), 0);
    /// ```
    pub fn kept_instances(&self) -> usize {
        self.warm.held()
    }
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost")
            .field("limits", &self.limits)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}
