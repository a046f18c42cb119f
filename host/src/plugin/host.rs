//! [`PluginHost`]: loads components and runs each call in a fresh, bounded instance.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use capstan_caps::Capability;
use tokio::sync::Semaphore;
use wasmtime::component::Linker;
use wasmtime::{Engine, Store, UpdateDeadline};

use super::bindings::capstan::plugin::types::CallContext;
use super::bindings::exports::capstan::plugin::tool::ToolError as WitToolError;
use super::bindings::exports::capstan::plugin::tool::ToolSpec;
use super::bindings::{Plugin, PluginPre};
use super::cache::{ArtifactCache, CacheKey, CacheOutcome};
use super::contract::WIT_VERSION;
use super::engine::{build_engine, build_linker, start_epoch_ticker};
use super::error::{HostError, LoadError, ToolError};
use super::failure;
use super::inspect::{check_exports, check_header, check_imports, outline};
use super::limits::Limits;
use super::loaded::{LoadedPlugin, RawToolSpec, ToolInfo};
use super::offline::{NotLinked, imports_http, link_http_as_traps};
use super::sandbox::{CallScope, Sandbox};
use super::warm::{ProcessInstances, WarmInstance, WarmKey, WarmPool};
use crate::net::{CallNet, Egress, GrantSource, NetHost, NetScope};
use crate::services::{AuditSink, Services};
use crate::text::{one_line, truncate};

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
    /// [`AuditSink::disabled`](crate::services::AuditSink) that says it keeps nothing.
    audit: Arc<dyn AuditSink>,
    /// The limits and secrets of outbound requests.
    network: Arc<NetHost>,
}

/// One call as the host runs it.
pub(crate) struct Invocation<'a> {
    pub(crate) tool: &'a str,
    pub(crate) args_json: &'a str,
    pub(crate) caller: &'a str,
    pub(crate) call_id: String,
    pub(crate) capabilities: Vec<Capability>,
    pub(crate) workspace: Option<&'a Path>,
    /// What the tool declares and the caller holds of the network, and where the grant
    /// comes from: the call's requests are checked against them.
    pub(crate) declared: &'a [Capability],
    pub(crate) granted: Vec<capstan_caps::NetRule>,
    pub(crate) grant_source: GrantSource,
    /// The calling process's own instances, when its policy reuses this plugin's.
    pub(crate) instances: Option<&'a ProcessInstances>,
}

/// The deadline callback's error, found again in the trap's error chain.
#[derive(Debug)]
struct DeadlineExceeded;

impl std::fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline exceeded")
    }
}

