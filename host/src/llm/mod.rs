//! Model providers: chat completion with tool calls.
//!
//! - [`Provider`] is the one trait every backend implements. Only the prompt gate
//!   (`dispatch`) calls it; nothing under `plugin/` can reach it.
//! - [`OpenAiProvider`] speaks the OpenAI Chat Completions API (OpenAI, OpenRouter, Ollama,
//!   vLLM, llama.cpp's server), retrying 429 and 5xx with backoff.
//! - [`ScriptedProvider`] plays a script file deterministically: the embedded default, so
//!   the demo and the tests need no network.
//! - [`Recorder`] wraps any provider and saves its exchanges as a script that
//!   [`ScriptedProvider`] replays.

mod error;
mod message;
mod openai;
mod recorder;
mod script;
mod scripted;

use std::future::Future;
use std::pin::Pin;

pub use error::ProviderError;
pub use message::{Completion, CompletionRequest, Message, Role, ToolCall, ToolChoice, ToolDef};
pub use openai::{OpenAiProvider, RetryPolicy};
pub use recorder::Recorder;
pub use script::{Script, ScriptStep, ScriptToolCall};
pub use scripted::ScriptedProvider;

/// A boxed future, so providers can be used as `dyn Provider`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A chat-completion backend.
pub trait Provider: Send + Sync {
    /// One completion: the assistant's next message, with any tool calls.
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>>;

    /// A short name for logs, e.g. `openai:gpt-4o-mini` or `scripted:demo`.
    fn name(&self) -> String;
}

impl<P: Provider + ?Sized> Provider for Box<P> {
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        (**self).complete(request)
    }

    fn name(&self) -> String {
        (**self).name()
    }
}
