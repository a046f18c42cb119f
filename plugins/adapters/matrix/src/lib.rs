//! Matrix for Capstan: the client-server API (v3) over the host's egress.
//!
//! In: `/sync` long polling (the cursor is `next_batch`; the first poll only finds where
//! "now" is, so a bot never answers what was said before it started). Rooms the bot is
//! invited to are joined when `join_on_invite` is set. Out: `m.room.message` with a
//! transaction id made of what is sent (a retry after a rate limit is the same event,
//! never two), in the message's thread, as a reply; edits (`m.replace`) and typing.
//! The access token is the host's: bind it as a header to the homeserver
//! (`header = "Authorization: Bearer {MATRIX_TOKEN}"`).
//!
//! Settings (`[channels.NAME.settings]`):
//! - `homeserver`: its base URL, e.g. `https://matrix.example.org`;
//! - `user_id`: the bot's own id, e.g. `@capstan:example.org` (its messages are skipped,
//!   and a mention of it addresses the bot);
//! - `join_on_invite`: join rooms the bot is invited to (default false).

use capstan_channel::{
    Adapter, AdapterError, Attachment, Batch, Feature, Inbound, Outbound, Platform, Sender,
};
use capstan_sdk::http::{Method, Request, Response};
use serde::Deserialize;
use serde_json::{Value, json};

/// The most characters one message carries here: an event is at most 64 KiB, JSON and
/// all.
pub const MAX_TEXT: u32 = 16_000;

/// The most a sync answer is read.
const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// `[channels.NAME.settings]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The homeserver's base URL.
    pub homeserver: String,
    /// The bot's user id.
    pub user_id: String,
    /// Join rooms the bot is invited to.
    #[serde(default)]
    pub join_on_invite: bool,
}

/// The client-server API's error body.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    errcode: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

/// `response` as JSON, or the adapter's error for it.
fn answer(response: Response) -> Result<Value, AdapterError> {
    if response.is_success() {
        return serde_json::from_slice(&response.body).map_err(|e| {
            AdapterError::Malformed(format!(
                "the homeserver answered {} with no JSON: {e}",
                response.status
            ))
        });
    }
    let body: ErrorBody = serde_json::from_slice(&response.body).unwrap_or_default();
    let said = format!("{} {}: {}", response.status, body.errcode, body.error);
    Err(match (response.status, body.errcode.as_str()) {
        (429, _) | (_, "M_LIMIT_EXCEEDED") => AdapterError::RateLimited(
            body.retry_after_ms
                .or_else(|| capstan_channel::retry_after_ms(&response))
                .unwrap_or(1000),
        ),
        (401 | 403, _) => AdapterError::Denied(said),
        (413, _) | (_, "M_TOO_LARGE") => AdapterError::TooLong(MAX_TEXT / 2),
        _ => AdapterError::Failed(said),
    })
}

