//! A whole `capstan tool call` process, start to result, with a warm artifact cache,
//! against bare wasmtime doing the same in a process of its own, and against the wasmtime
//! CLI (`wasmtime run --invoke`) of the same release.
//!
//! Run everything with `bash scripts/bench-start`: it builds the three extra plugins and
//! installs the wasmtime CLI (once) before it runs this benchmark. On its own,
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench start` (after
//! `bash scripts/setup`) runs the rows it has what for.
//!
//! - `capstan_tool_call`: the release `capstan` binary runs `tool call echo` with a plugins
//!   directory of every component the build makes that loads (the four first-party
//!   plugins, the probe fixture, the example and the Python-shaped fixture: 7) and those
//!   in `$CAPSTAN_START_PLUGINS` (`scripts/bench-start` builds three from the
//!   `capstan plugins new` Rust template: 10), its cache warm: parse the config, open the
//!   cache, read, check and map each plugin with its sealed tool list, audit, call, print.
//! - `bare_process`: this benchmark's own executable, started again: map the probe's
//!   precompiled file, link, instantiate, call `echo`, print. The floor for a process of
//!   its own with the host's engine settings.
//! - `capstan_files` and `wasmtime_run_files`: the `files` plugin alone reads a workspace
//!   file with `file_read`: `capstan tool call --grant fs.read`, its cache warm, against
//!   `wasmtime run --allow-precompiled --dir . --invoke 'call(...)'` of the same component
//!   precompiled by `wasmtime compile` (`$CAPSTAN_WASMTIME`: the CLI's path).

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;

use criterion::Criterion;

#[path = "support/bare.rs"]
mod bare;

use bare::{Bare, component_path};

#[path = "support/starting.rs"]
mod starting;

use starting::{percentiles, start_components};

/// Set in the environment of the bare process: the precompiled file it runs.
const BARE_RUN: &str = "CAPSTAN_BENCH_BARE_RUN";

/// The file `file_read` reads in the `files` rows.
const READ: &str = r#"{"path":"notes.txt"}"#;

/// Runs `command` to success and returns its standard output.
fn output(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A deployment: the plugins, a warm cache, a state dir and a workspace, all in a
/// temporary directory.
struct Deployment {
    dir: tempfile::TempDir,
    plugins: usize,
    /// The probe precompiled for [`Bare::engine`].
    cwasm: PathBuf,
    /// `files.wasm` precompiled by `wasmtime compile`, and the CLI, when it is given.
    wasmtime: Option<(PathBuf, PathBuf)>,
}

impl Deployment {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let plugins = base.join("plugins");
        let files_only = base.join("files-only");
        let workspace = base.join("workspace");
        for dir in [&plugins, &files_only, &workspace] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(workspace.join("notes.txt"), "one line\n").unwrap();

        let files = component_path("plugins", "files");
        let components = start_components(&files);
        for component in &components {
            std::fs::copy(component, plugins.join(component.file_name().unwrap())).unwrap();
        }
        std::fs::copy(&files, files_only.join("files.wasm")).unwrap();

        let probe = std::fs::read(component_path("fixtures", "probe")).unwrap();
        let cwasm = base.join("probe.cwasm");
        std::fs::write(&cwasm, Bare::engine().precompile_component(&probe).unwrap()).unwrap();

        let wasmtime = std::env::var_os("CAPSTAN_WASMTIME").map(|cli| {
            let cli = PathBuf::from(cli);
            let files_cwasm = base.join("files.cwasm");
            output(
                Command::new(&cli)
                    .arg("compile")
                    .arg(&files)
                    .arg("-o")
                    .arg(&files_cwasm),
            );
            (cli, files_cwasm)
        });
        let deployment = Deployment {
            dir,
            plugins: components.len(),
            cwasm,
            wasmtime,
        };
        // Warms the cache: artifacts and tool lists.
        assert!(deployment.capstan().contains("hi"));
        assert!(deployment.capstan_files().contains("one line"));
        deployment
    }

    /// `capstan tool call ARGS` with the plugins directory `plugins`.
    fn capstan_command(&self, plugins: &str, args: &[&str]) -> Command {
        let base = self.dir.path();
        let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
        command
            .args(["tool", "call"])
            .args(args)
            .arg("--plugins-dir")
            .arg(base.join(plugins))
            .current_dir(base.join("workspace"))
            .env_clear()
            .env("HOME", base)
            .env("CAPSTAN_CACHE_DIR", base.join("cache"))
            .env("CAPSTAN_STATE_DIR", base.join("state"));
        command
    }

    fn capstan(&self) -> String {
        output(&mut self.capstan_command("plugins", &["echo", r#"{"text":"hi"}"#]))
    }

    fn capstan_files(&self) -> String {
        output(&mut self.capstan_command("files-only", &["file_read", READ, "--grant", "fs.read"]))
    }

    fn wasmtime_files(&self) -> Option<String> {
        let (cli, cwasm) = self.wasmtime.as_ref()?;
        let invoke = format!(
            "call(\"file_read\", {}, {{caller: \"bench\", call-id: \"1\", capabilities: [\"fs.read\"]}})",
            serde_json::to_string(READ).unwrap()
        );
        Some(output(
            Command::new(cli)
                .args(["run", "--allow-precompiled", "--dir", ".", "--invoke"])
                .arg(invoke)
                .arg(cwasm)
                .current_dir(self.dir.path().join("workspace"))
                .env_clear(),
        ))
    }

    fn bare(&self) -> String {
        output(
            Command::new(std::env::current_exe().unwrap())
                .env_clear()
                .env(BARE_RUN, &self.cwasm),
        )
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

fn main() {
    if let Some(cwasm) = std::env::var_os(BARE_RUN) {
        bare_run(Path::new(&cwasm));
        return;
    }
    let deployment = Deployment::new();
    assert!(deployment.bare().contains("hello"));
    println!("capstan_tool_call loads {} plugins", deployment.plugins);
    match deployment.wasmtime_files() {
        Some(out) => assert!(out.contains("one line"), "{out}"),
        None => println!(
            "wasmtime_run_files: not run; `bash scripts/bench-start` installs the wasmtime CLI"
        ),
    }

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("start");
    group.sample_size(50);
    group.bench_function("bare_process", |b| b.iter(|| deployment.bare()));
    group.bench_function("capstan_tool_call", |b| b.iter(|| deployment.capstan()));
    group.bench_function("capstan_files", |b| b.iter(|| deployment.capstan_files()));
    if deployment.wasmtime.is_some() {
        group.bench_function("wasmtime_run_files", |b| {
            b.iter(|| deployment.wasmtime_files())
        });
    }
    group.finish();
    c.final_summary();

    let title = format!("whole process, {} plugins", deployment.plugins);
    percentiles(
        &title,
        &[
            ("capstan tool call", &|| drop(deployment.capstan())),
            ("bare wasmtime process", &|| drop(deployment.bare())),
        ],
    );
    if deployment.wasmtime.is_some() {
        percentiles(
            "whole process, files.wasm's file_read",
            &[
                ("capstan tool call", &|| drop(deployment.capstan_files())),
                ("wasmtime run", &|| drop(deployment.wasmtime_files())),
            ],
        );
    }
}
