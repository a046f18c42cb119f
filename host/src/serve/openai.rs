//! The OpenAI-compatible door: `GET /v1/models` and `POST /v1/chat/completions`, so any
//! client of that API talks to the agent unchanged.
//!
//! The model name picks the agent: `capstan` is a channel, `capstan-cortex` the admin chat.
//! The conversation is the `X-Capstan-Conversation` header, else the `user` field, else
//! `main`. A conversation keeps its own history, so only the last user message of the
//! request is sent; the reply is everything the message's own work answered (its tools,
//! and the workers and branches its turn started, done). Tool activity rides along in a `capstan` field
//! (non-streaming) or in chunks with an empty delta and a `capstan_event` (streaming),
//! which OpenAI clients ignore; every event is on `/v1/events`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::app::{App, user_message};
use super::auth::Caller;
use super::error::{ApiError, ApiJson, ErrorBody};
use super::turn::TurnItem;
use crate::agent::{End, ReplyPart, UserMessage};
use crate::config::TokenScope;
use crate::ids::{ProcessId, ProcessKind};

/// The model that talks in a channel.
pub(crate) const CHANNEL_MODEL: &str = "capstan";
/// The model that talks to the cortex (the admin chat).
pub(crate) const CORTEX_MODEL: &str = "capstan-cortex";
/// The header that names the conversation.
pub(crate) const CONVERSATION_HEADER: &str = "x-capstan-conversation";

/// A model, as `/v1/models` lists it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Model {
    id: &'static str,
    object: &'static str,
    created: i64,
    owned_by: &'static str,
}

/// The models.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ModelList {
    object: &'static str,
    data: Vec<Model>,
}

/// `GET /v1/models`: `capstan` (a channel) and, for an `admin` token, `capstan-cortex`.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses((status = 200, body = ModelList, description = "The models this token may use")))]
pub(crate) async fn models(State(app): State<Arc<App>>, caller: Caller) -> Json<ModelList> {
    let model = |id| Model {
        id,
        object: "model",
        created: app.started,
        owned_by: "capstan",
    };
    let mut data = vec![model(CHANNEL_MODEL)];
    if caller.scope >= TokenScope::Admin {
        data.push(model(CORTEX_MODEL));
    }
    Json(ModelList {
        object: "list",
        data,
    })
}

/// A chat completion request. Fields OpenAI defines that Capstan has no use for
/// (`temperature`, `tools`, ...) are accepted and ignored: the agent's own profile decides
/// its tools.
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct ChatRequest {
    /// `capstan` or `capstan-cortex`.
    model: String,
    /// The conversation so far; only the last `user` message is sent.
    messages: Vec<ChatMessage>,
    /// Stream the reply as chunks.
    #[serde(default)]
    stream: bool,
    /// Names the conversation when no `X-Capstan-Conversation` header does.
    user: Option<String>,
}

