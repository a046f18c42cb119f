//! Trusted dispatch through the whole runtime, raced with real tasks: routed messages are
//! delivered or reported, never lost; the worker limit is an admission; nothing reserved
//! outlives a worker's end, whatever the end; late results are folded back.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{Gated, PANIC_TRIGGER, Pending, Recording, agent_runtime, eventually, stored};
use capstan_host::agent::{Event, Runtime, SpawnOutcome};
use capstan_host::config::Config;
use capstan_host::ids::ProcessId;
use capstan_host::llm::Role;
use capstan_host::store::WorkerState;
use tokio::sync::mpsc;

/// The last step of every script here: the channel skips whatever the script does not
/// answer otherwise (results, mostly).
const CHANNEL_SKIPS: &str = r#"
[[step]]
process = "channel"
repeat = true
tool_calls = [{ name = "skip" }]
"#;

/// A runtime in `dir` on the default config plus `toml`, playing `script` (then
/// [`CHANNEL_SKIPS`]) and recording.
async fn runtime(
    dir: &std::path::Path,
    toml: &str,
    script: &str,
    probe: bool,
) -> (Arc<Runtime>, mpsc::UnboundedReceiver<Event>, Arc<Recording>) {
    let config_text = format!("[provider]\nkind = \"scripted\"\n{toml}");
    let config = Config::parse(&config_text, &dir.join("capstan.toml")).unwrap();
    let provider = Recording::new(&format!("{script}{CHANNEL_SKIPS}"));
    let (rt, events) = agent_runtime(config, provider.clone(), probe).await;
    (rt, events, provider)
}

fn spawned(outcome: SpawnOutcome) -> ProcessId {
    match outcome {
        SpawnOutcome::Spawned { worker } => worker,
        other => panic!("not spawned: {other:?}"),
    }
}

/// The stored history of channel `main`, as text.
fn channel_history(rt: &Runtime) -> Vec<String> {
    stored(rt)
        .load_history("channel:main")
        .unwrap()
        .into_iter()
        .map(|entry| {
            let message: capstan_host::llm::Message = serde_json::from_str(&entry.message).unwrap();
            message.content
        })
        .collect()
}

const WAIT_THEN_CONTINUE: &str = r#"
[[step]]
process = "worker"
when = "wait at the gate"
tool_calls = [{ name = "raw_put", arguments = { path = "gate", content = "x" } }]

[[step]]
process = "worker"
when = "continue with the messages"
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "done, with the routed note" } }]

"#;

/// The worker profile plus the probe's `raw_put`, which blocks opening the FIFO `gate` for
/// writing until the test opens it: a tool call that lasts exactly as long as the test
/// wants. (With fs.write, a call's file operations run on blocking threads and may open a
/// FIFO; a call that may only read is refused one.)
const GATE_PROFILE: &str = r#"
[limits]
tool_deadline_secs = 600

[profiles.worker]
tools = ["raw_put", "set_status"]
capabilities = ["fs.write"]
"#;

/// Makes the FIFO `name` in `dir`.
fn make_fifo(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let status = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("running mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_routed_during_a_long_tool_call_reaches_the_next_request() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events, provider) = runtime(dir.path(), GATE_PROFILE, WAIT_THEN_CONTINUE, true).await;
    let gate = make_fifo(&rt.config().agent.workspace, "gate");
    let worker = spawned(
        rt.spawn_worker("main", "Wait at the gate.", false, None)
            .await
            .unwrap(),
    );
    eventually("the worker's first request is answered", || {
        provider.requests_of("worker").len() == 1
    })
    .await;
    // The tool cannot end before the test opens the FIFO for reading: opening it for
    // writing waits for a reader. Route now, while the turn is in its tool round.
    assert!(rt.route_to_worker(&worker, "Also count the totals."));
    assert_eq!(
        provider.requests_of("worker").len(),
        1,
        "routed before the tool ended"
    );
    // Opening it lets the tool's open go on (its write then succeeds or finds the reader
    // gone); the tool's result comes either way.
    tokio::task::spawn_blocking(move || drop(std::fs::File::open(gate).unwrap()))
        .await
        .unwrap();
    rt.wait_idle("main").await;

    let requests = provider.requests_of("worker");
    assert_eq!(requests.len(), 2, "{requests:#?}");
    let next: Vec<(Role, &str)> = requests[1]
        .messages
        .iter()
        .map(|m| (m.role, m.content.as_str()))
        .collect();
    let n = next.len();
    assert_eq!(next[n - 2], (Role::User, "Also count the totals."));
    assert_eq!(
        next[n - 1],
        (Role::User, "Continue with the messages above in mind.")
    );
    assert_eq!(next[n - 3].0, Role::Tool, "the tool's result came first");
    let record = stored(&rt).get_worker(&worker).unwrap().unwrap();
    assert_eq!(
        (record.state, record.outcome.as_deref()),
        (WorkerState::Done, Some("done, with the routed note"))
    );
    assert!(
        channel_history(&rt)
            .iter()
            .all(|m| !m.contains("not delivered")),
        "delivered, so not reported"
    );
}

const CHORES: &str = r#"
[[step]]
process = "worker"
when = "do the chores"
delay_ms = 2
tool_calls = [{ name = "set_status", arguments = { state = "progress", message = "1" } }]

[[step]]
process = "worker"
when = "noted"
delay_ms = 2
tool_calls = [{ name = "set_status", arguments = { state = "progress", message = "2" } }]

[[step]]
process = "worker"
when = "noted"
delay_ms = 2
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "chores done" } }]

