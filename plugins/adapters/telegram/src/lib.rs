//! Telegram for Capstan: the Bot API over the host's egress.
//!
//! In: `getUpdates` long polling (the cursor is the next update's offset). Out:
//! `sendMessage` (replying in the message's topic), `editMessageText`, `sendChatAction`.
//! The Bot API wants the token in the path (`/bot<TOKEN>/METHOD`): the adapter asks for
//! `/METHOD`, and the host's egress puts the token's path prefix in front
//! (`path_prefix = "/bot{TELEGRAM_TOKEN}"` in `[secrets.TELEGRAM_TOKEN]`), so the adapter
//! never holds it.
//!
//! Settings (`[channels.NAME.settings]`):
//! - `api`: the Bot API's base URL, `https://api.telegram.org` by default;
//! - `bot_username`: the bot's `@name` without the `@`, to tell a mention.

use capstan_channel::{
    Adapter, AdapterError, Attachment, Batch, Feature, Inbound, Outbound, Platform, Sender,
};
use capstan_sdk::http::{Request, Response};
use serde::Deserialize;
use serde_json::{Value, json};

/// The most characters Telegram takes in one message.
pub const MAX_TEXT: u32 = 4096;

/// The most an answer of the Bot API is read: a page of updates is at most 100.
const MAX_RESPONSE_BYTES: usize = 4 << 20;

/// `[channels.NAME.settings]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The Bot API's base URL.
    #[serde(default = "default_api")]
    pub api: String,
    /// The bot's username, without the `@`.
    #[serde(default)]
    pub bot_username: Option<String>,
}

fn default_api() -> String {
    "https://api.telegram.org".into()
}

/// The Bot API's envelope: `ok`, then `result` or the error.
#[derive(Debug, Deserialize)]
struct Envelope {
    ok: bool,
    #[serde(default)]
    result: Value,
    #[serde(default)]
    error_code: Option<u16>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Parameters>,
}

#[derive(Debug, Deserialize)]
struct Parameters {
    #[serde(default)]
    retry_after: Option<u64>,
}

/// One update of `getUpdates`.
#[derive(Debug, Deserialize)]
struct Update {
    update_id: i64,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    edited_message: Option<Message>,
}

#[derive(Debug, Deserialize)]
struct Message {
    message_id: i64,
    #[serde(default)]
    message_thread_id: Option<i64>,
    #[serde(default)]
    is_topic_message: bool,
    #[serde(default)]
    edit_date: Option<i64>,
    #[serde(default)]
    from: Option<User>,
    chat: Chat,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    caption: Option<String>,
    #[serde(default)]
    reply_to_message: Option<Box<Message>>,
    #[serde(default)]
    document: Option<Document>,
    #[serde(default)]
    forward_origin: Option<Value>,
    #[serde(default)]
    forward_from: Option<User>,
    #[serde(default)]
    via_bot: Option<User>,
    #[serde(default)]
    photo: Vec<PhotoSize>,
}

