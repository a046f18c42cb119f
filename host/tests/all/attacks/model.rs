//! Class 6, the model's side: a slow, stalled, endless, oversized or truncated answer from
//! an OpenAI-compatible server. Each test runs the real provider and prompt gate (and, for
//! the last, the built `capstan` binary) against a server on loopback whose every write
//! the test controls: timing comes from explicit steps the test sends it, and a test that
//! waits for something waits for the thing itself (a delta, the server's report), with a
//! generous cap only against hangs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::dispatch::{
    DispatchError, DispatchOutcome, Dispatcher, GateSettings, Route, TooSlow,
};
use capstan_host::llm::{
    CompletionRequest, Delta, Message, OpenAiProvider, ProviderError, ToolCall, ToolChoice,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use server::{Server, Step};

/// The cap on any wait in these tests: only a hang reaches it.
const HANG: Duration = Duration::from_secs(120);

/// A test server on 127.0.0.1 that answers one request as the test tells it, step by step.
mod server {
    use std::time::Duration;

    use serde_json::Value;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{mpsc, oneshot};

    /// What the server writes next.
    pub enum Step {
        /// One chunk of the body.
        Send(Vec<u8>),
        /// `piece` again and again, up to `total` bytes or until a write fails.
        Flood { piece: Vec<u8>, total: usize },
        /// The end of the body (the chunked encoding's last chunk): a clean end.
        End,
        /// Close the connection with the body unfinished.
        Drop,
    }

    /// How the server's writing ended.
    #[derive(Debug)]
    pub struct Report {
        /// The request body it received.
        pub request: Value,
        /// Body bytes it wrote.
        pub written: usize,
        /// The write that failed, if one did (the client stopped reading and closed).
        pub failed: Option<std::io::Error>,
    }

    pub struct Server {
        pub url: String,
        steps: mpsc::UnboundedSender<Step>,
        report: oneshot::Receiver<Report>,
    }

    impl Server {
        /// Answers with status 200 and `content_type`, then runs the steps it is sent. It
        /// keeps the connection open, sending nothing, until the next step comes.
        pub async fn start(content_type: &'static str) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}/v1", listener.local_addr().unwrap());
            let (steps, mut todo) = mpsc::unbounded_channel();
            let (done, report) = oneshot::channel();
            tokio::spawn(async move {
                let (mut socket, _) = listener.accept().await.unwrap();
                let request = read_request(&mut socket).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
                );
                let mut report = Report {
                    request,
                    written: 0,
                    failed: None,
                };
                if let Err(err) = socket.write_all(head.as_bytes()).await {
                    report.failed = Some(err);
                }
                while report.failed.is_none() {
                    let Some(step) = todo.recv().await else { break };
                    match step {
                        Step::Send(bytes) => {
                            if let Err(err) = chunk(&mut socket, &bytes).await {
                                report.failed = Some(err);
                            } else {
                                report.written += bytes.len();
                            }
                        }
                        Step::Flood { piece, total } => {
                            while report.written < total {
                                if let Err(err) = chunk(&mut socket, &piece).await {
                                    report.failed = Some(err);
                                    break;
                                }
                                report.written += piece.len();
                            }
                        }
                        Step::End => {
                            let _ = socket.write_all(b"0\r\n\r\n").await;
                            break;
                        }
                        Step::Drop => break,
                    }
                }
                let _ = done.send(report);
            });
            Server { url, steps, report }
        }

        /// Queues `step`.
        pub fn step(&self, step: Step) {
            self.steps.send(step).expect("the server is still running");
        }

        /// Sends one Server-Sent Event with `data`.
        pub fn event(&self, data: &str) {
            self.step(Step::Send(format!("data: {data}\n\n").into_bytes()));
        }

        /// Waits for the server to stop writing, and says how it ended.
        pub async fn report(self) -> Report {
            drop(self.steps);
            tokio::time::timeout(super::HANG, self.report)
                .await
                .expect("the server finished writing")
                .expect("the server reported")
        }
    }

    async fn chunk(socket: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
        let mut framed = format!("{:x}\r\n", bytes.len()).into_bytes();
        framed.extend_from_slice(bytes);
        framed.extend_from_slice(b"\r\n");
        socket.write_all(&framed).await?;
        socket.flush().await
    }

    /// Reads one request: its head, then `content-length` bytes of body, as JSON.
    async fn read_request(socket: &mut TcpStream) -> Value {
        let mut buf = Vec::new();
        let mut piece = [0u8; 8192];
        loop {
            let n = tokio::time::timeout(Duration::from_secs(120), socket.read(&mut piece))
                .await
                .expect("the request arrives")
                .unwrap();
            assert!(n > 0, "the client closed before its request was whole");
            buf.extend_from_slice(&piece[..n]);
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            if buf.len() >= end + 4 + length {
                return serde_json::from_slice(&buf[end + 4..end + 4 + length]).unwrap();
            }
        }
    }
}

