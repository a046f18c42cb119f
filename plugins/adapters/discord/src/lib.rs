//! Discord for Capstan: interactions over HTTP (slash commands), with no gateway.
//!
//! In: Discord pushes each interaction to `POST /hooks/NAME` (the application's
//! Interactions Endpoint URL). The host checks Discord's Ed25519 signature with the
//! application's public key (`[channels.NAME.hook]`); the adapter answers a `PING` with a
//! `PONG`, and a command with a deferred answer (Discord shows "thinking") while the
//! command's text options become a message to the agent. Out: the answer replaces the
//! deferred one, and longer answers follow it, through the interaction's own webhook,
//! whose token (valid for 15 minutes) travels in the message's context: no bot token is
//! needed. The answers mention nobody (`allowed_mentions` empty), whatever the model
//! writes.
//!
//! Settings (`[channels.NAME.settings]`):
//! - `api`: the API's base URL, `https://discord.com/api/v10` by default.

use capstan_channel::{
    Adapter, AdapterError, Attachment, Feature, Inbound, Outbound, Platform, Received, Sender,
};
use capstan_sdk::http::{Method, Request, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The most characters one message carries.
pub const MAX_TEXT: u32 = 2000;

/// The most an answer of the API is read.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// `[channels.NAME.settings]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The API's base URL.
    #[serde(default = "default_api")]
    pub api: String,
}

fn default_api() -> String {
    "https://discord.com/api/v10".into()
}

/// What a reply needs: the interaction's application and token.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Context {
    /// The application's id.
    #[serde(rename = "a")]
    pub application: String,
    /// The interaction's token.
    #[serde(rename = "t")]
    pub token: String,
}

#[derive(Debug, Deserialize)]
struct Interaction {
    #[serde(rename = "type")]
    kind: u8,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    application_id: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    channel_id: Option<String>,
    #[serde(default)]
    guild_id: Option<String>,
    /// Where the command was run: 0 a server, 1 a direct message with the bot, 2 a
    /// private channel (a group or someone else's direct messages, for a user-installed
    /// application).
    #[serde(default)]
    context: Option<u8>,
    #[serde(default)]
    member: Option<Member>,
    #[serde(default)]
    user: Option<User>,
    #[serde(default)]
    data: Option<Data>,
}

#[derive(Debug, Deserialize)]
struct Member {
    user: User,
}

#[derive(Debug, Deserialize)]
struct User {
    id: String,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    global_name: Option<String>,
    #[serde(default)]
    bot: bool,
}

#[derive(Debug, Deserialize)]
struct Data {
    #[serde(default)]
    options: Vec<CommandOption>,
    #[serde(default)]
    resolved: Option<Resolved>,
}

