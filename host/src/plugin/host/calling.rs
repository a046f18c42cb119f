//! Calling a tool: a fresh or kept instance, its sandbox, the deadline and the limits,
//! and the failure explained.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use capstan_caps::Capability;
use futures_util::FutureExt;
use wasmtime::{Store, UpdateDeadline};

use super::PluginHost;
use crate::ids::Caller;
use crate::net::{CallNet, Egress, GrantSource, NetScope};
use crate::plugin::bindings::capstan::plugin::types::CallContext;
use crate::plugin::bindings::exports::capstan::plugin::tool::ToolError as WitToolError;
use crate::plugin::bindings::{Plugin, PluginPre};
use crate::plugin::contract::WIT_VERSION;
use crate::plugin::error::ToolError;
use crate::plugin::failure;
use crate::plugin::limits::FUEL;
use crate::plugin::loaded::LoadedPlugin;
use crate::plugin::memory_image;
use crate::plugin::offline::NotLinked;
use crate::plugin::sandbox::{CallScope, Sandbox};
use crate::plugin::touched::{CallTrace, Ran};
use crate::plugin::warm::{ProcessInstances, WarmInstance, WarmKey};
use crate::services::Receipt;
use crate::text::{one_line, truncate};

/// One call as the host runs it.
pub(crate) struct Invocation<'a> {
    pub(crate) tool: &'a str,
    pub(crate) args_json: &'a str,
    pub(crate) caller: &'a Caller,
    pub(crate) call_id: String,
    pub(crate) capabilities: Vec<Capability>,
    pub(crate) workspace: Option<&'a Path>,
    /// What the tool declares and the caller holds of the network, and where the grant
    /// comes from: the call's requests are checked against them.
    pub(crate) declared: &'a [Capability],
    pub(crate) granted: Vec<capstan_caps::NetRule>,
    pub(crate) grant_source: GrantSource,
    /// What the caller put into the call, and where what the call touches is noted.
    pub(crate) trace: &'a CallTrace,
    /// The calling process's own instances, when its policy reuses this plugin's.
    pub(crate) instances: Option<&'a ProcessInstances>,
}

/// A component linked for one world, ready to instantiate: a tool plugin's, or a
/// messaging adapter's (the same component, linked the same way, seen through its
/// `capstan:channel/adapter` export).
pub(crate) trait Linked: Sync {
    /// The world's bindings to one instance.
    type Instance: Send + Sync;

    /// The linked component.
    fn instance_pre(&self) -> &wasmtime::component::InstancePre<Sandbox>;

    /// A new instance in `store`.
    fn instantiate(
        &self,
        store: &mut Store<Sandbox>,
    ) -> impl Future<Output = wasmtime::Result<Self::Instance>> + Send;
}

/// Implements [`Linked`] for a world's `...Pre<Sandbox>` whose instances are `...`: what
/// bindgen generates for every world is the same.
macro_rules! impl_linked {
    ($pre:ty => $instance:ty) => {
        impl $crate::plugin::host::Linked for $pre {
            type Instance = $instance;

            fn instance_pre(
                &self,
            ) -> &wasmtime::component::InstancePre<$crate::plugin::sandbox::Sandbox> {
                <$pre>::instance_pre(self)
            }

            fn instantiate(
                &self,
                store: &mut wasmtime::Store<$crate::plugin::sandbox::Sandbox>,
            ) -> impl Future<Output = wasmtime::Result<$instance>> + Send {
                self.instantiate_async(store)
            }
        }
    };
}
pub(crate) use impl_linked;

impl_linked!(PluginPre<Sandbox> => Plugin);

/// What a run gave, and the most linear memory its instance held.
pub(crate) struct Metered<R> {
    pub(crate) outcome: Result<R, ToolError>,
    /// `None`: no instance ran (its sandbox could not be built).
    pub(crate) peak_memory: Option<usize>,
    /// The fuel it used, when [`Limits::fuel`](crate::plugin::Limits::fuel) is on.
    pub(crate) fuel: Option<u64>,
}

impl<R> Metered<R> {
    /// A run that ended with `err` before any instance ran.
    fn not_run(err: ToolError) -> Self {
        Metered {
            outcome: Err(err),
            peak_memory: None,
            fuel: None,
        }
    }
}

