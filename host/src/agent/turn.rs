//! The turn loop every process runs: ask the model, run the tools it calls, feed the
//! results back, until it answers in text, a tool ends the turn, or the turn budget is spent.

use std::fmt;
use std::sync::Arc;

use super::events::{Event, EventSink, TurnEnding};
use super::inbox::RoutedMessage;
use super::process_calls::ProcessCalls;
use crate::dispatch::{DispatchError, DispatchOutcome, Dispatcher, Route, Ticket, TooSlow};
use crate::flow::{HandleId, Handles, Held, Label};
use crate::ids::{ProcessId, ToolCallId};
use crate::llm::{AnswerSink, BoxFuture, CompletionRequest, Message, Role, ToolChoice, ToolDef};
use crate::services::Run;
use crate::telemetry::{TraceParent, spans};

/// What a tool call did, for the loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolOutcome {
    /// A result (or an error text) for the model; the turn goes on.
    Continue(String),
    /// A result for the model; the turn ends after this round of calls.
    EndTurn(String),
    /// The reply was delivered to the user: the turn ends after this round, and its
    /// messages collapse into one assistant message with this text.
    Delivered(String),
}

/// Runs the tools a process calls.
pub(crate) trait ToolHandler: Send + Sync {
    /// Runs tool `name` with `arguments` (as the model wrote them), called by a model that
    /// had read what is labelled `context`, while the process holds `handles`: the
    /// outcome, and the label of its text.
    fn handle<'a>(
        &'a self,
        name: &'a str,
        arguments: &'a str,
        context: &'a Label,
        handles: &'a Handles,
    ) -> BoxFuture<'a, (ToolOutcome, Label)>;

    /// Whether the result `text` of tool `name`, labelled `label`, is held back from the
    /// model as a handle (`[profiles.KIND.handles]`).
    fn holds(&self, _name: &str, _text: &str, _label: &Label) -> bool {
        false
    }

    /// Answers a call of a tool this process was not offered (the model made it up, or
    /// forced it): a denial naming why, never a run.
    fn refuse<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, String>;

    /// The plugin instances the process keeps and the audit rows of its calls, if any:
    /// the instances are marked as working while a round of tool calls runs, so another
    /// process's call does not take them meanwhile, and the round's results go on (to the
    /// model, or to the end of the turn) only once its audit rows are committed.
    fn calls(&self) -> Option<&ProcessCalls> {
        None
    }

    /// Messages that arrived for the process while it worked, taken at a turn boundary
    /// (after a round of tool results, before the next request). Any: the turn ends so
    /// they can be added as context.
    fn injected(&self) -> Vec<RoutedMessage> {
        Vec::new()
    }
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TurnEnd {
    /// The model answered in text with no tool call.
    Text(String),
    /// A tool (skip, set_status) ended the turn.
    Ended,
    /// `reply` delivered this text; the turn's messages collapsed into it.
    Delivered(String),
    /// Messages arrived at a turn boundary; the turn stopped there with every tool call
    /// answered.
    Injected(Vec<RoutedMessage>),
    /// The turn budget ran out.
    MaxTurns,
}

/// A turn that failed; its history is back to where it started.
#[derive(Debug)]
pub(crate) struct TurnError {
    pub(crate) reason: Unanswered,
    /// Requests of the turn the model answered before the failure (0: the messages added
    /// before the turn never got an answer).
    pub(crate) answered: u32,
}

/// Why a request got no answer.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// The session was busy or held by someone else, who answers instead.
    Suppressed(String),
    /// The model did not answer in time: which bound, and the key that raises it.
    TimedOut(TooSlow),
    /// The dispatch failed.
    Failed(DispatchError),
}

impl TurnError {
    /// A turn that could not start because `why`.
    pub(crate) fn suppressed(why: impl Into<String>) -> Self {
        TurnError {
            reason: Unanswered::Suppressed(why.into()),
            answered: 0,
        }
    }
}

impl fmt::Display for TurnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Unanswered::Suppressed(why) => write!(f, "not sent: {why}"),
            Unanswered::TimedOut(late) => write!(f, "the model did not answer in time: {late}"),
            Unanswered::Failed(err) => write!(f, "{err}"),
        }
    }
}

