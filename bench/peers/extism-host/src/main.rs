//! Times calls of a long-lived Extism plugin, on demand.
//!
//! `extism-peer GUEST.wasm` loads the guest once (Extism's `Plugin::new` with WASI off),
//! checks one call, prints `ready`, then for each line `N` read from stdin makes N calls of
//! `length` with the benchmark's argument and prints their durations in nanoseconds on one
//! line. End of input ends it. The caller interleaves these blocks with its own calls, so
//! both hosts share the machine's state of the moment.

use std::io::{BufRead, Write};
use std::time::Instant;

use extism::{Manifest, Plugin, Wasm};

/// The argument Capstan's benchmark passes to its `length` tool.
const ARGS: &str = r#"{"text":"hello"}"#;

fn main() -> Result<(), extism::Error> {
    let guest = std::env::args()
        .nth(1)
        .ok_or_else(|| extism::Error::msg("usage: extism-peer GUEST.wasm"))?;
    // Read here: loading a file by path is a feature of Extism's this build leaves out.
    let manifest = Manifest::new([Wasm::data(std::fs::read(&guest)?)]);
    let mut plugin = Plugin::new(&manifest, [], false)?;
    let check: String = plugin.call("length", ARGS)?;
    if check != ARGS.len().to_string() {
        return Err(extism::Error::msg(format!("length returned {check}")));
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    writeln!(out, "ready")?;
    out.flush()?;
    let mut times = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let n: usize = line?.trim().parse()?;
        times.clear();
        for _ in 0..n {
            let start = Instant::now();
            let output: &str = plugin.call("length", ARGS)?;
            std::hint::black_box(output);
            times.push(start.elapsed().as_nanos());
        }
        let line: Vec<String> = times.iter().map(u128::to_string).collect();
        writeln!(out, "{}", line.join(" "))?;
        out.flush()?;
    }
    Ok(())
}
