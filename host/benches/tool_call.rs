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
//! After criterion's report, both paths run interleaved once more to print p50 and p99
//! and their ratios.
//!
//! `plugin_load`: a cold compile, a warm load from Capstan's sealed cache (read, check the
//! seal, deserialize, link, `describe()`), and bare wasmtime deserializing the same
//! precompiled component from a file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::plugin::{ArtifactCache, CallRequest, Limits, PluginHost, Registry};
use capstan_host::policy::Grants;
use criterion::{BatchSize, Criterion};
use tokio::runtime::Runtime;
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

mod bare {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "plugin",
        exports: { default: async },
    });
}

use bare::capstan::plugin::types::{CallContext, HostError};
use bare::capstan::plugin::{log, memory, secrets, tasks, types};

/// The bare path's store data: a WASI context and nothing else.
struct BareState {
    wasi: WasiCtx,
    table: ResourceTable,
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
        let pre = bare::PluginPre::new(linker.instantiate_pre(&component).unwrap()).unwrap();
        Bare { engine, pre }
    }

    async fn call(&self) -> String {
        let state = BareState {
            wasi: WasiCtx::builder().build(),
            table: ResourceTable::new(),
        };
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

struct Ours {
    registry: Registry,
    grants: Grants,
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
        }
    }

    async fn call(&self) -> String {
        self.registry
            .call(CallRequest {
                tool: "echo",
                args_json: ARGS,
                grants: &self.grants,
                workspace: None,
                caller: "bench",
                instances: None,
            })
            .await
            .unwrap()
    }
}

fn bench_calls(c: &mut Criterion, rt: &Runtime, bare: &Bare, ours: &Ours) {
    assert_eq!(rt.block_on(bare.call()), "hello");
    assert_eq!(rt.block_on(ours.call()), "hello");
    let mut group = c.benchmark_group("tool_call");
    group.bench_function("bare", |b| b.iter(|| rt.block_on(bare.call())));
    group.bench_function("capstan", |b| b.iter(|| rt.block_on(ours.call())));
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

/// Runs both call paths interleaved and prints p50/p99 of each and the ratios.
fn percentiles(rt: &Runtime, bare: &Bare, ours: &Ours) {
    const ROUNDS: usize = 5000;
    let mut bare_times = Vec::with_capacity(ROUNDS);
    let mut our_times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        rt.block_on(bare.call());
        bare_times.push(t.elapsed());
        let t = Instant::now();
        rt.block_on(ours.call());
        our_times.push(t.elapsed());
    }
    let pct = |times: &mut Vec<Duration>, p: f64| {
        times.sort_unstable();
        times[((times.len() as f64 - 1.0) * p) as usize]
    };
    let (b50, b99) = (pct(&mut bare_times, 0.50), pct(&mut bare_times, 0.99));
    let (o50, o99) = (pct(&mut our_times, 0.50), pct(&mut our_times, 0.99));
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("\ntool call, {ROUNDS} interleaved rounds");
    println!("  bare     p50 {:8.1} us   p99 {:8.1} us", us(b50), us(b99));
    println!("  capstan  p50 {:8.1} us   p99 {:8.1} us", us(o50), us(o99));
    println!(
        "  ratio    p50 {:8.2}x     p99 {:8.2}x",
        us(o50) / us(b50),
        us(o99) / us(b99)
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bare = Bare::new();
    let ours = rt.block_on(Ours::new(ArtifactCache::disabled()));
    let mut c = Criterion::default().configure_from_args();
    bench_calls(&mut c, &rt, &bare, &ours);
    bench_load(&mut c, &rt);
    c.final_summary();
    percentiles(&rt, &bare, &ours);
}