const SSE: &str = "text/event-stream";

fn request() -> CompletionRequest {
    CompletionRequest {
        process: "worker".into(),
        messages: vec![Message::user("Read the notes")],
        tools: vec![].into(),
        tool_choice: ToolChoice::Auto,
    }
}

fn text(piece: &str) -> String {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]}).to_string()
}

fn finish(reason: &str) -> String {
    json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}).to_string()
}

/// A gate in front of the real provider at `url`, with answers capped at `cap` bytes.
fn openai_gate(url: &str, timeout: Duration, total: Duration, cap: usize) -> Arc<Dispatcher> {
    let provider = OpenAiProvider::new(url, "k", "m")
        .unwrap()
        .with_max_answer_bytes(cap);
    let settings = GateSettings {
        settle: Duration::ZERO,
        timeout,
        total,
        hold: Duration::ZERO,
    };
    Arc::new(Dispatcher::new(Arc::new(provider), settings))
}

/// Starts one dispatch on `gate`; its deltas go to the returned receiver.
fn dispatch(
    gate: &Arc<Dispatcher>,
) -> (
    tokio::task::JoinHandle<DispatchOutcome>,
    mpsc::UnboundedReceiver<Delta>,
) {
    let (deltas, received) = mpsc::unbounded_channel();
    let gate = gate.clone();
    let task = tokio::spawn(async move {
        let ticket = gate.reserve("worker:1", "worker:1:loop").unwrap();
        gate.send_streaming(&ticket, Route::Task, &request(), &deltas)
            .await
    });
    (task, received)
}

async fn outcome(task: tokio::task::JoinHandle<DispatchOutcome>) -> DispatchOutcome {
    tokio::time::timeout(HANG, task)
        .await
        .expect("the dispatch ends")
        .unwrap()
}

/// The next text delta, skipping progress.
async fn next_text(received: &mut mpsc::UnboundedReceiver<Delta>) -> String {
    loop {
        let delta = tokio::time::timeout(HANG, received.recv())
            .await
            .expect("a delta arrives")
            .expect("the dispatch is still running");
        if let Delta::Text(text) = delta {
            return text;
        }
    }
}