#[derive(Debug, Deserialize)]
struct User {
    id: i64,
    #[serde(default)]
    is_bot: bool,
    #[serde(default)]
    first_name: Option<String>,
    #[serde(default)]
    username: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Chat {
    id: i64,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct Document {
    file_id: String,
    #[serde(default)]
    file_name: Option<String>,
    #[serde(default)]
    mime_type: Option<String>,
    #[serde(default)]
    file_size: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct PhotoSize {
    file_id: String,
    #[serde(default)]
    file_size: Option<u64>,
}

/// The Bot API's answer to a call, or the adapter's error for it.
fn answer(response: Response) -> Result<Value, AdapterError> {
    let envelope: Envelope = serde_json::from_slice(&response.body).map_err(|e| {
        AdapterError::Malformed(format!(
            "the Bot API answered {} with no JSON envelope: {e}",
            response.status
        ))
    })?;
    if envelope.ok {
        return Ok(envelope.result);
    }
    let code = envelope.error_code.unwrap_or(response.status);
    let said = envelope.description.unwrap_or_default();
    Err(match code {
        429 => {
            let seconds = envelope
                .parameters
                .and_then(|p| p.retry_after)
                .or_else(|| capstan_channel::retry_after_ms(&response).map(|ms| ms.div_ceil(1000)))
                .unwrap_or(1);
            AdapterError::RateLimited(seconds.saturating_mul(1000))
        }
        409 => AdapterError::Conflict(said),
        401 | 403 | 404 => AdapterError::Denied(format!("{code}: {said}")),
        400 if said.contains("too long") => AdapterError::TooLong(MAX_TEXT),
        _ => AdapterError::Failed(format!("{code}: {said}")),
    })
}

/// Calls Bot API method `method` with a JSON body.
fn call(settings: &Settings, method: &str, body: Value) -> Result<Value, AdapterError> {
    let url = format!("{}/{method}", settings.api.trim_end_matches('/'));
    let response = Request::post(&url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .max_response_bytes(MAX_RESPONSE_BYTES)
        .send()?;
    answer(response)
}

/// The inbound message of `update`, if it carries one.
fn inbound(update: Update, bot: Option<&str>) -> Option<Inbound> {
    let (message, edited) = match (update.message, update.edited_message) {
        (Some(m), _) => (m, false),
        (None, Some(m)) => (m, true),
        (None, None) => return None,
    };
    // A forward (or a relay by an inline bot) carries someone else's words: who.
    let forwarded_from = first_writer(&message);
    let from = message.from?;
    // Other bots (and this one) are never taken as people talking.
    if from.is_bot {
        return None;
    }
    let text = message.text.or(message.caption).unwrap_or_default();
    let direct = message.chat.kind == "private";
    let mentioned = bot.is_some_and(|bot| {
        let mention = format!("@{bot}");
        text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '@'))
            .any(|word| word.eq_ignore_ascii_case(&mention))
    });
    let replied_to_bot = message.reply_to_message.as_ref().is_some_and(|r| {
        r.from
            .as_ref()
            .is_some_and(|u| u.is_bot && bot.is_some_and(|b| u.username.as_deref() == Some(b)))
    });
    let mut attachments = Vec::new();
    if let Some(doc) = message.document {
        attachments.push(Attachment {
            id: doc.file_id,
            name: doc.file_name.unwrap_or_else(|| "document".into()),
            media_type: doc
                .mime_type
                .unwrap_or_else(|| "application/octet-stream".into()),
            size: doc.file_size,
        });
    }
    // The largest size of a photo is its last.
    if let Some(photo) = message.photo.last() {
        attachments.push(Attachment {
            id: photo.file_id.clone(),
            name: "photo.jpg".into(),
            media_type: "image/jpeg".into(),
            size: photo.file_size,
        });
    }
    // An edit keeps the message's id: each edit is told apart by when it was made, so a
    // second edit is a message of its own.
    let original = message.message_id.to_string();
    let id = match (edited, message.edit_date) {
        (true, Some(at)) => format!("{original}.{at}"),
        (true, None) => format!("{original}.edited"),
        (false, _) => original.clone(),
    };
    Some(Inbound {
        edits: edited.then_some(original),
        id,
        room: message.chat.id.to_string(),
        thread: message
            .message_thread_id
            .filter(|_| message.is_topic_message)
            .map(|t| t.to_string()),
        sender: Sender {
            id: from.id.to_string(),
            display_name: from.username.map(|u| format!("@{u}")).or(from.first_name),
        },
        text,
        addressed: direct || mentioned || replied_to_bot,
        direct,
        attachments,
        forwarded_from,
        context: None,
    })
}

/// Who first wrote `message`, when it was forwarded or relayed by an inline bot: the
/// Bot API's `forward_origin` (a user, a hidden user, a chat or a channel), the older
/// `forward_from`, or `via_bot`.
fn first_writer(message: &Message) -> Option<Sender> {
    let id = |value: &Value| value.as_i64().map(|id| id.to_string());
    if let Some(origin) = &message.forward_origin {
        let (id, name) = match origin["type"].as_str() {
            Some("user") => (
                id(&origin["sender_user"]["id"]),
                origin["sender_user"]["username"].as_str(),
            ),
            Some("hidden_user") => (
                origin["sender_user_name"]
                    .as_str()
                    .map(|n| format!("hidden:{n}")),
                origin["sender_user_name"].as_str(),
            ),
            Some("chat") => (
                id(&origin["sender_chat"]["id"]).map(|c| format!("chat:{c}")),
                None,
            ),
            Some("channel") => (id(&origin["chat"]["id"]).map(|c| format!("chat:{c}")), None),
            _ => (None, None),
        };
        return Some(Sender {
            id: id.unwrap_or_else(|| "forwarded".into()),
            display_name: name.map(str::to_owned),
        });
    }
    let user = message.forward_from.as_ref().or(message.via_bot.as_ref())?;
    Some(Sender {
        id: user.id.to_string(),
        display_name: user.username.clone(),
    })
}

/// A page of `getUpdates`' result read into messages and the next offset.
pub fn read_updates(
    result: Value,
    cursor: Option<String>,
    bot: Option<&str>,
) -> Result<Batch, AdapterError> {
    let updates: Vec<Update> = serde_json::from_value(result)
        .map_err(|e| AdapterError::Malformed(format!("getUpdates: {e}")))?;
    let mut next = cursor;
    let mut messages = Vec::new();
    for update in updates {
        next = Some((update.update_id + 1).to_string());
        messages.extend(inbound(update, bot));
    }
    Ok(Batch {
        messages,
        cursor: next,
    })
}

struct Telegram;

impl Adapter for Telegram {
    fn describe(settings: String) -> Result<Platform, AdapterError> {
        capstan_channel::settings::<Settings>(&settings)?;
        Ok(Platform {
            name: "telegram".into(),
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
        let mut body = json!({
            "timeout": wait_ms / 1000,
            "allowed_updates": ["message", "edited_message"],
        });
        if let Some(offset) = &cursor {
            let offset: i64 = offset.parse().map_err(|_| {
                AdapterError::Failed(format!("cursor `{offset}` is no update offset"))
            })?;
            body["offset"] = json!(offset);
        }
        let result = call(&settings, "getUpdates", body)?;
        read_updates(result, cursor, settings.bot_username.as_deref())
    }

    fn send(settings: String, message: Outbound) -> Result<String, AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        let mut body = json!({ "chat_id": message.room, "text": message.text });
        if let Some(thread) = &message.thread {
            body["message_thread_id"] = json!(thread);
        }
        if let Some(reply_to) = &message.reply_to {
            body["reply_parameters"] =
                json!({ "message_id": reply_to, "allow_sending_without_reply": true });
        }
        let sent = call(&settings, "sendMessage", body)?;
        sent.get("message_id")
            .and_then(Value::as_i64)
            .map(|id| id.to_string())
            .ok_or_else(|| {
                AdapterError::Malformed("sendMessage: no message_id in its result".into())
            })
    }

    fn edit(settings: String, room: String, id: String, text: String) -> Result<(), AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        call(
            &settings,
            "editMessageText",
            json!({ "chat_id": room, "message_id": id, "text": text }),
        )?;
        Ok(())
    }

    fn typing(settings: String, room: String, thread: Option<String>) -> Result<(), AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        let mut body = json!({ "chat_id": room, "action": "typing" });
        if let Some(thread) = thread {
            body["message_thread_id"] = json!(thread);
        }
        call(&settings, "sendChatAction", body)?;
        Ok(())
    }
}

capstan_channel::export_adapter!(Telegram);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_become_messages_and_the_cursor_moves_past_them() {
        let result = json!([
            {"update_id": 10, "message": {"message_id": 1, "from": {"id": 7, "is_bot": false, "username": "alice"},
              "chat": {"id": -100, "type": "supergroup"}, "text": "hi @capbot please"}},
            {"update_id": 11, "message": {"message_id": 2, "from": {"id": 8, "is_bot": true, "username": "other"},
              "chat": {"id": -100, "type": "supergroup"}, "text": "bot noise"}},
            {"update_id": 12, "edited_message": {"message_id": 1, "from": {"id": 7, "is_bot": false},
              "chat": {"id": 7, "type": "private"}, "text": "edited", "edit_date": 1790000060}},
            {"update_id": 13, "channel_post": {}}
        ]);
        let batch = read_updates(result, None, Some("capbot")).unwrap();
        assert_eq!(batch.cursor.as_deref(), Some("14"));
        assert_eq!(batch.messages.len(), 2);
        let first = &batch.messages[0];
        assert!(first.addressed && !first.direct);
        assert_eq!(
            (first.room.as_str(), first.sender.id.as_str()),
            ("-100", "7")
        );
        assert_eq!(batch.messages[1].edits.as_deref(), Some("1"));
        assert_eq!(batch.messages[1].id, "1.1790000060");
        assert!(batch.messages[1].direct);
    }

