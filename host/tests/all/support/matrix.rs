//! A loopback Matrix homeserver that replays the client-server API's documented shapes for
//! a bot: `Authorization: Bearer` checked (401 `M_UNKNOWN_TOKEN` without it), `/sync` with
//! `since` and a long poll on `timeout`, `PUT .../send/m.room.message/{txnId}` idempotent
//! per transaction id, typing, joins, and `429 M_LIMIT_EXCEEDED` with `retry_after_ms`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::http_server::json as answer;
use tokio::sync::{Notify, mpsc};

/// The access token the fake homeserver accepts.
pub const TOKEN: &str = "syt_Y2Fwc3Rhbg_canaryMxToken_0aZ9";

/// The bot's user id.
pub const BOT: &str = "@capstan:localhost";

/// A message the bot sent.
#[derive(Debug, Clone)]
pub struct Sent {
    pub room: String,
    pub txn: String,
    pub content: Value,
}

struct State {
    /// Every event, in order, with its room: a sync `since=sN` gets those after the N-th.
    events: Mutex<Vec<(String, Value)>>,
    arrived: Notify,
    sent: mpsc::UnboundedSender<Sent>,
    /// Transaction ids seen, with the event id each got.
    txns: Mutex<Vec<(String, String)>>,
    /// Sends still to answer 429, with the wait they ask for.
    limited: Mutex<Vec<u64>>,
    requests: Mutex<Vec<String>>,
}

/// The fake homeserver; it stops when dropped.
pub struct FakeMatrix {
    pub addr: SocketAddr,
    state: Arc<State>,
    sent: tokio::sync::Mutex<mpsc::UnboundedReceiver<Sent>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeMatrix {
    pub async fn start() -> FakeMatrix {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(State {
            events: Mutex::default(),
            arrived: Notify::new(),
            sent: tx,
            txns: Mutex::default(),
            limited: Mutex::default(),
            requests: Mutex::default(),
        });
        let task = super::http_server::serve_loopback(listener, state.clone(), route);
        FakeMatrix {
            addr,
            state,
            sent: tokio::sync::Mutex::new(rx),
            task,
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `sender` says `text` in `room` (in `thread`, if any); the event's id.
    pub fn say(&self, room: &str, sender: &str, text: &str, thread: Option<&str>) -> String {
        let mut events = self.state.events.lock().unwrap();
        let id = format!("$ev{}", events.len() + 1);
        let mut content = json!({"msgtype": "m.text", "body": text});
        if text.contains(BOT) {
            content["m.mentions"] = json!({"user_ids": [BOT]});
        }
        if let Some(thread) = thread {
            content["m.relates_to"] = json!({"rel_type": "m.thread", "event_id": thread});
        }
        events.push((
            room.to_owned(),
            json!({"type": "m.room.message", "event_id": id, "sender": sender,
                   "origin_server_ts": 1_790_000_000_000u64, "content": content}),
        ));
        drop(events);
        self.state.arrived.notify_waiters();
        id
    }

    /// The next send answers 429 asking to wait `ms`.
    pub fn limit_next_send(&self, ms: u64) {
        self.state.limited.lock().unwrap().push(ms);
    }

    /// The next message the bot sent (a retried transaction counts again).
    pub async fn next_sent(&self) -> Sent {
        self.sent.lock().await.recv().await.unwrap()
    }

    /// Every request's path and query, as it arrived.
    pub fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeMatrix {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
            out.push(u8::from_str_radix(hex, 16).unwrap());
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

fn query<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == key).then_some(v)
    })
}

/// The sync answer for events after the `since`-th: each room's timeline, and the next batch.
fn sync_after(state: &State, since: usize) -> (Value, usize) {
    let events = state.events.lock().unwrap();
    let mut rooms = serde_json::Map::new();
    for (room, event) in events.iter().skip(since) {
        let timeline = rooms
            .entry(room.clone())
            .or_insert_with(|| json!({"timeline": {"events": []}}));
        timeline["timeline"]["events"]
            .as_array_mut()
            .unwrap()
            .push(event.clone());
    }
    (json!({"join": rooms}), events.len())
}

async fn route(state: Arc<State>, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let q = req.uri().query().unwrap_or_default().to_owned();
    state
        .requests
        .lock()
        .unwrap()
        .push(format!("{} {path}?{q}", req.method()));
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == format!("Bearer {TOKEN}").as_bytes());
    if !authorized {
        return answer(
            401,
            json!({"errcode": "M_UNKNOWN_TOKEN", "error": "Invalid access token passed."}),
        );
    }
    let method = req.method().clone();
    let body: Value = serde_json::from_slice(&req.into_body().collect().await.unwrap().to_bytes())
        .unwrap_or(Value::Null);
    let Some(rest) = path.strip_prefix("/_matrix/client/v3") else {
        return answer(
            404,
            json!({"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"}),
        );
    };
    let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["sync"]) => {
            let since = query(&q, "since")
                .and_then(|s| s.strip_prefix('s'))
                .and_then(|n| n.parse::<usize>().ok());
            let Some(since) = since else {
                // The first sync: where "now" is.
                let now = state.events.lock().unwrap().len();
                return answer(200, json!({"next_batch": format!("s{now}"), "rooms": {}}));
            };
            let wait = Duration::from_millis(
                query(&q, "timeout")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(0),
            );
            let arrived = state.arrived.notified();
            let (mut rooms, mut next) = sync_after(&state, since);
            if next == since && !wait.is_zero() {
                let _ = tokio::time::timeout(wait, arrived).await;
                (rooms, next) = sync_after(&state, since);
            }
            answer(
                200,
                json!({"next_batch": format!("s{next}"), "rooms": rooms}),
            )
        }
        ("PUT", ["rooms", room, "send", "m.room.message", txn]) => {
            let sent = Sent {
                room: decode(room),
                txn: (*txn).to_owned(),
                content: body,
            };
            let _ = state.sent.send(sent);
            if let Some(ms) = state.limited.lock().unwrap().pop() {
                return answer(
                    429,
                    json!({"errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests", "retry_after_ms": ms}),
                );
            }
            let mut txns = state.txns.lock().unwrap();
            let event = match txns.iter().find(|(t, _)| t == txn) {
                Some((_, event)) => event.clone(),
                None => {
                    let event = format!("$sent{}", txns.len() + 1);
                    txns.push(((*txn).to_owned(), event.clone()));
                    event
                }
            };
            answer(200, json!({"event_id": event}))
        }
        ("PUT", ["rooms", _, "typing", _]) => answer(200, json!({})),
        ("POST", ["rooms", room, "join"]) => answer(200, json!({"room_id": decode(room)})),
        _ => answer(
            404,
            json!({"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"}),
        ),
    }
}
