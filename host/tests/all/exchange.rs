//! The exchange: a door's message and its answer, acknowledged only once stored. The
//! history service of a real SQLite store is put behind a switch that makes it refuse
//! writes, as a database outage, a full pool or a full disk does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use capstan_host::agent::{End, Exchange, ReplyPart, Runtime, UserMessage};
use capstan_host::app::AgentBuilder;
use capstan_host::config::{Config, ProviderSettings};
use capstan_host::ids::{ProcessId, SessionKey};
use capstan_host::llm::{Script, ScriptedProvider};
use capstan_host::serve::Server;
use capstan_host::services::{ConversationSummary, History, HistoryEntry, ServiceError, Services};
use capstan_host::store::Store;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};

use crate::support::{plugins_dir, test_cache};

const SCRIPT: &str = r#"
[[step]]
process = "channel"
when = "hello"
repeat = true
reply = "Hi there."

[[step]]
process = "channel"
when = "count the files"
repeat = true
tool_calls = [
  { name = "spawn_worker", arguments = { task = "List the files of the workspace." } },
  { name = "skip" },
]

[[step]]
process = "worker"
when = "list the files"
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "no files" } }]

[[step]]
process = "channel"
when = "no files"
repeat = true
reply = "The worker found no files."
"#;

/// A history service that refuses every write while it is down, as a store in an outage.
struct Outage {
    inner: Arc<dyn History>,
    down: AtomicBool,
    /// Writes refused so far.
    refused: AtomicUsize,
    refusal: Notify,
}

impl Outage {
    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Waits until `count` writes in all were refused.
    async fn refused_at_least(&self, count: usize) {
        loop {
            let refused = self.refusal.notified();
            if self.refused.load(Ordering::SeqCst) >= count {
                return;
            }
            refused.await;
        }
    }

    fn refuse(&self) -> Result<(), ServiceError> {
        if !self.down.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::SeqCst);
        self.refusal.notify_waiters();
        Err(ServiceError::Backend(
            "the database is down (a test's outage)".into(),
        ))
    }
}

#[async_trait]
impl History for Outage {
    fn location(&self) -> String {
        self.inner.location()
    }

    async fn load(&self, channel: &SessionKey) -> Result<Vec<HistoryEntry>, ServiceError> {
        self.inner.load(channel).await
    }

    async fn append(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.refuse()?;
        self.inner.append(channel, messages).await
    }

    async fn replace(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.refuse()?;
        self.inner.replace(channel, messages).await
    }

    async fn conversations(&self) -> Result<Vec<ConversationSummary>, ServiceError> {
        self.inner.conversations().await
    }
}

/// An agent on a SQLite store in `dir` whose history goes through an [`Outage`].
async fn agent(
    dir: &std::path::Path,
    configure: impl FnOnce(&mut Config),
) -> (capstan_host::app::Agent, Arc<Outage>, Arc<dyn History>) {
    let mut config = Config::defaults(dir);
    config.provider = ProviderSettings::Scripted { script: None };
    config.limits.store_retry = std::time::Duration::from_millis(10);
    configure(&mut config);
    std::fs::create_dir_all(&config.agent.workspace).unwrap();
    let store = Arc::new(Store::open(&config.agent.data_dir).unwrap());
    let mut services: Services = store.services();
    let outage = Arc::new(Outage {
        inner: services.history.clone(),
        down: AtomicBool::new(false),
        refused: AtomicUsize::new(0),
        refusal: Notify::new(),
    });
    let stored = services.history.clone();
    services.history = outage.clone();
    let provider = ScriptedProvider::new(Script::parse(SCRIPT, "exchange").unwrap(), "exchange");
    let agent = AgentBuilder::new(config)
        .plugins_dir(plugins_dir())
        .cache(test_cache())
        .provider(Arc::new(provider))
        .services(services)
        .build()
        .await
        .expect("the agent starts");
    (agent, outage, stored)
}

