//! What a plugin costs by the language it is written in: the `capstan plugins new` template
//! (a word count of a workspace file, `fs.read`) in Rust, Python (componentize-py) and
//! JavaScript (ComponentizeJS), each loaded by the same host.
//!
//! Needs the three built by `bash scripts/bench-languages`, which then runs this bench
//! (`target/lang-plugins/{rswords,pywords,jswords}.wasm`, or the directory in
//! `CAPSTAN_LANG_PLUGINS`).
//!
//! - Before criterion: each component's size, core modules, core instances, linear
//!   memories and initial memory (read from its bytes, and how long reading them all
//!   takes), a cold compile (median of three),
//!   and the smallest `limits.tool_memory_mib` its call runs under.
//! - `languages/load_cached/LANG`: a load from the warm artifact cache of a plugin file
//!   and an artifact unchanged since they were checked (so neither is read whole or hashed
//!   again: the artifact is copied into a sealed memory file and mapped), then link and
//!   the tool list kept sealed beside it. The bench first waits for the cache's files to
//!   settle and loads each plugin once, as a start a few seconds after the last would.
//! - `languages/call/LANG`: `Registry::call` of the word count on a 1 KiB file: a fresh
//!   instance per call, the default.
//! - `languages/kept_call/LANG`: the same call in the instance the calling process keeps
//!   (`instance_reuse = "process"`); the bench first checks that the instance is kept.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::plugin::{
    ArtifactCache, CallRequest, Limits, PluginHost, ProcessInstances, Registry,
};
use capstan_host::policy::Grants;
use criterion::Criterion;
use tokio::runtime::Runtime;

const LANGUAGES: &[(&str, &str)] = &[
    ("rust", "rswords"),
    ("python", "pywords"),
    ("js", "jswords"),
];

#[path = "support/shape.rs"]
mod shape;

use shape::shape;

fn plugins_dir() -> PathBuf {
    std::env::var_os("CAPSTAN_LANG_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/lang-plugins"))
}

/// A registry with the one plugin at `file`, on a host with `limits` and `cache`; the
/// plugin may have been refused.
fn loaded(rt: &Runtime, file: &Path, limits: Limits, cache: ArtifactCache) -> Registry {
    let host = Arc::new(PluginHost::new(limits, cache).unwrap());
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(file, dir.path().join(file.file_name().unwrap())).unwrap();
    let log = capstan_host::plugin::CallLog::disabled();
    rt.block_on(Registry::load_dir(host, log, dir.path()))
        .unwrap()
}

/// A registry with the one plugin at `file` loaded, on a host with `limits` and `cache`.
fn registry(rt: &Runtime, file: &Path, limits: Limits, cache: ArtifactCache) -> Registry {
    let registry = loaded(rt, file, limits, cache);
    assert!(registry.refused().is_empty(), "{:?}", registry.refused());
    registry
}

fn call(rt: &Runtime, registry: &Registry, tool: &str, workspace: &Path) -> Result<String, String> {
    call_in(rt, registry, tool, workspace, None)
}

/// The word count's call, in `instances` when given (a kept instance), else a fresh one.
fn call_in(
    rt: &Runtime,
    registry: &Registry,
    tool: &str,
    workspace: &Path,
    instances: Option<&ProcessInstances>,
) -> Result<String, String> {
    let grants: Grants = "fs.read".parse().unwrap();
    rt.block_on(registry.call(CallRequest {
        tool,
        args_json: r#"{"path": "notes.txt", "top": 3}"#,
        grants: &grants,
        workspace: Some(workspace),
        caller: &capstan_host::ids::Caller::client("bench", None),
        instances,
    }))
    .map_err(|err| err.to_string())
}

/// The smallest memory limit, in MiB, under which the tool's call succeeds.
fn least_memory(rt: &Runtime, file: &Path, tool: &str, workspace: &Path, cache: &Path) -> u64 {
    let works = |mib: u64| {
        let limits = Limits {
            memory_bytes: (mib << 20) as usize,
            ..Limits::default()
        };
        let registry = loaded(rt, file, limits, ArtifactCache::new(cache));
        registry.refused().is_empty() && call(rt, &registry, tool, workspace).is_ok()
    };
    let (mut low, mut high) = (1, 64);
    assert!(works(high), "{tool} does not run under 64 MiB");
    while low < high {
        let mid = (low + high) / 2;
        if works(mid) {
            high = mid
        } else {
            low = mid + 1
        }
    }
    high
}

