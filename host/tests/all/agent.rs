//! The agent runtime through real plugins, a real SQLite file and the scripted provider:
//! each process's tool list, the demo scenario, compaction and restarts.

use std::sync::Arc;

use crate::support::ids::pid;
use crate::support::{agent_runtime, plugins_dir, repo_root, stored, test_cache};
use capstan_host::agent::{Event, Runtime};
use capstan_host::app::AgentBuilder;
use capstan_host::config::{Config, ProviderSettings};
use capstan_host::ids::ProcessId;
use capstan_host::llm::{Script, ScriptedProvider};
use capstan_host::policy::ProcessKind;
use capstan_host::services::{ServiceError, Services, TaskStatus};
use capstan_host::store::{Store, TaskFilter, WorkerState};
use tokio::sync::mpsc;

/// A runtime in `dir` (workspace and data dir inside it) playing `script`.
async fn runtime(
    dir: &std::path::Path,
    script: &str,
    edit: impl FnOnce(&mut Config),
) -> (Arc<Runtime>, mpsc::UnboundedReceiver<Event>) {
    let mut config = Config::defaults(dir);
    config.provider = ProviderSettings::Scripted { script: None };
    edit(&mut config);
    let provider = ScriptedProvider::new(Script::parse(script, "test").unwrap(), "test");
    agent_runtime(config, Arc::new(provider), false).await
}

fn names(runtime: &Runtime, kind: ProcessKind) -> Vec<String> {
    let mut names: Vec<String> = runtime
        .tool_defs(kind)
        .iter()
        .map(|t| t.name.clone())
        .collect();
    names.sort();
    names
}

fn drain(events: &mut mpsc::UnboundedReceiver<Event>) -> Vec<Event> {
    let mut all = Vec::new();
    while let Ok(event) = events.try_recv() {
        all.push(event);
    }
    all
}

#[tokio::test]
async fn each_process_is_offered_exactly_its_profiles_tools() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _) = runtime(dir.path(), "", |_| {}).await;
    assert_eq!(
        names(&rt, ProcessKind::Channel),
        ["branch", "cancel", "reply", "route", "skip", "spawn_worker"]
    );
    assert_eq!(
        names(&rt, ProcessKind::Branch),
        [
            "file_list",
            "file_read",
            "memory_delete",
            "memory_recall",
            "memory_save",
            "spawn_worker",
            "task_create",
            "task_list",
            "task_update"
        ]
    );
    assert_eq!(
        names(&rt, ProcessKind::Worker),
        [
            "file_edit",
            "file_list",
            "file_read",
            "file_write",
            "memory_save",
            "set_status",
            "task_create",
            "task_list",
            "task_update"
        ]
    );
    assert_eq!(names(&rt, ProcessKind::Compactor), ["memory_save"]);
    let cortex = names(&rt, ProcessKind::Cortex);
    assert!(
        cortex.contains(&"file_write".to_owned()) && cortex.contains(&"memory_recall".to_owned()),
        "{cortex:?}"
    );
}

/// A channel that forces calls it was never offered: each is denied, nothing runs.
const FORCED: &str = r#"
[[step]]
process = "channel"
when = "try"
tool_calls = [
  { name = "file_write", arguments = { path = "x.txt", content = "no" } },
  { name = "task_create", arguments = { title = "no" } },
  { name = "set_status", arguments = { state = "done", message = "no" } },
]

[[step]]
process = "channel"
when = "error[denied]"
tool_calls = [{ name = "reply", arguments = { text = "refused as expected" } }]
"#;

#[tokio::test]
async fn a_forced_call_outside_the_profile_is_denied_and_audited() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, mut events) = runtime(dir.path(), FORCED, |_| {}).await;
    rt.send_user_message("main", "try to write").await.unwrap();
    rt.wait_idle("main").await;
    let events = drain(&mut events);
    assert!(
        events.contains(&Event::Reply {
            channel: ProcessId::channel("main"),
            text: "refused as expected".into()
        }),
        "{events:?}"
    );
    assert!(!dir.path().join("workspace/x.txt").exists());
    assert!(
        stored(&rt)
            .list_tasks(&TaskFilter::default())
            .unwrap()
            .is_empty()
    );
    let audit = stored(&rt).audit_log(10).unwrap();
    let denied: Vec<_> = audit
        .iter()
        .filter(|a| a.outcome == "denied")
        .map(|a| a.tool.as_str())
        .collect();
    assert!(
        denied.contains(&"file_write") && denied.contains(&"task_create"),
        "{audit:?}"
    );
    // The turn ended by a delivered reply: its calls and denials collapse into the reply.
    let history: Vec<String> = stored(&rt)
        .load_history("channel:main")
        .unwrap()
        .into_iter()
        .map(|h| h.message)
        .collect();
    assert_eq!(
        history,
        [
            r#"{"role":"user","content":"try to write"}"#,
            r#"{"role":"assistant","content":"refused as expected"}"#
        ],
    );
}