/// The parts of `exchange` up to and including `until`.
async fn parts_until(
    exchange: &mut Exchange,
    until: impl Fn(&ReplyPart) -> bool,
) -> Vec<ReplyPart> {
    let mut parts = Vec::new();
    while let Some(part) = exchange.next().await {
        let found = until(&part);
        parts.push(part);
        if found {
            return parts;
        }
    }
    panic!("the exchange ended first: {parts:?}");
}

/// The stored messages of `channel` that hold `text`.
async fn stored_with(history: &Arc<dyn History>, channel: &str, text: &str) -> usize {
    let entries = history
        .load(&crate::support::ids::key(channel))
        .await
        .unwrap();
    entries.iter().filter(|e| e.message.contains(text)).count()
}

fn main_channel() -> ProcessId {
    ProcessId::channel("main")
}

#[tokio::test]
async fn an_exchange_ends_complete_only_once_the_store_has_taken_its_history() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, outage, stored) = agent(dir.path(), |_| {}).await;
    let rt: Arc<Runtime> = agent.runtime;
    outage.set_down(true);
    let mut exchange = rt.exchange(&main_channel(), "hello").await.unwrap();
    let parts = parts_until(&mut exchange, |p| {
        matches!(p, ReplyPart::NotYetStored { .. })
    })
    .await;
    assert!(
        parts
            .iter()
            .any(|p| matches!(p, ReplyPart::Reply { text, .. } if text == "Hi there.")),
        "the reply comes before the store takes it: {parts:?}"
    );
    // Written again and again while the store is down, and never acknowledged meanwhile.
    let so_far = outage.refused.load(Ordering::SeqCst);
    outage.refused_at_least(so_far + 2).await;
    while let Ok(part) = tokio::time::timeout(std::time::Duration::ZERO, exchange.next()).await {
        assert!(
            !matches!(part, None | Some(ReplyPart::End(_))),
            "no end while the history is not stored: {part:?}"
        );
    }
    assert_eq!(stored_with(&stored, "channel:main", "hello").await, 0);

    outage.set_down(false);
    assert_eq!(exchange.next().await, Some(ReplyPart::End(End::Complete)));
    assert_eq!(exchange.next().await, None);
    // Stored exactly once: the message and the reply.
    assert_eq!(stored_with(&stored, "channel:main", "hello").await, 1);
    assert_eq!(stored_with(&stored, "channel:main", "Hi there.").await, 1);
    assert!(rt.not_saved().is_empty());
    rt.shutdown();
}

#[tokio::test]
async fn an_exchange_carries_the_work_its_message_started_and_ends_when_it_reported_back() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _outage, stored) = agent(dir.path(), |_| {}).await;
    let rt = agent.runtime;
    let mut exchange = rt
        .exchange(&main_channel(), "count the files")
        .await
        .unwrap();
    let mut parts = Vec::new();
    while let Some(part) = exchange.next().await {
        parts.push(part);
    }
    let started = parts.iter().position(|p| {
        matches!(
            p,
            ReplyPart::Activity(capstan_host::agent::Event::WorkerStarted { .. })
        )
    });
    let ended = parts.iter().position(|p| {
        matches!(
            p,
            ReplyPart::Activity(capstan_host::agent::Event::WorkerEnded { .. })
        )
    });
    let replied = parts.iter().position(
        |p| matches!(p, ReplyPart::Reply { text, .. } if text == "The worker found no files."),
    );
    assert!(
        matches!((started, ended, replied), (Some(s), Some(e), Some(r)) if s < e && e < r),
        "{parts:?}"
    );
    assert_eq!(parts.last(), Some(&ReplyPart::End(End::Complete)));
    assert_eq!(
        stored_with(&stored, "channel:main", "The worker found no files.").await,
        1
    );
    rt.shutdown();
}