/// Which kept instance a call runs in, and where it notes what it touches.
struct Kept<'a> {
    instances: &'a ProcessInstances,
    key: WarmKey,
    tool: &'a str,
    trace: &'a CallTrace,
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
    /// Runs one tool call in a fresh instance of `plugin`, or in the calling process's own
    /// when it reuses them and the call holds no network grant (a request belongs to the
    /// call that made it, so such a call always starts fresh). What leaves the call (its
    /// output or error) has every secret value redacted. With it comes what the call
    /// touched beyond its arguments, however it ended.
    pub(crate) async fn invoke(&self, plugin: &LoadedPlugin, call: Invocation<'_>) -> Ran {
        let call_net = self.call_net(
            call.tool,
            call.caller,
            &call.capabilities,
            call.declared,
            &call.granted,
            call.grant_source.clone(),
        );
        let context = CallContext {
            caller: call.caller.to_string(),
            call_id: call.call_id,
            capabilities: call.capabilities.iter().map(ToString::to_string).collect(),
        };
        let pre = plugin.pre(call_net.is_some());
        let log = &call.trace.log;
        let egress = Egress::new(call_net.clone());
        // Built only for a fresh instance: a kept one has its sandbox already.
        let sandbox = || {
            let scope = CallScope {
                plugin: plugin.name.clone(),
                contract: plugin.wit_version.clone(),
                tool: call.tool.to_owned(),
                caller: call.caller.clone(),
                capabilities: call.capabilities.clone(),
                services: self.services.clone(),
                network: self.network.clone(),
                log_lines: 0,
                label: call.trace.label.clone(),
                reads: call.trace.reads.clone(),
                mail: None,
            };
            let mut sandbox = Sandbox::new(&self.limits, scope, call.workspace, egress)?;
            sandbox.file_access().log_into(log.clone());
            Ok(sandbox)
        };
        let run_tool = async |instance: &Plugin, store: &mut Store<Sandbox>| {
            instance
                .capstan_plugin_tool()
                .call_call(store, call.tool, call.args_json, &context)
                .await
        };
        let ran = match call.instances.filter(|_| call_net.is_none()) {
            Some(instances) => {
                let key = WarmKey::new(
                    plugin.serial,
                    call.caller,
                    &call.capabilities,
                    call.workspace,
                );
                let kept = Kept {
                    instances,
                    key,
                    tool: call.tool,
                    trace: call.trace,
                };
                self.run_kept(kept, pre, sandbox, run_tool).await
            }
            // Boxed: a fresh instance costs far more than the allocation, and unboxed its
            // future would be part of every kept call's too, copied as it moves.
            None => match sandbox() {
                Ok(sandbox) => Box::pin(self.run(pre, sandbox, run_tool)).await,
                Err(err) => Metered::not_run(err),
            },
        };
        let mut receipt = Receipt {
            peak_memory_bytes: ran.peak_memory.map(|n| n as u64),
            fuel: ran.fuel,
            ..Receipt::default()
        };
        // The store is gone, and with it every response body: each request's row is
        // written, so the call's audit is complete when it returns.
        // A clone: a kept instance carries its reads into its next call from this log.
        let mut touched = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(call_net) = &call_net {
            call_net.flush().await;
            touched.hosts = call_net.reached();
            call_net.tally().add_to(&mut receipt);
        }
        // An error's message is the guest's text as much as a result is: redacted and
        // capped alike.
        let redactor = self.network.secrets().redactor();
        let clean = |text: String| self.cap_output(redactor.redact_owned(text));
        let result = match ran.outcome {
            Ok(Ok(output)) => Ok(clean(output)),
            Ok(Err(err)) => Err(from_wit(err).map_message(clean)),
            Err(err) => Err(err.map_message(clean)),
        };
        Ran {
            result,
            touched,
            receipt,
            denied_by: None,
        }
    }

    /// The network of one call of `tool` by `caller`, running with `capabilities` of what
    /// it `declared` and its caller was `granted` (from `source`): `None` when it holds no
    /// `net:` rule. Its requests carry the secrets among `capabilities`, and are audited
    /// under `caller`.
    pub(crate) fn call_net(
        &self,
        tool: &str,
        caller: &Caller,
        capabilities: &[Capability],
        declared: &[Capability],
        granted: &[capstan_caps::NetRule],
        source: GrantSource,
    ) -> Option<Arc<CallNet>> {
        let scope = NetScope::new(tool, capabilities, declared, granted, source)?;
        let secrets = capabilities
            .iter()
            .filter_map(|cap| match cap {
                Capability::Secret(name) => Some(name.clone()),
                _ => None,
            })
            .collect();
        Some(Arc::new(CallNet::new(
            self.network.clone(),
            caller.to_string(),
            scope,
            secrets,
            self.audit.clone(),
        )))
    }

    /// Instantiates `pre` in a new store holding `sandbox`, bounded by the deadline and the
    /// memory limit, and runs `f` on the instance. A trap, deadline or refused memory growth
    /// becomes [`ToolError::Failed`] naming the cause.
    pub(crate) async fn run<P: Linked, R>(
        &self,
        pre: &P,
        sandbox: Sandbox,
        f: impl AsyncFnOnce(&P::Instance, &mut Store<Sandbox>) -> wasmtime::Result<R>,
    ) -> Metered<R> {
        let _slot = self.call_slot().await;
        let mut store = self.new_store(sandbox);
        self.arm_deadline(&mut store);
        let outcome = self
            .within_deadline(async {
                let instance = self.instantiate(pre, &mut store).await?;
                f(&instance, &mut store).await
            })
            .await;
        Metered {
            outcome: outcome.map_err(|err| self.explain_failure(&store, &err)),
            peak_memory: Some(store.data().limiter.peak()),
            fuel: self.fuel_used(&store),
        }
    }

    /// [`PluginHost::run`] in the instance `instances` keeps for `key`, or in a fresh one
    /// (its sandbox from `sandbox`) that is kept after the call if a warm slot is free.
    /// Only a call that returned gives its instance back; any failure drops it.
    async fn run_kept<R>(
        &self,
        kept: Kept<'_>,
        pre: &PluginPre<Sandbox>,
        sandbox: impl FnOnce() -> Result<Sandbox, ToolError>,
        f: impl AsyncFnOnce(&Plugin, &mut Store<Sandbox>) -> wasmtime::Result<R>,
    ) -> Metered<R> {
        let Kept {
            instances,
            key,
            tool,
            trace,
        } = kept;
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
                store.data_mut().begin_call(tool, Egress::default(), trace);
                self.refuel(&mut store);
                (store, Some((instance, resources, slot)))
            }
            None => match sandbox() {
                Ok(sandbox) => (self.new_store(sandbox), None),
                Err(err) => return Metered::not_run(err),
            },
        };
        self.arm_deadline(&mut store);
        let ran = self
            .within_deadline(async {
                let (instance, was_kept) = match kept {
                    Some((instance, resources, slot)) => (instance, Some((resources, slot))),
                    None => {
                        // Boxed: only the first call of a process makes its instance.
                        (Box::pin(self.instantiate(pre, &mut store)).await?, None)
                    }
                };
                let output = f(&instance, &mut store).await?;
                Ok((instance, was_kept, output))
            })
            .await;
        let peak_memory = Some(store.data().limiter.peak());
        let fuel = self.fuel_used(&store);
        let outcome = match ran {
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
        };
        Metered {
            outcome,
            peak_memory,
            fuel,
        }
    }

    /// A permit to run one call: calls beyond [`Limits::max_concurrent_calls`](crate::plugin::Limits::max_concurrent_calls) wait here.
    async fn call_slot(&self) -> tokio::sync::SemaphorePermit<'_> {
        if let Ok(free) = self.slots.try_acquire() {
            return free;
        }
        // Counted while it waits, however the wait ends (a call dropped while waiting too).
        let _waiting = Waiting::start();
        self.slots
            .acquire()
            .await
            .expect("the slot semaphore is never closed")
    }

    /// A store holding `sandbox`, its memory bounded by the sandbox's limiter.
    fn new_store(&self, sandbox: Sandbox) -> Store<Sandbox> {
        let mut store = Store::new(&self.engine, sandbox);
        store.limiter(|s| &mut s.limiter);
        self.refuel(&mut store);
        store
    }

    /// Gives `store` [`FUEL`] for its next call, when calls are metered.
    fn refuel(&self, store: &mut Store<Sandbox>) {
        if self.limits.fuel {
            store
                .set_fuel(FUEL)
                .expect("fuel is on in the engine whenever it is in the limits");
        }
    }

    /// The fuel `store`'s call used, when calls are metered.
    fn fuel_used(&self, store: &Store<Sandbox>) -> Option<u64> {
        self.limits
            .fuel
            .then(|| FUEL.saturating_sub(store.get_fuel().unwrap_or(FUEL)))
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

    /// A fresh instance of `pre` in `store`, its memory image made first.
    async fn instantiate<P: Linked>(
        &self,
        pre: &P,
        store: &mut Store<Sandbox>,
    ) -> wasmtime::Result<P::Instance> {
        memory_image::prepare(pre.instance_pre().component()).await?;
        pre.instantiate(store).await
    }

    /// `call`, stopped at the deadline: this stops a guest that waits in a host call (a
    /// sleep, a read that never returns, a slow import). Dropping the call's future
    /// unwinds its fiber; the store, and with it the pool slot, go right after.
    ///
    /// Not an `async fn`: one would hold `call` twice in its state (the argument, and the
    /// future awaited), and a call's future is large. The deadline counts from here.
    fn within_deadline<R>(
        &self,
        call: impl Future<Output = wasmtime::Result<R>>,
    ) -> impl Future<Output = wasmtime::Result<R>> {
        tokio::time::timeout(self.limits.deadline, call).map(|timed| match timed {
            Ok(outcome) => outcome,
            Err(_elapsed) => Err(wasmtime::Error::new(DeadlineExceeded)),
        })
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
        if let Some(cause) = failure::host_io(err) {
            return ToolError::Failed(format!(
                "{who} could not run: the host failed ({cause}); the plugin is not at fault, \
                 and the call can be made again"
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

    /// Cuts `output` to [`Limits::max_output_bytes`](crate::plugin::Limits::max_output_bytes), saying so at the end.
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

/// A call waiting for a slot, in `capstan_calls_waiting` until dropped.
struct Waiting;

impl Waiting {
    fn start() -> Self {
        crate::telemetry::metrics().calls_waiting(1);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        crate::telemetry::metrics().calls_waiting(-1);
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

/// Resources (open files, streams) a kept instance may hold between calls; past it the
/// instance is dropped after its call, as a fresh one would be. An SDK plugin holds its
/// stdio streams and the workspace's preopen.
const MAX_KEPT_RESOURCES: usize = 8;
