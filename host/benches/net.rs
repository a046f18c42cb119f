//! `http_request` through Capstan against the same request from native Rust, to the same
//! loopback server, measured in one run.
//!
//! Needs the built plugins (`bash scripts/setup`). Run with
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench net`.
//!
//! - `native`: reqwest, a new connection per request (as Capstan opens one per request),
//!   GET `/ok` and read the body.
//! - `capstan`: `Registry::call` of the `web` plugin's `http_request` with a grant naming
//!   the server: a fresh instance, the request checked (target, rule, address, rate and
//!   in-flight limits), connected, the body read through the cap and the redactor, the JSON
//!   answer built by the guest.
//!
//! The host's overhead per request is `capstan - native`. After criterion's report, both
//! run interleaved once more to print p50 and p99, their ratio and their difference.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use capstan_host::net::{NetHost, NetLimits, NetSettings};
use capstan_host::plugin::{ArtifactCache, CallRequest, Limits, PluginHost, Registry};
use capstan_host::policy::Grants;
use capstan_host::secrets::Secrets;
use criterion::Criterion;
use http_body_util::Full;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;

#[path = "support/percentiles.rs"]
mod percentiles;

use percentiles::percentile;

const BODY: &str = "hello from the benchmark server";

/// A loopback server answering every request with [`BODY`].
async fn serve() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                        BODY.as_bytes(),
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(wasmtime_wasi_http::io::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

struct Paths {
    registry: Registry,
    grants: Grants,
    args: String,
    url: String,
}

impl Paths {
    async fn native(&self) {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let text = client
            .get(&self.url)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(text, BODY);
    }

    async fn capstan(&self) {
        let out = self
            .registry
            .call(CallRequest {
                tool: "http_request",
                args_json: &self.args,
                grants: &self.grants,
                workspace: None,
                caller: &capstan_host::ids::Caller::client("worker:1", None),
                instances: None,
            })
            .await
            .unwrap();
        assert!(out.contains(BODY), "{out}");
    }
}

fn setup(rt: &Runtime) -> Paths {
    rt.block_on(async {
        let addr = serve().await;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let cache = ArtifactCache::new(root.join("target/bench-component-cache"));
        // No rate limit worth the name: the benchmark makes many requests a second.
        let limits = NetLimits {
            requests_per_minute: 1_000_000,
            ..NetLimits::default()
        };
        let host = PluginHost::new(Limits::default(), cache)
            .unwrap()
            .with_network(NetHost::new(
                NetSettings {
                    limits,
                    per_tool: Default::default(),
                },
                Secrets::none(),
            ));
        let mut registry = Registry::new(Arc::new(host), capstan_host::plugin::CallLog::disabled());
        registry
            .add_file(&root.join("target/plugins/web.wasm"))
            .await
            .expect("build the plugins first: bash scripts/setup");
        let url = format!("http://{addr}/ok");
        Paths {
            registry,
            grants: format!("net:http://{addr}").parse().unwrap(),
            args: serde_json::json!({"method": "GET", "url": url}).to_string(),
            url,
        }
    })
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let paths = setup(&rt);
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("http_request");
    group.bench_function("native", |b| b.iter(|| rt.block_on(paths.native())));
    group.bench_function("capstan", |b| b.iter(|| rt.block_on(paths.capstan())));
    group.finish();
    c.final_summary();

    let rounds = 2_000;
    let (mut native, mut ours) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        let started = Instant::now();
        rt.block_on(paths.native());
        native.push(started.elapsed());
        let started = Instant::now();
        rt.block_on(paths.capstan());
        ours.push(started.elapsed());
    }
    native.sort();
    ours.sort();
    for (name, p) in [("p50", 0.5), ("p99", 0.99)] {
        let (n, o) = (percentile(&native, p), percentile(&ours, p));
        println!(
            "{name}: native {:.1} µs, capstan {:.1} µs, ratio {:.2}x, host overhead {:.1} µs",
            n.as_secs_f64() * 1e6,
            o.as_secs_f64() * 1e6,
            o.as_secs_f64() / n.as_secs_f64(),
            (o.as_secs_f64() - n.as_secs_f64()) * 1e6
        );
    }
}
