//! What the runtime reports as it works: replies for the user, and every step of every
//! process (turns, tool calls, workers, branches, compaction, late reports), as typed
//! events.

use std::fmt;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::notifications::NotificationKind;
use crate::dispatch::Route;
use crate::ids::ProcessId;
use crate::plugin::ToolError;
use crate::services::{ApprovalId, RunId, WorkerState};

/// One thing that happened, in order.
///
/// Its JSON form is stable, for services that stream events: an object whose `type` is the
/// variant's name in snake case, with the fields beside it and process ids as text.
/// Callers match on variants; none parses the [`Display`](fmt::Display) text, which is for
/// people (`[worker:1] started: ...`).
///
/// ```
/// use capstan_host::agent::Event;
/// use capstan_host::ids::ProcessId;
///
/// let event = Event::Reply { channel: ProcessId::channel("main"), text: "hi".into() };
/// let json = serde_json::to_string(&event)?;
/// assert_eq!(json, r#"{"type":"reply","channel":"channel:main","text":"hi"}"#);
/// assert_eq!(serde_json::from_str::<Event>(&json)?, event);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// The channel replied to the user.
    Reply {
        /// The conversation.
        channel: ProcessId,
        /// The reply.
        text: String,
    },
    /// A piece of a channel's answer, as the model streams it. The whole answer follows
    /// as a [`Event::Reply`] once it is complete; a model that does not stream sends none.
    Text {
        /// The conversation.
        channel: ProcessId,
        /// The text that just arrived.
        text: String,
    },
    /// A process began a turn: its first request to the model is about to be sent.
    TurnStarted {
        /// The process.
        process: ProcessId,
        /// Why it prompts.
        route: Route,
    },
    /// A process's turn ended.
    TurnFinished {
        /// The process.
        process: ProcessId,
        /// How it ended.
        end: TurnEnding,
    },
    /// A conversation's inputs were not sent to the model, because someone else holds its
    /// session (and answers instead); the inputs stay in the history.
    TurnSuppressed {
        /// The conversation.
        process: ProcessId,
        /// Who holds the session, or why it is busy.
        reason: String,
    },
    /// A plugin tool ran and returned a result.
    ToolCalled {
        /// The process that called it.
        process: ProcessId,
        /// The tool.
        tool: String,
    },
    /// A tool call was refused by policy: the tool is not offered to the process, or a
    /// capability it needs is not granted. Nothing ran.
    ToolDenied {
        /// The process that called it.
        process: ProcessId,
        /// The tool.
        tool: String,
        /// Why, naming the profile or capability.
        reason: String,
    },
    /// A tool call was parked: the flow rules want a person's approval before it runs
    /// (`capstan approvals`). The process waits for the decision.
    ApprovalRequested {
        /// The process that called it.
        process: ProcessId,
        /// The tool.
        tool: String,
        /// The approval to decide.
        approval: ApprovalId,
        /// Why it needs a person.
        reason: String,
    },
    /// A tool call produced no result: bad arguments, not found, or it failed (a host
    /// tool's bad arguments included).
    ToolFailed {
        /// The process that called it.
        process: ProcessId,
        /// The tool.
        tool: String,
        /// The error the model was shown.
        error: ToolError,
    },
    /// A worker was admitted and began its task.
    WorkerStarted {
        /// The worker.
        worker: ProcessId,
        /// The conversation it reports to.
        channel: ProcessId,
        /// Its task.
        task: String,
    },
    /// A worker reported progress with `set_status`.
    WorkerProgress {
        /// The worker.
        worker: ProcessId,
        /// What it said.
        message: String,
    },
    /// An interactive worker asked for input and waits for a routed answer.
    WorkerWaiting {
        /// The worker.
        worker: ProcessId,
        /// Its question.
        question: String,
    },
    /// Messages routed to a running worker were added to its history at a turn boundary.
    InjectionDelivered {
        /// The worker.
        worker: ProcessId,
        /// How many messages.
        messages: usize,
    },
    /// A worker ended: done, failed, cancelled, or interrupted (also reported at start-up
    /// for the workers an earlier host left running).
    WorkerEnded {
        /// The worker.
        worker: ProcessId,
        /// How it ended.
        state: WorkerState,
        /// Its result, or why it ended.
        outcome: String,
    },
    /// A branch began thinking about a question.
    BranchStarted {
        /// The branch.
        branch: ProcessId,
        /// The conversation it forks.
        channel: ProcessId,
        /// Its question.
        question: String,
    },
    /// A branch concluded (its conclusion says so when its model failed).
    BranchConcluded {
        /// The branch.
        branch: ProcessId,
        /// What it concluded.
        conclusion: String,
    },
    /// A branch did not end normally: it panicked or the runtime shut down under it.
    BranchFailed {
        /// The branch.
        branch: ProcessId,
        /// Why.
        error: String,
    },
    /// A compactor began summarizing the oldest part of a conversation's history.
    CompactionStarted {
        /// The compactor run.
        compactor: ProcessId,
        /// The conversation whose history it summarizes.
        channel: ProcessId,
        /// Messages to summarize.
        messages: usize,
        /// Messages in the history.
        of: usize,
        /// The history's estimated size in tokens.
        tokens: usize,
        /// The size in tokens past which a history is compacted.
        threshold: usize,
    },
    /// The summarized messages were replaced by the summary.
    Compacted {
        /// The compactor run.
        compactor: ProcessId,
        /// Messages in the history now.
        messages: usize,
    },
    /// Compaction changed nothing: the history was kept as it was.
    CompactionSkipped {
        /// The compactor run.
        compactor: ProcessId,
        /// Why.
        reason: String,
    },
    /// A report arrived after the process that asked for it ended (or its channel
    /// closed): it was kept in working memory and, if its channel is open, told in a turn
    /// of its own.
    NotificationFolded {
        /// The conversation it belongs to.
        channel: ProcessId,
        /// Who reported, e.g. `worker:3`.
        source: ProcessId,
        /// Who had asked for it, e.g. `branch:2`.
        requester: ProcessId,
        /// What kind of report it is.
        kind: NotificationKind,
        /// Its working-memory key.
        key: String,
    },
    /// A model request of a process got no answer: it failed or timed out. The process
    /// goes on as its kind does (a channel waits for the next input, a worker fails);
    /// `capstan run` exits non-zero when any request failed.
    ModelFailed {
        /// The process whose request failed.
        process: ProcessId,
        /// Why, as the process reports it.
        error: String,
    },
    /// A conversation's history could not be stored after a turn. The messages stay in
    /// memory and the next save rewrites the whole history.
    HistoryNotSaved {
        /// The conversation.
        channel: ProcessId,
        /// What the store said.
        error: String,
    },
    /// A message for a conversation that another host sharing the store answers was
    /// forwarded to it: its turn, reply and events happen on that host.
    Forwarded {
        /// The conversation.
        channel: ProcessId,
        /// The run, on the other host, that answers it.
        owner: RunId,
    },
    /// A message came in through a messaging channel (`[channels.NAME]`), or a reply went
    /// out through one.
    ChatMessage {
        /// The conversation it belongs to (for a refused one: the one it would have).
        channel: ProcessId,
        /// The messaging channel's name.
        via: String,
        /// What became of it.
        step: ChatStep,
        /// Coming in, the sender's id on the platform; going out, the room.
        who: String,
        /// Its length in characters.
        chars: u64,
    },
}

