//! [`Conversations`]: what a conversation's loop asks of the store: its session claimed
//! and its history read, what other hosts forwarded to it, its history saved (and kept in
//! the spill file while the store refuses it), and a stop that could not save it noted.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::events::Event;
use super::inbox::{ChannelHandle, ChannelInput};
use super::reporter::Reporter;
use super::spill::Spill;
use super::stop::{NotSaved, StopLedger};
use super::supervisor::{ShuttingDown, TooManyConversations};
use crate::ids::ProcessId;
use crate::llm::Message;
use crate::services::{Claim, Epoch, History, Run, RunId, ServiceError, Sessions};

/// The least a save of a history may take before its exchanges hear the store is slow,
/// whatever `limits.unstored_reply_secs` says: a healthy store never takes this long.
const SLOW_SAVE_MIN: Duration = Duration::from_secs(1);

/// Why a conversation could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    /// The host is shutting down ([`Runtime::shutdown`](super::Runtime::shutdown) or
    /// [`Runtime::interrupt`](super::Runtime::interrupt) was called).
    #[error(transparent)]
    ShuttingDown(#[from] ShuttingDown),
    /// Its stored history could not be read: it does not start rather than start from
    /// an empty or partial history.
    #[error(transparent)]
    History(#[from] ServiceError),
    /// As many conversations as the limit allows are open.
    #[error(transparent)]
    TooMany(#[from] TooManyConversations),
    /// Another host answers it: what is sent to it is forwarded there.
    #[error(transparent)]
    OwnedElsewhere(#[from] OwnedElsewhere),
    /// Which host answers it could not be settled (the store failed).
    #[error("cannot settle which host answers the conversation: {0}")]
    Session(ServiceError),
}

/// A conversation another host's run answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{conversation} is answered by {owner}, a run of another host sharing the store: \
     send it messages (they are forwarded), or use that host"
)]
pub struct OwnedElsewhere {
    /// The conversation.
    pub conversation: ProcessId,
    /// The run that owns it.
    pub owner: RunId,
}

/// What conversations ask of the store; see the [module](self).
pub(crate) struct Conversations {
    history: Arc<dyn History>,
    sessions: Arc<dyn Sessions>,
    reporter: Arc<Reporter>,
    /// This host's run, which claims the sessions.
    pub(super) run: Arc<Run>,
    /// `limits.unstored_reply_secs`: how long a save may take before its exchanges hear
    /// the store is slow.
    unstored_reply: Duration,
    /// `store.spill_file`: where histories the store refused are kept besides memory.
    pub(crate) spill: Option<Arc<Spill>>,
    /// The conversations whose history the store had not taken when they stopped, with
    /// its last error.
    pub(crate) stop: StopLedger,
}

impl Conversations {
    /// Conversations stored in `history`, claimed in `sessions` under `run`, telling
    /// through `reporter`, keeping what the store refuses in `spill` (if any) and what a
    /// stop could not save in `stop`.
    pub(crate) fn new(
        history: Arc<dyn History>,
        sessions: Arc<dyn Sessions>,
        reporter: Arc<Reporter>,
        run: Arc<Run>,
        unstored_reply: Duration,
        spill: Option<Arc<Spill>>,
        stop: StopLedger,
    ) -> Self {
        Conversations {
            history,
            sessions,
            reporter,
            run,
            unstored_reply,
            spill,
            stop,
        }
    }

    /// Claims conversation `id`'s session for this host's run and reads its history:
    /// the epoch it is owned under, the history it starts with, and whether that is not
    /// stored yet (it came from the spill file). Claimed before its history is read: the
    /// history of a session this host owns changes only through this host.
    pub(crate) async fn claim(
        &self,
        id: &ProcessId,
    ) -> Result<(Epoch, Vec<Message>, bool), ConversationError> {
        let session = id.session();
        let claim = self
            .sessions
            .claim(&session, self.run.id())
            .await
            .map_err(ConversationError::Session)?;
        let epoch = match claim {
            Claim::Owned(epoch) => epoch,
            Claim::OwnedElsewhere(owner) => {
                return Err(OwnedElsewhere {
                    conversation: id.clone(),
                    owner,
                }
                .into());
            }
        };
        let history = self.history.load_as(&session).await?;
        let (history, unstored) = self.land_spilled(id, history).await?;
        Ok((epoch, history, unstored))
    }

    /// Sends into conversation `id` (through `handle`) what other hosts forwarded to it,
    /// oldest first. A failure is logged; the next look at the inbox tries again.
    pub(crate) async fn take_forwarded(&self, id: &ProcessId, handle: &ChannelHandle) {
        let session = id.session();
        let taken = self
            .sessions
            .take_forwarded(&session, self.run.id(), handle.epoch)
            .await;
        match taken {
            Ok(messages) => {
                for (number, message) in messages {
                    handle.send(ChannelInput::forwarded(number, message));
                }
            }
            Err(err) => tracing::warn!(
                conversation = %id,
                "cannot take what was forwarded to the conversation (trying again soon): {err}"
            ),
        }
    }

    /// Stores `history` of conversation `id` (through `handle`), each message redacted:
    /// only the messages from `from` on are appended when the store already holds the
    /// rest; `from == 0` rewrites it all. A failure is reported as
    /// [`Event::HistoryNotSaved`], told to the exchanges waiting (which end only once a
    /// save succeeds) and returned, so the caller rewrites the whole history at its next
    /// save.
    pub(crate) async fn save_history(
        &self,
        id: &ProcessId,
        handle: &ChannelHandle,
        history: &[Message],
        from: usize,
    ) -> Result<(), ServiceError> {
        let channel = &id.session();
        let rows = self.stored_rows(&history[from.min(history.len())..]);
        let save = async {
            if from == 0 {
                self.history.replace(channel, rows).await
            } else {
                self.history.append(channel, rows).await
            }
        };
        // A store that neither takes nor refuses the history (a locked database, a pool
        // with no free connection) keeps the exchanges waiting no longer than one that
        // refuses it: they hear it is not yet stored, and the save goes on.
        let slow_after = self.unstored_reply.max(SLOW_SAVE_MIN);
        tokio::pin!(save);
        let saved = match tokio::time::timeout(slow_after, &mut save).await {
            Ok(saved) => saved,
            Err(_) => {
                // Kept on disk before any exchange hears it is not yet stored.
                if self.spill_history(id, history).await {
                    handle.audience.store_slow(slow_after);
                }
                save.await
            }
        };
        match &saved {
            Ok(()) => {
                self.release_spilled(id).await;
                handle.audience.stored(|| handle.is_idle());
            }
            Err(err) => {
                // Kept on disk before any exchange hears it is not yet stored.
                let kept = self.spill_history(id, history).await;
                let error = self.reporter.redactor().redact_owned(err.to_string());
                // Reported when the store starts refusing, not at every try after.
                if !handle.audience.not_stored(&error, kept) {
                    tracing::debug!(conversation = %id, "the store still refuses the history: {error}");
                    return saved;
                }
                self.reporter.emit_to(
                    &handle.audience.everyone(),
                    Event::HistoryNotSaved {
                        channel: id.clone(),
                        error,
                    },
                );
            }
        }
        saved
    }

    /// `messages` as the store keeps them: JSON rows, each redacted field by field (so a
    /// row stays a message whatever the value), since a value the redactor knows (a
    /// user's paste, the model's echo) never rests in the store.
    pub(crate) fn stored_rows(&self, messages: &[Message]) -> Vec<String> {
        messages
            .iter()
            .map(|m| {
                let row = serde_json::to_string(m).expect("messages serialize");
                if matches!(self.reporter.redactor().redact(&row), Cow::Borrowed(_)) {
                    return row;
                }
                let mut row = serde_json::to_value(m).expect("messages serialize");
                self.reporter.redactor().redact_json(&mut row);
                row.to_string()
            })
            .collect()
    }

    /// Notes that conversation `id` stopped with `history` not stored (the store's last
    /// `error`): the stop reports it, and whether the spill file holds it.
    pub(crate) fn not_saved_at_stop(&self, id: &ProcessId, history: &[Message], error: String) {
        let spilled = self
            .spill
            .as_ref()
            .filter(|_| self.spilled_as_is(id, history))
            .map(|spill| spill.path().to_owned());
        match &spilled {
            Some(spill) => tracing::error!(
                conversation = %id,
                "the conversation stopped with its history not stored ({error}); it is kept in \
                 the spill file {} and stored at the next start",
                spill.display()
            ),
            None => tracing::error!(
                conversation = %id,
                "the conversation stopped with its history not stored: {error}"
            ),
        }
        self.stop.not_saved(NotSaved {
            conversation: id.clone(),
            error,
            spilled,
        });
    }
}
