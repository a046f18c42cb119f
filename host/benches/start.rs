//! A whole `capstan tool call` process, start to result, with a warm artifact cache,
//! against bare wasmtime doing the same in a process of its own.
//!
//! Needs the built plugins (`bash scripts/setup`). Run with
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench start`.
//!
//! - `capstan_tool_call`: the release `capstan` binary runs `tool call echo` with a plugins
//!   directory of every component the build makes that loads (the four first-party
//!   plugins, the probe fixture, the example and the Python-shaped fixture: 7), its cache
//!   warm: parse the config, open the cache, read, check and map each plugin with its
//!   sealed tool list, audit, call, print.
//! - `bare_process`: this benchmark's own executable, started again as a stand-in for
//!   `wasmtime run` of a precompiled component (the machine has no wasmtime CLI): map the
//!   probe's precompiled file, link, instantiate, call `echo`, print.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::Criterion;

#[path = "support/bare.rs"]
mod bare;

use bare::{Bare, component_path};

/// Set in the environment of the bare process: the precompiled file it runs.
const BARE_RUN: &str = "CAPSTAN_BENCH_BARE_RUN";

/// A deployment: the plugins, a warm cache and a state dir, all in a temporary directory.
struct Deployment {
    dir: tempfile::TempDir,
    cwasm: PathBuf,
}

impl Deployment {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir(&plugins).unwrap();
        let mut components: Vec<PathBuf> =
            std::fs::read_dir(component_path("plugins", "files").parent().unwrap())
                .unwrap()
                .map(|entry| entry.unwrap().path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
                .collect();
        components.push(component_path("fixtures", "probe"));
        components.push(component_path("fixtures", "python_style"));
        components.push(component_path("examples", "word_count"));
        for component in &components {
            std::fs::copy(component, plugins.join(component.file_name().unwrap())).unwrap();
        }
        let probe = std::fs::read(component_path("fixtures", "probe")).unwrap();
        let cwasm = dir.path().join("probe.cwasm");
        std::fs::write(&cwasm, Bare::engine().precompile_component(&probe).unwrap()).unwrap();
        let deployment = Deployment { dir, cwasm };
        // Warms the cache: artifacts and tool lists.
        let out = deployment.capstan();
        assert!(out.contains("hi"), "{out}");
        deployment
    }

    fn capstan(&self) -> String {
        let base = self.dir.path();
        let out = Command::new(env!("CARGO_BIN_EXE_capstan"))
            .args(["tool", "call", "echo", r#"{"text":"hi"}"#, "--plugins-dir"])
            .arg(base.join("plugins"))
            .current_dir(base)
            .env_clear()
            .env("HOME", base)
            .env("CAPSTAN_CACHE_DIR", base.join("cache"))
            .env("CAPSTAN_STATE_DIR", base.join("state"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn bare(&self) -> String {
        let out = Command::new(std::env::current_exe().unwrap())
            .env_clear()
            .env(BARE_RUN, &self.cwasm)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

/// The bare process: run `echo` once from the precompiled file and print its result.
fn bare_run(cwasm: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let bare = Bare::precompiled(cwasm);
    println!("{}", rt.block_on(bare.call()));
}

fn percentiles(deployment: &Deployment) {
    const ROUNDS: usize = 200;
    let mut ours = Vec::with_capacity(ROUNDS);
    let mut bare = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        deployment.capstan();
        ours.push(t.elapsed());
        let t = Instant::now();
        deployment.bare();
        bare.push(t.elapsed());
    }
    let ms = |times: &mut Vec<Duration>, p: f64| {
        times.sort_unstable();
        times[((times.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e3
    };
    println!("\nwhole process, {ROUNDS} interleaved rounds (ms)");
    let (b50, b99) = (ms(&mut bare, 0.5), ms(&mut bare, 0.99));
    let (o50, o99) = (ms(&mut ours, 0.5), ms(&mut ours, 0.99));
    println!("  bare wasmtime process  p50 {b50:7.2}  p99 {b99:7.2}");
    println!("  capstan tool call      p50 {o50:7.2}  p99 {o99:7.2}");
    println!(
        "  ratio                  p50 {:6.2}x  p99 {:6.2}x",
        o50 / b50,
        o99 / b99
    );
}

fn main() {
    if let Some(cwasm) = std::env::var_os(BARE_RUN) {
        bare_run(Path::new(&cwasm));
        return;
    }
    let deployment = Deployment::new();
    assert!(deployment.bare().contains("hello"));
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("start");
    group.sample_size(50);
    group.bench_function("bare_process", |b| b.iter(|| deployment.bare()));
    group.bench_function("capstan_tool_call", |b| b.iter(|| deployment.capstan()));
    group.finish();
    c.final_summary();
    percentiles(&deployment);
}
