//! [`App`]: what every handler of the service shares, and the exchanges they run.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::http::StatusCode;
use serde_json::Value;

use super::auth::Access;
use super::branches::Branches;
use super::error::ApiError;
use super::hub::EventHub;
use super::turn::{self, TurnItem};
use crate::agent::{End, ReplyPart, Runtime, UserMessage};
use crate::ids::{MessageKey, ProcessId};
use crate::secrets::Redactor;
use crate::telemetry::TraceParent;

/// What every handler shares.
pub(crate) struct App {
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) hub: Arc<EventHub>,
    pub(crate) branches: Arc<Branches>,
    pub(crate) access: Access,
    /// Every secret's and token's value: nothing served may hold one.
    pub(crate) redactor: Redactor,
    /// When the server started, Unix seconds.
    pub(crate) started: i64,
    /// Chat completions answered, for their ids.
    pub(crate) completions: AtomicU64,
    /// The messaging channels that take pushed events (`POST /hooks/{name}`).
    pub(crate) hooks: Arc<crate::messaging::Hooks>,
}

/// The client's span a request names in its W3C `traceparent` header (none if it names
/// none, or traces are off).
pub(crate) fn trace_parent(headers: &axum::http::HeaderMap) -> TraceParent {
    if !crate::telemetry::traces_on() {
        return TraceParent::none();
    }
    headers
        .get("traceparent")
        .and_then(|value| value.to_str().ok())
        .map(TraceParent::from_header)
        .unwrap_or_default()
}

/// The header that carries a message's idempotency key.
pub(crate) const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// The user's message `text` with the idempotency key a client gave in the
/// `Idempotency-Key` header or in the body's `idempotency_key` (`field`); both must agree.
/// A W3C `traceparent` header makes the client's span the parent of the turn's.
pub(crate) fn user_message(
    text: String,
    headers: &axum::http::HeaderMap,
    field: Option<String>,
) -> Result<UserMessage, ApiError> {
    let header = headers
        .get(IDEMPOTENCY_HEADER)
        .map(|value| {
            value
                .to_str()
                .map(str::to_owned)
                .map_err(|_| ApiError::invalid("Idempotency-Key is not visible ASCII"))
        })
        .transpose()?;
    let key = match (header, field) {
        (Some(header), Some(field)) if header != field => {
            return Err(ApiError::invalid(
                "the Idempotency-Key header and `idempotency_key` differ; send one, or the same",
            )
            .param("idempotency_key"));
        }
        (Some(key), _) | (None, Some(key)) => Some(key.parse::<MessageKey>().map_err(|why| {
            ApiError::invalid(format!("Idempotency-Key: {why}")).param("idempotency_key")
        })?),
        (None, None) => None,
    };
    Ok(UserMessage {
        text,
        key,
        trace: trace_parent(headers),
        label: crate::flow::Label::trusted(),
    })
}

/// A whole exchange: the reply, what happened, and how it ended.
pub(crate) struct Answered {
    /// Every reply of the exchange, set off by blank lines.
    pub(crate) reply: String,
    /// What the conversation's processes did, as events.
    pub(crate) events: Vec<Value>,
    /// Whether what the exchange did is stored.
    pub(crate) outcome: Outcome,
    /// Whether the message was sent before with its idempotency key: answered again,
    /// not taken again.
    pub(crate) repeated: bool,
}

/// How an answered exchange stands.
pub(crate) enum Outcome {
    /// Its work is done and stored: acknowledged as done.
    Stored,
    /// Answered, but the store has not taken it yet: kept in the host, written once the
    /// store is back (the reason).
    NotYetStored(String),
    /// The host stopped before the work the message started was over; what was done is
    /// stored.
    Interrupted,
    /// The message went to the host that answers the conversation; its answer did not
    /// come while the door waited.
    Pending {
        /// The message's number in that host's inbox.
        message: crate::services::ForwardId,
        /// Why the answer is not here.
        reason: String,
    },
}

