//! The providers through their real paths: the OpenAI-compatible client against an HTTP
//! server on loopback (answering with a JSON body, or streaming Server-Sent Events), the
//! scripted provider, and recording then replaying.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use capstan_host::llm::{
    CompletionRequest, Delta, Message, OpenAiProvider, Provider, ProviderError, Recorder,
    RetryPolicy, Script, ScriptedProvider, ToolCall, ToolChoice, ToolDef,
};
use capstan_host::secrets::Redactor;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One canned HTTP answer.
struct Answer {
    status: u16,
    content_type: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    body: String,
}

fn ok(body: Value) -> Answer {
    Answer {
        status: 200,
        content_type: "application/json",
        headers: vec![],
        body: body.to_string(),
    }
}

/// A streamed answer: each of `events` as one Server-Sent Event, then `[DONE]`.
fn streamed(events: &[Value]) -> Answer {
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    Answer {
        status: 200,
        content_type: "text/event-stream",
        headers: vec![],
        body,
    }
}

fn status(code: u16, body: &str) -> Answer {
    Answer {
        status: code,
        content_type: "application/json",
        headers: vec![],
        body: body.to_owned(),
    }
}

/// A request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    head: String,
    body: Value,
}

/// Serves `answers` in order on 127.0.0.1, one per connection, recording each request.
/// Returns the base URL and the log.
async fn serve(answers: Vec<Answer>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for answer in answers {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let (head, body) = loop {
                let n = socket.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).into_owned();
                if let Some(end) = text.find("\r\n\r\n") {
                    let head = text[..end].to_owned();
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + length {
                        break (
                            head,
                            String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).into_owned(),
                        );
                    }
                }
                assert!(n > 0, "client closed early");
            };
            log.lock().unwrap().push(Seen {
                head,
                body: serde_json::from_str(&body).unwrap_or(Value::Null),
            });
            let mut response = format!(
                "HTTP/1.1 {} X\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
                answer.status,
                answer.content_type,
                answer.body.len()
            );
            for (k, v) in answer.headers {
                response.push_str(&format!("{k}: {v}\r\n"));
            }
            response.push_str("\r\n");
            response.push_str(&answer.body);
            socket.write_all(response.as_bytes()).await.unwrap();
            socket.shutdown().await.ok();
        }
    });
    (url, seen)
}

fn fast_retry(attempts: u32) -> RetryPolicy {
    RetryPolicy {
        attempts,
        base_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
    }
}

fn request() -> CompletionRequest {
    CompletionRequest {
        process: "worker".into(),
        messages: vec![
            Message::system("You are a worker."),
            Message::user("Read notes.md"),
            Message {
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "file_read".into(),
                    arguments: r#"{"path":"notes.md"}"#.into(),
                }],
                ..Message::assistant("")
            },
            Message::tool_result("c1", "- item one"),
        ],
        tools: vec![ToolDef {
            name: "file_read".into(),
            description: "Reads a file.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }]
        .into(),
        tool_choice: ToolChoice::Auto,
    }
}

/// One streamed chunk carrying `delta`.
fn chunk(delta: Value) -> Value {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

fn completion(message: Value) -> Value {
    json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": {"total_tokens": 17}})
}

#[tokio::test]
async fn the_request_body_carries_messages_tools_and_tool_choice() {
    let (url, seen) = serve(vec![ok(completion(
        json!({"role": "assistant", "content": "Done."}),
    ))])
    .await;
    let provider = OpenAiProvider::new(&url, "secret-key", "test-model").unwrap();
    let answer = provider.complete(&request(), &()).await.unwrap();
    assert_eq!(answer.message.content, "Done.");
    assert_eq!(answer.tokens, Some(17));

    let seen = seen.lock().unwrap();
    let Seen { head, body } = &seen[0];
    assert!(head.starts_with("POST /v1/chat/completions "), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("authorization: bearer secret-key"),
        "{head}"
    );
    assert_eq!(body["model"], "test-model");
    assert_eq!(body["stream"], true, "answers are asked for as a stream");
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "function": {"name": "file_read", "description": "Reads a file.", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})
    );
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4);
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "You are a worker."})
    );
    assert_eq!(
        messages[2]["content"],
        Value::Null,
        "a tool-call-only assistant message has null content"
    );
    assert_eq!(
        messages[2]["tool_calls"][0],
        json!({"id": "c1", "type": "function", "function": {"name": "file_read", "arguments": "{\"path\":\"notes.md\"}"}})
    );
    assert_eq!(
        messages[3],
        json!({"role": "tool", "content": "- item one", "tool_call_id": "c1"})
    );
}

