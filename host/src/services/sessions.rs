//! Session ownership: which run answers a conversation, when several hosts share the
//! services.
//!
//! A session (a conversation, keyed like `channel:main`) is owned by one live run at a
//! time. The owner answers it; every other host [forwards](Sessions::forward) what it
//! receives for the session into the owner's inbox, and the owner
//! [takes](Sessions::take_forwarded) it from there. A takeover (the owner's lease ran out)
//! bumps the session's [`Epoch`], and the backend fences every write of a session with the
//! epoch it was made under.
//!
//! The defaults are those of a backend one host uses alone (SQLite, in memory): every
//! claim is granted, under the first epoch, and nothing is ever forwarded.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{RunId, ServiceError};
use crate::ids::{ProcessId, SessionKey};

/// How many times a session changed owner: a takeover makes it one more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(u64);

impl Epoch {
    /// The epoch of a session's first owner.
    pub const FIRST: Epoch = Epoch(1);

    /// The epoch numbered `n`.
    pub fn new(n: u64) -> Self {
        Epoch(n)
    }

    /// Its number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {}", self.0)
    }
}

/// A forwarded message's number, by which its answer is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ForwardId(u64);

impl ForwardId {
    /// The message numbered `n`.
    pub fn new(n: u64) -> Self {
        ForwardId(n)
    }

    /// Its number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ForwardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "forwarded message {}", self.0)
    }
}

/// The answer to a claim of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The claiming run owns the session, under this epoch.
    Owned(Epoch),
    /// Another run, still live, owns it: forward to it.
    OwnedElsewhere(RunId),
}

/// What one host hands to a session another host owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Forwarded {
    /// A message from the user.
    User {
        /// Its text.
        text: String,
        /// The client's idempotency key, if it gave one: the owner takes the message once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<crate::ids::MessageKey>,
        /// The W3C `traceparent` of the span that sent it, if traces were on there: the
        /// turn that takes it in here is that span's child.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        traceparent: Option<String>,
        /// Who could have written it (trusted when absent: a row written before labels
        /// travelled with forwarded messages came from a door, whose people are trusted).
        #[serde(default, skip_serializing_if = "crate::flow::Label::is_clear")]
        label: crate::flow::Label,
    },
    /// A worker of the conversation was lost with its host (killed, or cut off past its
    /// lease): it was marked interrupted and is never run again.
    WorkerLost {
        /// e.g. `worker:3`.
        worker: ProcessId,
        /// What its record says now (the host's words).
        outcome: String,
    },
}

/// What the owner of a conversation answers a forwarded message with: the replies of the
/// turn that took it in, or why it got none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// Every reply of the turn, set off by blank lines (empty: the turn said nothing).
    pub reply: String,
    /// Why the message got no answer, if it did not (or, with
    /// [`AnswerOutcome::NotStored`], the store's error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether what answered the message is stored.
    #[serde(default, skip_serializing_if = "AnswerOutcome::is_stored")]
    pub outcome: AnswerOutcome,
}

/// Whether the owner stored what answered a forwarded message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerOutcome {
    /// Answered (or not, as its error says), and the history holding it is stored.
    #[default]
    Stored,
    /// The owner stopped before the work the message started was over; what was done is
    /// stored.
    Interrupted,
    /// The owner stopped before the store took the history holding it.
    NotStored,
}

impl AnswerOutcome {
    /// Whether it is [`AnswerOutcome::Stored`].
    pub fn is_stored(&self) -> bool {
        *self == AnswerOutcome::Stored
    }
}

/// Session ownership and the inboxes of sessions owned elsewhere.
///
/// ```
/// use capstan_host::services::{Claim, Epoch, Services};
/// use capstan_host::ids::ProcessId;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // One host alone owns every session it claims.
/// let services = Services::in_memory();
/// let run = services.ledger.begin_run().await.unwrap();
/// let main = ProcessId::channel("main").session();
/// let claim = services.sessions.claim(&main, run.id()).await.unwrap();
/// assert_eq!(claim, Claim::Owned(Epoch::FIRST));
/// # });
/// ```
#[async_trait]
pub trait Sessions: Send + Sync {
    /// Claims `session` for `run`: keeps it if the run owns it already, takes it if
    /// nobody owns it or its owner's run is over (a new epoch), and otherwise names the
    /// live run that owns it. A run that is over is refused.
    async fn claim(&self, session: &SessionKey, run: RunId) -> Result<Claim, ServiceError> {
        let _ = (session, run);
        Ok(Claim::Owned(Epoch::FIRST))
    }

    /// Queues `message` for whichever run owns `session`, now or later: it is taken once,
    /// by the owner, in the order forwarded. Returns the number its answer is found by.
    async fn forward(
        &self,
        session: &SessionKey,
        message: &Forwarded,
    ) -> Result<ForwardId, ServiceError> {
        let _ = message;
        Err(ServiceError::Invalid(format!(
            "{session} cannot be forwarded to: this store serves one host, which owns every session"
        )))
    }

    /// The sessions with forwarded messages waiting that `run` owns, or may take over
    /// (their owner's run is over, or nobody owns them).
    async fn forwarded_sessions(&self, run: RunId) -> Result<Vec<SessionKey>, ServiceError> {
        let _ = run;
        Ok(Vec::new())
    }

    /// Takes the messages forwarded to `session`, oldest first, if `run` owns it under
    /// `epoch` (and its run is live); otherwise refuses and takes nothing.
    async fn take_forwarded(
        &self,
        session: &SessionKey,
        run: RunId,
        epoch: Epoch,
    ) -> Result<Vec<(ForwardId, Forwarded)>, ServiceError> {
        let _ = (session, run, epoch);
        Ok(Vec::new())
    }

    /// Leaves `answer` for forwarded message `id`, for the host that forwarded it
    /// ([`Sessions::take_answer`]).
    async fn answer(&self, id: ForwardId, answer: &Answer) -> Result<(), ServiceError> {
        let _ = (id, answer);
        Ok(())
    }

    /// Takes the answer to forwarded message `id`, once: `None` while there is none.
    async fn take_answer(&self, id: ForwardId) -> Result<Option<Answer>, ServiceError> {
        let _ = id;
        Ok(None)
    }

    /// Returns when an answer may have been left since the call (a hint), and at least
    /// every few seconds while any host shares the store. One host alone: never.
    async fn answer_wakeup(&self) {
        std::future::pending::<()>().await
    }

    /// Returns when messages may have been forwarded since the last call (a hint: check
    /// with [`Sessions::forwarded_sessions`]), and at least every few seconds while any
    /// host shares the store. One host alone: never.
    async fn forwarded_wakeup(&self) {
        std::future::pending::<()>().await
    }
}
