//! Why an SDK-built component instantiates more slowly than a trivial one: bare wasmtime
//! (the host's engine settings, pooling allocator, copy-on-write memory images) instantiates
//! and drops components that add one part of the SDK component's shape at a time.
//!
//! Needs the built fixtures (`bash scripts/setup`). Run with
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench instantiate`.
//!
//! - `minimal`: one core module with one function: no memory, no table.
//! - `memory`: one core module with the probe's linear memory (initial size), its active
//!   data and its function table with its element segments: the probe's state in a single
//!   core instance.
//! - `instances`: as many core instances as the probe has (the preview1 adapter and the
//!   shim modules `wit-component` adds), the first with `memory`'s state, the others empty.
//! - `imports`: `instances` whose first module also imports as many host functions as the
//!   probe lowers (WASI's clock, lowered again and again).
//! - `files`, `probe`: the first-party `files` plugin and the probe fixture, built with the
//!   SDK through the preview1 adapter.
//! - `probe_decommit_batch_16`, `probe_no_warm_slots`: the probe on an engine whose pool
//!   batches 16 decommits, or keeps no unused warm slot (the default keeps 100).
//!
//! Each measures `InstancePre::instantiate_async` on a new store and the drop of that store,
//! which returns the instance's slots to the pool (and decommits what it touched).
//! Before criterion, the shape of each is printed as read from its bytes.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::fmt::Write as _;

use criterion::Criterion;
use tokio::runtime::Runtime;
use wasmtime::component::{Component, InstancePre};
use wasmtime::{Engine, Store};

#[path = "support/bare.rs"]
mod bare;
#[path = "support/shape.rs"]
mod shape;

use bare::{Bare, BareState, component_path};
use shape::{Shape, shape};

/// A core module with `pages` of memory holding `data` bytes of active data, and a table of
/// `elements` functions filled by one element segment.
fn state_module(pages: u64, data: u64, elements: u64) -> String {
    let mut module = String::from("(core module (func $f)");
    if pages > 0 {
        let _ = write!(module, " (memory {pages})");
    }
    if data > 0 {
        // Not zeros: the image must carry every byte.
        let bytes = "\\5a".repeat(data as usize);
        let _ = write!(module, " (data (i32.const 1024) \"{bytes}\")");
    }
    if elements > 0 {
        let funcs = " $f".repeat(elements as usize);
        let _ = write!(
            module,
            " (table {elements} funcref) (elem (i32.const 0) func{funcs})"
        );
    }
    module.push_str(" (export \"f\" (func $f)))");
    module
}

/// A component of `instances` core instances: the first of `first` (a module from
/// [`state_module`]), the rest of an empty module. It exports the first's function.
fn component_text(first: &str, instances: usize) -> String {
    let mut text = format!("(component {first} (core instance $i0 (instantiate 0))");
    finish_component(&mut text, instances);
    text
}

/// Ends `text`, whose first core instance `$i0` is made: `instances - 1` instances of an
/// empty module, and the export of `$i0`'s function.
fn finish_component(text: &mut String, instances: usize) {
    if instances > 1 {
        text.push_str(" (core module (func (export \"g\")))");
        for i in 1..instances {
            let _ = write!(text, " (core instance $i{i} (instantiate 1))");
        }
    }
    text.push_str(" (func (export \"f\") (canon lift (core func $i0 \"f\"))))");
}

/// [`component_text`] whose first core instance also imports `lowered` host functions:
/// WASI's monotonic clock `now`, lowered once for each.
fn component_with_imports(first: &str, instances: usize, lowered: usize) -> String {
    let mut text = String::from(
        "(component (import \"wasi:clocks/monotonic-clock@0.2.0\" (instance $clock \
         (export \"now\" (func (result u64))))) (alias export $clock \"now\" (func $now))",
    );
    let mut args = String::from("(core instance $host");
    for i in 0..lowered {
        let _ = write!(text, " (core func $l{i} (canon lower (func $now)))");
        let _ = write!(args, " (export \"f{i}\" (func $l{i}))");
    }
    args.push(')');
    // The first module imports them all.
    let imports: String = (0..lowered)
        .map(|i| format!(" (import \"host\" \"f{i}\" (func (result i64)))"))
        .collect();
    let first = first.replacen("(core module", &format!("(core module{imports}"), 1);
    let _ = write!(
        text,
        " {args} {first} (core instance $i0 (instantiate 0 (with \"host\" (instance $host))))"
    );
    finish_component(&mut text, instances);
    text
}

struct Case {
    name: &'static str,
    shape: Shape,
    pre: InstancePre<BareState>,
}

impl Case {
    fn new(engine: &Engine, name: &'static str, bytes: &[u8]) -> Self {
        let component = Component::new(engine, bytes).unwrap();
        let pre = Bare::linker(engine).instantiate_pre(&component).unwrap();
        Case {
            name,
            shape: shape(bytes),
            pre,
        }
    }

    async fn instantiate_and_drop(&self) {
        let mut store = Store::new(self.pre.engine(), BareState::new());
        store.set_epoch_deadline(u64::MAX);
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        std::hint::black_box(instance);
    }
}

fn main() {
    let engine = Bare::engine();
    let probe_bytes = std::fs::read(component_path("fixtures", "probe")).unwrap();
    let probe = shape(&probe_bytes);
    let files_bytes = std::fs::read(component_path("plugins", "files")).unwrap();

    let minimal = component_text(&state_module(0, 0, 0), 1);
    let state = state_module(
        probe.initial_memory / 65536,
        probe.data_bytes,
        probe.table_elements,
    );
    let memory = component_text(&state, 1);
    let instances = component_text(&state, probe.core_instances);
    let imports = component_with_imports(&state, probe.core_instances, probe.lowered);
    let cases = [
        Case::new(&engine, "minimal", &wat::parse_str(&minimal).unwrap()),
        Case::new(&engine, "memory", &wat::parse_str(&memory).unwrap()),
        Case::new(&engine, "instances", &wat::parse_str(&instances).unwrap()),
        Case::new(&engine, "imports", &wat::parse_str(&imports).unwrap()),
        Case::new(&engine, "files", &files_bytes),
        Case::new(&engine, "probe", &probe_bytes),
    ];

    println!(
        "{:<10} {:>8} {:>7} {:>9} {:>9} {:>11} {:>7} {:>9} {:>9} {:>6} {:>7} {:>7}",
        "component",
        "bytes",
        "modules",
        "instances",
        "memories",
        "initial KiB",
        "tables",
        "elements",
        "data KiB",
        "starts",
        "imports",
        "lowered"
    );
    for case in &cases {
        let s = &case.shape;
        println!(
            "{:<10} {:>8} {:>7} {:>9} {:>9} {:>11} {:>7} {:>9} {:>9.1} {:>6} {:>7} {:>7}",
            case.name,
            s.bytes,
            s.core_modules,
            s.core_instances,
            s.memories,
            s.initial_memory / 1024,
            s.tables,
            s.table_elements,
            s.data_bytes as f64 / 1024.0,
            s.start_functions,
            s.imports,
            s.lowered
        );
    }

    // The pooling allocator's settings that issue 14 asks to try, on the probe.
    let batched = Bare::engine_with(|pool| {
        pool.decommit_batch_size(16);
    });
    let no_warm_slots = Bare::engine_with(|pool| {
        pool.max_unused_warm_slots(0);
    });
    let settings = [
        Case::new(&batched, "probe_decommit_batch_16", &probe_bytes),
        Case::new(&no_warm_slots, "probe_no_warm_slots", &probe_bytes),
    ];

    let rt = Runtime::new().unwrap();
    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("instantiate");
    for case in cases.iter().chain(&settings) {
        group.bench_function(case.name, |b| {
            b.iter(|| rt.block_on(case.instantiate_and_drop()))
        });
    }
    group.finish();
    criterion.final_summary();
}
