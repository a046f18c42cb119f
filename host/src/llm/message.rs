//! The conversation model shared by every provider (the Chat Completions shape).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::flow::{Held, Label};
use crate::ids::{MessageKey, ToolCallId};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The user, or context the host injects as the user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text (empty for an assistant message that only calls tools).
    #[serde(default)]
    pub content: String,
    /// The tools an assistant message calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<ToolCallId>,
    /// For a user's message: the client's idempotency key, kept with it in the history
    /// so the message is taken once. Never sent to a model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<MessageKey>,
    /// What the host knows of where its text came from and who may read it: a tool
    /// result's origin, a worker report's. Kept with it in the history; never sent to a
    /// model. Trusted and public (left out when stored) for the user's words and the
    /// model's.
    #[serde(default, skip_serializing_if = "Label::is_clear")]
    pub label: Label,
    /// For a tool result the host holds back as a handle: the result's text, while
    /// `content` is the line the model is shown instead. Kept with it in the history;
    /// never sent to a model, and its label is not part of what the process has read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::text(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::text(Role::User, content)
    }

    /// An assistant message with text only.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::text(Role::Assistant, content)
    }

    /// A tool result answering call `call_id`.
    pub fn tool_result(call_id: impl Into<ToolCallId>, content: impl Into<String>) -> Self {
        Message {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
            key: None,
            label: Label::default(),
            held: None,
        }
    }

    /// This message, labelled `label`.
    pub fn labelled(self, label: Label) -> Self {
        Message { label, ..self }
    }

    /// A tool result answering call `call_id` held back as `held`: the model is shown
    /// [`Held::shown`], and the value keeps `label`.
    pub fn held_result(call_id: impl Into<ToolCallId>, held: Held, label: Label) -> Self {
        let shown = Held::shown(held.handle, &held.value, &label);
        Message {
            held: Some(held),
            ..Message::tool_result(call_id, shown).labelled(label)
        }
    }

    /// The label of what a model that is shown this message reads: none for a held
    /// result, whose value it is not shown.
    pub fn read_label(&self) -> &Label {
        static NOTHING: Label = Label::trusted();
        if self.held.is_some() {
            &NOTHING
        } else {
            &self.label
        }
    }

    fn text(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            key: None,
            label: Label::default(),
            held: None,
        }
    }
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; the result message carries it back.
    pub id: ToolCallId,
    /// The tool's name.
    pub name: String,
    /// The arguments exactly as the model wrote them: usually a JSON object, but a model
    /// can write anything, and the host answers invalid JSON with `invalid-args`.
    pub arguments: String,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

/// Whether the model must, may or must not call a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
}

/// One request for the next assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The kind of process asking (`channel`, `worker`, ...); scripts choose steps by it.
    pub process: String,
    /// The conversation so far, system prompt first.
    pub messages: Vec<Message>,
    /// The tools offered: one list per kind of process, shared by its requests.
    pub tools: Arc<[ToolDef]>,
    /// Whether a tool call is required.
    pub tool_choice: ToolChoice,
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Completion {
    /// The assistant message: text, tool calls or both.
    pub message: Message,
    /// Prompt plus completion tokens, when the provider reports them.
    pub tokens: Option<u32>,
    /// The prompt's and the answer's tokens apart, when the provider reports them.
    #[serde(default)]
    pub usage: Usage,
}

/// The tokens of a request's prompt and of its answer, each when the provider reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// The prompt's tokens (`prompt_tokens`).
    pub input: Option<u32>,
    /// The answer's tokens (`completion_tokens`).
    pub output: Option<u32>,
}
