//! Conversation history. Each channel has a head row holding its next sequence number:
//! an append takes its numbers from it under the row's lock, so appends from several
//! hosts to one channel interleave whole, and a replace takes the same lock.

use async_trait::async_trait;
use deadpool_postgres::Transaction;

use super::Postgres;
use super::rows::{parsed, readable};
use crate::ids::SessionKey;
use crate::services::Operation;
use crate::services::{ConversationSummary, History, HistoryEntry, ServiceError};

impl Postgres {
    /// Writes `channel`'s history, in one transaction. While this host has a run, the
    /// write is fenced: the run must own the session (claiming it if nobody live does),
    /// under the epoch it claimed; a write refused by the fence forgets the epoch, so the
    /// next write claims again.
    async fn write_history(
        &self,
        channel: &str,
        write: Write,
        messages: &[String],
    ) -> Result<(), ServiceError> {
        let fence = self.fence(channel, None).await?;
        let failed = |err| self.failed(write.what(), err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        self.hold(&tx, channel, fence).await?;
        let mut length = None;
        if fence.is_some() {
            // The history as stored, under its head row's lock: it must be the one this
            // host last read or wrote.
            let stored: i64 = tx
                .query_opt(
                    "SELECT next FROM history_heads WHERE channel = $1 FOR UPDATE",
                    &[&channel],
                )
                .await
                .map_err(failed)?
                .map_or(0, |row| row.get(0));
            // After a write of its own that was never answered (the server restarting as
            // it committed), which may have landed, a replace of this host's whole copy
            // (which holds it) may follow under the same epoch: no other host wrote since.
            let own_write_unanswered = matches!(write, Write::Replace)
                && fence.is_some_and(|f| self.was_unanswered(channel, &f));
            if let Some(known) = self.known_length(channel)
                && known != stored
                && !own_write_unanswered
            {
                return Err(ServiceError::Invalid(format!(
                    "{channel}'s history changed since this host read it ({known} messages \
                     then, {stored} now): the {} is dropped; reload the conversation before \
                     writing to it",
                    write.what()
                )));
            }
            length = Some(match write {
                Write::Append => stored + messages.len() as i64,
                Write::Replace => messages.len() as i64,
            });
        }
        match write {
            Write::Append => self.append_in(&tx, channel, messages).await?,
            Write::Replace => self.replace_in(&tx, channel, messages).await?,
        }
        if let Err(err) = tx.commit().await {
            if let Some(fence) = fence {
                self.note_unanswered(channel, &fence);
            }
            return Err(failed(err).into());
        }
        if let Some(length) = length {
            self.note_length(channel, length);
        }
        Ok(())
    }

    /// Replaces `channel`'s history inside `tx`, under its head row's lock.
    async fn replace_in(
        &self,
        tx: &Transaction<'_>,
        channel: &str,
        messages: &[String],
    ) -> Result<(), ServiceError> {
        let failed = |err| self.failed(Operation::HistoryReplace, err);
        let count = messages.len() as i64;
        tx.execute(
            "INSERT INTO history_heads (channel, next) VALUES ($1, $2)
             ON CONFLICT (channel) DO UPDATE SET next = $2",
            &[&channel, &count],
        )
        .await
        .map_err(failed)?;
        tx.execute("DELETE FROM history WHERE channel = $1", &[&channel])
            .await
            .map_err(failed)?;
        self.insert_messages(tx, Operation::HistoryReplace, channel, 0, messages)
            .await
    }

    /// Appends `messages` to `channel` inside `tx`, numbered from the channel's head row
    /// (taken under its lock).
    pub(super) async fn append_in(
        &self,
        tx: &Transaction<'_>,
        channel: &str,
        messages: &[String],
    ) -> Result<(), ServiceError> {
        if messages.is_empty() {
            return Ok(());
        }
        let count = messages.len() as i64;
        let first: i64 = tx
            .query_one(
                "INSERT INTO history_heads (channel, next) VALUES ($1, $2)
                 ON CONFLICT (channel) DO UPDATE SET next = history_heads.next + $2
                 RETURNING next - $2",
                &[&channel, &count],
            )
            .await
            .map_err(|err| self.failed(Operation::HistoryAppend, err))?
            .get(0);
        self.insert_messages(tx, Operation::HistoryAppend, channel, first, messages)
            .await
    }

    /// Inserts `messages` into `channel` from number `first` on, in one statement.
    async fn insert_messages(
        &self,
        tx: &Transaction<'_>,
        what: Operation,
        channel: &str,
        first: i64,
        messages: &[String],
    ) -> Result<(), ServiceError> {
        tx.execute(
            "INSERT INTO history (channel, seq, message)
             SELECT $1, $2 + n - 1, message FROM unnest($3::TEXT[]) WITH ORDINALITY AS m(message, n)",
            &[&channel, &first, &messages],
        )
        .await
        .map_err(|err| self.failed(what, err))?;
        Ok(())
    }
}

#[async_trait]
impl History for Postgres {
    fn location(&self) -> String {
        self.location.clone()
    }

    async fn load(&self, channel: &SessionKey) -> Result<Vec<HistoryEntry>, ServiceError> {
        let channel = channel.as_str();
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT seq, message FROM history WHERE channel = $1 ORDER BY seq",
                &[&channel],
            )
            .await
            .map_err(|err| self.failed(Operation::HistoryLoad, err))?;
        // One statement, one snapshot: the history is 0..len, as its head row says.
        self.note_length(channel, rows.len() as i64);
        rows.iter()
            .map(|row| {
                let seq = row.get::<_, i64>(0) as u64;
                let message: String = row.get(1);
                serde_json::from_str::<serde::de::IgnoredAny>(&message).map_err(|err| {
                    ServiceError::UnreadableHistory {
                        location: self.location.clone(),
                        channel: channel.to_owned(),
                        seq,
                        reason: format!("not valid JSON: {err}"),
                    }
                })?;
                Ok(HistoryEntry { seq, message })
            })
            .collect()
    }

    async fn append(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.write_history(channel.as_str(), Write::Append, &messages)
            .await
    }

    async fn replace(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.write_history(channel.as_str(), Write::Replace, &messages)
            .await
    }

    async fn conversations(&self) -> Result<Vec<ConversationSummary>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT channel, COUNT(*) FROM history GROUP BY channel ORDER BY channel COLLATE \"C\"",
                &[],
            )
            .await
            .map_err(|err| self.failed(Operation::HistoryConversations, err))?;
        Ok(readable("a conversation", &rows, |row| {
            Ok(ConversationSummary {
                channel: parsed(row, 0)?,
                messages: row.get::<_, i64>(1) as u64,
            })
        }))
    }
}

/// A write of a channel's history.
#[derive(Debug, Clone, Copy)]
enum Write {
    Append,
    Replace,
}

impl Write {
    fn what(self) -> Operation {
        match self {
            Write::Append => Operation::HistoryAppend,
            Write::Replace => Operation::HistoryReplace,
        }
    }
}
