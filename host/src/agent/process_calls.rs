//! What the plugin calls of one agent process share for its life: the instances it keeps
//! and the audit rows of its round of calls under way.

use std::sync::Mutex;

use crate::ids::SessionKey;
use crate::plugin::{ProcessInstances, committed};
use crate::services::Committing;

/// What a process's plugin calls share: the conversation whose work they are, the
/// instances it keeps, and the audit rows of its round of calls under way, which the turn
/// waits for before the round's results go on ([`ProcessCalls::committed`]): the rows of
/// one round share a commit.
pub(crate) struct ProcessCalls {
    /// The conversation the process works for (a worker's or branch's is the one that
    /// started it): each call's audit row names it.
    pub(crate) conversation: SessionKey,
    pub(crate) instances: ProcessInstances,
    audits: Mutex<Vec<Committing>>,
}

impl ProcessCalls {
    /// The calls of a process working for `conversation`, none made yet.
    pub(crate) fn new(conversation: SessionKey) -> Self {
        ProcessCalls {
            conversation,
            instances: ProcessInstances::default(),
            audits: Mutex::default(),
        }
    }

    /// Returns once the audit row of every call made so far is committed.
    pub(crate) async fn committed(&self) {
        let rows = std::mem::take(&mut *self.audits.lock().unwrap());
        for row in rows {
            committed(row).await;
        }
    }

    /// Keeps the audit rows of a call made, to be waited for by [`ProcessCalls::committed`].
    pub(crate) fn note_audits(&self, rows: impl IntoIterator<Item = Committing>) {
        self.audits.lock().unwrap().extend(rows);
    }
}