/// Waits until every file in `dir` last changed over two seconds ago.
fn wait_until_settled(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let youngest = || {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let metadata = entry.unwrap().metadata().unwrap();
                std::time::UNIX_EPOCH
                    + Duration::new(metadata.ctime() as u64, metadata.ctime_nsec() as u32)
            })
            .max()
            .unwrap_or(std::time::UNIX_EPOCH)
    };
    while youngest().elapsed().unwrap_or_default() < Duration::from_millis(2100) {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn main() {
    let dir = plugins_dir();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let text = "the quick brown fox jumps over the lazy dog\n".repeat(24);
    std::fs::write(workspace.path().join("notes.txt"), text).unwrap();
    let cache = tempfile::tempdir().unwrap();

    let mut loaded = Vec::new();
    println!(
        "{:<7} {:>9} {:>7} {:>9} {:>8} {:>10} {:>8} {:>11} {:>10}",
        "lang",
        "size MiB",
        "modules",
        "instances",
        "memories",
        "start MiB",
        "scan ms",
        "compile s",
        "least MiB"
    );
    for (lang, tool) in LANGUAGES {
        let file = dir.join(format!("{tool}.wasm"));
        let bytes = std::fs::read(&file).unwrap_or_else(|err| {
            panic!(
                "{}: {err}; build it with `bash scripts/bench-languages`",
                file.display()
            )
        });
        // A whole parse of its bytes: more than the load's check of imports and exports
        // reads, so an upper bound of what that check costs.
        let started = Instant::now();
        let shape = shape(&bytes);
        let scan = started.elapsed();
        let cold = PluginHost::new(Limits::default(), ArtifactCache::disabled()).unwrap();
        let mut compiles: Vec<Duration> = (0..3)
            .map(|_| {
                let started = Instant::now();
                rt.block_on(cold.load(&file)).unwrap();
                started.elapsed()
            })
            .collect();
        compiles.sort();
        // Warm the cache the criterion runs load from.
        let warm = registry(
            &rt,
            &file,
            Limits::default(),
            ArtifactCache::new(cache.path()),
        );
        call(&rt, &warm, tool, workspace.path()).expect("the template's tool runs");
        let least = least_memory(&rt, &file, tool, workspace.path(), cache.path());
        println!(
            "{:<7} {:>9.1} {:>7} {:>9} {:>8} {:>10.1} {:>8.1} {:>11.2} {:>10}",
            lang,
            shape.bytes as f64 / (1 << 20) as f64,
            shape.core_modules,
            shape.core_instances,
            shape.memories,
            shape.initial_memory as f64 / (1 << 20) as f64,
            scan.as_secs_f64() * 1e3,
            compiles[1].as_secs_f64(),
            least
        );
        loaded.push((lang, tool, file, warm));
    }

    let mut criterion = Criterion::default()
        .configure_from_args()
        .measurement_time(Duration::from_secs(5));
    let cached = PluginHost::new(Limits::default(), ArtifactCache::new(cache.path())).unwrap();
    // A file is recorded as checked once it has not changed for two seconds: the plugin
    // files long since, the artifacts just written.
    wait_until_settled(cache.path());
    for (_, _, file, _) in &loaded {
        rt.block_on(cached.load(file)).unwrap();
    }
    for (lang, tool, file, warm) in &loaded {
        criterion.bench_function(&format!("languages/load_cached/{lang}"), |b| {
            b.iter(|| rt.block_on(cached.load(file)).unwrap())
        });
        criterion.bench_function(&format!("languages/call/{lang}"), |b| {
            b.iter(|| call(&rt, warm, tool, workspace.path()).unwrap())
        });
        let kept = ProcessInstances::new();
        for _ in 0..2 {
            call_in(&rt, warm, tool, workspace.path(), Some(&kept)).unwrap();
            assert_eq!(kept.len(), 1, "{lang}: the call's instance is kept");
        }
        criterion.bench_function(&format!("languages/kept_call/{lang}"), |b| {
            b.iter(|| call_in(&rt, warm, tool, workspace.path(), Some(&kept)).unwrap())
        });
    }
    criterion.final_summary();
}
