//! [`App`]: what every handler of the service shares, and the exchanges they run.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::http::StatusCode;
use serde_json::Value;

use super::auth::Access;
use super::branches::Branches;
use super::error::ApiError;
use super::hub::EventHub;
use super::turn::{self, TurnItem, TurnLocks};
use crate::agent::Runtime;
use crate::ids::ProcessId;
use crate::plugin::Registry;
use crate::secrets::Redactor;

/// What every handler shares.
pub(crate) struct App {
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) hub: Arc<EventHub>,
    pub(crate) branches: Arc<Branches>,
    pub(crate) access: Access,
    /// Every secret's and token's value: nothing served may hold one.
    pub(crate) redactor: Redactor,
    pub(crate) turns: TurnLocks,
    /// When the server started, Unix seconds.
    pub(crate) started: i64,
    /// Chat completions answered, for their ids.
    pub(crate) completions: AtomicU64,
}

/// A whole exchange: the reply and what happened.
pub(crate) struct Exchange {
    pub(crate) reply: String,
    pub(crate) events: Vec<Value>,
}

impl App {
    /// Starts an exchange: `text` to `conversation`; its items come on the receiver.
    pub(crate) fn start_exchange(
        &self,
        conversation: ProcessId,
        text: String,
    ) -> tokio::sync::mpsc::UnboundedReceiver<TurnItem> {
        turn::start(
            self.runtime.clone(),
            self.hub.clone(),
            &self.turns,
            conversation,
            text,
        )
    }

    /// Runs an exchange to its end. A model failure with no reply at all is a 502.
    pub(crate) async fn exchange(
        &self,
        conversation: ProcessId,
        text: String,
    ) -> Result<Exchange, ApiError> {
        let mut items = self.start_exchange(conversation, text);
        let mut reply = String::new();
        let mut events = Vec::new();
        let mut failed = None;
        while let Some(item) = items.recv().await {
            match item {
                TurnItem::Text(text) => reply.push_str(&text),
                TurnItem::Activity(published) => {
                    events.push(serde_json::from_str(&published.json).unwrap_or(Value::Null));
                }
                TurnItem::ModelFailed(error) => failed = Some(error),
                TurnItem::Lost(count) => {
                    tracing::warn!(count, "an exchange lost events to a full buffer");
                }
                TurnItem::Refused(why) => return Err(ApiError::unavailable(why)),
            }
        }
        if reply.is_empty()
            && let Some(error) = failed
        {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "model_failed",
                format!("the model gave no answer: {}", self.redactor.redact(&error)),
            ));
        }
        Ok(Exchange { reply, events })
    }
}