#[tokio::test]
async fn the_demo_scenario_runs_through_real_plugins_and_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let script = std::fs::read_to_string(repo_root().join("examples/demo/script.toml")).unwrap();
    let (rt, mut events) = runtime(dir.path(), &script, |_| {}).await;
    let notes = dir.path().join("workspace/notes");
    std::fs::create_dir_all(&notes).unwrap();
    for name in ["meeting.md", "todo.txt"] {
        std::fs::copy(
            repo_root().join("examples/demo/notes").join(name),
            notes.join(name),
        )
        .unwrap();
    }
    for message in [
        "Gather the open items from the notes in notes/ and summarize them.",
        "yes, create the tasks",
        "Which item is the most urgent?",
        "Save that conclusion to a file, please.",
    ] {
        rt.send_user_message("main", message).await.unwrap();
        rt.wait_idle("main").await;
    }
    let events = drain(&mut events);
    let count = |wanted: fn(&Event) -> bool| events.iter().filter(|e| wanted(e)).count();
    assert_eq!(
        count(|e| matches!(e, Event::WorkerStarted { .. })),
        2,
        "two workers: {events:#?}"
    );
    assert_eq!(
        count(|e| matches!(e, Event::BranchStarted { .. })),
        2,
        "two branches"
    );
    let replies: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::Reply { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(replies.len(), 5, "{replies:#?}");
    assert!(replies[4].contains("cannot write files"), "{replies:?}");

    let analysis = std::fs::read_to_string(dir.path().join("workspace/analysis.md")).unwrap();
    assert!(analysis.contains("Nightly backup job failed"), "{analysis}");
    assert!(
        !dir.path().join("workspace/urgent.md").exists(),
        "the branch could not write"
    );

    // Read back from the SQLite file by a fresh handle: tasks by the worker, worker records.
    rt.shutdown();
    let store = Store::open(&dir.path().join(".capstan")).unwrap();
    let tasks = store.list_tasks(&TaskFilter::default()).unwrap();
    let titles: Vec<_> = tasks
        .iter()
        .map(|t| (t.title.as_str(), t.priority.as_str(), t.creator.to_string()))
        .collect();
    assert_eq!(
        titles,
        [
            (
                "Accept passwords longer than 64 characters on the login page",
                "high",
                "worker:2".to_owned()
            ),
            (
                "Fix the failing nightly backup job",
                "high",
                "worker:2".to_owned()
            ),
            (
                "Write the 0.3 upgrade guide",
                "normal",
                "worker:2".to_owned()
            ),
        ]
    );
    for worker in ["worker:1", "worker:2"] {
        let record = store.get_worker(&pid(worker)).unwrap().unwrap();
        assert_eq!(record.state, WorkerState::Done, "{record:?}");
    }
    let denied = store
        .audit_log(100)
        .unwrap()
        .into_iter()
        .find(|a| a.outcome == "denied")
        .unwrap();
    assert_eq!(
        (denied.process.as_str(), denied.tool.as_str()),
        ("branch:2", "file_write")
    );
    assert!(
        !store.load_history("channel:main").unwrap().is_empty(),
        "the conversation persists"
    );
}

/// Every channel message is answered with text; the compactor summarizes and saves a memory.
const CHATTY: &str = r#"
[[step]]
process = "compactor"
tool_calls = [{ name = "memory_save", arguments = { content = "The user talked about the weather a lot.", kind = "observation" } }]

[[step]]
process = "compactor"
reply = "The user described the weather several times."

[[step]]
process = "channel"
reply = "Noted."
repeat = true
"#;