fn provider_error(outcome: DispatchOutcome) -> ProviderError {
    match outcome {
        DispatchOutcome::Failed {
            attempted: true,
            error: DispatchError::Provider(error),
        } => error,
        other => panic!("expected a provider error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_slow_answer_that_keeps_coming_outlives_the_timeout_and_arrives_whole() {
    // Each piece comes about a thirtieth of the timeout after the caller has the last; the
    // whole answer takes one and a half times the timeout.
    let timeout = Duration::from_secs(3);
    let server = Server::start(SSE).await;
    let gate = openai_gate(&server.url, timeout, Duration::from_secs(600), 1 << 20);
    let (task, mut received) = dispatch(&gate);
    let started = Instant::now();
    let mut sent = String::new();
    let mut streamed = String::new();
    let mut i = 0;
    while started.elapsed() < timeout * 3 / 2 {
        let piece = format!("word{i} ");
        server.event(&text(&piece));
        sent.push_str(&piece);
        i += 1;
        // The next piece goes only once the caller has this one, so the server never
        // runs ahead of the client; the short pause only keeps the piece count small.
        streamed.push_str(&next_text(&mut received).await);
        tokio::time::sleep(timeout / 30).await;
    }
    server.event(&finish("stop"));
    server.event("[DONE]");
    let DispatchOutcome::Dispatched(answer) = outcome(task).await else {
        panic!("the slow answer was cut");
    };
    assert!(started.elapsed() > timeout);
    assert_eq!(answer.message.content, sent);
    while let Ok(delta) = received.try_recv() {
        if let Delta::Text(piece) = delta {
            streamed.push_str(&piece);
        }
    }
    assert_eq!(streamed, sent, "every piece reached the caller, in order");
    let request = server.report().await.request;
    assert_eq!(request["stream"], true);
}

#[tokio::test]
async fn a_server_silent_before_the_first_piece_times_out_on_that_bound() {
    let server = Server::start(SSE).await;
    // A keep-alive-free server that sent its headers and nothing more.
    let gate = openai_gate(
        &server.url,
        Duration::from_millis(500),
        Duration::from_secs(600),
        1 << 20,
    );
    let (task, _received) = dispatch(&gate);
    let outcome = outcome(task).await;
    let DispatchOutcome::TimedOut(late) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(matches!(late, TooSlow::FirstChunk { .. }), "{late:?}");
    let message = late.to_string();
    assert!(
        message.contains("first piece") && message.contains("limits.dispatch_timeout_secs"),
        "{message}"
    );
    assert_eq!(gate.gate().reservations(), 0, "the reservation is released");
    drop(server);
}

#[tokio::test]
async fn an_answer_that_stalls_midway_times_out_on_the_gap_bound() {
    let server = Server::start(SSE).await;
    let gate = openai_gate(
        &server.url,
        Duration::from_secs(3),
        Duration::from_secs(600),
        1 << 20,
    );
    let (task, mut received) = dispatch(&gate);
    server.event(&text("The first half"));
    assert_eq!(next_text(&mut received).await, "The first half");
    // ...and nothing more, the connection still open.
    let outcome = outcome(task).await;
    let DispatchOutcome::TimedOut(late) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(matches!(late, TooSlow::Gap { .. }), "{late:?}");
    let message = late.to_string();
    assert!(
        message.contains("stalled") && message.contains("limits.dispatch_timeout_secs"),
        "{message}"
    );
    drop(server);
}

#[tokio::test]
async fn an_endless_steady_answer_times_out_on_the_total_bound() {
    let server = Server::start(SSE).await;
    let gate = openai_gate(
        &server.url,
        Duration::from_secs(30),
        Duration::from_secs(1),
        1 << 20,
    );
    let (task, _received) = dispatch(&gate);
    while !task.is_finished() {
        server.event(&text("more "));
        // Pacing the server: any pause under the 30 s gap bound keeps the answer alive,
        // so only the one-second total bound can end it.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outcome = outcome(task).await;
    let DispatchOutcome::TimedOut(late) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(matches!(late, TooSlow::Total { .. }), "{late:?}");
    assert!(
        late.to_string().contains("limits.dispatch_total_secs"),
        "{late}"
    );
}

#[tokio::test]
async fn text_reaches_the_caller_before_the_answer_ends() {
    let server = Server::start(SSE).await;
    let gate = openai_gate(&server.url, HANG, HANG, 1 << 20);
    let (task, mut received) = dispatch(&gate);
    server.event(
        &json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            .to_string(),
    );
    server.event(&text("Hel"));
    assert_eq!(next_text(&mut received).await, "Hel");
    assert!(
        !task.is_finished(),
        "the server has not finished the answer: the text came first"
    );
    server.event(&text("lo."));
    assert_eq!(next_text(&mut received).await, "lo.");
    assert!(!task.is_finished());
    server.event(&finish("stop"));
    server.event("[DONE]");
    let DispatchOutcome::Dispatched(answer) = outcome(task).await else {
        panic!("no answer");
    };
    assert_eq!(answer.message.content, "Hello.");
}

#[tokio::test]
async fn tool_calls_split_across_many_chunks_are_assembled_whole() {
    let server = Server::start(SSE).await;
    let gate = openai_gate(&server.url, HANG, HANG, 1 << 20);
    let (task, _received) = dispatch(&gate);
    let call = |index: u64, fields: Value| {
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": index, "type": "function", "function": fields}
        ]}}]})
    };
    let mut events = vec![
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_a", "type": "function", "function": {"name": "file_read", "arguments": ""}}
        ]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "id": "call_b", "type": "function", "function": {"name": "task_create", "arguments": ""}}
        ]}}]}),
    ];
    let first = r#"{"path": "notes/ü.md"}"#;
    let second = r#"{"title": "Ship it", "notes": "line\nbreak"}"#;
    // One character at a time, the two calls interleaved.
    let mut a = first.chars();
    let mut b = second.chars();
    loop {
        let (x, y) = (a.next(), b.next());
        if x.is_none() && y.is_none() {
            break;
        }
        if let Some(c) = x {
            events.push(call(0, json!({"arguments": c.to_string()})));
        }
        if let Some(c) = y {
            events.push(call(1, json!({"arguments": c.to_string()})));
        }
    }
    events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}));
    // The stream's bytes cut at arbitrary points, not at event boundaries, CRLF-terminated.
    let mut stream = Vec::new();
    for event in &events {
        stream.extend_from_slice(format!("data: {event}\r\n\r\n").as_bytes());
    }
    stream.extend_from_slice(b"data: [DONE]\r\n\r\n");
    for piece in stream.chunks(7) {
        server.step(Step::Send(piece.to_vec()));
    }
    let DispatchOutcome::Dispatched(answer) = outcome(task).await else {
        panic!("no answer");
    };
    assert_eq!(
        answer.message.tool_calls,
        [
            ToolCall {
                id: "call_a".into(),
                name: "file_read".into(),
                arguments: first.into()
            },
            ToolCall {
                id: "call_b".into(),
                name: "task_create".into(),
                arguments: second.into()
            },
        ]
    );
}

