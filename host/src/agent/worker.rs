//! A worker: a fresh prompt and one task, file and task tools, and `set_status`.
//!
//! Messages routed to a worker are never lost: a worker waiting for input takes the next
//! one as its answer; a running worker gets them at its next turn boundary (the turn
//! stops there, they are added as context, and it is re-prompted to continue); what
//! arrives after its last turn is reported to the channel as not delivered.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use tokio::sync::{Mutex as AsyncMutex, Notify, mpsc};

use super::channel::parse_args;
use super::drain;
use super::notifications::{NotificationKind, fold_back, report};
use super::prompts::system_prompt;
use super::reservations::Reservation;
use super::runtime::{ChannelHandle, Runtime, WorkerHandle};
use super::supervisor::run_supervised;
use super::turn::{ToolHandler, ToolOutcome, Turn, TurnEnd};
use crate::dispatch::Route;
use crate::ids::ProcessId;
use crate::llm::{BoxFuture, Message};
use crate::policy::ProcessKind;
use crate::store::WorkerState;

/// The re-prompt after routed messages were added to a worker's history.
const CONTINUE_HINT: &str = "Continue with the messages above in mind.";

/// What a worker is started with.
pub(crate) struct WorkerSpec {
    pub(crate) id: ProcessId,
    /// The conversation it reports to.
    pub(crate) channel: ProcessId,
    pub(crate) task: String,
    pub(crate) interactive: bool,
    /// The branch that spawned it, if a branch did (else its channel did).
    pub(crate) requester: Option<ProcessId>,
}

type Inbox = Arc<AsyncMutex<mpsc::UnboundedReceiver<String>>>;

/// Runs a worker to its end, whatever the end: it finishes, fails, is cancelled, times
/// out, or panics. The worker is recorded and reported on every path, its registry entry
/// goes, and its reservation (the task description) and admission permit are released.
pub(crate) async fn supervise_worker(
    rt: Arc<Runtime>,
    spec: WorkerSpec,
    channel: ChannelHandle,
    reservation: Reservation,
) {
    // Whether this worker counts in its channel's pending work (not while it waits).
    let counted = Arc::new(AtomicBool::new(true));
    let (inbox_tx, inbox) = mpsc::unbounded_channel();
    let inbox: Inbox = Arc::new(AsyncMutex::new(inbox));
    let spec = Arc::new(spec);
    let worker = run_worker(
        rt.clone(),
        spec.clone(),
        channel.clone(),
        reservation,
        counted.clone(),
        inbox_tx,
        inbox.clone(),
    );
    if let Err(why) = run_supervised(worker).await {
        rt.workers.lock().unwrap().remove(&spec.id);
        let undelivered = drain(&mut *inbox.lock().await);
        finish(&rt, &spec, &channel, WorkerState::Failed, why, undelivered);
    }
    if counted.load(Ordering::SeqCst) {
        channel.done_pending();
    }
}

/// The worker's life, in its own task so that a panic is caught by
/// [`supervise_worker`]. `_reservation` and the admission permit drop with this future,
/// however it ends.
async fn run_worker(
    rt: Arc<Runtime>,
    spec: Arc<WorkerSpec>,
    channel: ChannelHandle,
    _reservation: Reservation,
    counted: Arc<AtomicBool>,
    inbox_tx: mpsc::UnboundedSender<String>,
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
    rt.workers.lock().unwrap().insert(
        spec.id.clone(),
        WorkerHandle {
            inbox: inbox_tx,
            cancel: cancel.clone(),
            interrupted: interrupted.clone(),
        },
    );
    let recorded = rt.store.insert_worker_in_run(
        rt.run_id(),
        &spec.id.to_string(),
        &spec.channel.to_string(),
        &spec.task,
    );
    if let Err(err) = recorded {
        tracing::error!(worker = %spec.id, "cannot record the worker: {err}");
    }
    rt.status(&spec.id, format!("started: {}", spec.task));

    let limit = rt.config.limits.worker_timeout;
    // Routed messages added to the history that no model answer has covered yet: if the
    // worker ends now (its request failed, it was cancelled or timed out mid-request),
    // they are reported as not delivered with the rest.
    let mut unanswered = Vec::new();
    let working = work(&rt, &spec, &channel, &counted, &inbox, &mut unanswered);
    let (state, outcome) = tokio::select! {
        ended = tokio::time::timeout(limit, working) => {
            ended.unwrap_or_else(|_| {
                (WorkerState::Failed, format!("timed out after {} s", limit.as_secs()))
            })
        }
        () = cancel.notified() => if interrupted.load(Ordering::SeqCst) {
            (WorkerState::Interrupted, "interrupted: the host was stopped".to_owned())
        } else {
            (WorkerState::Cancelled, "cancelled on request".to_owned())
        },
    };
    // Out of the registry first: from here on a route is refused, not queued.
    rt.workers.lock().unwrap().remove(&spec.id);
    let mut undelivered = unanswered;
    undelivered.extend(drain(&mut *inbox.lock().await));
    finish(&rt, &spec, &channel, state, outcome, undelivered);
}

