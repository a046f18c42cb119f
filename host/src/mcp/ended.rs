//! [`EndedBy`]: why the host ended a server's transport, for the call that was waiting.

use std::sync::{Arc, Mutex};

/// Why the host ended a server's transport (an answer over a size limit): the transport
/// sets it as it fails, and the calls that were waiting on it report it, rather than
/// rmcp's "transport closed" or, later, a deadline. Each start of a server has its own.
#[derive(Clone, Default)]
pub(super) struct EndedBy(Arc<Mutex<Option<String>>>);

impl EndedBy {
    /// Records `why` the transport ends.
    pub(super) fn set(&self, why: String) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    /// The reason recorded, if any.
    pub(super) fn reason(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
