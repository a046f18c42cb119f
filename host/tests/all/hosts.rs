//! Several hosts on one PostgreSQL database, in one test process: each runtime here is a
//! host, with its own connections, run lease and model. The tests hold each model request
//! at a gate ([`Gated`]), so every interleaving they check is forced, not timed.

use std::sync::Arc;
use std::time::Duration;

use capstan_host::agent::{Event, Runtime, Sent, SpawnOutcome};
use capstan_host::config::{Config, DatabaseUrl, ProviderSettings, StoreSettings};
use capstan_host::ids::ProcessId;
use capstan_host::postgres::Postgres;
use capstan_host::postgres::test_cluster::{TestCluster, admin};
use capstan_host::services::{Claim, Forwarded, Ledger, Sessions};
use serde_json::json;
use tokio::sync::mpsc;

use crate::support::{Gated, Pending, agent_runtime};

/// One host: its runtime, events and the requests its model is asked.
struct Host {
    runtime: Arc<Runtime>,
    events: mpsc::UnboundedReceiver<Event>,
    requests: mpsc::UnboundedReceiver<Pending>,
    _dir: tempfile::TempDir,
}

impl Host {
    async fn start(url: &str) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::defaults(dir.path());
        config.provider = ProviderSettings::Scripted { script: None };
        config.store = StoreSettings::Postgres {
            url: DatabaseUrl::Literal(url.to_owned()),
            lease: Duration::from_secs(15),
        };
        config.limits.dispatch.settle = Duration::ZERO;
        let (provider, requests) = Gated::new();
        let (runtime, events) = agent_runtime(config, provider, false).await;
        Host {
            runtime,
            events,
            requests,
            _dir: dir,
        }
    }

    /// The next request its model is asked.
    async fn request(&mut self) -> Pending {
        bounded("a model request", self.requests.recv())
            .await
            .expect("the host is running")
    }

    /// Sends `text` to conversation `main` and answers it with `answer`, until idle.
    async fn answer_first(&mut self, text: &str, answer: &str) {
        self.runtime.send_user_message("main", text).await.unwrap();
        reply(self.request().await, answer);
        self.event(replied(answer)).await;
        self.runtime.wait_idle("main").await;
    }

    /// The first event `want` picks out, skipping the others.
    async fn event<T>(&mut self, mut want: impl FnMut(&Event) -> Option<T>) -> T {
        bounded("an event", async {
            loop {
                let event = self.events.recv().await.expect("the host is running");
                if let Some(found) = want(&event) {
                    return found;
                }
            }
        })
        .await
    }
}

/// `work`, failing the test (naming `what`) if it hangs: a guard, never a timing.
async fn bounded<T>(what: &str, work: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), work)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn reply(pending: Pending, text: &str) {
    pending.call("reply", json!({ "text": text }));
}

fn replied(text: &str) -> impl FnMut(&Event) -> Option<()> + '_ {
    move |event| matches!(event, Event::Reply { text: t, .. } if t == text).then_some(())
}

