//! [`Exchange`]: the one way a door sends a message to a conversation and receives its
//! answer, as typed [`ReplyPart`]s ending in a typed [`End`].
//!
//! The parts come from the conversation itself, not from the global event stream: the
//! message carries its exchange's sending end into the conversation, which attaches it to
//! the conversation's [`Audience`] when a turn takes the message in. From then on what the
//! conversation and the workers and branches it runs do reaches the exchange, until the
//! conversation is idle again *and* its history is stored: an exchange ends
//! [`End::Complete`] only for what is durable. While the store refuses the history the
//! exchange hears [`ReplyPart::NotYetStored`], and the conversation keeps the history and
//! writes it again ([`limits.store_retry_ms`](crate::config::AgentLimits::store_retry));
//! the door decides what to tell its client meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::events::Event;
use crate::ids::MessageKey;
use crate::secrets::Redactor;
use crate::services::{Answer, AnswerOutcome, ForwardId, RunId};

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
}

impl UserMessage {
    /// `text` with the client's idempotency key `key`.
    pub fn keyed(text: impl Into<String>, key: MessageKey) -> Self {
        UserMessage {
            text: text.into(),
            key: Some(key),
        }
    }
}

impl From<&str> for UserMessage {
    fn from(text: &str) -> Self {
        UserMessage {
            text: text.to_owned(),
            key: None,
        }
    }
}

impl From<String> for UserMessage {
    fn from(text: String) -> Self {
        UserMessage { text, key: None }
    }
}

/// Answers to keyed messages a conversation keeps in memory, most recent last: a message
/// sent again with a key past these is answered from the stored history instead.
const ANSWERS_KEPT: usize = 1024;

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
/// A part every exchange attached to the conversation hears (text, a reply, activity) is
/// numbered in the order the conversation sent it; a part of one exchange alone (its
/// repeat, its notice that the store has not taken the history, its end) is not. A door that follows several exchanges of
/// one conversation at once (a chat whose lines go in as they are typed, so a follow-up
/// reaches a busy worker) shows each numbered part once: the first time it sees its
/// number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartNumber(u64);

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
    key: Option<MessageKey>,
    /// The model's error, if a turn of the exchange failed.
    failed: Option<String>,
    /// The replies delivered so far.
    replies: Vec<String>,
    /// Whether it was told the store refused the history.
    told_unstored: bool,
}

impl Listener {
    /// Sends `part`, its own; an exchange nobody reads any more is no error (its work
    /// goes on).
    pub(crate) fn send(&self, part: ReplyPart) {
        let _ = self.tx.send((None, part));
    }

    /// Sends `part`, which every exchange attached to the conversation hears, as `number`.
    fn send_shared(&self, number: PartNumber, part: ReplyPart) {
        let _ = self.tx.send((Some(number), part));
    }

    /// Ends the exchange with `end`.
    pub(crate) fn end(self, end: End) {
        self.send(ReplyPart::End(end));
    }
}

/// The exchanges attached to one conversation, and whether its history is stored.
#[derive(Clone, Default)]
pub(crate) struct Audience {
    inner: Arc<Mutex<Attached>>,
}

#[derive(Default)]
struct Attached {
    listeners: Vec<Listener>,
    /// The parts sent to every attached exchange so far.
    sent: u64,
    /// The store's error while the conversation's history is not stored.
    unsaved: Option<String>,
    /// Whether the store refused it (not only kept it waiting).
    refused: bool,
    /// The replies of the last [`ANSWERS_KEPT`] keyed exchanges that ended stored, and
    /// the model's error if they got none.
    answered: HashMap<MessageKey, (Vec<String>, Option<String>)>,
    /// Their keys, oldest first.
    answered_order: VecDeque<MessageKey>,
}

impl Attached {
    /// The number of the next part every attached exchange hears.
    fn number(&mut self) -> PartNumber {
        self.sent += 1;
        PartNumber(self.sent)
    }

