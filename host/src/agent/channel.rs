//! A channel: one conversation with the user. It delegates and never touches the world.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::sync::mpsc;

use super::audience::{EndsOnDrop, Scope};
use super::compactor::compact_if_needed;
use super::events::Event;
use super::exchange::ReplyPart;
use super::inbox::{ChannelHandle, ChannelInput, RoutedMessage, drain};
use super::process_calls::ProcessCalls;
use super::prompts::system_prompt;
use super::repeats::{answer_repeated, take_repeated};
use super::reporter::Reporter;
use super::spawning::ChannelKit;
use super::tool_calls::{HostTools, ProcessTools};
use super::turn::{ToolOutcome, TurnEnd, Unanswered, repair};
use crate::dispatch::Route;
use crate::flow::Label;
use crate::ids::ProcessId;
use crate::llm::{AnswerSink, BoxFuture, Delta, Message};
use crate::plugin::ToolError;
use crate::policy::ProcessKind;
use crate::secrets::StreamRedactor;
use crate::services::{Answer, ForwardId};
use crate::tools::HostCall;

/// Retrigger turns (after results) one user message may cause; later results are kept in
/// the history for the next turn instead.
const MAX_RETRIGGERS_PER_MESSAGE: u32 = 8;

/// The channel's inbox, read in batches: whatever arrived together becomes one turn,
/// except that a notification is always a turn of its own.
struct Batches {
    inbox: mpsc::UnboundedReceiver<ChannelInput>,
    carried: Option<ChannelInput>,
    closing: bool,
}

/// What the channel's loop does next.
enum Next {
    /// A turn, beginning with this input.
    Input(ChannelInput),
    /// Store the history again: the store refused it last time.
    StoreAgain,
}