/// The messages of `channel`'s stored history, in order.
async fn history(url: &str, channel: &str) -> Vec<String> {
    admin(url)
        .await
        .query(
            "SELECT message FROM history WHERE channel = $1 ORDER BY seq",
            &[&channel],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn epoch(url: &str, channel: &str) -> i64 {
    admin(url)
        .await
        .query_one("SELECT epoch FROM sessions WHERE channel = $1", &[&channel])
        .await
        .unwrap()
        .get(0)
}

/// Ends `run`'s lease now, as if its host had been paused past it.
async fn expire_runs_but(url: &str, kept: &[i64]) {
    admin(url)
        .await
        .execute(
            "UPDATE runs SET expires_at = now() - interval '1 second' WHERE id <> ALL($1)",
            &[&kept],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_a_conversation_another_host_answers_is_forwarded_and_answered_there() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let (mut a, mut b) = (Host::start(&url).await, Host::start(&url).await);
    a.answer_first("hi", "A answers hi").await;

    // B receives the next message: A owns the conversation, so B forwards it.
    b.runtime.send_user_message("main", "again").await.unwrap();
    let owner = b
        .event(|event| match event {
            Event::Forwarded { channel, owner } if *channel == ProcessId::channel("main") => {
                Some(*owner)
            }
            _ => None,
        })
        .await;
    // A answers it, from the history it holds.
    let pending = a.request().await;
    assert!(pending.holds("hi") && pending.holds("again"));
    reply(pending, "A answers again");
    a.event(replied("A answers again")).await;
    a.runtime.wait_idle("main").await;
    assert!(
        b.requests.try_recv().is_err(),
        "B's model was never asked about A's conversation"
    );
    let owners: Vec<i64> = admin(&url)
        .await
        .query("SELECT owner_run FROM sessions", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(owners, [owner.get() as i64]);
    let stored = history(&url, "channel:main").await.join("\n");
    let order: Vec<usize> = ["hi", "A answers hi", "again", "A answers again"]
        .iter()
        .map(|said| {
            stored
                .find(said)
                .unwrap_or_else(|| panic!("{said}: {stored}"))
        })
        .collect();
    assert!(order.is_sorted(), "one conversation, in order: {stored}");
    assert_eq!(epoch(&url, "channel:main").await, 1, "never taken over");

    // B waits for the answer to what it forwards, as `capstan serve`'s exchanges do.
    let Sent::Forwarded { number, .. } = b
        .runtime
        .send_or_forward(&ProcessId::channel("main"), "and then?")
        .await
        .unwrap()
    else {
        panic!("B answered it itself")
    };
    let waiting = tokio::spawn({
        let b = b.runtime.clone();
        async move { b.forwarded_answer(number, Duration::from_secs(120)).await }
    });
    reply(a.request().await, "A answers and then");
    let answer = waiting.await.unwrap().unwrap();
    assert_eq!(answer.reply, "A answers and then");
    assert_eq!(answer.error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_that_lost_its_lease_prompts_and_stores_nothing_more_and_another_takes_over() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let (mut a, mut b) = (Host::start(&url).await, Host::start(&url).await);
    a.answer_first("first", "stored by A").await;

    // A's model is slow to answer the next message; meanwhile A's lease runs out (as if
    // A were paused) and A's renewer finds it lost.
    a.runtime.send_user_message("main", "second").await.unwrap();
    let held = a.request().await;
    let b_run: i64 = admin(&url)
        .await
        .query_one("SELECT max(id) FROM runs", &[])
        .await
        .unwrap()
        .get(0);
    expire_runs_but(&url, &[b_run]).await;
    bounded("A to find its lease lost", a.runtime.lease_lost()).await;

    // B takes the conversation over with the next message, from what was stored.
    b.runtime.send_user_message("main", "third").await.unwrap();
    let pending = b.request().await;
    assert!(pending.holds("first") && pending.holds("third"));
    assert!(!pending.holds("second"), "A never stored it");
    reply(pending, "B answers");
    b.event(replied("B answers")).await;
    b.runtime.wait_idle("main").await;
    assert_eq!(epoch(&url, "channel:main").await, 2);

    // A's model answers at last, with a reply: it is not delivered, and not stored.
    reply(held, "too late");
    let suppressed = a
        .event(|event| match event {
            Event::TurnSuppressed { reason, .. } => Some(reason.clone()),
            Event::Reply { text, .. } => panic!("delivered: {text}"),
            _ => None,
        })
        .await;
    assert!(suppressed.contains("lease is not live"), "{suppressed}");
    let refused = a
        .event(|event| match event {
            Event::HistoryNotSaved { error, .. } => Some(error.clone()),
            _ => None,
        })
        .await;
    assert!(refused.contains("dropped"), "{refused}");
    while let Ok(event) = a.events.try_recv() {
        assert!(!matches!(event, Event::Reply { .. }), "{event:?}");
    }
    assert!(a.requests.try_recv().is_err(), "no request after the loss");
    let stored = history(&url, "channel:main").await.join("\n");
    assert!(
        !stored.contains("second") && !stored.contains("worker:99"),
        "{stored}"
    );
    assert!(stored.contains("B answers"), "{stored}");
    // And A refuses new work.
    assert!(a.runtime.send_user_message("main", "fourth").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_forwarded_to_a_host_that_went_away_are_answered_by_the_next() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    // A host that adopts nothing (a session at the terminal) is up throughout.
    let mut terminal = Host::start(&url).await;
    terminal.runtime.adopt_conversations(false);
    // A host that claimed the conversation, had messages forwarded to it, and died.
    let gone = Postgres::connect(&url).await.unwrap();
    let run = gone.begin_run().await.unwrap();
    let claim = gone
        .claim(&crate::support::ids::key("channel:main"), run.id())
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Owned(_)));
    for text in ["one", "two"] {
        let message = Forwarded::User {
            text: text.into(),
            key: None,
            traceparent: None,
            label: capstan_host::flow::Label::trusted(),
        };
        gone.forward(&crate::support::ids::key("channel:main"), &message)
            .await
            .unwrap();
    }
    let terminal_run: i64 = admin(&url)
        .await
        .query_one("SELECT min(id) FROM runs", &[])
        .await
        .unwrap()
        .get(0);
    expire_runs_but(&url, &[terminal_run]).await;
    drop(run);

    // The next host that adopts takes the conversation over, and answers what waited.
    let mut b = Host::start(&url).await;
    // Both in order, in one turn or in two.
    let mut pending = b.request().await;
    assert!(pending.holds("one"), "{:?}", pending.request.messages);
    if !pending.holds("two") {
        reply(pending, "answered one");
        pending = b.request().await;
        assert!(pending.holds("two"));
    }
    reply(pending, "answered");
    b.event(replied("answered")).await;
    // Each message's row goes with its answer, left once its turn is stored.
    b.runtime.wait_idle("main").await;
    let left: i64 = admin(&url)
        .await
        .query_one("SELECT count(*) FROM inbox", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    assert_eq!(epoch(&url, "channel:main").await, 2);
    assert!(
        terminal.requests.try_recv().is_err(),
        "the host that adopts nothing never took it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_identical_spawns_split_across_two_hosts_start_one_worker() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let (mut a, mut b) = (Host::start(&url).await, Host::start(&url).await);
    // Each host its own conversation; the task is the same, worded a little apart.
    let spawns: Vec<_> = (0..50)
        .map(|n| {
            let (runtime, channel) = if n % 2 == 0 {
                (a.runtime.clone(), "left")
            } else {
                (b.runtime.clone(), "right")
            };
            let task = if n % 3 == 0 {
                "Sort the  files."
            } else {
                "sort the files"
            };
            tokio::spawn(async move {
                let outcome = runtime.spawn_worker(channel, task, false, None).await;
                (n % 2, outcome)
            })
        })
        .collect();
    let mut spawned = Vec::new();
    let mut named = std::collections::HashSet::new();
    for spawn in spawns {
        match spawn.await.unwrap() {
            (host, Ok(SpawnOutcome::Spawned { worker })) => spawned.push((host, worker)),
            (_, Ok(SpawnOutcome::Duplicate { existing })) => {
                named.insert(existing);
            }
            (_, Err(err)) => panic!("{err}"),
        }
    }
    assert_eq!(spawned.len(), 1, "{spawned:?}");
    let (host, worker) = spawned.pop().unwrap();
    assert!(named.iter().all(|w| *w == worker), "{named:?}");
    // Its host's model is asked for it; the other host's never is.
    let (owner, other) = if host == 0 {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let pending = owner.request().await;
    assert_eq!(pending.request.process, "worker");
    assert_eq!(
        owner.runtime.live_workers() + other.runtime.live_workers(),
        1
    );
    assert!(other.requests.try_recv().is_err());
    let recorded: i64 = admin(&url)
        .await
        .query_one("SELECT count(*) FROM workers", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, 1, "{worker} only");
    drop(pending);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_of_a_host_that_died_is_reported_to_its_conversation_as_failed_and_never_rerun() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let mut a = Host::start(&url).await;
    let spawned = a
        .runtime
        .spawn_worker("main", "sort the files", false, None)
        .await
        .unwrap();
    let SpawnOutcome::Spawned { worker } = spawned else {
        panic!("{spawned:?}")
    };
    // The worker is mid-request when its host dies (its lease runs out unrenewed).
    let held = a.request().await;
    assert_eq!(held.request.process, "worker");
    let mut b = Host::start(&url).await;
    let b_run: i64 = admin(&url)
        .await
        .query_one("SELECT max(id) FROM runs", &[])
        .await
        .unwrap()
        .get(0);
    expire_runs_but(&url, &[b_run]).await;

    // B marks the worker lost, takes the conversation over, and tells it.
    let pending = b.request().await;
    assert_eq!(pending.request.process, "channel");
    let report = pending
        .request
        .messages
        .iter()
        .find(|m| m.content.contains(&format!("[{worker}]")))
        .map(|m| m.content.clone())
        .unwrap_or_else(|| panic!("{:?}", pending.request.messages));
    assert!(
        report.contains("failed") && report.contains("not run again"),
        "{report}"
    );
    reply(pending, "noted");
    b.event(replied("noted")).await;
    b.runtime.wait_idle("main").await;
    let (state, outcome): (String, String) = {
        let row = admin(&url)
            .await
            .query_one("SELECT state, outcome FROM workers", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(state, "interrupted", "{outcome}");
    assert!(b.requests.try_recv().is_err(), "B never ran the worker");
    assert_eq!(b.runtime.live_workers(), 0);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_message_forwarded_twice_is_taken_once_by_the_owner_and_answered_twice() {
    use capstan_host::agent::UserMessage;
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let (mut a, b) = (Host::start(&url).await, Host::start(&url).await);
    a.answer_first("hi", "A answers hi").await;

    let keyed = || UserMessage::keyed("order it", "order-1".parse().unwrap());
    let main = ProcessId::channel("main");
    let answer = async |exchange: capstan_host::agent::Exchange| {
        let mut exchange = exchange;
        let mut parts = Vec::new();
        while let Some(part) = bounded("the forwarded answer", exchange.next()).await {
            parts.push(part);
        }
        parts
    };
    let first = b.runtime.exchange(&main, keyed()).await.unwrap();
    reply(a.request().await, "A orders it");
    let first = answer(first).await;
    answered_complete(&first, "A orders it");
    // The client retries through B: forwarded again, taken by nobody, answered the same.
    let again = answer(b.runtime.exchange(&main, keyed()).await.unwrap()).await;
    answered_complete(&again, "A orders it");
    assert!(a.requests.try_recv().is_err(), "A's model was asked once");
    let stored = history(&url, "channel:main").await;
    let taken = stored.iter().filter(|m| m.contains("order it")).count();
    assert_eq!(taken, 1, "{stored:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_message_forwarded_twice_into_one_turn_is_taken_once_and_both_wait_for_it() {
    use capstan_host::agent::UserMessage;
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let (mut a, b) = (Host::start(&url).await, Host::start(&url).await);
    a.answer_first("hi", "A answers hi").await;
    // A is busy: its model holds a request while B forwards the same keyed message twice,
    // so both copies wait in A's inbox for one turn.
    a.runtime
        .send_user_message("main", "hold on")
        .await
        .unwrap();
    let held = a.request().await;
    let keyed = || UserMessage::keyed("order it", "order-2".parse().unwrap());
    let main = ProcessId::channel("main");
    let first = b.runtime.exchange(&main, keyed()).await.unwrap();
    let second = b.runtime.exchange(&main, keyed()).await.unwrap();
    reply(held, "A held on");
    let asked = a.request().await;
    assert_eq!(
        asked.count("order it"),
        1,
        "the model sees the message once"
    );
    reply(asked, "A orders it");
    for exchange in [first, second] {
        let mut exchange = exchange;
        let mut parts = Vec::new();
        while let Some(part) = bounded("the forwarded answer", exchange.next()).await {
            parts.push(part);
        }
        answered_complete(&parts, "A orders it");
    }
    let stored = history(&url, "channel:main").await;
    let taken = stored.iter().filter(|m| m.contains("order it")).count();
    assert_eq!(taken, 1, "{stored:?}");
}

/// Asserts that `parts` hold the reply `text` and end complete.
fn answered_complete(parts: &[capstan_host::agent::ReplyPart], text: &str) {
    use capstan_host::agent::{End, ReplyPart};
    let reply = ReplyPart::Reply {
        text: text.into(),
        streamed: false,
    };
    assert!(parts.contains(&reply), "{parts:?}");
    assert_eq!(
        parts.last(),
        Some(&ReplyPart::End(End::Complete)),
        "{parts:?}"
    );
}
