//! A loopback JSON API that records every request and answers from a script: the Web API
//! of a platform whose events are pushed (Slack's `chat.postMessage`, Discord's interaction
//! webhooks). Each request gets the next answer queued for its path, if any (a 429, an
//! error), else what the default answer says.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// One request, as it arrived.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub body: Value,
}

/// An answer: status, JSON body, extra headers.
pub type Answer = (u16, Value, Vec<(&'static str, String)>);

struct State {
    default: fn(&Recorded) -> Answer,
    queued: Mutex<Vec<(String, VecDeque<Answer>)>>,
    recorded: mpsc::UnboundedSender<Recorded>,
    all: Mutex<Vec<Recorded>>,
}

/// The API; it stops when dropped.
pub struct ScriptedApi {
    pub addr: SocketAddr,
    state: Arc<State>,
    calls: tokio::sync::Mutex<mpsc::UnboundedReceiver<Recorded>>,
    task: tokio::task::JoinHandle<()>,
}

impl ScriptedApi {
    /// Starts it, answering what nothing is queued for with `default`.
    pub async fn start(default: fn(&Recorded) -> Answer) -> ScriptedApi {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(State {
            default,
            queued: Mutex::default(),
            recorded: tx,
            all: Mutex::default(),
        });
        let task = super::http_server::serve_loopback(listener, state.clone(), route);
        ScriptedApi {
            addr,
            state,
            calls: tokio::sync::Mutex::new(rx),
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next request to a path ending in `suffix` gets `answer`.
    pub fn queue(&self, suffix: &str, answer: Answer) {
        let mut queued = self.state.queued.lock().unwrap();
        match queued.iter_mut().find(|(s, _)| s == suffix) {
            Some((_, answers)) => answers.push_back(answer),
            None => queued.push((suffix.to_owned(), VecDeque::from([answer]))),
        }
    }

    /// The next request received.
    pub async fn next(&self) -> Recorded {
        self.calls
            .lock()
            .await
            .recv()
            .await
            .expect("the fake API runs")
    }

    /// Every request received so far.
    pub fn all(&self) -> Vec<Recorded> {
        self.state.all.lock().unwrap().clone()
    }
}

impl Drop for ScriptedApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn route(state: Arc<State>, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let authorization = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let recorded = Recorded {
        method,
        path,
        authorization,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let queued = {
        let mut queued = state.queued.lock().unwrap();
        queued
            .iter_mut()
            .find(|(suffix, answers)| recorded.path.ends_with(suffix) && !answers.is_empty())
            .and_then(|(_, answers)| answers.pop_front())
    };
    let (status, json, headers) = queued.unwrap_or_else(|| (state.default)(&recorded));
    state.all.lock().unwrap().push(recorded.clone());
    let _ = state.recorded.send(recorded);
    let mut response = super::http_server::json(status, json);
    for (name, value) in headers {
        response.headers_mut().insert(name, value.parse().unwrap());
    }
    response
}
