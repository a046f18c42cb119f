//! A channel: one conversation with the user. It delegates and never touches the world.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::branch::supervise_branch;
use super::compactor::compact_if_needed;
use super::drain;
use super::events::Event;
use super::notifications::{Notification, NotificationKind, fold_back};
use super::prompts::system_prompt;
use super::runtime::{ChannelHandle, Runtime, SpawnOutcome};
use super::turn::{ToolHandler, ToolOutcome, Turn, TurnEnd, Unanswered, repair};
use crate::dispatch::Route;
use crate::ids::ProcessId;
use crate::llm::{AnswerSink, BoxFuture, Delta, Message};
use crate::policy::ProcessKind;

/// Retrigger turns (after results) one user message may cause; later results are kept in
/// the history for the next turn instead.
const MAX_RETRIGGERS_PER_MESSAGE: u32 = 8;

/// What a channel reacts to.
#[derive(Debug, Clone)]
pub(crate) enum ChannelInput {
    /// A message from the user.
    User(String),
    /// A worker's or branch's report.
    Result {
        /// e.g. `worker:3`.
        source: ProcessId,
        /// What kind of report it is (kept as such if the channel closes first).
        kind: NotificationKind,
        /// What it reports.
        text: String,
    },
    /// A report that arrived after its requester ended, saved in working memory; told in
    /// a turn of its own.
    Notification(Notification),
    /// Stop after the inputs before this one.
    Close,
}

impl ChannelInput {
    /// The history message for this input.
    fn message(&self) -> Message {
        match self {
            ChannelInput::User(text) => Message::user(text.clone()),
            ChannelInput::Result { source, text, .. } => {
                Message::user(format!("[{source}] {text}"))
            }
            ChannelInput::Notification(note) => Message::user(note.message()),
            ChannelInput::Close => unreachable!("Close ends the loop before it is batched"),
        }
    }
}

/// The channel's inbox, read in batches: whatever arrived together becomes one turn,
/// except that a notification is always a turn of its own.
struct Batches {
    inbox: mpsc::UnboundedReceiver<ChannelInput>,
    carried: Option<ChannelInput>,
    closing: bool,
}

impl Batches {
    async fn first(&mut self) -> Option<ChannelInput> {
        if self.closing {
            return None;
        }
        let first = match self.carried.take() {
            Some(input) => input,
            None => self.inbox.recv().await?,
        };
        (!matches!(first, ChannelInput::Close)).then_some(first)
    }

