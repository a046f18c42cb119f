//! Instances kept per process (`instance_reuse = "process"`): a process's calls reuse its
//! own instance, and nothing else does. The probe's `remember` tool shows which calls
//! shared an instance: it returns everything its instance was told.

use std::time::Duration;

use capstan_host::plugin::{CallRequest, Limits, ProcessInstances, Registry, ToolError};
use capstan_host::policy::Grants;
use serde_json::json;

use crate::support::{Workspace, expect_error, registry};

/// Calls `tool` as process `caller`, keeping its instances in `instances`.
async fn call_in(
    registry: &Registry,
    instances: Option<&ProcessInstances>,
    tool: &str,
    args: serde_json::Value,
    grants: &str,
    ws: &Workspace,
) -> Result<String, ToolError> {
    let grants: Grants = grants.parse().expect("grants");
    let workspace = ws.path();
    registry
        .call(CallRequest {
            tool,
            args_json: &args.to_string(),
            grants: &grants,
            workspace: Some(&workspace),
            caller: &crate::support::ids::by("worker:1"),
            instances,
        })
        .await
}

async fn remember(registry: &Registry, instances: &ProcessInstances, text: &str) -> String {
    let ws = Workspace::new();
    call_in(
        registry,
        Some(instances),
        "remember",
        json!({ "text": text }),
        "",
        &ws,
    )
    .await
    .expect("remember answers")
}

fn small_limits() -> Limits {
    Limits {
        deadline: Duration::from_secs(5),
        memory_bytes: 48 << 20,
        ..Limits::default()
    }
}

#[tokio::test]
async fn a_process_reuses_its_instance_and_a_fresh_call_does_not() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    assert_eq!(remember(&registry, &mine, "a").await, "a");
    assert_eq!(remember(&registry, &mine, "b").await, "a,b");
    assert_eq!(mine.len(), 1);
    let ws = Workspace::new();
    let fresh = call_in(&registry, None, "remember", json!({"text": "c"}), "", &ws).await;
    assert_eq!(fresh.unwrap(), "c", "a call without instances runs fresh");
    assert_eq!(remember(&registry, &mine, "d").await, "a,b,d");
}

#[tokio::test]
async fn an_sdk_plugin_builds_its_toolbox_once_per_instance() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    let built = async |instances| {
        call_in(&registry, instances, "toolboxes_built", json!({}), "", &ws)
            .await
            .expect("toolboxes_built answers")
    };
    assert_eq!(built(Some(&mine)).await, "1");
    assert_eq!(
        built(Some(&mine)).await,
        "1",
        "a kept instance's second call reuses the toolbox its first built"
    );
    assert_eq!(mine.len(), 1);
    assert_eq!(built(None).await, "1", "a fresh instance builds its own");
}

#[tokio::test]
async fn state_written_by_one_process_is_invisible_to_another() {
    let registry = registry(small_limits()).await;
    let (one, two) = (ProcessInstances::new(), ProcessInstances::new());
    assert_eq!(
        remember(&registry, &one, "one's secret").await,
        "one's secret"
    );
    assert_eq!(remember(&registry, &two, "two").await, "two");
    assert_eq!(
        remember(&registry, &one, "again").await,
        "one's secret,again"
    );
}

#[tokio::test]
async fn another_capability_set_gets_another_instance() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    ws.put("a.txt", "readable");
    assert_eq!(remember(&registry, &mine, "plain").await, "plain");
    // The same code declaring fs.read runs in an instance with the workspace preopened:
    // not the one above.
    let reading = call_in(
        &registry,
        Some(&mine),
        "remember_reading",
        json!({"text": "reading"}),
        "fs.read",
        &ws,
    )
    .await;
    assert_eq!(reading.unwrap(), "reading");
    assert_eq!(mine.len(), 2);
    // A call without file capabilities never lands in the instance that has the
    // preopen: it sees no files, as a fresh call does.
    let read = call_in(
        &registry,
        Some(&mine),
        "raw_read",
        json!({"path": "a.txt"}),
        "fs.read",
        &ws,
    )
    .await;
    assert_eq!(read.unwrap(), "readable");
    let listed = call_in(&registry, Some(&mine), "raw_list", json!({}), "", &ws).await;
    let err = expect_error(listed, "failed");
    assert!(!err.contains("a.txt"), "{err}");
}