#[tokio::test]
async fn a_stream_that_ends_before_done_is_an_error_not_a_shorter_answer() {
    // The body ends cleanly, even after a finish_reason, but without `data: [DONE]`.
    let server = Server::start(SSE).await;
    let gate = openai_gate(&server.url, HANG, HANG, 1 << 20);
    let (task, mut received) = dispatch(&gate);
    server.event(&text("Half an ans"));
    assert_eq!(next_text(&mut received).await, "Half an ans");
    server.event(&finish("stop"));
    server.step(Step::End);
    let err = provider_error(outcome(task).await);
    assert!(matches!(err, ProviderError::Incomplete { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("[DONE]") && message.contains("nothing of it is used"),
        "{message}"
    );

    // The connection drops mid-answer.
    let server = Server::start(SSE).await;
    let gate = openai_gate(&server.url, HANG, HANG, 1 << 20);
    let (task, mut received) = dispatch(&gate);
    server.event(&text("Half an ans"));
    assert_eq!(next_text(&mut received).await, "Half an ans");
    server.step(Step::Drop);
    let err = provider_error(outcome(task).await);
    assert!(matches!(err, ProviderError::Incomplete { .. }), "{err:?}");
}

/// What a flood writes, in all: far more than socket buffers hold, so the server can only
/// finish if the client reads it all.
const FLOOD: usize = 64 << 20;
const CAP: usize = 64 << 10;

fn assert_too_large(err: &ProviderError) {
    assert!(
        matches!(err, ProviderError::TooLarge { limit: CAP, .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("65536 bytes") && message.contains("limits.max_answer_kib"),
        "{message}"
    );
}

#[tokio::test]
async fn an_oversized_streamed_answer_fails_at_the_cap_without_reading_the_rest() {
    let server = Server::start(SSE).await;
    let gate = openai_gate(&server.url, HANG, HANG, CAP);
    let (task, _received) = dispatch(&gate);
    let piece = format!("data: {}\n\n", text(&"x".repeat(8 << 10))).into_bytes();
    server.step(Step::Flood {
        piece,
        total: FLOOD,
    });
    assert_too_large(&provider_error(outcome(task).await));
    let report = server.report().await;
    assert!(
        report.failed.is_some() && report.written < FLOOD,
        "the client stopped reading: {report:?}"
    );

    // One endless line, never an event: refused once it passes the cap, not buffered.
    let server = Server::start(SSE).await;
    let gate = openai_gate(&server.url, HANG, HANG, CAP);
    let (task, _received) = dispatch(&gate);
    server.step(Step::Send(b"data: ".to_vec()));
    server.step(Step::Flood {
        piece: vec![b'y'; 8 << 10],
        total: FLOOD,
    });
    assert_too_large(&provider_error(outcome(task).await));
    let report = server.report().await;
    assert!(
        report.failed.is_some() && report.written < FLOOD,
        "{report:?}"
    );
}

#[tokio::test]
async fn an_oversized_json_answer_fails_at_the_cap_without_reading_the_rest() {
    // A server that ignores `stream` and sends one JSON body, without a length.
    let server = Server::start("application/json").await;
    let gate = openai_gate(&server.url, HANG, HANG, CAP);
    let (task, _received) = dispatch(&gate);
    server.step(Step::Send(
        br#"{"choices": [{"index": 0, "message": {"role": "assistant", "content": ""#.to_vec(),
    ));
    server.step(Step::Flood {
        piece: vec![b'z'; 8 << 10],
        total: FLOOD,
    });
    assert_too_large(&provider_error(outcome(task).await));
    let report = server.report().await;
    assert!(
        report.failed.is_some() && report.written < FLOOD,
        "{report:?}"
    );

    // Under the cap, the same kind of body is an answer.
    let server = Server::start("application/json").await;
    let gate = openai_gate(&server.url, HANG, HANG, CAP);
    let (task, _received) = dispatch(&gate);
    let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "z".repeat(1000)}}]});
    server.step(Step::Send(body.to_string().into_bytes()));
    server.step(Step::End);
    let DispatchOutcome::Dispatched(answer) = outcome(task).await else {
        panic!("no answer");
    };
    assert_eq!(answer.message.content.len(), 1000);
}