impl Outcome {
    /// The status an answer with this outcome is served with: 200 only for what is
    /// stored and over.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Outcome::Stored => StatusCode::OK,
            _ => StatusCode::ACCEPTED,
        }
    }

    /// Its name in a response: `stored`, `not_yet_stored`, `interrupted` or `pending`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Outcome::Stored => "stored",
            Outcome::NotYetStored(_) => "not_yet_stored",
            Outcome::Interrupted => "interrupted",
            Outcome::Pending { .. } => "pending",
        }
    }

    /// What a client is told of it, beyond its name.
    pub(crate) fn note(&self) -> Option<String> {
        match self {
            Outcome::Stored => None,
            Outcome::NotYetStored(why) => Some(format!(
                "{why}: the answer is kept in the host and written once the store is back; \
                 do not send the message again"
            )),
            Outcome::Interrupted => Some(
                "the host stopped before the work the message started was over; the message \
                 and what was done are stored"
                    .into(),
            ),
            Outcome::Pending { message, reason } => Some(format!(
                "forwarded as {message} to the host that answers the conversation; {reason}"
            )),
        }
    }
}

impl App {
    /// Starts an exchange: `message` to `conversation`; its items come on the receiver.
    pub(crate) fn start_exchange(
        &self,
        conversation: ProcessId,
        message: UserMessage,
    ) -> tokio::sync::mpsc::UnboundedReceiver<TurnItem> {
        turn::start(self.runtime.clone(), conversation, message)
    }

    /// Runs an exchange to its end. Errors say what happened to the message: refused or
    /// not taken (nothing stored, 503), no answer from the model (502), not stored
    /// before the host stopped (503 `not_stored`), interrupted before any reply (503
    /// `interrupted`, the message stored).
    pub(crate) async fn exchange(
        &self,
        conversation: ProcessId,
        message: UserMessage,
    ) -> Result<Answered, ApiError> {
        let mut items = self.start_exchange(conversation, message);
        let mut replies: Vec<String> = Vec::new();
        let mut events = Vec::new();
        let mut repeated = false;
        let outcome = loop {
            let Some(item) = items.recv().await else {
                return Err(ApiError::internal("the exchange ended without saying how"));
            };
            let part = match item {
                TurnItem::Part(part) => part,
                TurnItem::Refused(why) => return Err(ApiError::unavailable(why)),
                TurnItem::NotYetStored(why) => break Outcome::NotYetStored(why),
            };
            let end = match part {
                ReplyPart::Reply { text, .. } => {
                    replies.push(text);
                    continue;
                }
                ReplyPart::Activity(event) => {
                    events.push(serde_json::to_value(&event).unwrap_or(Value::Null));
                    continue;
                }
                ReplyPart::Repeated { .. } => {
                    repeated = true;
                    continue;
                }
                ReplyPart::Text(_) | ReplyPart::NotYetStored { .. } => continue,
                ReplyPart::End(end) => end,
            };
            break match end {
                End::Complete => Outcome::Stored,
                End::Failed { error } if replies.is_empty() => {
                    return Err(ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "model_failed",
                        format!("the model gave no answer: {}", self.redactor.redact(&error)),
                    ));
                }
                End::Failed { .. } => Outcome::Stored,
                End::Interrupted if replies.is_empty() => {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "interrupted",
                        "the host stopped before answering; the message is stored in the \
                         conversation's history and is seen at its next turn",
                    ));
                }
                End::Interrupted => Outcome::Interrupted,
                End::Pending {
                    message, reason, ..
                } => Outcome::Pending { message, reason },
                end @ End::NotStored { .. } => {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not_stored",
                        self.redactor.redact(&end.to_string()).into_owned(),
                    ));
                }
                End::Lost => {
                    return Err(ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "not_taken",
                        End::Lost.to_string() + "; nothing of it is stored: send it again",
                    ));
                }
            };
        };
        Ok(Answered {
            reply: replies.join("\n\n"),
            events,
            outcome,
            repeated,
        })
    }
}