/// One message of a chat request.
#[derive(Debug, Deserialize, ToSchema)]
struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`; only the last `user` one is sent.
    role: String,
    /// Text, or parts of which the `text` ones count.
    #[serde(default)]
    content: Content,
}

/// Text, or parts of which the `text` ones count.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
    #[default]
    Null,
}

/// A part of a message's content.
#[derive(Debug, Deserialize, ToSchema)]
struct Part {
    /// `text` counts; other kinds (`image_url`, ...) are ignored.
    #[serde(rename = "type")]
    kind: String,
    /// The text of a `text` part.
    text: Option<String>,
}

impl Content {
    fn text(&self) -> String {
        match self {
            Content::Text(text) => text.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter(|p| p.kind == "text")
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join("\n"),
            Content::Null => String::new(),
        }
    }
}

/// A `chat.completion`: the conversation's reply, once the message's work is over.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChatCompletion {
    /// `chatcmpl-N`.
    id: String,
    /// `chat.completion`.
    object: &'static str,
    /// Unix seconds.
    created: i64,
    /// The model asked for.
    model: String,
    /// One choice.
    choices: Vec<Choice>,
    /// Zeros: the host does not count the model's tokens here.
    usage: Usage,
    /// What the conversation's processes did on the way (not in OpenAI's API).
    capstan: Activity,
}

/// The one choice of a completion.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Choice {
    /// 0.
    index: u32,
    /// The reply.
    message: AssistantMessage,
    /// `stop`.
    finish_reason: &'static str,
}

/// The reply's message.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AssistantMessage {
    /// `assistant`.
    role: &'static str,
    /// Everything the conversation answered, in order.
    content: String,
}

/// Token counts.
#[derive(Debug, Default, Serialize, ToSchema)]
pub(crate) struct Usage {
    /// 0.
    prompt_tokens: u64,
    /// 0.
    completion_tokens: u64,
    /// 0.
    total_tokens: u64,
}

/// A completion's `capstan` field.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Activity {
    /// The conversation, e.g. `channel:main`.
    conversation: String,
    /// The runtime's events of this exchange, as on `/v1/events`.
    #[schema(value_type = Vec<Object>)]
    events: Vec<Value>,
    /// How the exchange stands: `stored` (status 200), or, with status 202,
    /// `not_yet_stored`, `interrupted` or `pending`, as `POST /v1/channels/{name}/messages`
    /// says.
    outcome: &'static str,
    /// What a client should know of an outcome other than `stored`.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// True if the message was sent before with its `Idempotency-Key` header: it was not
    /// taken again, and this is the answer it got.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    repeated: bool,
}

/// `POST /v1/chat/completions`: a message to a conversation, and its reply.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    request_body = ChatRequest,
    params(("X-Capstan-Conversation" = Option<String>, Header, description = "The conversation"), ("Idempotency-Key" = Option<String>, Header, description = "The message's idempotency key: sent again with it, the message is answered again, not taken again")),
    responses((status = 200, body = ChatCompletion, description = "The reply; with `stream`, `text/event-stream` of `chat.completion.chunk`s ending in `[DONE]`"),
        (status = 400, body = ErrorBody, description = "Bad input; the message names the field and what it takes"), (status = 404, body = ErrorBody, description = "No such conversation or model"),
        (status = 202, body = ChatCompletion, description = "Answered, but not yet stored, interrupted, or pending on another host: `capstan.outcome` says which"),
        (status = 503, body = ErrorBody, description = "Not taken (`unavailable`, `not_taken`: nothing stored, send it again), not stored before the host stopped (`not_stored`), or interrupted before any reply (`interrupted`: the message is stored)"),
        (status = 502, body = ErrorBody, description = "The model failed; the message says how")))]
pub(crate) async fn chat_completions(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ChatRequest>,
) -> Result<Response, ApiError> {
    let kind = match request.model.as_str() {
        CHANNEL_MODEL => ProcessKind::Channel,
        CORTEX_MODEL => ProcessKind::Cortex,
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!(
                    "no model `{}`; use `{CHANNEL_MODEL}` (a channel) or `{CORTEX_MODEL}` (the \
                     admin chat); GET /v1/models lists them",
                    crate::text::truncate(other, 64).escape_debug()
                ),
            )
            .param("model"));
        }
    };
    caller.require(if kind == ProcessKind::Cortex {
        TokenScope::Admin
    } else {
        TokenScope::Chat
    })?;
    let name = match headers.get(CONVERSATION_HEADER) {
        Some(value) => value
            .to_str()
            .map_err(|_| ApiError::invalid("X-Capstan-Conversation is not text"))?
            .to_owned(),
        None => request.user.clone().unwrap_or_else(|| "main".to_owned()),
    };
    let conversation =
        ProcessId::conversation(kind, &name).map_err(|msg| ApiError::invalid(msg).param("user"))?;
    let text = request
        .messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .map(|m| m.content.text())
        .unwrap_or_default();
    if text.trim().is_empty() {
        return Err(ApiError::invalid(
            "`messages` has no user message with text; the last one is what is sent",
        )
        .param("messages"));
    }
    let id = format!(
        "chatcmpl-{}",
        app.completions.fetch_add(1, Ordering::Relaxed) + 1
    );
    let created = crate::services::now();
    let message = user_message(text, &headers, None)?;
    if request.stream {
        return Ok(stream(app, conversation, message, id, request.model, created).into_response());
    }
    let answered = app.exchange(conversation.clone(), message).await?;
    let status = answered.outcome.status();
    let completion = ChatCompletion {
        id,
        object: "chat.completion",
        created,
        model: request.model,
        choices: vec![Choice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content: answered.reply,
            },
            finish_reason: "stop",
        }],
        usage: Usage::default(),
        capstan: Activity {
            conversation: conversation.to_string(),
            events: answered.events,
            outcome: answered.outcome.name(),
            note: answered.outcome.note(),
            repeated: answered.repeated,
        },
    };
    Ok((status, Json(completion)).into_response())
}

/// The reply as `chat.completion.chunk`s: a role chunk, text deltas and activity as they
/// come, a `stop` chunk, then `[DONE]`. A model failure with no reply is an `error` chunk.
fn stream(
    app: Arc<App>,
    conversation: ProcessId,
    message: UserMessage,
    id: String,
    model: String,
    created: i64,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let items = app.start_exchange(conversation, message);
    let chunk = move |delta: Value, finish: Option<&str>, extra: Option<(&str, Value)>| {
        let mut chunk = json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if let Some((key, value)) = extra {
            chunk[key] = value;
        }
        SseEvent::default().data(chunk.to_string())
    };
    let state = Streaming {
        items,
        chunk: Box::new(chunk),
        phase: Phase::Start,
        replied: false,
        delivered: false,
        reply_ended: false,
        redactor: app.redactor.clone(),
    };
    let stream = futures_util::stream::unfold(state, |mut state| async move {
        let event = state.next().await?;
        Some((Ok(event), state))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

type Chunk = dyn Fn(Value, Option<&str>, Option<(&str, Value)>) -> SseEvent + Send;

struct Streaming {
    items: tokio::sync::mpsc::UnboundedReceiver<TurnItem>,
    chunk: Box<Chunk>,
    phase: Phase,
    /// Whether any reply text went out.
    replied: bool,
    /// Whether a reply was delivered (not only streamed).
    delivered: bool,
    /// Whether a reply ended since the last text: the next is set off by a blank line.
    reply_ended: bool,
    redactor: crate::secrets::Redactor,
}

#[derive(PartialEq)]
enum Phase {
    Start,
    Body,
    Done,
    Over,
}

impl Streaming {
    /// A content chunk of `text`, set off from a reply before it.
    fn text(&mut self, text: String) -> SseEvent {
        let text = if std::mem::take(&mut self.reply_ended) && self.replied {
            format!("\n\n{text}")
        } else {
            text
        };
        self.replied = true;
        (self.chunk)(json!({"content": text}), None, None)
    }

    /// The last chunk: `stop`, saying how the exchange stands; or the error that ends it.
    fn end(&mut self, end: End) -> SseEvent {
        self.phase = Phase::Done;
        let outcome = match end {
            End::Complete => "stored",
            End::Failed { .. } if self.delivered => "stored",
            End::Interrupted if self.delivered => "interrupted",
            End::Pending { .. } => "pending",
            End::Failed { error } => {
                let error = ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "model_failed",
                    format!("the model gave no answer: {}", self.redactor.redact(&error)),
                );
                return error_event(&error);
            }
            End::Interrupted => {
                let error = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "interrupted",
                    "the host stopped before answering; the message is stored in the \
                     conversation's history and is seen at its next turn",
                );
                return error_event(&error);
            }
            end @ (End::NotStored { .. } | End::Lost) => {
                let code = if end == End::Lost {
                    "not_taken"
                } else {
                    "not_stored"
                };
                let message = self.redactor.redact(&end.to_string()).into_owned();
                let error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message);
                return error_event(&error);
            }
        };
        (self.chunk)(
            json!({}),
            Some("stop"),
            Some(("capstan_outcome", json!(outcome))),
        )
    }

    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            match self.phase {
                Phase::Start => {
                    self.phase = Phase::Body;
                    return Some((self.chunk)(
                        json!({"role": "assistant", "content": ""}),
                        None,
                        None,
                    ));
                }
                Phase::Body => match self.items.recv().await {
                    Some(TurnItem::Part(ReplyPart::Text(text))) => return Some(self.text(text)),
                    Some(TurnItem::Part(ReplyPart::Reply { text, streamed })) => {
                        let shown = (!streamed).then(|| self.text(text));
                        self.reply_ended = true;
                        self.delivered = true;
                        if let Some(shown) = shown {
                            return Some(shown);
                        }
                    }
                    Some(TurnItem::Part(ReplyPart::Activity(event))) => {
                        let event = serde_json::to_value(&event).unwrap_or(Value::Null);
                        return Some((self.chunk)(
                            json!({}),
                            None,
                            Some(("capstan_event", event)),
                        ));
                    }
                    Some(TurnItem::Part(ReplyPart::NotYetStored { .. })) => {}
                    Some(TurnItem::Part(ReplyPart::Repeated { key })) => {
                        let repeated = json!({"type": "repeated", "key": key});
                        return Some((self.chunk)(
                            json!({}),
                            None,
                            Some(("capstan_event", repeated)),
                        ));
                    }
                    Some(TurnItem::Part(ReplyPart::End(end))) => return Some(self.end(end)),
                    Some(TurnItem::NotYetStored(_)) => {
                        self.phase = Phase::Done;
                        return Some((self.chunk)(
                            json!({}),
                            Some("stop"),
                            Some(("capstan_outcome", json!("not_yet_stored"))),
                        ));
                    }
                    Some(TurnItem::Refused(why)) => {
                        self.phase = Phase::Done;
                        let error = ApiError::unavailable(why);
                        return Some(error_event(&error));
                    }
                    None => {
                        self.phase = Phase::Done;
                        let error = ApiError::internal("the exchange ended without saying how");
                        return Some(error_event(&error));
                    }
                },
                Phase::Done => {
                    self.phase = Phase::Over;
                    return Some(SseEvent::default().data("[DONE]"));
                }
                Phase::Over => return None,
            }
        }
    }
}

fn error_event(error: &ApiError) -> SseEvent {
    let body = serde_json::to_string(&error.body()).unwrap_or_default();
    SseEvent::default().data(body)
}
