//! A worker: a fresh prompt and one task, file and task tools, and `set_status`.
//!
//! Messages routed to a worker are never lost: a worker waiting for input takes the next
//! one as its answer; a running worker gets them at its next turn boundary (the turn
//! stops there, they are added as context, and it is re-prompted to continue); what
//! arrives after its last turn is reported to the channel as not delivered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, Notify, mpsc};

use super::audience::Scope;
use super::events::Event;
use super::inbox::{ChannelHandle, RoutedMessage, drain};
use super::notifications::NotificationKind;
use super::process_calls::ProcessCalls;
use super::prompts::system_prompt;
use super::reporter::Reporter;
use super::reservations::Reservation;
use super::spawning::{WorkerKit, WorkerSpec};
use super::supervisor::{Pending, WorkerHandle, supervise};
use super::tool_calls::{HostTools, ProcessTools};
use super::turn::{ToolOutcome, TurnEnd, context_label};
use crate::dispatch::Route;
use crate::flow::Label;
use crate::ids::ProcessId;
use crate::llm::{BoxFuture, Message};
use crate::plugin::ToolError;
use crate::policy::ProcessKind;
use crate::services::WorkerState;
use crate::tools::{HostCall, ReportedState};

/// The re-prompt after routed messages were added to a worker's history.
const CONTINUE_HINT: &str = "Continue with the messages above in mind.";

type Inbox = Arc<AsyncMutex<mpsc::UnboundedReceiver<RoutedMessage>>>;

/// Starts a worker for `channel`, supervised: whatever the end (it finishes, fails, is
/// cancelled, times out, or panics), the worker is recorded and reported, its registry
/// entry goes, and its reservation (the task description) and admission permit are
/// released.
pub(crate) fn start(
    kit: WorkerKit,
    spec: WorkerSpec,
    channel: ChannelHandle,
    reservation: Reservation,
) {
    let (inbox_tx, inbox) = mpsc::unbounded_channel();
    let inbox: Inbox = Arc::new(AsyncMutex::new(inbox));
    let spec = Arc::new(spec);
    let failed = {
        let (kit, spec, channel, inbox) =
            (kit.clone(), spec.clone(), channel.clone(), inbox.clone());
        move |why| async move {
            kit.supervisor.worker_ended(&spec.id);
            let undelivered = drain(&mut *inbox.lock().await);
            let ended = Ended {
                state: WorkerState::Failed,
                outcome: why,
                recorded: true,
                // The host's words about a failure, and the messages routed to it.
                read: spec.task_label.clone(),
            };
            finish(&kit, &spec, &channel, ended, undelivered).await;
        }
    };
    // Its turns and its report are under the span that spawned it.
    let trace = spec.trace.clone();
    supervise(
        &channel,
        |pending| {
            trace.scope(run(
                kit,
                spec,
                channel.clone(),
                reservation,
                pending,
                inbox_tx,
                inbox,
            ))
        },
        failed,
    );
}

