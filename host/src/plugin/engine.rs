//! The wasmtime engine every plugin runs on, its linker, and the epoch ticker.

use std::thread;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, EngineWeak, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::bindings::Plugin;
use super::error::HostError;
use super::limits::{EPOCH_TICK, Limits};
use super::sandbox::Sandbox;

/// Core instances one component may create. Measured (`cargo bench --bench languages`): a
/// Rust wasip2 component built through the preview1 adapter has four or five, ComponentizeJS
/// 0.23 four, componentize-py 0.25 fourteen (CPython as shared libraries, linked in the
/// component); the margin admits Python native extensions and other toolchains.
pub(crate) const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 32;

/// Linear memories and tables one component may define.
pub(crate) const MAX_MEMORIES_PER_COMPONENT: u32 = 4;
pub(crate) const MAX_TABLES_PER_COMPONENT: u32 = 16;

/// Dropped instances whose memories, tables and stacks are decommitted together, in one
/// batch of `madvise` calls. Measured (`cargo bench --bench tool_call`, BENCHMARKS.md): a
/// batch takes the fresh call's p50 from 1.05x of bare wasmtime (wasmtime's default of 1)
/// to 1.03x with 4 and 0.93x with 16, but the call that pays the batch sets the p99: 1.04x
/// with 4, 1.17x with 16. Four keeps both within 1.1x. A slot waits in the batch until it
/// is full; when the pool has no free slot, wasmtime flushes the batch before it refuses
/// an instance.
const DECOMMIT_BATCH: usize = 4;

/// An engine configured for plugins: component model, epoch interruption, and a pooling
/// allocator with a slot for each of `limits.max_concurrent_calls` and
/// `limits.max_warm_instances` (a kept instance holds its slot, and its store the fiber
/// stack it last ran on, while it waits), whose memories cannot exceed
/// `limits.memory_bytes`.
pub(crate) fn build_engine(limits: &Limits) -> Result<Engine, HostError> {
    let slots = limits.max_concurrent_calls.max(1) + limits.max_warm_instances;
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(slots)
        .total_core_instances(slots * MAX_CORE_INSTANCES_PER_COMPONENT)
        .total_memories(slots * MAX_MEMORIES_PER_COMPONENT)
        .total_tables(slots * MAX_TABLES_PER_COMPONENT)
        .total_stacks(slots)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
        .max_memory_size(limits.memory_bytes)
        .decommit_batch_size(DECOMMIT_BATCH);

    let mut config = Config::new();
    config
        .wasm_component_model(true)
        // Plugins export synchronous functions and the host awaits each call on a fiber.
        // With concurrency support on (wasmtime's default), every `call_async` goes through
        // the component-model-async task machinery instead: measured (`tool_call -- trivial`)
        // as about a quarter of a call into a kept instance.
        .concurrency_support(false)
        .epoch_interruption(true)
        .consume_fuel(limits.fuel)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config).map_err(|err| HostError::Engine(format!("{err:#}")))
}

/// A linker with WASI preview 2 and the Capstan imports, and with `http`, `wasi:http`
/// (behind the egress of each call's [`Sandbox`]).
pub(crate) fn build_linker(engine: &Engine, http: bool) -> Result<Linker<Sandbox>, HostError> {
    let fail = |err: wasmtime::Error| HostError::Engine(format!("linking host imports: {err:#}"));
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(fail)?;
    super::special_files::replace_inline_fs_functions(&mut linker).map_err(fail)?;
    super::file_streams::note_file_streams(&mut linker).map_err(fail)?;
    super::file_access::note_file_access(&mut linker).map_err(fail)?;
    if http {
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).map_err(fail)?;
    }
    Plugin::add_to_linker::<Sandbox, HasSelf<Sandbox>>(&mut linker, |s| s).map_err(fail)?;
    super::channel::add_to_linker(&mut linker).map_err(fail)?;
    Ok(linker)
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until the engine is dropped.
pub(crate) fn start_epoch_ticker(engine: &Engine) {
    let weak: EngineWeak = engine.weak();
    thread::Builder::new()
        .name("capstan-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                thread::sleep(EPOCH_TICK);
            }
        })
        .expect("spawning the epoch ticker thread");
}