    /// Notes that the history is not stored (`error`, after `waited`) and tells every
    /// exchange not told yet.
    fn tell_unstored(&mut self, error: &str, waited: Duration) {
        self.unsaved = Some(error.to_owned());
        // Each exchange's own notice, unnumbered: only those not told yet hear it.
        for listener in &mut self.listeners {
            if !listener.told_unstored {
                listener.told_unstored = true;
                listener.send(ReplyPart::NotYetStored {
                    error: error.to_owned(),
                    waited,
                });
            }
        }
    }

    /// Keeps the replies of keyed `listener`, which ended stored.
    fn keep_answer(&mut self, listener: &Listener) {
        let Some(key) = &listener.key else { return };
        let answer = (listener.replies.clone(), listener.failed.clone());
        if self.answered.insert(key.clone(), answer).is_none() {
            self.answered_order.push_back(key.clone());
        }
        while self.answered_order.len() > ANSWERS_KEPT {
            if let Some(old) = self.answered_order.pop_front() {
                self.answered.remove(&old);
            }
        }
    }
}

impl Audience {
    fn lock(&self) -> std::sync::MutexGuard<'_, Attached> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attaches `listener`: from now on it hears what the conversation does. It is not
    /// told a refusal that came before it: its own message is in no spill yet, and it hears
    /// one once its history is written and refused.
    pub(crate) fn attach(&self, listener: Listener) {
        self.lock().listeners.push(listener);
    }

    /// Sends `part` to every attached exchange.
    pub(crate) fn send(&self, part: &ReplyPart) {
        let mut attached = self.lock();
        let number = attached.number();
        for listener in &attached.listeners {
            listener.send_shared(number, part.clone());
        }
    }

    /// Whether a keyed exchange with `key` is attached, or ended stored lately.
    pub(crate) fn knows(&self, key: &MessageKey) -> bool {
        let attached = self.lock();
        attached.answered.contains_key(key)
            || attached
                .listeners
                .iter()
                .any(|l| l.key.as_ref() == Some(key))
    }

    /// Answers `listener`, whose message has a key the conversation took before, with
    /// the answer that key got so far: that of its exchange still under way, or kept from
    /// one that ended, or else `stored` (read from the history). Then it is attached like
    /// any exchange: it hears the rest, and ends only once the conversation is idle and
    /// its history stored (the first message may still be at work, or not stored yet).
    pub(crate) fn repeat(&self, mut listener: Listener, stored: impl FnOnce() -> Vec<String>) {
        let Some(key) = listener.key.clone() else {
            return self.attach(listener);
        };
        listener.send(ReplyPart::Repeated { key: key.clone() });
        // Whether what it repeats is held as the store's refusal is told: its first
        // exchange, still under way, was told so (its message may not be held yet); or it
        // ended, or is in the history, held with it.
        let (replies, failed, held) = {
            let attached = self.lock();
            let under_way = attached
                .listeners
                .iter()
                .find(|l| l.key.as_ref() == Some(&key))
                .map(|l| (l.replies.clone(), l.failed.clone(), l.told_unstored));
            under_way.or_else(|| {
                let (replies, failed) = attached.answered.get(&key).cloned()?;
                Some((replies, failed, true))
            })
        }
        .unwrap_or_else(|| (stored(), None, true));
        for text in &replies {
            listener.send(ReplyPart::Reply {
                text: text.clone(),
                streamed: false,
            });
        }
        listener.replies = replies;
        listener.failed = failed;
        let mut attached = self.lock();
        // What it repeats is already held (in memory and the spill): it hears so now.
        if let Some(error) = attached.unsaved.clone().filter(|_| held) {
            listener.told_unstored = true;
            listener.send(ReplyPart::NotYetStored {
                error,
                waited: Duration::ZERO,
            });
        }
        attached.listeners.push(listener);
    }