#[derive(Debug, Deserialize)]
struct CommandOption {
    #[serde(rename = "type")]
    kind: u8,
    #[serde(default)]
    value: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Resolved {
    #[serde(default)]
    attachments: std::collections::BTreeMap<String, DiscordAttachment>,
}

#[derive(Debug, Deserialize)]
struct DiscordAttachment {
    id: String,
    filename: String,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    size: Option<u64>,
}

/// An interaction's type: a `PING` from Discord checking the endpoint.
const PING: u8 = 1;
/// An interaction's type: a command.
const APPLICATION_COMMAND: u8 = 2;
/// An answer's type: `PONG`.
const PONG: u8 = 1;
/// An answer's type: the answer will follow (Discord shows that the bot is thinking).
const DEFERRED_CHANNEL_MESSAGE: u8 = 5;
/// An interaction's context: a direct message with the bot.
const BOT_DM: u8 = 1;
/// A command option's type: text.
const STRING_OPTION: u8 = 3;
/// A command option's type: a file.
const ATTACHMENT_OPTION: u8 = 11;

/// Reads one interaction: its immediate answer and its message.
pub fn read_interaction(body: &str) -> Result<Received, AdapterError> {
    let interaction: Interaction = serde_json::from_str(body)
        .map_err(|e| AdapterError::Malformed(format!("not a Discord interaction: {e}")))?;
    match interaction.kind {
        PING => Ok(Received {
            answer: json!({ "type": PONG }).to_string(),
            messages: Vec::new(),
        }),
        APPLICATION_COMMAND => Ok(Received {
            answer: json!({ "type": DEFERRED_CHANNEL_MESSAGE }).to_string(),
            messages: inbound(interaction).into_iter().collect(),
        }),
        other => Err(AdapterError::Malformed(format!(
            "interaction type {other} is not a command; this adapter takes slash commands"
        ))),
    }
}

/// The message a command carries, if a person sent it.
fn inbound(interaction: Interaction) -> Option<Inbound> {
    let user = interaction.member.map(|m| m.user).or(interaction.user)?;
    if user.bot {
        return None;
    }
    let data = interaction.data?;
    let text = data
        .options
        .iter()
        .filter(|o| o.kind == STRING_OPTION)
        .filter_map(|o| o.value.as_ref()?.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let chosen: Vec<&str> = data
        .options
        .iter()
        .filter(|o| o.kind == ATTACHMENT_OPTION)
        .filter_map(|o| o.value.as_ref()?.as_str())
        .collect();
    let attachments = data
        .resolved
        .map(|r| r.attachments)
        .unwrap_or_default()
        .into_values()
        .filter(|a| chosen.contains(&a.id.as_str()))
        .map(|a| Attachment {
            id: a.id,
            name: a.filename,
            media_type: a
                .content_type
                .unwrap_or_else(|| "application/octet-stream".into()),
            size: a.size,
        })
        .collect();
    let context = Context {
        application: interaction.application_id?,
        token: interaction.token?,
    };
    Some(Inbound {
        id: interaction.id?,
        room: interaction.channel_id?,
        thread: None,
        sender: Sender {
            id: user.id,
            display_name: user.global_name.or(user.username),
        },
        text,
        // A command is always to the bot.
        addressed: true,
        // Only a direct message with the bot itself: a group, or another person's direct
        // messages, has others in it.
        direct: interaction.context == Some(BOT_DM)
            || (interaction.context.is_none() && interaction.guild_id.is_none()),
        attachments,
        edits: None,
        forwarded_from: None,
        context: serde_json::to_string(&context).ok(),
    })
}

/// What an API answer says: its body when it succeeded, else the error as the host reads it.
fn answer(response: Response) -> Result<Value, AdapterError> {
    let body: Value = if response.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&response.body).map_err(|e| {
            AdapterError::Malformed(format!(
                "the API answered {} with no JSON: {e}",
                response.status
            ))
        })?
    };
    if response.is_success() {
        return Ok(body);
    }
    let said = body["message"].as_str().unwrap_or_default().to_owned();
    Err(match response.status {
        429 => {
            let seconds = body["retry_after"].as_f64().unwrap_or(1.0).max(0.0);
            AdapterError::RateLimited((seconds * 1000.0).ceil() as u64)
        }
        // 50035: invalid form body, which is what an over-long `content` is.
        400 if body["code"].as_u64() == Some(50035) && body.to_string().contains("content") => {
            AdapterError::TooLong(MAX_TEXT)
        }
        401 | 403 | 404 => AdapterError::Denied(format!("{}: {said}", response.status)),
        status => AdapterError::Failed(format!("{status}: {said}")),
    })
}

struct Discord;

impl Adapter for Discord {
    fn describe(settings: String) -> Result<Platform, AdapterError> {
        capstan_channel::settings::<Settings>(&settings)?;
        Ok(Platform {
            name: "discord".into(),
            max_text: MAX_TEXT,
            features: vec![Feature::Mentions, Feature::Attachments, Feature::RateLimits],
            capabilities: capstan_channel::where_the_channel_grants(),
        })
    }

    fn receive(settings: String, body: String) -> Result<Received, AdapterError> {
        capstan_channel::settings::<Settings>(&settings)?;
        read_interaction(&body)
    }

