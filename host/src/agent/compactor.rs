//! Compaction: when a channel's history passes its share of the context window, the oldest
//! part is summarized (by a compactor process, which may save memories) and replaced by
//! the summary.

use super::audience::Scope;
use super::events::Event;
use super::process_calls::ProcessCalls;
use super::prompts::system_prompt;
use super::spawning::CompactorKit;
use super::tool_calls::{NoHostTools, ProcessTools};
use super::turn::{TurnEnd, TurnError, context_label};
use crate::dispatch::Route;
use crate::ids::ProcessId;
use crate::llm::{Message, Role};
use crate::policy::ProcessKind;

/// The prefix of the message that replaces compacted history.
pub(crate) const SUMMARY_PREFIX: &str = "[summary of the earlier conversation]";

/// A rough token count: four bytes a token, the usual rule of thumb for English text.
pub(crate) fn estimate_tokens(history: &[Message]) -> usize {
    history
        .iter()
        .map(|m| {
            m.content.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.arguments.len() + c.name.len())
                    .sum::<usize>()
                + 16
        })
        .sum::<usize>()
        / 4
}

/// Where to cut `history` so the older half can be summarized without splitting a tool
/// call from its results: the last user message at or before the middle.
fn cut_point(history: &[Message]) -> Option<usize> {
    let middle = history.len() / 2;
    (1..=middle).rev().find(|&i| history[i].role == Role::User)
}

/// Compacts `history` in place if it is over the threshold; returns whether it did.
pub(crate) async fn compact_if_needed(
    kit: &CompactorKit,
    channel: &ProcessId,
    turn: &Scope,
    history: &mut Vec<Message>,
) -> bool {
    let limits = &kit.settings.limits;
    let threshold = (limits.context_window_tokens as f64 * limits.compaction_threshold) as usize;
    let tokens = estimate_tokens(history);
    if tokens <= threshold {
        return false;
    }
    let Some(cut) = cut_point(history) else {
        return false;
    };
    let id = match kit.ids.next(ProcessKind::Compactor).await {
        Ok(id) => id,
        Err(err) => {
            tracing::error!("cannot number a compactor run, history kept: {err}");
            return false;
        }
    };
    kit.reporter.emit_to(
        turn,
        Event::CompactionStarted {
            compactor: id.clone(),
            channel: channel.clone(),
            messages: cut,
            of: history.len(),
            tokens,
            threshold,
        },
    );
    let excerpt: String = history[..cut]
        .iter()
        .map(|m| format!("{:?}: {}\n", m.role, m.content))
        .collect();
    // The compactor reads what the excerpt's messages were labelled, and its summary
    // stands for them in the history: both carry their labels.
    let excerpt_label = context_label(&history[..cut]);
    let mut work = vec![
        Message::user(format!("Summarize this conversation excerpt:\n\n{excerpt}"))
            .labelled(excerpt_label),
    ];
    let tools = kit.gate.tool_defs(ProcessKind::Compactor);
    let system = system_prompt(ProcessKind::Compactor, &kit.settings.agent_name);
    // The compactor's own plugin instances and audit rows, for its life.
    let calls = ProcessCalls::new(channel.session());
    let handler = ProcessTools::new(&kit.gate, &kit.reporter, &id, &calls, turn, &NoHostTools);
    let end = match kit.gate.lease_loop(&id) {
        Ok(lease) => {
            let turn = kit
                .gate
                .turn(&id, lease.ticket(), Route::Compaction, &system, &tools);
            turn.run(&mut work, &handler).await
        }
        Err(held) => Err(TurnError::suppressed(held.to_string())),
    };
    let compacted = match end {
        Ok(TurnEnd::Text(summary)) if !summary.trim().is_empty() => {
            let summary = Message::user(format!("{SUMMARY_PREFIX} {summary}"));
            history.splice(..cut, [summary.labelled(context_label(&work))]);
            kit.reporter.emit_to(
                turn,
                Event::Compacted {
                    compactor: id.clone(),
                    messages: history.len(),
                },
            );
            true
        }
        Ok(_) => {
            kit.reporter.emit_to(
                turn,
                Event::CompactionSkipped {
                    compactor: id.clone(),
                    reason: "no summary produced".into(),
                },
            );
            false
        }
        Err(err) => {
            kit.reporter.model_failed(turn, &id, &err);
            kit.reporter.emit_to(
                turn,
                Event::CompactionSkipped {
                    compactor: id.clone(),
                    reason: format!("the model failed: {err}"),
                },
            );
            false
        }
    };
    kit.gate.release_process(&id);
    compacted
}