#[tokio::test]
async fn compaction_triggers_at_the_threshold_and_keeps_the_history_well_formed() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, mut events) = runtime(dir.path(), CHATTY, |c| {
        c.limits.context_window_tokens = 1000;
        c.limits.compaction_threshold = 0.5;
    })
    .await;
    let long = "The weather today is grey and mild with a light wind from the west. ".repeat(5);
    let mut compacted_at = None;
    for n in 0..12 {
        rt.send_user_message("main", &format!("{n}: {long}"))
            .await
            .unwrap();
        rt.wait_idle("main").await;
        let events = drain(&mut events);
        if compacted_at.is_none() && events.iter().any(|e| matches!(e, Event::Compacted { .. })) {
            compacted_at = Some(n);
        }
    }
    // ~95 tokens a message pair: the 500-token threshold is passed at the sixth message.
    assert!(
        matches!(compacted_at, Some(4..=6)),
        "compacted at {compacted_at:?}"
    );
    let history: Vec<serde_json::Value> = stored(&rt)
        .load_history("channel:main")
        .unwrap()
        .iter()
        .map(|h| serde_json::from_str(&h.message).unwrap())
        .collect();
    assert!(
        history[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("[summary of the earlier conversation]"),
        "{:?}",
        history[0]
    );
    assert_eq!(history[0]["role"], "user");
    // After the summary, user and assistant messages still alternate: no pair was split.
    for pair in history[1..].windows(2) {
        assert_ne!(pair[0]["role"], pair[1]["role"], "{history:#?}");
    }
    assert!(
        history.len() < 24,
        "the history shrank: {} messages",
        history.len()
    );
    assert_eq!(
        stored(&rt).recall("weather", 5).unwrap().len(),
        1,
        "the compactor saved a memory"
    );
}

const GREETER: &str = r#"
[[step]]
process = "channel"
when = "remember"
reply = "I will remember the code word: heron."

[[step]]
process = "channel"
when = "code word"
reply = "You told me earlier."
"#;

#[tokio::test]
async fn a_restart_keeps_the_channel_history() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (rt, _) = runtime(dir.path(), GREETER, |_| {}).await;
        rt.send_user_message("main", "Please remember: heron.")
            .await
            .unwrap();
        rt.wait_idle("main").await;
        rt.shutdown();
    }
    let (rt, _) = runtime(dir.path(), GREETER, |_| {}).await;
    rt.send_user_message("main", "What was the code word?")
        .await
        .unwrap();
    rt.wait_idle("main").await;
    let history = stored(&rt).load_history("channel:main").unwrap();
    let contents: Vec<String> = history
        .iter()
        .map(|h| {
            serde_json::from_str::<serde_json::Value>(&h.message).unwrap()["content"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    assert_eq!(
        contents,
        [
            "Please remember: heron.",
            "I will remember the code word: heron.",
            "What was the code word?",
            "You told me earlier."
        ]
    );
}

/// An interactive worker asks for input; the user's answer is routed to it; it finishes.
const INTERACTIVE: &str = r#"
[[step]]
process = "channel"
when = "start the job"
tool_calls = [
  { name = "spawn_worker", arguments = { task = "An interactive job: ask which file to use.", interactive = true } },
  { name = "skip" },
]

[[step]]
process = "worker"
when = "interactive job"
tool_calls = [{ name = "set_status", arguments = { state = "waiting", message = "Which file should I use?" } }]

[[step]]
process = "channel"
when = "needs input"
tool_calls = [{ name = "reply", arguments = { text = "The worker asks: which file should it use?" } }]

[[step]]
process = "channel"
when = "use data.txt"
tool_calls = [
  { name = "route", arguments = { worker = "worker:1", message = "Use data.txt" } },
  { name = "skip" },
]

[[step]]
process = "worker"
when = "continue with the messages"
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "Used data.txt as told." } }]

[[step]]
process = "channel"
when = "used data.txt"
tool_calls = [{ name = "reply", arguments = { text = "Done: it used data.txt." } }]
"#;

