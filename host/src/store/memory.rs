//! Long-term memories with FTS5 recall, and working memory with expiry, in SQLite. The
//! types and the rules are the services' (`services::memory`).

use rusqlite::{OptionalExtension, params};

use super::rows::{label, label_text, parsed, readable};
use super::{Store, StoreError, now};
use crate::flow::Label;
use crate::ids::Caller;
use crate::services::{MemoryItem, NewMemory, RECALL_MAX, WorkingEntry, expires_at, recall_words};

impl Store {
    /// Saves a memory from `source`.
    pub(crate) fn save_memory(
        &self,
        source: &Caller,
        memory: &NewMemory,
    ) -> Result<MemoryItem, StoreError> {
        let (kind, importance) = (&memory.kind, memory.importance());
        let at = now();
        // The insert and its FTS trigger, and the row id read back, in one transaction.
        let id = self.write(|tx| {
            tx.execute(
                "INSERT INTO memories (kind, content, importance, source, created_at, label)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    kind,
                    memory.content,
                    importance,
                    source.to_string(),
                    at,
                    label_text(&memory.label)
                ],
            )?;
            Ok(tx.last_insert_rowid() as u64)
        })?;
        Ok(MemoryItem {
            id,
            kind: kind.clone(),
            content: memory.content.clone(),
            importance,
            source: source.clone(),
            created_at: at,
            label: memory.label.clone(),
        })
    }

    /// The memories matching `query` (full-text, any of its words), best first: text
    /// relevance weighted by importance.
    pub fn recall(&self, query: &str, limit: u32) -> Result<Vec<MemoryItem>, StoreError> {
        let Some(fts_query) = fts_any_word(query) else {
            return Ok(Vec::new());
        };
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT m.id, m.kind, m.content, m.importance, m.source, m.created_at, m.label
             FROM memories_fts f JOIN memories m ON m.id = f.rowid
             WHERE memories_fts MATCH ?1
             ORDER BY bm25(memories_fts) * (0.5 + m.importance) LIMIT ?2",
        )?;
        let rows = stmt.query_map(params![fts_query, limit.clamp(1, RECALL_MAX)], |row| {
            Ok(MemoryItem {
                id: row.get::<_, i64>(0)? as u64,
                kind: row.get(1)?,
                content: row.get(2)?,
                importance: row.get(3)?,
                source: parsed(row, 4)?,
                created_at: row.get(5)?,
                label: label(row, 6)?,
            })
        })?;
        Ok(readable("a memory", rows)?)
    }

    /// Deletes memory `id`.
    pub fn delete_memory(&self, id: u64) -> Result<(), StoreError> {
        let n =
            self.write(|tx| Ok(tx.execute("DELETE FROM memories WHERE id = ?1", [id as i64])?))?;
        if n == 0 {
            return Err(StoreError::NotFound(format!("memory {id} does not exist")));
        }
        Ok(())
    }

    /// Reads working-memory entry `key`, if present and not expired.
    pub fn working_get(&self, key: &str) -> Result<Option<WorkingEntry>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT value, label FROM working_memory
                 WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)",
                params![key, now()],
                |row| {
                    Ok(WorkingEntry {
                        value: row.get(0)?,
                        label: label(row, 1)?,
                    })
                },
            )
            .optional()?)
    }

    /// Writes working-memory entry `key`, its writer having read `label`, expiring after `ttl_seconds` if given.
    pub(crate) fn working_set(
        &self,
        key: &str,
        value: &str,
        label: &Label,
        ttl_seconds: Option<u64>,
    ) -> Result<(), StoreError> {
        let at = now();
        let expires = expires_at(at, ttl_seconds);
        let label = label_text(label);
        self.write(|tx| {
            tx.execute(
                "INSERT INTO working_memory (key, value, expires_at, updated_at, label)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(key) DO UPDATE
                     SET value = ?2, expires_at = ?3, updated_at = ?4, label = ?5",
                params![key, value, expires, at, label],
            )?;
            Ok(())
        })
    }

    /// The live working-memory keys starting with `prefix`, sorted.
    pub fn working_keys(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT key FROM working_memory
             WHERE substr(key, 1, length(?1)) = ?1 AND (expires_at IS NULL OR expires_at > ?2)
             ORDER BY key",
        )?;
        let rows = stmt.query_map(params![prefix, now()], |row| row.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// An FTS5 query matching any of `text`'s [`recall_words`], each quoted.
fn fts_any_word(text: &str) -> Option<String> {
    let quoted: Vec<String> = recall_words(text)
        .iter()
        .map(|w| format!("\"{w}\""))
        .collect();
    (!quoted.is_empty()).then(|| quoted.join(" OR "))
}
