//! Slack for Capstan: the Events API in, the Web API out, over the host's egress.
//!
//! In: Slack pushes each event to `POST /hooks/NAME` (the app's Request URL). The host
//! checks Slack's `v0` signature with the signing secret (`[channels.NAME.hook]`), so the
//! adapter never sees it; the adapter reads the event: a `url_verification` is answered
//! with its challenge, a `message` or `app_mention` is a message (an edit,
//! `message_changed`, one of its own), and a bot's message (this one's included) is none.
//! Out: `chat.postMessage` in the message's thread, `chat.update` for edits, with the bot
//! token the egress injects (`header = "Authorization: Bearer {SLACK_TOKEN}"`).
//!
//! Settings (`[channels.NAME.settings]`):
//! - `api`: the Web API's base URL, `https://slack.com/api` by default;
//! - `bot_user_id`: the bot's user id (`U...`), to tell a mention and its own messages;
//!   by default the one Slack names in each event's `authorizations`.

use capstan_channel::{
    Adapter, AdapterError, Attachment, Feature, Inbound, Outbound, Platform, Received, Sender,
};
use capstan_sdk::http::{Request, Response};
use serde::Deserialize;
use serde_json::{Value, json};

/// The most characters one message carries: Slack's advice for `text` (it cuts at 40000).
pub const MAX_TEXT: u32 = 4000;

/// The most an answer of the Web API is read.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// `[channels.NAME.settings]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The Web API's base URL.
    #[serde(default = "default_api")]
    pub api: String,
    /// The bot's user id.
    #[serde(default)]
    pub bot_user_id: Option<String>,
}

fn default_api() -> String {
    "https://slack.com/api".into()
}

/// An event's envelope.
#[derive(Debug, Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    challenge: Option<String>,
    #[serde(default)]
    event: Option<Event>,
    #[serde(default)]
    authorizations: Vec<Authorization>,
}

#[derive(Debug, Deserialize)]
struct Authorization {
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    is_bot: bool,
}

/// A `message` or `app_mention` event (or the message inside a `message_changed`).
#[derive(Debug, Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    subtype: Option<String>,
    #[serde(default)]
    channel: Option<String>,
    #[serde(default)]
    channel_type: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    bot_id: Option<String>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    ts: Option<String>,
    #[serde(default)]
    thread_ts: Option<String>,
    #[serde(default)]
    files: Vec<File>,
    #[serde(default)]
    message: Option<Box<Event>>,
    #[serde(default)]
    edited: Option<Edited>,
}

#[derive(Debug, Deserialize)]
struct Edited {
    ts: String,
}

#[derive(Debug, Deserialize)]
struct File {
    id: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    mimetype: Option<String>,
    #[serde(default)]
    size: Option<u64>,
}

/// Reads one pushed event: its immediate answer and its messages.
pub fn read_event(body: &str, bot: Option<&str>) -> Result<Received, AdapterError> {
    let envelope: Envelope = serde_json::from_str(body)
        .map_err(|e| AdapterError::Malformed(format!("not a Slack event: {e}")))?;
    match envelope.kind.as_str() {
        "url_verification" => {
            let challenge = envelope.challenge.ok_or_else(|| {
                AdapterError::Malformed("a url_verification without its challenge".into())
            })?;
            Ok(Received {
                answer: json!({ "challenge": challenge }).to_string(),
                messages: Vec::new(),
            })
        }
        "event_callback" => {
            let bot = bot.map(str::to_owned).or_else(|| {
                envelope
                    .authorizations
                    .iter()
                    .find(|a| a.is_bot)
                    .and_then(|a| a.user_id.clone())
            });
            let messages = envelope
                .event
                .and_then(|event| inbound(event, bot.as_deref()))
                .into_iter()
                .collect();
            Ok(Received {
                answer: String::new(),
                messages,
            })
        }
        // Other envelopes (app rate limiting notices) bring no message.
        _ => Ok(Received {
            answer: String::new(),
            messages: Vec::new(),
        }),
    }
}

/// The message `event` carries, if it is one a person wrote.
fn inbound(event: Event, bot: Option<&str>) -> Option<Inbound> {
    if !matches!(event.kind.as_str(), "message" | "app_mention") {
        return None;
    }
    let channel = event.channel.clone()?;
    let channel_type = event.channel_type.clone();
    let (message, edits) = match event.subtype.as_deref() {
        None | Some("file_share" | "thread_broadcast") => (event, None),
        Some("message_changed") => {
            let changed = *event.message?;
            let original = changed.ts.clone()?;
            let edited = changed.edited.as_ref()?.ts.clone();
            (
                Event {
                    ts: Some(format!("{original}@{edited}")),
                    ..changed
                },
                Some(original),
            )
        }
        // Joins, topic changes, deletions, bot messages: nobody talking.
        Some(_) => return None,
    };
    if message.bot_id.is_some() {
        return None;
    }
    let user = message.user?;
    if bot == Some(user.as_str()) {
        return None;
    }
    let text = message.text.unwrap_or_default();
    let direct = channel_type.as_deref() == Some("im");
    let mentioned =
        message.kind == "app_mention" || bot.is_some_and(|bot| text.contains(&format!("<@{bot}>")));
    let attachments = message
        .files
        .into_iter()
        .map(|file| Attachment {
            name: file.name.unwrap_or_else(|| file.id.clone()),
            id: file.id,
            media_type: file
                .mimetype
                .unwrap_or_else(|| "application/octet-stream".into()),
            size: file.size,
        })
        .collect();
    Some(Inbound {
        id: message.ts?,
        room: channel,
        thread: message.thread_ts,
        sender: Sender {
            id: user,
            display_name: None,
        },
        text,
        addressed: direct || mentioned,
        direct,
        attachments,
        edits,
        forwarded_from: None,
        context: None,
    })
}

