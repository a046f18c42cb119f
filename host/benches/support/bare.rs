//! Bare wasmtime, for the benchmarks to measure Capstan against: the same component on
//! an engine with the same settings, a minimal store, and a direct typed call.

#![allow(dead_code)] // Each benchmark uses its share.

use std::path::{Path, PathBuf};

use capstan_host::plugin::Limits;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

pub mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "plugin",
        exports: { default: async },
    });
}

use bindings::capstan::plugin::types::{CallContext, HostError};
use bindings::capstan::plugin::{log, memory, secrets, tasks, types};

/// The bare path's store data: WASI and WASI HTTP contexts and nothing else.
pub struct BareState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: NoNetwork,
    table: ResourceTable,
}

impl BareState {
    pub fn new() -> Self {
        BareState {
            wasi: WasiCtx::builder().build(),
            http: WasiHttpCtx::new(),
            hooks: NoNetwork,
            table: ResourceTable::new(),
        }
    }
}

/// The bare path sends no request (`echo` makes none): any would wait forever.
struct NoNetwork;

type Sent = Box<
    dyn Future<
            Output = Result<
                (
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
                ),
                wasmtime_wasi_http::Error,
            >,
        > + Send,
>;

impl WasiHttpHooks for NoNetwork {
    fn send_request(
        &mut self,
        _: http::Request<WasiBody>,
        _: Option<RequestOptions>,
        _: Box<dyn Future<Output = Result<(), wasmtime_wasi_http::Error>> + Send>,
    ) -> Sent {
        Box::new(std::future::pending())
    }
}

impl WasiHttpView for BareState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

impl WasiView for BareState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

// The echo tool never calls these; they exist so the component links.
impl types::Host for BareState {}
impl log::Host for BareState {
    fn write(&mut self, _: log::Level, _: String) {}
}
fn refused() -> HostError {
    HostError::Denied(String::new())
}
impl tasks::Host for BareState {
    fn create(&mut self, _: tasks::NewTask) -> Result<tasks::Task, HostError> {
        Err(refused())
    }
    fn get(&mut self, _: u64) -> Result<tasks::Task, HostError> {
        Err(refused())
    }
    fn list(&mut self, _: tasks::TaskFilter) -> Result<Vec<tasks::Task>, HostError> {
        Err(refused())
    }
    fn update(&mut self, _: u64, _: tasks::TaskPatch) -> Result<tasks::Task, HostError> {
        Err(refused())
    }
}
impl memory::Host for BareState {
    fn save(&mut self, _: memory::NewMemory) -> Result<memory::MemoryItem, HostError> {
        Err(refused())
    }
    fn recall(&mut self, _: String, _: u32) -> Result<Vec<memory::MemoryItem>, HostError> {
        Err(refused())
    }
    fn delete(&mut self, _: String) -> Result<(), HostError> {
        Err(refused())
    }
    fn working_get(&mut self, _: String) -> Result<Option<String>, HostError> {
        Err(refused())
    }
    fn working_set(&mut self, _: String, _: String, _: Option<u64>) -> Result<(), HostError> {
        Err(refused())
    }
}

impl secrets::Host for BareState {
    fn exists(&mut self, _: String) -> bool {
        false
    }
    fn hmac_sha256(&mut self, _: String, _: Vec<u8>) -> Result<Vec<u8>, HostError> {
        Err(refused())
    }
}

pub const ARGS: &str = r#"{"text":"hello"}"#;

pub fn component_path(group: &str, name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(group)
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} missing: run `bash scripts/setup`",
        path.display()
    );
    path
}

pub struct Bare {
    pub engine: Engine,
    pub pre: bindings::PluginPre<BareState>,
}

impl Bare {
    /// The probe fixture, compiled.
    pub fn new() -> Self {
        Self::fixture("probe")
    }

    /// The fixture `name` (a file in `target/fixtures/`), compiled.
    pub fn fixture(name: &str) -> Self {
        let engine = Self::engine();
        let component = Component::from_file(&engine, component_path("fixtures", name)).unwrap();
        Self::linked(engine, &component)
    }

    /// The component precompiled at `cwasm` by [`Bare::engine`], mapped from the file as
    /// `wasmtime run` does with a precompiled component.
    pub fn precompiled(cwasm: &Path) -> Self {
        let engine = Self::engine();
        // SAFETY: the benchmark wrote the file with `precompile_component` of this engine.
        let component = unsafe { Component::deserialize_file(&engine, cwasm) }.unwrap();
        Self::linked(engine, &component)
    }

    /// An engine with the host's settings: component model without concurrency support,
    /// epoch interruption, pooling.
    pub fn engine() -> Engine {
        Self::engine_with(|_| {})
    }

    /// [`Bare::engine`] with one change to its pooling allocator. With
    /// `CAPSTAN_BENCH_PERFMAP` set, the engine writes a perf map, so `perf report` names
    /// the guest's JIT frames.
    pub fn engine_with(change: impl FnOnce(&mut PoolingAllocationConfig)) -> Engine {
        let limits = Limits::default();
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(limits.max_concurrent_calls)
            .max_memory_size(limits.memory_bytes);
        change(&mut pool);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .concurrency_support(false)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        if std::env::var_os("CAPSTAN_BENCH_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        Engine::new(&config).unwrap()
    }

    /// A linker with everything a plugin may import: WASI, WASI HTTP, Capstan's imports.
    pub fn linker(engine: &Engine) -> Linker<BareState> {
        let mut linker = Linker::new(engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        bindings::Plugin::add_to_linker::<BareState, HasSelf<BareState>>(&mut linker, |s| s)
            .unwrap();
        // The probe's network tools import wasi:http.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).unwrap();
        linker
    }

    fn linked(engine: Engine, component: &Component) -> Self {
        let linker = Self::linker(&engine);
        let pre = bindings::PluginPre::new(linker.instantiate_pre(component).unwrap()).unwrap();
        Bare { engine, pre }
    }

    pub async fn call(&self) -> String {
        let state = BareState::new();
        let mut store = Store::new(&self.engine, state);
        store.set_epoch_deadline(u64::MAX);
        let plugin = self.pre.instantiate_async(&mut store).await.unwrap();
        let ctx = CallContext {
            caller: "bench".into(),
            call_id: "1".into(),
            capabilities: vec![],
        };
        plugin
            .capstan_plugin_tool()
            .call_call(&mut store, "echo", ARGS, &ctx)
            .await
            .unwrap()
            .unwrap()
    }
}

/// Bare wasmtime's long-lived instance: one store, one instance, every call into it.
pub struct BareWarm {
    store: Store<BareState>,
    plugin: bindings::Plugin,
}

impl BareWarm {
    pub async fn new(bare: &Bare) -> Self {
        let state = BareState::new();
        let mut store = Store::new(&bare.engine, state);
        store.set_epoch_deadline(u64::MAX);
        let plugin = bare.pre.instantiate_async(&mut store).await.unwrap();
        BareWarm { store, plugin }
    }

    /// Calls the probe's `echo` with [`ARGS`].
    pub async fn call(&mut self) -> String {
        self.call_tool("echo", ARGS).await
    }

    /// Calls `tool` with `args`, the context built per call as a host would.
    pub async fn call_tool(&mut self, tool: &str, args: &str) -> String {
        let ctx = CallContext {
            caller: "bench".into(),
            call_id: "1".into(),
            capabilities: vec![],
        };
        self.plugin
            .capstan_plugin_tool()
            .call_call(&mut self.store, tool, args, &ctx)
            .await
            .unwrap()
            .unwrap()
    }
}