#[tokio::test]
async fn an_interactive_worker_waits_for_routed_input_then_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, mut events) = runtime(dir.path(), INTERACTIVE, |_| {}).await;
    rt.send_user_message("main", "Please start the job.")
        .await
        .unwrap();
    rt.wait_idle("main").await;
    let first = drain(&mut events);
    assert!(
        first.contains(&Event::Reply {
            channel: ProcessId::channel("main"),
            text: "The worker asks: which file should it use?".into()
        }),
        "{first:#?}"
    );
    let record = stored(&rt)
        .get_worker(&crate::support::ids::pid("worker:1"))
        .unwrap()
        .unwrap();
    assert_eq!(record.state, WorkerState::WaitingForInput);

    rt.send_user_message("main", "Tell it to use data.txt")
        .await
        .unwrap();
    rt.wait_idle("main").await;
    let second = drain(&mut events);
    assert!(
        second.contains(&Event::Reply {
            channel: ProcessId::channel("main"),
            text: "Done: it used data.txt.".into()
        }),
        "{second:#?}"
    );
    let record = stored(&rt)
        .get_worker(&crate::support::ids::pid("worker:1"))
        .unwrap()
        .unwrap();
    assert_eq!(
        (record.state, record.outcome.as_deref()),
        (WorkerState::Done, Some("Used data.txt as told."))
    );
}

/// An answer routed to a waiting worker from outside a turn makes its channel busy at
/// once: `wait_idle` right after the route waits for the worker's report and the reply to
/// it, instead of finding the channel idle before the worker wakes.
#[tokio::test]
async fn a_route_to_a_waiting_worker_counts_before_the_worker_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, mut events) = runtime(dir.path(), INTERACTIVE, |_| {}).await;
    rt.send_user_message("main", "Please start the job.")
        .await
        .unwrap();
    rt.wait_idle("main").await;
    drain(&mut events);
    let worker = ProcessId::numbered(ProcessKind::Worker, 1);
    assert!(rt.route_to_worker(&worker, "Use data.txt"));
    rt.wait_idle("main").await;
    let after = drain(&mut events);
    assert!(
        after.contains(&Event::Reply {
            channel: ProcessId::channel("main"),
            text: "Done: it used data.txt.".into()
        }),
        "{after:#?}"
    );
}

/// A branch creates two tasks and assigns a worker to the first: the worker may update its
/// assigned task, not the other.
const ASSIGNED: &str = r#"
[[step]]
process = "channel"
when = "plan it"
tool_calls = [{ name = "branch", arguments = { question = "plan the work" } }, { name = "skip" }]

[[step]]
process = "branch"
when = "plan the work"
tool_calls = [
  { name = "task_create", arguments = { title = "Assigned work" } },
  { name = "task_create", arguments = { title = "Someone else's work" } },
]

[[step]]
process = "branch"
when = "Someone else"
tool_calls = [{ name = "spawn_worker", arguments = { task = "Start on task 1.", task_number = 1 } }]

[[step]]
process = "branch"
when = "spawned"
reply = "Planned two tasks; a worker is on #1."

[[step]]
process = "worker"
when = "start on task 1"
tool_calls = [
  { name = "task_update", arguments = { number = 1, status = "in-progress" } },
  { name = "task_update", arguments = { number = 2, status = "in-progress" } },
]

[[step]]
process = "worker"
when = "error[denied]"
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "started #1; #2 is not mine" } }]

[[step]]
process = "channel"
repeat = true
tool_calls = [{ name = "skip" }]
"#;

#[tokio::test]
async fn a_worker_updates_its_assigned_task_but_not_another() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events) = runtime(dir.path(), ASSIGNED, |_| {}).await;
    rt.send_user_message("main", "plan it please")
        .await
        .unwrap();
    rt.wait_idle("main").await;
    let store = stored(&rt);
    let first = store.get_task(1).unwrap();
    assert_eq!(first.status, capstan_host::store::TaskStatus::InProgress);
    assert_eq!(first.assigned_worker, Some(pid("worker:1")));
    assert_eq!(first.creator.to_string(), "branch:1");
    assert_eq!(
        store.get_task(2).unwrap().status,
        capstan_host::store::TaskStatus::Backlog
    );
    let refusal = store
        .audit_log(50)
        .unwrap()
        .into_iter()
        .find(|a| a.outcome == "denied")
        .expect("a denial");
    assert_eq!(refusal.process, "worker:1");
    assert!(refusal.detail.contains("task #2"), "{}", refusal.detail);
    let worker = store
        .get_worker(&crate::support::ids::pid("worker:1"))
        .unwrap()
        .unwrap();
    assert_eq!(
        worker.outcome.as_deref(),
        Some("started #1; #2 is not mine")
    );
}