impl Batches {
    /// The first input of the next turn, or, with `retry`, [`Next::StoreAgain`] once that
    /// long has passed with no input; `None` once the channel closes.
    async fn first(&mut self, retry: Option<std::time::Duration>) -> Option<Next> {
        if self.closing {
            return None;
        }
        let first = match (self.carried.take(), retry) {
            (Some(input), _) => input,
            (None, None) => self.inbox.recv().await?,
            (None, Some(retry)) => tokio::select! {
                input = self.inbox.recv() => input?,
                () = tokio::time::sleep(retry) => return Some(Next::StoreAgain),
            },
        };
        (!matches!(first, ChannelInput::Close)).then_some(Next::Input(first))
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
pub(crate) async fn run(
    kit: ChannelKit,
    name: ProcessId,
    handle: ChannelHandle,
    inbox: mpsc::UnboundedReceiver<ChannelInput>,
    mut history: Vec<Message>,
) {
    let kind = name.kind();
    let tools = kit.gate.tool_defs(kind);
    let system = system_prompt(kind, &kit.settings.agent_name);
    // The channel's own plugin instances and audit rows, for its life.
    let calls = Arc::new(ProcessCalls::new(name.session()));
    let audience = &handle.audience;
    // After the loop ends every exchange itself, this finds none; after a panic, the rest.
    let _ends = EndsOnDrop(audience.clone());
    let retry = kit.settings.limits.store_retry;
    let mut batches = Batches {
        inbox,
        carried: None,
        closing: false,
    };
    let mut retriggers = 0;
    // How much of `history` the store holds, and whether that stored prefix changed (a
    // history opened from the spill file is not stored yet, and is written first).
    let mut saved = history.len();
    let mut rewrite = audience.is_unsaved();
    // Whether the store's last refusal may pass (then the history is written again on a
    // timer; otherwise at the next turn, or the stop).
    let mut transient = rewrite;
    // Answers for other hosts' messages, held until the history holding them is stored.
    let mut held: Vec<(ForwardId, Answer)> = Vec::new();
    loop {
        let first = match batches.first((rewrite && transient).then_some(retry)).await {
            None => break,
            Some(Next::Input(first)) => first,
            Some(Next::StoreAgain) => {
                // Kept in memory while the store refused it: written whole, in order.
                let stored = kit
                    .conversations
                    .save_history(&name, &handle, &history, 0)
                    .await;
                (rewrite, transient) = (stored.is_err(), stored.is_err_and(|e| e.is_transient()));
                if !rewrite {
                    kit.reporter
                        .answer_forwarded(std::mem::take(&mut held))
                        .await;
                }
                saved = history.len();
                continue;
            }
        };
        let route = match first {
            ChannelInput::User { .. } => Route::User,
            ChannelInput::Notification(_) => Route::Notification,
            _ => Route::Retrigger,
        };
        // Reserved before the settle wait, so no other route can take this idle edge.
        let lease = kit.gate.lease_loop(&name);
        if route != Route::User {
            tokio::time::sleep(kit.gate.dispatcher().settings().settle).await;
        }
        let mut inputs = batches.rest(first);
        // A message sent again with a key the conversation took is answered, not taken:
        // one sent twice in this batch is taken once, and its repeat (answered after the
        // first is attached) follows the first.
        let repeated = take_repeated(&mut inputs, &history, audience);
        // The turn's work: the exchanges of its messages follow it, and those that
        // followed a worker or branch whose report it takes in follow it from now on.
        let turn = audience.next_turn();
        for input in &mut inputs {
            match input {
                ChannelInput::User { exchange, .. } => {
                    if let Some(listener) = exchange.take() {
                        turn.attach(*listener);
                    }
                }
                ChannelInput::Result { source, kind, .. } => {
                    turn.took_report(source, kind.is_last());
                }
                ChannelInput::Notification(note) => {
                    turn.took_report(&note.source, note.kind.is_last());
                }
                ChannelInput::Close => {}
            }
        }
        for input in repeated {
            answer_repeated(&kit.reporter, audience, &history, input);
            handle.done_pending();
        }
        if inputs.is_empty() {
            continue;
        }
        let from_user = inputs
            .iter()
            .any(|i| matches!(i, ChannelInput::User { .. }));
        // The turn is a child of the span of its first input's sender, if it named one
        // (a client's, or the call that spawned the worker reporting).
        let trace = inputs
            .iter()
            .find_map(|input| match input {
                ChannelInput::User { trace, .. } | ChannelInput::Result { trace, .. }
                    if !trace.is_none() =>
                {
                    Some(trace.clone())
                }
                _ => None,
            })
            .unwrap_or_default();
        history.extend(inputs.iter().map(ChannelInput::message));
        if from_user {
            retriggers = 0;
        } else if route == Route::Retrigger {
            retriggers += 1;
        }
        let route = if from_user { Route::User } else { route };
        // For the hosts that forwarded any of the inputs and wait for the answer.
        let mut answer = Answer::default();
        let allowed = route != Route::Retrigger || retriggers <= MAX_RETRIGGERS_PER_MESSAGE;
        match &lease {
            Err(held) if allowed => {
                // Whoever holds the session answers; the inputs wait in the history.
                let error = format!(
                    "not answered yet ({held}); the message is in the conversation's history"
                );
                turn.model_failed(&error);
                kit.reporter.emit_to(
                    &turn,
                    Event::TurnSuppressed {
                        process: name.clone(),
                        reason: held.to_string(),
                    },
                );
                answer.error = Some(error);
            }
            Ok(lease) if allowed => {
                // Anything but appending since the last save means a rewrite of the stored copy.
                rewrite |= repair(&mut history);
                // A compaction the turn waits for is part of its trace.
                let compacting = compact_if_needed(&kit.compactor, &name, &turn, &mut history);
                rewrite |= trace.clone().scope(compacting).await;
                let host_tools = ChannelTools {
                    kit: kit.clone(),
                    channel: name.clone(),
                    handle: handle.clone(),
                    turn: turn.clone(),
                    fork: history.clone(),
                    delivered: Mutex::default(),
                };
                let tools_handler =
                    ProcessTools::new(&kit.gate, &kit.reporter, &name, &calls, &turn, &host_tools);
                let text_out = StreamedText {
                    reporter: &kit.reporter,
                    channel: &name,
                    turn: &turn,
                    redactor: Mutex::new(kit.reporter.redactor().steady_stream()),
                    streamed: std::sync::atomic::AtomicBool::new(false),
                };
                let mut prompt = kit.gate.turn(&name, lease.ticket(), route, &system, &tools);
                prompt.deltas = &text_out;
                prompt.trace = trace;
                let ran = prompt.run(&mut history, &tools_handler).await;
                text_out.finish();
                match ran {
                    Ok(TurnEnd::Text(text)) if !text.trim().is_empty() => {
                        let streamed = text_out.streamed();
                        if let Some(text) = kit.reporter.deliver_reply(&name, &turn, text, streamed)
                        {
                            host_tools.delivered.lock().unwrap().push(text);
                        }
                    }
                    Ok(_) => {}
                    // Suppressed: whoever holds the session answers; not a reason to retry.
                    Err(err) => {
                        let error = kit.reporter.redactor().redact_owned(err.to_string());
                        turn.model_failed(&error);
                        answer.error = Some(error);
                        match err.reason {
                            Unanswered::Suppressed(reason) => kit.reporter.emit_to(
                                &turn,
                                Event::TurnSuppressed {
                                    process: name.clone(),
                                    reason,
                                },
                            ),
                            _ => kit.reporter.model_failed(&turn, &name, &err),
                        }
                    }
                }
                answer.reply = host_tools.delivered.into_inner().unwrap().join("\n\n");
            }
            _ => {}
        }
        drop(lease);
        rewrite |= history.len() < saved;
        let from = if rewrite { 0 } else { saved };
        // A failed save is reported; the next one rewrites the whole history.
        let stored = kit
            .conversations
            .save_history(&name, &handle, &history, from)
            .await;
        (rewrite, transient) = (stored.is_err(), stored.is_err_and(|e| e.is_transient()));
        saved = history.len();
        // Its exchanges end now if the store took the history, else once it does.
        turn.over();
        held.extend(forwarded_ids(&inputs).map(|id| (id, answer.clone())));
        if !rewrite {
            kit.reporter
                .answer_forwarded(std::mem::take(&mut held))
                .await;
        }
        for _ in &inputs {
            handle.done_pending();
        }
    }
    // Nothing this loop reserved outlives it.
    kit.gate.release_process(&name);
    // What the store refused is written once more before the conversation stops; what
    // still does not go in is reported, never dropped in silence.
    let flushed = if rewrite {
        flush(&kit, &name, &handle, &history).await
    } else {
        Ok(())
    };
    // Noted before the exchanges hear it, so a door that heard it finds it in the report.
    if let Err(error) = &flushed {
        kit.conversations
            .not_saved_at_stop(&name, &history, error.clone());
        for (_, answer) in &mut held {
            answer.error = Some(error.clone());
            answer.outcome = crate::services::AnswerOutcome::NotStored;
        }
    }
    kit.reporter.answer_forwarded(held).await;
    audience.end_all(flushed.as_ref().map(drop).map_err(String::as_str));
    // Reports that arrived as the channel closed are kept, not dropped.
    let carried = batches.carried.take();
    let left: Vec<ChannelInput> = carried
        .into_iter()
        .chain(drain(&mut batches.inbox))
        .collect();
    for input in left {
        match input {
            ChannelInput::Result {
                source,
                kind,
                text,
                label,
                ..
            } => {
                kit.reporter
                    .fold_back(&name, &source, &name, kind, &text, &label)
                    .await;
            }
            ChannelInput::Notification(note) => tracing::warn!(
                channel = %name,
                key = %note.key,
                "the channel closed before telling a late report; it stays in working memory"
            ),
            // Lost with the channel, as a message sent here would be (its exchange ends
            // lost); one another host forwarded stays in the inbox, and is taken again
            // once this run ends.
            ChannelInput::User { .. } => {}
            ChannelInput::Close => continue,
        }
        handle.done_pending();
    }
}

/// Writes `history` whole, as conversation `name` stops after the store refused it: up
/// to `limits.stop_flush_attempts` times, `limits.store_retry_ms` apart. The store's last error if
/// it never took it.
async fn flush(
    kit: &ChannelKit,
    name: &ProcessId,
    handle: &ChannelHandle,
    history: &[Message],
) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..kit.settings.limits.stop_flush_attempts {
        if attempt > 0 {
            tokio::time::sleep(kit.settings.limits.store_retry).await;
        }
        match kit
            .conversations
            .save_history(name, handle, history, 0)
            .await
        {
            Ok(()) => return Ok(()),
            Err(err) => last = kit.reporter.redactor().redact_owned(err.to_string()),
        }
    }
    Err(last)
}

/// The numbers of the `inputs` another host forwarded.
fn forwarded_ids(inputs: &[ChannelInput]) -> impl Iterator<Item = ForwardId> + '_ {
    inputs.iter().filter_map(|input| match input {
        ChannelInput::User {
            forwarded: Some(id),
            ..
        } => Some(*id),
        _ => None,
    })
}