/// What a Web API answer says: its body on `ok`, else the error as the host reads it.
fn answer(response: Response) -> Result<Value, AdapterError> {
    if response.status == 429 {
        let ms = capstan_channel::retry_after_ms(&response).unwrap_or(1000);
        return Err(AdapterError::RateLimited(ms));
    }
    let body: Value = serde_json::from_slice(&response.body).map_err(|e| {
        AdapterError::Malformed(format!(
            "the Web API answered {} with no JSON: {e}",
            response.status
        ))
    })?;
    if body["ok"].as_bool() == Some(true) {
        return Ok(body);
    }
    let error = body["error"].as_str().unwrap_or("unknown_error").to_owned();
    Err(match error.as_str() {
        "ratelimited" => {
            AdapterError::RateLimited(capstan_channel::retry_after_ms(&response).unwrap_or(1000))
        }
        "msg_too_long" => AdapterError::TooLong(MAX_TEXT),
        "invalid_auth" | "not_authed" | "account_inactive" | "token_revoked" | "missing_scope"
        | "not_in_channel" | "channel_not_found" | "is_archived" => AdapterError::Denied(error),
        _ => AdapterError::Failed(error),
    })
}

/// Calls Web API method `method` with a JSON body.
fn call(settings: &Settings, method: &str, body: Value) -> Result<Value, AdapterError> {
    let url = format!("{}/{method}", settings.api.trim_end_matches('/'));
    let response = Request::post(&url)
        .header("content-type", "application/json; charset=utf-8")
        .body(body.to_string())
        .max_response_bytes(MAX_RESPONSE_BYTES)
        .send()?;
    answer(response)
}

struct Slack;

impl Adapter for Slack {
    fn describe(settings: String) -> Result<Platform, AdapterError> {
        capstan_channel::settings::<Settings>(&settings)?;
        Ok(Platform {
            name: "slack".into(),
            max_text: MAX_TEXT,
            features: vec![
                Feature::Mentions,
                Feature::Threads,
                Feature::Edits,
                Feature::Attachments,
                Feature::RateLimits,
            ],
            capabilities: capstan_channel::where_the_channel_grants(),
        })
    }

    fn receive(settings: String, body: String) -> Result<Received, AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        read_event(&body, settings.bot_user_id.as_deref())
    }

    fn send(settings: String, message: Outbound) -> Result<String, AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        let mut body = json!({ "channel": message.room, "text": message.text });
        if let Some(thread) = &message.thread {
            body["thread_ts"] = json!(thread);
        }
        let sent = call(&settings, "chat.postMessage", body)?;
        sent["ts"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| AdapterError::Malformed("chat.postMessage: no ts in its answer".into()))
    }

    fn edit(settings: String, room: String, id: String, text: String) -> Result<(), AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        call(
            &settings,
            "chat.update",
            json!({ "channel": room, "ts": id, "text": text }),
        )?;
        Ok(())
    }
}

capstan_channel::export_adapter!(Slack);

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event: Value) -> String {
        json!({
            "type": "event_callback",
            "event": event,
            "authorizations": [{ "user_id": "UBOT", "is_bot": true }],
        })
        .to_string()
    }

    #[test]
    fn a_challenge_is_answered_and_brings_nothing() {
        let got = read_event(r#"{"type":"url_verification","challenge":"c-1"}"#, None).unwrap();
        assert_eq!(got.answer, r#"{"challenge":"c-1"}"#);
        assert!(got.messages.is_empty());
    }

    #[test]
    fn a_mention_in_a_thread_is_read_with_its_thread_and_files() {
        let body = event(json!({
            "type": "message", "channel": "C1", "channel_type": "channel", "user": "U1",
            "text": "<@UBOT> look", "ts": "2.0", "thread_ts": "1.0",
            "files": [{ "id": "F1", "name": "a.pdf", "mimetype": "application/pdf", "size": 9 }],
        }));
        let message = read_event(&body, None).unwrap().messages.remove(0);
        assert_eq!((message.id.as_str(), message.room.as_str()), ("2.0", "C1"));
        assert_eq!(message.thread.as_deref(), Some("1.0"));
        assert!(message.addressed && !message.direct);
        assert_eq!(message.attachments[0].name, "a.pdf");
    }

    #[test]
    fn bots_and_the_bot_itself_are_not_taken_and_an_edit_is_a_message_of_its_own() {
        for own in [
            json!({ "type": "message", "channel": "C1", "user": "UBOT", "text": "x", "ts": "3.0" }),
            json!({ "type": "message", "channel": "C1", "bot_id": "B1", "user": "U9", "text": "x", "ts": "3.1" }),
            json!({ "type": "message", "subtype": "channel_join", "channel": "C1", "user": "U1", "ts": "3.2" }),
        ] {
            assert!(read_event(&event(own), None).unwrap().messages.is_empty());
        }
        let edit = event(json!({
            "type": "message", "subtype": "message_changed", "channel": "D1", "channel_type": "im",
            "message": { "type": "message", "user": "U1", "text": "fixed", "ts": "4.0",
                         "edited": { "user": "U1", "ts": "5.0" } },
        }));
        let message = read_event(&edit, None).unwrap().messages.remove(0);
        assert_eq!(message.id, "4.0@5.0");
        assert_eq!(message.edits.as_deref(), Some("4.0"));
        assert!(message.direct && message.addressed);
    }

    #[test]
    fn garbage_is_malformed() {
        assert!(matches!(
            read_event("{", None),
            Err(AdapterError::Malformed(_))
        ));
    }
}