/// The same run on in-memory services: the taskboard, the audit log, the history and the
/// ledger all answer from memory, with the same rules, and no database is written.
#[tokio::test]
async fn an_agent_runs_on_in_memory_services_and_writes_no_database() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults(dir.path());
    config.provider = ProviderSettings::Scripted { script: None };
    let data_dir = config.agent.data_dir.clone();
    let services = Services::in_memory();
    let provider = ScriptedProvider::new(Script::parse(ASSIGNED, "test").unwrap(), "test");
    let agent = AgentBuilder::new(config)
        .plugins_dir(plugins_dir())
        .cache(test_cache())
        .provider(Arc::new(provider))
        .services(services.clone())
        .build()
        .await
        .unwrap();
    let rt = agent.runtime;
    rt.send_user_message("main", "plan it please")
        .await
        .unwrap();
    rt.wait_idle("main").await;

    let first = services.tasks.get(1).await.unwrap();
    assert_eq!(
        (
            first.status,
            first.assigned_worker,
            first.creator.to_string()
        ),
        (
            TaskStatus::InProgress,
            Some(pid("worker:1")),
            "branch:1".to_owned()
        )
    );
    assert_eq!(
        services.tasks.get(2).await.unwrap().status,
        TaskStatus::Backlog
    );
    let audit = services.audit.recent(50).await.unwrap();
    let refusal = audit
        .iter()
        .find(|a| a.outcome == "denied")
        .expect("a denial");
    assert!(refusal.detail.contains("task #2"), "{}", refusal.detail);
    let worker = services
        .ledger
        .worker(&crate::support::ids::pid("worker:1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(worker.state, WorkerState::Done);
    let history = services
        .history
        .load(&crate::support::ids::key("channel:main"))
        .await
        .unwrap();
    assert!(!history.is_empty(), "the channel's history is kept");
    assert!(
        !data_dir.join("capstan.db").exists(),
        "nothing was written to {}",
        data_dir.display()
    );
    rt.shutdown();
}

const QUICK_WORKER: &str = r#"
[[step]]
process = "worker"
when = "count the files"
delay_ms = 50
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "counted" } }]

[[step]]
process = "worker"
# Matches both spellings the duplicate-spawn test uses ("Wait for me.", "wait  for me"): a
# worker without a matching step would fail and free its task for another spawn.
when = "for me"
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "waiting", message = "which one?" } }]

[[step]]
process = "channel"
repeat = true
tool_calls = [{ name = "skip" }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_spawns_start_one_worker_and_report_duplicates() {
    use capstan_host::agent::SpawnOutcome;
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events) = runtime(dir.path(), QUICK_WORKER, |c| {
        c.limits.max_workers_per_channel = 100
    })
    .await;
    // The worker that wins waits for input, so it is alive until cancelled: every other
    // spawn in the burst must find it, however the spawns interleave.
    let spawns: Vec<_> = (0..100)
        .map(|i| {
            let rt = rt.clone();
            // Spacing and case differ; the task is the same.
            let task = if i % 2 == 0 {
                "Wait for me."
            } else {
                "wait  for me"
            };
            tokio::spawn(async move { rt.spawn_worker("main", task, true, None).await.unwrap() })
        })
        .collect();
    let mut spawned = Vec::new();
    let mut duplicates = Vec::new();
    for spawn in spawns {
        match spawn.await.unwrap() {
            SpawnOutcome::Spawned { worker } => spawned.push(worker),
            SpawnOutcome::Duplicate { existing } => duplicates.push(existing),
        }
    }
    assert_eq!(spawned.len(), 1, "{spawned:?}");
    assert_eq!(duplicates.len(), 99);
    assert!(
        duplicates.iter().all(|d| *d == spawned[0]),
        "duplicates name the live worker"
    );
    rt.wait_idle("main").await; // the worker now waits for input
    assert!(rt.cancel_worker(&spawned[0]));
    // A waiting worker does not hold its channel busy, so wait for the cancel itself.
    crate::support::eventually("released when the worker ended", || {
        rt.reserved_tasks() == 0
    })
    .await;
    rt.wait_idle("main").await;
    assert!(matches!(
        rt.spawn_worker("main", "wait for me", true, None).await,
        Ok(SpawnOutcome::Spawned { .. })
    ));
    rt.shutdown();
}