/// Records the worker's end and reports it: to its channel, or, when the branch that
/// asked for it has ended, as a late notification.
fn finish(
    rt: &Arc<Runtime>,
    spec: &WorkerSpec,
    channel: &ChannelHandle,
    state: WorkerState,
    outcome: String,
    undelivered: Vec<String>,
) {
    rt.release_process(&spec.id);
    let recorded = rt
        .store
        .set_worker_state(&spec.id.to_string(), state, Some(&outcome));
    if let Err(err) = recorded {
        tracing::error!(worker = %spec.id, "cannot record the worker's end: {err}");
    }
    rt.status(&spec.id, format!("{state}: {outcome}"));
    let mut report = format!("finished ({state}): {outcome}");
    if !undelivered.is_empty() {
        report.push_str(&format!(
            "\n{} message(s) routed to it arrived after it finished and were not delivered: {}",
            undelivered.len(),
            undelivered.join(" | ")
        ));
    }
    let kind = match state {
        WorkerState::Done => NotificationKind::Result,
        WorkerState::Cancelled | WorkerState::Interrupted => NotificationKind::Status,
        WorkerState::WaitingForInput => NotificationKind::InputRequired,
        WorkerState::Failed | WorkerState::Running => NotificationKind::Error,
    };
    tell(rt, spec, channel, kind, report);
}

/// Sends `text` to the worker's channel, or folds it back if its requester has ended.
fn tell(
    rt: &Arc<Runtime>,
    spec: &WorkerSpec,
    channel: &ChannelHandle,
    kind: NotificationKind,
    text: String,
) {
    let late_for = spec
        .requester
        .as_ref()
        .filter(|branch| !rt.branch_alive(branch));
    match late_for {
        Some(requester) => {
            fold_back(rt, &spec.channel, &spec.id, requester, kind, &text);
        }
        None => report(rt, &spec.channel, channel, &spec.id, kind, text),
    }
}