#[tokio::test]
async fn several_tool_calls_in_one_turn_parse_and_malformed_arguments_stay_verbatim() {
    let message = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "file_read", "arguments": "{\"path\":\"a.md\"}"}},
        {"id": "b", "type": "function", "function": {"name": "task_create", "arguments": "{\"title\": unquoted"}},
        {"id": "c", "type": "function", "function": {"name": "file_list", "arguments": {"path": "."}}}
    ]});
    let (url, _) = serve(vec![ok(completion(message))]).await;
    let provider = OpenAiProvider::new(&url, "k", "m").unwrap();
    let calls = provider
        .complete(&request(), &())
        .await
        .unwrap()
        .message
        .tool_calls;
    let names: Vec<_> = calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["file_read", "task_create", "file_list"]);
    assert_eq!(
        calls[1].arguments, "{\"title\": unquoted",
        "kept for the host to answer invalid-args"
    );
    assert_eq!(
        serde_json::from_str::<Value>(&calls[2].arguments).unwrap(),
        json!({"path": "."})
    );
}

#[tokio::test]
async fn busy_answers_are_retried_with_backoff_then_succeed() {
    let (url, seen) = serve(vec![
        Answer {
            headers: vec![("retry-after", "0")],
            ..status(429, "{}")
        },
        status(503, "overloaded"),
        streamed(&[
            chunk(json!({"content": "third "})),
            chunk(json!({"content": "time"})),
        ]),
    ])
    .await;
    let provider = OpenAiProvider::new(&url, "k", "m")
        .unwrap()
        .with_retry(fast_retry(4));
    let answer = provider.complete(&request(), &()).await.unwrap();
    assert_eq!(answer.message.content, "third time");
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn client_errors_fail_at_once_and_persistent_5xx_after_the_last_attempt() {
    let (url, seen) = serve(vec![status(
        401,
        r#"{"error":{"message":"invalid api key"}}"#,
    )])
    .await;
    let provider = OpenAiProvider::new(&url, "k", "m")
        .unwrap()
        .with_retry(fast_retry(4));
    let err = provider.complete(&request(), &()).await.unwrap_err();
    assert!(
        matches!(
            err,
            ProviderError::Status {
                status: 401,
                attempts: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("invalid api key"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 1);

    let (url, seen) = serve(vec![status(500, "a"), status(502, "b"), status(500, "c")]).await;
    let provider = OpenAiProvider::new(&url, "k", "m")
        .unwrap()
        .with_retry(fast_retry(3));
    let err = provider
        .complete(&request(), &())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("500 after 3 attempt(s)"), "{err}");
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn an_unreachable_endpoint_and_a_bad_response_get_specific_errors() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let provider = OpenAiProvider::new(&url, "k", "m")
        .unwrap()
        .with_retry(fast_retry(2));
    let err = provider.complete(&request(), &()).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Unreachable { attempts: 2, .. }),
        "{err:?}"
    );

    let (url, _) = serve(vec![ok(json!({"object": "list"}))]).await;
    let provider = OpenAiProvider::new(&url, "k", "m").unwrap();
    let err = provider
        .complete(&request(), &())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not a chat completion") && err.contains("choices"),
        "{err}"
    );

    let missing = OpenAiProvider::from_env(&url, "CAPSTAN_TEST_SURELY_UNSET_KEY", "m").unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("CAPSTAN_TEST_SURELY_UNSET_KEY"),
        "{missing}"
    );
}

const SCRIPT: &str = r#"
[[step]]
process = "channel"
when = "open items"
reply = "I'll put a worker on it."
tool_calls = [{ name = "spawn_worker", arguments = { task = "Gather the open items" } }]

[[step]]
process = "worker"
tool_calls = [{ name = "file_list", arguments_raw = "{oops" }]

[[step]]
process = "channel"
reply = "Anything else?"
repeat = true
"#;

fn ask(process: &str, text: &str) -> CompletionRequest {
    CompletionRequest {
        process: process.into(),
        messages: vec![Message::user(text)],
        tools: vec![].into(),
        tool_choice: ToolChoice::Auto,
    }
}

#[tokio::test]
async fn the_scripted_provider_picks_steps_by_process_and_message() {
    let provider = ScriptedProvider::new(Script::parse(SCRIPT, "test").unwrap(), "test");
    let first = provider
        .complete(&ask("channel", "Please gather the OPEN ITEMS"), &())
        .await
        .unwrap();
    assert_eq!(first.message.content, "I'll put a worker on it.");
    assert_eq!(
        first.message.tool_calls[0].arguments,
        r#"{"task":"Gather the open items"}"#
    );
    let worker = provider.complete(&ask("worker", "go"), &()).await.unwrap();
    assert_eq!(worker.message.tool_calls[0].arguments, "{oops");
    // The first step is used up; the repeating one answers from now on.
    for _ in 0..3 {
        let next = provider
            .complete(&ask("channel", "open items again"), &())
            .await
            .unwrap();
        assert_eq!(next.message.content, "Anything else?");
    }
    let err = provider
        .complete(&ask("worker", "more"), &())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no step left for a worker request") && err.contains("\"more\""),
        "{err}"
    );
}

#[tokio::test]
async fn a_bad_script_names_the_step_and_the_problem() {
    let err = Script::parse("[[step]]\nprocess = \"janitor\"\n", "s.toml")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("s.toml") && err.contains("step[0].process") && err.contains("janitor"),
        "{err}"
    );
    let err = Script::parse(
        "[[step]]\nprocess = \"channel\"\nreplyy = \"x\"\n",
        "s.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("unknown field `replyy`"), "{err}");
}