#[tokio::test]
async fn a_trap_drops_the_instance_and_its_state() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    assert_eq!(remember(&registry, &mine, "before").await, "before");
    let trapped = call_in(&registry, Some(&mine), "panic", json!({}), "", &ws).await;
    assert!(expect_error(trapped, "failed").contains("panicked"));
    assert_eq!(mine.len(), 0, "the trapped instance is not kept");
    assert_eq!(remember(&registry, &mine, "after").await, "after");
}

#[tokio::test]
async fn the_deadline_holds_per_call_and_drops_the_instance() {
    let registry = registry(Limits {
        deadline: Duration::from_millis(500),
        ..small_limits()
    })
    .await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    assert_eq!(remember(&registry, &mine, "before").await, "before");
    // The deadline counts from each call, not from the instance's first.
    let spun = call_in(&registry, Some(&mine), "spin", json!({}), "", &ws).await;
    let err = expect_error(spun, "failed");
    assert!(err.contains("deadline"), "{err}");
    assert_eq!(remember(&registry, &mine, "after").await, "after");
    let slept = call_in(
        &registry,
        Some(&mine),
        "sleep",
        json!({"secs": 60}),
        "",
        &ws,
    )
    .await;
    assert!(expect_error(slept, "failed").contains("deadline"));
    assert_eq!(remember(&registry, &mine, "again").await, "again");
}

#[tokio::test]
async fn memory_kept_between_calls_counts_against_the_limit() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    let grow = async || call_in(&registry, Some(&mine), "grow", json!({"mib": 16}), "", &ws).await;
    assert_eq!(grow().await.unwrap(), "16");
    assert_eq!(grow().await.unwrap(), "32");
    // 48 MiB is the limit: a third 16 MiB does not fit beside the rest of the heap.
    let err = expect_error(grow().await, "failed");
    assert!(
        err.contains("ran out of memory") && err.contains("48 MiB"),
        "{err}"
    );
    assert_eq!(mine.len(), 0);
    assert_eq!(grow().await.unwrap(), "16", "the next call starts fresh");
}

#[tokio::test]
async fn an_instance_holding_more_resources_than_after_its_first_call_is_not_kept() {
    let registry = registry(small_limits()).await;
    let ws = Workspace::new();
    let leak = async |instances: &ProcessInstances, count: u32| {
        call_in(
            &registry,
            Some(instances),
            "leak_files",
            json!({ "count": count }),
            "fs.read",
            &ws,
        )
        .await
        .unwrap()
    };
    let many = ProcessInstances::new();
    assert_eq!(leak(&many, 16).await, "16 left open");
    assert_eq!(
        many.len(),
        0,
        "16 open files are not carried to the next call"
    );
    let mine = ProcessInstances::new();
    assert_eq!(leak(&mine, 0).await, "0 left open");
    assert_eq!(mine.len(), 1);
    assert_eq!(leak(&mine, 0).await, "0 left open");
    assert_eq!(mine.len(), 1, "holding what it held after its first call");
    assert_eq!(leak(&mine, 1).await, "1 left open");
    assert_eq!(mine.len(), 0, "one more open file than before: dropped");
}

#[tokio::test]
async fn an_instance_holding_a_file_or_another_directory_is_not_kept() {
    // Carried to the next call, a handle would outlive what it names: a directory moved
    // out of the workspace, a file deleted from it. Only the workspace itself may be held.
    let registry = registry(small_limits()).await;
    let ws = Workspace::new();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    std::fs::write(ws.path().join("notes.txt"), "x").unwrap();
    for path in ["sub", "notes.txt", "."] {
        let instances = ProcessInstances::new();
        let left = call_in(
            &registry,
            Some(&instances),
            "leak_files",
            json!({ "count": 1, "path": path }),
            "fs.read",
            &ws,
        )
        .await
        .unwrap();
        assert_eq!(left, "1 left open");
        let kept = usize::from(path == ".");
        assert_eq!(instances.len(), kept, "holding `{path}`");
    }
}

