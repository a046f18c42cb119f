//! The `tasks` and `memory` imports: refused by capability first, then "not available in
//! this host" until the store exists. Never a trap.

use crate::support::{Workspace, call, default_registry, expect_error};
use serde_json::json;

#[tokio::test]
async fn host_imports_check_the_call_capabilities_and_answer_without_trapping() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    let out = call(
        &registry,
        "host_imports",
        json!({}),
        "tasks.read",
        &ws.path(),
    )
    .await
    .unwrap();
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["capabilities"], json!(["tasks.read"]));
    let tasks = report["tasks.list"].as_str().unwrap();
    assert!(
        tasks.starts_with("denied") && tasks.contains("not available in this host"),
        "{tasks}"
    );
    // The tool did not declare memory.read, so the host refuses before anything else.
    let memory = report["memory.recall"].as_str().unwrap();
    assert!(
        memory.starts_with("denied") && memory.contains("memory.read"),
        "{memory}"
    );
}

#[tokio::test]
async fn a_tool_needing_an_ungranted_capability_never_starts() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    let msg = expect_error(
        call(
            &registry,
            "host_imports",
            json!({}),
            "memory.read",
            &ws.path(),
        )
        .await,
        "denied",
    );
    assert!(
        msg.contains("`tasks.read`") && msg.contains("granted: memory.read"),
        "{msg}"
    );
}

/// A status value no WIT enum has (as a plugin built for another contract might send)
/// fails that call, blaming the plugin without a wasm backtrace; the next call works.
#[tokio::test]
async fn an_enum_value_outside_the_contract_fails_only_that_call_and_blames_the_plugin() {
    let data = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(capstan_host::store::Store::open(data.path()).unwrap());
    let registry = crate::support::registry_with_store(store).await;
    let ws = Workspace::new();
    for value in [7, -1] {
        let msg = expect_error(
            call(
                &registry,
                "raw_status",
                json!({ "value": value }),
                "tasks.read",
                &ws.path(),
            )
            .await,
            "failed",
        );
        assert!(
            msg.contains("tool `raw_status` (plugin probe)")
                && msg.contains("could not take a value it passed")
                && msg.contains("discriminant")
                && msg.contains("built for this host's capstan:plugin@0.2.1")
                && msg.contains("passed a value its contract has no place for"),
            "{msg}"
        );
        assert!(!msg.contains("backtrace"), "{msg}");
    }
    let fine = call(
        &registry,
        "raw_status",
        json!({ "value": 0 }),
        "tasks.read",
        &ws.path(),
    )
    .await;
    assert!(fine.is_ok(), "a value in the enum is answered: {fine:?}");
}
