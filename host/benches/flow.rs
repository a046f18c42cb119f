//! What the data-flow labels and checks add to a tool call, measured in one run beside the
//! whole call they are part of.
//!
//! Needs the built plugins (`bash scripts/setup`). Run with
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench flow`.
//!
//! - `flow/context_label`: the label of what a process has read, worked out before each
//!   round of calls: the join of a 40-message history's labels, every fourth message a
//!   tool result labelled untrusted and private.
//! - `flow/facts_and_check`: what the router does per call on top of the rest: the tool's
//!   flow facts (its declared capabilities and the kind's grants) and the check against the
//!   rules, for a context holding untrusted, private data.
//! - `flow/result_label`: the label a result is given.
//! - `flow/label_json`: a label written and read back as a history message, task or
//!   memory keeps it (JSON).
//! - `flow/message_json` and `flow/message_json_unlabelled`: a tool result written and
//!   read back as the store keeps a history message, with a label and without.
//! - `flow/file_stamp`: the `fstat` the host makes of each file a call opens to write
//!   (a read-only call's open reuses the one it makes anyway), for the file's label.
//! - `flow/touched_clone`: the copy of what a call touched that the host keeps after each
//!   call, holding one file read.
//! - `route/file_read_recorded`: `route/file_read` with the labels of written files kept
//!   (in memory): the lookup of the file read, answered from what the router remembers.
//! - `route/file_read`: the whole call those are part of, `ToolRouter::route` of the
//!   sandboxed `file_read` (flow check, grants, fresh instance, audit row), from the same
//!   context.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::hint::black_box;
use std::sync::Arc;

use capstan_host::config::Config;
use capstan_host::flow::{Label, Origin, Scope};
use capstan_host::ids::ProcessId;
use capstan_host::llm::Message;
use capstan_host::plugin::{ArtifactCache, CallLog, Limits, PluginHost, Registry, Touched};
use capstan_host::policy::ProcessKind;
use capstan_host::services::{FileStamp, Services};
use capstan_host::tools::{Read, Routed, ToolCatalog, ToolRouter};
use criterion::Criterion;

fn main() {
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("data.txt"), "bench data\n").unwrap();
    let config = Config::defaults(dir.path());
    let plugins = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins");
    let registry = tokio.block_on(async {
        let host = PluginHost::new(Limits::default(), ArtifactCache::disabled()).unwrap();
        Registry::load_dir(host.into(), CallLog::disabled(), &plugins)
            .await
            .unwrap()
    });
    let registry = Arc::new(registry);
    let catalog = Arc::new(ToolCatalog::new(&registry, &config.policy));
    let router = ToolRouter::new(registry.clone(), catalog.clone(), workspace.clone());
    let recorded = ToolRouter::new(registry, catalog.clone(), workspace.clone())
        .with_file_labels(Services::in_memory().files, Default::default());
    let opened = std::fs::File::open(workspace.join("data.txt")).unwrap();
    let worker = ProcessId::numbered(ProcessKind::Worker, 1);

    let read =
        Label::untrusted(Origin::Plugin("files".into())).joined(&Label::private(Scope::Workspace));
    let history: Vec<Message> = (0..40)
        .map(|i| {
            let message = Message::user(format!("message {i}"));
            if i % 4 == 3 {
                message.labelled(read.clone())
            } else {
                message
            }
        })
        .collect();
    let context = Label::join_all(history.iter().map(|m| &m.label));

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("flow");
    group.bench_function("context_label", |b| {
        b.iter(|| Label::join_all(black_box(&history).iter().map(|m| &m.label)))
    });
    group.bench_function("facts_and_check", |b| {
        b.iter(|| {
            let facts = catalog
                .flow_facts(ProcessKind::Worker, "file_write")
                .unwrap();
            catalog.decide_flow(
                ProcessKind::Worker,
                "file_write",
                black_box(&context),
                &Label::trusted(),
                &facts.sink,
            )
        })
    });
    group.bench_function("result_label", |b| {
        b.iter(|| router.result_label(ProcessKind::Worker, black_box("file_read")))
    });
    group.bench_function("label_json", |b| {
        b.iter(|| {
            let text = serde_json::to_string(black_box(&context)).unwrap();
            serde_json::from_str::<Label>(&text).unwrap()
        })
    });
    let result = Message::tool_result("call-1", "bench data\n".repeat(4));
    for (name, message) in [
        ("message_json", result.clone().labelled(read.clone())),
        ("message_json_unlabelled", result),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let text = serde_json::to_string(black_box(&message)).unwrap();
                serde_json::from_str::<Message>(&text).unwrap()
            })
        });
    }
    let mut touched = Touched::default();
    let stamp = FileStamp::of(&opened.metadata().unwrap());
    touched.read.insert(("data.txt".into(), Some(stamp)));
    group.bench_function("touched_clone", |b| b.iter(|| black_box(&touched).clone()));
    group.bench_function("file_stamp", |b| {
        b.iter(|| FileStamp::of(&black_box(&opened).metadata().unwrap()))
    });
    group.finish();
    let route = |router: &ToolRouter| {
        tokio.block_on(async {
            let routed = router
                .route(
                    &worker,
                    None,
                    "file_read",
                    r#"{"path":"data.txt"}"#,
                    Read::context(&context),
                )
                .await;
            match routed {
                Routed::Ran { recorded, .. } => recorded.committed().await.unwrap(),
                other => panic!("{other:?}"),
            }
        })
    };
    let mut group = c.benchmark_group("route");
    group.bench_function("file_read", |b| b.iter(|| route(&router)));
    group.bench_function("file_read_recorded", |b| b.iter(|| route(&recorded)));
    group.finish();
    c.final_summary();
}
