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
//! `trivial`: the `length` fixture (a short JSON text in, its length out: the Extism peer
//! guest's work) on every path that keeps an instance: `capstan_kept` (the SDK's tool through
//! `Registry::call`), `capstan_kept_nosdk` (the same tool as a bare component, `length-bare`),
//! `bare_kept` and `bare_kept_nosdk` (bare wasmtime's long-lived instance of each), and
//! `extism_kept`, Extism's long-lived plugin of `bench/peers/extism-guest`, timed in its own
//! process (`bench/peers/extism-host`) when `CAPSTAN_BENCH_EXTISM` names that binary and
//! `CAPSTAN_BENCH_EXTISM_GUEST` its guest. `scripts/bench-peers` builds both and sets them.
//!
//! `plugin_load`: a cold compile, a warm load from Capstan's sealed cache (read, check the
//! seal, deserialize, link, and the tool list sealed beside the artifact), and bare wasmtime deserializing the same
//! precompiled component from a file.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::ids::Caller;
use capstan_host::plugin::{
    ArtifactCache, CallRequest, Limits, PluginHost, ProcessInstances, Registry,
};
use capstan_host::policy::Grants;
use criterion::{BatchSize, Criterion};
use tokio::runtime::Runtime;
use wasmtime::component::Component;

#[path = "support/bare.rs"]
mod bare;
#[path = "support/percentiles.rs"]
mod percentiles;

use bare::{ARGS, Bare, BareWarm, component_path};
use percentiles::p50_p99;

struct Ours {
    registry: Registry,
    grants: Grants,
    /// The benchmark's process: its kept instance serves [`Ours::call_warm`].
    instances: ProcessInstances,
    /// Who calls: made once, as a process holds its own.
    caller: Caller,
}

impl Ours {
    async fn new(cache: ArtifactCache) -> Self {
        Self::with(cache, &["probe"]).await
    }

    /// A registry of the fixtures named.
    async fn with(cache: ArtifactCache, fixtures: &[&str]) -> Self {
        let host = Arc::new(PluginHost::new(Limits::default(), cache).unwrap());
        let mut registry = Registry::new(host, capstan_host::plugin::CallLog::disabled());
        for fixture in fixtures {
            registry
                .add_file(&component_path("fixtures", fixture))
                .await
                .unwrap();
        }
        Ours {
            registry,
            grants: Grants::none(),
            instances: ProcessInstances::new(),
            caller: Caller::client("bench", None),
        }
    }

    async fn call(&self) -> String {
        self.call_in(None).await
    }

    async fn call_warm(&self) -> String {
        self.call_in(Some(&self.instances)).await
    }

    async fn call_in(&self, instances: Option<&ProcessInstances>) -> String {
        self.call_tool("echo", ARGS, instances).await
    }