    fn send(settings: String, message: Outbound) -> Result<String, AdapterError> {
        let settings: Settings = capstan_channel::settings(&settings)?;
        let context: Context = message
            .context
            .as_deref()
            .and_then(|c| serde_json::from_str(c).ok())
            .ok_or_else(|| {
                AdapterError::Failed(
                    "no interaction to answer: Discord's bot answers only its commands".into(),
                )
            })?;
        let hook = format!(
            "{}/webhooks/{}/{}",
            settings.api.trim_end_matches('/'),
            context.application,
            context.token
        );
        // The first part replaces the deferred answer; the rest follow it.
        let (method, url) = if message.reply_to.is_some() {
            (Method::Patch, format!("{hook}/messages/@original"))
        } else {
            (Method::Post, hook)
        };
        let body = json!({ "content": message.text, "allowed_mentions": { "parse": [] } });
        let response = Request::new(method, &url)
            .header("content-type", "application/json")
            .body(body.to_string())
            .max_response_bytes(MAX_RESPONSE_BYTES)
            .send()?;
        let sent = answer(response)?;
        Ok(sent["id"].as_str().unwrap_or_default().to_owned())
    }
}

capstan_channel::export_adapter!(Discord);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_is_answered_with_a_pong() {
        let got = read_interaction(r#"{"type":1,"id":"1","application_id":"A"}"#).unwrap();
        assert_eq!(got.answer, r#"{"type":1}"#);
        assert!(got.messages.is_empty());
    }

    #[test]
    fn a_command_is_deferred_and_read_with_its_text_file_and_token() {
        let body = json!({
            "type": 2, "id": "I1", "application_id": "APP", "token": "tok-1",
            "channel_id": "C1", "guild_id": "G1",
            "member": { "user": { "id": "U1", "username": "alice", "global_name": "Alice" } },
            "data": { "name": "ask", "options": [
                { "name": "question", "type": 3, "value": "what time is it?" },
                { "name": "file", "type": 11, "value": "F1" },
            ], "resolved": { "attachments": {
                "F1": { "id": "F1", "filename": "a.png", "content_type": "image/png", "size": 4 },
            } } },
        })
        .to_string();
        let mut got = read_interaction(&body).unwrap();
        assert_eq!(got.answer, r#"{"type":5}"#);
        let message = got.messages.remove(0);
        assert_eq!((message.id.as_str(), message.room.as_str()), ("I1", "C1"));
        assert_eq!(message.text, "what time is it?");
        assert_eq!(message.sender.display_name.as_deref(), Some("Alice"));
        assert!(message.addressed && !message.direct);
        assert_eq!(message.attachments[0].name, "a.png");
        let context: Context = serde_json::from_str(message.context.as_deref().unwrap()).unwrap();
        assert_eq!(context.token, "tok-1");
    }

    #[test]
    fn only_a_direct_message_with_the_bot_is_direct() {
        let at = |context: u8| {
            json!({
                "type": 2, "id": "I3", "application_id": "APP", "token": "t", "channel_id": "C9",
                "context": context, "user": { "id": "U1" },
                "data": { "options": [{ "type": 3, "value": "hi" }] },
            })
            .to_string()
        };
        let direct = |context| read_interaction(&at(context)).unwrap().messages[0].direct;
        assert!(direct(1));
        assert!(!direct(2), "a group, or someone else's direct messages");
        assert!(!direct(0));
    }

    #[test]
    fn a_bot_and_other_interactions_are_not_messages() {
        let bot = json!({
            "type": 2, "id": "I2", "application_id": "APP", "token": "t", "channel_id": "C1",
            "user": { "id": "B1", "bot": true }, "data": { "options": [] },
        })
        .to_string();
        assert!(read_interaction(&bot).unwrap().messages.is_empty());
        assert!(matches!(
            read_interaction(r#"{"type":3}"#),
            Err(AdapterError::Malformed(_))
        ));
    }
}
