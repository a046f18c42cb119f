//! What the start benchmarks share: the plugins a start is measured with, and interleaved
//! percentiles.
//!
//! The plugins: every component the build makes that loads (the
//! four first-party plugins, the probe fixture, the example and the Python-shaped
//! fixture: 7) and those in `$CAPSTAN_START_PLUGINS` (`scripts/bench-start` builds three
//! from the `capstan plugins new` Rust template: 10).

#![allow(dead_code)] // Each benchmark uses its share.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The `.wasm` files in `dir`.
pub fn wasm_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
        .collect()
}

/// Every component a start loads; `files` is the path of `target/plugins/files.wasm`.
pub fn start_components(files: &Path) -> Vec<PathBuf> {
    let built = files.parent().unwrap().parent().unwrap();
    let mut components = wasm_in(files.parent().unwrap());
    components.push(built.join("fixtures/probe.wasm"));
    components.push(built.join("fixtures/python_style.wasm"));
    components.push(built.join("examples/word_count.wasm"));
    if let Some(extra) = std::env::var_os("CAPSTAN_START_PLUGINS") {
        components.extend(wasm_in(Path::new(&extra)));
    }
    components
}

/// Runs each of `rows` in turn, `ROUNDS` times, and prints their p50 and p99 and the ratio
/// of the first to the last.
pub fn percentiles(title: &str, rows: &[(&str, &dyn Fn())]) {
    const ROUNDS: usize = 200;
    let mut times = vec![Vec::with_capacity(ROUNDS); rows.len()];
    for _ in 0..ROUNDS {
        for ((_, run), times) in rows.iter().zip(&mut times) {
            let t = Instant::now();
            run();
            times.push(t.elapsed());
        }
    }
    let ms = |times: &mut Vec<Duration>, p: f64| {
        times.sort_unstable();
        times[((times.len() as f64 - 1.0) * p) as usize].as_secs_f64() * 1e3
    };
    println!("\n{title}, {ROUNDS} interleaved rounds (ms)");
    let mut first = (0.0, 0.0);
    let mut last = (0.0, 0.0);
    for (i, ((name, _), times)) in rows.iter().zip(&mut times).enumerate() {
        let (p50, p99) = (ms(times, 0.5), ms(times, 0.99));
        println!("  {name:<28} p50 {p50:7.2}  p99 {p99:7.2}");
        if i == 0 {
            first = (p50, p99);
        }
        last = (p50, p99);
    }
    println!(
        "  {:<28} p50 {:6.2}x  p99 {:6.2}x",
        "ratio",
        first.0 / last.0,
        first.1 / last.1
    );
}
