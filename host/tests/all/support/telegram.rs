//! A loopback Telegram Bot API that replays the platform's documented shapes: the token in
//! the path (`/bot<TOKEN>/METHOD`, a 404 envelope without it), `getUpdates` with `offset`
//! and a long poll on `timeout`, `sendMessage` answering the sent message, `sendChatAction`,
//! and the error envelopes (`{"ok":false,"error_code":429,"parameters":{"retry_after":N}}`,
//! 409 for a second poller). A test queues updates and faults, and waits on what was sent.

use std::collections::VecDeque;
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

/// The bot token the fake platform accepts.
pub const TOKEN: &str = "7700112233:AAE-canary-tg-token_Zq9";

/// A fault the next call of a method meets.
#[derive(Debug, Clone)]
pub enum Fault {
    /// `429` with `retry_after` seconds.
    RateLimited(u64),
    /// `409 Conflict`: another poller.
    Conflict,
    /// `200` whose body is not JSON.
    Garbage,
    /// No answer until the server is dropped.
    Hang,
}

/// A request the fake platform took, with the token checked.
#[derive(Debug, Clone)]
pub struct Call {
    /// `getUpdates`, `sendMessage`, ...
    pub method: String,
    /// The JSON body.
    pub body: Value,
    /// The whole request line's path, as it arrived.
    pub path: String,
}

struct State {
    updates: Mutex<VecDeque<Value>>,
    next_update: Mutex<i64>,
    next_message: Mutex<i64>,
    faults: Mutex<Vec<(String, Fault)>>,
    arrived: Notify,
    calls: mpsc::UnboundedSender<Call>,
    all: Mutex<Vec<Call>>,
    /// How many calls hang now.
    hung: tokio::sync::watch::Sender<usize>,
}

/// The fake platform; it stops when dropped.
pub struct FakeTelegram {
    pub addr: SocketAddr,
    state: Arc<State>,
    calls: tokio::sync::Mutex<mpsc::UnboundedReceiver<Call>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeTelegram {
    pub async fn start() -> FakeTelegram {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(State {
            updates: Mutex::default(),
            next_update: Mutex::new(1000),
            next_message: Mutex::new(1),
            faults: Mutex::default(),
            arrived: Notify::new(),
            calls: tx,
            all: Mutex::default(),
            hung: tokio::sync::watch::channel(0).0,
        });
        let task = super::http_server::serve_loopback(listener, state.clone(), route);
        FakeTelegram {
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

    /// Queues a text message from user `from` in chat `chat` (`private` when they are the
    /// same), returning its update id.
    pub fn say(&self, chat: i64, from: i64, username: &str, text: &str) -> i64 {
        let kind = if chat == from {
            "private"
        } else {
            "supergroup"
        };
        self.push(json!({
            "message": {
                "message_id": 0,
                "from": {"id": from, "is_bot": false, "first_name": username, "username": username},
                "chat": {"id": chat, "type": kind},
                "date": 1_790_000_000,
                "text": text,
            }
        }))
    }

    /// Queues `update` (its `update_id` and message id filled in), returning its id.
    pub fn push(&self, mut update: Value) -> i64 {
        let id = {
            let mut next = self.state.next_update.lock().unwrap();
            *next += 1;
            *next
        };
        update["update_id"] = json!(id);
        if let Some(message) = update.get_mut("message")
            && message["message_id"] == json!(0)
        {
            message["message_id"] = json!(id * 10);
        }
        self.state.updates.lock().unwrap().push_back(update);
        self.state.arrived.notify_waiters();
        id
    }

    /// The next call of `method` meets `fault`.
    pub fn fault(&self, method: &str, fault: Fault) {
        self.state
            .faults
            .lock()
            .unwrap()
            .push((method.to_owned(), fault));
    }

    /// Waits for the next call of `method` (others are skipped, and kept in [`Self::all`]).
    pub async fn next(&self, method: &str) -> Call {
        let mut calls = self.calls.lock().await;
        loop {
            let call = calls.recv().await.expect("the fake platform runs");
            if call.method == method {
                return call;
            }
        }
    }

    /// Waits until `n` calls hang.
    pub async fn hung(&self, n: usize) {
        let mut hung = self.state.hung.subscribe();
        hung.wait_for(|now| *now >= n).await.unwrap();
    }

    /// Forgets the calls not yet waited for: what comes next is new.
    pub async fn drain(&self) {
        let mut calls = self.calls.lock().await;
        while calls.try_recv().is_ok() {}
    }

    /// Every call taken so far.
    pub fn all(&self) -> Vec<Call> {
        self.state.all.lock().unwrap().clone()
    }
}

impl Drop for FakeTelegram {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn error(code: u16, description: &str) -> Response<Full<Bytes>> {
    answer(
        code,
        json!({"ok": false, "error_code": code, "description": description}),
    )
}

async fn route(state: Arc<State>, req: Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let Some(method) = path
        .strip_prefix(&format!("/bot{TOKEN}/"))
        .map(str::to_owned)
    else {
        return error(404, "Not Found");
    };
    let bytes = req.into_body().collect().await.unwrap().to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let call = Call {
        method: method.clone(),
        body: body.clone(),
        path: path.clone(),
    };
    state.all.lock().unwrap().push(call.clone());
    let fault = {
        let mut faults = state.faults.lock().unwrap();
        faults
            .iter()
            .position(|(m, _)| *m == method)
            .map(|at| faults.remove(at).1)
    };
    let _ = state.calls.send(call);
    match fault {
        Some(Fault::RateLimited(seconds)) => {
            return answer(
                429,
                json!({"ok": false, "error_code": 429,
                       "description": format!("Too Many Requests: retry after {seconds}"),
                       "parameters": {"retry_after": seconds}}),
            );
        }
        Some(Fault::Conflict) => {
            return error(
                409,
                "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
            );
        }
        Some(Fault::Garbage) => {
            return Response::new(Full::new(Bytes::from_static(
                b"<html>502 bad gateway</html>",
            )));
        }
        Some(Fault::Hang) => {
            state.hung.send_modify(|n| *n += 1);
            std::future::pending().await
        }
        None => {}
    }
    match method.as_str() {
        "getUpdates" => {
            let offset = body["offset"].as_i64().unwrap_or(0);
            let wait = Duration::from_secs(body["timeout"].as_u64().unwrap_or(0));
            let pending = || -> Vec<Value> {
                let mut updates = state.updates.lock().unwrap();
                // As the Bot API does: an offset confirms every update before it.
                updates.retain(|u| u["update_id"].as_i64().unwrap() >= offset);
                updates.iter().cloned().collect()
            };
            let mut found = pending();
            if found.is_empty() && !wait.is_zero() {
                let arrived = state.arrived.notified();
                let _ = tokio::time::timeout(wait, arrived).await;
                found = pending();
            }
            answer(200, json!({"ok": true, "result": found}))
        }
        "sendMessage" => {
            let text = body["text"].as_str().unwrap_or_default();
            if text.chars().count() > 4096 {
                return error(400, "Bad Request: message is too long");
            }
            let id = {
                let mut next = state.next_message.lock().unwrap();
                *next += 1;
                *next
            };
            answer(
                200,
                json!({"ok": true, "result": {"message_id": id, "chat": {"id": body["chat_id"]}, "text": text}}),
            )
        }
        "sendChatAction" | "editMessageText" => answer(200, json!({"ok": true, "result": true})),
        _ => error(404, "Not Found: method not found"),
    }
}
