//! Deltas: what a provider reports while an answer arrives.

use tokio::sync::mpsc;

/// A piece of an answer that has just arrived.
///
/// A streaming provider reports each event of its answer as one or more deltas, in order;
/// the [`Completion`](super::Completion) it returns at the end still carries the whole
/// message. A provider that does not stream reports nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Text of the answer; the texts of all deltas, concatenated, are the message's
    /// content.
    Text(String),
    /// Part of tool call `index` (0-based, in the order the model made them) arrived. The
    /// provider assembles the call; the completion carries it whole.
    ToolCall {
        /// Which call of the answer.
        index: usize,
    },
    /// Something arrived that has nothing to show: a keep-alive, a role header, reasoning,
    /// usage, or part of an answer that is not streamed.
    Progress,
}

/// Where a provider reports [`Delta`]s as they arrive.
///
/// The prompt gate passes one with every request and restarts its wait timers on every
/// delta, so a provider that reports progress is never cut off while it is still
/// answering. `()` discards deltas; an unbounded `mpsc` sender forwards them.
///
/// ```
/// use capstan_host::llm::{AnswerSink, Delta};
///
/// let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
/// tx.delta(Delta::Text("Hel".into()));
/// tx.delta(Delta::Text("lo".into()));
/// assert_eq!(rx.try_recv().unwrap(), Delta::Text("Hel".into()));
/// ().delta(Delta::Progress); // discarded
/// ```
pub trait AnswerSink: Send + Sync {
    /// Takes one delta. Called from the task reading the answer: it must not block.
    fn delta(&self, delta: Delta);
}

impl AnswerSink for () {
    fn delta(&self, _delta: Delta) {}
}

impl AnswerSink for mpsc::UnboundedSender<Delta> {
    fn delta(&self, delta: Delta) {
        // A receiver that went away no longer wants the text; the answer goes on.
        let _ = self.send(delta);
    }
}

impl<S: AnswerSink + ?Sized> AnswerSink for &S {
    fn delta(&self, delta: Delta) {
        (**self).delta(delta)
    }
}