[[step]]
process = "worker"
when = "continue with the messages"
delay_ms = 1
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "chores done" } }]
[[step]]
process = "worker"
when = "continue with the messages"
delay_ms = 1
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "chores done" } }]
[[step]]
process = "worker"
when = "continue with the messages"
delay_ms = 1
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "chores done" } }]

"#;

/// The worker takes three rounds of routed follow-ups, then its model fails (the script
/// has no fourth answer) while routes keep coming: some messages are answered, some are
/// taken into a request that fails, some wait in its inbox, the rest come too late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_routes_racing_completion_are_each_delivered_or_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events, provider) = runtime(dir.path(), "", CHORES, false).await;
    let worker = spawned(
        rt.spawn_worker("main", "Do the chores.", false, None)
            .await
            .unwrap(),
    );
    eventually("the worker starts", || rt.live_workers() == 1).await;
    let routers: Vec<_> = (0..4)
        .map(|r| {
            let (rt, worker) = (rt.clone(), worker.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for i in 0..250 {
                    let message = format!("route-{r}-{i:03}");
                    outcomes.push((message.clone(), rt.route_to_worker(&worker, &message)));
                    if i % 8 == 0 {
                        tokio::time::sleep(Duration::from_micros(500)).await;
                    }
                }
                outcomes
            })
        })
        .collect();
    let mut accepted = BTreeSet::new();
    let mut refused = BTreeSet::new();
    for router in routers {
        for (message, routed) in router.await.unwrap() {
            if routed {
                accepted.insert(message);
            } else {
                refused.insert(message);
            }
        }
    }
    rt.wait_idle("main").await;
    eventually("the worker ends", || rt.live_workers() == 0).await;
    rt.wait_idle("main").await;

    let delivered: BTreeSet<String> = provider
        .requests_of("worker")
        .iter()
        .flat_map(|r| r.messages.iter())
        .filter(|m| m.role == Role::User && m.content.starts_with("route-"))
        .map(|m| m.content.clone())
        .collect();
    let reported: BTreeSet<String> = channel_history(&rt)
        .iter()
        .filter_map(|m| m.split_once("were not delivered: "))
        .flat_map(|(_, list)| list.split(" | ").map(str::to_owned).collect::<Vec<_>>())
        .collect();
    assert_eq!(accepted.len() + refused.len(), 1000);
    assert!(
        delivered.is_disjoint(&reported),
        "each message is delivered or reported, not both"
    );
    let accounted: BTreeSet<String> = delivered.union(&reported).cloned().collect();
    assert_eq!(
        accounted, accepted,
        "every accepted message is delivered or reported"
    );
    assert!(
        refused.is_disjoint(&accounted),
        "a refused message went nowhere"
    );
    // Which outcome each message got depends on the interleaving; only the accounting
    // above must hold. Each outcome is forced on its own in
    // `each_route_outcome_is_forced_by_gates`.
}

const JOBS: &str = r#"
[[step]]
process = "worker"
when = "job"
delay_ms = 20
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "job done" } }]