/// One process's turn: its identity, prompt and tools.
pub(crate) struct Turn<'a> {
    pub(crate) dispatcher: &'a Dispatcher,
    /// The reservation of the session (`main`, `worker:3`, ...) the turn prompts.
    pub(crate) ticket: &'a Ticket,
    /// Why the turn's first request is sent; later rounds are continuations.
    pub(crate) route: Route,
    /// The process whose turn it is.
    pub(crate) process: &'a ProcessId,
    /// Where [`Event::TurnStarted`] and [`Event::TurnFinished`] go.
    pub(crate) events: &'a EventSink,
    pub(crate) system: &'a str,
    pub(crate) tools: &'a Arc<[ToolDef]>,
    pub(crate) max_turns: u32,
    /// Where the pieces of each answer go as the model streams them (`&()`: nowhere).
    pub(crate) deltas: &'a dyn AnswerSink,
    /// The host's run: no request is sent once its lease is not live.
    pub(crate) run: &'a Run,
    /// What started the turn (a message's sender, the turn that spawned the process):
    /// the parent of its span.
    pub(crate) trace: TraceParent,
}

impl Turn<'_> {
    /// Runs the loop over `history`, appending every message it produces, so that every
    /// tool call it leaves has its result:
    /// - a delivered reply: the turn's messages become one assistant message, the reply;
    /// - an error: `history` is truncated back to its length before the turn;
    /// - max turns or an injection: what the turn produced stays, results included.
    pub(crate) async fn run(
        &self,
        history: &mut Vec<Message>,
        handler: &dyn ToolHandler,
    ) -> Result<TurnEnd, TurnError> {
        let before = history.len();
        self.events.emit(Event::TurnStarted {
            process: self.process.clone(),
            route: self.route,
        });
        let conversation = handler.calls().map(|calls| calls.conversation.as_str());
        let mut span = spans::turn(&self.trace, self.process, conversation);
        let ended = span.parent().scope(self.run_inner(history, handler)).await;
        if let Err(err) = &ended {
            span.fail(match err.reason {
                Unanswered::Suppressed(_) => "suppressed",
                Unanswered::TimedOut(_) => "timeout",
                Unanswered::Failed(_) => "dispatch_failed",
            });
        }
        drop(span);
        self.events.emit(Event::TurnFinished {
            process: self.process.clone(),
            end: match &ended {
                Ok(TurnEnd::Text(_)) => TurnEnding::Answered,
                Ok(TurnEnd::Delivered(_)) => TurnEnding::Replied,
                Ok(TurnEnd::Ended) => TurnEnding::Ended,
                Ok(TurnEnd::Injected(_)) => TurnEnding::Injected,
                Ok(TurnEnd::MaxTurns) => TurnEnding::OutOfTurns,
                Err(_) => TurnEnding::Unanswered,
            },
        });
        match ended {
            Ok(TurnEnd::Delivered(text)) => {
                // The reply stands for what the turn read: it keeps the turn's labels.
                let read = Label::join_all(history[before..].iter().map(Message::read_label));
                history.truncate(before);
                history.push(Message::assistant(text.clone()).labelled(read));
                Ok(TurnEnd::Delivered(text))
            }
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
    ) -> Result<TurnEnd, TurnError> {
        let mut route = self.route;
        for answered in 0..self.max_turns {
            let unanswered = |reason| TurnError { reason, answered };
            // Checked by this host's own clock, not the database: a host paused past its
            // lease sends at most the request it was about to send when it stopped.
            if !self.run.is_live() {
                return Err(unanswered(Unanswered::Suppressed(format!(
                    "this host's {} lease is not live, so it may not act for the session \
                     (another host takes it over once the lease expires)",
                    self.run.id()
                ))));
            }
            repair(history);
            let mut messages = Vec::with_capacity(history.len() + 1);
            messages.push(Message::system(self.system));
            messages.extend(history.iter().cloned());
            let request = CompletionRequest {
                process: self.process.kind().as_str().to_owned(),
                messages,
                tools: self.tools.clone(),
                tool_choice: ToolChoice::Auto,
            };
            let sent = self
                .dispatcher
                .send_streaming(self.ticket, route, &request, self.deltas);
            let completion = match sent.await {
                DispatchOutcome::Dispatched(completion) => completion,
                DispatchOutcome::Active => {
                    return Err(unanswered(Unanswered::Suppressed(
                        "the session is busy".into(),
                    )));
                }
                DispatchOutcome::Reserved { by } => {
                    return Err(unanswered(Unanswered::Suppressed(format!(
                        "the session is held by {by}"
                    ))));
                }
                DispatchOutcome::TimedOut(late) => {
                    return Err(unanswered(Unanswered::TimedOut(late)));
                }
                DispatchOutcome::Failed { error, .. } => {
                    return Err(unanswered(Unanswered::Failed(error)));
                }
            };
            route = Route::Continuation;
            let message = completion.message;
            let calls = message.tool_calls.clone();
            let text = message.content.clone();
            history.push(message);
            if calls.is_empty() {
                return Ok(TurnEnd::Text(text));
            }
            // The same check before any tool runs: a host that was paused while the model
            // answered acts on nothing it said.
            if !self.run.is_live() {
                return Err(unanswered(Unanswered::Suppressed(format!(
                    "this host's {} lease is not live, so the tools the model called were not run",
                    self.run.id()
                ))));
            }
            let mut ended = None;
            let process_calls = handler.calls();
            let working = process_calls.map(|calls| calls.instances.working());
            // What the model had read when it wrote these calls: every one of them is
            // checked against it, whatever the others return.
            let context = context_label(history);
            let handles = handles(history);
            // Worked out at the first result held: it reads the whole history.
            let mut next_handle: Option<HandleId> = None;
            for call in &calls {
                let (outcome, label) = {
                    let _running = self.dispatcher.gate().tool_running(self.ticket.session());
                    if self.tools.iter().any(|t| t.name == call.name) {
                        handler
                            .handle(&call.name, &call.arguments, &context, &handles)
                            .await
                    } else {
                        let refused = handler.refuse(&call.name, &call.arguments).await;
                        (ToolOutcome::Continue(refused), Label::trusted())
                    }
                };
                let result = match outcome {
                    ToolOutcome::Continue(text) => text,
                    ToolOutcome::EndTurn(text) => {
                        ended.get_or_insert(TurnEnd::Ended);
                        text
                    }
                    ToolOutcome::Delivered(reply) => {
                        ended = Some(TurnEnd::Delivered(reply));
                        "delivered".to_owned()
                    }
                };
                let message = if handler.holds(&call.name, &result, &label) {
                    let handle = *next_handle.get_or_insert_with(|| {
                        handles.next_id(history.iter().flat_map(|m| {
                            let calls = m.tool_calls.iter().map(|c| c.arguments.as_str());
                            std::iter::once(m.content.as_str()).chain(calls)
                        }))
                    });
                    next_handle = Some(handle.next());
                    let held = Held {
                        handle,
                        value: result.into(),
                    };
                    Message::held_result(call.id.clone(), held, label)
                } else {
                    Message::tool_result(call.id.clone(), result).labelled(label)
                };
                history.push(message);
            }
            drop(working);
            if let Some(calls) = process_calls {
                calls.committed().await;
            }
            if let Some(end) = ended {
                return Ok(end);
            }
            let injected = handler.injected();
            if !injected.is_empty() {
                return Ok(TurnEnd::Injected(injected));
            }
        }
        Ok(TurnEnd::MaxTurns)
    }
}