/// What became of a message through a messaging channel, in an [`Event::ChatMessage`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatStep {
    /// It came in and went to its conversation.
    Taken,
    /// It came in from a sender the channel does not allow, or over the sender's rate.
    Refused,
    /// It came in without speaking to the bot in a room with others.
    Ignored,
    /// A reply went out.
    Sent,
    /// A reply could not be sent.
    Failed,
}

impl ChatStep {
    /// Its name, as the event and the metrics write it.
    pub fn as_str(self) -> &'static str {
        match self {
            ChatStep::Taken => "taken",
            ChatStep::Refused => "refused",
            ChatStep::Ignored => "ignored",
            ChatStep::Sent => "sent",
            ChatStep::Failed => "failed",
        }
    }

    /// `in` or `out`.
    pub fn direction(self) -> &'static str {
        match self {
            ChatStep::Taken | ChatStep::Refused | ChatStep::Ignored => "in",
            ChatStep::Sent | ChatStep::Failed => "out",
        }
    }
}

/// How a turn ended, in an [`Event::TurnFinished`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnEnding {
    /// The model answered in text.
    Answered,
    /// `reply` delivered an answer to the user.
    Replied,
    /// A tool ended the turn (`skip`, `set_status`).
    Ended,
    /// Routed messages arrived; the turn stopped at a boundary to take them in.
    Injected,
    /// The turn budget ran out.
    OutOfTurns,
    /// The model gave no answer (see [`Event::ModelFailed`]) or the turn was suppressed.
    Unanswered,
}