#[tokio::test]
async fn a_recording_replays_the_same_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recorded.toml");
    let (url, _) = serve(vec![
        streamed(&[
            chunk(json!({"tool_calls": [{"index": 0, "id": "x", "type": "function", "function": {"name": "file_read", "arguments": "{\"pa"}}]})),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "th\":\"a\"}"}}]})),
        ]),
        ok(completion(json!({"role": "assistant", "content": "All read."}))),
    ])
    .await;
    let live = Recorder::new(
        OpenAiProvider::new(&url, "k", "m").unwrap(),
        &path,
        Redactor::default(),
    );
    let requests = [ask("worker", "Read a"), ask("worker", "file a says hi")];
    let mut originals = Vec::new();
    let (deltas, mut received) = tokio::sync::mpsc::unbounded_channel();
    for r in &requests {
        originals.push(live.complete(r, &deltas).await.unwrap().message);
    }
    assert_eq!(
        originals[0].tool_calls[0].arguments, r#"{"path":"a"}"#,
        "the streamed fragments, assembled"
    );
    // The recorder passes the stream's deltas through; the JSON answer has no pieces.
    let mut seen = Vec::new();
    while let Ok(delta) = received.try_recv() {
        seen.push(delta);
    }
    assert_eq!(
        seen[..2],
        [Delta::ToolCall { index: 0 }, Delta::ToolCall { index: 0 }]
    );
    assert!(seen[2..].iter().all(|d| *d == Delta::Progress), "{seen:?}");

    let replay = ScriptedProvider::new(Script::load(&path).unwrap(), "recorded");
    for (r, original) in requests.iter().zip(originals) {
        let again = replay.complete(r, &()).await.unwrap().message;
        assert_eq!(again.content, original.content);
        let calls = |m: &Message| {
            m.tool_calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(calls(&again), calls(&original));
    }
    assert_eq!(replay.remaining(), 0);
}

#[tokio::test]
async fn a_recording_never_holds_a_value_the_redactor_knows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recorded.toml");
    let key = "sk-canary-0123456789abcdef";
    let (url, _) = serve(vec![ok(completion(
        json!({"role": "assistant", "content": format!("the key is {key}")}),
    ))])
    .await;
    let redactor = Redactor::new([("API_KEY".parse().unwrap(), Arc::from(key))]);
    let live = Recorder::new(
        OpenAiProvider::new(&url, "k", "m").unwrap(),
        &path,
        redactor,
    );
    // The key starts past the middle of the 80 bytes a step's `when` keeps of the request.
    let asked = format!("{} please repeat {key} back to me", "x".repeat(40));
    live.complete(&ask("worker", &asked), &()).await.unwrap();
    let recording = std::fs::read_to_string(&path).unwrap();
    assert!(!recording.contains(&key[..8]), "{recording}");
    assert!(
        recording.contains("the key is [redacted secret API_KEY]"),
        "{recording}"
    );
}

/// The whole path: a channel on the OpenAI-compatible provider, against the loopback
/// server; the model's malformed tool arguments go back to it as invalid-args.
#[tokio::test]
async fn malformed_arguments_from_the_model_go_back_to_it_as_invalid_args() {
    use capstan_host::agent::Event;
    use capstan_host::app::AgentBuilder;
    use capstan_host::config::Config;

    let plugins = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins");
    assert!(
        plugins.join("files.wasm").is_file(),
        "build the plugins first: bash scripts/setup"
    );
    let (url, seen) = serve(vec![
        ok(completion(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "m1", "type": "function", "function": {"name": "file_read", "arguments": "{\"path\": notes.md"}}
        ]}))),
        ok(completion(json!({"role": "assistant", "content": "Sorry, my arguments were broken."}))),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = Config::parse(
        "[profiles.channel]\ntools = [\"reply\", \"file_read\"]\ncapabilities = [\"fs.read\"]\n",
        &dir.path().join("capstan.toml"),
    )
    .unwrap();
    let provider = OpenAiProvider::new(&url, "k", "m").unwrap();
    let agent = AgentBuilder::new(config)
        .plugins_dir(&plugins)
        .provider(Arc::new(provider))
        .build()
        .await
        .unwrap();
    let (rt, mut events) = (agent.runtime, agent.events);
    rt.send_user_message("main", "read my notes").await.unwrap();
    rt.wait_idle("main").await;

    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    let tools: Vec<&str> = seen[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["reply", "file_read"],
        "the channel's profile, nothing more"
    );
    let messages = seen[1].body["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "m1");
    let content = last["content"].as_str().unwrap();
    assert!(
        content.starts_with("error[invalid-args]: file_read: arguments are not valid JSON"),
        "{content}"
    );
    let mut replies = Vec::new();
    while let Ok(event) = events.try_recv() {
        if let Event::Reply { text, .. } = event {
            replies.push(text);
        }
    }
    assert_eq!(replies, ["Sorry, my arguments were broken."]);
}