/// The worker's life, in its own task so that a panic is caught by its supervisor.
/// `_reservation` and the admission permit drop with this future, however it ends.
async fn run(
    kit: WorkerKit,
    spec: Arc<WorkerSpec>,
    channel: ChannelHandle,
    reservation: Reservation,
    pending: Arc<Pending>,
    inbox_tx: mpsc::UnboundedSender<RoutedMessage>,
    inbox: Inbox,
) {
    // Held until the worker ends: at most max_workers_per_channel run at once.
    let _slot = channel
        .worker_slots
        .clone()
        .acquire_owned()
        .await
        .expect("never closed");
    let cancel = Arc::new(Notify::new());
    let interrupted = Arc::new(AtomicBool::new(false));
    kit.supervisor.worker_started(
        &spec.id,
        WorkerHandle {
            channel: spec.channel.clone(),
            inbox: inbox_tx,
            cancel: cancel.clone(),
            interrupted: interrupted.clone(),
            pending: pending.clone(),
        },
    );
    let (id, records) = (&spec.id, &kit.records);
    // Admitted here by the host's own count, and by the store's among the hosts.
    let recorded = records.admit(id, &spec.channel, &spec.task).await;
    kit.reporter.emit_to(
        &channel.audience.of(&spec.id),
        Event::WorkerStarted {
            worker: spec.id.clone(),
            channel: spec.channel.clone(),
            task: spec.task.clone(),
        },
    );
    if let Err(err) = recorded {
        // A worker the store does not know of would be invisible to every other host,
        // and never marked lost if this one died: it does not work, and the channel hears
        // why.
        kit.supervisor.worker_ended(&spec.id);
        let outcome = format!("not started: the store refused to record it ({err})");
        finish(
            &kit,
            &spec,
            &channel,
            Ended::unrecorded(outcome),
            Vec::new(),
        )
        .await;
        // The task is free again on every host: no worker of it ever ran.
        let _ = records.release_task(reservation.key(), id).await;
        return;
    }

    let limit = kit.settings.limits.worker_timeout;
    // Routed messages added to the history that no model answer has covered yet: if the
    // worker ends now (its request failed, it was cancelled or timed out mid-request),
    // they are reported as not delivered with the rest.
    let mut unanswered = Vec::new();
    // What the worker has read so far: its report carries it, however it ends.
    let read = Mutex::new(spec.task_label.clone());
    let working = work(
        &kit,
        &spec,
        &channel,
        &pending,
        &inbox,
        &mut unanswered,
        &read,
    );
    let (state, outcome) = tokio::select! {
        // A worker stopped before it began (the host stopped while it waited for a slot)
        // never asks the model.
        biased;
        () = cancel.notified() => if interrupted.load(Ordering::SeqCst) {
            (WorkerState::Interrupted, "the host was stopped".to_owned())
        } else {
            (WorkerState::Cancelled, "cancelled on request".to_owned())
        },
        ended = tokio::time::timeout(limit, working) => {
            ended.unwrap_or_else(|_| {
                (WorkerState::Failed, format!("timed out after {} s", limit.as_secs()))
            })
        }
    };
    // Out of the registry first: from here on a route is refused, not queued.
    kit.supervisor.worker_ended(&spec.id);
    let mut undelivered = unanswered;
    undelivered.extend(drain(&mut *inbox.lock().await));
    let ended = Ended {
        state,
        outcome,
        recorded: true,
        read: read
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    };
    finish(&kit, &spec, &channel, ended, undelivered).await;
    // Free for a worker of any host now, not only once the end is seen.
    if let Err(err) = records.release_task(reservation.key(), id).await {
        tracing::warn!(worker = %spec.id, "cannot release the worker's task among the hosts (it is free anyway once its end is stored): {err}");
    }
}

/// How a worker ended.
struct Ended {
    state: WorkerState,
    outcome: String,
    /// Whether the store has a record of the worker to update.
    recorded: bool,
    /// What it had read: the label its report carries.
    read: Label,
}

impl Ended {
    /// A worker that failed before the store recorded it.
    fn unrecorded(outcome: String) -> Self {
        Ended {
            state: WorkerState::Failed,
            outcome,
            recorded: false,
            read: Label::trusted(),
        }
    }
}

/// Records the worker's end and reports it: to its channel, or, when the branch that
/// asked for it has ended, as a late notification.
async fn finish(
    kit: &WorkerKit,
    spec: &WorkerSpec,
    channel: &ChannelHandle,
    ended: Ended,
    undelivered: Vec<RoutedMessage>,
) {
    kit.gate.release_process(&spec.id);
    let Ended {
        state,
        outcome,
        recorded,
        mut read,
    } = ended;
    if recorded {
        let stored = kit.records.set_state(&spec.id, state, Some(&outcome));
        if let Err(err) = stored.await {
            tracing::error!(worker = %spec.id, "cannot record the worker's end: {err}");
        }
    }
    kit.reporter.emit_to(
        &channel.audience.of(&spec.id),
        Event::WorkerEnded {
            worker: spec.id.clone(),
            state,
            outcome: outcome.clone(),
        },
    );
    let mut report = format!("finished ({state}): {outcome}");
    if !undelivered.is_empty() {
        let texts: Vec<&str> = undelivered.iter().map(|m| m.text.as_str()).collect();
        report.push_str(&format!(
            "\n{} message(s) routed to it arrived after it finished and were not delivered: {}",
            undelivered.len(),
            texts.join(" | ")
        ));
        // The report quotes them: it carries what their senders had read.
        for message in &undelivered {
            read.join(&message.label);
        }
    }
    let kind = match state {
        WorkerState::Done => NotificationKind::Result,
        WorkerState::Cancelled | WorkerState::Interrupted => NotificationKind::Status,
        WorkerState::WaitingForInput => NotificationKind::InputRequired,
        WorkerState::Failed | WorkerState::Running => NotificationKind::Error,
    };
    tell(kit, spec, channel, kind, report, read).await;
}