#[tokio::test]
async fn a_cancelled_worker_releases_its_task() {
    use capstan_host::agent::SpawnOutcome;
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events) = runtime(dir.path(), QUICK_WORKER, |_| {}).await;
    let SpawnOutcome::Spawned { worker } = rt
        .spawn_worker("main", "wait for me", true, None)
        .await
        .unwrap()
    else {
        panic!("first spawn")
    };
    rt.wait_idle("main").await; // the worker now waits for input
    assert_eq!(
        rt.spawn_worker("main", "Wait for me.", true, None)
            .await
            .unwrap(),
        SpawnOutcome::Duplicate {
            existing: worker.clone()
        }
    );
    assert!(rt.cancel_worker(&worker));
    // A waiting worker does not hold its channel busy, so wait for the cancel itself.
    crate::support::eventually("the cancel releases the task", || rt.reserved_tasks() == 0).await;
    rt.wait_idle("main").await;
    assert_eq!(
        stored(&rt).get_worker(&worker).unwrap().unwrap().state,
        WorkerState::Cancelled
    );
    assert!(!rt.cancel_worker(&worker), "gone");
}

/// After shutdown nothing opens a conversation again (a late spawn or message would keep
/// the runtime alive and the CLI waiting): both are refused, and the event stream ends
/// once the runtime is dropped.
#[tokio::test]
async fn after_shutdown_no_conversation_opens_and_the_event_stream_ends() {
    use capstan_host::agent::ConversationError;

    let dir = tempfile::tempdir().unwrap();
    let script = "[[step]]\nprocess = \"channel\"\nwhen = \"hi\"\nreply = \"hello\"\n";
    let (rt, mut events) = runtime(dir.path(), script, |_| {}).await;
    rt.send_user_message("main", "hi").await.unwrap();
    rt.wait_idle("main").await;
    rt.shutdown();
    let refused = rt.send_user_message("main", "again").await.unwrap_err();
    assert!(
        matches!(refused, ConversationError::ShuttingDown(_)),
        "{refused}"
    );
    let spawn = rt
        .spawn_worker("main", "late work", false, None)
        .await
        .unwrap_err();
    assert!(spawn.contains("shutting down"), "{spawn}");
    assert_eq!(rt.live_workers(), 0);
    drop(rt);
    // Every process ends and lets go of the stream; a hang here is the failure.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        while events.recv().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the event stream did not end after shutdown");
}

/// A worker's one round of three calls, then its report.
const THREE_READS: &str = r#"
[[step]]
process = "worker"
when = "read three"
tool_calls = [
  { name = "file_read", arguments = { path = "a.txt" } },
  { name = "file_read", arguments = { path = "b.txt" } },
  { name = "file_read", arguments = { path = "c.txt" } },
]

[[step]]
process = "worker"
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "read" } }]

[[step]]
process = "channel"
repeat = true
tool_calls = [{ name = "skip" }]
"#;

/// Plays a script and, at each request, counts the audited `file_read` calls in the
/// database through a connection of its own: what a reader outside the host sees.
struct AuditWatcher {
    script: ScriptedProvider,
    db: std::path::PathBuf,
    seen: std::sync::Mutex<Vec<(usize, i64)>>,
}