impl std::error::Error for DeadlineExceeded {}

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
        })
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
    /// `services`. Without them, calls are recorded by an [`AuditSink::disabled`], which
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

    /// Loads and checks one component file: it must be a component exporting
    /// `capstan:plugin/tool` at a supported version, import only what plugins may import,
    /// link, and describe valid tools.
    pub async fn load(&self, path: &Path) -> Result<LoadedPlugin, LoadError> {
        let prepared = self.prepare(path)?;
        self.finish(prepared).await
    }

    /// The blocking half of [`PluginHost::load`]: reads and checks the file, compiles it
    /// (or takes its artifact from the cache), links it, and finds its cached tool list.
    /// Nothing of the plugin runs.
    pub(crate) fn prepare(&self, path: &Path) -> Result<Prepared, LoadError> {
        let bytes = read_plugin_file(path)?;
        check_header(path, &bytes)?;
        let started = Instant::now();
        // What it imports and exports is checked before anything is compiled.
        let outline = outline(path, &bytes)?;
        check_imports(path, &outline)?;
        let wit_version = check_exports(path, &outline)?;
        let (component, cache, key) = self.cache.load_keyed(&self.engine, &bytes).map_err(
            |err| match failure::pool_limit(&err, &self.limits) {
                Some(reason) => LoadError::OverLimit {
                    path: path.to_owned(),
                    reason,
                },
                None => LoadError::Invalid {
                    path: path.to_owned(),
                    reason: format!("{err:#}"),
                },
            },
        )?;
        let link_error = |err: wasmtime::Error| LoadError::Link {
            path: path.to_owned(),
            reason: format!("{err:#}"),
        };
        // A component importing wasi:http links twice: with traps in its place for calls
        // without a network grant, and with it for calls that hold one.
        let (pre, online_pre) = if imports_http(&outline.imports) {
            let mut offline = self.linker.clone();
            link_http_as_traps(&mut offline, &self.engine, &component).map_err(link_error)?;
            let online = self
                .online_linker
                .instantiate_pre(&component)
                .map_err(link_error)?;
            (offline, Some(PluginPre::new(online).map_err(link_error)?))
        } else {
            (self.linker.clone(), None)
        };
        let pre = pre.instantiate_pre(&component).map_err(link_error)?;
        let pre = PluginPre::new(pre).map_err(link_error)?;
        // What describe() said of these very bytes on this engine, if the cache kept it
        // sealed: the plugin need not be instantiated to start.
        let cached_tools = self
            .cache
            .tools::<CachedTools>(&key)
            .filter(|cached| cached.described_by == self.describing_host())
            .map(|cached| cached.tools);
        Ok(Prepared {
            path: path.to_owned(),
            wit_version,
            imports: outline.imports,
            cache,
            key,
            cached_tools,
            pre,
            online_pre,
            started,
        })
    }

    /// The rest of [`PluginHost::load`]: the tool list, from the cache or from a
    /// `describe()` call (then kept), checked either way; a list that fails the checks is
    /// never kept.
    pub(crate) async fn finish(&self, prepared: Prepared) -> Result<LoadedPlugin, LoadError> {
        let Prepared {
            path,
            wit_version,
            imports,
            cache,
            key,
            cached_tools,
            pre,
            online_pre,
            started,
        } = prepared;
        let name: Arc<str> = plugin_name(&path).into();
        let tools_cached = cached_tools.is_some();
        let tools = match cached_tools {
            Some(cached) => {
                ToolInfo::from_specs(&path, cached.into_iter().map(ToolSpec::from).collect())?
            }
            None => {
                let specs = self
                    .describe(&pre, &name, &wit_version)
                    .await
                    .map_err(|reason| LoadError::Describe {
                        path: path.clone(),
                        reason,
                    })?;
                let raw = specs.iter().cloned().map(RawToolSpec::from).collect();
                let tools = ToolInfo::from_specs(&path, specs)?;
                let kept = CachedTools {
                    described_by: self.describing_host(),
                    tools: raw,
                };
                self.cache.store_tools(&key, &kept);
                tools
            }
        };
        tracing::debug!(
            plugin = %path.display(),
            ?cache,
            tools_cached,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "plugin loaded"
        );
        Ok(LoadedPlugin {
            serial: NEXT_PLUGIN_SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            path,
            name,
            wit_version,
            imports,
            tools,
            cache,
            tools_cached,
            pre,
            online_pre,
        })
    }

    /// What a cached tool list must have been made under to stand for a `describe()` here:
    /// this host's version and contract, and the memory limit a describe() instantiates
    /// under (a plugin that would not fit now is loaded only by running it again).
    fn describing_host(&self) -> String {
        format!(
            "capstan {} capstan:plugin@{WIT_VERSION} memory {}",
            env!("CARGO_PKG_VERSION"),
            self.limits.memory_bytes
        )
    }

    /// Runs `describe()` in a sandbox without capabilities.
    async fn describe(
        &self,
        pre: &PluginPre<Sandbox>,
        plugin: &Arc<str>,
        contract: &str,
    ) -> Result<Vec<super::bindings::exports::capstan::plugin::tool::ToolSpec>, String> {
        let scope = CallScope {
            plugin: plugin.clone(),
            contract: contract.to_owned(),
            tool: "describe".into(),
            caller: "host".into(),
            capabilities: Vec::new(),
            services: None,
            network: self.network.clone(),
            log_lines: 0,
        };
        let sandbox = Sandbox::new(&self.limits, scope, None, Egress::default())
            .map_err(|e| e.to_string())?;
        self.run(pre, sandbox, async |instance, store| {
            instance.capstan_plugin_tool().call_describe(store).await
        })
        .await
        .map_err(|err| err.message().to_owned())
    }

    /// Runs one tool call in a fresh instance of `plugin`, or in the calling process's own
    /// when it reuses them and the call holds no network grant (a request belongs to the
    /// call that made it, so such a call always starts fresh). What leaves the call (its
    /// output or error) has every secret value redacted.
    pub(crate) async fn invoke(
        &self,
        plugin: &LoadedPlugin,
        call: Invocation<'_>,
    ) -> Result<String, ToolError> {
        let scope = NetScope::new(
            call.tool,
            &call.capabilities,
            call.declared,
            &call.granted,
            call.grant_source.clone(),
        );
        let call_net = scope.map(|scope| {
            let secrets = call
                .capabilities
                .iter()
                .filter_map(|cap| match cap {
                    Capability::Secret(name) => Some(name.clone()),
                    _ => None,
                })
                .collect();
            Arc::new(CallNet::new(
                self.network.clone(),
                call.caller.to_owned(),
                scope,
                secrets,
                self.audit.clone(),
            ))
        });
        let context = CallContext {
            caller: call.caller.to_owned(),
            call_id: call.call_id,
            capabilities: call.capabilities.iter().map(ToString::to_string).collect(),
        };
        let pre = plugin.pre(call_net.is_some());
        let egress = Egress::new(call_net.clone());
        // Built only for a fresh instance: a kept one has its sandbox already.
        let sandbox = || {
            let scope = CallScope {
                plugin: plugin.name.clone(),
                contract: plugin.wit_version.clone(),
                tool: call.tool.to_owned(),
                caller: call.caller.to_owned(),
                capabilities: call.capabilities.clone(),
                services: self.services.clone(),
                network: self.network.clone(),
                log_lines: 0,
            };
            Sandbox::new(&self.limits, scope, call.workspace, egress)
        };
        let run_tool = async |instance: &Plugin, store: &mut Store<Sandbox>| {
            instance
                .capstan_plugin_tool()
                .call_call(store, call.tool, call.args_json, &context)
                .await
        };
        let result = match call.instances.filter(|_| call_net.is_none()) {
            Some(instances) => {
                let key = WarmKey::new(
                    plugin.serial,
                    call.caller,
                    &call.capabilities,
                    call.workspace,
                );
                self.run_kept(instances, key, pre, call.tool, sandbox, run_tool)
                    .await
            }
            None => self.run(pre, sandbox()?, run_tool).await,
        };
        // The store is gone, and with it every response body: each request's row is
        // written, so the call's audit is complete when it returns.
        if let Some(call_net) = &call_net {
            call_net.flush().await;
        }
        // An error's message is the guest's text as much as a result is: redacted and
        // capped alike.
        let redactor = self.network.secrets().redactor();
        let clean = |text: String| self.cap_output(redactor.redact_owned(text));
        match result {
            Ok(Ok(output)) => Ok(clean(output)),
            Ok(Err(err)) => Err(from_wit(err).map_message(clean)),
            Err(err) => Err(err.map_message(clean)),
        }
    }

    /// Instantiates `pre` in a new store holding `sandbox`, bounded by the deadline and the
    /// memory limit, and runs `f` on the instance. A trap, deadline or refused memory growth
    /// becomes [`ToolError::Failed`] naming the cause.
    async fn run<R>(
        &self,
        pre: &PluginPre<Sandbox>,
        sandbox: Sandbox,
        f: impl AsyncFnOnce(&Plugin, &mut Store<Sandbox>) -> wasmtime::Result<R>,
    ) -> Result<R, ToolError> {
        let _slot = self.call_slot().await;
        let mut store = self.new_store(sandbox);
        self.arm_deadline(&mut store);
        let call = async {
            let instance = pre.instantiate_async(&mut store).await?;
            f(&instance, &mut store).await
        };
        let outcome = self.within_deadline(call).await;
        outcome.map_err(|err| self.explain_failure(&store, &err))
    }

    /// [`PluginHost::run`] in the instance `instances` keeps for `key`, or in a fresh one
    /// (its sandbox from `sandbox`) that is kept after the call if a warm slot is free.
    /// Only a call that returned gives its instance back; any failure drops it.
    async fn run_kept<R>(
        &self,
        instances: &ProcessInstances,
        key: WarmKey,
        pre: &PluginPre<Sandbox>,
        tool: &str,
        sandbox: impl FnOnce() -> Result<Sandbox, ToolError>,
        f: impl AsyncFnOnce(&Plugin, &mut Store<Sandbox>) -> wasmtime::Result<R>,
    ) -> Result<R, ToolError> {
        let _slot = self.call_slot().await;
        let (mut store, kept) = match self.warm.take(instances, &key) {
            Some(warm) => {
                let WarmInstance {
                    mut store,
                    instance,
                    resources,
                    slot,
                    ..
                } = warm;
                store.data_mut().begin_call(tool, Egress::default());
                (store, Some((instance, resources, slot)))
            }
            None => (self.new_store(sandbox()?), None),
        };
        self.arm_deadline(&mut store);
        let call = async {
            let (instance, was_kept) = match kept {
                Some((instance, resources, slot)) => (instance, Some((resources, slot))),
                None => (pre.instantiate_async(&mut store).await?, None),
            };
            let output = f(&instance, &mut store).await?;
            Ok((instance, was_kept, output))
        };
        match self.within_deadline(call).await {
            Ok((instance, was_kept, output)) => {
                // What the instance holds now would be there for the process's next call.
                // It is kept only if the guest was refused no memory (one that recovered
                // from a refusal sits at its limit), holds no file and no directory but the
                // workspace (see `Sandbox::holds_only_the_workspace`), and no more resources
                // (streams) than after its first call, and few: a plugin that leaves some
                // open each time would hold them for the life of the process.
                let held = store.data_mut().resources_held();
                let clean = store.data().limiter.refused_growth.is_none()
                    && store.data_mut().holds_only_the_workspace();
                let kept = match was_kept {
                    Some((baseline, slot)) if clean && held <= baseline => Some((baseline, slot)),
                    Some(_) => None,
                    None if clean && held <= MAX_KEPT_RESOURCES => {
                        self.warm.slot().map(|slot| (held, slot))
                    }
                    None => None,
                };
                if let Some((resources, slot)) = kept {
                    let warm = WarmInstance::new(store, instance, resources, slot);
                    self.warm.keep(instances, key, warm);
                }
                Ok(output)
            }
            Err(err) => Err(self.explain_failure(&store, &err)),
        }
    }

    /// A permit to run one call: calls beyond [`Limits::max_concurrent_calls`] wait here.
    async fn call_slot(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.slots
            .acquire()
            .await
            .expect("the slot semaphore is never closed")
    }

    /// A store holding `sandbox`, its memory bounded by the sandbox's limiter.
    fn new_store(&self, sandbox: Sandbox) -> Store<Sandbox> {
        let mut store = Store::new(&self.engine, sandbox);
        store.limiter(|s| &mut s.limiter);
        store
    }

    /// Starts the deadline of the next call on `store`, counted from now: the epoch
    /// callback makes a guest that computes yield at every tick and stops it once the
    /// deadline has passed.
    fn arm_deadline(&self, store: &mut Store<Sandbox>) {
        let started = Instant::now();
        let deadline = self.limits.deadline;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if started.elapsed() >= deadline {
                Err(wasmtime::Error::new(DeadlineExceeded))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
    }

    /// Awaits `call` until the deadline: this stops a guest that waits in a host call (a
    /// sleep, a read that never returns, a slow import). Dropping the call's future
    /// unwinds its fiber; the store, and with it the pool slot, go right after.
    async fn within_deadline<R>(
        &self,
        call: impl Future<Output = wasmtime::Result<R>>,
    ) -> wasmtime::Result<R> {
        match tokio::time::timeout(self.limits.deadline, call).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => Err(wasmtime::Error::new(DeadlineExceeded)),
        }
    }

    /// Turns a trap or host error from a call into a message naming its cause. Guest text
    /// quoted in it is put on one line with its control characters escaped.
    fn explain_failure(&self, store: &Store<Sandbox>, err: &wasmtime::Error) -> ToolError {
        let scope = &store.data().scope;
        let who = format!("tool `{}` (plugin {})", scope.tool, one_line(&scope.plugin));
        if err.downcast_ref::<DeadlineExceeded>().is_some() {
            return ToolError::Failed(format!(
                "{who} ran past its {:.1} s deadline and was stopped",
                self.limits.deadline.as_secs_f64()
            ));
        }
        if let Some(not_linked) = err.downcast_ref::<NotLinked>() {
            return ToolError::Failed(format!(
                "{who} was stopped: {not_linked}. A tool that makes requests declares \
                 `net:HOST` in describe(), and its process's profile grants it (`net = \
                 [\"HOST\"]`); `capstan policy --why KIND TOOL URL` shows what is missing"
            ));
        }
        if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
            return ToolError::Failed(format!(
                "{who} exited with status {} instead of returning a result",
                exit.0
            ));
        }
        if let Some(asked) = store.data().limiter.refused_growth {
            return ToolError::Failed(format!(
                "{who} ran out of memory: it asked for {} MiB, over its {} MiB limit",
                asked.div_ceil(1 << 20),
                self.limits.memory_bytes >> 20
            ));
        }
        if let Some(cause) = failure::pool_limit(err, &self.limits) {
            return ToolError::Failed(format!("{who} cannot be instantiated: {cause}"));
        }
        if let Some(how) = failure::stack_overflow(err) {
            return ToolError::Failed(format!(
                "{who} was stopped by a stack overflow ({how}); recursion too deep or frames \
                 too large"
            ));
        }
        let said = store.data().captured_output();
        let said = one_line(said.trim());
        if let Some(panic) = said.find("panicked at") {
            return ToolError::Failed(format!("{who} panicked: {}", &said[panic..]));
        }
        let trap = match err.downcast_ref::<wasmtime::Trap>() {
            Some(trap) => format!("trapped: {trap}"),
            // Not a trap: the host could not take a value the guest passed it (an enum
            // value no WIT enum has), which a plugin built for another contract does.
            None => {
                let cause = one_line(err.root_cause().to_string().trim()).into_owned();
                let cause = if cause.is_empty() {
                    String::new()
                } else {
                    format!(" ({cause})")
                };
                let theirs = &scope.contract;
                if *theirs == WIT_VERSION {
                    format!(
                        "was stopped: the host could not take a value it passed{cause}; it \
                         was built for this host's capstan:plugin@{WIT_VERSION}, so the \
                         plugin (or its SDK) passed a value its contract has no place for"
                    )
                } else {
                    format!(
                        "was stopped: the host could not take a value it passed{cause}; it \
                         was built for capstan:plugin@{theirs} and this host speaks \
                         capstan:plugin@{WIT_VERSION}: rebuild it with a capstan-sdk for \
                         {WIT_VERSION}"
                    )
                }
            }
        };
        if said.is_empty() {
            ToolError::Failed(format!("{who} {trap}"))
        } else {
            ToolError::Failed(format!("{who} {trap}; it wrote: {said}"))
        }
    }

    /// Cuts `output` to [`Limits::max_output_bytes`], saying so at the end.
    pub(crate) fn cap_output(&self, output: String) -> String {
        let max = self.limits.max_output_bytes;
        if output.len() <= max {
            return output;
        }
        let total = output.len();
        let mut kept = truncate(&output, max).to_owned();
        kept.push_str(&format!(
            "\n[output cut by the host: {total} bytes, over the {} KiB of limits.tool_output_kib; \
             ask for less]",
            max >> 10
        ));
        kept
    }
}

