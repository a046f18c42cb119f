//! The cost of Capstan's tool-call path against a bare wasmtime call of the same component,
//! measured in the same run, and plugin load time with a warm artifact cache against a cold
//! compile.
//!
//! Needs the built plugins (`bash scripts/setup`). Run with
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench tool_call`: a backtrace
//! captured on any error path would distort the figures.
//!
//! - `bare`: `InstancePre` + pooling allocator, a fresh `Store` and instance per call, a
//!   direct typed call of `echo` (the same component, the same engine settings, the minimal
//!   WASI context the component needs to instantiate).
//! - `capstan`: `Registry::call`: tool lookup, grant check, argument check, sandbox
//!   construction, fresh pooled instance with deadline and memory limit, call, output cap.
//!
//! - `bare_warm`: one long-lived store and instance, called again and again.
//! - `capstan_warm`: `Registry::call` with the caller's [`ProcessInstances`]
//!   (`instance_reuse = "process"`): the same host path, in the instance the process keeps.
//!
//! After criterion's report, each pair runs interleaved once more to print p50 and p99,
//! their ratios and (warm) the difference.
//!
//! `plugin_load`: a cold compile, a warm load from Capstan's sealed cache (read, check the
//! seal, deserialize, link, `describe()`), and bare wasmtime deserializing the same
//! precompiled component from a file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::plugin::{
    ArtifactCache, CallRequest, Limits, PluginHost, ProcessInstances, Registry,
};
use capstan_host::policy::Grants;
use criterion::{BatchSize, Criterion};
use tokio::runtime::Runtime;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{
    RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView, WasiHttpHooks, WasiHttpView,
};

mod bare {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "plugin",
        exports: { default: async },
    });
}

use bare::capstan::plugin::types::{CallContext, HostError};
use bare::capstan::plugin::{log, memory, secrets, tasks, types};

/// The bare path's store data: WASI and WASI HTTP contexts and nothing else.
struct BareState {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    hooks: NoNetwork,
    table: ResourceTable,
}

impl BareState {
    fn new() -> Self {
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

const ARGS: &str = r#"{"text":"hello"}"#;

fn component_path(group: &str, name: &str) -> PathBuf {
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

struct Bare {
    engine: Engine,
    pre: bare::PluginPre<BareState>,
}

impl Bare {
    fn new() -> Self {
        let limits = Limits::default();
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(limits.max_concurrent_calls)
            .max_memory_size(limits.memory_bytes);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).unwrap();
        let component = Component::from_file(&engine, component_path("fixtures", "probe")).unwrap();
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        bare::Plugin::add_to_linker::<BareState, HasSelf<BareState>>(&mut linker, |s| s).unwrap();
        // The probe's network tools import wasi:http.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker).unwrap();
        let pre = bare::PluginPre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
        Bare { engine, pre }
    }

    async fn call(&self) -> String {
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
struct BareWarm {
    store: Store<BareState>,
    plugin: bare::Plugin,
}

impl BareWarm {
    async fn new(bare: &Bare) -> Self {
        let state = BareState::new();
        let mut store = Store::new(&bare.engine, state);
        store.set_epoch_deadline(u64::MAX);
        let plugin = bare.pre.instantiate_async(&mut store).await.unwrap();
        BareWarm { store, plugin }
    }

    async fn call(&mut self) -> String {
        let ctx = CallContext {
            caller: "bench".into(),
            call_id: "1".into(),
            capabilities: vec![],
        };
        self.plugin
            .capstan_plugin_tool()
            .call_call(&mut self.store, "echo", ARGS, &ctx)
            .await
            .unwrap()
            .unwrap()
    }
}

struct Ours {
    registry: Registry,
    grants: Grants,
    /// The benchmark's process: its kept instance serves [`Ours::call_warm`].
    instances: ProcessInstances,
}

impl Ours {
    async fn new(cache: ArtifactCache) -> Self {
        let host = Arc::new(PluginHost::new(Limits::default(), cache).unwrap());
        let mut registry = Registry::new(host);
        registry
            .add_file(&component_path("fixtures", "probe"))
            .await
            .unwrap();
        Ours {
            registry,
            grants: Grants::none(),
            instances: ProcessInstances::new(),
        }
    }

    async fn call(&self) -> String {
        self.call_in(None).await
    }

    async fn call_warm(&self) -> String {
        self.call_in(Some(&self.instances)).await
    }

    async fn call_in(&self, instances: Option<&ProcessInstances>) -> String {
        self.registry
            .call(CallRequest {
                tool: "echo",
                args_json: ARGS,
                grants: &self.grants,
                workspace: None,
                caller: "bench",
                instances,
            })
            .await
            .unwrap()
    }
}

fn bench_calls(c: &mut Criterion, rt: &Runtime, bare: &Bare, warm: &mut BareWarm, ours: &Ours) {
    assert_eq!(rt.block_on(bare.call()), "hello");
    assert_eq!(rt.block_on(ours.call()), "hello");
    assert_eq!(rt.block_on(warm.call()), "hello");
    assert_eq!(rt.block_on(ours.call_warm()), "hello");
    assert_eq!(ours.instances.len(), 1, "the warm path keeps its instance");
    let mut group = c.benchmark_group("tool_call");
    group.bench_function("bare", |b| b.iter(|| rt.block_on(bare.call())));
    group.bench_function("capstan", |b| b.iter(|| rt.block_on(ours.call())));
    group.bench_function("bare_warm", |b| b.iter(|| rt.block_on(warm.call())));
    group.bench_function("capstan_warm", |b| b.iter(|| rt.block_on(ours.call_warm())));
    group.finish();
}

fn bench_load(c: &mut Criterion, rt: &Runtime) {
    let file = component_path("plugins", "files");
    let cache_dir = tempfile::tempdir().unwrap();
    let cold = PluginHost::new(Limits::default(), ArtifactCache::disabled()).unwrap();
    let warm = PluginHost::new(Limits::default(), ArtifactCache::new(cache_dir.path())).unwrap();
    rt.block_on(warm.load(&file)).unwrap();
    // Bare wasmtime's share of a warm load: deserializing the precompiled component from
    // a file, with the engine settings the host uses.
    let bare = Bare::new();
    let artifact = cache_dir.path().join("bare.cwasm");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&artifact, bare.engine.precompile_component(&bytes).unwrap()).unwrap();
    let mut group = c.benchmark_group("plugin_load");
    group.sample_size(20);
    group.bench_function("bare_deserialize", |b| {
        // SAFETY: the artifact was precompiled just above by this engine.
        b.iter(|| unsafe { Component::deserialize_file(&bare.engine, &artifact) }.unwrap())
    });
    group.bench_function("cold_compile", |b| {
        b.iter_batched(
            || (),
            |()| rt.block_on(cold.load(&file)).unwrap(),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("warm_cache", |b| {
        b.iter(|| rt.block_on(warm.load(&file)).unwrap())
    });
    group.finish();
}

/// p50 and p99 of `times`.
fn p50_p99(times: &mut [Duration]) -> (f64, f64) {
    times.sort_unstable();
    let at = |p: f64| times[((times.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e6;
    (at(0.50), at(0.99))
}

/// Runs each pair of call paths interleaved and prints p50/p99 of each, the ratios and
/// the difference.
fn percentiles(rt: &Runtime, bare: &Bare, warm: &mut BareWarm, ours: &Ours) {
    const ROUNDS: usize = 5000;
    let mut times: [Vec<Duration>; 4] = std::array::from_fn(|_| Vec::with_capacity(ROUNDS));
    for _ in 0..ROUNDS {
        let t = Instant::now();
        rt.block_on(bare.call());
        times[0].push(t.elapsed());
        let t = Instant::now();
        rt.block_on(ours.call());
        times[1].push(t.elapsed());
        let t = Instant::now();
        rt.block_on(warm.call());
        times[2].push(t.elapsed());
        let t = Instant::now();
        rt.block_on(ours.call_warm());
        times[3].push(t.elapsed());
    }
    let [b, o, bw, ow] = times.each_mut().map(|t| p50_p99(t));
    println!("\ntool call, {ROUNDS} interleaved rounds (us)");
    println!("  fresh instance   bare  p50 {:8.2}  p99 {:8.2}", b.0, b.1);
    println!("                capstan  p50 {:8.2}  p99 {:8.2}", o.0, o.1);
    println!(
        "                  ratio  p50 {:7.2}x  p99 {:7.2}x",
        o.0 / b.0,
        o.1 / b.1
    );
    println!(
        "  kept instance    bare  p50 {:8.2}  p99 {:8.2}",
        bw.0, bw.1
    );
    println!(
        "                capstan  p50 {:8.2}  p99 {:8.2}",
        ow.0, ow.1
    );
    println!(
        "                   over  p50 {:8.2}  p99 {:8.2}",
        ow.0 - bw.0,
        ow.1 - bw.1
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bare = Bare::new();
    let mut warm = rt.block_on(BareWarm::new(&bare));
    let ours = rt.block_on(Ours::new(ArtifactCache::disabled()));
    let mut c = Criterion::default().configure_from_args();
    bench_calls(&mut c, &rt, &bare, &mut warm, &ours);
    bench_load(&mut c, &rt);
    c.final_summary();
    percentiles(&rt, &bare, &mut warm, &ours);
}
