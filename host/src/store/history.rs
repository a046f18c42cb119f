//! Conversation history per channel: an ordered list of messages (JSON) per channel.

use rusqlite::params;

use super::{Store, StoreError};

/// One stored message of a channel's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Its position, from 0.
    pub seq: u64,
    /// The message as JSON.
    pub message: String,
}

impl Store {
    /// Appends messages (JSON) to `channel`'s history, in one transaction.
    pub fn append_history(&self, channel: &str, messages: &[String]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let next: i64 = tx.query_row(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM history WHERE channel = ?1",
            [channel],
            |row| row.get(0),
        )?;
        for (i, message) in messages.iter().enumerate() {
            tx.execute(
                "INSERT INTO history (channel, seq, message) VALUES (?1, ?2, ?3)",
                params![channel, next + i as i64, message],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// `channel`'s whole history, in order.
    pub fn load_history(&self, channel: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached("SELECT seq, message FROM history WHERE channel = ?1 ORDER BY seq")?;
        let rows = stmt.query_map([channel], |row| {
            Ok(HistoryEntry {
                seq: row.get::<_, i64>(0)? as u64,
                message: row.get(1)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Replaces `channel`'s whole history (after compaction or a rollback), atomically.
    pub fn replace_history(&self, channel: &str, messages: &[String]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM history WHERE channel = ?1", [channel])?;
        for (i, message) in messages.iter().enumerate() {
            tx.execute(
                "INSERT INTO history (channel, seq, message) VALUES (?1, ?2, ?3)",
                params![channel, i as i64, message],
            )?;
        }
        tx.commit()?;
        Ok(())
    }
}