    /// The inputs queued behind `first` that join its turn.
    fn rest(&mut self, first: ChannelInput) -> Vec<ChannelInput> {
        if matches!(first, ChannelInput::Notification(_)) {
            return vec![first];
        }
        let mut batch = vec![first];
        loop {
            match self.inbox.try_recv() {
                Ok(ChannelInput::Close) => {
                    self.closing = true;
                    break;
                }
                Ok(note @ ChannelInput::Notification(_)) => {
                    self.carried = Some(note);
                    break;
                }
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        batch
    }
}

/// The channel's loop: each batch of inputs becomes one turn. `name`'s kind is
/// [`ProcessKind::Channel`] for a conversation with the user, [`ProcessKind::Cortex`] for
/// the admin chat (same loop, the cortex profile's tools, its own session and history).
///
/// Every turn goes through the prompt gate: the loop reserves its session (as
/// `<kind>:<name>:loop`) before the settle wait, so nothing else can prompt the session
/// while it answers, and releases it (the hold still runs) once the turn is over.
pub(crate) async fn run_channel(
    rt: Arc<Runtime>,
    name: ProcessId,
    handle: ChannelHandle,
    inbox: mpsc::UnboundedReceiver<ChannelInput>,
    mut history: Vec<Message>,
) {
    let kind = name.kind();
    let tools = rt.tool_defs(kind);
    let system = system_prompt(kind, &rt.config.agent.name);
    let mut batches = Batches {
        inbox,
        carried: None,
        closing: false,
    };
    let mut retriggers = 0;
    // How much of `history` the store holds, and whether that stored prefix changed.
    let mut saved = history.len();
    let mut rewrite = false;
    while let Some(first) = batches.first().await {
        let route = match first {
            ChannelInput::User(_) => Route::User,
            ChannelInput::Notification(_) => Route::Notification,
            _ => Route::Retrigger,
        };
        // Reserved before the settle wait, so no other route can take this idle edge.
        let lease = rt.lease_loop(&name);
        if route != Route::User {
            tokio::time::sleep(rt.dispatcher.settings().settle).await;
        }
        let inputs = batches.rest(first);
        let from_user = inputs.iter().any(|i| matches!(i, ChannelInput::User(_)));
        history.extend(inputs.iter().map(ChannelInput::message));
        if from_user {
            retriggers = 0;
        } else if route == Route::Retrigger {
            retriggers += 1;
        }
        let route = if from_user { Route::User } else { route };
        let allowed = route != Route::Retrigger || retriggers <= MAX_RETRIGGERS_PER_MESSAGE;
        match &lease {
            Err(held) if allowed => {
                // Whoever holds the session answers; the inputs wait in the history.
                rt.status(
                    &name,
                    format!("not sent: {held}; the inputs stay in the history"),
                );
            }
            Ok(lease) if allowed => {
                // Anything but appending since the last save means a rewrite of the stored copy.
                rewrite |= repair(&mut history);
                rewrite |= compact_if_needed(&rt, &mut history).await;
                let tools_handler = ChannelTools {
                    rt: rt.clone(),
                    kind,
                    channel: name.clone(),
                    handle: handle.clone(),
                    fork: history.clone(),
                };
                let text_out = StreamedText {
                    rt: &rt,
                    channel: &name,
                };
                let turn = Turn {
                    dispatcher: &rt.dispatcher,
                    ticket: lease.ticket(),
                    route,
                    process: kind.as_str(),
                    system: &system,
                    tools: &tools,
                    max_turns: rt.config.limits.max_turns,
                    deltas: &text_out,
                };
                match turn.run(&mut history, &tools_handler).await {
                    Ok(TurnEnd::Text(text)) if !text.trim().is_empty() => rt.emit(Event::Reply {
                        channel: name.clone(),
                        text,
                    }),
                    Ok(_) => {}
                    // Suppressed: whoever holds the session answers; not a reason to retry.
                    Err(err) if matches!(err.reason, Unanswered::Suppressed(_)) => {
                        rt.status(&name, format!("{err}; the inputs stay in the history"))
                    }
                    Err(err) => {
                        rt.model_failed(&name, &err);
                        rt.status(&name, format!("the model failed: {err}"));
                    }
                }
            }
            _ => {}
        }
        drop(lease);
        rewrite |= history.len() < saved;
        let from = if rewrite { 0 } else { saved };
        // A failed save is reported; the next one rewrites the whole history.
        rewrite = rt.save_history(&name, &history, from).is_err();
        saved = history.len();
        for _ in &inputs {
            handle.done_pending();
        }
    }
    // Nothing this loop reserved outlives it.
    rt.release_process(&name);
    // Reports that arrived as the channel closed are kept, not dropped.
    let carried = batches.carried.take();
    let left: Vec<ChannelInput> = carried
        .into_iter()
        .chain(drain(&mut batches.inbox))
        .collect();
    for input in left {
        match input {
            ChannelInput::Result { source, kind, text } => {
                fold_back(&rt, &name, &source, &name, kind, &text);
            }
            ChannelInput::Notification(note) => tracing::warn!(
                channel = %name,
                key = %note.key,
                "the channel closed before telling a late report; it stays in working memory"
            ),
            ChannelInput::User(_) => {}
            ChannelInput::Close => continue,
        }
        handle.done_pending();
    }
}

/// Passes the text of a channel's answer on as [`Event::Text`] while the model streams
/// it, so a person sees the reply as it is written.
struct StreamedText<'a> {
    rt: &'a Runtime,
    channel: &'a ProcessId,
}

impl AnswerSink for StreamedText<'_> {
    fn delta(&self, delta: Delta) {
        if let Delta::Text(text) = delta {
            self.rt.emit(Event::Text {
                channel: self.channel.clone(),
                text,
            });
        }
    }
}

/// The channel's host tools.
struct ChannelTools {
    rt: Arc<Runtime>,
    kind: ProcessKind,
    channel: ProcessId,
    handle: ChannelHandle,
    /// The history a branch forks from.
    fork: Vec<Message>,
}

#[derive(Deserialize)]
struct ReplyArgs {
    text: String,
}

#[derive(Deserialize)]
pub(crate) struct SpawnArgs {
    task: String,
    #[serde(default)]
    interactive: bool,
    /// Assign the worker to this task on the board, so it may update it.
    #[serde(default)]
    task_number: Option<u64>,
}

#[derive(Deserialize)]
struct BranchArgs {
    question: String,
}

#[derive(Deserialize)]
struct RouteArgs {
    worker: String,
    message: String,
}