/// What a process has read: the join of the labels of its history (the system prompt
/// is the operator's, trusted), but for the held results it was not shown.
pub(crate) fn context_label(history: &[Message]) -> Label {
    Label::join_all(history.iter().map(Message::read_label))
}

/// The handles a process holds: the held results of its history.
pub(crate) fn handles(history: &[Message]) -> Handles {
    Handles::new(history.iter().filter_map(|message| {
        let held = message.held.as_ref()?;
        Some((held.handle, held.value.clone(), message.label.clone()))
    }))
}

/// Drops tool calls without results and results without calls, so every request the model
/// sees is well-formed whatever happened to the history before. Returns whether anything
/// was dropped.
pub(crate) fn repair(history: &mut Vec<Message>) -> bool {
    use std::collections::HashSet;
    // The usual case, checked without building anything: it runs before every request.
    if in_pairs(history) {
        return false;
    }
    let answered: HashSet<ToolCallId> = history
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| m.tool_call_id.clone())
        .collect();
    let original_len = history.len();
    let mut called = HashSet::new();
    let mut kept = Vec::with_capacity(original_len);
    let mut dropped_calls = false;
    // What a dropped message was labelled stays in the context: the model may have read it.
    let mut dropped = Label::trusted();
    for mut message in history.drain(..) {
        match message.role {
            Role::Assistant if !message.tool_calls.is_empty() => {
                let before = message.tool_calls.len();
                message.tool_calls.retain(|c| answered.contains(&c.id));
                dropped_calls |= message.tool_calls.len() != before;
                called.extend(message.tool_calls.iter().map(|c| c.id.clone()));
                if message.tool_calls.is_empty() && message.content.is_empty() {
                    dropped.join(message.read_label());
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
                } else {
                    dropped.join(message.read_label());
                }
            }
            _ => kept.push(message),
        }
    }
    if let Some(first) = kept.first_mut() {
        first.label.join(&dropped);
    }
    let changed = dropped_calls || kept.len() != original_len;
    *history = kept;
    changed
}

