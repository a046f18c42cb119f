//! Waiting for a person: a parked call's process waits here until its approval is
//! decided, its patience runs out, or it is stopped. A wait that ends without a decision
//! withdraws the request, so no approval given later covers a call nobody makes.
//!
//! The decision is read from the store, which every host and every `capstan approvals`
//! shares: a person may approve on any host, or with the CLI against the database.

use std::sync::Arc;
use std::time::Duration;

use crate::services::{Approval, ApprovalId, ApprovalState, Approvals};

/// How a wait for a decision ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// Approved: routing the call again takes a use of its lease.
    Approved(Approval),
    /// Denied by a person.
    Denied(Approval),
    /// No one decided in time (or it was withdrawn elsewhere): the request is withdrawn.
    Withdrawn(Approval),
    /// The decision could not be read, or no approvals are kept.
    Lost(String),
}

impl Decided {
    /// What the model is told of a call of `tool` that did not run because of this.
    pub fn refusal(&self, tool: &str) -> String {
        let tool = crate::text::echo_name(tool, crate::text::MAX_ECHOED_NAME);
        match self {
            Decided::Approved(approval) => format!(
                "`{tool}` was approved ({}) but the approval no longer covers this call \
                 (used or expired)",
                approval.id
            ),
            Decided::Denied(approval) => format!(
                "`{tool}` did not run: a person denied it (approval {}). Do not try it \
                 again; say so in your answer",
                approval.id
            ),
            Decided::Withdrawn(approval) => format!(
                "`{tool}` did not run: no one decided on approval {} in time, and the request \
                 was withdrawn; say so in your answer",
                approval.id
            ),
            Decided::Lost(why) => {
                format!("`{tool}` did not run: its approval could not be read ({why})")
            }
        }
    }
}

/// The first and the longest pause between two reads of the decision.
const FIRST_POLL: Duration = Duration::from_millis(25);
const LONGEST_POLL: Duration = Duration::from_millis(500);

/// Waits for a person to decide `approval`: until it is decided, `patience` has passed
/// (then it is withdrawn), or `cancelled` completes (then it is withdrawn, and the wait
/// ends as [`Decided::Lost`]). Dropping the wait also withdraws it.
pub async fn decision(
    approvals: &Arc<dyn Approvals>,
    approval: &Approval,
    patience: Duration,
    cancelled: impl Future<Output = ()>,
) -> Decided {
    let mut pending = Pending {
        approvals: approvals.clone(),
        id: Some(approval.id),
    };
    let waited = tokio::select! {
        decided = poll(approvals, approval.id) => decided,
        () = tokio::time::sleep(patience) => None,
        () = cancelled => return Decided::Lost("the process was stopped".into()),
    };
    let decided = match waited {
        Some(decided) => decided,
        // Out of patience: withdrawn, unless a person decided meanwhile.
        None => match approvals.withdraw(approval.id).await {
            Ok(_) => match approvals.get(approval.id).await {
                Ok(now) => read(now),
                Err(err) => Decided::Lost(err.to_string()),
            },
            Err(err) => Decided::Lost(err.to_string()),
        },
    };
    pending.id = None;
    decided
}

/// Reads `id` until it is no longer pending.
async fn poll(approvals: &Arc<dyn Approvals>, id: ApprovalId) -> Option<Decided> {
    let mut pause = FIRST_POLL;
    loop {
        match approvals.get(id).await {
            Ok(approval) if approval.state == ApprovalState::Pending => {}
            Ok(approval) => return Some(read(approval)),
            // A store that fails for a moment is read again; the patience bounds it.
            Err(err) if err.is_transient() => {}
            Err(err) => return Some(Decided::Lost(err.to_string())),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_POLL);
    }
}

fn read(approval: Approval) -> Decided {
    match approval.state {
        ApprovalState::Approved => Decided::Approved(approval),
        ApprovalState::Denied => Decided::Denied(approval),
        ApprovalState::Withdrawn | ApprovalState::Pending => Decided::Withdrawn(approval),
    }
}

/// A request still waiting: withdrawn if the wait is dropped (its process stopped).
struct Pending {
    approvals: Arc<dyn Approvals>,
    id: Option<ApprovalId>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let approvals = self.approvals.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = approvals.withdraw(id).await {
                    tracing::warn!("approval {id} could not be withdrawn: {err}");
                }
            });
        }
    }
}