impl capstan_host::llm::Provider for AuditWatcher {
    fn complete<'a>(
        &'a self,
        request: &'a capstan_host::llm::CompletionRequest,
        sink: &'a dyn capstan_host::llm::AnswerSink,
    ) -> capstan_host::llm::BoxFuture<
        'a,
        Result<capstan_host::llm::Completion, capstan_host::llm::ProviderError>,
    > {
        Box::pin(async move {
            if request.process == "worker" {
                let results = request
                    .messages
                    .iter()
                    .filter(|m| m.role == capstan_host::llm::Role::Tool)
                    .count();
                let db = rusqlite::Connection::open(&self.db).unwrap();
                let audited: i64 = db
                    .query_row(
                        "SELECT count(*) FROM audit WHERE tool = 'file_read'",
                        [],
                        |r| r.get(0),
                    )
                    .unwrap();
                self.seen.lock().unwrap().push((results, audited));
            }
            self.script.complete(request, sink).await
        })
    }

    fn name(&self) -> String {
        self.script.name()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rounds_tool_results_reach_the_model_only_after_their_audit_rows_are_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults(dir.path());
    config.provider = ProviderSettings::Scripted { script: None };
    std::fs::create_dir_all(&config.agent.workspace).unwrap();
    for (name, text) in [("a.txt", "a one"), ("b.txt", "a two"), ("c.txt", "a three")] {
        std::fs::write(config.agent.workspace.join(name), text).unwrap();
    }
    let provider = Arc::new(AuditWatcher {
        script: ScriptedProvider::new(Script::parse(THREE_READS, "test").unwrap(), "test"),
        db: config.agent.data_dir.join("capstan.db"),
        seen: Default::default(),
    });
    let (rt, _events) = agent_runtime(config, provider.clone(), false).await;
    rt.spawn_worker("main", "read three", false, None)
        .await
        .unwrap();
    crate::support::eventually("the worker reports", || {
        provider.seen.lock().unwrap().len() == 2
    })
    .await;
    let seen = provider.seen.lock().unwrap().clone();
    assert_eq!(seen[0], (0, 0), "nothing read or audited before the round");
    assert_eq!(
        seen[1],
        (3, 3),
        "the three results reach the model with their three rows committed"
    );
}

/// A ledger that refuses to record any worker, as a store whose session moved to another
/// host does; everything else goes to the services it wraps.
struct RefusingWorkers(Services);

#[async_trait::async_trait]
impl capstan_host::services::Ledger for RefusingWorkers {
    async fn begin_run(&self) -> Result<capstan_host::services::Run, ServiceError> {
        self.0.ledger.begin_run().await
    }

    async fn next_process_number(&self, kind: ProcessKind) -> Result<u64, ServiceError> {
        self.0.ledger.next_process_number(kind).await
    }

    async fn worker_started(
        &self,
        _run: capstan_host::services::RunId,
        id: &ProcessId,
        _channel: &ProcessId,
        _task: &str,
    ) -> Result<(), ServiceError> {
        Err(ServiceError::Invalid(format!("{id} refused by the test")))
    }

    async fn set_worker_state(
        &self,
        id: &ProcessId,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError> {
        self.0.ledger.set_worker_state(id, state, outcome).await
    }

    async fn worker(
        &self,
        id: &ProcessId,
    ) -> Result<Option<capstan_host::services::WorkerRecord>, ServiceError> {
        self.0.ledger.worker(id).await
    }

    async fn workers(
        &self,
        limit: u32,
    ) -> Result<Vec<capstan_host::services::WorkerRecord>, ServiceError> {
        self.0.ledger.workers(limit).await
    }

    async fn mark_interrupted_workers(
        &self,
    ) -> Result<Vec<capstan_host::services::WorkerRecord>, ServiceError> {
        self.0.ledger.mark_interrupted_workers().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_the_store_refuses_to_record_does_no_work_and_its_channel_hears_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults(dir.path());
    config.provider = ProviderSettings::Scripted { script: None };
    let mut services = Services::in_memory();
    services.ledger = Arc::new(RefusingWorkers(services.clone()));
    let (provider, mut requests) = crate::support::Gated::new();
    let agent = AgentBuilder::new(config)
        .plugins_dir(plugins_dir())
        .cache(test_cache())
        .provider(provider)
        .services(services)
        .build()
        .await
        .unwrap();
    let (rt, mut events) = (agent.runtime, agent.events);
    rt.spawn_worker("main", "sort the files", false, None)
        .await
        .unwrap();
    // The channel is told; the worker's model is never asked.
    let told = requests.recv().await.unwrap();
    assert_eq!(told.request.process, "channel");
    let report = told
        .request
        .messages
        .iter()
        .find(|m| m.content.contains("not started"))
        .map(|m| m.content.clone())
        .unwrap_or_else(|| panic!("{:?}", told.request.messages));
    assert!(report.contains("refused by the test"), "{report}");
    told.call("skip", serde_json::json!({}));
    rt.wait_idle("main").await;
    let mut ended = None;
    while let Ok(event) = events.try_recv() {
        if let Event::WorkerEnded { state, .. } = event {
            ended = Some(state);
        }
    }
    assert_eq!(ended, Some(WorkerState::Failed));
    assert!(requests.try_recv().is_err(), "no worker request");
    assert_eq!(rt.reserved_tasks(), 0, "its task is free again");
}