"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_spawns_never_exceed_the_worker_limit_and_all_finish() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events, _provider) = runtime(
        dir.path(),
        "[limits]\nmax_workers_per_channel = 5\n",
        JOBS,
        false,
    )
    .await;
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (rt, sampling) = (rt.clone(), sampling.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while sampling.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(rt.live_workers());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            most
        })
    };
    let mut workers: Vec<ProcessId> = Vec::new();
    for i in 0..100 {
        let task = format!("job {i}");
        let outcome = rt.spawn_worker("main", &task, false, None).await;
        workers.push(spawned(outcome.unwrap()));
    }
    rt.wait_idle("main").await;
    sampling.store(false, std::sync::atomic::Ordering::SeqCst);
    let most = sampler.await.unwrap();
    assert!(most <= 5, "{most} workers alive at once, limit 5");
    for worker in &workers {
        let record = stored(&rt).get_worker(worker).unwrap().unwrap();
        assert_eq!(record.state, WorkerState::Done, "{worker}");
    }
    assert_eq!(rt.live_workers(), 0);
    assert_eq!(rt.reserved_tasks(), 0);
}

const ENDINGS: &str = r#"
[[step]]
process = "worker"
when = "finish fine"
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "fine" } }]

[[step]]
process = "worker"
when = "report a failure"
tool_calls = [{ name = "set_status", arguments = { state = "failed", message = "could not" } }]

[[step]]
process = "worker"
when = "wait for an answer"
tool_calls = [{ name = "set_status", arguments = { state = "waiting", message = "which one?" } }]

[[step]]
process = "worker"
when = "take too long"
delay_ms = 10000
reply = "far too late"

"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_reservation_outlives_any_terminal_path() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events, _provider) = runtime(
        dir.path(),
        "[limits]\nworker_timeout_secs = 1\n",
        ENDINGS,
        false,
    )
    .await;
    let store = stored(&rt);
    let cases = [
        ("Finish fine.", WorkerState::Done, "fine"),
        ("Report a failure.", WorkerState::Failed, "could not"),
        (
            "Nothing in the script matches this.",
            WorkerState::Failed,
            "the model failed",
        ),
        ("Wait for an answer.", WorkerState::Cancelled, "cancelled"),
        ("Take too long.", WorkerState::Failed, "timed out after 1 s"),
        (
            PANIC_TRIGGER,
            WorkerState::Failed,
            "panicked: the provider panicked on purpose",
        ),
    ];
    for (task, state, outcome) in cases {
        let worker = spawned(rt.spawn_worker("main", task, true, None).await.unwrap());
        if state == WorkerState::Cancelled {
            eventually("the worker waits", || {
                store
                    .get_worker(&worker)
                    .unwrap()
                    .is_some_and(|r| r.state == WorkerState::WaitingForInput)
            })
            .await;
            assert!(rt.cancel_worker(&worker));
        }
        eventually(&format!("{task}: the worker ends"), || {
            rt.live_workers() == 0
                && store
                    .get_worker(&worker)
                    .unwrap()
                    .is_some_and(|r| r.state == state)
        })
        .await;
        rt.wait_idle("main").await;
        let record = store.get_worker(&worker).unwrap().unwrap();
        assert!(
            record.outcome.as_deref().unwrap_or("").contains(outcome),
            "{task}: {record:?}"
        );
        assert_eq!(rt.reserved_tasks(), 0, "{task}: the task description");
        assert_eq!(rt.gate_reservations(), 0, "{task}: the prompt gate");
    }
}

/// A branch that hands a slow job to a worker and concludes at once: the worker's result
/// arrives after its requester ended.
const LATE: &str = r#"
[[step]]
process = "channel"
when = "plan it"
tool_calls = [{ name = "branch", arguments = { question = "plan the work" } }, { name = "skip" }]

[[step]]
process = "branch"
when = "plan the work"
tool_calls = [
  { name = "spawn_worker", arguments = { task = "Slow job one." } },
  { name = "spawn_worker", arguments = { task = "Slow job two." } },
]

[[step]]
process = "branch"
when = "spawned"
reply = "Two workers are on it."

[[step]]
process = "worker"
when = "slow job one"
delay_ms = 300
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "job one finished" } }]

[[step]]
process = "worker"
when = "slow job two"
delay_ms = 320
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "job two finished" } }]

[[step]]
process = "worker"
when = "slow job three"
delay_ms = 500
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "job three finished" } }]

[[step]]
process = "channel"
when = "[notification"
delay_ms = 100
repeat = true
tool_calls = [{ name = "reply", arguments = { text = "Late news arrived." } }]

"#;

