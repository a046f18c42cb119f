//! The `tasks` and `memory` plugins against a real SQLite store, scoped by grant.

use std::sync::Arc;

use crate::support::{Workspace, call_by, expect_error, registry_with_store};
use capstan_host::store::{Store, TaskStatus};
use serde_json::{Value, json};

/// The worker and branch profiles' grants from the default config.
const WORKER: &str = "fs.read,fs.write,tasks.read,tasks.write-own,memory.write";
const BRANCH: &str = "memory.read,memory.write,tasks.read,tasks.write,fs.read";

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test]
async fn a_worker_creates_and_updates_its_own_tasks_but_not_another_workers() {
    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(data.path()).unwrap());
    let registry = registry_with_store(store.clone()).await;
    let ws = Workspace::new();

    let mine = parse(
        &call_by(&registry, "worker:1", "task_create", json!({"title": "Fix the login bug", "priority": "high", "metadata": {"source": "notes.md"}}), WORKER, &ws.path())
            .await
            .unwrap(),
    );
    assert_eq!(mine["creator"], "worker:1");
    assert_eq!(mine["priority"], "high");
    assert_eq!(mine["metadata"]["source"], "notes.md");
    let theirs = parse(
        &call_by(
            &registry,
            "worker:2",
            "task_create",
            json!({"title": "Someone else's"}),
            WORKER,
            &ws.path(),
        )
        .await
        .unwrap(),
    );

    let updated = call_by(
        &registry,
        "worker:1",
        "task_update",
        json!({"number": mine["number"], "status": "in-progress"}),
        WORKER,
        &ws.path(),
    )
    .await
    .unwrap();
    assert_eq!(parse(&updated)["status"], "in-progress");

    let msg = expect_error(
        call_by(
            &registry,
            "worker:1",
            "task_update",
            json!({"number": theirs["number"], "status": "cancelled"}),
            WORKER,
            &ws.path(),
        )
        .await,
        "denied",
    );
    assert!(
        msg.contains(&format!("task #{}", theirs["number"])) && msg.contains("worker:2"),
        "{msg}"
    );
    assert_eq!(
        store
            .get_task(theirs["number"].as_u64().unwrap())
            .unwrap()
            .status,
        TaskStatus::Backlog
    );

    // A branch holds tasks.write: it may update any task.
    call_by(
        &registry,
        "branch:1",
        "task_update",
        json!({"number": theirs["number"], "status": "cancelled"}),
        BRANCH,
        &ws.path(),
    )
    .await
    .unwrap();
    assert_eq!(
        store
            .get_task(theirs["number"].as_u64().unwrap())
            .unwrap()
            .status,
        TaskStatus::Cancelled
    );

    let listed = parse(
        &call_by(
            &registry,
            "worker:1",
            "task_list",
            json!({"status": "in-progress"}),
            WORKER,
            &ws.path(),
        )
        .await
        .unwrap(),
    );
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["title"], "Fix the login bug");
}

