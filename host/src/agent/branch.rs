//! A branch: a fork of the channel's history that thinks about one question and returns a
//! conclusion.

use std::sync::Arc;

use super::channel::spawn_worker_tool;
use super::notifications::{NotificationKind, report};
use super::prompts::system_prompt;
use super::runtime::{ChannelHandle, Runtime};
use super::supervisor::run_supervised;
use super::turn::{ToolHandler, ToolOutcome, Turn, TurnEnd, TurnError};
use crate::dispatch::Route;
use crate::ids::ProcessId;
use crate::llm::{BoxFuture, Message};
use crate::policy::ProcessKind;

/// Runs a branch to its end, whatever the end: it concludes, its model fails, or it
/// panics. Like a worker, it is reported to its channel on every path, and its channel's
/// pending count is released, so `wait_idle` never hangs on a branch that died.
pub(crate) async fn supervise_branch(
    rt: Arc<Runtime>,
    id: ProcessId,
    channel_name: ProcessId,
    channel: ChannelHandle,
    question: String,
    history: Vec<Message>,
) {
    let branch = run_branch(
        rt.clone(),
        id.clone(),
        channel_name.clone(),
        channel.clone(),
        question,
        history,
    );
    if let Err(why) = run_supervised(branch).await {
        rt.release_process(&id);
        rt.status(&id, format!("failed: {why}"));
        report(
            &rt,
            &channel_name,
            &channel,
            &id,
            NotificationKind::Error,
            format!("failed: {why}"),
        );
    }
    channel.done_pending();
}

/// The branch's life: think, then send the conclusion to the channel it came from.
async fn run_branch(
    rt: Arc<Runtime>,
    id: ProcessId,
    channel_name: ProcessId,
    channel: ChannelHandle,
    question: String,
    mut history: Vec<Message>,
) {
    let _slot = channel
        .branch_slots
        .clone()
        .acquire_owned()
        .await
        .expect("never closed");
    let alive = rt.branch_started(&id);
    rt.status(&id, format!("thinking: {question}"));
    history.push(Message::user(format!("Branch question: {question}")));
    let tools = rt.tool_defs(ProcessKind::Branch);
    let system = system_prompt(ProcessKind::Branch, &rt.config.agent.name);
    let handler = BranchTools {
        rt: rt.clone(),
        id: id.clone(),
        channel_name: channel_name.clone(),
    };
    let conclusion = match rt.lease_loop(&id) {
        Err(held) => format!("(could not think: {held})"),
        Ok(lease) => {
            let turn = Turn {
                dispatcher: &rt.dispatcher,
                ticket: lease.ticket(),
                route: Route::Branch,
                process: ProcessKind::Branch.as_str(),
                system: &system,
                tools: &tools,
                max_turns: rt.config.limits.max_turns,
                deltas: &(),
            };
            let end = turn.run(&mut history, &handler).await;
            if let Err(err) = &end {
                rt.model_failed(&id, err);
            }
            conclude(&rt, end)
        }
    };
    drop(alive);
    rt.release_process(&id);
    rt.status(&id, format!("concluded: {conclusion}"));
    report(
        &rt,
        &channel_name,
        &channel,
        &id,
        NotificationKind::Result,
        format!("concluded: {conclusion}"),
    );
}

/// A branch's conclusion from how its turn ended.
fn conclude(rt: &Runtime, end: Result<TurnEnd, TurnError>) -> String {
    match end {
        Ok(TurnEnd::Text(text) | TurnEnd::Delivered(text)) => text,
        Ok(TurnEnd::Ended | TurnEnd::Injected(_)) => "(ended without a conclusion)".into(),
        Ok(TurnEnd::MaxTurns) => format!(
            "(no conclusion within {} turns)",
            rt.config.limits.max_turns
        ),
        Err(err) => format!("(the model failed: {err})"),
    }
}

/// A branch's tools: plugins with the branch profile, and `spawn_worker` on its channel.
struct BranchTools {
    rt: Arc<Runtime>,
    id: ProcessId,
    channel_name: ProcessId,
}

impl ToolHandler for BranchTools {
    fn refuse<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, String> {
        Box::pin(
            self.rt
                .refuse(ProcessKind::Branch, &self.id, name, arguments),
        )
    }

    fn handle<'a>(&'a self, name: &'a str, arguments: &'a str) -> BoxFuture<'a, ToolOutcome> {
        Box::pin(async move {
            if name == "spawn_worker" {
                return ToolOutcome::Continue(spawn_worker_tool(
                    &self.rt,
                    &self.channel_name,
                    Some(&self.id),
                    arguments,
                ));
            }
            ToolOutcome::Continue(
                self.rt
                    .call_plugin(ProcessKind::Branch, &self.id, name, arguments)
                    .await,
            )
        })
    }
}