/// Passes the text of a channel's answer on as [`Event::Text`] while the model streams
/// it, so a person sees the reply as it is written: redacted as one steady stream, so a
/// secret the model writes across several deltas is hidden whole, and what is held back
/// (always the last few bytes, as many as the longest value less one) tells a user who
/// asks the model to repeat a guess nothing of any value.
struct StreamedText<'a> {
    reporter: &'a Reporter,
    channel: &'a ProcessId,
    /// The turn whose exchanges wait for the reply.
    turn: &'a Scope,
    redactor: Mutex<StreamRedactor>,
    /// Whether any text went out.
    streamed: std::sync::atomic::AtomicBool,
}

impl StreamedText<'_> {
    fn send(&self, text: Vec<u8>) {
        // Not even in part from a host that may no longer answer the conversation.
        if text.is_empty() || !self.reporter.is_live() {
            return;
        }
        let text = String::from_utf8_lossy(&text).into_owned();
        self.streamed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.turn.send(&ReplyPart::Text(text.clone()));
        self.reporter.emit(Event::Text {
            channel: self.channel.clone(),
            text,
        });
    }

    /// Whether any of the turn's text went out as it was written.
    fn streamed(&self) -> bool {
        self.streamed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends what was held back: the turn's text is over.
    fn finish(&self) {
        let rest = self.redactor.lock().unwrap().finish();
        self.send(rest);
    }
}

