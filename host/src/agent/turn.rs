//! The turn loop every process runs: ask the model, run the tools it calls, feed the
//! results back, until it answers in text, a tool ends the turn, or the turn budget is spent.

use crate::dispatch::Dispatcher;
use crate::llm::{BoxFuture, CompletionRequest, Message, ProviderError, Role, ToolChoice, ToolDef};

/// What a tool call did, for the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolOutcome {
    /// A result (or an error text) for the model; the turn goes on.
    Continue(String),
    /// A result for the model; the turn ends after this round of calls.
    EndTurn(String),
}

/// Runs the tools a process calls.
pub(crate) trait ToolHandler: Send + Sync {
    /// Runs tool `name` with `arguments` (as the model wrote them).
    fn handle<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, ToolOutcome>;

    /// Answers a call of a tool this process was not offered (the model made it up, or
    /// forced it): a denial naming why, never a run.
    fn refuse<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, String>;
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TurnEnd {
    /// The model answered in text with no tool call.
    Text(String),
    /// A tool (reply, skip, set_status done) ended the turn.
    Ended,
    /// The turn budget ran out.
    MaxTurns,
}

/// One process's turn: its identity, prompt and tools.
pub(crate) struct Turn<'a> {
    pub(crate) dispatcher: &'a Dispatcher,
    /// `channel`, `worker`, ...
    pub(crate) process: &'a str,
    /// `channel:main`, `worker:3`, ...
    pub(crate) session: &'a str,
    pub(crate) system: &'a str,
    pub(crate) tools: &'a [ToolDef],
    pub(crate) max_turns: u32,
}

impl Turn<'_> {
    /// Runs the loop over `history`, appending every message it produces. On a provider
    /// error `history` is truncated back to its length before the turn.
    pub(crate) async fn run(
        &self,
        history: &mut Vec<Message>,
        handler: &dyn ToolHandler,
    ) -> Result<TurnEnd, ProviderError> {
        let before = history.len();
        match self.run_inner(history, handler).await {
            Ok(end) => Ok(end),
            Err(err) => {
                history.truncate(before);
                Err(err)
            }
        }
    }

    async fn run_inner(
        &self,
        history: &mut Vec<Message>,
        handler: &dyn ToolHandler,
    ) -> Result<TurnEnd, ProviderError> {
        for _ in 0..self.max_turns {
            repair(history);
            let mut messages = Vec::with_capacity(history.len() + 1);
            messages.push(Message::system(self.system));
            messages.extend(history.iter().cloned());
            let request = CompletionRequest {
                process: self.process.to_owned(),
                messages,
                tools: self.tools.to_vec(),
                tool_choice: ToolChoice::Auto,
            };
            let completion = self.dispatcher.dispatch(self.session, &request).await?;
            let message = completion.message;
            let calls = message.tool_calls.clone();
            let text = message.content.clone();
            history.push(message);
            if calls.is_empty() {
                return Ok(TurnEnd::Text(text));
            }
            let mut ended = false;
            for call in &calls {
                let outcome = if self.tools.iter().any(|t| t.name == call.name) {
                    handler.handle(&call.name, &call.arguments).await
                } else {
                    ToolOutcome::Continue(handler.refuse(&call.name, &call.arguments).await)
                };
                let result = match outcome {
                    ToolOutcome::Continue(text) => text,
                    ToolOutcome::EndTurn(text) => {
                        ended = true;
                        text
                    }
                };
                history.push(Message::tool_result(&call.id, result));
            }
            if ended {
                return Ok(TurnEnd::Ended);
            }
        }
        Ok(TurnEnd::MaxTurns)
    }
}

/// Drops tool calls without results and results without calls, so every request the model
/// sees is well-formed whatever happened to the history before. Returns whether anything
/// was dropped.
pub(crate) fn repair(history: &mut Vec<Message>) -> bool {
    use std::collections::HashSet;
    let answered: HashSet<String> = history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| m.tool_call_id.clone())
        .collect();
    let original_len = history.len();
    let mut called = HashSet::new();
    let mut kept = Vec::with_capacity(original_len);
    let mut dropped_calls = false;
    for mut message in history.drain(..) {
        match message.role {
            Role::Assistant if !message.tool_calls.is_empty() => {
                let before = message.tool_calls.len();
                message.tool_calls.retain(|c| answered.contains(&c.id));
                dropped_calls |= message.tool_calls.len() != before;
                called.extend(message.tool_calls.iter().map(|c| c.id.clone()));
                if message.tool_calls.is_empty() && message.content.is_empty() {
                    continue;
                }
                kept.push(message);
            }
            Role::Tool => {
                if message
                    .tool_call_id
                    .as_ref()
                    .is_some_and(|id| called.contains(id))
                {
                    kept.push(message);
                }
            }
            _ => kept.push(message),
        }
    }
    let changed = dropped_calls || kept.len() != original_len;
    *history = kept;
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;

    fn call(id: &str) -> Message {
        Message {
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: "t".into(),
                arguments: "{}".into(),
            }],
            ..Message::assistant("")
        }
    }

    #[test]
    fn repair_drops_orphaned_calls_and_results_and_keeps_pairs() {
        let mut history = vec![
            Message::user("hi"),
            call("a"),
            Message::tool_result("a", "ok"),
            call("b"),
            Message::tool_result("zzz", "stray"),
            Message::assistant("done"),
        ];
        assert!(repair(&mut history));
        let roles: Vec<_> = history
            .iter()
            .map(|m| (m.role, m.tool_call_id.clone()))
            .collect();
        assert_eq!(
            roles,
            vec![
                (Role::User, None),
                (Role::Assistant, None),
                (Role::Tool, Some("a".into())),
                (Role::Assistant, None),
            ]
        );
    }
}