/// Percent-encodes `segment` for a path: room ids hold `!` and `:`, event ids `$`.
fn encode(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Calls the client-server API: `method` on `path` (under `/_matrix/client/v3`).
fn call(
    settings: &Settings,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value, AdapterError> {
    let url = format!(
        "{}/_matrix/client/v3{path}",
        settings.homeserver.trim_end_matches('/')
    );
    let mut request = Request::new(method, &url).max_response_bytes(MAX_RESPONSE_BYTES);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    answer(request.send()?)
}

/// A transaction id made of what is sent: FNV-1a over the fields, as hex.
fn txn_id(parts: &[&str]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain([0xff]) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    format!("capstan-{hash:016x}")
}

/// The messages of a `/sync` answer for `me`, and the rooms it is invited to.
pub fn read_sync(sync: &Value, me: &str) -> Result<(Vec<Inbound>, Vec<String>), AdapterError> {
    let mut messages = Vec::new();
    let joined = sync["rooms"]["join"].as_object();
    for (room, state) in joined.into_iter().flatten() {
        let Some(events) = state["timeline"]["events"].as_array() else {
            continue;
        };
        for event in events {
            if let Some(message) = inbound(room, event, me) {
                messages.push(message);
            }
        }
    }
    let invited = sync["rooms"]["invite"]
        .as_object()
        .map(|rooms| rooms.keys().cloned().collect())
        .unwrap_or_default();
    Ok((messages, invited))
}

/// The message `event` in `room` is, if it is one someone else wrote.
fn inbound(room: &str, event: &Value, me: &str) -> Option<Inbound> {
    if event["type"] != "m.room.message" {
        return None;
    }
    let sender = event["sender"].as_str()?;
    if sender == me {
        return None;
    }
    let id = event["event_id"].as_str()?.to_owned();
    let content = &event["content"];
    let relates = &content["m.relates_to"];
    let (text, edits) = match relates["rel_type"].as_str() {
        Some("m.replace") => (
            content["m.new_content"]["body"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            relates["event_id"].as_str().map(str::to_owned),
        ),
        _ => (
            content["body"].as_str().unwrap_or_default().to_owned(),
            None,
        ),
    };
    let thread = (relates["rel_type"] == "m.thread")
        .then(|| relates["event_id"].as_str().map(str::to_owned))
        .flatten();
    let mentioned = content["m.mentions"]["user_ids"]
        .as_array()
        .is_some_and(|ids| ids.iter().any(|id| id == me))
        || text.contains(me);
    let mut attachments = Vec::new();
    if matches!(
        content["msgtype"].as_str(),
        Some("m.file" | "m.image" | "m.audio" | "m.video")
    ) && let Some(url) = content["url"].as_str()
    {
        attachments.push(Attachment {
            id: url.to_owned(),
            name: content["filename"].as_str().unwrap_or(&text).to_owned(),
            media_type: content["info"]["mimetype"]
                .as_str()
                .unwrap_or("application/octet-stream")
                .to_owned(),
            size: content["info"]["size"].as_u64(),
        });
    }
    Some(Inbound {
        id,
        room: room.to_owned(),
        thread,
        sender: Sender {
            id: sender.to_owned(),
            display_name: None,
        },
        text,
        addressed: mentioned,
        direct: false,
        attachments,
        edits,
        // Matrix has no forwards: a message is its sender's words.
        forwarded_from: None,
        context: None,
    })
}

struct Matrix;

impl Adapter for Matrix {
    fn describe(settings: String) -> Result<Platform, AdapterError> {
        capstan_channel::settings::<Settings>(&settings)?;
        Ok(Platform {
            name: "matrix".into(),
            max_text: MAX_TEXT,
            features: vec![
                Feature::Mentions,
                Feature::Threads,
                Feature::Edits,
                Feature::Typing,
                Feature::Attachments,
                Feature::RateLimits,
            ],
            capabilities: capstan_channel::where_the_channel_grants(),
        })
    }

    fn poll(settings: String, cursor: Option<String>, wait_ms: u32) -> Result<Batch, AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        let Some(since) = cursor else {
            // Where "now" is: nothing said before the bot started is answered.
            let filter = encode(r#"{"room":{"timeline":{"limit":0}}}"#);
            let sync = call(
                &settings,
                Method::Get,
                &format!("/sync?timeout=0&filter={filter}"),
                None,
            )?;
            let next = sync["next_batch"].as_str().map(str::to_owned);
            return Ok(Batch {
                messages: vec![],
                cursor: next,
            });
        };
        let path = format!("/sync?since={}&timeout={wait_ms}", encode(&since));
        let sync = call(&settings, Method::Get, &path, None)?;
        let next = sync["next_batch"]
            .as_str()
            .ok_or_else(|| AdapterError::Malformed("sync: no next_batch".into()))?
            .to_owned();
        let (messages, invited) = read_sync(&sync, &settings.user_id)?;
        if settings.join_on_invite {
            for room in invited {
                call(
                    &settings,
                    Method::Post,
                    &format!("/rooms/{}/join", encode(&room)),
                    Some(json!({})),
                )?;
            }
        }
        Ok(Batch {
            messages,
            cursor: Some(next),
        })
    }

    fn send(settings: String, message: Outbound) -> Result<String, AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        let mut content = json!({ "msgtype": "m.text", "body": message.text });
        match (&message.thread, &message.reply_to) {
            (Some(thread), reply_to) => {
                content["m.relates_to"] = json!({
                    "rel_type": "m.thread",
                    "event_id": thread,
                    "is_falling_back": reply_to.is_none(),
                    "m.in_reply_to": { "event_id": reply_to.as_deref().unwrap_or(thread) },
                });
            }
            (None, Some(reply_to)) => {
                content["m.relates_to"] = json!({ "m.in_reply_to": { "event_id": reply_to } });
            }
            (None, None) => {}
        }
        let txn = txn_id(&[
            &message.room,
            message.thread.as_deref().unwrap_or_default(),
            message.reply_to.as_deref().unwrap_or_default(),
            &message.text,
        ]);
        let path = format!("/rooms/{}/send/m.room.message/{txn}", encode(&message.room));
        let sent = call(&settings, Method::Put, &path, Some(content))?;
        sent["event_id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| AdapterError::Malformed("send: no event_id in its answer".into()))
    }

    fn edit(settings: String, room: String, id: String, text: String) -> Result<(), AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        let content = json!({
            "msgtype": "m.text",
            "body": format!("* {text}"),
            "m.new_content": { "msgtype": "m.text", "body": text },
            "m.relates_to": { "rel_type": "m.replace", "event_id": id },
        });
        let txn = txn_id(&[&room, &id, &text, "edit"]);
        let path = format!("/rooms/{}/send/m.room.message/{txn}", encode(&room));
        call(&settings, Method::Put, &path, Some(content))?;
        Ok(())
    }

    fn typing(settings: String, room: String, _thread: Option<String>) -> Result<(), AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        let path = format!(
            "/rooms/{}/typing/{}",
            encode(&room),
            encode(&settings.user_id)
        );
        call(
            &settings,
            Method::Put,
            &path,
            Some(json!({ "typing": true, "timeout": 10_000 })),
        )?;
        Ok(())
    }
}

capstan_channel::export_adapter!(Matrix);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_gives_others_messages_with_threads_mentions_edits_and_files() {
        let me = "@bot:localhost";
        let sync = json!({
            "next_batch": "s2",
            "rooms": {
                "join": {
                    "!r:localhost": { "timeline": { "events": [
                        {"type": "m.room.message", "event_id": "$1", "sender": "@alice:localhost",
                         "content": {"msgtype": "m.text", "body": "hi @bot:localhost"}},
                        {"type": "m.room.message", "event_id": "$2", "sender": me,
                         "content": {"msgtype": "m.text", "body": "my own"}},
                        {"type": "m.room.member", "event_id": "$3", "sender": "@bob:localhost", "content": {}},
                        {"type": "m.room.message", "event_id": "$4", "sender": "@bob:localhost",
                         "content": {"msgtype": "m.text", "body": "in a thread",
                                     "m.relates_to": {"rel_type": "m.thread", "event_id": "$1"}}},
                        {"type": "m.room.message", "event_id": "$5", "sender": "@alice:localhost",
                         "content": {"msgtype": "m.text", "body": "* fixed",
                                     "m.new_content": {"msgtype": "m.text", "body": "fixed"},
                                     "m.relates_to": {"rel_type": "m.replace", "event_id": "$1"}}},
                        {"type": "m.room.message", "event_id": "$6", "sender": "@bob:localhost",
                         "content": {"msgtype": "m.file", "body": "a.pdf", "url": "mxc://x/y",
                                     "info": {"mimetype": "application/pdf", "size": 9}}}
                    ]}}
                },
                "invite": { "!new:localhost": {} }
            }
        });
        let (messages, invited) = read_sync(&sync, me).unwrap();
        assert_eq!(invited, ["!new:localhost"]);
        let ids: Vec<&str> = messages.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(ids, ["$1", "$4", "$5", "$6"]);
        assert!(messages[0].addressed && !messages[1].addressed);
        assert_eq!(messages[1].thread.as_deref(), Some("$1"));
        assert_eq!(
            (messages[2].text.as_str(), messages[2].edits.as_deref()),
            ("fixed", Some("$1"))
        );
        assert_eq!(messages[3].attachments[0].media_type, "application/pdf");
    }

    #[test]
    fn room_ids_are_encoded_and_a_retry_sends_the_same_transaction() {
        assert_eq!(encode("!r:localhost"), "%21r%3Alocalhost");
        assert_eq!(
            txn_id(&["!r", "", "$1", "hi"]),
            txn_id(&["!r", "", "$1", "hi"])
        );
        assert_ne!(
            txn_id(&["!r", "", "$1", "hi"]),
            txn_id(&["!r", "$1", "", "hi"])
        );
    }

    #[test]
    fn a_rate_limit_says_how_long_to_wait() {
        let response = Response {
            status: 429,
            headers: vec![],
            body: br#"{"errcode":"M_LIMIT_EXCEEDED","error":"Too Many Requests","retry_after_ms":1500}"#.to_vec(),
            truncated: false,
        };
        assert!(matches!(
            answer(response),
            Err(AdapterError::RateLimited(1500))
        ));
    }
}