/// The last message of each channel request that opened a notification turn.
fn notification_turns(provider: &Recording) -> Vec<String> {
    provider
        .requests_of("channel")
        .iter()
        .filter_map(|r| r.messages.last())
        .filter(|m| m.content.starts_with("[notification"))
        .map(|m| m.content.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_results_are_folded_back_into_one_notification_turn_each() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, mut events, provider) = runtime(dir.path(), "", LATE, false).await;
    rt.send_user_message("main", "Plan it, please.")
        .await
        .unwrap();
    rt.wait_idle("main").await;

    let turns = notification_turns(&provider);
    assert_eq!(turns.len(), 2, "{turns:#?}");
    assert!(
        turns[0].starts_with("[notification: result from worker:1, which branch:1 asked for"),
        "{}",
        turns[0]
    );
    assert!(turns[1].contains("from worker:2"), "{}", turns[1]);
    // Each turn is its own: the second arrived while the first was being answered, and
    // its turn holds only itself after the first turn's reply.
    let second = provider
        .requests_of("channel")
        .into_iter()
        .find(|r| {
            r.messages
                .last()
                .is_some_and(|m| m.content.contains("from worker:2"))
        })
        .unwrap();
    let n = second.messages.len();
    assert_eq!(second.messages[n - 2].content, "Late news arrived.");

    let store = stored(&rt);
    assert_eq!(
        store
            .working_get("notifications/result/worker:1")
            .unwrap()
            .map(|entry| entry.value)
            .as_deref(),
        Some("finished (done): job one finished")
    );
    let index = store
        .working_get("notifications/index")
        .unwrap()
        .unwrap()
        .value;
    assert_eq!(index.lines().count(), 2, "{index}");
    assert!(
        index.contains("result worker:1 (for branch:1): finished (done): job one finished"),
        "{index}"
    );
    let mut replies = 0;
    while let Ok(event) = events.try_recv() {
        assert!(!matches!(event, Event::TurnSuppressed { .. }), "{event:?}");
        replies +=
            usize::from(matches!(event, Event::Reply { text, .. } if text == "Late news arrived."));
    }
    assert_eq!(replies, 2);
}

const LIVE_REQUESTER: &str = r#"
[[step]]
process = "channel"
when = "plan it"
tool_calls = [{ name = "branch", arguments = { question = "plan the work" } }, { name = "skip" }]

[[step]]
process = "branch"
when = "plan the work"
tool_calls = [{ name = "spawn_worker", arguments = { task = "Quick job." } }]

[[step]]
process = "branch"
when = "spawned"
delay_ms = 400
reply = "A worker did it."

[[step]]
process = "worker"
when = "quick job"
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "quick job finished" } }]

"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_for_a_requester_still_running_is_no_notification() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events, provider) = runtime(dir.path(), "", LIVE_REQUESTER, false).await;
    rt.send_user_message("main", "Plan it, please.")
        .await
        .unwrap();
    rt.wait_idle("main").await;
    assert!(notification_turns(&provider).is_empty());
    assert!(
        stored(&rt)
            .working_keys("notifications/")
            .unwrap()
            .is_empty(),
        "nothing folded back"
    );
    assert!(
        channel_history(&rt)
            .iter()
            .any(|m| m == "[worker:1] finished (done): quick job finished"),
        "{:#?}",
        channel_history(&rt)
    );
}

/// Collects what `tracing` writes.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_late_result_for_a_channel_that_is_gone_is_kept_with_a_warning() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    // This test's runtime runs on this thread, so the default subscriber sees it all.
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().unwrap();
    let (rt, _events, provider) = runtime(dir.path(), "", LATE, false).await;
    let store = stored(&rt);
    rt.send_user_message("main", "Plan it, please.")
        .await
        .unwrap();
    eventually("the branch concludes", || {
        channel_history(&rt)
            .iter()
            .any(|m| m.starts_with("[branch:1] concluded"))
    })
    .await;
    // One more, asked for by the channel itself, which closes before it reports.
    spawned(
        rt.spawn_worker("main", "Slow job three.", false, None)
            .await
            .unwrap(),
    );
    eventually("three workers run", || rt.live_workers() == 3).await;
    rt.shutdown();
    eventually("the workers end", || rt.live_workers() == 0).await;
    // A report is its entry, then its line in the index: both are waited for.
    eventually("the reports are kept and indexed", || {
        let indexed = store
            .working_get("notifications/index")
            .unwrap()
            .map_or(0, |index| index.value.lines().count());
        store.working_keys("notifications/status/").unwrap().len() == 3 && indexed == 3
    })
    .await;
    assert!(
        store
            .working_get("notifications/index")
            .unwrap()
            .unwrap()
            .value
            .contains("status worker:3 (for channel:main)"),
        "the channel's own worker, reported as the channel closed"
    );
    assert_eq!(
        store
            .working_get("notifications/status/worker:1")
            .unwrap()
            .map(|entry| entry.value)
            .as_deref(),
        Some("finished (cancelled): cancelled on request")
    );
    assert!(
        notification_turns(&provider).is_empty(),
        "no channel, no turn"
    );
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("WARN") && log.contains("channel that is gone") && log.contains("worker:1"),
        "{log}"
    );
}