/// The guest's error, its message on one line (it reaches logs and terminals).
fn from_wit(err: WitToolError) -> ToolError {
    let line = |m: String| one_line(&m).into_owned();
    match err {
        WitToolError::InvalidArgs(m) => ToolError::InvalidArgs(line(m)),
        WitToolError::Denied(m) => ToolError::Denied(line(m)),
        WitToolError::NotFound(m) => ToolError::NotFound(line(m)),
        WitToolError::Failed(m) => ToolError::Failed(line(m)),
    }
}

/// Reads a plugin file without ever blocking in `open()`: the file is opened non-blocking
/// (a FIFO would otherwise wait for a writer) and refused unless it is a regular file (a
/// device such as `/dev/zero` would never end).
fn read_plugin_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    use std::io::Read;
    let read_error = |source| LoadError::Read {
        path: path.to_owned(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).map_err(read_error)?;
    let file_type = file.metadata().map_err(read_error)?.file_type();
    if !file_type.is_file() {
        return Err(LoadError::NotAFile {
            path: path.to_owned(),
            kind: describe_file_type(file_type),
        });
    }
    // Read one byte past the cap, so a file that grows while it is read is caught too.
    let mut bytes = Vec::new();
    file.take(MAX_PLUGIN_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_PLUGIN_BYTES {
        return Err(LoadError::OverLimit {
            path: path.to_owned(),
            reason: format!(
                "the file is larger than {} MiB, the most a plugin may be",
                MAX_PLUGIN_BYTES >> 20
            ),
        });
    }
    Ok(bytes)
}

/// A plugin compiled, checked and linked, not yet described: [`PluginHost::prepare`].
pub(crate) struct Prepared {
    path: PathBuf,
    wit_version: String,
    imports: Vec<String>,
    cache: CacheOutcome,
    key: CacheKey,
    cached_tools: Option<Vec<RawToolSpec>>,
    pre: PluginPre<Sandbox>,
    online_pre: Option<PluginPre<Sandbox>>,
    started: Instant,
}

/// A tool list as the artifact cache keeps it, with the host it was described under.
#[derive(serde::Serialize, serde::Deserialize)]
struct CachedTools {
    described_by: String,
    tools: Vec<RawToolSpec>,
}

/// Resources (open files, streams) a kept instance may hold between calls; past it the
/// instance is dropped after its call, as a fresh one would be. An SDK plugin holds its
/// stdio streams and the workspace's preopen.
const MAX_KEPT_RESOURCES: usize = 8;

/// Each loaded plugin's identity, for the instances processes keep of it.
static NEXT_PLUGIN_SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The largest plugin file read: components are a few MiB; a bigger file is refused
/// before it fills memory or ties up the compiler.
const MAX_PLUGIN_BYTES: u64 = 64 << 20;

/// What a file that is not a regular file is, for the refusal.
fn describe_file_type(file_type: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if file_type.is_char_device() {
            return "a character device";
        }
        if file_type.is_block_device() {
            return "a block device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// A plugin's name: its file name without `.wasm`.
fn plugin_name(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| PathBuf::from(path).display().to_string())
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost")
            .field("limits", &self.limits)
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}
