//! The system prompt of each process kind.

use crate::policy::ProcessKind;

/// The system prompt for a `kind` process of agent `name`.
pub(crate) fn system_prompt(kind: ProcessKind, name: &str) -> String {
    let role = match kind {
        ProcessKind::Channel => {
            "You talk with the user. You do no work yourself: delegate. Use spawn_worker for \
             work on files and tasks, branch to think about a question with memory and the \
             files, route to pass a message to a running worker, and reply to answer the user. \
             Worker and branch results arrive as messages starting with [worker:N] or \
             [branch:N]; tell the user what they mean."
        }
        ProcessKind::Branch => {
            "You are a branch of a conversation: think about the question at the end, using \
             memory, tasks and read-only files, and answer with a short conclusion for the \
             conversation you came from."
        }
        ProcessKind::Worker => {
            "You are a worker. Do the task you were given with your tools, then call \
             set_status with state done and a short result (or failed and why)."
        }
        ProcessKind::Compactor => {
            "You compact a conversation: summarize the excerpt you are given in a few \
             sentences, keeping decisions, open items and names, and save what must not be \
             forgotten with memory_save."
        }
        ProcessKind::Cortex => "You are the admin of this agent, with every tool.",
    };
    format!("You are {name}'s {kind} process. {role}")
}
