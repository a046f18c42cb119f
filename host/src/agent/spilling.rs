//! How conversations use the spill file ([`Spill`]): a history the store refused is kept
//! in it before any exchange hears so, dropped from it once the store takes it, and, at
//! the next start, opened again under that host's claim and written to the store.
//!
//! The file's reads and writes block on the disk, so they run on tokio's blocking threads.

use std::sync::{Arc, Weak};

use super::context::Context;
use super::conversations::{ConversationError, Conversations};
use super::spill::{Spill, SpillError};
use crate::ids::ProcessId;
use crate::llm::Message;
use crate::services::{RunId, ServiceError};

impl Conversations {
    /// Keeps conversation `id`'s whole `history` in the spill file, if there is one: the
    /// store has not taken it. Whether it is kept as the config says (in the spill file if
    /// there is one, else in memory only): a spill file that cannot be written is logged,
    /// and no exchange may then hear its message is kept.
    pub(crate) async fn spill_history(&self, id: &ProcessId, history: &[Message]) -> bool {
        let Some(spill) = self.spill.clone() else {
            return true;
        };
        let rows = self.stored_rows(history);
        let (run, conversation) = (self.run.id(), id.clone());
        let kept = blocking(move || spill.keep(&conversation, run, rows)).await;
        if let Err(err) = &kept {
            tracing::error!(
                conversation = %id,
                "the history is in memory only, and its exchanges wait for the store: {err}"
            );
        }
        kept.is_ok()
    }

    /// Whether the spill file holds `history`, conversation `id`'s whole history, as it is.
    pub(crate) fn spilled_as_is(&self, id: &ProcessId, history: &[Message]) -> bool {
        self.spill
            .as_ref()
            .and_then(|spill| spill.history(id))
            .is_some_and(|spilled| spilled.rows == self.stored_rows(history))
    }

    /// Drops conversation `id`'s history from the spill file: the store took it.
    pub(crate) async fn release_spilled(&self, id: &ProcessId) {
        let Some(spill) = self.spill.clone().filter(|spill| spill.holds(id)) else {
            return;
        };
        let conversation = id.clone();
        if let Err(err) = blocking(move || spill.release(&conversation)).await {
            tracing::warn!(conversation = %id, "{err}");
        }
    }

    /// The history conversation `id` starts with, `stored` being its stored history, and
    /// whether that is not stored yet: the spill file's history of it (kept there when the
    /// store refused it, by this host or one before it in the same place) when that
    /// begins with `stored`; the conversation's loop then writes it first. A spilled
    /// history that does not begin with `stored` (another host answered the conversation
    /// meanwhile, or compacted it) is never written over it: it is set aside in a file of
    /// its own and reported, and the conversation does not open if that cannot be done.
    pub(crate) async fn land_spilled(
        &self,
        id: &ProcessId,
        stored: Vec<Message>,
    ) -> Result<(Vec<Message>, bool), ServiceError> {
        let Some(spilled) = self.spill.as_ref().and_then(|spill| spill.history(id)) else {
            return Ok((stored, false));
        };
        let as_stored: Vec<String> = stored
            .iter()
            .map(|m| serde_json::to_string(m).expect("messages serialize"))
            .collect();
        if Spill::extends(&as_stored, &spilled.rows) {
            // Stored already (the save went in, dropping it from the spill did not).
            self.release_spilled(id).await;
            return Ok((stored, false));
        }
        let messages: Option<Vec<Message>> = spilled
            .rows
            .iter()
            .map(|row| serde_json::from_str(row).ok())
            .collect();
        match messages.filter(|_| Spill::extends(&spilled.rows, &as_stored)) {
            Some(messages) => {
                // Said at the default level: the operator learns a crash was made good.
                tracing::warn!(
                    conversation = %id,
                    "opens with the {} messages the spill file held past what is stored; \
                     they are written to the store now",
                    messages.len() - stored.len()
                );
                Ok((messages, true))
            }
            None => {
                let why = "does not follow what is stored (another host answered the \
                           conversation, or it was compacted, meanwhile)";
                self.set_aside(id, why)
                    .await
                    .map_err(|err| ServiceError::Invalid(err.to_string()))?;
                Ok((stored, false))
            }
        }
    }

    /// Moves conversation `id`'s spilled history aside (it cannot be stored: `why`) and
    /// reports where it is kept.
    pub(super) async fn set_aside(&self, id: &ProcessId, why: &str) -> Result<(), SpillError> {
        let Some(spill) = self.spill.clone() else {
            return Ok(());
        };
        let path = spill.path().to_owned();
        let conversation = id.clone();
        let aside = blocking(move || spill.set_aside(&conversation)).await?;
        tracing::error!(
            conversation = %id,
            "the history the spill file {} held of the conversation {why}: it was not stored, \
             and is kept in {}",
            path.display(),
            aside.display()
        );
        Ok(())
    }
}

/// Runs `work` on a blocking thread.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SpillError> + Send + 'static,
) -> Result<T, SpillError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
}

/// Opens every conversation the spill file holds a history of, so that each is written to
/// the store before this host answers it (see [`Conversations::land_spilled`]). One that another
/// host answers now is set aside and reported. One still held by the run that spilled it
/// (a host that stopped before its lease ended) is opened once that lease ends, by a task
/// of its own; one that cannot be opened yet stays in the spill file for its next opening.
pub(crate) async fn land_spill(ctx: &Arc<Context>) {
    let Some(spill) = &ctx.conversations.spill else {
        return;
    };
    for id in spill.conversations() {
        if let Some(spiller) = land(ctx, &id).await {
            tokio::spawn(land_after(Arc::downgrade(ctx), id, spiller));
        }
    }
}

/// Opens conversation `id` to land its spilled history; the run that spilled it if that
/// run still holds it.
async fn land(ctx: &Arc<Context>, id: &ProcessId) -> Option<RunId> {
    let spiller = ctx.conversations.spill.as_ref()?.history(id)?.run;
    match ctx.spawner.conversation(id).await {
        Ok(_) => None,
        Err(ConversationError::OwnedElsewhere(elsewhere)) if elsewhere.owner == spiller => {
            Some(spiller)
        }
        Err(ConversationError::OwnedElsewhere(elsewhere)) => {
            let why = format!(
                "cannot be stored: {} answers the conversation now",
                elsewhere.owner
            );
            if let Err(err) = ctx.conversations.set_aside(id, &why).await {
                tracing::error!(conversation = %id, "the spilled history {why}; it stays in the spill file ({err})");
            }
            None
        }
        Err(err) => {
            tracing::error!(
                conversation = %id,
                "the history the spill file holds of the conversation is not stored yet \
                 ({err}); it stays there and is stored when the conversation opens"
            );
            None
        }
    }
}

/// Tries [`land`] again every [`LAND_RETRY`] until `spiller`'s lease has ended and the
/// conversation opens here, or the runtime is gone.
async fn land_after(ctx: Weak<Context>, id: ProcessId, spiller: RunId) {
    tracing::warn!(
        conversation = %id,
        "the conversation's spilled history waits for the lease of {spiller} (which spilled \
         it) to end"
    );
    loop {
        tokio::time::sleep(LAND_RETRY).await;
        let Some(ctx) = ctx.upgrade() else { return };
        if land(&ctx, &id).await.is_none() {
            return;
        }
    }
}

/// How often a spilled history held by the run that spilled it is tried again.
const LAND_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