/// The whole path: `capstan run` on the OpenAI-compatible provider, whose answer passes
/// `limits.max_answer_kib`; the person running it is told the cap and the key.
#[tokio::test]
async fn capstan_run_names_the_answer_cap_and_its_key() {
    let server = Server::start(SSE).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        format!(
            "[limits]\nmax_answer_kib = 16\n\n[provider]\nkind = \"openai\"\nbase_url = \"{}\"\n\
             api_key_env = \"CAPSTAN_ATTACK_KEY\"\nmodel = \"m\"\n",
            server.url
        ),
    )
    .unwrap();
    let piece = format!("data: {}\n\n", text(&"x".repeat(4 << 10))).into_bytes();
    server.step(Step::Flood {
        piece,
        total: FLOOD,
    });
    let mut command = crate::support::capstan_command(dir.path(), &["run", "hello"]);
    command.env("CAPSTAN_ATTACK_KEY", "k");
    let out = tokio::time::timeout(
        HANG,
        tokio::task::spawn_blocking(move || command.output().unwrap()),
    )
    .await
    .expect("capstan run ends")
    .unwrap();
    let stderr = crate::support::stderr(&out);
    assert!(
        stderr.contains("16384 bytes") && stderr.contains("limits.max_answer_kib"),
        "{stderr}"
    );
    let report = server.report().await;
    assert!(
        report.failed.is_some() && report.written < FLOOD,
        "{report:?}"
    );
}

/// The whole path: `capstan run` prints a streamed reply as it arrives. The server sends
/// the rest of the answer only after the test has read the first piece on the CLI's
/// standard output.
#[tokio::test]
async fn capstan_run_prints_a_streamed_reply_as_it_arrives() {
    use std::io::Read;

    let server = Server::start(SSE).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        format!(
            "[provider]\nkind = \"openai\"\nbase_url = \"{}\"\n\
             api_key_env = \"CAPSTAN_ATTACK_KEY\"\nmodel = \"m\"\n",
            server.url
        ),
    )
    .unwrap();
    let mut command = crate::support::capstan_command(dir.path(), &["run", "hello"]);
    command
        .env("CAPSTAN_ATTACK_KEY", "k")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    server.event(&text("Hel"));
    let shown = tokio::time::timeout(
        HANG,
        tokio::task::spawn_blocking(move || {
            let mut seen = Vec::new();
            let mut byte = [0u8; 1];
            while !seen.ends_with(b"agent> Hel") {
                let n = stdout.read(&mut byte).unwrap();
                assert!(
                    n == 1,
                    "stdout ended first: {:?}",
                    String::from_utf8_lossy(&seen)
                );
                seen.push(byte[0]);
            }
            (seen, stdout)
        }),
    )
    .await
    .expect("the first piece is shown before the answer ends")
    .unwrap();
    let (mut seen, mut stdout) = shown;
    server.event(&text("lo there"));
    server.event(&finish("stop"));
    server.event("[DONE]");
    server.step(Step::End);
    let status = tokio::task::spawn_blocking(move || {
        stdout.read_to_end(&mut seen).unwrap();
        (child.wait().unwrap(), seen)
    });
    let (status, seen) = tokio::time::timeout(HANG, status)
        .await
        .expect("capstan run ends")
        .unwrap();
    assert!(status.success());
    assert_eq!(String::from_utf8_lossy(&seen), "agent> Hello there\n");
}