#[tokio::test]
async fn an_instance_holding_a_stream_over_a_file_is_not_kept() {
    // A stream holds its file open after the descriptor is closed, and says nothing of
    // what it reads: a kept instance would read a file since deleted from the workspace.
    let registry = registry(small_limits()).await;
    let ws = Workspace::new();
    for grants in ["fs.read", "fs.read,fs.write"] {
        std::fs::write(ws.path().join("secret.txt"), "before").unwrap();
        let instances = ProcessInstances::new();
        let call = |tool| {
            call_in(
                &registry,
                Some(&instances),
                tool,
                json!({ "path": "secret.txt" }),
                grants,
                &ws,
            )
        };
        assert_eq!(call("hold_stream").await.unwrap(), "held");
        assert_eq!(
            instances.len(),
            0,
            "{grants}: the stream's instance was kept"
        );
        std::fs::remove_file(ws.path().join("secret.txt")).unwrap();
        assert_eq!(call("read_held").await.unwrap(), "none held", "{grants}");
    }
    // Streams closed before the call returns leave the instance kept.
    reads_of_notes_keep_one_instance(&registry, &ws, 2).await;
}

#[tokio::test]
async fn an_instance_that_recovered_from_refused_memory_is_not_kept() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    let try_grow = async |mib: u64| {
        call_in(
            &registry,
            Some(&mine),
            "try_grow",
            json!({ "mib": mib }),
            "",
            &ws,
        )
        .await
        .unwrap()
    };
    assert_eq!(try_grow(8).await, "8");
    assert_eq!(mine.len(), 1);
    assert_eq!(
        try_grow(64).await,
        "refused",
        "the guest handles the refusal"
    );
    assert_eq!(mine.len(), 0, "an instance at its limit is not kept");
    assert_eq!(try_grow(8).await, "8", "the next call starts fresh");
}

#[tokio::test]
async fn a_call_with_a_network_grant_never_uses_or_leaves_a_kept_instance() {
    let server = crate::support::http_server::TestServer::start().await;
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    for _ in 0..2 {
        let fetched = call_in(
            &registry,
            Some(&mine),
            "net_get",
            json!({ "url": server.url("/") }),
            &server.grant(),
            &ws,
        )
        .await;
        let fetched = fetched.unwrap();
        assert!(fetched.contains("\"status\":404"), "answered: {fetched}");
        assert_eq!(mine.len(), 0, "a call with a network grant runs fresh");
    }
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn another_caller_or_workspace_gets_another_instance() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let (one, two) = (Workspace::new(), Workspace::new());
    let reading = async |ws: &Workspace, caller: &str, text: &str| {
        let grants: Grants = "fs.read".parse().unwrap();
        let workspace = ws.path();
        registry
            .call(CallRequest {
                tool: "remember_reading",
                args_json: &json!({ "text": text }).to_string(),
                grants: &grants,
                workspace: Some(&workspace),
                caller: &crate::support::ids::by(caller),
                instances: Some(&mine),
            })
            .await
            .unwrap()
    };
    assert_eq!(reading(&one, "worker:1", "a").await, "a");
    assert_eq!(
        reading(&two, "worker:1", "b").await,
        "b",
        "another workspace"
    );
    assert_eq!(reading(&one, "worker:2", "c").await, "c", "another caller");
    assert_eq!(reading(&one, "worker:1", "d").await, "a,d");
    assert_eq!(mine.len(), 3);
}

