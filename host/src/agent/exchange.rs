//! [`Exchange`]: the one way a door sends a message to a conversation and receives its
//! answer, as typed [`ReplyPart`]s ending in a typed [`End`].
//!
//! The parts come from the conversation itself, not from the global event stream: the
//! message carries its exchange's sending end into the conversation, which attaches it to
//! the conversation's audience when a turn takes the message in. From then on the
//! exchange hears what its own message's work does (that turn, the workers and branches
//! it starts, the turns that take their reports in), until that work is over *and* the
//! conversation's history is stored: an exchange ends [`End::Complete`] only for what is
//! durable. Messages the conversation takes in together (they arrived while it was busy)
//! share that turn, and its answer. While the store refuses the history the
//! exchange hears [`ReplyPart::NotYetStored`], and the conversation keeps the history and
//! writes it again ([`limits.store_retry_ms`](crate::config::AgentLimits::store_retry));
//! the door decides what to tell its client meanwhile.

use std::time::Duration;

use tokio::sync::mpsc;

use super::events::Event;
use crate::flow::Label;
use crate::ids::MessageKey;
use crate::secrets::Redactor;
use crate::services::{Answer, AnswerOutcome, ForwardId, RunId};
use crate::telemetry::TraceParent;

/// A user's message as a door sends it: its text and, if the client gave one, its
/// idempotency key.
///
/// ```
/// use capstan_host::agent::UserMessage;
///
/// let plain = UserMessage::from("hello");
/// assert_eq!((plain.text.as_str(), plain.key), ("hello", None));
/// let keyed = UserMessage::keyed("hello", "retry-7".parse().unwrap());
/// assert_eq!(keyed.key.unwrap().as_str(), "retry-7");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserMessage {
    /// What the user says.
    pub text: String,
    /// The client's idempotency key: a message sent again with it is answered again, not
    /// taken again.
    pub key: Option<MessageKey>,
    /// The client's span (its `traceparent`), if it sent one: the turn that takes the
    /// message in is its child.
    pub trace: TraceParent,
    /// Who could have written it: trusted for a person at a door the operator set up,
    /// `untrusted(chat:CHANNEL:SENDER)` for someone on a chat platform the operator does
    /// not trust. The history keeps it, and the flow rules check what the turn does by it.
    pub label: Label,
}

impl UserMessage {
    /// `text` with the client's idempotency key `key`.
    pub fn keyed(text: impl Into<String>, key: MessageKey) -> Self {
        UserMessage {
            text: text.into(),
            key: Some(key),
            trace: TraceParent::none(),
            label: Label::trusted(),
        }
    }
}

impl From<&str> for UserMessage {
    fn from(text: &str) -> Self {
        UserMessage {
            text: text.to_owned(),
            key: None,
            trace: TraceParent::none(),
            label: Label::trusted(),
        }
    }
}

impl From<String> for UserMessage {
    fn from(text: String) -> Self {
        UserMessage {
            text,
            key: None,
            trace: TraceParent::none(),
            label: Label::trusted(),
        }
    }
}

/// One part of a conversation's answer to a message, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyPart {
    /// More text of a reply being written, as the model streams it (redacted).
    Text(String),
    /// A whole reply, delivered. `streamed` says its text came before as [`ReplyPart::Text`]
    /// (a door that showed those has shown it); otherwise it is new.
    Reply {
        /// The reply (redacted).
        text: String,
        /// Whether its text was streamed as [`ReplyPart::Text`] first.
        streamed: bool,
    },
    /// Something the conversation's processes did: a tool call or denial, a worker or
    /// branch starting, progressing or ending, a compaction.
    Activity(Event),
    /// The conversation took a message with this idempotency key before: this one is not
    /// taken again (nothing new is stored), and the answer that one got follows (the rest
    /// of it, while it is still being answered).
    Repeated {
        /// The key.
        key: MessageKey,
    },
    /// The store refused the conversation's history, or has not answered for a while (a
    /// locked database, no free connection): what was answered is kept in the host and
    /// written until the store takes it. The exchange ends once it does.
    NotYetStored {
        /// The store's error, or how long it has not answered.
        error: String,
        /// How long the store had been waited on already when this was said: zero for a
        /// refusal, the wait so far for a store that does not answer.
        waited: Duration,
    },
    /// The last part: how the exchange ended.
    End(End),
}

