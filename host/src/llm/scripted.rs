//! The scripted provider: deterministic answers from a [`Script`].

use std::sync::Mutex;
use std::time::Duration;

use super::{
    AnswerSink, BoxFuture, Completion, CompletionRequest, Message, Provider, ProviderError, Role,
    Script, ToolCall,
};
use crate::text::truncate;

/// Plays a [`Script`]. For each request it answers with the first step, in file order,
/// that is for the request's process kind, matches the incoming message, and has not been
/// used (unless it repeats). The same script and the same requests give the same answers.
///
/// ```
/// use capstan_host::llm::{CompletionRequest, Message, Provider, Script, ScriptedProvider, ToolChoice};
///
/// let script = Script::parse(r#"
///     [[step]]
///     process = "channel"
///     when = "hello"
///     reply = "Hi there."
/// "#, "inline").unwrap();
/// let provider = ScriptedProvider::new(script, "inline");
/// let request = CompletionRequest {
///     process: "channel".into(),
///     messages: vec![Message::user("hello!")],
///     tools: vec![].into(),
///     tool_choice: ToolChoice::Auto,
/// };
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let answer = provider.complete(&request, &()).await.unwrap();
/// assert_eq!(answer.message.content, "Hi there.");
/// # });
/// ```
pub struct ScriptedProvider {
    script: Script,
    name: String,
    used: Mutex<Vec<bool>>,
}

impl ScriptedProvider {
    /// A provider playing `script`; `name` labels it in logs and errors.
    pub fn new(script: Script, name: &str) -> Self {
        let used = Mutex::new(vec![false; script.steps.len()]);
        ScriptedProvider {
            script,
            name: name.to_owned(),
            used,
        }
    }

    /// How many steps have not been used.
    pub fn remaining(&self) -> usize {
        self.used
            .lock()
            .unwrap()
            .iter()
            .filter(|used| !**used)
            .count()
    }

    fn pick(&self, request: &CompletionRequest) -> Result<(usize, Duration), ProviderError> {
        let incoming = request
            .messages
            .last()
            .map(|m| m.content.to_lowercase())
            .unwrap_or_default();
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        let found = self.script.steps.iter().enumerate().position(|(i, step)| {
            (step.repeat || !used[i])
                && step.process == request.process
                && step
                    .when
                    .as_ref()
                    .is_none_or(|w| incoming.contains(&w.to_lowercase()))
        });
        let Some(index) = found else {
            let last = request
                .messages
                .last()
                .map(|m| m.content.as_str())
                .unwrap_or("");
            return Err(ProviderError::ScriptExhausted(format!(
                "script {}: no step left for a {} request whose incoming message is \"{}\"; add a \
                 [[step]] with process = \"{}\" (and a `when` that matches it)",
                self.name,
                request.process,
                truncate(last, 120),
                request.process
            )));
        };
        used[index] = true;
        Ok((
            index,
            Duration::from_millis(self.script.steps[index].delay_ms),
        ))
    }
}

impl Provider for ScriptedProvider {
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
        _sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        // Not a stream: the whole answer at once, so the gate's first-chunk wait bounds it.
        Box::pin(async move {
            let (index, delay) = self.pick(request)?;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let step = &self.script.steps[index];
            let tool_calls = step
                .tool_calls
                .iter()
                .enumerate()
                .map(|(i, call)| ToolCall {
                    id: format!("call_{index}_{i}").into(),
                    name: call.name.clone(),
                    arguments: call.arguments_text(),
                })
                .collect();
            Ok(Completion {
                message: Message {
                    role: Role::Assistant,
                    content: step.reply.clone().unwrap_or_default(),
                    tool_calls,
                    tool_call_id: None,
                    key: None,
                    label: Default::default(),
                    held: None,
                },
                tokens: None,
                usage: Default::default(),
            })
        })
    }

    fn name(&self) -> String {
        format!("scripted:{}", self.name)
    }
}
