//! Recording: any provider's exchanges saved as a script the scripted provider replays.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{
    AnswerSink, BoxFuture, Completion, CompletionRequest, Provider, ProviderError, Script,
    ScriptStep, ScriptToolCall,
};
use crate::secrets::Redactor;
use crate::text::truncate;

/// The longest `when` a recorded step gets: a prefix of the incoming message, enough to
/// tell requests apart without copying whole documents into the script.
const WHEN_PREFIX: usize = 80;

/// Wraps a provider and, after every completion, rewrites `path` with the script so far.
/// Replaying that script with [`ScriptedProvider`](super::ScriptedProvider) answers the
/// same requests the same way.
pub struct Recorder<P> {
    inner: P,
    path: PathBuf,
    script: Mutex<Script>,
    /// The recording leaves the host as a file: it is written redacted.
    redactor: Redactor,
}

impl<P: Provider> Recorder<P> {
    /// Records `inner`'s exchanges into `path`, every value `redactor` knows hidden.
    pub fn new(inner: P, path: &Path, redactor: Redactor) -> Self {
        Recorder {
            inner,
            path: path.to_owned(),
            script: Mutex::new(Script::default()),
            redactor,
        }
    }

    fn record(
        &self,
        request: &CompletionRequest,
        completion: &Completion,
    ) -> Result<(), ProviderError> {
        let incoming = request
            .messages
            .last()
            .map(|m| m.content.trim())
            .unwrap_or("");
        // Redacted before it is cut: a cut value is no longer one the redactor finds.
        let incoming = self.redactor.redact(incoming);
        let when = truncate(&incoming, WHEN_PREFIX).trim();
        let message = &completion.message;
        let step = ScriptStep {
            process: request.process.clone(),
            when: (!when.is_empty()).then(|| when.to_owned()),
            reply: (!message.content.is_empty()).then(|| message.content.clone()),
            tool_calls: message
                .tool_calls
                .iter()
                .map(|call| ScriptToolCall {
                    name: call.name.clone(),
                    arguments: None,
                    arguments_raw: Some(call.arguments.clone()),
                })
                .collect(),
            delay_ms: 0,
            repeat: false,
        };
        let mut script = self.script.lock().unwrap_or_else(|p| p.into_inner());
        script.steps.push(step);
        let text = self.redactor.outbound(script.to_toml());
        std::fs::write(&self.path, text.as_bytes()).map_err(|err| {
            ProviderError::Script(format!(
                "{}: cannot write the recording: {err}",
                self.path.display()
            ))
        })
    }
}

impl<P: Provider> Provider for Recorder<P> {
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
        sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            let completion = self.inner.complete(request, sink).await?;
            self.record(request, &completion)?;
            Ok(completion)
        })
    }

    fn name(&self) -> String {
        format!("recording:{}", self.inner.name())
    }
}
