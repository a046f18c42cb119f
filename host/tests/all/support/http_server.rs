//! A loopback HTTP/1.1 server for the network tests, with routes that misbehave on
//! purpose. It records every request it receives (method, path, headers, body length), so
//! a test can assert what reached it, and what never did.
//!
//! Routes:
//! - `/ok`: 200 with a short text body.
//! - `/echo-headers`: 200, the request's headers as `name: value` lines.
//! - `/echo-body`: 200, the request's body.
//! - `/redirect?to=URL`: 302 to `URL`.
//! - `/big?bytes=N`: 200 with `N` bytes.
//! - `/json`: 200 `application/json`.
//! - `/binary`: 200 `image/png`.
//! - `/hang`: never answers (the request waits until the server is dropped).
//! - `/stall`: sends headers and part of the body, then nothing more.
//! - `/hold`: answers once [`TestServer::release`] is called; [`TestServer::held`] counts
//!   the requests waiting.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::{Request, Response};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use wasmtime_wasi_http::io::TokioIo;

/// What the server saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body_len: usize,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct State {
    seen: Mutex<Vec<Seen>>,
    held: watch::Sender<usize>,
    release: Notify,
}

/// Serves every connection `listener` accepts with `route`, each on a task of its own,
/// until the returned task is aborted.
pub fn serve_loopback<S, F, Fut, B>(
    listener: TcpListener,
    state: Arc<S>,
    route: F,
) -> tokio::task::JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<hyper::body::Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(route(state, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// A JSON answer with `status`: what the platforms' fakes answer.
pub fn json(status: u16, body: serde_json::Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The server; it stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            seen: Mutex::default(),
            held: watch::channel(0).0,
            release: Notify::new(),
        });
        let task = serve_loopback(listener, state.clone(), route);
        TestServer { addr, state, task }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The rule granting exactly this server.
    pub fn grant(&self) -> String {
        format!("net:http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Waits until `n` requests wait in `/hold`.
    pub async fn held(&self, n: usize) {
        let mut rx = self.state.held.subscribe();
        rx.wait_for(|held| *held >= n).await.unwrap();
    }

    /// Lets every request in `/hold` answer.
    pub fn release(&self) {
        self.state.release.notify_waiters();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn text(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()).boxed())
        .unwrap()
}

fn query<'a>(req: &'a Request<hyper::body::Incoming>, key: &str) -> Option<&'a str> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then_some(v)
    })
}

async fn route(state: Arc<State>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(n, v)| {
            (
                n.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let method = req.method().to_string();
    let to = query(&req, "to").map(percent_decode);
    let bytes: usize = query(&req, "bytes")
        .and_then(|b| b.parse().ok())
        .unwrap_or(0);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    state.seen.lock().unwrap().push(Seen {
        method,
        path: path.clone(),
        headers: headers.clone(),
        body_len: body.len(),
    });
    match path.as_str() {
        "/ok" => text(200, "text/plain", "hello from the test server"),
        "/json" => text(200, "application/json", r#"{"answer":42}"#),
        "/binary" => text(200, "image/png", vec![0x89u8, b'P', b'N', b'G']),
        "/echo-headers" => {
            let lines: String = headers.iter().map(|(n, v)| format!("{n}: {v}\n")).collect();
            text(200, "text/plain", lines)
        }
        "/echo-body" => text(200, "text/plain", body),
        "/redirect" => Response::builder()
            .status(302)
            .header("location", to.unwrap_or_default())
            .body(Full::new(Bytes::new()).boxed())
            .unwrap(),
        "/big" => text(200, "text/plain", vec![b'x'; bytes]),
        "/hang" => std::future::pending().await,
        "/stall" => Response::builder()
            .status(200)
            .header("content-type", "text/plain")
            .body(Stall { sent: false }.boxed())
            .unwrap(),
        "/hold" => {
            let released = state.release.notified();
            state.held.send_modify(|n| *n += 1);
            released.await;
            text(200, "text/plain", "released")
        }
        _ => text(404, "text/plain", "no such route"),
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A body that sends a few bytes, then nothing, forever.
struct Stall {
    sent: bool,
}

impl hyper::body::Body for Stall {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.sent {
            return std::task::Poll::Pending;
        }
        self.sent = true;
        std::task::Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"the start, ")))))
    }
}
