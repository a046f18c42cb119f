//! What a service call can fail with, whichever backend answers it.

/// Why a service call failed.
///
/// The first three are the caller's to act on and read the same from every backend; the
/// rest carry the backend's own error, which names its file or server and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No such item: a task, a memory, a worker.
    #[error("{0}")]
    NotFound(String),
    /// A request refused as it stands: a bad transition, an empty title, a value out of
    /// range.
    #[error("{0}")]
    Invalid(String),
    /// A stored history message cannot be read; the history is not returned short, since
    /// a history returned short would be saved back short.
    #[error(
        "{location}: message {seq} of channel `{channel}`'s history cannot be read ({reason}); restore the store from a backup, or delete that channel's history to start it fresh"
    )]
    UnreadableHistory {
        /// Where the history is kept, e.g. the database file.
        location: String,
        /// The channel.
        channel: String,
        /// The message's position in the history.
        seq: u64,
        /// Why it cannot be read.
        reason: String,
    },
    /// The backend failed (its error says which file or server, and what to do).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// The backend's work was lost before it answered (its thread panicked).
    #[error("the {0} operation did not finish: its worker thread stopped")]
    Lost(super::Operation),
}

impl ServiceError {
    /// Whether the same request may succeed later unchanged: the backend failed (a
    /// server down, its connection slots taken, a locked or full disk), not the request.
    ///
    /// ```
    /// use capstan_host::services::ServiceError;
    ///
    /// assert!(ServiceError::Backend("connection refused".into()).is_transient());
    /// assert!(!ServiceError::Invalid("fenced".into()).is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        matches!(self, ServiceError::Backend(_) | ServiceError::Lost(_))
    }
}
