//! A branch: a fork of the channel's history that thinks about one question and returns a
//! conclusion.

use super::audience::Scope;
use super::events::Event;
use super::inbox::ChannelHandle;
use super::notifications::NotificationKind;
use super::process_calls::ProcessCalls;
use super::prompts::system_prompt;
use super::spawning::BranchKit;
use super::spawning::BranchSpec;
use super::supervisor::supervise;
use super::tool_calls::{HostTools, ProcessTools};
use super::turn::{ToolOutcome, TurnEnd, TurnError, context_label};
use crate::dispatch::Route;
use crate::flow::Label;
use crate::ids::ProcessId;
use crate::llm::{BoxFuture, Message};
use crate::plugin::ToolError;
use crate::policy::ProcessKind;
use crate::tools::HostCall;

/// Starts a branch for `channel`, supervised: it is reported to its channel on every
/// path (it concludes, its model fails, or it panics), and its channel's pending count is
/// released, so `wait_idle` never hangs on a branch that died.
pub(crate) fn start(kit: BranchKit, spec: BranchSpec, channel: ChannelHandle) {
    let failed = {
        let kit = kit.clone();
        let channel = channel.clone();
        let (id, channel_name) = (spec.id.clone(), spec.channel.clone());
        move |why: String| async move {
            kit.gate.release_process(&id);
            kit.reporter.emit_to(
                &channel.audience.of(&id),
                Event::BranchFailed {
                    branch: id.clone(),
                    error: why.clone(),
                },
            );
            kit.reporter
                .report(
                    &channel_name,
                    &channel,
                    &id,
                    NotificationKind::Error,
                    format!("failed: {why}"),
                    // The host's own words.
                    Label::trusted(),
                )
                .await;
        }
    };
    // Its turn and its conclusion are under the span that forked it.
    let trace = spec.trace.clone();
    supervise(
        &channel,
        |_| trace.scope(run(kit, spec, channel.clone())),
        failed,
    );
}

/// The branch's life: think, then send the conclusion to the channel it came from.
async fn run(kit: BranchKit, spec: BranchSpec, channel: ChannelHandle) {
    let BranchSpec {
        id,
        channel: channel_name,
        question,
        question_label,
        mut history,
        trace: _,
    } = spec;
    let _slot = channel
        .branch_slots
        .clone()
        .acquire_owned()
        .await
        .expect("never closed");
    let alive = kit.supervisor.branch_started(&id);
    let scope = channel.audience.of(&id);
    kit.reporter.emit_to(
        &scope,
        Event::BranchStarted {
            branch: id.clone(),
            channel: channel_name.clone(),
            question: question.clone(),
        },
    );
    history.push(Message::user(format!("Branch question: {question}")).labelled(question_label));
    let tools = kit.gate.tool_defs(ProcessKind::Branch);
    let system = system_prompt(ProcessKind::Branch, &kit.settings.agent_name);
    let host_tools = BranchTools {
        kit: kit.clone(),
        id: id.clone(),
        channel_name: channel_name.clone(),
        scope: scope.clone(),
    };
    // The branch's own plugin instances and audit rows, for its life.
    let calls = ProcessCalls::new(channel_name.session());
    let handler = ProcessTools::new(&kit.gate, &kit.reporter, &id, &calls, &scope, &host_tools);
    let conclusion = match kit.gate.lease_loop(&id) {
        Err(held) => format!("(could not think: {held})"),
        Ok(lease) => {
            let turn = kit
                .gate
                .turn(&id, lease.ticket(), Route::Branch, &system, &tools);
            let end = turn.run(&mut history, &handler).await;
            if let Err(err) = &end {
                kit.reporter.model_failed(&scope, &id, err);
            }
            conclude(&kit, end)
        }
    };
    // Its conclusion carries what it read, the channel's history it forked from included.
    let read = context_label(&history);
    drop(alive);
    kit.gate.release_process(&id);
    kit.reporter.emit_to(
        &scope,
        Event::BranchConcluded {
            branch: id.clone(),
            conclusion: conclusion.clone(),
        },
    );
    kit.reporter
        .report(
            &channel_name,
            &channel,
            &id,
            NotificationKind::Result,
            format!("concluded: {conclusion}"),
            read,
        )
        .await;
}

/// A branch's conclusion from how its turn ended.
fn conclude(kit: &BranchKit, end: Result<TurnEnd, TurnError>) -> String {
    match end {
        Ok(TurnEnd::Text(text) | TurnEnd::Delivered(text)) => text,
        Ok(TurnEnd::Ended | TurnEnd::Injected(_)) => "(ended without a conclusion)".into(),
        Ok(TurnEnd::MaxTurns) => format!(
            "(no conclusion within {} turns)",
            kit.settings.limits.max_turns
        ),
        Err(err) => format!("(the model failed: {err})"),
    }
}

/// The host tool a branch runs: `spawn_worker`, on its channel.
struct BranchTools {
    kit: BranchKit,
    id: ProcessId,
    channel_name: ProcessId,
    /// The branch's work: the workers it starts are part of it.
    scope: Scope,
}

impl HostTools for BranchTools {
    fn run<'a>(
        &'a self,
        call: HostCall,
        context: &'a Label,
    ) -> BoxFuture<'a, Result<ToolOutcome, ToolError>> {
        Box::pin(async move {
            match call {
                HostCall::SpawnWorker(args) => self
                    .kit
                    .spawner
                    .spawn_worker_tool(
                        &self.channel_name,
                        Some(&self.id),
                        &self.scope,
                        args,
                        context,
                    )
                    .await
                    .map(ToolOutcome::Continue),
                other => Err(ToolError::Denied(format!(
                    "`{}` is not a branch's tool",
                    other.tool()
                ))),
            }
        })
    }
}