/// Whether every assistant message that calls tools is followed at once by one result for
/// each of its calls, and every result follows its call so: then [`repair`] keeps all.
fn in_pairs(history: &[Message]) -> bool {
    let mut rest = history;
    while let Some((message, after)) = rest.split_first() {
        rest = after;
        match message.role {
            Role::Tool => return false,
            Role::Assistant if !message.tool_calls.is_empty() => {
                let calls = &message.tool_calls;
                let Some((results, after)) = rest.split_at_checked(calls.len()) else {
                    return false;
                };
                for (i, result) in results.iter().enumerate() {
                    let answers = |id: &ToolCallId| {
                        calls.iter().any(|c| &c.id == id)
                            && !results[..i]
                                .iter()
                                .any(|r| r.tool_call_id.as_ref() == Some(id))
                    };
                    if result.role != Role::Tool
                        || !result.tool_call_id.as_ref().is_some_and(answers)
                    {
                        return false;
                    }
                }
                rest = after;
            }
            _ => {}
        }
    }
    true
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

/// Property: whatever a turn meets (tool calls that go on, end the turn or deliver a
/// reply, calls of tools never offered, provider errors, injections, the turn budget), the
/// history never holds a tool call without its result, and the next turn succeeds.
#[cfg(test)]
mod properties {
    use std::collections::{HashSet, VecDeque};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::dispatch::GateSettings;
    use crate::llm::{AnswerSink, Completion, Provider, ProviderError, ToolCall};

    #[derive(Debug, Clone, Copy)]
    enum Tool {
        /// Offered; the turn goes on.
        Go,
        /// Offered; ends the turn (skip, set_status).
        Stop,
        /// Offered; delivers a reply.
        Reply,
        /// Not offered: refused.
        Ghost,
    }

    #[derive(Debug, Clone)]
    enum Answer {
        Text,
        Calls(Vec<Tool>),
        Error,
    }

    fn answer() -> impl Strategy<Value = Answer> {
        let tool = prop_oneof![
            Just(Tool::Go),
            Just(Tool::Stop),
            Just(Tool::Reply),
            Just(Tool::Ghost)
        ];
        prop_oneof![
            1 => Just(Answer::Text),
            1 => Just(Answer::Error),
            4 => prop::collection::vec(tool, 1..4).prop_map(Answer::Calls),
        ]
    }

    /// Plays planned answers (then text), and notes any malformed request it receives.
    #[derive(Default)]
    struct Planned {
        answers: Mutex<VecDeque<Answer>>,
        next_id: AtomicUsize,
        malformed: AtomicBool,
    }

    impl Provider for Planned {
        fn complete<'a>(
            &'a self,
            request: &'a CompletionRequest,
            _sink: &'a dyn AnswerSink,
        ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
            if let Err(why) = well_formed(&request.messages) {
                #[allow(clippy::disallowed_macros)] // a test's own diagnostics
                {
                    eprintln!("malformed request: {why}");
                }
                self.malformed.store(true, Ordering::SeqCst);
            }
            let answer = self
                .answers
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Answer::Text);
            let message = match answer {
                Answer::Text => Ok(Message::assistant("text")),
                Answer::Error => Err(ProviderError::Config("planned failure".into())),
                Answer::Calls(tools) => Ok(Message {
                    tool_calls: tools
                        .iter()
                        .map(|tool| ToolCall {
                            id: format!("c{}", self.next_id.fetch_add(1, Ordering::SeqCst)).into(),
                            name: format!("{tool:?}").to_lowercase(),
                            arguments: "{}".into(),
                        })
                        .collect(),
                    ..Message::assistant("")
                }),
            };
            Box::pin(async move {
                message.map(|message| Completion {
                    message,
                    tokens: None,
                    usage: Default::default(),
                })
            })
        }

        fn name(&self) -> String {
            "planned".into()
        }
    }

    struct Tools {
        injections: Mutex<VecDeque<bool>>,
    }

    impl ToolHandler for Tools {
        fn handle<'a>(
            &'a self,
            name: &'a str,
            _: &'a str,
            _: &'a Label,
            _: &'a Handles,
        ) -> BoxFuture<'a, (ToolOutcome, Label)> {
            let outcome = match name {
                "go" => ToolOutcome::Continue("went".into()),
                "stop" => ToolOutcome::EndTurn("stopped".into()),
                "reply" => ToolOutcome::Delivered("the reply".into()),
                other => unreachable!("{other} is not offered"),
            };
            Box::pin(async move { (outcome, Label::trusted()) })
        }

        fn refuse<'a>(&'a self, name: &'a str, _: &'a str) -> BoxFuture<'a, String> {
            Box::pin(async move { format!("error[denied]: {name}") })
        }

        fn injected(&self) -> Vec<RoutedMessage> {
            match self.injections.lock().unwrap().pop_front() {
                Some(true) => vec![RoutedMessage::trusted("routed")],
                _ => Vec::new(),
            }
        }
    }

    /// Every tool call answered exactly once, after it; every result after its call.
    fn well_formed(history: &[Message]) -> Result<(), String> {
        let mut open = HashSet::new();
        let mut answered = HashSet::new();
        for (i, message) in history.iter().enumerate() {
            match message.role {
                Role::Assistant => {
                    if let Some(id) = open.iter().next() {
                        return Err(format!("call {id} unanswered before message {i}"));
                    }
                    open.extend(message.tool_calls.iter().map(|c| c.id.clone()));
                }
                Role::Tool => {
                    let id = message.tool_call_id.clone().unwrap_or_default();
                    if !open.remove(&id) || !answered.insert(id.clone()) {
                        return Err(format!("result {id} at {i} has no open call"));
                    }
                }
                _ => {}
            }
        }
        match open.iter().next() {
            Some(id) => Err(format!("call {id} unanswered at the end")),
            None => Ok(()),
        }
    }

    fn defs() -> Arc<[ToolDef]> {
        ["go", "stop", "reply"]
            .iter()
            .map(|name| ToolDef {
                name: (*name).into(),
                description: String::new(),
                parameters: serde_json::json!({ "type": "object" }),
            })
            .collect()
    }

    type TurnPlan = (Vec<Answer>, u32, Vec<bool>);

    fn run_plan(turns: Vec<TurnPlan>) -> Result<(), TestCaseError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let provider = Arc::new(Planned::default());
            let settings = GateSettings {
                settle: Duration::ZERO,
                timeout: Duration::from_secs(5),
                hold: Duration::ZERO,
                ..GateSettings::default()
            };
            let dispatcher = Dispatcher::new(provider.clone(), settings);
            let ticket = dispatcher.reserve("s", "s:loop").unwrap();
            let run = Run::new(crate::services::RunId::new(1), ());
            let tools = defs();
            let mut history = Vec::new();
            for (answers, max_turns, injections) in turns.into_iter().chain([(vec![], 1, vec![])]) {
                let last = answers.is_empty();
                *provider.answers.lock().unwrap() = answers.into();
                let handler = Tools {
                    injections: Mutex::new(injections.into()),
                };
                history.push(Message::user("go on"));
                let before = history.len();
                let (events, _watched) = EventSink::new();
                let process = ProcessId::channel("main");
                let turn = Turn {
                    dispatcher: &dispatcher,
                    ticket: &ticket,
                    route: Route::User,
                    process: &process,
                    events: &events,
                    system: "test",
                    tools: &tools,
                    max_turns,
                    deltas: &(),
                    run: &run,
                    trace: TraceParent::none(),
                };
                let end = turn.run(&mut history, &handler).await;
                prop_assert!(well_formed(&history).is_ok(), "{:?}", well_formed(&history));
                match &end {
                    Err(_) => prop_assert_eq!(history.len(), before, "an error truncates"),
                    Ok(TurnEnd::Delivered(text)) => {
                        prop_assert_eq!(history.len(), before + 1);
                        prop_assert_eq!(&history[before].content, text);
                        prop_assert!(history[before].tool_calls.is_empty());
                    }
                    Ok(_) => prop_assert!(history.len() > before),
                }
                if last {
                    // The turn after whatever happened before succeeds.
                    prop_assert!(matches!(end, Ok(TurnEnd::Text(_))), "{:?}", end);
                }
            }
            prop_assert!(!provider.malformed.load(Ordering::SeqCst));
            Ok(())
        })
    }

    /// A message of a small alphabet: user text, an assistant calling some of three ids,
    /// or a result for one of them.
    fn any_message() -> impl Strategy<Value = Message> {
        let id = prop_oneof![Just("a"), Just("b"), Just("c")];
        prop_oneof![
            Just(Message::user("u")),
            prop::collection::vec(id.clone(), 0..3).prop_map(|ids| Message {
                tool_calls: ids
                    .into_iter()
                    .map(|id| ToolCall {
                        id: id.into(),
                        name: "t".into(),
                        arguments: "{}".into(),
                    })
                    .collect(),
                ..Message::assistant("x")
            }),
            id.prop_map(|id| Message::tool_result(id, "r")),
        ]
    }

    /// Well-paired turns (a call, then its results in any order), then one random message
    /// moved, dropped or added: histories at the edge of being in pairs.
    fn near_pairs() -> impl Strategy<Value = Vec<Message>> {
        let turn = (
            prop::sample::subsequence(vec!["a", "b", "c"], 0..=3),
            any::<bool>(),
        )
            .prop_map(|(ids, reversed)| {
                let call = Message {
                    tool_calls: ids
                        .iter()
                        .map(|id| ToolCall {
                            id: (*id).into(),
                            name: "t".into(),
                            arguments: "{}".into(),
                        })
                        .collect(),
                    ..Message::assistant("x")
                };
                let mut results: Vec<Message> = ids
                    .iter()
                    .map(|id| Message::tool_result(*id, "r"))
                    .collect();
                if reversed {
                    results.reverse();
                }
                let mut turn = vec![Message::user("u"), call];
                turn.extend(results);
                turn
            });
        (
            prop::collection::vec(turn, 0..4),
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            0..4u8,
            any_message(),
        )
            .prop_map(|(turns, from, to, how, extra)| {
                let mut history: Vec<Message> = turns.into_iter().flatten().collect();
                if !history.is_empty() {
                    let (i, j) = (from.index(history.len()), to.index(history.len()));
                    match how {
                        0 => history.swap(i, j),
                        1 => drop(history.remove(i)),
                        2 => history.insert(i, extra),
                        _ => {}
                    }
                }
                history
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn a_history_in_pairs_is_one_repair_keeps_whole(
            history in prop_oneof![prop::collection::vec(any_message(), 0..12), near_pairs()]
        ) {
            if in_pairs(&history) {
                let mut repaired = history.clone();
                let mut slow = history.clone();
                // The full repair, without the shortcut, keeps it all too.
                let answered_all = {
                    slow.push(Message::user("end"));
                    slow.insert(0, Message::tool_result("zz", "stray"));
                    repair(&mut slow);
                    slow.remove(slow.len() - 1);
                    slow == history
                };
                prop_assert!(!repair(&mut repaired));
                prop_assert_eq!(&repaired, &history);
                prop_assert!(answered_all, "{:?}", history);
            }
        }

        #[test]
        fn the_history_stays_well_formed_and_the_next_turn_succeeds(
            turns in prop::collection::vec(
                (prop::collection::vec(answer(), 0..6), 1u32..5, prop::collection::vec(any::<bool>(), 0..4)),
                1..8,
            )
        ) {
            run_plan(turns)?;
        }
    }

    #[tokio::test]
    async fn no_request_goes_out_once_the_hosts_lease_is_not_live() {
        let provider = Arc::new(Planned::default());
        // Taken by the first request, if one went out.
        provider.answers.lock().unwrap().push_back(Answer::Text);
        let dispatcher = Dispatcher::new(provider.clone(), GateSettings::default());
        let ticket = dispatcher.reserve("s", "s:loop").unwrap();
        let lease = crate::services::LeaseClock::new(std::time::Instant::now());
        let run = Run::leased(crate::services::RunId::new(4), (), lease);
        let (events, _watched) = EventSink::new();
        let process = ProcessId::channel("main");
        let tools = defs();
        let turn = Turn {
            dispatcher: &dispatcher,
            ticket: &ticket,
            route: Route::User,
            process: &process,
            events: &events,
            system: "test",
            tools: &tools,
            max_turns: 3,
            deltas: &(),
            run: &run,
            trace: TraceParent::none(),
        };
        let mut history = vec![Message::user("hi")];
        let err = turn
            .run(
                &mut history,
                &Tools {
                    injections: Mutex::default(),
                },
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&err.reason, Unanswered::Suppressed(why) if why.contains("run:4 lease is not live")),
            "{err}"
        );
        assert_eq!(history, [Message::user("hi")]);
        assert_eq!(
            provider.answers.lock().unwrap().len(),
            1,
            "no request went out"
        );
    }
}