#[tokio::test]
async fn task_errors_come_back_as_tool_errors() {
    let data = tempfile::tempdir().unwrap();
    let registry = registry_with_store(Arc::new(Store::open(data.path()).unwrap())).await;
    let ws = Workspace::new();
    let created = parse(
        &call_by(
            &registry,
            "worker:1",
            "task_create",
            json!({"title": "t"}),
            WORKER,
            &ws.path(),
        )
        .await
        .unwrap(),
    );
    let msg = expect_error(
        call_by(
            &registry,
            "worker:1",
            "task_update",
            json!({"number": created["number"], "status": "done"}),
            WORKER,
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(msg.contains("cannot move from backlog to done"), "{msg}");
    let msg = expect_error(
        call_by(
            &registry,
            "worker:1",
            "task_update",
            json!({"number": 999, "title": "x"}),
            WORKER,
            &ws.path(),
        )
        .await,
        "not-found",
    );
    assert!(msg.contains("#999"), "{msg}");
    let msg = expect_error(
        call_by(
            &registry,
            "worker:1",
            "task_create",
            json!({"title": "t", "priority": "asap"}),
            WORKER,
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(msg.contains("unknown priority `asap`"), "{msg}");
    // The channel's grants hold no task capability: refused before the plugin runs.
    let msg = expect_error(
        call_by(
            &registry,
            "channel:1",
            "task_list",
            json!({}),
            "",
            &ws.path(),
        )
        .await,
        "denied",
    );
    assert!(msg.contains("`tasks.read`"), "{msg}");
}

#[tokio::test]
async fn memories_are_saved_recalled_and_deleted_through_the_plugin() {
    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(data.path()).unwrap());
    let registry = registry_with_store(store.clone()).await;
    let ws = Workspace::new();
    let saved = parse(
        &call_by(&registry, "worker:1", "memory_save", json!({"content": "The customer prefers weekly reports", "kind": "preference", "importance": 0.8}), WORKER, &ws.path())
            .await
            .unwrap(),
    );
    // Workers get no memory_recall: their grants lack memory.read.
    let msg = expect_error(
        call_by(
            &registry,
            "worker:1",
            "memory_recall",
            json!({"query": "reports"}),
            WORKER,
            &ws.path(),
        )
        .await,
        "denied",
    );
    assert!(msg.contains("`memory.read`"), "{msg}");
    let found = parse(
        &call_by(
            &registry,
            "branch:1",
            "memory_recall",
            json!({"query": "weekly reports"}),
            BRANCH,
            &ws.path(),
        )
        .await
        .unwrap(),
    );
    assert_eq!(found[0]["id"], saved["id"]);
    assert_eq!(found[0]["kind"], "preference");

    call_by(
        &registry,
        "branch:1",
        "memory_delete",
        json!({"id": saved["id"]}),
        BRANCH,
        &ws.path(),
    )
    .await
    .unwrap();
    assert!(store.recall("weekly", 5).unwrap().is_empty());
    let msg = expect_error(
        call_by(
            &registry,
            "branch:1",
            "memory_delete",
            json!({"id": "abc"}),
            BRANCH,
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(msg.contains("not a number"), "{msg}");

    // The rows are in the SQLite file, for the next process to find.
    drop(registry);
    let reopened = Store::open(data.path()).unwrap();
    assert_eq!(reopened.recall("customer", 5).unwrap().len(), 0);
}

#[tokio::test]
async fn every_call_is_audited_with_effective_grants_and_redacted_arguments() {
    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(data.path()).unwrap());
    let registry = registry_with_store(store.clone()).await;
    let ws = Workspace::new();
    let secret = "sk-live-0123456789abcdef0123";
    call_by(
        &registry,
        "worker:7",
        "file_write",
        json!({"path": "k.txt", "content": secret}),
        WORKER,
        &ws.path(),
    )
    .await
    .unwrap();
    let denied = call_by(
        &registry,
        "branch:2",
        "file_write",
        json!({"path": "k.txt", "content": "x", "api_key": "abc"}),
        BRANCH,
        &ws.path(),
    )
    .await;
    assert!(denied.is_err());

    let log = store.audit_log(10).unwrap();
    assert_eq!(log.len(), 2, "{log:?}");
    let (newest, oldest) = (&log[0], &log[1]);
    assert_eq!(
        (
            oldest.process.as_str(),
            oldest.tool.as_str(),
            oldest.outcome.as_str()
        ),
        ("worker:7", "file_write", "ok")
    );
    assert_eq!(oldest.grants, "fs.write");
    assert!(!oldest.arguments.contains(secret), "{}", oldest.arguments);
    assert!(oldest.arguments.contains("k.txt"), "{}", oldest.arguments);
    assert_eq!(
        (newest.process.as_str(), newest.outcome.as_str()),
        ("branch:2", "denied")
    );
    assert!(newest.detail.contains("`fs.write`"), "{}", newest.detail);
    assert!(!newest.arguments.contains("abc"), "{}", newest.arguments);
}

/// Status and priority are WIT enums; the task tools show the model every name each
/// takes, and hand back the names the host stored.
#[tokio::test]
async fn the_task_tools_show_the_model_every_status_and_priority() {
    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(data.path()).unwrap());
    let registry = registry_with_store(store.clone()).await;
    let names = |tool: &str, field: &str| {
        let (_, spec) = registry.tool(tool).unwrap();
        spec.args_schema["properties"][field].to_string()
    };
    let statuses = ["backlog", "ready", "in-progress", "done", "cancelled"];
    let priorities = ["low", "normal", "high", "urgent"];
    for (tool, field, all) in [
        ("task_update", "status", &statuses[..]),
        ("task_list", "status", &statuses[..]),
        ("task_update", "priority", &priorities[..]),
        ("task_create", "priority", &priorities[..]),
    ] {
        let schema = names(tool, field);
        assert!(schema.contains("\"enum\""), "{tool}.{field}: {schema}");
        for name in all {
            assert!(
                schema.contains(&format!("\"{name}\"")),
                "{tool}.{field}: {schema}"
            );
        }
    }
    let ws = Workspace::new();
    let created = call_by(
        &registry,
        "worker:1",
        "task_create",
        json!({"title": "urgent one", "priority": "urgent"}),
        WORKER,
        &ws.path(),
    )
    .await
    .unwrap();
    let created = parse(&created);
    assert_eq!(
        (created["status"].clone(), created["priority"].clone()),
        (json!("backlog"), json!("urgent"))
    );
    let listed = call_by(
        &registry,
        "worker:1",
        "task_list",
        json!({"status": "backlog"}),
        WORKER,
        &ws.path(),
    )
    .await
    .unwrap();
    assert_eq!(parse(&listed).as_array().map(Vec::len), Some(1), "{listed}");
    let msg = expect_error(
        call_by(
            &registry,
            "worker:1",
            "task_list",
            json!({"status": "finished"}),
            WORKER,
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(
        msg.contains("unknown task status `finished`; expected backlog, ready, in-progress, done or cancelled"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_call_that_may_change_something_is_logged_when_it_returns_and_a_read_with_its_round() {
    use capstan_host::config::Config;
    use capstan_host::plugin::committed;
    use capstan_host::policy::ProcessKind;
    use capstan_host::tools::{ToolCatalog, ToolRouter};

    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(data.path()).unwrap());
    let registry = Arc::new(registry_with_store(store.clone()).await);
    let ws = Workspace::new();
    let config = Config::defaults(data.path());
    let catalog = Arc::new(ToolCatalog::new(&registry, &config.policy));
    let router = ToolRouter::new(registry, catalog, ws.path().to_owned());
    let call = |tool: &'static str, args: Value| {
        let router = &router;
        async move {
            let pending = std::future::pending();
            let arguments = args.to_string();
            let recorded = router
                .run(
                    ProcessKind::Worker,
                    &crate::support::ids::by("worker:1"),
                    None,
                    tool,
                    &arguments,
                    pending,
                )
                .await;
            recorded.into_parts()
        }
    };
    let tools = |store: &Store| -> Vec<String> {
        let log = store.audit_log(10).unwrap();
        log.into_iter().rev().map(|entry| entry.tool).collect()
    };

    let (written, row) = call("file_write", json!({"path": "a.txt", "content": "x"})).await;
    written.unwrap();
    assert!(row.is_none(), "nothing left to wait for");
    assert_eq!(tools(&store), ["file_write"], "in the log on return");

    let (read, row) = call("file_read", json!({"path": "a.txt"})).await;
    assert_eq!(read.unwrap(), "x");
    assert_eq!(
        tools(&store),
        ["file_write"],
        "the read's row waits for its round"
    );
    committed(row.expect("a row to wait for")).await;
    assert_eq!(tools(&store), ["file_write", "file_read"]);
}
