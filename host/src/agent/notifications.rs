//! Late reports: a worker's or branch's report that arrives after its requester ended is
//! kept in working memory and told to the channel in a turn of its own (see
//! [`Reporter::fold_back`](super::reporter::Reporter::fold_back)).
//!
//! The entry is `notifications/<kind>/<source>` and a line is added to
//! `notifications/index`, so the report survives even when no channel is left to tell.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::ProcessId;

/// What a worker's or branch's report is. Its JSON form is [`NotificationKind::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotificationKind {
    /// A finished worker's outcome, or a branch's conclusion.
    Result,
    /// A worker stopped on request or by its time limit.
    Status,
    /// A worker failed.
    Error,
    /// An interactive worker asks for input.
    InputRequired,
}

impl NotificationKind {
    /// The name in working-memory keys and messages: `result`, `status`, `error` or
    /// `input-required`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationKind::Result => "result",
            NotificationKind::Status => "status",
            NotificationKind::Error => "error",
            NotificationKind::InputRequired => "input-required",
        }
    }

    /// Whether a report of this kind is its process's last: a worker that asks for input
    /// goes on, and reports again.
    pub(crate) fn is_last(self) -> bool {
        self != NotificationKind::InputRequired
    }
}

impl fmt::Display for NotificationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A late report, as its channel is told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notification {
    /// e.g. `worker:3`.
    pub(crate) source: ProcessId,
    /// Who asked for it and had ended, e.g. `branch:2`.
    pub(crate) requester: ProcessId,
    pub(crate) kind: NotificationKind,
    /// Its working-memory key.
    pub(crate) key: String,
    pub(crate) text: String,
    /// What its source had read.
    pub(crate) label: crate::flow::Label,
}

impl Notification {
    /// The message the channel's notification turn starts from.
    pub(crate) fn message(&self) -> String {
        format!(
            "[notification: {kind} from {source}, which {requester} asked for before it ended; \
             saved as {key}] {text}\nTell the user what arrived and from where.",
            kind = self.kind,
            source = self.source,
            requester = self.requester,
            key = self.key,
            text = self.text,
        )
    }
}

/// Serializes updates of `notifications/index` (a read, then a write).
#[derive(Debug, Default)]
pub(crate) struct NotificationIndex(pub(crate) tokio::sync::Mutex<()>);
