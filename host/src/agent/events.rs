//! What the runtime reports as it works: replies for the user and status lines.

use std::fmt;

use crate::ids::ProcessId;

/// One thing that happened, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The channel replied to the user.
    Reply {
        /// The conversation.
        channel: ProcessId,
        /// The reply.
        text: String,
    },
    /// A piece of a channel's answer, as the model streams it. The whole answer follows
    /// as a [`Event::Reply`] once it is complete; a model that does not stream sends none.
    Text {
        /// The conversation.
        channel: ProcessId,
        /// The text that just arrived.
        text: String,
    },
    /// A process reports progress: started, a tool call, done, failed.
    Status {
        /// e.g. `worker:1`.
        source: ProcessId,
        /// What happened.
        text: String,
    },
    /// A model request of a process got no answer: it failed or timed out. The process
    /// goes on as its kind does (a channel waits for the next input, a worker fails);
    /// `capstan run` exits non-zero when any request failed.
    ModelFailed {
        /// The process whose request failed.
        process: ProcessId,
        /// Why, as the process reports it.
        error: String,
    },
    /// A conversation's history could not be stored after a turn. The messages stay in
    /// memory and the next save rewrites the whole history.
    HistoryNotSaved {
        /// The conversation.
        channel: ProcessId,
        /// What the store said.
        error: String,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Reply { text, .. } | Event::Text { text, .. } => write!(f, "{text}"),
            Event::Status { source, text } => write!(f, "[{source}] {text}"),
            Event::ModelFailed { process, error } => {
                write!(f, "[{process}] the model failed: {error}")
            }
            Event::HistoryNotSaved { channel, error } => {
                write!(f, "[{channel}] the history was not saved: {error}")
            }
        }
    }
}