impl TurnEnding {
    /// The name in the JSON form, e.g. `out_of_turns`.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnEnding::Answered => "answered",
            TurnEnding::Replied => "replied",
            TurnEnding::Ended => "ended",
            TurnEnding::Injected => "injected",
            TurnEnding::OutOfTurns => "out_of_turns",
            TurnEnding::Unanswered => "unanswered",
        }
    }
}

impl Event {
    /// This event with every value `redactor` hides replaced, in whichever field it is
    /// (a reply, a tool's error, a worker's outcome). Should the redacted form no longer
    /// read as an event, what is left says an event was withheld.
    pub fn redacted(self, redactor: &crate::secrets::Redactor) -> Event {
        if redactor.is_empty() {
            return self;
        }
        let Ok(json) = serde_json::to_string(&self) else {
            return self;
        };
        match redactor.redact(&json) {
            std::borrow::Cow::Borrowed(_) => self,
            std::borrow::Cow::Owned(clean) => {
                serde_json::from_str(&clean).unwrap_or_else(|_| Event::TurnSuppressed {
                    process: self.process().clone(),
                    reason: "an event was withheld: it held a secret's value, and without it \
                             it no longer reads as an event"
                        .into(),
                })
            }
        }
    }

    /// The conversation this event names, where it names one: a conversation's own
    /// events, and the start of a worker, branch or compaction for it. Later events of
    /// those processes name only the process; a service follows them from the start.
    pub fn conversation(&self) -> Option<&ProcessId> {
        match self {
            Event::WorkerStarted { channel, .. }
            | Event::BranchStarted { channel, .. }
            | Event::CompactionStarted { channel, .. } => Some(channel),
            _ => {
                let process = self.process();
                process.kind().is_conversation().then_some(process)
            }
        }
    }

    /// Whether this is the last event of its process: a worker ended, a branch concluded
    /// or failed, a compaction finished.
    pub fn ends_process(&self) -> bool {
        matches!(
            self,
            Event::WorkerEnded { .. }
                | Event::BranchConcluded { .. }
                | Event::BranchFailed { .. }
                | Event::Compacted { .. }
                | Event::CompactionSkipped { .. }
        )
    }

    /// The process the event is about.
    pub fn process(&self) -> &ProcessId {
        match self {
            Event::Reply { channel, .. }
            | Event::Text { channel, .. }
            | Event::NotificationFolded { channel, .. }
            | Event::HistoryNotSaved { channel, .. }
            | Event::Forwarded { channel, .. }
            | Event::ChatMessage { channel, .. } => channel,
            Event::TurnStarted { process, .. }
            | Event::TurnFinished { process, .. }
            | Event::TurnSuppressed { process, .. }
            | Event::ToolCalled { process, .. }
            | Event::ToolDenied { process, .. }
            | Event::ApprovalRequested { process, .. }
            | Event::ToolFailed { process, .. }
            | Event::ModelFailed { process, .. } => process,
            Event::WorkerStarted { worker, .. }
            | Event::WorkerProgress { worker, .. }
            | Event::WorkerWaiting { worker, .. }
            | Event::InjectionDelivered { worker, .. }
            | Event::WorkerEnded { worker, .. } => worker,
            Event::BranchStarted { branch, .. }
            | Event::BranchConcluded { branch, .. }
            | Event::BranchFailed { branch, .. } => branch,
            Event::CompactionStarted { compactor, .. }
            | Event::Compacted { compactor, .. }
            | Event::CompactionSkipped { compactor, .. } => compactor,
        }
    }
}