#[tokio::test]
async fn a_stop_with_the_store_still_down_ends_the_exchange_not_stored_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, outage, stored) = agent(dir.path(), |_| {}).await;
    let rt = agent.runtime;
    outage.set_down(true);
    let mut exchange = rt.exchange(&main_channel(), "hello").await.unwrap();
    parts_until(&mut exchange, |p| {
        matches!(p, ReplyPart::NotYetStored { .. })
    })
    .await;
    rt.interrupt();
    let end = parts_until(&mut exchange, |p| matches!(p, ReplyPart::End(_))).await;
    assert!(
        matches!(end.last(), Some(ReplyPart::End(End::NotStored { error })) if error.contains("database is down")),
        "{end:?}"
    );
    let not_saved = rt.not_saved();
    assert_eq!(not_saved.len(), 1, "{not_saved:?}");
    assert_eq!(not_saved[0].conversation, main_channel());
    assert_eq!(stored_with(&stored, "channel:main", "hello").await, 0);
    // A message sent once the host is stopping is refused, and stored nowhere.
    assert!(rt.exchange(&main_channel(), "hello again").await.is_err());
}

/// A server on the agent, stopped when the returned sender is dropped.
async fn serve(agent: capstan_host::app::Agent) -> (String, oneshot::Sender<()>) {
    let mut settings = agent.runtime.config().serve.clone();
    settings.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let server = Server::bind(&settings, agent.runtime, agent.events)
        .await
        .expect("the server binds");
    let url = format!("http://{}", server.local_addr());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = server
            .run(async {
                let _ = stopped.await;
            })
            .await;
    });
    (url, stop)
}