impl AnswerSink for StreamedText<'_> {
    fn delta(&self, delta: Delta) {
        if let Delta::Text(text) = delta {
            let safe = self.redactor.lock().unwrap().push(text.as_bytes());
            self.send(safe);
        }
    }
}

/// The host tools a conversation (channel or cortex) runs.
struct ChannelTools {
    kit: ChannelKit,
    channel: ProcessId,
    handle: ChannelHandle,
    /// The turn: the workers and branches it starts, and those it routes messages to,
    /// are part of its work.
    turn: Scope,
    /// The history a branch forks from.
    fork: Vec<Message>,
    /// The replies delivered in this turn.
    delivered: Mutex<Vec<String>>,
}

/// The worker a model named, if the text is a worker's id.
fn worker_id(text: &str) -> Option<ProcessId> {
    text.trim()
        .parse::<ProcessId>()
        .ok()
        .filter(|id| id.kind() == ProcessKind::Worker)
}

impl ChannelTools {
    async fn answer(&self, call: HostCall, context: &Label) -> Result<ToolOutcome, ToolError> {
        let kit = &self.kit;
        let supervisor = &kit.supervisor;
        let answer = |value: serde_json::Value| Ok(ToolOutcome::Continue(value.to_string()));
        match call {
            HostCall::Reply(args) => {
                let turn = &self.turn;
                if let Some(text) =
                    kit.reporter
                        .deliver_reply(&self.channel, turn, args.text.clone(), false)
                {
                    self.delivered.lock().unwrap().push(text);
                    Ok(ToolOutcome::Delivered(args.text))
                } else {
                    Ok(ToolOutcome::EndTurn(
                        "not delivered: this host may no longer answer the conversation".into(),
                    ))
                }
            }
            HostCall::Skip(_) => Ok(ToolOutcome::EndTurn("skipped".into())),
            HostCall::SpawnWorker(args) => kit
                .spawner
                .spawn_worker_tool(&self.channel, None, &self.turn, args, context)
                .await
                .map(ToolOutcome::Continue),
            HostCall::Branch(args) => {
                let branched = kit.spawner.spawn_branch(
                    &self.channel,
                    &self.handle,
                    &self.turn,
                    args.question,
                    self.fork.clone(),
                    context,
                );
                match branched.await {
                    Ok(id) => answer(json!({ "branched": true, "branch": id })),
                    Err(why) => Err(ToolError::Failed(format!("branch: {why}"))),
                }
            }
            HostCall::Route(args) => {
                // Who waits on this turn hears what the worker does with the message: a
                // worker a route reaches has not reported its end yet.
                let routed = |id: ProcessId| {
                    let following = || self.turn.include(&id);
                    // The worker reads it as what this channel had read.
                    let message = RoutedMessage {
                        text: args.message.clone(),
                        label: context.clone(),
                    };
                    supervisor.route_from(&self.channel, &id, message, following)
                };
                if worker_id(&args.worker).is_some_and(routed) {
                    answer(json!({ "routed": true, "worker": args.worker }))
                } else {
                    answer(json!({
                        "routed": false,
                        "worker": args.worker,
                        "reason": "no such running worker; the message was not delivered",
                    }))
                }
            }
            HostCall::Cancel(args) => {
                if worker_id(&args.worker)
                    .is_some_and(|id| supervisor.cancel_from(&self.channel, &id))
                {
                    answer(json!({ "cancelled": true, "worker": args.worker }))
                } else {
                    answer(json!({
                        "cancelled": false,
                        "worker": args.worker,
                        "reason": "no such running worker",
                    }))
                }
            }
            HostCall::SetStatus(_) => Err(ToolError::Denied(
                "`set_status` is a worker's tool, not a conversation's".into(),
            )),
            // Answered by the process's tool calls, which hold its handles.
            HostCall::AskAbout(_) => Err(ToolError::Failed(
                "`ask_about` reached the conversation instead of its handles".into(),
            )),
        }
    }
}

impl HostTools for ChannelTools {
    fn run<'a>(
        &'a self,
        call: HostCall,
        context: &'a Label,
    ) -> BoxFuture<'a, Result<ToolOutcome, ToolError>> {
        Box::pin(self.answer(call, context))
    }
}
