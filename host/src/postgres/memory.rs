//! Long-term memory, recalled by the words [`memory_words`] finds in each memory (an
//! array with a GIN index, so every backend matches the same words), and working memory
//! with expiry.

use async_trait::async_trait;

use super::prepared::Prepared;
use super::rows::{label, label_text, parsed, readable};
use super::sessions::live_run;
use super::{Postgres, now};
use crate::flow::Label;
use crate::ids::Caller;
use crate::services::Operation;
use crate::services::{
    Memory, MemoryItem, NewMemory, RECALL_MAX, ServiceError, WorkingEntry, expires_at,
    memory_words, recall_terms,
};

#[async_trait]
impl Memory for Postgres {
    async fn save(&self, source: &Caller, memory: NewMemory) -> Result<MemoryItem, ServiceError> {
        let (kind, importance) = (memory.kind.as_str(), memory.importance());
        let at = now();
        let client = self.client().await?;
        let row = client
            .query_one_cached(
                "INSERT INTO memories (kind, content, importance, source, created_at, words, label)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
                &[
                    &kind,
                    &memory.content,
                    &importance,
                    &source.to_string(),
                    &at,
                    &memory_words(kind, &memory.content),
                    &label_text(&memory.label),
                ],
            )
            .await
            .map_err(|err| self.failed(Operation::MemorySave, err))?;
        Ok(MemoryItem {
            id: row.get::<_, i64>(0) as u64,
            kind: kind.to_owned(),
            content: memory.content.clone(),
            importance,
            source: source.clone(),
            created_at: at,
            label: memory.label.clone(),
        })
    }

    async fn recall(&self, query: &str, limit: u32) -> Result<Vec<MemoryItem>, ServiceError> {
        let terms = recall_terms(query);
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let limit = i64::from(limit.clamp(1, RECALL_MAX));
        // Ranked by the share of the memory's words that match, weighted by importance.
        let rows = client
            .query_cached(
                "SELECT id, kind, content, importance, source, created_at, label
                 FROM memories
                 WHERE words && $1
                 ORDER BY (SELECT count(*) FROM unnest(words) AS w WHERE w = ANY($1))::REAL
                              / (1 + cardinality(words)) * (0.5 + importance) DESC, id
                 LIMIT $2",
                &[&terms, &limit],
            )
            .await
            .map_err(|err| self.failed(Operation::MemoryRecall, err))?;
        Ok(readable("a memory", &rows, |row| {
            Ok(MemoryItem {
                id: row.get::<_, i64>(0) as u64,
                kind: row.get(1),
                content: row.get(2),
                importance: row.get(3),
                source: parsed(row, 4)?,
                created_at: row.get(5),
                label: label(row, 6),
            })
        }))
    }

    async fn delete(&self, id: u64) -> Result<(), ServiceError> {
        let client = self.client().await?;
        let n = client
            .execute_cached("DELETE FROM memories WHERE id = $1", &[&(id as i64)])
            .await
            .map_err(|err| self.failed(Operation::MemoryDelete, err))?;
        if n == 0 {
            return Err(ServiceError::NotFound(format!(
                "memory {id} does not exist"
            )));
        }
        Ok(())
    }

    async fn working_get(&self, key: &str) -> Result<Option<WorkingEntry>, ServiceError> {
        let client = self.client().await?;
        let row = client
            .query_opt_cached(
                "SELECT value, label FROM working_memory
                 WHERE key = $1 AND (expires_at IS NULL OR expires_at > $2)",
                &[&key, &now()],
            )
            .await
            .map_err(|err| self.failed(Operation::MemoryWorkingGet, err))?;
        Ok(row.map(|row| WorkingEntry {
            value: row.get(0),
            label: label(&row, 1),
        }))
    }

    async fn working_set(
        &self,
        key: &str,
        value: &str,
        label: &Label,
        ttl_seconds: Option<u64>,
    ) -> Result<(), ServiceError> {
        let at = now();
        let expires = expires_at(at, ttl_seconds);
        let label = label_text(label);
        let client = self.client().await?;
        // Fenced like tasks: late reports folded back by a host whose run is over land
        // nothing.
        let sql = format!(
            "INSERT INTO working_memory (key, value, expires_at, updated_at, label)
             SELECT $1, $2, $3, $4, $5 WHERE {}
             ON CONFLICT (key) DO UPDATE
                 SET value = $2, expires_at = $3, updated_at = $4, label = $5",
            live_run(6)
        );
        let written = client
            .execute_cached(
                &sql,
                &[&key, &value, &expires, &at, &label, &self.writer_run()],
            )
            .await
            .map_err(|err| self.failed(Operation::MemoryWorkingSet, err))?;
        if written == 0 {
            return Err(self.dropped(&format!("working memory `{key}`")));
        }
        Ok(())
    }

    async fn working_keys(&self, prefix: &str) -> Result<Vec<String>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query_cached(
                "SELECT key FROM working_memory
                 WHERE left(key, char_length($1)) = $1
                   AND (expires_at IS NULL OR expires_at > $2)
                 ORDER BY key COLLATE \"C\"",
                &[&prefix, &now()],
            )
            .await
            .map_err(|err| self.failed(Operation::MemoryWorkingKeys, err))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}