#[tokio::test]
async fn kept_instances_and_calls_share_the_pool_without_starving_each_other() {
    // One call slot and one warm slot: a kept instance waits beside a call that needs a
    // fresh one, whatever its capabilities.
    let registry = registry(Limits {
        max_concurrent_calls: 1,
        max_warm_instances: 1,
        ..small_limits()
    })
    .await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    assert_eq!(remember(&registry, &mine, "kept").await, "kept");
    for _ in 0..3 {
        // Calls that keep nothing, with other capabilities or none.
        let other = call_in(
            &registry,
            None,
            "remember_reading",
            json!({"text": "x"}),
            "fs.read",
            &ws,
        )
        .await;
        assert_eq!(other.unwrap(), "x", "a fresh instance beside the kept one");
        let fresh = call_in(&registry, None, "echo", json!({"text": "y"}), "", &ws).await;
        assert_eq!(fresh.unwrap(), "y");
    }
    assert_eq!(remember(&registry, &mine, "again").await, "kept,again");
    // Another capability set of the same process takes the one warm slot in turn: the
    // instance idle longest makes room.
    let reading = |text: &'static str| {
        call_in(
            &registry,
            Some(&mine),
            "remember_reading",
            json!({ "text": text }),
            "fs.read",
            &ws,
        )
    };
    assert_eq!(reading("r1").await.unwrap(), "r1");
    assert_eq!(reading("r2").await.unwrap(), "r1,r2");
    assert_eq!(remember(&registry, &mine, "last").await, "last");
}

#[test]
fn the_largest_pool_the_config_allows_builds() {
    let limits = Limits {
        max_warm_instances: 4096,
        ..Limits::default()
    };
    capstan_host::plugin::PluginHost::new(limits, capstan_host::plugin::ArtifactCache::disabled())
        .expect("an engine with 4096 warm slots");
}

#[tokio::test]
async fn kept_instances_are_bounded_host_wide_the_longest_idle_making_room() {
    let registry = registry(Limits {
        max_warm_instances: 1,
        ..small_limits()
    })
    .await;
    let (one, two) = (ProcessInstances::new(), ProcessInstances::new());
    assert_eq!(remember(&registry, &one, "a").await, "a");
    // The one warm slot is taken by an idle instance: the second process's instance takes
    // its place, and the first process's next call starts afresh.
    assert_eq!(remember(&registry, &two, "x").await, "x");
    assert_eq!(remember(&registry, &two, "y").await, "x,y");
    assert_eq!((one.len(), two.len()), (0, 1));
    assert_eq!(registry.host().kept_instances(), 1);
    assert_eq!(remember(&registry, &one, "b").await, "b");
    assert_eq!((one.len(), two.len()), (1, 0));
    // A process that ends frees its slot at once.
    drop(one);
    assert_eq!(registry.host().kept_instances(), 0);
    assert_eq!(remember(&registry, &two, "p").await, "p");
    assert_eq!(remember(&registry, &two, "q").await, "p,q");
}

#[tokio::test]
async fn the_instance_idle_longest_is_the_one_that_makes_room() {
    let registry = registry(Limits {
        max_warm_instances: 2,
        ..small_limits()
    })
    .await;
    let (a, b, c) = (
        ProcessInstances::new(),
        ProcessInstances::new(),
        ProcessInstances::new(),
    );
    assert_eq!(remember(&registry, &a, "a1").await, "a1");
    assert_eq!(remember(&registry, &b, "b1").await, "b1");
    // a's instance is used again: b's has now been idle longest.
    assert_eq!(remember(&registry, &a, "a2").await, "a1,a2");
    assert_eq!(remember(&registry, &c, "c1").await, "c1");
    assert_eq!((a.len(), b.len(), c.len()), (1, 0, 1));
    assert_eq!(remember(&registry, &a, "a3").await, "a1,a2,a3");
    assert_eq!(remember(&registry, &c, "c2").await, "c1,c2");
}

#[tokio::test]
async fn the_instances_of_a_process_in_a_round_of_calls_are_not_taken_to_make_room() {
    let registry = registry(Limits {
        max_warm_instances: 1,
        ..small_limits()
    })
    .await;
    let (one, two) = (ProcessInstances::new(), ProcessInstances::new());
    assert_eq!(remember(&registry, &one, "a").await, "a");
    let round = one.working();
    assert_eq!(remember(&registry, &two, "x").await, "x");
    assert_eq!(
        (one.len(), two.len()),
        (1, 0),
        "one's round keeps its instance"
    );
    assert_eq!(remember(&registry, &one, "b").await, "a,b");
    drop(round);
    assert_eq!(remember(&registry, &two, "y").await, "y");
    assert_eq!(
        (one.len(), two.len()),
        (0, 1),
        "between rounds, it makes room"
    );
}

