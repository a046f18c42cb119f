//! The prompt gate: the only code that sends a prompt to a model.
//!
//! Every route that asks a model for its next message (a user message, a retrigger after
//! a worker or branch finished, a worker's or branch's own turns, compaction) goes through
//! [`Dispatcher::dispatch`]. Nothing under `plugin/` can reach it, and no other module
//! holds the provider.

use std::sync::Arc;

use crate::llm::{Completion, CompletionRequest, Provider, ProviderError};

/// Owns the provider and sends every prompt.
pub struct Dispatcher {
    provider: Arc<dyn Provider>,
}

impl Dispatcher {
    /// A gate in front of `provider`.
    pub fn new(provider: Arc<dyn Provider>) -> Self {
        Dispatcher { provider }
    }

    /// The provider's name, for logs.
    pub fn provider_name(&self) -> String {
        self.provider.name()
    }

    /// Sends `request` for `session` (e.g. `channel:main`, `worker:3`) and returns the
    /// model's answer.
    pub async fn dispatch(
        &self,
        session: &str,
        request: &CompletionRequest,
    ) -> Result<Completion, ProviderError> {
        tracing::debug!(session, process = %request.process, messages = request.messages.len(), "dispatch");
        self.provider.complete(request).await
    }
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher")
            .field("provider", &self.provider.name())
            .finish()
    }
}
