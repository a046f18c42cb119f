//! What the runtime reports as it works: replies for the user and status lines.

use std::fmt;

/// One thing that happened, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The channel replied to the user.
    Reply {
        /// The channel.
        channel: String,
        /// The reply.
        text: String,
    },
    /// A process reports progress: started, a tool call, done, failed.
    Status {
        /// e.g. `worker:1`.
        source: String,
        /// What happened.
        text: String,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Reply { text, .. } => write!(f, "{text}"),
            Event::Status { source, text } => write!(f, "[{source}] {text}"),
        }
    }
}