#[tokio::test]
async fn an_instance_running_a_call_is_never_taken_to_make_room() {
    let registry = registry(Limits {
        max_warm_instances: 1,
        ..small_limits()
    })
    .await;
    let (one, two) = (ProcessInstances::new(), ProcessInstances::new());
    let ws = Workspace::new();
    assert_eq!(remember(&registry, &one, "a").await, "a");
    // The same capabilities as `remember`: the sleep runs in one's kept instance.
    let sleeping = call_in(&registry, Some(&one), "sleep", json!({"secs": 60}), "", &ws);
    tokio::pin!(sleeping);
    tokio::select! {
        biased;
        outcome = &mut sleeping => panic!("the sleep cannot finish first: {outcome:?}"),
        () = async {
            while !one.is_empty() {
                tokio::task::yield_now().await;
            }
        } => {}
    }
    // While it sleeps, another process calls: nothing is idle, so its instance is not kept.
    let other = tokio::select! {
        biased;
        outcome = &mut sleeping => panic!("the sleep cannot finish first: {outcome:?}"),
        answer = remember(&registry, &two, "x") => answer,
    };
    assert_eq!(other, "x");
    assert_eq!(two.len(), 0);
    assert_eq!(
        registry.host().kept_instances(),
        1,
        "the running instance's slot"
    );
}

#[tokio::test]
async fn two_calls_of_one_process_at_once_get_an_instance_each_and_one_is_kept() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    assert_eq!(remember(&registry, &mine, "a").await, "a");
    // The sleep runs in the kept instance (the same capabilities as `remember`) and is
    // left pending there, unpolled, while a second call of the same process runs.
    let sleeping = call_in(&registry, Some(&mine), "sleep", json!({"secs": 1}), "", &ws);
    tokio::pin!(sleeping);
    tokio::select! {
        biased;
        outcome = &mut sleeping => panic!("the sleep cannot finish first: {outcome:?}"),
        () = async {
            while !mine.is_empty() {
                tokio::task::yield_now().await;
            }
        } => {}
    }
    assert_eq!(
        remember(&registry, &mine, "x").await,
        "x",
        "a fresh instance"
    );
    assert_eq!(mine.len(), 1);
    sleeping.await.unwrap();
    // One instance per key: the second to come back is dropped, with its slot.
    assert_eq!(mine.len(), 1);
    assert_eq!(registry.host().kept_instances(), 1);
    assert_eq!(remember(&registry, &mine, "y").await, "x,y");
}

#[tokio::test]
async fn a_kept_call_that_fails_quotes_only_its_own_output() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    let say = |text: &str, abort: bool| {
        call_in(
            &registry,
            Some(&mine),
            "say",
            json!({ "text": text, "abort": abort }),
            "",
            &ws,
        )
    };
    assert_eq!(say("first-call-output", false).await.unwrap(), "said");
    assert_eq!(mine.len(), 1);
    let failed = say("second-call-output", true)
        .await
        .unwrap_err()
        .to_string();
    assert!(failed.contains("second-call-output"), "{failed}");
    assert!(!failed.contains("first-call-output"), "{failed}");
}

#[tokio::test]
async fn a_kept_instance_that_traps_frees_its_warm_slot() {
    let registry = registry(Limits {
        max_warm_instances: 1,
        ..small_limits()
    })
    .await;
    let (one, two) = (ProcessInstances::new(), ProcessInstances::new());
    let ws = Workspace::new();
    assert_eq!(remember(&registry, &one, "a").await, "a");
    assert_eq!(registry.host().kept_instances(), 1);
    // The same capabilities as `remember`: the call runs in one's kept instance, traps,
    // and takes the instance and its slot with it.
    let trapped = call_in(&registry, Some(&one), "panic", json!({}), "", &ws).await;
    assert!(matches!(trapped, Err(ToolError::Failed(_))), "{trapped:?}");
    assert_eq!(one.len(), 0);
    assert_eq!(registry.host().kept_instances(), 0);
    assert_eq!(remember(&registry, &two, "p").await, "p");
    assert_eq!(
        remember(&registry, &two, "q").await,
        "p,q",
        "two keeps the freed slot"
    );
}