    async fn call_tool(
        &self,
        tool: &str,
        args_json: &str,
        instances: Option<&ProcessInstances>,
    ) -> String {
        self.registry
            .call(CallRequest {
                tool,
                args_json,
                grants: &self.grants,
                workspace: None,
                caller: &self.caller,
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

/// The trivial tool's argument: the Extism peer passes the same text.
const TRIVIAL_ARGS: &str = r#"{"text":"hello"}"#;

/// Extism's long-lived plugin in the peer process: it times `n` calls when asked.
struct ExtismPeer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ExtismPeer {
    /// The peer named by `CAPSTAN_BENCH_EXTISM`, started and ready, or `None` when unset.
    fn start() -> Option<Self> {
        let binary = std::env::var_os("CAPSTAN_BENCH_EXTISM")?;
        let guest = std::env::var_os("CAPSTAN_BENCH_EXTISM_GUEST")
            .expect("CAPSTAN_BENCH_EXTISM_GUEST names the Extism guest (scripts/bench-peers)");
        let mut child = Command::new(&binary)
            .arg(guest)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.to_string_lossy()));
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        stdout.read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready", "the Extism peer did not start");
        Some(ExtismPeer {
            child,
            stdin,
            stdout,
        })
    }

    /// The durations of `n` calls made back to back in the peer. One more is made first,
    /// untimed: the first call after the peer wakes from its read is a cold one.
    fn calls(&mut self, n: u64) -> Vec<Duration> {
        writeln!(self.stdin, "{}", n + 1).unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let times: Vec<Duration> = line
            .split_whitespace()
            .skip(1)
            .map(|ns| Duration::from_nanos(ns.parse().unwrap()))
            .collect();
        assert_eq!(times.len() as u64, n, "the Extism peer timed {n} calls");
        times
    }
}

impl Drop for ExtismPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The trivial tool on each path that keeps an instance.
struct Trivial {
    ours: Ours,
    sdk: BareWarm,
    nosdk: BareWarm,
    extism: Option<ExtismPeer>,
}

impl Trivial {
    fn new(rt: &Runtime) -> Self {
        let ours = rt.block_on(Ours::with(
            ArtifactCache::disabled(),
            &["length", "length_bare"],
        ));
        let sdk = rt.block_on(BareWarm::new(&Bare::fixture("length")));
        let nosdk = rt.block_on(BareWarm::new(&Bare::fixture("length_bare")));
        let mut trivial = Trivial {
            ours,
            sdk,
            nosdk,
            extism: ExtismPeer::start(),
        };
        assert_eq!(rt.block_on(trivial.capstan()), "5");
        assert_eq!(rt.block_on(trivial.capstan_nosdk()), "16");
        assert_eq!(rt.block_on(trivial.bare()), "5");
        assert_eq!(rt.block_on(trivial.bare_nosdk()), "16");
        assert_eq!(
            trivial.ours.instances.len(),
            2,
            "each tool keeps its instance"
        );
        trivial
    }

    async fn capstan(&self) -> String {
        let instances = Some(&self.ours.instances);
        self.ours.call_tool("length", TRIVIAL_ARGS, instances).await
    }

    async fn capstan_nosdk(&self) -> String {
        let instances = Some(&self.ours.instances);
        self.ours
            .call_tool("length_bare", TRIVIAL_ARGS, instances)
            .await
    }

    async fn bare(&mut self) -> String {
        self.sdk.call_tool("length", TRIVIAL_ARGS).await
    }

    async fn bare_nosdk(&mut self) -> String {
        self.nosdk.call_tool("length_bare", TRIVIAL_ARGS).await
    }
}

fn bench_trivial(c: &mut Criterion, rt: &Runtime, trivial: &mut Trivial) {
    let mut group = c.benchmark_group("trivial");
    group.bench_function("capstan_kept", |b| {
        b.iter(|| rt.block_on(trivial.capstan()))
    });
    group.bench_function("capstan_kept_nosdk", |b| {
        b.iter(|| rt.block_on(trivial.capstan_nosdk()))
    });
    group.bench_function("bare_kept", |b| b.iter(|| rt.block_on(trivial.bare())));
    group.bench_function("bare_kept_nosdk", |b| {
        b.iter(|| rt.block_on(trivial.bare_nosdk()))
    });
    if let Some(peer) = trivial.extism.as_mut() {
        group.bench_function("extism_kept", |b| {
            b.iter_custom(|n| peer.calls(n).into_iter().sum())
        });
    }
    group.finish();
}

/// Times `call` once.
fn timed<T>(times: &mut Vec<Duration>, call: impl FnOnce() -> T) {
    let t = Instant::now();
    std::hint::black_box(call());
    times.push(t.elapsed());
}

/// The trivial tool's paths interleaved in blocks, with p50 and p99 of each and our kept
/// call against each baseline. Each path makes its block of calls in a row after one
/// untimed call, as Extism's peer does in its own process (the first call after another
/// path's block is a cold one), and the paths take turns going first.
fn trivial_percentiles(rt: &Runtime, trivial: &mut Trivial) {
    const BLOCKS: usize = 100;
    const BLOCK: usize = 100;
    const PATHS: usize = 4;
    let mut times: [Vec<Duration>; 5] = std::array::from_fn(|_| Vec::new());
    let call = |trivial: &mut Trivial, path: usize| match path {
        0 => rt.block_on(trivial.capstan()),
        1 => rt.block_on(trivial.capstan_nosdk()),
        2 => rt.block_on(trivial.bare()),
        _ => rt.block_on(trivial.bare_nosdk()),
    };
    // Each path makes a block of calls in a row, as Extism's peer does, after one
    // untimed call; which path goes first turns with each block.
    for block in 0..BLOCKS {
        for turn in 0..PATHS {
            let path = (block + turn) % PATHS;
            call(trivial, path);
            for _ in 0..BLOCK {
                timed(&mut times[path], || call(trivial, path));
            }
        }
        if let Some(peer) = trivial.extism.as_mut() {
            times[4].extend(peer.calls(BLOCK as u64));
        }
    }
    let names = [
        "capstan kept (SDK)",
        "capstan kept (no SDK)",
        "bare wasmtime kept (SDK)",
        "bare wasmtime kept (no SDK)",
        "extism long-lived",
    ];
    let figures: Vec<Option<(f64, f64)>> = times
        .iter_mut()
        .map(|t| (!t.is_empty()).then(|| p50_p99(t)))
        .collect();
    println!("\ntrivial tool, {BLOCKS} interleaved blocks of {BLOCK} calls (us)");
    for (name, figure) in names.iter().zip(&figures) {
        match figure {
            Some((p50, p99)) => println!("  {name:28} p50 {p50:8.2}  p99 {p99:8.2}"),
            None => println!("  {name:28} not run (scripts/bench-peers runs it)"),
        }
    }
    let over = |ours: usize, base: usize| {
        let (o, b) = (figures[ours].unwrap(), figures[base].unwrap());
        (o.0 - b.0, o.1 - b.1)
    };
    let (p50, p99) = over(0, 2);
    println!("  capstan over bare (SDK)      p50 {p50:8.2}  p99 {p99:8.2}");
    let (p50, p99) = over(1, 3);
    println!("  capstan over bare (no SDK)   p50 {p50:8.2}  p99 {p99:8.2}");
    if let (Some(ours), Some(extism)) = (figures[0], figures[4]) {
        println!(
            "  capstan (SDK) / extism       p50 {:7.2}x  p99 {:7.2}x",
            ours.0 / extism.0,
            ours.1 / extism.1
        );
    }
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
    let mut trivial = Trivial::new(&rt);
    bench_calls(&mut c, &rt, &bare, &mut warm, &ours);
    bench_trivial(&mut c, &rt, &mut trivial);
    bench_load(&mut c, &rt);
    c.final_summary();
    // A profile (`--profile-time`) is of the one function criterion ran, nothing else;
    // a listing runs nothing.
    if !std::env::args().any(|arg| arg == "--profile-time" || arg == "--list") {
        percentiles(&rt, &bare, &mut warm, &ours);
        trivial_percentiles(&rt, &mut trivial);
    }
}