/// The worker's turns: the task, then any routed follow-ups, until it reports an end.
async fn work(
    rt: &Arc<Runtime>,
    spec: &WorkerSpec,
    channel: &ChannelHandle,
    counted: &AtomicBool,
    inbox: &Inbox,
    unanswered: &mut Vec<String>,
) -> (WorkerState, String) {
    let tools = rt.tool_defs(ProcessKind::Worker);
    let system = system_prompt(ProcessKind::Worker, &rt.config.agent.name);
    let lease = match rt.lease_loop(&spec.id) {
        Ok(lease) => lease,
        Err(held) => return (WorkerState::Failed, format!("cannot prompt: {held}")),
    };
    let mut history = vec![Message::user(spec.task.clone())];
    let mut route = Route::Task;
    loop {
        let handler = WorkerTools {
            rt: rt.clone(),
            id: spec.id.clone(),
            reported: Mutex::new(None),
            inbox,
        };
        let turn = Turn {
            dispatcher: &rt.dispatcher,
            ticket: lease.ticket(),
            route,
            process: ProcessKind::Worker.as_str(),
            system: &system,
            tools: &tools,
            max_turns: rt.config.limits.max_turns,
            deltas: &(),
        };
        let end = turn.run(&mut history, &handler).await;
        if !matches!(&end, Err(err) if err.answered == 0) {
            unanswered.clear();
        }
        let reported = handler.reported.lock().unwrap().take();
        let (state, message) = match (end, reported) {
            (Err(err), _) => {
                rt.model_failed(&spec.id, &err);
                return (WorkerState::Failed, format!("the model failed: {err}"));
            }
            (Ok(TurnEnd::Injected(messages)), _) => {
                // Stopped at a boundary with every call answered: add the messages and go
                // on. Not a retry, so it uses no budget of any kind.
                rt.status(
                    &spec.id,
                    format!("{} routed message(s) injected", messages.len()),
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
                    format!("ran out of its {} turns", rt.config.limits.max_turns),
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
            rt.status(&spec.id, format!("waiting for input: {message}"));
            if routed.is_empty() {
                if let Err(err) = rt.store.set_worker_state(
                    &spec.id.to_string(),
                    WorkerState::WaitingForInput,
                    None,
                ) {
                    tracing::error!(worker = %spec.id, "cannot record the worker's state: {err}");
                }
                // The user hears the question; while it waits, the worker does not keep its
                // channel busy.
                tell(
                    rt,
                    spec,
                    channel,
                    NotificationKind::InputRequired,
                    format!("needs input (route your answer to {}): {message}", spec.id),
                );
                counted.store(false, Ordering::SeqCst);
                channel.done_pending();
                let input = inbox.lock().await.recv().await;
                channel.add_pending();
                counted.store(true, Ordering::SeqCst);
                match input {
                    Some(input) => routed.push(input),
                    None => return (WorkerState::Cancelled, "its channel closed".into()),
                }
                if let Err(err) =
                    rt.store
                        .set_worker_state(&spec.id.to_string(), WorkerState::Running, None)
                {
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
fn continue_with(history: &mut Vec<Message>, messages: Vec<String>) -> Vec<String> {
    history.extend(messages.iter().cloned().map(Message::user));
    history.push(Message::user(CONTINUE_HINT));
    messages
}

/// The worker's host tool `set_status`; everything else goes to the plugins.
struct WorkerTools<'w> {
    rt: Arc<Runtime>,
    id: ProcessId,
    reported: Mutex<Option<(WorkerState, String)>>,
    inbox: &'w Inbox,
}

#[derive(Deserialize)]
struct StatusArgs {
    state: String,
    message: String,
}

impl ToolHandler for WorkerTools<'_> {
    fn refuse<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, String> {
        Box::pin(
            self.rt
                .refuse(ProcessKind::Worker, &self.id, name, arguments),
        )
    }

    fn injected(&self) -> Vec<String> {
        // Only the worker's own loop takes this lock, and never during a turn.
        match self.inbox.try_lock() {
            Ok(mut inbox) => drain(&mut inbox),
            Err(_) => Vec::new(),
        }
    }

    fn handle<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            if name != "set_status" {
                return ToolOutcome::Continue(
                    self.rt
                        .call_plugin(ProcessKind::Worker, &self.id, name, arguments)
                        .await,
                );
            }
            let args = match parse_args::<StatusArgs>(name, arguments) {
                Ok(args) => args,
                Err(err) => return ToolOutcome::Continue(err),
            };
            let state = match args.state.as_str() {
                "progress" => {
                    self.rt.status(&self.id, args.message);
                    return ToolOutcome::Continue("noted".into());
                }
                "waiting" => WorkerState::WaitingForInput,
                "done" => WorkerState::Done,
                "failed" => WorkerState::Failed,
                other => {
                    return ToolOutcome::Continue(format!(
                        "error[invalid-args]: set_status: unknown state `{other}`; use progress, waiting, done or failed"
                    ));
                }
            };
            *self.reported.lock().unwrap() = Some((state, args.message));
            ToolOutcome::EndTurn("status recorded".into())
        })
    }
}