#[derive(Deserialize)]
struct CancelArgs {
    worker: String,
}

/// Parses host-tool arguments, or says what is wrong for the model.
pub(crate) fn parse_args<'a, T: Deserialize<'a>>(
    tool: &str,
    arguments: &'a str,
) -> Result<T, String> {
    serde_json::from_str(arguments).map_err(|err| format!("error[invalid-args]: {tool}: {err}"))
}

impl ChannelTools {
    fn reply(&self, arguments: &str) -> ToolOutcome {
        match parse_args::<ReplyArgs>("reply", arguments) {
            Ok(args) => {
                self.rt.emit(Event::Reply {
                    channel: self.channel.clone(),
                    text: args.text.clone(),
                });
                ToolOutcome::Delivered(args.text)
            }
            Err(err) => ToolOutcome::Continue(err),
        }
    }
}

/// Runs the `spawn_worker` host tool for `channel`, on behalf of `requester` (a branch;
/// `None`: the channel): the outcome as JSON for the model.
pub(crate) fn spawn_worker_tool(
    rt: &Arc<Runtime>,
    channel: &ProcessId,
    requester: Option<&ProcessId>,
    arguments: &str,
) -> String {
    let args = match parse_args::<SpawnArgs>("spawn_worker", arguments) {
        Ok(args) => args,
        Err(err) => return err,
    };
    match rt.spawn_worker_for(
        channel,
        requester,
        &args.task,
        args.interactive,
        args.task_number,
    ) {
        Ok(SpawnOutcome::Spawned { worker }) => {
            json!({ "spawned": true, "worker": worker, "task_number": args.task_number })
                .to_string()
        }
        Ok(SpawnOutcome::Duplicate { existing }) => json!({
            "spawned": false,
            "existing_worker": existing,
            "hint": format!("{existing} is already on this task; use route to send it more input"),
        })
        .to_string(),
        Err(err) => format!("error[invalid-args]: spawn_worker: {err}"),
    }
}

/// The worker a model named, if the text is a worker's id.
fn worker_id(text: &str) -> Option<ProcessId> {
    text.trim()
        .parse::<ProcessId>()
        .ok()
        .filter(|id| id.kind() == ProcessKind::Worker)
}

impl ToolHandler for ChannelTools {
    fn refuse<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, String> {
        Box::pin(self.rt.refuse(self.kind, &self.channel, name, arguments))
    }

    fn handle<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            let rt = &self.rt;
            let outcome = match name {
                "reply" => return self.reply(arguments),
                "skip" => return ToolOutcome::EndTurn("skipped".into()),
                "spawn_worker" => spawn_worker_tool(rt, &self.channel, None, arguments),
                "branch" => match parse_args::<BranchArgs>(name, arguments) {
                    Ok(args) => match rt.new_id(ProcessKind::Branch) {
                        Ok(id) => {
                            self.handle.add_pending();
                            let fork = self.fork.clone();
                            tokio::spawn(supervise_branch(
                                rt.clone(),
                                id.clone(),
                                self.channel.clone(),
                                self.handle.clone(),
                                args.question,
                                fork,
                            ));
                            json!({ "branched": true, "branch": id }).to_string()
                        }
                        Err(err) => format!("error[failed]: branch: cannot number a new branch: {err}"),
                    },
                    Err(err) => err,
                },
                "route" => match parse_args::<RouteArgs>(name, arguments) {
                    Ok(args) if worker_id(&args.worker).is_some_and(|id| rt.route_to_worker(&id, &args.message)) => {
                        json!({ "routed": true, "worker": args.worker }).to_string()
                    }
                    Ok(args) => json!({
                        "routed": false,
                        "worker": args.worker,
                        "reason": "no such running worker; the message was not delivered",
                    })
                    .to_string(),
                    Err(err) => err,
                },
                "cancel" => match parse_args::<CancelArgs>(name, arguments) {
                    Ok(args) if worker_id(&args.worker).is_some_and(|id| rt.cancel_worker(&id)) => {
                        json!({ "cancelled": true, "worker": args.worker }).to_string()
                    }
                    Ok(args) => json!({ "cancelled": false, "worker": args.worker, "reason": "no such running worker" }).to_string(),
                    Err(err) => err,
                },
                // The profile offered a plugin tool to the channel (a custom config).
                other => {
                    rt.call_plugin(self.kind, &self.channel, other, arguments)
                        .await
                }
            };
            ToolOutcome::Continue(outcome)
        })
    }
}
