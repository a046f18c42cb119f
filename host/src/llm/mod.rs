//! Model providers: chat completion with tool calls.
//!
//! - [`Provider`] is the one trait every backend implements. Only the prompt gate
//!   (`dispatch`) calls it; nothing under `plugin/` can reach it.
//! - [`OpenAiProvider`] speaks the OpenAI Chat Completions API (OpenAI, OpenRouter, Ollama,
//!   vLLM, llama.cpp's server), streaming its answers (Server-Sent Events, parsed by
//!   `sse`), capping their size, and retrying 429 and 5xx with backoff.
//! - [`AnswerSink`] takes the [`Delta`]s a provider reports as its answer arrives.
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
mod sink;
mod sse;

use std::future::Future;
use std::pin::Pin;

pub use error::ProviderError;
pub use message::{
    Completion, CompletionRequest, Message, Role, ToolCall, ToolChoice, ToolDef, Usage,
};
pub use openai::{DEFAULT_MAX_ANSWER_BYTES, OpenAiProvider, RetryPolicy};
pub use recorder::Recorder;
pub use script::{Script, ScriptStep, ScriptToolCall};
pub use scripted::ScriptedProvider;
pub use sink::{AnswerSink, Delta};

/// A boxed future, so providers can be used as `dyn Provider`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A chat-completion backend.
pub trait Provider: Send + Sync {
    /// One completion: the assistant's next message, with any tool calls.
    ///
    /// A provider that streams reports each piece of the answer to `sink` as it arrives
    /// (the prompt gate's timers restart on each); one that does not may ignore `sink`.
    /// Either way the returned completion is the whole answer. Pass `&()` to discard the
    /// deltas.
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
        sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>>;

    /// A short name for logs, e.g. `openai:gpt-4o-mini` or `scripted:demo`.
    fn name(&self) -> String;
}

impl<P: Provider + ?Sized> Provider for std::sync::Arc<P> {
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
        sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        (**self).complete(request, sink)
    }

    fn name(&self) -> String {
        (**self).name()
    }
}

impl<P: Provider + ?Sized> Provider for Box<P> {
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
        sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        (**self).complete(request, sink)
    }

    fn name(&self) -> String {
        (**self).name()
    }
}