/// Sends `text`, labelled `label`, to the worker's channel, or folds it back if its
/// requester has ended.
async fn tell(
    kit: &WorkerKit,
    spec: &WorkerSpec,
    channel: &ChannelHandle,
    kind: NotificationKind,
    text: String,
    label: Label,
) {
    let requester = spec.requester.as_ref();
    kit.reporter
        .tell(
            &spec.channel,
            channel,
            &spec.id,
            requester,
            kind,
            text,
            label,
        )
        .await;
}

/// The worker's turns: the task, then any routed follow-ups, until it reports an end.
async fn work(
    kit: &WorkerKit,
    spec: &WorkerSpec,
    channel: &ChannelHandle,
    pending: &Pending,
    inbox: &Inbox,
    unanswered: &mut Vec<RoutedMessage>,
    read: &Mutex<Label>,
) -> (WorkerState, String) {
    let tools = kit.gate.tool_defs(ProcessKind::Worker);
    let system = system_prompt(ProcessKind::Worker, &kit.settings.agent_name);
    let lease = match kit.gate.lease_loop(&spec.id) {
        Ok(lease) => lease,
        Err(held) => return (WorkerState::Failed, format!("cannot prompt: {held}")),
    };
    let mut history = vec![Message::user(spec.task.clone()).labelled(spec.task_label.clone())];
    let mut route = Route::Task;
    // The worker's own plugin instances and audit rows, for its life.
    let calls = ProcessCalls::new(spec.channel.session());
    let scope = channel.audience.of(&spec.id);
    loop {
        let host_tools = WorkerTools {
            reporter: &kit.reporter,
            id: spec.id.clone(),
            scope: &scope,
            reported: Mutex::new(None),
            inbox,
        };
        let handler = ProcessTools::new(
            &kit.gate,
            &kit.reporter,
            &spec.id,
            &calls,
            &scope,
            &host_tools,
        );
        let turn = kit
            .gate
            .turn(&spec.id, lease.ticket(), route, &system, &tools);
        let end = turn.run(&mut history, &handler).await;
        *read.lock().unwrap() = context_label(&history);
        if !matches!(&end, Err(err) if err.answered == 0) {
            unanswered.clear();
        }
        let reported = host_tools.reported.lock().unwrap().take();
        let (state, message) = match (end, reported) {
            (Err(err), _) => {
                kit.reporter.model_failed(&scope, &spec.id, &err);
                return (WorkerState::Failed, format!("the model failed: {err}"));
            }
            (Ok(TurnEnd::Injected(messages)), _) => {
                // Stopped at a boundary with every call answered: add the messages and go
                // on. Not a retry, so it uses no budget of any kind.
                kit.reporter.emit_to(
                    &scope,
                    Event::InjectionDelivered {
                        worker: spec.id.clone(),
                        messages: messages.len(),
                    },
                );
                *unanswered = continue_with(&mut history, messages);
                route = Route::Injection;
                continue;
            }
            (Ok(_), Some((state, message))) => (state, message),
            (Ok(TurnEnd::Text(text) | TurnEnd::Delivered(text)), None) => (WorkerState::Done, text),
            (Ok(TurnEnd::MaxTurns), None) => {
                return (
                    WorkerState::Failed,
                    format!("ran out of its {} turns", kit.settings.limits.max_turns),
                );
            }
            (Ok(TurnEnd::Ended), None) => (WorkerState::Done, String::new()),
        };
        // Messages routed while it worked are delivered before it may end.
        let mut routed = drain(&mut *inbox.lock().await);
        if state == WorkerState::WaitingForInput {
            if !spec.interactive {
                return (
                    WorkerState::Done,
                    format!("asked for input, but is not interactive: {message}"),
                );
            }
            kit.reporter.emit_to(
                &scope,
                Event::WorkerWaiting {
                    worker: spec.id.clone(),
                    question: message.clone(),
                },
            );
            if routed.is_empty() {
                let waiting = WorkerState::WaitingForInput;
                let recorded = kit.records.set_state(&spec.id, waiting, None);
                if let Err(err) = recorded.await {
                    tracing::error!(worker = %spec.id, "cannot record the worker's state: {err}");
                }
                // The user hears the question; while it waits, the worker does not keep its
                // channel busy.
                let label = read.lock().unwrap().clone();
                tell(
                    kit,
                    spec,
                    channel,
                    NotificationKind::InputRequired,
                    format!("needs input (route your answer to {}): {message}", spec.id),
                    label,
                )
                .await;
                let mut waiting = inbox.lock().await;
                // Paused only if nothing was routed meanwhile; a route resumes it (both
                // under the registry lock), so the channel is never idle with an answer
                // on its way to this worker.
                kit.supervisor.pause_while_waiting(&waiting, pending);
                let input = waiting.recv().await;
                drop(waiting);
                pending.resume();
                match input {
                    Some(input) => routed.push(input),
                    None => return (WorkerState::Cancelled, "its channel closed".into()),
                }
                let running = WorkerState::Running;
                let recorded = kit.records.set_state(&spec.id, running, None);
                if let Err(err) = recorded.await {
                    tracing::error!(worker = %spec.id, "cannot record the worker's state: {err}");
                }
            }
        } else if routed.is_empty() {
            return (state, message);
        }
        *unanswered = continue_with(&mut history, routed);
        route = Route::FollowUp;
    }
}