/// How long an exchange waits for the answer of the host that owns its conversation.
pub(crate) const FORWARDED_ANSWER_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// How an exchange ended.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// The message was answered, everything it started has reported back, and the
    /// conversation's history holding all of it is stored.
    Complete,
    /// The model gave no answer to the message (its history, with the message, is stored;
    /// the next turn sees it).
    Failed {
        /// Why (redacted).
        error: String,
    },
    /// The host stopped before the work the message started was over; what was done is
    /// stored.
    Interrupted,
    /// What the exchange did could not be stored before the host stopped: the stop
    /// reports the conversation as not saved.
    NotStored {
        /// The store's last error.
        error: String,
    },
    /// The message was not taken in (the host stopped first): nothing of it is stored.
    Lost,
    /// The message went to the host that answers the conversation, but its answer did not
    /// come while the door waited: that host may answer it yet, or may have stopped first
    /// (sent again with the same key, the message is answered, never taken twice).
    Pending {
        /// The message's number in that host's inbox.
        message: ForwardId,
        /// That host's run.
        owner: RunId,
        /// Why the answer is not here.
        reason: String,
    },
}

impl End {
    /// Whether what the exchange did is known to be stored (complete, failed or
    /// interrupted with the message stored); a pending one is not known here.
    pub fn is_stored(&self) -> bool {
        matches!(self, End::Complete | End::Failed { .. } | End::Interrupted)
    }
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Complete => f.write_str("answered and stored"),
            End::Failed { error } => write!(f, "the model gave no answer: {error}"),
            End::Interrupted => f.write_str(
                "the host stopped before the work the message started was over; what was \
                 done is stored",
            ),
            End::NotStored { error } => write!(
                f,
                "answered, but the host stopped before the store took the conversation's \
                 history: {error}"
            ),
            End::Lost => f.write_str("the host stopped before the message was taken in"),
            End::Pending {
                message,
                owner,
                reason,
            } => write!(
                f,
                "forwarded to {owner} as {message}; its answer is pending: {reason}"
            ),
        }
    }
}

/// What the owner of a conversation leaves for the host that forwarded a message:
/// `replies` and how its exchange ended, redacted.
pub(crate) fn answer_of(replies: &[String], end: &End, redactor: &Redactor) -> Answer {
    let reply = redactor.redact_owned(replies.join("\n\n"));
    let (error, outcome) = match end {
        End::Complete => (None, AnswerOutcome::Stored),
        End::Failed { error } => (Some(error.clone()), AnswerOutcome::Stored),
        End::Interrupted => (None, AnswerOutcome::Interrupted),
        End::NotStored { error } => (Some(error.clone()), AnswerOutcome::NotStored),
        other => (Some(other.to_string()), AnswerOutcome::NotStored),
    };
    Answer {
        reply,
        error: error.map(|e| redactor.redact_owned(e)),
        outcome,
    }
}

/// How an exchange whose message was forwarded ends, by the `answer` its owner left.
pub(crate) fn end_of(answer: &Answer) -> End {
    let error = answer.error.clone().unwrap_or_default();
    match answer.outcome {
        AnswerOutcome::NotStored => End::NotStored { error },
        AnswerOutcome::Interrupted => End::Interrupted,
        AnswerOutcome::Stored if answer.error.is_some() && answer.reply.is_empty() => {
            End::Failed { error }
        }
        AnswerOutcome::Stored => End::Complete,
    }
}

/// Where a part of an answer sits among everything its conversation sent its exchanges.
///
/// A part of the conversation's work (text, a reply, activity), which every exchange
/// following that work hears, is numbered in the order the conversation sent it; a part
/// of one exchange alone (its repeat, its notice that the store has not taken the
/// history, its end) is not. A door that follows several exchanges of one conversation at
/// once (a chat whose lines go in as they are typed, so a follow-up reaches a busy
/// worker) shows each numbered part once: the first time it sees its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartNumber(u64);

impl PartNumber {
    pub(super) fn new(number: u64) -> Self {
        PartNumber(number)
    }
}