#[tokio::test]
async fn with_no_warm_slots_every_call_is_fresh() {
    let registry = registry(Limits {
        max_warm_instances: 0,
        ..small_limits()
    })
    .await;
    let mine = ProcessInstances::new();
    assert_eq!(remember(&registry, &mine, "a").await, "a");
    assert_eq!(remember(&registry, &mine, "b").await, "b");
}

#[tokio::test]
async fn a_cancelled_call_drops_the_instance() {
    let registry = registry(small_limits()).await;
    let mine = ProcessInstances::new();
    let ws = Workspace::new();
    assert_eq!(remember(&registry, &mine, "before").await, "before");
    let sleeping = call_in(
        &registry,
        Some(&mine),
        "sleep",
        json!({"secs": 60}),
        "",
        &ws,
    );
    // The sleep has taken the kept instance once it is polled; dropping it mid-call is what
    // a caller's cancellation does.
    let outcome = tokio::select! {
        biased;
        outcome = sleeping => Some(outcome),
        () = async {
            while !mine.is_empty() {
                tokio::task::yield_now().await;
            }
        } => None,
    };
    assert!(
        outcome.is_none(),
        "the sleep cannot finish first: {outcome:?}"
    );
    assert_eq!(remember(&registry, &mine, "after").await, "after");
}

#[tokio::test]
async fn the_files_plugin_is_kept_between_a_process_calls() {
    let registry = registry(small_limits()).await;
    let ws = Workspace::new();
    reads_of_notes_keep_one_instance(&registry, &ws, 3).await;
}

/// Reads `notes.txt` (written here) `times` times as one process: every read sees it,
/// and the process keeps one instance throughout.
async fn reads_of_notes_keep_one_instance(registry: &Registry, ws: &Workspace, times: usize) {
    ws.put("notes.txt", "kept");
    let instances = ProcessInstances::new();
    for _ in 0..times {
        let read = call_in(
            registry,
            Some(&instances),
            "file_read",
            json!({ "path": "notes.txt" }),
            "fs.read",
            ws,
        )
        .await;
        assert!(read.unwrap().contains("kept"));
        assert_eq!(instances.len(), 1);
    }
}

/// Each worker remembers two things in one turn, then reports what its instance holds.
const TWO_WORKERS: &str = r#"
[[step]]
process = "worker"
when = "task one"
tool_calls = [
  { name = "remember", arguments = { text = "one-a" } },
  { name = "remember", arguments = { text = "one-b" } },
]

[[step]]
process = "worker"
when = "task two"
tool_calls = [
  { name = "remember", arguments = { text = "two-a" } },
  { name = "remember", arguments = { text = "two-b" } },
]

[[step]]
process = "worker"
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "remembered" } }]

[[step]]
process = "channel"
repeat = true
tool_calls = [{ name = "skip" }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_reuse_their_own_instances_through_the_config() {
    use capstan_host::config::Config;

    let dir = tempfile::tempdir().unwrap();
    let toml = r#"
[provider]
kind = "scripted"

[plugins]
instance_reuse = { probe = "process" }

[profiles.worker]
tools = ["remember", "set_status"]
capabilities = []
"#;
    let config = Config::parse(toml, &dir.path().join("capstan.toml")).unwrap();
    assert_eq!(
        config
            .policy
            .reuse()
            .decide(capstan_host::policy::ProcessKind::Worker, "probe"),
        capstan_host::policy::InstanceReuse::Process
    );
    let provider = crate::support::Recording::new(TWO_WORKERS);
    let (rt, _events) = crate::support::agent_runtime(config, provider.clone(), true).await;
    for task in ["task one", "task two"] {
        rt.spawn_worker("main", task, false, None).await.unwrap();
    }
    crate::support::eventually("both workers report", || {
        provider.requests_of("worker").len() == 4
    })
    .await;
    let mut last_results: Vec<String> = provider
        .requests_of("worker")
        .iter()
        .map(|request| request.messages.last().unwrap().content.clone())
        .filter(|text| !text.starts_with("task"))
        .collect();
    last_results.sort();
    // Each worker's second call saw its first, and nothing of the other worker's.
    assert_eq!(last_results, ["one-a,one-b", "two-a,two-b"]);
}
