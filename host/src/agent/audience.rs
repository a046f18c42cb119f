//! [`Audience`]: the exchanges waiting on one conversation, each following its own
//! message's [`Work`].
//!
//! An exchange follows the turn that took its message in, the workers and branches that
//! turn started, and, once one of them reports back, the turn that takes the report in;
//! and so on, for as long as the work its message started goes on. What a process does
//! reaches the exchanges through its [`Scope`]: only those that follow its work hear it.
//! An exchange ends once nothing it follows is under way *and* the conversation's history
//! is stored; so two messages sent at once each get their own answer, unless the
//! conversation took them in together (they arrived while it was busy): then that turn's
//! answer is the answer to both. A report that arrives with a message joins that turn
//! likewise: who waits on the report, and who waits on the message, hear the turn and
//! what it starts. Once the conversation is idle every exchange ends, whatever it
//! followed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::exchange::{End, Listener, PartNumber, ReplyPart};
use crate::ids::{MessageKey, ProcessId};

/// Answers to keyed messages a conversation keeps in memory, most recent last: a message
/// sent again with a key past these is answered from the stored history instead.
const ANSWERS_KEPT: usize = 1024;

/// A piece of a conversation's work that an exchange can follow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Work {
    /// A turn of the conversation's loop, numbered from 1 in this run.
    Turn(u64),
    /// A worker or branch working for the conversation, from its start until its report
    /// is taken into a turn.
    Process(ProcessId),
}

/// An attached exchange and the work it follows.
struct Follower {
    listener: Listener,
    follows: HashSet<Work>,
    /// Follows all of the conversation's work: it repeats a message whose answer may be
    /// under way with no exchange of its own to follow (sent without waiting, or forwarded).
    whole: bool,
}

impl Follower {
    fn follows(&self, work: &Work) -> bool {
        self.whole || self.follows.contains(work)
    }
}

/// The exchanges attached to one conversation, and whether its history is stored.
#[derive(Clone, Default)]
pub(crate) struct Audience {
    inner: Arc<Mutex<Attached>>,
}

#[derive(Default)]
struct Attached {
    followers: Vec<Follower>,
    /// The parts sent to attached exchanges so far.
    sent: u64,
    /// The turns begun so far.
    turns: u64,
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
    /// The number of the next part sent to more than one exchange.
    fn number(&mut self) -> PartNumber {
        self.sent += 1;
        PartNumber::new(self.sent)
    }

    /// The exchanges `to` reaches: those following its work, or all.
    fn reached<'a>(&'a mut self, to: &'a Option<Work>) -> impl Iterator<Item = &'a mut Follower> {
        self.followers
            .iter_mut()
            .filter(move |f| to.as_ref().is_none_or(|work| f.follows(work)))
    }

    /// Notes that the history is not stored (`error`, after `waited`) and tells every
    /// exchange not told yet.
    fn tell_unstored(&mut self, error: &str, waited: Duration) {
        self.unsaved = Some(error.to_owned());
        // Each exchange's own notice, unnumbered: only those not told yet hear it.
        for follower in &mut self.followers {
            let listener = &mut follower.listener;
            if !listener.told_unstored {
                listener.told_unstored = true;
                listener.send(ReplyPart::NotYetStored {
                    error: error.to_owned(),
                    waited,
                });
            }
        }
    }

