//! `capstan serve` over a real socket on loopback: the API, the event stream with resume,
//! the OpenAI-compatible endpoint, tokens and scopes, refusals, and the binary's start and
//! graceful stop. The agent is the real one (plugins, SQLite file) on a scripted model.

use std::net::SocketAddr;
use std::sync::Arc;

use capstan_host::app::AgentBuilder;
use capstan_host::config::{Config, ProviderSettings, ServeSettings, TokenScope, TokenSpec};
use capstan_host::llm::{Script, ScriptedProvider};
use capstan_host::secrets::{SecretSource, SecretSpec};
use capstan_host::serve::{ServeError, Server};
use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::support::{plugins_dir, test_cache};

/// The model's part: a greeting, a delegation whose worker lists the workspace, and a
/// call outside the channel's profile (denied).
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
tool_calls = [{ name = "file_list", arguments = { path = "." } }]

[[step]]
process = "worker"
when = "notes.txt"
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "one file: notes.txt" } }]

[[step]]
process = "channel"
when = "one file: notes.txt"
repeat = true
reply = "The worker found one file, notes.txt."

[[step]]
process = "channel"
when = "read it yourself"
repeat = true
tool_calls = [{ name = "file_read", arguments = { path = "notes.txt" } }]

[[step]]
process = "channel"
when = "not offered"
repeat = true
reply = "I may not read files."

[[step]]
process = "channel"
when = "keep my key"
repeat = true
tool_calls = [
  { name = "spawn_worker", arguments = { task = "Keep the key {SECRET} safe." } },
  { name = "skip" },
]

[[step]]
process = "worker"
when = "keep the key"
repeat = true
tool_calls = [
  { name = "task_create", arguments = { title = "Rotate {SECRET}" } },
  { name = "set_status", arguments = { state = "done", message = "kept {SECRET}" } },
]

[[step]]
process = "channel"
when = "kept"
repeat = true
reply = "Kept."
"#;

/// A secret the config declares; nothing served may hold its value. The script says it
/// where `{SECRET}` stands.
const SECRET_VALUE: &str = "sk-serve-secret-0123456789";
/// A second secret, with what JSON escapes: served inside a JSON string, it reads
/// differently, and must be hidden in that form too.
const QUOTED_SECRET: &str = r#"pass"word\0123456789"#;