/// A message's answer as it comes: [`Exchange::next`] until it returns `None`.
///
/// Made by [`Runtime::exchange`](super::Runtime::exchange).
#[derive(Debug)]
pub struct Exchange {
    parts: mpsc::UnboundedReceiver<(Option<PartNumber>, ReplyPart)>,
    ended: bool,
}

impl Exchange {
    /// An exchange for a message with `key` (if any) and the sending end its
    /// conversation holds.
    pub(crate) fn new(key: Option<MessageKey>) -> (Listener, Exchange) {
        let (tx, parts) = mpsc::unbounded_channel();
        let listener = Listener {
            tx,
            key,
            failed: None,
            replies: Vec::new(),
            told_unstored: false,
        };
        (
            listener,
            Exchange {
                parts,
                ended: false,
            },
        )
    }

    /// The next part; [`ReplyPart::End`] is the last, then `None`. An exchange whose
    /// message was dropped untaken (the host stopped) ends [`End::Lost`].
    pub async fn next(&mut self) -> Option<ReplyPart> {
        self.next_numbered().await.map(|(_, part)| part)
    }

    /// The next part with its number among the parts its conversation sent every
    /// attached exchange (`None`: a part of this exchange alone).
    pub async fn next_numbered(&mut self) -> Option<(Option<PartNumber>, ReplyPart)> {
        if self.ended {
            return None;
        }
        let (number, part) = self
            .parts
            .recv()
            .await
            .unwrap_or((None, ReplyPart::End(End::Lost)));
        self.ended = matches!(part, ReplyPart::End(_));
        Some((number, part))
    }
}

/// An exchange's sending end, held by the conversation from the turn that takes its
/// message in until it ends.
#[derive(Debug)]
pub(crate) struct Listener {
    tx: mpsc::UnboundedSender<(Option<PartNumber>, ReplyPart)>,
    /// Its message's idempotency key.
    pub(super) key: Option<MessageKey>,
    /// The model's error, if a turn of the exchange failed.
    pub(super) failed: Option<String>,
    /// The replies delivered so far.
    pub(super) replies: Vec<String>,
    /// Whether it was told the store refused the history.
    pub(super) told_unstored: bool,
}

impl Listener {
    /// Sends `part`, its own; an exchange nobody reads any more is no error (its work
    /// goes on).
    pub(crate) fn send(&self, part: ReplyPart) {
        let _ = self.tx.send((None, part));
    }

    /// Sends `part` of the conversation's work, which every exchange following that work
    /// hears, as `number`.
    pub(super) fn send_shared(&self, number: PartNumber, part: ReplyPart) {
        let _ = self.tx.send((Some(number), part));
    }

    /// Ends the exchange with `end`.
    pub(crate) fn end(self, end: End) {
        self.send(ReplyPart::End(end));
    }
}

#[cfg(test)]
impl Exchange {
    /// The parts sent so far, without waiting.
    pub(super) fn sent_so_far(&mut self) -> Vec<ReplyPart> {
        std::iter::from_fn(|| self.parts.try_recv().ok().map(|(_, part)| part)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_messages_end_survives_the_trip_through_the_owners_answer() {
        let redactor = Redactor::default();
        let ends = [
            End::Complete,
            End::Failed {
                error: "timed out".into(),
            },
            End::Interrupted,
            End::NotStored {
                error: "disk full".into(),
            },
        ];
        for end in ends {
            let replies = if matches!(end, End::Failed { .. }) {
                Vec::new()
            } else {
                vec!["hi".to_owned()]
            };
            assert_eq!(end_of(&answer_of(&replies, &end, &redactor)), end);
        }
        // A message the owner lost is never reported to its sender as stored.
        let lost = answer_of(&["hi".to_owned()], &End::Lost, &redactor);
        assert!(!end_of(&lost).is_stored());
    }

    #[tokio::test]
    async fn a_message_dropped_untaken_ends_lost() {
        let (listener, mut exchange) = Exchange::new(None);
        drop(listener);
        assert_eq!(exchange.next().await, Some(ReplyPart::End(End::Lost)));
        assert_eq!(exchange.next().await, None);
    }
}
