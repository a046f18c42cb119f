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
//! seal, deserialize, link, and the tool list sealed beside the artifact), and bare wasmtime deserializing the same
//! precompiled component from a file.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::plugin::{
    ArtifactCache, CallRequest, Limits, PluginHost, ProcessInstances, Registry,
};
use capstan_host::policy::Grants;
use criterion::{BatchSize, Criterion};
use tokio::runtime::Runtime;
use wasmtime::component::Component;

#[path = "support/bare.rs"]
mod bare;

use bare::{ARGS, Bare, BareWarm, component_path};

struct Ours {
    registry: Registry,
    grants: Grants,
    /// The benchmark's process: its kept instance serves [`Ours::call_warm`].
    instances: ProcessInstances,
}

impl Ours {
    async fn new(cache: ArtifactCache) -> Self {
        let host = Arc::new(PluginHost::new(Limits::default(), cache).unwrap());
        let mut registry = Registry::new(host, capstan_host::plugin::CallLog::disabled());
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
                caller: &capstan_host::ids::Caller::client("bench", None),
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
