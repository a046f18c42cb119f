//! The branches this host started, followed from its events: branches are thinking forks
//! that are not stored, so this is the one list of them.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use utoipa::ToSchema;

use super::hub::{Next, Subscription};
use crate::agent::Event;

/// Branches kept, newest first; older ones drop off.
const MAX_BRANCHES: usize = 256;

/// One branch.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct BranchView {
    /// e.g. `branch:4`.
    id: String,
    /// The conversation it forked.
    channel: String,
    /// Its question.
    question: String,
    /// `thinking`, `concluded` or `failed`.
    state: &'static str,
    /// Its conclusion, or why it failed.
    outcome: Option<String>,
}

/// The branches seen so far.
#[derive(Default)]
pub(crate) struct Branches {
    list: Mutex<VecDeque<BranchView>>,
}

impl Branches {
    /// Newest first.
    pub(crate) fn list(&self) -> Vec<BranchView> {
        self.lock().iter().cloned().collect()
    }

    /// Follows `events` until the stream ends.
    pub(crate) async fn follow(&self, mut events: Subscription) {
        while let Some(next) = events.next().await {
            if let Next::Event(published) = next {
                self.take(&published.event);
            }
        }
    }

    fn take(&self, event: &Event) {
        let mut list = self.lock();
        match event {
            Event::BranchStarted {
                branch,
                channel,
                question,
            } => {
                if list.len() >= MAX_BRANCHES {
                    list.pop_back();
                }
                list.push_front(BranchView {
                    id: branch.to_string(),
                    channel: channel.to_string(),
                    question: question.clone(),
                    state: "thinking",
                    outcome: None,
                });
            }
            Event::BranchConcluded { branch, conclusion } => {
                if let Some(view) = list.iter_mut().find(|v| v.id == branch.to_string()) {
                    view.state = "concluded";
                    view.outcome = Some(conclusion.clone());
                }
            }
            Event::BranchFailed { branch, error } => {
                if let Some(view) = list.iter_mut().find(|v| v.id == branch.to_string()) {
                    view.state = "failed";
                    view.outcome = Some(error.clone());
                }
            }
            _ => {}
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<BranchView>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }
}