const BRANCH_PANICS: &str = r#"
[[step]]
process = "channel"
when = "think hard"
tool_calls = [{ name = "branch", arguments = { question = "PANIC NOW" } }]

"#;

/// A branch is supervised like a worker: its panic is reported to its channel, and the
/// channel's pending count is released, so `wait_idle` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_that_panics_is_reported_and_never_leaves_wait_idle_hanging() {
    assert!(BRANCH_PANICS.contains(PANIC_TRIGGER));
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events, _provider) = runtime(dir.path(), "", BRANCH_PANICS, false).await;
    rt.send_user_message("main", "Think hard.").await.unwrap();
    tokio::time::timeout(Duration::from_secs(120), rt.wait_idle("main"))
        .await
        .expect("wait_idle returns after the branch panicked");
    let history = channel_history(&rt);
    assert!(
        history.iter().any(|m| m.starts_with("[branch:")
            && m.contains("failed: panicked: the provider panicked on purpose")),
        "the channel heard of the panic: {history:#?}"
    );
}

/// The next request of a worker; channel requests met on the way are answered with `skip`.
async fn next_worker_request(held: &mut mpsc::UnboundedReceiver<Pending>) -> Pending {
    loop {
        let pending = tokio::time::timeout(Duration::from_secs(120), held.recv())
            .await
            .expect("a request within the hang guard")
            .expect("the provider is alive");
        if pending.request.process == "worker" {
            return pending;
        }
        pending.call("skip", serde_json::json!({}));
    }
}

/// Every outcome of a route, each forced by holding the worker's requests at the
/// provider: a message routed while a request is held is injected at the next boundary
/// and delivered once answered; one injected into a request that then fails is reported
/// as not delivered; one routed after the worker ended is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_route_outcome_is_forced_by_gates() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse("", &dir.path().join("capstan.toml")).unwrap();
    let (provider, mut held) = Gated::new();
    let (rt, _events) = agent_runtime(config, provider, false).await;
    let worker = spawned(
        rt.spawn_worker("main", "Do the chores.", false, None)
            .await
            .unwrap(),
    );
    let progress = serde_json::json!({ "state": "progress", "message": "working" });

    let first = next_worker_request(&mut held).await;
    assert!(
        rt.route_to_worker(&worker, "m-delivered"),
        "the worker runs"
    );
    first.call("set_status", progress.clone());

    let second = next_worker_request(&mut held).await;
    assert!(second.holds("m-delivered"), "injected at the boundary");
    assert!(rt.route_to_worker(&worker, "m-reported"));
    second.call("set_status", progress);

    let third = next_worker_request(&mut held).await;
    assert!(third.holds("m-reported"));
    third.fail("the model is gone");

    // The channel hears the report; answer its turns until the worker is gone.
    let serve = tokio::spawn(async move {
        while let Some(pending) = held.recv().await {
            pending.call("skip", serde_json::json!({}));
        }
    });
    eventually("the worker ends", || rt.live_workers() == 0).await;
    assert!(
        !rt.route_to_worker(&worker, "m-refused"),
        "a route after the end is refused"
    );
    rt.wait_idle("main").await;
    let history = channel_history(&rt);
    let reports: Vec<&String> = history
        .iter()
        .filter(|m| m.contains("were not delivered"))
        .collect();
    assert_eq!(reports.len(), 1, "{history:#?}");
    assert!(
        reports[0].ends_with("were not delivered: m-reported"),
        "{}",
        reports[0]
    );
    assert!(
        history
            .iter()
            .all(|m| !m.contains("m-delivered") && !m.contains("m-refused"))
    );
    let record = stored(&rt).get_worker(&worker).unwrap().unwrap();
    assert_eq!(record.state, WorkerState::Failed);
    rt.shutdown();
    drop(rt);
    serve.abort();
}
