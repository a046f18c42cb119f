//! A worker: a fresh prompt and one task, file and task tools, and `set_status`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use tokio::sync::{Notify, mpsc};

use super::channel::{ChannelInput, parse_args};
use super::prompts::system_prompt;
use super::reservations::Reservation;
use super::runtime::{ChannelHandle, Runtime, WorkerHandle};
use super::turn::{ToolHandler, ToolOutcome, Turn, TurnEnd};
use crate::llm::{BoxFuture, Message};
use crate::policy::ProcessKind;
use crate::store::WorkerState;

/// What a worker is started with.
pub(crate) struct WorkerSpec {
    pub(crate) id: String,
    pub(crate) channel: String,
    pub(crate) task: String,
    pub(crate) interactive: bool,
}

/// Runs a worker to its end, records it, and reports to its channel.
/// `_reservation` holds the task description for the worker's whole life and is released
/// when this future ends or is dropped, however that happens.
pub(crate) async fn run_worker(
    rt: Arc<Runtime>,
    spec: WorkerSpec,
    channel: ChannelHandle,
    _reservation: Reservation,
) {
    // Held until the worker ends: at most max_workers_per_channel run at once.
    let _slot = channel
        .worker_slots
        .clone()
        .acquire_owned()
        .await
        .expect("never closed");
    let (inbox_tx, mut inbox) = mpsc::unbounded_channel();
    let cancel = Arc::new(Notify::new());
    rt.workers.lock().unwrap().insert(
        spec.id.clone(),
        WorkerHandle {
            inbox: inbox_tx,
            cancel: cancel.clone(),
        },
    );
    if let Err(err) = rt.store.insert_worker(&spec.id, &spec.channel, &spec.task) {
        tracing::error!(worker = %spec.id, "cannot record the worker: {err}");
    }
    rt.status(&spec.id, format!("started: {}", spec.task));

    // Whether this worker counts in its channel's pending work right now (not while it
    // waits for input); read after a cancel cut the work short.
    let counted = AtomicBool::new(true);
    let (state, outcome) = tokio::select! {
        ended = work(&rt, &spec, &channel, &counted, &mut inbox) => ended,
        () = cancel.notified() => (WorkerState::Cancelled, "cancelled on request".to_owned()),
    };

    rt.workers.lock().unwrap().remove(&spec.id);
    // Messages routed after its last turn: reported, not silently dropped.
    let mut undelivered = Vec::new();
    while let Ok(message) = inbox.try_recv() {
        undelivered.push(message);
    }
    if let Err(err) = rt.store.set_worker_state(&spec.id, state, Some(&outcome)) {
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
    channel.send(ChannelInput::Result {
        source: spec.id.clone(),
        text: report,
    });
    if counted.load(Ordering::SeqCst) {
        channel.done_pending();
    }
}

/// The worker's turns: the task, then any routed follow-ups, until it reports an end.
async fn work(
    rt: &Arc<Runtime>,
    spec: &WorkerSpec,
    channel: &ChannelHandle,
    counted: &AtomicBool,
    inbox: &mut mpsc::UnboundedReceiver<String>,
) -> (WorkerState, String) {
    let tools = rt.tool_defs(ProcessKind::Worker);
    let system = system_prompt(ProcessKind::Worker, &rt.config.agent.name);
    let mut history = vec![Message::user(spec.task.clone())];
    loop {
        let handler = WorkerTools {
            rt: rt.clone(),
            id: spec.id.clone(),
            reported: Mutex::new(None),
        };
        let turn = Turn {
            dispatcher: &rt.dispatcher,
            process: ProcessKind::Worker.as_str(),
            session: &spec.id,
            system: &system,
            tools: &tools,
            max_turns: rt.config.limits.max_turns,
        };
        let end = turn.run(&mut history, &handler).await;
        let reported = handler.reported.lock().unwrap().take();
        let (state, message) = match (end, reported) {
            (Err(err), _) => return (WorkerState::Failed, format!("the model failed: {err}")),
            (Ok(_), Some((state, message))) => (state, message),
            (Ok(TurnEnd::Text(text)), None) => (WorkerState::Done, text),
            (Ok(TurnEnd::MaxTurns), None) => {
                return (
                    WorkerState::Failed,
                    format!("ran out of its {} turns", rt.config.limits.max_turns),
                );
            }
            (Ok(TurnEnd::Ended), None) => (WorkerState::Done, String::new()),
        };
        // Messages routed while it worked are delivered before it may end.
        let mut routed = Vec::new();
        while let Ok(message) = inbox.try_recv() {
            routed.push(message);
        }
        if state == WorkerState::WaitingForInput {
            if !spec.interactive {
                return (
                    WorkerState::Done,
                    format!("asked for input, but is not interactive: {message}"),
                );
            }
            rt.status(&spec.id, format!("waiting for input: {message}"));
            if routed.is_empty() {
                if let Err(err) =
                    rt.store
                        .set_worker_state(&spec.id, WorkerState::WaitingForInput, None)
                {
                    tracing::error!(worker = %spec.id, "cannot record the worker's state: {err}");
                }
                // The user hears the question; while it waits, the worker does not keep its
                // channel busy.
                channel.send(ChannelInput::Result {
                    source: spec.id.clone(),
                    text: format!("needs input (route your answer to {}): {message}", spec.id),
                });
                counted.store(false, Ordering::SeqCst);
                channel.done_pending();
                let input = inbox.recv().await;
                channel.add_pending();
                counted.store(true, Ordering::SeqCst);
                match input {
                    Some(input) => routed.push(input),
                    None => return (WorkerState::Cancelled, "its channel closed".into()),
                }
                if let Err(err) = rt
                    .store
                    .set_worker_state(&spec.id, WorkerState::Running, None)
                {
                    tracing::error!(worker = %spec.id, "cannot record the worker's state: {err}");
                }
            }
        } else if routed.is_empty() {
            return (state, message);
        }
        for input in routed {
            history.push(Message::user(input));
        }
        history.push(Message::user("Continue with the messages above in mind."));
    }
}

/// The worker's host tool `set_status`; everything else goes to the plugins.
struct WorkerTools {
    rt: Arc<Runtime>,
    id: String,
    reported: Mutex<Option<(WorkerState, String)>>,
}

#[derive(Deserialize)]
struct StatusArgs {
    state: String,
    message: String,
}

impl ToolHandler for WorkerTools {
    fn refuse<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, String> {
        Box::pin(
            self.rt
                .refuse(ProcessKind::Worker, &self.id, name, arguments),
        )
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