    /// Ends the exchanges whose work is over (all of them if `idle`: nothing of the
    /// conversation's is under way), if the history is stored.
    fn end_settled(&mut self, idle: bool) {
        if self.unsaved.is_some() {
            return;
        }
        let (ended, waiting) = std::mem::take(&mut self.followers)
            .into_iter()
            .partition(|f| idle || (!f.whole && f.follows.is_empty()));
        self.followers = waiting;
        for Follower { listener, .. } in ended {
            self.keep_answer(&listener);
            let end = match (&listener.failed, listener.replies.is_empty()) {
                (Some(error), true) => End::Failed {
                    error: error.clone(),
                },
                _ => End::Complete,
            };
            listener.end(end);
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

    /// The scope of the conversation's next turn.
    pub(crate) fn next_turn(&self) -> Scope {
        let mut attached = self.lock();
        attached.turns += 1;
        self.scope(Some(Work::Turn(attached.turns)))
    }

    /// The scope of worker or branch `process`: the exchanges that follow it are those
    /// that followed the work that started it ([`Scope::include`]).
    pub(crate) fn of(&self, process: &ProcessId) -> Scope {
        self.scope(Some(Work::Process(process.clone())))
    }

    /// The scope of what concerns every exchange attached: the conversation's history is
    /// not stored.
    pub(crate) fn everyone(&self) -> Scope {
        self.scope(None)
    }

    fn scope(&self, work: Option<Work>) -> Scope {
        Scope {
            audience: self.clone(),
            work,
        }
    }

    /// Whether a keyed exchange with `key` is attached, or ended stored lately.
    pub(crate) fn knows(&self, key: &MessageKey) -> bool {
        let attached = self.lock();
        attached.answered.contains_key(key)
            || attached
                .followers
                .iter()
                .any(|f| f.listener.key.as_ref() == Some(key))
    }

    /// Answers `listener`, whose message has a key the conversation took before, with
    /// the answer that key got so far: that of its exchange still under way, or kept from
    /// one that ended, or else `stored` (read from the history). Then it follows what
    /// that message's exchange follows, and ends with it; one that ended is over, and
    /// one only the history holds may still be under way with nothing to follow (it was
    /// sent without waiting, or forwarded): that repeat follows all the conversation's
    /// work. Either way it ends only once the history is stored.
    pub(crate) fn repeat(&self, mut listener: Listener, stored: impl FnOnce() -> Vec<String>) {
        let Some(key) = listener.key.clone() else {
            return self.attach(listener, HashSet::new(), true);
        };
        // Under one lock: what it follows cannot grow between the copy and the attach.
        let mut attached = self.lock();
        listener.send(ReplyPart::Repeated { key: key.clone() });
        // Whether what it repeats is held as the store's refusal is told: its first
        // exchange, still under way, was told so (its message may not be held yet); or it
        // ended, or is in the history, held with it.
        let under_way = attached
            .followers
            .iter()
            .find(|f| f.listener.key.as_ref() == Some(&key))
            .map(|f| {
                let l = &f.listener;
                let follows = f.follows.clone();
                (
                    l.replies.clone(),
                    l.failed.clone(),
                    l.told_unstored,
                    follows,
                    f.whole,
                )
            });
        let (replies, failed, held, follows, whole) = under_way
            .or_else(|| {
                let (replies, failed) = attached.answered.get(&key).cloned()?;
                Some((replies, failed, true, HashSet::new(), false))
            })
            .unwrap_or_else(|| (stored(), None, true, HashSet::new(), true));
        for text in &replies {
            listener.send(ReplyPart::Reply {
                text: text.clone(),
                streamed: false,
            });
        }
        listener.replies = replies;
        listener.failed = failed;
        // What it repeats is already held (in memory and the spill): it hears so now.
        if let Some(error) = attached.unsaved.clone().filter(|_| held) {
            listener.told_unstored = true;
            listener.send(ReplyPart::NotYetStored {
                error,
                waited: Duration::ZERO,
            });
        }
        attached.followers.push(Follower {
            listener,
            follows,
            whole,
        });
        attached.end_settled(false);
    }

    fn attach(&self, listener: Listener, follows: HashSet<Work>, whole: bool) {
        self.lock().followers.push(Follower {
            listener,
            follows,
            whole,
        });
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

    /// Notes that the history is stored; then ends the exchanges whose work is over, or
    /// all of them if `idle` says nothing is pending.
    pub(crate) fn stored(&self, idle: impl Fn() -> bool) {
        {
            let mut attached = self.lock();
            attached.unsaved = None;
            attached.refused = false;
        }
        self.end_if_settled(idle);
    }

    /// Ends the exchanges whose work is over, or all of them if nothing is pending
    /// (`idle`, read under the lock, so an exchange attached meanwhile is not ended
    /// before its own message was handled), once the history is stored.
    pub(crate) fn end_if_settled(&self, idle: impl Fn() -> bool) {
        let mut attached = self.lock();
        let idle = idle();
        attached.end_settled(idle);
    }

    /// Ends every attached exchange: the conversation stopped. `Err` carries the store's
    /// error if its history could not be stored.
    pub(crate) fn end_all(&self, stored: Result<(), &str>) {
        let mut attached = self.lock();
        for Follower { listener, .. } in attached.followers.drain(..) {
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
        self.lock().followers.is_empty()
    }
}

/// Where what one piece of a conversation's work does is told: the exchanges that follow
/// that work (a turn, a worker, a branch), or every exchange attached.
#[derive(Clone)]
pub(crate) struct Scope {
    audience: Audience,
    /// `None`: every exchange.
    work: Option<Work>,
}

impl Scope {
    /// Attaches `listener`, whose message this turn takes in: it follows the turn.
    pub(crate) fn attach(&self, listener: Listener) {
        let follows = self.work.iter().cloned().collect();
        self.audience.attach(listener, follows, false);
    }

    /// Sends `part` to the exchanges that follow this work.
    pub(crate) fn send(&self, part: &ReplyPart) {
        let mut attached = self.audience.lock();
        let number = attached.number();
        for follower in attached.reached(&self.work) {
            follower.listener.send_shared(number, part.clone());
        }
    }

    /// Sends a delivered reply to the exchanges that follow this work.
    pub(crate) fn reply(&self, text: &str, streamed: bool) {
        let mut attached = self.audience.lock();
        let number = attached.number();
        for follower in attached.reached(&self.work) {
            let listener = &mut follower.listener;
            listener.replies.push(text.to_owned());
            let text = text.to_owned();
            listener.send_shared(number, ReplyPart::Reply { text, streamed });
        }
    }

    /// Notes that this work got no answer from the model.
    pub(crate) fn model_failed(&self, error: &str) {
        let mut attached = self.audience.lock();
        for follower in attached.reached(&self.work) {
            follower.listener.failed = Some(error.to_owned());
        }
    }

    /// Includes worker or branch `process` in this work (it starts it, routes it a
    /// message, or asks for one it already runs): who follows this work follows it, until
    /// its last report is taken in ([`Scope::took_report`]). Called before it starts, or
    /// under the registry lock before the message goes, so they hear all it does.
    pub(crate) fn include(&self, process: &ProcessId) {
        let child = Work::Process(process.clone());
        let mut attached = self.audience.lock();
        for follower in attached.reached(&self.work) {
            follower.follows.insert(child.clone());
        }
    }

    /// Notes that this turn takes in a report of `process`: who follows it follows the
    /// turn too, and, if it is the process's `last` report, no longer the process (a worker
    /// that asks for input goes on, and reports again).
    pub(crate) fn took_report(&self, process: &ProcessId, last: bool) {
        let Some(turn) = &self.work else { return };
        let reported = Work::Process(process.clone());
        let mut attached = self.audience.lock();
        for follower in &mut attached.followers {
            let followed = if last {
                follower.follows.remove(&reported)
            } else {
                follower.follows.contains(&reported)
            };
            if followed {
                follower.follows.insert(turn.clone());
            }
        }
    }

    /// Notes that this turn is over and what it did was handed to the store: the
    /// exchanges that follow nothing else end, if the history is stored (else once it
    /// is).
    pub(crate) fn over(&self) {
        let Some(turn) = &self.work else { return };
        let mut attached = self.audience.lock();
        for follower in &mut attached.followers {
            follower.follows.remove(turn);
        }
        attached.end_settled(false);
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
    use crate::agent::exchange::Exchange;
    use crate::ids::testing::pid;

    fn reply(text: &str) -> ReplyPart {
        ReplyPart::Reply {
            text: text.into(),
            streamed: false,
        }
    }

    #[test]
    fn an_exchange_ends_only_once_its_work_is_over_and_stored() {
        let audience = Audience::default();
        let (listener, mut exchange) = Exchange::new(None);
        let turn = audience.next_turn();
        turn.attach(listener);
        turn.reply("hello", false);
        audience.not_stored("database down", true);
        turn.over();
        assert_eq!(
            exchange.sent_so_far(),
            [
                reply("hello"),
                ReplyPart::NotYetStored {
                    error: "database down".into(),
                    waited: Duration::ZERO,
                }
            ],
            "not ended while the history is not stored"
        );
        audience.stored(|| false);
        assert_eq!(exchange.sent_so_far(), [ReplyPart::End(End::Complete)]);
        assert!(audience.is_empty());
    }

    /// An audience whose first turn took a message in, started `worker` and replied
    /// `replied`: the audience and that message's exchange.
    fn started(worker: &ProcessId, replied: &str) -> (Audience, Exchange) {
        let audience = Audience::default();
        let (first, first_exchange) = Exchange::new(None);
        let one = audience.next_turn();
        one.attach(first);
        one.include(worker);
        one.reply(replied, false);
        one.over();
        (audience, first_exchange)
    }

    #[test]
    fn an_exchange_follows_the_workers_its_turn_started_into_the_turn_that_takes_their_report() {
        let worker = pid("worker:1");
        let (audience, mut first_exchange) = started(&worker, "on it");
        // A second message, while the first one's worker works: its own turn, its own
        // answer, none of the worker's activity, and it ends while the worker goes on.
        let (second, mut second_exchange) = Exchange::new(None);
        let two = audience.next_turn();
        two.attach(second);
        let progress = ReplyPart::Text("worker progress".into());
        audience.of(&worker).send(&progress);
        two.reply("hi", false);
        two.over();
        assert_eq!(
            second_exchange.sent_so_far(),
            [reply("hi"), ReplyPart::End(End::Complete)]
        );
        assert_eq!(first_exchange.sent_so_far(), [reply("on it"), progress]);
        // The worker's report is taken into a turn: the first exchange follows it, and
        // ends with it.
        let three = audience.next_turn();
        three.took_report(&worker, true);
        three.reply("the worker is done", false);
        assert_eq!(
            first_exchange.sent_so_far(),
            [reply("the worker is done")],
            "not ended before the turn that took the report is over"
        );
        three.over();
        assert_eq!(
            first_exchange.sent_so_far(),
            [ReplyPart::End(End::Complete)]
        );
        assert!(audience.is_empty());
    }

    #[test]
    fn a_worker_that_asks_for_input_is_still_followed_until_its_last_report() {
        let worker = pid("worker:1");
        let (audience, mut first_exchange) = started(&worker, "on it");
        assert_eq!(first_exchange.sent_so_far(), [reply("on it")]);
        // The question is taken in; the worker goes on once answered.
        let two = audience.next_turn();
        two.took_report(&worker, false);
        two.over();
        let progress = ReplyPart::Text("the worker goes on".into());
        audience.of(&worker).send(&progress);
        assert_eq!(first_exchange.sent_so_far(), [progress]);
        let three = audience.next_turn();
        three.took_report(&worker, true);
        three.over();
        assert_eq!(
            first_exchange.sent_so_far(),
            [ReplyPart::End(End::Complete)]
        );
    }

    #[test]
    fn messages_taken_in_together_share_their_turn_and_each_hears_the_reply_once() {
        let audience = Audience::default();
        let turn = audience.next_turn();
        let (a, mut a_exchange) = Exchange::new(None);
        let (b, mut b_exchange) = Exchange::new(None);
        turn.attach(a);
        turn.attach(b);
        turn.reply("both answered", false);
        turn.over();
        for exchange in [&mut a_exchange, &mut b_exchange] {
            assert_eq!(
                exchange.sent_so_far(),
                [reply("both answered"), ReplyPart::End(End::Complete)]
            );
        }
    }

    #[test]
    fn a_failure_with_no_reply_ends_failed_and_one_with_a_reply_complete() {
        let audience = Audience::default();
        let (failed, mut failed_exchange) = Exchange::new(None);
        let one = audience.next_turn();
        one.attach(failed);
        one.model_failed("timed out");
        one.over();
        let (answered, mut answered_exchange) = Exchange::new(None);
        let two = audience.next_turn();
        two.attach(answered);
        two.model_failed("timed out");
        two.reply("late but here", true);
        two.over();
        assert_eq!(
            failed_exchange.sent_so_far(),
            [ReplyPart::End(End::Failed {
                error: "timed out".into()
            })]
        );
        assert_eq!(
            answered_exchange.sent_so_far().last(),
            Some(&ReplyPart::End(End::Complete))
        );
    }

    #[test]
    fn a_repeat_waits_like_the_first_while_the_history_is_not_stored() {
        let audience = Audience::default();
        let key: MessageKey = "k".parse().unwrap();
        let (first, mut first_exchange) = Exchange::new(Some(key.clone()));
        let turn = audience.next_turn();
        turn.attach(first);
        turn.reply("hello", false);
        audience.not_stored("database down", true);
        // Sent again while the first waits for the store: told the answer so far, and that
        // it is not stored, and not ended.
        let (again, mut again_exchange) = Exchange::new(Some(key.clone()));
        audience.repeat(again, || panic!("the answer under way is used"));
        turn.over();
        let parts = again_exchange.sent_so_far();
        assert_eq!(parts[0], ReplyPart::Repeated { key: key.clone() });
        assert!(parts.contains(&reply("hello")));
        assert!(
            parts
                .iter()
                .any(|p| matches!(p, ReplyPart::NotYetStored { .. }))
        );
        assert!(
            !parts.iter().any(|p| matches!(p, ReplyPart::End(_))),
            "{parts:?}"
        );
        audience.stored(|| false);
        assert_eq!(
            first_exchange.sent_so_far().last(),
            Some(&ReplyPart::End(End::Complete))
        );
        assert_eq!(
            again_exchange.sent_so_far(),
            [ReplyPart::End(End::Complete)]
        );
        // Once more, after both ended: answered from what was kept, at once.
        let (late, mut late_exchange) = Exchange::new(Some(key.clone()));
        audience.repeat(late, || panic!("the kept answer is used"));
        assert_eq!(
            late_exchange.sent_so_far(),
            [
                ReplyPart::Repeated { key },
                reply("hello"),
                ReplyPart::End(End::Complete)
            ]
        );
    }

    #[test]
    fn a_repeat_of_a_message_only_the_history_holds_waits_for_the_whole_conversation() {
        let audience = Audience::default();
        let key: MessageKey = "sent-without-waiting".parse().unwrap();
        let (again, mut again_exchange) = Exchange::new(Some(key.clone()));
        audience.repeat(again, Vec::new);
        audience.next_turn().over();
        assert_eq!(again_exchange.sent_so_far(), [ReplyPart::Repeated { key }]);
        audience.end_if_settled(|| true);
        assert_eq!(
            again_exchange.sent_so_far(),
            [ReplyPart::End(End::Complete)]
        );
    }

    #[tokio::test]
    async fn a_stop_says_what_was_stored() {
        let audience = Audience::default();
        let (kept, mut kept_exchange) = Exchange::new(None);
        audience.next_turn().attach(kept);
        audience.end_all(Err("disk full"));
        assert_eq!(
            kept_exchange.next().await,
            Some(ReplyPart::End(End::NotStored {
                error: "disk full".into()
            }))
        );
    }
}