/// A running server and what a test needs to talk to it.
struct Served {
    url: String,
    /// The agent's services, to plant what a test walks.
    services: capstan_host::services::Services,
    client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Served {
    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(self.at(path)).send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self
            .client
            .post(self.at(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Stops the server as a signal would, and waits for it to finish.
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.done.take().unwrap().await.unwrap();
    }
}

/// A server on 127.0.0.1 (a port the system picks) over a fresh agent in a temporary
/// directory, its settings edited by `edit`.
async fn serve(edit: impl FnOnce(&mut ServeSettings, &std::path::Path)) -> Served {
    serve_on(|_| {}, edit).await
}

/// [`serve`], with the agent's config edited first.
async fn serve_on(
    configure: impl FnOnce(&mut Config),
    edit: impl FnOnce(&mut ServeSettings, &std::path::Path),
) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults(dir.path());
    config.provider = ProviderSettings::Scripted { script: None };
    configure(&mut config);
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, SECRET_VALUE).unwrap();
    config.secrets.push(SecretSpec {
        name: "API_KEY".parse().unwrap(),
        source: SecretSource::File(secret_file),
        hosts: vec!["api.example.com".parse().unwrap()],
        header: None,
        path_prefix: None,
    });
    let quoted_file = dir.path().join("quoted");
    std::fs::write(&quoted_file, QUOTED_SECRET).unwrap();
    config.secrets.push(SecretSpec {
        name: "QUOTED".parse().unwrap(),
        source: SecretSource::File(quoted_file),
        hosts: vec!["api.example.com".parse().unwrap()],
        header: None,
        path_prefix: None,
    });
    let mut settings = config.serve.clone();
    settings.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    edit(&mut settings, dir.path());
    std::fs::create_dir_all(&config.agent.workspace).unwrap();
    std::fs::write(config.agent.workspace.join("notes.txt"), "a note\n").unwrap();
    let script = SCRIPT.replace("{SECRET}", SECRET_VALUE);
    let provider = ScriptedProvider::new(Script::parse(&script, "serve").unwrap(), "serve");
    let agent = AgentBuilder::new(config)
        .plugins_dir(plugins_dir())
        .cache(test_cache())
        .provider(Arc::new(provider))
        .build()
        .await
        .expect("the agent starts");
    let services = agent.runtime.services().clone();
    let server = Server::bind(&settings, agent.runtime, agent.events)
        .await
        .expect("the server binds");
    let url = format!("http://{}", server.local_addr());
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(async move {
        server
            .run(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Served {
        url,
        services,
        client: reqwest::Client::new(),
        stop: Some(stop),
        done: Some(done),
        _dir: dir,
    }
}

/// Writes `value` to `name` in `dir`, and declares it a token of `scope`.
fn token(settings: &mut ServeSettings, dir: &std::path::Path, name: &str, scope: TokenScope) {
    let file = dir.join(format!("token-{name}"));
    std::fs::write(&file, format!("{name}-token-0123456789abcdef")).unwrap();
    settings.tokens.push(TokenSpec {
        name: name.into(),
        source: SecretSource::File(file),
        scope,
    });
}

fn bearer(name: &str) -> String {
    format!("Bearer {name}-token-0123456789abcdef")
}

/// Server-Sent Events read off a response: (id, event, data) triples, the id the event's
/// number (of `RUN-N`).
struct SseReader {
    response: reqwest::Response,
    buffer: String,
    /// The last id read, whole (`RUN-N`).
    last_id: Option<String>,
}

/// The id of event `number` of the run `id` (`RUN-N`) belongs to.
fn sibling_id(id: &str, number: u64) -> String {
    let (run, _) = id.split_once('-').expect("an id is RUN-N");
    format!("{run}-{number}")
}

impl SseReader {
    async fn open(client: &reqwest::Client, url: &str, last_event_id: Option<&str>) -> Self {
        let mut request = client.get(url);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        SseReader {
            response,
            buffer: String::new(),
            last_id: None,
        }
    }

    /// The next message with data (keep-alive comments skipped); `None` at the end.
    async fn next(&mut self) -> Option<(Option<u64>, String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::from("message"), None);
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        self.last_id = Some(v.trim().to_owned());
                        id = v.trim().rsplit_once('-').and_then(|(_, n)| n.parse().ok());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data = Some(v.trim().to_owned());
                    }
                }
                let Some(data) = data else { continue };
                let value = serde_json::from_str(&data).unwrap_or(Value::String(data));
                return Some((id, event, value));
            }
            let chunk = self.response.chunk().await.unwrap()?;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Reads until a message of type `event`, returning everything read.
    async fn until(&mut self, event: &str) -> Vec<(Option<u64>, String, Value)> {
        let mut seen = Vec::new();
        while let Some(message) = self.next().await {
            let last = message.1 == event;
            seen.push(message);
            if last {
                return seen;
            }
        }
        panic!("the stream ended before a `{event}`: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_with_wait_returns_the_reply_after_the_worker_ran_and_the_state_shows_it() {
    let served = serve(|_, _| {}).await;
    let (status, body) = served
        .post(
            "/v1/channels/main/messages",
            json!({"text": "Please count the files.", "wait": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["reply"], "The worker found one file, notes.txt.");
    let types: Vec<&str> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(types.contains(&"worker_started"), "{types:?}");
    assert!(types.contains(&"tool_called"), "{types:?}");
    assert!(types.contains(&"worker_ended"), "{types:?}");

    let (_, channels) = served.get("/v1/channels").await;
    assert_eq!(channels["channels"][0]["id"], "channel:main");
    let (_, history) = served.get("/v1/channels/main/history").await;
    assert!(
        history["messages"].as_array().unwrap().len() >= 3,
        "{history}"
    );
    let (_, workers) = served.get("/v1/workers").await;
    assert_eq!(workers["workers"][0]["state"], "done");
    assert_eq!(workers["workers"][0]["outcome"], "one file: notes.txt");
    let (_, audit) = served.get("/v1/audit?limit=1").await;
    assert_eq!(audit["entries"][0]["tool"], "file_list");
    assert!(audit["next"].is_null(), "one entry only: {audit}");
    let (_, audit) = served.get("/v1/audit?limit=0").await;
    assert_eq!(
        audit["entries"].as_array().unwrap().len(),
        1,
        "a limit is at least 1"
    );
    let (_, policy) = served.get("/v1/policy").await;
    let row = policy["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["tool"] == "file_read")
        .unwrap();
    assert_eq!(row["kinds"]["branch"], "on");
    assert_eq!(row["kinds"]["channel"], "not in the profile");
    let (_, tools) = served.get("/v1/tools").await;
    let spawn = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "spawn_worker")
        .unwrap();
    let offered = spawn["offered_to"].as_array().unwrap();
    assert!(offered.contains(&json!("channel")) && !offered.contains(&json!("worker")));
    let (_, plugins) = served.get("/v1/plugins").await;
    assert!(
        plugins["loaded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "files")
    );
    let (status, tasks) = served.get("/v1/tasks?status=ready").await;
    assert_eq!(
        (status, tasks["tasks"].clone()),
        (StatusCode::OK, json!([]))
    );
    let (_, branches) = served.get("/v1/branches").await;
    assert_eq!(branches["branches"], json!([]));
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_follows_one_conversation_and_resumes_after_the_last_event_id() {
    let served = serve(|_, _| {}).await;
    let mut events =
        SseReader::open(&served.client, &served.at("/v1/events?channel=main"), None).await;
    let (status, _) = served
        .post("/v1/channels/other/messages", json!({"text": "hello"}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = served
        .post("/v1/channels/main/messages", json!({"text": "hello"}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let seen = events.until("reply").await;
    for (_, _, data) in &seen {
        let text = data.to_string();
        assert!(
            !text.contains("channel:other"),
            "another channel's event: {text}"
        );
    }
    let (reply_id, _, reply) = seen.last().unwrap().clone();
    assert_eq!(reply["text"], "Hi there.");
    let reply_id = reply_id.unwrap();
    let whole_id = events.last_id.clone().unwrap();

    // A client that saw everything up to just before the reply gets the reply again.
    let before = sibling_id(&whole_id, reply_id - 1);
    let mut resumed = SseReader::open(
        &served.client,
        &served.at("/v1/events?channel=main"),
        Some(&before),
    )
    .await;
    let (id, event, data) = resumed.next().await.unwrap();
    assert_eq!((id, event.as_str()), (Some(reply_id), "reply"));
    assert_eq!(data["text"], "Hi there.");

    let (status, body) = served
        .client
        .get(served.at("/v1/events"))
        .header("Last-Event-ID", "yesterday")
        .send()
        .await
        .map(|r| (r.status(), r))
        .unwrap();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: Value = body.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Last-Event-ID")
    );

    // Stopping ends the streams still open (after what they had not read yet), so the
    // server does not wait on them.
    served.stop().await;
    while let Some((_, event, _)) = events.next().await {
        assert_ne!(event, "reply", "the reply was read already");
    }
    assert!(resumed.next().await.is_none());
}

/// A `Last-Event-ID` the server cannot resume from gets a `reset` message saying why, then
/// live events, never a silent stream: one of another run of the server (as after a
/// restart), a bare number (no run), one past the newest event, one whose next events were
/// evicted from the buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_event_id_that_cannot_be_resumed_gets_a_reset_then_live_events() {
    let served = serve(|settings, _| settings.event_buffer = 4).await;
    let exchange = || async {
        let (status, _) = served
            .post(
                "/v1/channels/main/messages",
                json!({"text": "hello", "wait": true}),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    };
    let mut first = SseReader::open(&served.client, &served.at("/v1/events"), None).await;
    exchange().await;
    first.next().await.unwrap();
    let id_one = first.last_id.clone().unwrap();
    assert!(id_one.ends_with("-1"), "{id_one}");
    drop(first);
    for _ in 0..3 {
        exchange().await;
    }
    // Four exchanges of three events each: events 1..=8 are gone.
    let another_run = format!("0123456789abcdef-{}", 3);
    let future = sibling_id(&id_one, 1000);
    let mut readers = Vec::new();
    for (given, reason) in [
        (id_one.as_str(), "evicted"),
        (another_run.as_str(), "another_run"),
        ("7", "another_run"),
        (future.as_str(), "future"),
    ] {
        let mut resumed =
            SseReader::open(&served.client, &served.at("/v1/events"), Some(given)).await;
        let (id, event, data) = resumed.next().await.unwrap();
        assert_eq!(
            (event.as_str(), &data["reason"]),
            ("reset", &json!(reason)),
            "{given}"
        );
        assert_eq!(id, Some(12), "the reset is at the newest event");
        readers.push((given.to_owned(), resumed));
    }
    // Then live events.
    exchange().await;
    for (given, mut resumed) in readers {
        let (id, event, _) = resumed.next().await.unwrap();
        assert_eq!((id, event.as_str()), (Some(13), "turn_started"), "{given}");
    }
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_required_checked_and_scoped() {
    let served = serve(|settings, dir| {
        token(settings, dir, "viewer", TokenScope::Read);
        token(settings, dir, "chatter", TokenScope::Chat);
        token(settings, dir, "root", TokenScope::Admin);
    })
    .await;
    let url = served.at("/v1/channels");
    let missing = served.client.get(&url).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
    assert!(missing.headers().contains_key("www-authenticate"));
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "missing_token");
    assert_eq!(body["error"]["type"], "authentication_error");

    let wrong = served
        .client
        .get(&url)
        .header("Authorization", "Bearer viewer-token-0123456789abcdeX")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        wrong.json::<Value>().await.unwrap()["error"]["code"],
        "invalid_token"
    );

    let read = served
        .client
        .get(&url)
        .header("Authorization", bearer("viewer"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK);

    let post = |who: &str, path: &str, body: Value| {
        served
            .client
            .post(served.at(path))
            .header("Authorization", bearer(who))
            .json(&body)
            .send()
    };
    let refused = post(
        "viewer",
        "/v1/channels/main/messages",
        json!({"text": "hello"}),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let message = refused.json::<Value>().await.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("scope \"read\"") && message.contains("needs \"chat\""),
        "{message}"
    );

    let chat = json!({"model": "capstan", "messages": [{"role": "user", "content": "hello"}]});
    let ok = post("chatter", "/v1/chat/completions", chat.clone())
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let cortex =
        json!({"model": "capstan-cortex", "messages": [{"role": "user", "content": "hello"}]});
    let refused = post("chatter", "/v1/chat/completions", cortex)
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);

    // The page needs no token: it asks for one when the API does.
    let page = served.client.get(served.at("/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_in_the_openai_error_shape() {
    let served = serve(|settings, _| settings.max_request_body_bytes = 1024).await;
    let big = json!({"text": "x".repeat(4096)});
    let (status, body) = served.post("/v1/channels/main/messages", big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("serve.max_request_body_kib (1 KiB)"),
        "{message}"
    );

    let bad_json = served
        .client
        .post(served.at("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad_json.status(), StatusCode::BAD_REQUEST);
    let form = served
        .client
        .post(served.at("/v1/channels/main/messages"))
        .header("content-type", "text/plain")
        .body(r#"{"text":"hello"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let (status, body) = served.get("/v1/channels/nobody/history").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["type"], "not_found_error");
    let (status, body) = served.get("/v1/channels/..%2Fetc/history").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = served
        .post(
            "/v1/chat/completions",
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["param"], "model");
    let (status, _) = served
        .post(
            "/v1/chat/completions",
            json!({"model": "capstan", "messages": [{"role": "system", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = served.get("/v1/tasks?status=sideways").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // Query strings, path segments and methods axum itself refuses are refused in the
    // same shape, naming what is wrong.
    for (path, says) in [
        ("/v1/audit?limit=-1", "limit: invalid digit"),
        ("/v1/events?after=soon", "not an event id: it is `RUN-N`"),
        ("/v1/workers?limit=99999999999", "limit: number too large"),
        ("/v1/channels/%FF/history", "Invalid UTF-8 in `name`"),
    ] {
        let (status, body) = served.get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(
            body["error"]["type"], "invalid_request_error",
            "{path}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{path}: {message}");
    }
    let wrong_method = served
        .client
        .delete(served.at("/v1/channels"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), StatusCode::METHOD_NOT_ALLOWED);
    let body: Value = wrong_method.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");

    // A page elsewhere whose name points at this machine is refused (DNS rebinding).
    let rebound = served
        .client
        .get(served.at("/v1/channels"))
        .header("Host", "attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::FORBIDDEN);
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_answer_after_the_tools_ran_streaming_or_not() {
    let served = serve(|_, _| {}).await;
    let request = |stream: bool| {
        json!({
            "model": "capstan",
            "stream": stream,
            "user": "files",
            "messages": [
                {"role": "system", "content": "ignored"},
                {"role": "user", "content": [{"type": "text", "text": "Please count the files."}]},
            ],
        })
    };
    let (status, body) = served.post("/v1/chat/completions", request(false)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "The worker found one file, notes.txt."
    );
    assert_eq!(body["capstan"]["conversation"], "channel:files");

    let response = served
        .client
        .post(served.at("/v1/chat/completions"))
        .json(&request(true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut reader = SseReader {
        response,
        buffer: String::new(),
        last_id: None,
    };
    let (mut content, mut tools, mut finish, mut done) = (String::new(), Vec::new(), None, false);
    while let Some((_, _, data)) = reader.next().await {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        assert_eq!(data["object"], "chat.completion.chunk");
        if let Some(text) = data["choices"][0]["delta"]["content"].as_str() {
            content.push_str(text);
        }
        if data["capstan_event"]["type"] == "tool_called" {
            tools.push(data["capstan_event"]["tool"].clone());
        }
        if let Some(reason) = data["choices"][0]["finish_reason"].as_str() {
            finish = Some(reason.to_owned());
        }
    }
    assert!(done, "the stream ends with [DONE]");
    assert_eq!(finish.as_deref(), Some("stop"));
    assert_eq!(content, "The worker found one file, notes.txt.");
    assert_eq!(tools, [json!("file_list")]);
    served.stop().await;
}

/// Every route of `capstan serve`, by the path it is declared with. Each is searched for
/// secrets and tokens by `every_route_serves_no_secret_and_no_token` (here) and
/// `tests/interop/test_one_way_out.py` (through real clients, every byte).
const ROUTES: [&str; 28] = [
    "/v1/channels",
    "/v1/channels/{name}/history",
    "/v1/channels/{name}/messages",
    "/v1/workers",
    "/v1/branches",
    "/v1/tasks",
    "/v1/policy",
    "/v1/audit",
    "/v1/audit/requests",
    "/v1/audit/costs",
    "/v1/approvals",
    "/v1/approvals/{id}",
    "/v1/approvals/{id}/approve",
    "/v1/approvals/{id}/deny",
    "/v1/plugins",
    "/v1/tools",
    "/v1/events",
    "/v1/models",
    "/v1/chat/completions",
    "/metrics",
    "/mcp/{kind}",
    "/mcp",
    "/v1/openapi.json",
    "/healthz",
    "/hooks/{name}",
    "/",
    "/app.js",
    "/style.css",
];

/// The routes declared in the server's source (`.route("...")`, `.route_service(...)`):
/// a route the list above does not name fails here, so nobody adds a door that the
/// secret searches do not walk through.
#[test]
fn every_route_is_named_in_the_inventory() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/serve");
    let mut declared = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for (at, _) in source.match_indices(".route") {
            let rest = &source[at..];
            let Some(open) = rest.find('"') else { continue };
            let close = rest[open + 1..].find('"').unwrap() + open + 1;
            // The literal belongs to this call: nothing but the call's opening before it.
            let before = &rest[..open];
            if before.contains(';') || before.contains(')') {
                continue;
            }
            declared.insert(rest[open + 1..close].to_owned());
        }
    }
    let listed: std::collections::BTreeSet<String> = ROUTES.iter().map(|r| r.to_string()).collect();
    assert_eq!(
        declared, listed,
        "a route of src/serve is missing from ROUTES (or ROUTES names one that is gone): add \
         it, and walk it in every_route_serves_no_secret_and_no_token and \
         tests/interop/test_one_way_out.py"
    );
}

/// Every route, a secret's and a token's value planted in the model's reply, a worker's
/// task, a tool's error and the path asked for: neither value is in any byte served, on
/// any route, streamed or not, headers included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_serves_no_secret_and_no_token() {
    let served = serve(|settings, dir| token(settings, dir, "ops", TokenScope::Admin)).await;
    let token_value = "ops-token-0123456789abcdef";
    let auth = bearer("ops");
    let client = &served.client;
    let mut bytes: Vec<u8> = Vec::new();
    fn headers(response: &reqwest::Response) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in response.headers() {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out
    }
    // Open before anything happens, so it carries every event that follows.
    let mut events = client
        .get(served.at("/v1/events"))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap();
    bytes.extend(headers(&events));
    // The token's value, told to the model, comes back in its reply and in the history.
    let text = format!("hello, keep {SECRET_VALUE} and {token_value}");
    for (path, body) in [
        (
            "/v1/channels/main/messages",
            json!({"text": text, "wait": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "capstan", "user": "keeper",
            "messages": [{"role": "user", "content": "Please keep my key."}]}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "capstan", "stream": true,
            "messages": [{"role": "user", "content": text}]}),
        ),
        (
            "/mcp",
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": token_value, "version": "1"}}}),
        ),
        (
            "/mcp/worker",
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "file_read", "arguments": {"path": token_value}}}),
        ),
    ] {
        let response = client
            .post(served.at(path))
            .json(&body)
            .header("authorization", &auth)
            .header("accept", "application/json, text/event-stream")
            .send()
            .await
            .unwrap();
        bytes.extend(headers(&response));
        bytes.extend_from_slice(&response.bytes().await.unwrap());
    }
    let mut stream = Vec::new();
    while String::from_utf8_lossy(&stream)
        .matches("turn_finished")
        .count()
        < 3
    {
        stream.extend_from_slice(&events.chunk().await.unwrap().expect("the stream goes on"));
    }
    bytes.extend_from_slice(&stream);
    drop(events);
    // A call parked for approval whose arguments and reason hold both values: listed,
    // shown and decided, they leave redacted.
    let worker =
        capstan_host::ids::ProcessId::numbered(capstan_host::policy::ProcessKind::Worker, 9);
    let arguments = json!({"url": "https://api.example.com/", "body": text}).to_string();
    let reason = format!("because {token_value}");
    let parked = capstan_host::services::NewApproval::of(
        &worker,
        "http_request",
        &arguments,
        &reason,
        "secret(API_KEY)",
    );
    let parked = served.services.approvals.park(parked).await.unwrap();
    let second = capstan_host::services::NewApproval::of(
        &worker,
        "http_request",
        "{}",
        &reason,
        "secret(API_KEY)",
    );
    let second = served.services.approvals.park(second).await.unwrap();
    for (path, body) in [
        (
            format!("/v1/approvals/{}/approve", parked.id.get()),
            json!({"uses": 2}),
        ),
        (format!("/v1/approvals/{}/deny", second.id.get()), json!({})),
    ] {
        let response = client
            .post(served.at(&path))
            .json(&body)
            .header("authorization", &auth)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        bytes.extend(headers(&response));
        bytes.extend_from_slice(&response.bytes().await.unwrap());
    }
    for route in ROUTES {
        let path = route
            .replace("{name}", "main")
            .replace("{kind}", "worker")
            .replace("{id}", &parked.id.get().to_string());
        let path = if route.starts_with("/v1/approvals") && !route.contains('{') {
            format!("{path}?all=true")
        } else {
            path
        };
        let response = client
            .get(served.at(&path))
            .header("authorization", &auth)
            .send()
            .await
            .unwrap();
        bytes.extend(headers(&response));
        if path != "/v1/events" {
            bytes.extend_from_slice(&response.bytes().await.unwrap());
        }
    }
    let shown = client
        .get(served.at(&format!("/v1/approvals/{}", parked.id.get())))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        shown.contains("[redacted secret API_KEY]")
            && shown.contains("[redacted secret token.ops]"),
        "the approval is shown, redacted: {shown}"
    );
    bytes.extend_from_slice(shown.as_bytes());
    // A platform's event to a channel named by a token's value, carrying a secret: the
    // refusal quotes neither.
    let response = client
        .post(served.at(&format!("/hooks/{token_value}")))
        .body(format!("{{\"challenge\":\"{SECRET_VALUE}\"}}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    bytes.extend(headers(&response));
    let refused = response.text().await.unwrap();
    assert!(!refused.contains("redacted"), "{refused}");
    bytes.extend_from_slice(refused.as_bytes());
    // A path that is a token's value: the refusal does not quote it (nor, redacted, tell
    // that it is one).
    let response = client
        .get(served.at(&format!("/v1/{token_value}")))
        .header("authorization", &auth)
        .send()
        .await
        .unwrap();
    bytes.extend(headers(&response));
    let missing = response.text().await.unwrap();
    assert!(
        missing.contains("no route of that method and path"),
        "{missing}"
    );
    bytes.extend_from_slice(missing.as_bytes());
    let all = String::from_utf8_lossy(&bytes);
    for value in [SECRET_VALUE, token_value] {
        assert!(!all.contains(value), "{value} was served: …{}…", {
            let at = all.find(value).unwrap();
            &all[at.saturating_sub(200)..(at + 200).min(all.len())]
        });
    }
    assert!(
        all.contains("[redacted secret token.ops]"),
        "the reply held the token: {all}"
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_value_is_ever_served() {
    let served = serve(|_, _| {}).await;
    let mut events = SseReader::open(&served.client, &served.at("/v1/events"), None).await;
    let (status, body) = served
        .post(
            "/v1/channels/main/messages",
            json!({"text": format!("hello, my keys are {SECRET_VALUE} and {QUOTED_SECRET}"), "wait": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let seen = events.until("turn_finished").await;
    // The worker's task and outcome, and the task it created, hold the secret too.
    let (status, kept) = served
        .post(
            "/v1/chat/completions",
            json!({"model": "capstan", "user": "keeper",
                   "messages": [{"role": "user", "content": "Please keep my key."}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    assert_eq!(kept["choices"][0]["message"]["content"], "Kept.");
    let mut served_texts = vec![body.to_string(), kept.to_string(), format!("{seen:?}")];
    for path in [
        "/v1/channels/main/history",
        "/v1/channels/keeper/history",
        "/v1/audit",
        "/v1/workers",
        "/v1/tasks",
        "/v1/branches",
    ] {
        let response = served.client.get(served.at(path)).send().await.unwrap();
        served_texts.push(response.text().await.unwrap());
    }
    let escaped = serde_json::to_string(QUOTED_SECRET).unwrap();
    for text in &served_texts {
        assert!(!text.contains(SECRET_VALUE), "a secret was served: {text}");
        assert!(
            !text.contains(&escaped[1..escaped.len() - 1]) && !text.contains(QUOTED_SECRET),
            "a secret was served, JSON-escaped: {text}"
        );
    }
    let history = &served_texts[3];
    assert!(
        history.contains("[redacted secret API_KEY]")
            && history.contains("[redacted secret QUOTED]"),
        "{history}"
    );
    let workers = &served_texts[6];
    assert!(
        workers.contains("kept [redacted secret API_KEY]"),
        "{workers}"
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limit_refuses_with_retry_after() {
    let served = serve(|settings, _| settings.requests_per_minute = 3).await;
    for _ in 0..3 {
        assert_eq!(served.get("/v1/channels").await.0, StatusCode::OK);
    }
    let refused = served
        .client
        .get(served.at("/v1/channels"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("serve.requests_per_minute (3)")
    );
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_address_without_a_token_and_a_busy_port_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let start = |settings: ServeSettings| {
        let dir = dir.path().to_owned();
        async move {
            let mut config = Config::defaults(&dir);
            config.provider = ProviderSettings::Scripted { script: None };
            let script = SCRIPT.replace("{SECRET}", SECRET_VALUE);
            let provider = ScriptedProvider::new(Script::parse(&script, "serve").unwrap(), "serve");
            let agent = AgentBuilder::new(config)
                .provider(Arc::new(provider))
                .build()
                .await
                .unwrap();
            Server::bind(&settings, agent.runtime, agent.events).await
        }
    };
    let public = ServeSettings {
        addr: "0.0.0.0:0".parse().unwrap(),
        ..ServeSettings::default()
    };
    let err = start(public).await.err().expect("refused");
    assert!(matches!(err, ServeError::NoToken { .. }), "{err}");
    assert!(err.to_string().contains("[serve.tokens.NAME]"), "{err}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = ServeSettings {
        addr: taken.local_addr().unwrap(),
        ..ServeSettings::default()
    };
    let err = start(busy).await.err().expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("the address is in use") && text.contains("--addr"),
        "{text}"
    );
}

/// The binary: it prints where it listens, serves, and on SIGTERM stops gracefully with
/// the conversation stored; a bad --addr is refused with the fix.
/// The `capstan serve --demo` binary in `dir`, on a free loopback port, its output piped.
#[cfg(unix)]
fn spawn_demo_server(dir: &std::path::Path) -> std::process::Child {
    let demo = dir.join("demo");
    crate::support::capstan_command(
        dir,
        &[
            "serve",
            "--demo",
            "--dir",
            demo.to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap()
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_and_stops_gracefully_on_sigterm() {
    use std::io::BufRead;

    let dir = tempfile::tempdir().unwrap();
    let bad = crate::support::capstan(dir.path(), &["serve", "--addr", "localhost:99999"]);
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("IP:PORT, such as 127.0.0.1:8787"), "{said}");

    let mut child = spawn_demo_server(dir.path());
    // Only the first line is read, then the pipe is closed, as `capstan serve | head -1`
    // does: the server must go on serving.
    let stdout = child.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .unwrap();
        line
    })
    .await
    .unwrap();
    let url = first
        .trim()
        .strip_prefix("capstan serve: listening on ")
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();
    let client = reqwest::Client::new();
    let health = client.get(format!("{url}healthz")).send().await.unwrap();
    assert_eq!(health.text().await.unwrap(), "ok");
    let reply: Value = client
        .post(format!("{url}v1/chat/completions"))
        .json(&json!({"model": "capstan", "messages": [
            {"role": "user", "content": "Gather the open items from the notes in notes/ and summarize them."}
        ]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("There are 3 open items"),
        "{reply}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let store = capstan_host::store::Store::open(&dir.path().join("demo/.capstan")).unwrap();
    let history = store.load_history("channel:main").unwrap();
    assert!(history.len() >= 4, "the conversation was stored");
}

/// Load on loopback: 200 clients follow the event stream while 1,000 chat completions run
/// on 50 conversations at once. Every completion is answered, and every client sees every
/// event from where it joined, in order, with none skipped. The completions do not wait
/// for the event stream (their answers come by their own exchange), so on two cores the
/// 200 readers can fall more than a third of the events behind: the buffer holds them all,
/// and a reader further behind would be told `lost`, never skip in silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_streams_lose_nothing_while_a_thousand_completions_run() {
    const CLIENTS: usize = 200;
    const COMPLETIONS: usize = 1000;
    const CONVERSATIONS: usize = 50;
    // Each completion is at most three events (a turn started, its reply, the turn
    // finished).
    let served = serve(|settings, _| {
        settings.requests_per_minute = 1_000_000;
        settings.event_buffer = 3 * COMPLETIONS + 64;
    })
    .await;
    let url = served.at("/v1/events");
    let mut readers = Vec::new();
    for _ in 0..CLIENTS {
        readers.push(SseReader::open(&served.client, &url, None).await);
    }
    // Read until the reply to a last message, sent once every completion was answered.
    let followers: Vec<_> = readers
        .into_iter()
        .map(|mut reader| {
            tokio::spawn(async move {
                let (mut last, mut replies) = (0u64, 0usize);
                loop {
                    let (id, event, data) = reader.next().await.expect("the stream goes on");
                    assert_ne!(event, "lost", "a connected client lost events");
                    let id = id.expect("every event has an id");
                    assert_eq!(id, last + 1, "events in order, none skipped");
                    last = id;
                    if event == "reply" {
                        replies += 1;
                        if data.to_string().contains("channel:load-end") {
                            return (last, replies);
                        }
                    }
                }
            })
        })
        .collect();
    let chats = futures_util::stream::iter(0..COMPLETIONS)
        .map(|n| {
            let client = served.client.clone();
            let url = served.at("/v1/chat/completions");
            async move {
                let body = json!({
                    "model": "capstan",
                    "user": format!("load-{}", n % CONVERSATIONS),
                    "messages": [{"role": "user", "content": "hello"}],
                });
                let response = client.post(url).json(&body).send().await.unwrap();
                assert_eq!(response.status(), StatusCode::OK);
                let answer: Value = response.json().await.unwrap();
                assert_eq!(answer["choices"][0]["message"]["content"], "Hi there.");
            }
        })
        .buffer_unordered(CONVERSATIONS);
    chats.collect::<Vec<()>>().await;
    let end = json!({"model": "capstan", "user": "load-end",
                     "messages": [{"role": "user", "content": "hello"}]});
    let (status, body) = served.post("/v1/chat/completions", end).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut ends = Vec::new();
    for follower in followers {
        ends.push(follower.await.unwrap());
    }
    // Every reader saw every event, in the same order. Messages a conversation took in
    // together share a turn, so there is a reply for each conversation at least.
    assert!(ends.iter().all(|&end| end == ends[0]), "{ends:?}");
    assert!(ends[0].1 > CONVERSATIONS, "{ends:?}");
    served.stop().await;
}

/// Every conversation keeps its history in memory, so clients cannot open more than
/// `limits.max_open_conversations`: the next new one is refused by name, the open ones go
/// on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_open_more_conversations_than_the_limit() {
    let served = serve_on(|config| config.limits.max_open_conversations = 2, |_, _| {}).await;
    let hello = |conversation: &str| {
        json!({"model": "capstan", "user": conversation,
               "messages": [{"role": "user", "content": "hello"}]})
    };
    for open in ["one", "two"] {
        let (status, body) = served.post("/v1/chat/completions", hello(open)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, body) = served.post("/v1/chat/completions", hello("three")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("2 conversations are open")
            && message.contains("limits.max_open_conversations"),
        "{message}"
    );
    let (status, body) = served
        .post("/v1/channels/four/messages", json!({"text": "hello"}))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = served.post("/v1/chat/completions", hello("one")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], "Hi there.");
    served.stop().await;
}

/// The OpenAPI document in `docs/` is the one the code derives, and the server serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_committed_openapi_document_is_the_served_one() {
    let derived = capstan_host::serve::openapi_json();
    let committed = std::fs::read_to_string(crate::support::repo_root().join("docs/openapi.json"))
        .expect("docs/openapi.json");
    assert!(
        committed.trim_end() == derived.trim_end(),
        "docs/openapi.json is stale: regenerate it with \
         `cargo run -p capstan-host -- serve --openapi > docs/openapi.json`"
    );
    let served = serve(|_, _| {}).await;
    let (status, document) = served.get("/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let derived: Value = serde_json::from_str(&derived).unwrap();
    assert_eq!(document, derived);
    // Every documented route is routed: nothing answers with the fallback's "no route".
    for (path, operations) in document["paths"].as_object().unwrap() {
        let url = served.at(&path.replace("{name}", "main"));
        for method in operations.as_object().unwrap().keys() {
            let response = match method.as_str() {
                "get" => served.client.get(&url).send().await.unwrap(),
                "post" => served
                    .client
                    .post(&url)
                    .json(&json!({}))
                    .send()
                    .await
                    .unwrap(),
                other => panic!("a {other} route is documented: {path}"),
            };
            if response.status() == StatusCode::NOT_FOUND {
                let body: Value = response.json().await.unwrap();
                let message = body["error"]["message"].as_str().unwrap_or_default();
                assert!(
                    !message.starts_with("no route"),
                    "{method} {path}: {message}"
                );
            }
        }
    }
    served.stop().await;
}

#[cfg(unix)]
#[test]
fn a_sigterm_right_after_the_banner_still_stops_gracefully() {
    use std::io::BufRead;

    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn_demo_server(dir.path());
    // A supervisor that signals as soon as it reads the first line.
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("capstan serve: listening on "), "{first}");
    crate::support::send_signal(child.id(), "-TERM");
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("(stopping"));
}