/// For people: a reply is its text; anything else is `[process] what happened`.
impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Event::Reply { text, .. } | Event::Text { text, .. } = self {
            return f.write_str(text);
        }
        write!(f, "[{}] ", self.process())?;
        match self {
            Event::Reply { .. } | Event::Text { .. } => Ok(()),
            Event::TurnStarted { route, .. } => write!(f, "turn started ({route})"),
            Event::TurnFinished { end, .. } => write!(f, "turn finished ({})", end.as_str()),
            Event::TurnSuppressed { reason, .. } => {
                write!(f, "not sent: {reason}; the inputs stay in the history")
            }
            Event::ToolCalled { tool, .. } => write!(f, "{tool} ok"),
            Event::ToolDenied { tool, reason, .. } => write!(f, "{tool} denied: {reason}"),
            Event::ApprovalRequested {
                tool,
                approval,
                reason,
                ..
            } => write!(
                f,
                "{tool} waits for approval {approval}: {reason} (decide with `capstan approvals approve {n}` or `deny {n}`)",
                n = approval.get()
            ),
            Event::ToolFailed { tool, error, .. } => write!(f, "{tool} {error}"),
            Event::WorkerStarted { task, .. } => write!(f, "started: {task}"),
            Event::WorkerProgress { message, .. } => f.write_str(message),
            Event::WorkerWaiting { question, .. } => write!(f, "waiting for input: {question}"),
            Event::InjectionDelivered { messages, .. } => {
                write!(f, "{messages} routed message(s) injected")
            }
            Event::WorkerEnded { state, outcome, .. } => write!(f, "{state}: {outcome}"),
            Event::BranchStarted { question, .. } => write!(f, "thinking: {question}"),
            Event::BranchConcluded { conclusion, .. } => write!(f, "concluded: {conclusion}"),
            Event::BranchFailed { error, .. } => write!(f, "failed: {error}"),
            Event::CompactionStarted {
                messages,
                of,
                tokens,
                threshold,
                ..
            } => write!(
                f,
                "compacting {messages} of {of} messages ({tokens} tokens, threshold {threshold})"
            ),
            Event::Compacted { messages, .. } => write!(
                f,
                "compacted into one summary; history is now {messages} messages"
            ),
            Event::CompactionSkipped { reason, .. } => write!(f, "history kept: {reason}"),
            Event::NotificationFolded {
                source,
                requester,
                kind,
                key,
                ..
            } => write!(
                f,
                "late {kind} from {source} (for {requester}, which has ended) kept as {key}"
            ),
            Event::ModelFailed { error, .. } => write!(f, "the model failed: {error}"),
            Event::HistoryNotSaved { error, .. } => {
                write!(f, "the history was not saved: {error}")
            }
            Event::Forwarded { owner, .. } => write!(
                f,
                "forwarded to {owner}, which answers this conversation on another host"
            ),
            Event::ChatMessage {
                via,
                step,
                who,
                chars,
                ..
            } => match step.direction() {
                "in" => write!(
                    f,
                    "{via}: message from {who} {} ({chars} chars)",
                    step.as_str()
                ),
                _ => write!(f, "{via}: reply to {who} {} ({chars} chars)", step.as_str()),
            },
        }
    }
}

/// Where processes send their [`Event`]s: the runtime's one stream, in order.
#[derive(Debug, Clone)]
pub(crate) struct EventSink(mpsc::UnboundedSender<Event>);