#[tokio::test]
async fn the_doors_answer_200_only_for_what_is_stored_and_202_not_yet_stored_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, outage, stored) = agent(dir.path(), |config| {
        config.limits.unstored_reply = std::time::Duration::ZERO;
    })
    .await;
    let (url, _stop) = serve(agent).await;
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| client.post(format!("{url}{path}")).json(&body).send();

    let answered = post(
        "/v1/channels/main/messages",
        json!({"text": "hello", "wait": true}),
    )
    .await
    .unwrap();
    assert_eq!(answered.status(), 200);
    let body: Value = answered.json().await.unwrap();
    assert_eq!(
        (body["reply"].as_str(), body["outcome"].as_str()),
        (Some("Hi there."), Some("stored"))
    );
    assert_eq!(stored_with(&stored, "channel:main", "Hi there.").await, 1);

    outage.set_down(true);
    let kept = post(
        "/v1/channels/main/messages",
        json!({"text": "hello once more", "wait": true}),
    )
    .await
    .unwrap();
    assert_eq!(kept.status(), 202);
    let body: Value = kept.json().await.unwrap();
    assert_eq!(body["outcome"], "not_yet_stored", "{body}");
    assert_eq!(body["reply"], "Hi there.");
    assert!(
        body["note"]
            .as_str()
            .unwrap()
            .contains("do not send the message again"),
        "{body}"
    );
    let completion = post(
        "/v1/chat/completions",
        json!({"model": "capstan", "messages": [{"role": "user", "content": "hello, third"}], "user": "other"}),
    )
    .await
    .unwrap();
    assert_eq!(completion.status(), 202);
    let body: Value = completion.json().await.unwrap();
    assert_eq!(body["capstan"]["outcome"], "not_yet_stored", "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "Hi there.");

    // Back: what was kept is written, in order, once each.
    outage.set_down(false);
    crate::support::until("the kept exchanges stored", async || {
        let counts = (
            stored_with(&stored, "channel:main", "hello once more").await,
            stored_with(&stored, "channel:other", "hello, third").await,
        );
        (counts == (1, 1))
            .then_some(())
            .ok_or(format!("{counts:?}"))
    })
    .await;
    let main = stored
        .load(&crate::support::ids::key("channel:main"))
        .await
        .unwrap();
    let users: Vec<&str> = main
        .iter()
        .filter(|e| e.message.contains(r#""role":"user""#))
        .map(|e| e.message.as_str())
        .collect();
    assert_eq!(users.len(), 2, "{users:?}");
    assert!(users[0].contains("\"hello\"") && users[1].contains("hello once more"));
}

/// The parts of `exchange` to its end.
async fn all_parts(mut exchange: Exchange) -> Vec<ReplyPart> {
    let mut parts = Vec::new();
    while let Some(part) = exchange.next().await {
        parts.push(part);
    }
    parts
}

fn replies(parts: &[ReplyPart]) -> Vec<&str> {
    parts
        .iter()
        .filter_map(|p| match p {
            ReplyPart::Reply { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn keyed(text: &str, key: &str) -> UserMessage {
    UserMessage::keyed(text, key.parse().unwrap())
}

#[tokio::test]
async fn a_message_sent_again_with_its_key_is_answered_again_and_taken_once() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _outage, stored) = agent(dir.path(), |_| {}).await;
    let rt = agent.runtime;
    let first = all_parts(
        rt.exchange(&main_channel(), keyed("hello", "k-1"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(replies(&first), ["Hi there."]);
    assert!(
        !first
            .iter()
            .any(|p| matches!(p, ReplyPart::Repeated { .. }))
    );
    // Sent again after its answer: answered again from what the conversation keeps.
    let again = all_parts(
        rt.exchange(&main_channel(), keyed("hello", "k-1"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        again[0],
        ReplyPart::Repeated {
            key: "k-1".parse().unwrap()
        }
    );
    assert_eq!(replies(&again), ["Hi there."]);
    assert_eq!(again.last(), Some(&ReplyPart::End(End::Complete)));
    // Sent twice at once: one is taken, both are answered.
    let (a, b) = (
        rt.exchange(&main_channel(), keyed("hello twice", "k-2"))
            .await
            .unwrap(),
        rt.exchange(&main_channel(), keyed("hello twice", "k-2"))
            .await
            .unwrap(),
    );
    let (a, b) = tokio::join!(all_parts(a), all_parts(b));
    assert_eq!(
        (replies(&a), replies(&b)),
        (vec!["Hi there."], vec!["Hi there."])
    );
    assert_eq!(a.last(), Some(&ReplyPart::End(End::Complete)));
    assert_eq!(b.last(), Some(&ReplyPart::End(End::Complete)));
    assert_eq!(stored_with(&stored, "channel:main", "\"hello\"").await, 1);
    assert_eq!(stored_with(&stored, "channel:main", "hello twice").await, 1);
    // A new key, or none, is a new message.
    let plain = all_parts(rt.exchange(&main_channel(), "hello").await.unwrap()).await;
    assert!(
        !plain
            .iter()
            .any(|p| matches!(p, ReplyPart::Repeated { .. }))
    );
    assert_eq!(stored_with(&stored, "channel:main", "\"hello\"").await, 2);

    // After a restart the key is still known: it rests with the message in the history.
    let report = rt.stop_report();
    rt.shutdown();
    drop(rt);
    drop(agent.registry);
    drop(agent.events);
    assert!(report.ended().await.is_empty());
    let (agent, _outage, stored) = agent_on(dir.path()).await;
    let rt = agent.runtime;
    let after = all_parts(
        rt.exchange(&main_channel(), keyed("hello", "k-1"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        after[0],
        ReplyPart::Repeated {
            key: "k-1".parse().unwrap()
        }
    );
    assert_eq!(replies(&after), ["Hi there."]);
    assert_eq!(stored_with(&stored, "channel:main", "\"hello\"").await, 2);
    rt.shutdown();
}

/// [`agent`] with the default settings, on the store `dir` already holds.
async fn agent_on(
    dir: &std::path::Path,
) -> (capstan_host::app::Agent, Arc<Outage>, Arc<dyn History>) {
    agent(dir, |_| {}).await
}

#[tokio::test]
async fn the_http_doors_take_a_keyed_message_once_and_say_when_an_answer_is_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let (agent, _outage, stored) = agent(dir.path(), |_| {}).await;
    let (url, _stop) = serve(agent).await;
    let client = reqwest::Client::new();
    let send = |key: &'static str| {
        client
            .post(format!("{url}/v1/channels/main/messages"))
            .header("Idempotency-Key", key)
            .json(&json!({"text": "hello", "wait": true}))
            .send()
    };
    let first: Value = send("abc-1").await.unwrap().json().await.unwrap();
    let again = send("abc-1").await.unwrap();
    assert_eq!(again.status(), 200);
    let again: Value = again.json().await.unwrap();
    assert_eq!(first["reply"], again["reply"]);
    assert_eq!(
        (first.get("repeated"), &again["repeated"]),
        (None, &json!(true))
    );
    assert_eq!(stored_with(&stored, "channel:main", "\"hello\"").await, 1);

    let completion = |key: &'static str| {
        client
            .post(format!("{url}/v1/chat/completions"))
            .header("Idempotency-Key", key)
            .json(&json!({"model": "capstan", "messages": [{"role": "user", "content": "hello there"}]}))
            .send()
    };
    let first: Value = completion("abc-2").await.unwrap().json().await.unwrap();
    let again: Value = completion("abc-2").await.unwrap().json().await.unwrap();
    assert_eq!(first["choices"][0]["message"]["content"], "Hi there.");
    assert_eq!(again["choices"][0]["message"]["content"], "Hi there.");
    assert_eq!(again["capstan"]["repeated"], true);
    assert_eq!(stored_with(&stored, "channel:main", "hello there").await, 1);

    // Two keys that disagree, or a key that is not one, are refused before anything is sent.
    let refused = client
        .post(format!("{url}/v1/channels/main/messages"))
        .header("Idempotency-Key", "one")
        .json(&json!({"text": "never sent", "idempotency_key": "two"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("differ"),
        "{body}"
    );
    let refused = client
        .post(format!("{url}/v1/channels/main/messages"))
        .json(&json!({"text": "never sent", "idempotency_key": "has a space"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    assert_eq!(stored_with(&stored, "channel:main", "never sent").await, 0);
}

#[tokio::test]
async fn two_messages_at_once_through_the_doors_each_get_their_own_answer_and_neither_waits_for_the_others_worker()
 {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults(dir.path());
    config.provider = ProviderSettings::Scripted { script: None };
    std::fs::create_dir_all(&config.agent.workspace).unwrap();
    let (provider, mut held) = crate::support::Gated::new();
    let agent = AgentBuilder::new(config)
        .plugins_dir(plugins_dir())
        .cache(test_cache())
        .provider(provider)
        .build()
        .await
        .expect("the agent starts");
    let (url, _stop) = serve(agent).await;
    let client = reqwest::Client::new();

    // The first message starts a worker, which the model then keeps waiting.
    let first = tokio::spawn({
        let (client, url) = (client.clone(), url.clone());
        async move {
            let body = json!({"text": "start the long job", "wait": true});
            let answered = client
                .post(format!("{url}/v1/channels/main/messages"))
                .json(&body)
                .send()
                .await
                .unwrap();
            (answered.status(), answered.json::<Value>().await.unwrap())
        }
    });
    let asked = held.recv().await.unwrap();
    assert!(asked.holds("start the long job"), "{:?}", asked.request);
    asked.call("spawn_worker", json!({"task": "the long job"}));
    // Then the worker and the turn ask the model, in either order.
    let (mut worker, mut turn) = (None, None);
    for _ in 0..2 {
        let pending = held.recv().await.unwrap();
        if pending.holds("the long job") {
            worker = Some(pending);
        } else {
            turn = Some(pending);
        }
    }
    let (worker, turn) = (worker.unwrap(), turn.unwrap());
    assert!(turn.holds("start the long job"), "{:?}", turn.request);
    turn.reply("Started the long job.");

    // The second message, through the OpenAI door, while that worker works: answered
    // and stored on its own, with none of the worker's doing in its answer.
    let second = client
        .post(format!("{url}/v1/chat/completions"))
        .json(&json!({"model": "capstan", "user": "main",
            "messages": [{"role": "user", "content": "hello meanwhile"}]}))
        .send();
    let reply = async {
        let pending = held.recv().await.unwrap();
        assert!(pending.holds("hello meanwhile"), "{:?}", pending.request);
        pending.reply("Hi, the job is still running.");
    };
    // Bounded only so that a door that queued it behind the first fails, not hangs.
    let both = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        tokio::join!(second, reply)
    });
    let (second, ()) = both
        .await
        .expect("the second message is not held behind the first one's worker");
    let second = second.unwrap();
    assert_eq!(second.status(), 200);
    let body: Value = second.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["content"], "Hi, the job is still running.",
        "{body}"
    );
    assert_eq!(body["capstan"]["outcome"], "stored", "{body}");
    assert!(
        !body.to_string().contains("worker:") && !body.to_string().contains("Started"),
        "the first message's work is not the second's: {body}"
    );
    assert!(!first.is_finished(), "the first waits for its worker");

    // The worker ends; its report's turn answers the first message.
    worker.call(
        "set_status",
        json!({"state": "done", "message": "the long job is done"}),
    );
    let told = held.recv().await.unwrap();
    let report =
        told.request.messages.iter().any(|m| {
            m.content.starts_with("[worker:") && m.content.ends_with("the long job is done")
        });
    assert!(report, "{:?}", told.request);
    told.reply("The long job finished.");
    let (status, body) = first.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "stored", "{body}");
    assert_eq!(
        body["reply"], "Started the long job.\n\nThe long job finished.",
        "{body}"
    );
    assert!(
        !body["reply"].as_str().unwrap().contains("still running"),
        "the second message's answer is not the first's: {body}"
    );
    let events = body["events"].to_string();
    assert!(
        events.contains("worker_started") && events.contains("worker_ended"),
        "{body}"
    );
}

#[tokio::test]
async fn the_answer_to_a_workers_question_is_followed_to_the_workers_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults(dir.path());
    config.provider = ProviderSettings::Scripted { script: None };
    let (provider, requests) = crate::support::Gated::new();
    let (rt, _events) = crate::support::agent_runtime(config, provider, false).await;
    let mut held = crate::support::Held::new(requests);

    // The first message starts an interactive worker, which asks a question.
    let first = rt
        .exchange(&main_channel(), "run the survey")
        .await
        .unwrap();
    let first = tokio::spawn(all_parts(first));
    held.next_where(|p| p.holds("run the survey")).await.call(
        "spawn_worker",
        json!({"task": "the survey", "interactive": true}),
    );
    held.next_where(|p| p.holds("the survey")).await.call(
        "set_status",
        json!({"state": "waiting", "message": "Which color?"}),
    );
    held.next_where(|p| p.holds("run the survey"))
        .await
        .reply("The survey has started.");
    held.next_where(|p| p.mentions("Which color?"))
        .await
        .reply("The survey asks: which color?");
    // Its exchange ends once the conversation waits on the user.
    let first = first.await.unwrap();
    assert_eq!(
        replies(&first),
        ["The survey has started.", "The survey asks: which color?"]
    );
    assert_eq!(first.last(), Some(&ReplyPart::End(End::Complete)));

    // The answer, routed to the worker: its exchange follows the worker to its end.
    let second = rt.exchange(&main_channel(), "blue").await.unwrap();
    let second = tokio::spawn(all_parts(second));
    held.next_where(|p| p.holds("blue") && !p.holds("the survey"))
        .await
        .call("route", json!({"worker": "worker:1", "message": "blue"}));
    held.next_where(|p| p.holds("the survey") && p.holds("blue"))
        .await
        .call(
            "set_status",
            json!({"state": "done", "message": "the color is blue"}),
        );
    held.next_where(|p| {
        p.holds("blue") && !p.holds("the survey") && !p.mentions("the color is blue")
    })
    .await
    .reply("Passed on.");
    held.next_where(|p| p.mentions("the color is blue") && !p.holds("the survey"))
        .await
        .reply("The survey is done: blue.");
    let second = second.await.unwrap();
    assert_eq!(
        replies(&second),
        ["Passed on.", "The survey is done: blue."]
    );
    assert_eq!(second.last(), Some(&ReplyPart::End(End::Complete)));
    assert!(
        second.iter().any(|p| matches!(
            p,
            ReplyPart::Activity(capstan_host::agent::Event::WorkerEnded { .. })
        )),
        "{second:?}"
    );
    rt.shutdown();
}
