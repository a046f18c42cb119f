//! Conversation history. Each channel has a head row holding its next sequence number:
//! an append takes its numbers from it under the row's lock, so appends from several
//! hosts to one channel interleave whole, and a replace takes the same lock.

use async_trait::async_trait;
use deadpool_postgres::Transaction;

use super::Postgres;
use crate::services::{ConversationSummary, History, HistoryEntry, ServiceError};

impl Postgres {
    /// Inserts `messages` into `channel` from number `first` on, in one statement.
    async fn insert_messages(
        &self,
        tx: &Transaction<'_>,
        what: &'static str,
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

    async fn load(&self, channel: &str) -> Result<Vec<HistoryEntry>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT seq, message FROM history WHERE channel = $1 ORDER BY seq",
                &[&channel],
            )
            .await
            .map_err(|err| self.failed("history.load", err))?;
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

    async fn append(&self, channel: &str, messages: Vec<String>) -> Result<(), ServiceError> {
        if messages.is_empty() {
            return Ok(());
        }
        let failed = |err| self.failed("history.append", err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let count = messages.len() as i64;
        let first: i64 = tx
            .query_one(
                "INSERT INTO history_heads (channel, next) VALUES ($1, $2)
                 ON CONFLICT (channel) DO UPDATE SET next = history_heads.next + $2
                 RETURNING next - $2",
                &[&channel, &count],
            )
            .await
            .map_err(failed)?
            .get(0);
        self.insert_messages(&tx, "history.append", channel, first, &messages)
            .await?;
        Ok(tx.commit().await.map_err(failed)?)
    }

    async fn replace(&self, channel: &str, messages: Vec<String>) -> Result<(), ServiceError> {
        let failed = |err| self.failed("history.replace", err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
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
        self.insert_messages(&tx, "history.replace", channel, 0, &messages)
            .await?;
        Ok(tx.commit().await.map_err(failed)?)
    }

    async fn conversations(&self) -> Result<Vec<ConversationSummary>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT channel, COUNT(*) FROM history GROUP BY channel ORDER BY channel COLLATE \"C\"",
                &[],
            )
            .await
            .map_err(|err| self.failed("history.conversations", err))?;
        Ok(rows
            .iter()
            .map(|row| ConversationSummary {
                channel: row.get(0),
                messages: row.get::<_, i64>(1) as u64,
            })
            .collect())
    }
}