impl EventSink {
    /// A sink and the receiver of what is sent into it.
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<Event>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (EventSink(sender), receiver)
    }

    /// Sends `event`. A closed receiver means nobody is watching; the work goes on.
    pub(crate) fn emit(&self, event: Event) {
        // Every event passes here: the metrics that count events count them here.
        if let Event::TurnStarted { process, .. } = &event {
            crate::telemetry::metrics().turn_started(process.kind());
        }
        let _ = self.0.send(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ProcessKind;
    use serde_json::json;

    /// Every variant, with the JSON a client reads; changing one breaks clients.
    fn every_variant() -> Vec<(Event, serde_json::Value)> {
        let main = ProcessId::channel("main");
        let worker = ProcessId::numbered(ProcessKind::Worker, 3);
        let branch = ProcessId::numbered(ProcessKind::Branch, 2);
        let compactor = ProcessId::numbered(ProcessKind::Compactor, 1);
        vec![
            (
                Event::Reply {
                    channel: main.clone(),
                    text: "done".into(),
                },
                json!({"type": "reply", "channel": "channel:main", "text": "done"}),
            ),
            (
                Event::Text {
                    channel: main.clone(),
                    text: "do".into(),
                },
                json!({"type": "text", "channel": "channel:main", "text": "do"}),
            ),
            (
                Event::TurnStarted {
                    process: main.clone(),
                    route: Route::FollowUp,
                },
                json!({"type": "turn_started", "process": "channel:main", "route": "follow-up"}),
            ),
            (
                Event::TurnFinished {
                    process: main.clone(),
                    end: TurnEnding::OutOfTurns,
                },
                json!({"type": "turn_finished", "process": "channel:main", "end": "out_of_turns"}),
            ),
            (
                Event::TurnSuppressed {
                    process: main.clone(),
                    reason: "held".into(),
                },
                json!({"type": "turn_suppressed", "process": "channel:main", "reason": "held"}),
            ),
            (
                Event::ToolCalled {
                    process: worker.clone(),
                    tool: "file_read".into(),
                },
                json!({"type": "tool_called", "process": "worker:3", "tool": "file_read"}),
            ),
            (
                Event::ToolDenied {
                    process: branch.clone(),
                    tool: "file_write".into(),
                    reason: "not granted".into(),
                },
                json!({"type": "tool_denied", "process": "branch:2", "tool": "file_write",
                       "reason": "not granted"}),
            ),
            (
                Event::ApprovalRequested {
                    process: worker.clone(),
                    tool: "send_money".into(),
                    approval: crate::services::ApprovalId::new(4),
                    reason: "untrusted".into(),
                },
                json!({"type": "approval_requested", "process": "worker:3", "tool": "send_money",
                       "approval": 4, "reason": "untrusted"}),
            ),
            (
                Event::ToolFailed {
                    process: worker.clone(),
                    tool: "file_read".into(),
                    error: ToolError::NotFound("no such file".into()),
                },
                json!({"type": "tool_failed", "process": "worker:3", "tool": "file_read",
                       "error": {"kind": "not-found", "message": "no such file"}}),
            ),
            (
                Event::WorkerStarted {
                    worker: worker.clone(),
                    channel: ProcessId::channel("main"),
                    task: "sum".into(),
                },
                json!({"type": "worker_started", "worker": "worker:3", "channel": "channel:main",
                       "task": "sum"}),
            ),
            (
                Event::WorkerProgress {
                    worker: worker.clone(),
                    message: "half".into(),
                },
                json!({"type": "worker_progress", "worker": "worker:3", "message": "half"}),
            ),
            (
                Event::WorkerWaiting {
                    worker: worker.clone(),
                    question: "which?".into(),
                },
                json!({"type": "worker_waiting", "worker": "worker:3", "question": "which?"}),
            ),
            (
                Event::InjectionDelivered {
                    worker: worker.clone(),
                    messages: 2,
                },
                json!({"type": "injection_delivered", "worker": "worker:3", "messages": 2}),
            ),
            (
                Event::WorkerEnded {
                    worker: worker.clone(),
                    state: WorkerState::WaitingForInput,
                    outcome: "asked".into(),
                },
                json!({"type": "worker_ended", "worker": "worker:3",
                       "state": "waiting-for-input", "outcome": "asked"}),
            ),
            (
                Event::BranchStarted {
                    branch: branch.clone(),
                    channel: ProcessId::channel("main"),
                    question: "why?".into(),
                },
                json!({"type": "branch_started", "branch": "branch:2", "channel": "channel:main",
                       "question": "why?"}),
            ),
            (
                Event::BranchConcluded {
                    branch: branch.clone(),
                    conclusion: "because".into(),
                },
                json!({"type": "branch_concluded", "branch": "branch:2", "conclusion": "because"}),
            ),
            (
                Event::BranchFailed {
                    branch: branch.clone(),
                    error: "panicked: x".into(),
                },
                json!({"type": "branch_failed", "branch": "branch:2", "error": "panicked: x"}),
            ),
            (
                Event::CompactionStarted {
                    compactor: compactor.clone(),
                    channel: ProcessId::channel("main"),
                    messages: 4,
                    of: 9,
                    tokens: 900,
                    threshold: 800,
                },
                json!({"type": "compaction_started", "compactor": "compactor:1",
                       "channel": "channel:main", "messages": 4,
                       "of": 9, "tokens": 900, "threshold": 800}),
            ),
            (
                Event::Compacted {
                    compactor: compactor.clone(),
                    messages: 6,
                },
                json!({"type": "compacted", "compactor": "compactor:1", "messages": 6}),
            ),
            (
                Event::CompactionSkipped {
                    compactor,
                    reason: "no summary produced".into(),
                },
                json!({"type": "compaction_skipped", "compactor": "compactor:1",
                       "reason": "no summary produced"}),
            ),
            (
                Event::NotificationFolded {
                    channel: main.clone(),
                    source: worker.clone(),
                    requester: branch,
                    kind: NotificationKind::InputRequired,
                    key: "notifications/input-required/worker:3".into(),
                },
                json!({"type": "notification_folded", "channel": "channel:main",
                       "source": "worker:3", "requester": "branch:2", "kind": "input-required",
                       "key": "notifications/input-required/worker:3"}),
            ),
            (
                Event::ModelFailed {
                    process: worker,
                    error: "timed out".into(),
                },
                json!({"type": "model_failed", "process": "worker:3", "error": "timed out"}),
            ),
            (
                Event::HistoryNotSaved {
                    channel: main.clone(),
                    error: "disk full".into(),
                },
                json!({"type": "history_not_saved", "channel": "channel:main", "error": "disk full"}),
            ),
            (
                Event::Forwarded {
                    channel: main.clone(),
                    owner: RunId::new(7),
                },
                json!({"type": "forwarded", "channel": "channel:main", "owner": 7}),
            ),
            (
                Event::ChatMessage {
                    channel: main,
                    via: "tg".into(),
                    step: ChatStep::Refused,
                    who: "7".into(),
                    chars: 5,
                },
                json!({"type": "chat_message", "channel": "channel:main", "via": "tg",
                       "step": "refused", "who": "7", "chars": 5}),
            ),
        ]
    }

    #[test]
    fn every_event_has_a_stable_tagged_json_form_that_round_trips() {
        for (event, expected) in every_variant() {
            let json = serde_json::to_value(&event).unwrap();
            assert_eq!(json, expected);
            assert_eq!(serde_json::from_value::<Event>(json).unwrap(), event);
        }
    }

    #[test]
    fn people_read_the_process_then_what_happened() {
        let shown: Vec<String> = every_variant()
            .into_iter()
            .map(|(event, _)| event.to_string())
            .collect();
        assert_eq!(shown[0], "done", "a reply is its text");
        assert!(shown.contains(&"[worker:3] started: sum".to_owned()));
        assert!(shown.contains(&"[worker:3] waiting-for-input: asked".to_owned()));
        assert!(shown.contains(&"[branch:2] file_write denied: not granted".to_owned()));
        assert!(shown.contains(&"[worker:3] file_read not-found: no such file".to_owned()));
        assert!(shown.contains(&"[worker:3] 2 routed message(s) injected".to_owned()));
        assert!(shown.contains(&"[channel:main] turn finished (out_of_turns)".to_owned()));
        assert!(shown.contains(
            &"[channel:main] forwarded to run:7, which answers this conversation on another host"
                .to_owned()
        ));
    }

    #[test]
    fn unknown_types_fields_and_bad_ids_are_refused() {
        for bad in [
            r#"{"type":"shout","channel":"channel:main","text":"x"}"#,
            r#"{"type":"reply","channel":"channel:main","text":"x","extra":1}"#,
            r#"{"type":"reply","channel":"main","text":"x"}"#,
            r#"{"channel":"channel:main","text":"x"}"#,
            r#"{"type":"worker_ended","worker":"worker:1","state":"asleep","outcome":""}"#,
        ] {
            assert!(serde_json::from_str::<Event>(bad).is_err(), "{bad}");
        }
    }
}