    #[test]
    fn a_forward_names_who_first_wrote_it() {
        let result = json!([
            {"update_id": 1, "message": {"message_id": 1, "from": {"id": 7, "is_bot": false},
              "chat": {"id": 7, "type": "private"}, "text": "look",
              "forward_origin": {"type": "user", "date": 1, "sender_user": {"id": 999, "is_bot": false, "first_name": "eve"}}}},
            {"update_id": 2, "message": {"message_id": 2, "from": {"id": 7, "is_bot": false},
              "chat": {"id": 7, "type": "private"}, "text": "from a channel",
              "forward_origin": {"type": "channel", "date": 1, "chat": {"id": -100}, "message_id": 5}}},
            {"update_id": 3, "message": {"message_id": 3, "from": {"id": 7, "is_bot": false},
              "chat": {"id": 7, "type": "private"}, "text": "inline", "via_bot": {"id": 55, "is_bot": true, "username": "gif"}}}
        ]);
        let batch = read_updates(result, None, None).unwrap();
        let firsts: Vec<&str> = batch
            .messages
            .iter()
            .map(|m| m.forwarded_from.as_ref().unwrap().id.as_str())
            .collect();
        assert_eq!(firsts, ["999", "chat:-100", "55"]);
    }

    #[test]
    fn a_mention_is_a_whole_word() {
        let result = json!([{"update_id": 1, "message": {"message_id": 1, "from": {"id": 7, "is_bot": false},
            "chat": {"id": -1, "type": "group"}, "text": "mail @capbotx"}}]);
        let batch = read_updates(result, None, Some("capbot")).unwrap();
        assert!(!batch.messages[0].addressed);
    }

    #[test]
    fn a_rate_limit_says_how_long_to_wait() {
        let response = Response {
            status: 429,
            headers: vec![],
            body: br#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}"#.to_vec(),
            truncated: false,
        };
        assert!(matches!(
            answer(response),
            Err(AdapterError::RateLimited(3000))
        ));
    }
}
