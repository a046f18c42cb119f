//! A chat turn through `capstan serve` vs the same turn in-process.
//!
//! Needs the built plugins (`bash scripts/setup`). Run with
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench serve`.
//!
//! Two agents alike (SQLite in a temporary directory, the scripted model, the channel
//! offered `file_read`), one behind a `Server` on loopback:
//! - `in_process`: `send_user_message` then `wait_idle`, as `capstan run` does.
//! - `serve`: `POST /v1/chat/completions` (not streaming) with reqwest over a kept-alive
//!   connection: the request parsed, authenticated, the exchange started behind the
//!   conversation's lock, its events followed through the hub, the reply and activity
//!   returned as JSON.
//!
//! For `no_tool` the model answers in text; for `one_tool` it calls `file_read` once (a
//! sandboxed call) and then answers. After criterion's report both paths run interleaved,
//! 1,000 rounds each, and the percentiles, their ratio and the requests per second of
//! each (one at a time) are printed.
//!
//! With them, in the same rounds, the transport's floor: a bare axum route on the same
//! runtime that parses the same request body and answers a fixed completion, called by the
//! same client. What `serve` costs over the in-process turn, less that floor, is the
//! server's own work (authentication, the exchange, following its events, the reply).

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::agent::{Event, Runtime};
use capstan_host::app::AgentBuilder;
use capstan_host::config::Config;
use capstan_host::llm::{Script, ScriptedProvider};
use capstan_host::plugin::ArtifactCache;
use capstan_host::serve::Server;
use criterion::Criterion;
use serde_json::json;
use tokio::runtime::Runtime as Tokio;
use tokio::sync::mpsc;

#[path = "support/percentiles.rs"]
mod percentiles;

use percentiles::percentile;

const SCRIPT: &str = r#"
[[step]]
process = "channel"
when = "hello"
reply = "ok"
repeat = true

[[step]]
process = "channel"
when = "read"
tool_calls = [{ name = "file_read", arguments = { path = "data.txt" } }]
repeat = true

[[step]]
process = "channel"
when = "bench data"
reply = "ok"
repeat = true
"#;

/// An agent in `dir` playing [`SCRIPT`], its channel offered `file_read`.
fn agent(tokio: &Tokio, dir: &Path) -> (Arc<Runtime>, mpsc::UnboundedReceiver<Event>, Config) {
    let toml = "[limits]\nmax_turns = 4\ncontext_window_tokens = 100000000\nmax_open_conversations = 1000000\n\
                [profiles.channel]\ntools = [\"reply\", \"file_read\"]\ncapabilities = [\"fs.read\"]\n";
    let config = Config::parse(toml, &dir.join("capstan.toml")).unwrap();
    std::fs::create_dir_all(&config.agent.workspace).unwrap();
    std::fs::write(config.agent.workspace.join("data.txt"), "bench data\n").unwrap();
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins");
    assert!(
        plugins.join("files.wasm").is_file(),
        "run `bash scripts/setup` first"
    );
    let provider = ScriptedProvider::new(Script::parse(SCRIPT, "bench").unwrap(), "bench");
    let built = tokio
        .block_on(
            AgentBuilder::new(config.clone())
                .plugins_dir(plugins)
                .cache(ArtifactCache::new(dir.join("cache")))
                .provider(Arc::new(provider))
                .build(),
        )
        .expect("the agent starts");
    (built.runtime, built.events, config)
}

struct Paths {
    local: Arc<Runtime>,
    url: String,
    /// The bare axum route: the transport's floor.
    floor_url: String,
    client: reqwest::Client,
    /// Turns on one conversation, so histories stay of a realistic length.
    n: std::cell::Cell<u64>,
}

impl Paths {
    fn channel(&self) -> String {
        let n = self.n.get() + 1;
        self.n.set(n);
        format!("c{}", n / 10)
    }

    async fn in_process(&self, message: &str) {
        let channel = self.channel();
        self.local
            .send_user_message(&channel, message)
            .await
            .unwrap();
        self.local.wait_idle(&channel).await;
    }

    async fn serve(&self, message: &str) {
        self.chat(&self.url, &self.channel(), message).await
    }

    /// The same request and answer through a bare axum route: HTTP on loopback and JSON
    /// both ways, nothing of Capstan.
    async fn floor(&self, message: &str) {
        self.chat(&self.floor_url, "floor", message).await
    }

    /// A chat completion of `message` for `user`, posted to `url`, and its answer checked.
    async fn chat(&self, url: &str, user: &str, message: &str) {
        let body = json!({
            "model": "capstan",
            "user": user,
            "messages": [{"role": "user", "content": message}],
        });
        let response = self.client.post(url).json(&body).send().await.unwrap();
        assert!(response.status().is_success());
        let answer: serde_json::Value = response.json().await.unwrap();
        assert_eq!(answer["choices"][0]["message"]["content"], "ok");
    }
}

/// A bare axum server on loopback answering every chat completion with "ok"; its URL.
fn floor_server(tokio: &Tokio) -> String {
    async fn complete(
        axum::Json(request): axum::Json<serde_json::Value>,
    ) -> axum::Json<serde_json::Value> {
        assert!(request["messages"].is_array());
        axum::Json(json!({
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "model": request["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok"}}],
        }))
    }
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(complete));
    let listener = tokio
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
        .unwrap();
    let url = format!(
        "http://{}/v1/chat/completions",
        listener.local_addr().unwrap()
    );
    tokio.spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn setup(tokio: &Tokio, local_dir: &Path, served_dir: &Path) -> Paths {
    let (local, mut local_events, _) = agent(tokio, local_dir);
    // Nobody reads the in-process events: drained so they do not pile up.
    tokio.spawn(async move { while local_events.recv().await.is_some() {} });
    let (runtime, events, config) = agent(tokio, served_dir);
    let mut settings = config.serve.clone();
    settings.addr = SocketAddr::from(([127, 0, 0, 1], 0));
    settings.requests_per_minute = u32::MAX;
    let server = tokio
        .block_on(Server::bind(&settings, runtime, events))
        .unwrap();
    let url = format!("http://{}/v1/chat/completions", server.local_addr());
    tokio.spawn(server.run(std::future::pending()));
    Paths {
        local,
        url,
        floor_url: floor_server(tokio),
        client: reqwest::Client::new(),
        n: std::cell::Cell::new(0),
    }
}

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let paths = setup(&tokio, a.path(), b.path());
    let turns = [("no_tool", "hello"), ("one_tool", "read it")];
    let mut c = Criterion::default().configure_from_args();
    for (name, message) in turns {
        let mut group = c.benchmark_group(format!("chat_{name}"));
        group.bench_function("in_process", |bench| {
            bench.iter(|| tokio.block_on(paths.in_process(message)))
        });
        group.bench_function("serve", |bench| {
            bench.iter(|| tokio.block_on(paths.serve(message)))
        });
        group.finish();
    }
    c.final_summary();

    let rounds = 1_000;
    for (name, message) in turns {
        let (mut local, mut served) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        let mut floor = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let started = Instant::now();
            tokio.block_on(paths.in_process(message));
            local.push(started.elapsed());
            let started = Instant::now();
            tokio.block_on(paths.serve(message));
            served.push(started.elapsed());
            let started = Instant::now();
            tokio.block_on(paths.floor(message));
            floor.push(started.elapsed());
        }
        let per_second =
            |times: &[Duration]| times.len() as f64 / times.iter().sum::<Duration>().as_secs_f64();
        println!(
            "{name}: in-process {:.0} turns/s, serve {:.0} requests/s (one at a time)",
            per_second(&local),
            per_second(&served)
        );
        local.sort();
        served.sort();
        floor.sort();
        for (label, p) in [("p50", 0.5), ("p99", 0.99)] {
            let (l, s, f) = (
                percentile(&local, p),
                percentile(&served, p),
                percentile(&floor, p),
            );
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            println!(
                "  {label}: in-process {:.1} µs, serve {:.1} µs, ratio {:.2}x, serve's share {:.1} µs; \
                 bare axum {:.1} µs, serve's share over it {:.1} µs",
                us(l),
                us(s),
                us(s) / us(l),
                us(s) - us(l),
                us(f),
                us(s) - us(l) - us(f)
            );
        }
    }
}
