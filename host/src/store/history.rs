//! Conversation history per channel: an ordered list of messages (JSON) per channel.
//!
//! Writes take the write lock before reading the next position (immediate transactions,
//! retried while busy), so runs appending to one channel at once lose no message. A stored
//! message that cannot be read makes the whole load fail with its channel and position:
//! a history silently returned short would be saved back short.

use rusqlite::params;
use rusqlite::types::ValueRef;
use serde::de::DeserializeOwned;

use super::rows::{parsed, readable};
use super::{Store, StoreError};
use crate::services::{ConversationSummary, HistoryEntry};

impl Store {
    /// Appends messages (JSON) to `channel`'s history, in one transaction.
    pub fn append_history(&self, channel: &str, messages: &[String]) -> Result<(), StoreError> {
        self.write(|tx| append_in(tx, channel, messages))
    }

    /// Appends each `(channel, messages)` in turn, all in one transaction.
    pub fn append_histories(&self, appends: &[(String, Vec<String>)]) -> Result<(), StoreError> {
        self.write(|tx| append_all(tx, appends))
    }

    /// Every conversation with a stored message, sorted by name, with its message count.
    pub fn conversations(&self) -> Result<Vec<ConversationSummary>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT channel, COUNT(*) FROM history GROUP BY channel ORDER BY channel",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok(ConversationSummary {
                channel: parsed(row, 0)?,
                messages: row.get::<_, i64>(1)? as u64,
            })
        })?;
        Ok(readable("a conversation", rows)?)
    }

    /// `channel`'s whole history, in order. Fails with
    /// [`StoreError::UnreadableHistory`] if any stored message is not JSON text.
    pub fn load_history(&self, channel: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached("SELECT seq, message FROM history WHERE channel = ?1 ORDER BY seq")?;
        let mut rows = stmt.query([channel])?;
        let mut entries = Vec::new();
        while let Some(row) = rows.next()? {
            let seq = row.get::<_, i64>(0)? as u64;
            let unreadable = |reason: String| StoreError::UnreadableHistory {
                path: self.path.clone(),
                channel: channel.to_owned(),
                seq,
                reason,
            };
            let message = match row.get_ref(1)? {
                ValueRef::Text(bytes) => std::str::from_utf8(bytes)
                    .map_err(|err| unreadable(format!("not UTF-8 text: {err}")))?
                    .to_owned(),
                other => {
                    return Err(unreadable(format!(
                        "stored as {}, not text",
                        other.data_type()
                    )));
                }
            };
            serde_json::from_str::<serde::de::IgnoredAny>(&message)
                .map_err(|err| unreadable(format!("not valid JSON: {err}")))?;
            entries.push(HistoryEntry { seq, message });
        }
        Ok(entries)
    }

    /// `channel`'s whole history, each message parsed as a `T`. Fails with
    /// [`StoreError::UnreadableHistory`], naming the first message that does not parse,
    /// rather than return the history without it.
    ///
    /// ```
    /// use capstan_host::store::{Store, StoreError};
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path()).unwrap();
    /// store.append_history("main", &["1".into(), r#""two""#.into()]).unwrap();
    /// let err = store.load_history_as::<u32>("main").unwrap_err();
    /// assert!(matches!(err, StoreError::UnreadableHistory { seq: 1, .. }));
    /// ```
    pub fn load_history_as<T: DeserializeOwned>(
        &self,
        channel: &str,
    ) -> Result<Vec<T>, StoreError> {
        self.load_history(channel)?
            .into_iter()
            .map(|entry| {
                serde_json::from_str(&entry.message).map_err(|err| StoreError::UnreadableHistory {
                    path: self.path.clone(),
                    channel: channel.to_owned(),
                    seq: entry.seq,
                    reason: format!("not a valid message: {err}"),
                })
            })
            .collect()
    }

    /// Replaces `channel`'s whole history (after compaction or a rollback), atomically. It
    /// waits for a database another process holds busy for one busy timeout at most (the
    /// conversation writes it again later).
    pub fn replace_history(&self, channel: &str, messages: &[String]) -> Result<(), StoreError> {
        self.write_within(super::retry::HISTORY_RETRY_FOR, |tx| {
            tx.execute("DELETE FROM history WHERE channel = ?1", [channel])?;
            let mut insert = tx.prepare_cached(
                "INSERT INTO history (channel, seq, message) VALUES (?1, ?2, ?3)",
            )?;
            for (i, message) in messages.iter().enumerate() {
                insert.execute(params![channel, i as i64, message])?;
            }
            Ok(())
        })
    }
}

/// Appends each `(channel, messages)` in turn inside `tx`.
pub(super) fn append_all(
    tx: &rusqlite::Transaction<'_>,
    appends: &[(String, Vec<String>)],
) -> Result<(), StoreError> {
    appends
        .iter()
        .try_for_each(|(channel, messages)| append_in(tx, channel, messages))
}

/// Appends `messages` to `channel`'s history inside `tx`, after what it holds.
fn append_in(
    tx: &rusqlite::Transaction<'_>,
    channel: &str,
    messages: &[String],
) -> Result<(), StoreError> {
    let next: i64 = tx
        .prepare_cached("SELECT COALESCE(MAX(seq) + 1, 0) FROM history WHERE channel = ?1")?
        .query_row([channel], |row| row.get(0))?;
    let mut insert =
        tx.prepare_cached("INSERT INTO history (channel, seq, message) VALUES (?1, ?2, ?3)")?;
    for (i, message) in messages.iter().enumerate() {
        insert.execute(params![channel, next + i as i64, message])?;
    }
    Ok(())
}