    /// Sends a delivered reply to every attached exchange.
    pub(crate) fn reply(&self, text: &str, streamed: bool) {
        let mut attached = self.lock();
        let number = attached.number();
        for listener in &mut attached.listeners {
            listener.replies.push(text.to_owned());
            let text = text.to_owned();
            listener.send_shared(number, ReplyPart::Reply { text, streamed });
        }
    }

    /// Notes that a turn of the attached exchanges got no answer from the model.
    pub(crate) fn model_failed(&self, error: &str) {
        let mut attached = self.lock();
        for listener in &mut attached.listeners {
            listener.failed = Some(error.to_owned());
        }
    }

    /// Notes that the store refused the history: if `kept` (it is held as the config
    /// says: in the spill file, if there is one), the attached exchanges hear it once;
    /// otherwise they wait for the store. Whether the refusal is news (the history was
    /// stored, or only slow, until now).
    pub(crate) fn not_stored(&self, error: &str, kept: bool) -> bool {
        let mut attached = self.lock();
        let news = !attached.refused;
        attached.refused = true;
        if kept {
            attached.tell_unstored(error, Duration::ZERO);
        } else {
            attached.unsaved = Some(error.to_owned());
        }
        news
    }

    /// Notes that the store has not answered a save of the history for `waited`: the
    /// attached exchanges hear it once, as they would a refusal.
    pub(crate) fn store_slow(&self, waited: Duration) {
        let error = format!(
            "the store has not answered for {} s (a locked database, or no free connection)",
            waited.as_secs()
        );
        self.lock().tell_unstored(&error, waited);
    }

    /// Notes that the history the conversation opened with is not stored: it came from
    /// the spill file, and the conversation writes it first.
    pub(crate) fn held_from_spill(&self) {
        self.lock().unsaved = Some("the history from the spill file is not stored yet".into());
    }

    /// Whether the history is not stored.
    pub(crate) fn is_unsaved(&self) -> bool {
        self.lock().unsaved.is_some()
    }

    /// Notes that the history is stored; then, if `idle` says nothing is pending, ends
    /// the attached exchanges.
    pub(crate) fn stored(&self, idle: impl Fn() -> bool) {
        {
            let mut attached = self.lock();
            attached.unsaved = None;
            attached.refused = false;
        }
        self.end_if_settled(idle);
    }

    /// Ends the attached exchanges if nothing is pending (`idle`, read under the lock, so
    /// an exchange attached meanwhile is not ended before its own message was handled)
    /// and the history is stored.
    pub(crate) fn end_if_settled(&self, idle: impl Fn() -> bool) {
        let mut attached = self.lock();
        if attached.unsaved.is_some() || !idle() {
            return;
        }
        let ended: Vec<Listener> = attached.listeners.drain(..).collect();
        for listener in ended {
            attached.keep_answer(&listener);
            let end = match (&listener.failed, listener.replies.is_empty()) {
                (Some(error), true) => End::Failed {
                    error: error.clone(),
                },
                _ => End::Complete,
            };
            listener.end(end);
        }
    }

    /// Ends every attached exchange: the conversation stopped. `Err` carries the store's
    /// error if its history could not be stored.
    pub(crate) fn end_all(&self, stored: Result<(), &str>) {
        let mut attached = self.lock();
        for listener in attached.listeners.drain(..) {
            listener.end(match stored {
                Ok(()) => End::Interrupted,
                Err(error) => End::NotStored {
                    error: error.to_owned(),
                },
            });
        }
    }

    /// Whether any exchange is attached.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().listeners.is_empty()
    }
}

/// Ends the exchanges still attached to a conversation when dropped: held by its loop,
/// so that a loop that stops without ending them (it panicked) leaves none waiting.
pub(crate) struct EndsOnDrop(pub(crate) Audience);