/// Adds routed `messages` to a worker's history, then the hint to continue; returns the
/// messages, which count as delivered once the model answers a request holding them.
fn continue_with(history: &mut Vec<Message>, messages: Vec<RoutedMessage>) -> Vec<RoutedMessage> {
    history.extend(messages.iter().map(RoutedMessage::message));
    history.push(Message::user(CONTINUE_HINT));
    messages
}

/// The worker's host tool `set_status`; everything else goes to the plugins.
struct WorkerTools<'w> {
    reporter: &'w Reporter,
    id: ProcessId,
    /// The worker's work, whose exchanges hear its progress.
    scope: &'w Scope,
    reported: Mutex<Option<(WorkerState, String)>>,
    inbox: &'w Inbox,
}

impl WorkerTools<'_> {
    fn answer(&self, call: HostCall) -> Result<ToolOutcome, ToolError> {
        let HostCall::SetStatus(args) = call else {
            return Err(ToolError::Denied(format!(
                "`{}` is not a worker's tool",
                call.tool()
            )));
        };
        let state = match args.state {
            ReportedState::Progress => {
                self.reporter.emit_to(
                    self.scope,
                    Event::WorkerProgress {
                        worker: self.id.clone(),
                        message: args.message,
                    },
                );
                return Ok(ToolOutcome::Continue("noted".into()));
            }
            ReportedState::Waiting => WorkerState::WaitingForInput,
            ReportedState::Done => WorkerState::Done,
            ReportedState::Failed => WorkerState::Failed,
        };
        *self.reported.lock().unwrap() = Some((state, args.message));
        Ok(ToolOutcome::EndTurn("status recorded".into()))
    }
}

impl HostTools for WorkerTools<'_> {
    // Its report carries the whole history's label, whatever the call had read: the
    // result of `set_status` included, which carries the handles its message named.
    fn run<'a>(
        &'a self,
        call: HostCall,
        _: &'a Label,
    ) -> BoxFuture<'a, Result<ToolOutcome, ToolError>> {
        Box::pin(std::future::ready(self.answer(call)))
    }

    fn injected(&self) -> Vec<RoutedMessage> {
        // Only the worker's own loop takes this lock, and never during a turn.
        match self.inbox.try_lock() {
            Ok(mut inbox) => drain(&mut inbox),
            Err(_) => Vec::new(),
        }
    }
}