impl Drop for EndsOnDrop {
    fn drop(&mut self) {
        self.0.end_all(Err(
            "the conversation's loop stopped unexpectedly (see the host's log)",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(exchange: &mut Exchange) -> Vec<ReplyPart> {
        let mut parts = Vec::new();
        while let Ok((_, part)) = exchange.parts.try_recv() {
            parts.push(part);
        }
        parts
    }

    #[test]
    fn an_exchange_ends_only_once_idle_and_stored() {
        let audience = Audience::default();
        let (listener, mut exchange) = Exchange::new(None);
        audience.attach(listener);
        audience.reply("hello", false);
        audience.not_stored("database down", true);
        audience.end_if_settled(|| true);
        assert_eq!(
            drain(&mut exchange),
            [
                ReplyPart::Reply {
                    text: "hello".into(),
                    streamed: false
                },
                ReplyPart::NotYetStored {
                    error: "database down".into(),
                    waited: Duration::ZERO,
                }
            ],
            "not ended while the history is not stored"
        );
        audience.stored(|| false);
        assert!(
            drain(&mut exchange).is_empty(),
            "not ended while work is pending"
        );
        audience.end_if_settled(|| true);
        assert_eq!(drain(&mut exchange), [ReplyPart::End(End::Complete)]);
        assert!(audience.is_empty());
    }

    #[test]
    fn a_failure_with_no_reply_ends_failed_and_one_with_a_reply_complete() {
        let audience = Audience::default();
        let (failed, mut failed_exchange) = Exchange::new(None);
        audience.attach(failed);
        audience.model_failed("timed out");
        audience.end_if_settled(|| true);
        let (answered, mut answered_exchange) = Exchange::new(None);
        audience.attach(answered);
        audience.model_failed("timed out");
        audience.reply("late but here", true);
        audience.end_if_settled(|| true);
        assert_eq!(
            drain(&mut failed_exchange),
            [ReplyPart::End(End::Failed {
                error: "timed out".into()
            })]
        );
        assert_eq!(
            drain(&mut answered_exchange).last(),
            Some(&ReplyPart::End(End::Complete))
        );
    }

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

    #[test]
    fn a_repeat_waits_like_the_first_while_the_history_is_not_stored() {
        let audience = Audience::default();
        let key: MessageKey = "k".parse().unwrap();
        let (first, mut first_exchange) = Exchange::new(Some(key.clone()));
        audience.attach(first);
        audience.reply("hello", false);
        audience.not_stored("database down", true);
        // Sent again while the first waits for the store: told the answer so far, and that
        // it is not stored, and not ended.
        let (again, mut again_exchange) = Exchange::new(Some(key.clone()));
        audience.repeat(again, || panic!("the answer under way is used"));
        audience.end_if_settled(|| true);
        let parts = drain(&mut again_exchange);
        assert_eq!(parts[0], ReplyPart::Repeated { key });
        assert!(parts.contains(&ReplyPart::Reply {
            text: "hello".into(),
            streamed: false
        }));
        assert!(
            parts
                .iter()
                .any(|p| matches!(p, ReplyPart::NotYetStored { .. }))
        );
        assert!(
            !parts.iter().any(|p| matches!(p, ReplyPart::End(_))),
            "{parts:?}"
        );
        audience.stored(|| true);
        assert_eq!(
            drain(&mut first_exchange).last(),
            Some(&ReplyPart::End(End::Complete))
        );
        assert_eq!(drain(&mut again_exchange), [ReplyPart::End(End::Complete)]);
    }

    #[tokio::test]
    async fn a_message_dropped_untaken_ends_lost_and_a_stop_says_what_was_stored() {
        let (listener, mut exchange) = Exchange::new(None);
        drop(listener);
        assert_eq!(exchange.next().await, Some(ReplyPart::End(End::Lost)));
        assert_eq!(exchange.next().await, None);

        let audience = Audience::default();
        let (kept, mut kept_exchange) = Exchange::new(None);
        audience.attach(kept);
        audience.end_all(Err("disk full"));
        assert_eq!(
            kept_exchange.next().await,
            Some(ReplyPart::End(End::NotStored {
                error: "disk full".into()
            }))
        );
    }
}
