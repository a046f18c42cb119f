//! Long-term memories with full-text recall, and working memory with expiry.
//!
//! What every backend applies (content required, importance in range, which words of a
//! query count) lives here with the types.

use async_trait::async_trait;
use serde::Serialize;

use super::ServiceError;
use crate::flow::Label;
use crate::ids::Caller;

/// Long-term memories and the working memory every process and plugin shares.
///
/// ```
/// use capstan_host::flow::Label;
/// use capstan_host::ids::{Caller, ProcessId, ProcessKind};
/// use capstan_host::services::{NewMemory, Services};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let note = NewMemory {
///     kind: "fact".into(),
///     content: "The release ships on Friday".into(),
///     importance: None,
///     // What its writer had read: a person's words.
///     label: Label::trusted(),
/// };
/// let who = Caller::from(ProcessId::numbered(ProcessKind::Branch, 1));
/// services.memory.save(&who, note).await.unwrap();
/// let found = services.memory.recall("when is the release?", 5).await.unwrap();
/// assert_eq!(found[0].content, "The release ships on Friday");
/// # });
/// ```
#[async_trait]
pub trait Memory: Send + Sync {
    /// Saves a memory from `source`; refuses empty content and importance out of 0..=1
    /// ([`NewMemory::checked`]).
    async fn save(&self, source: &Caller, memory: NewMemory) -> Result<MemoryItem, ServiceError>;

    /// At most `limit` (clamped to 1..=100) memories matching any of `query`'s
    /// [`recall_words`], best first: text relevance weighted by importance.
    async fn recall(&self, query: &str, limit: u32) -> Result<Vec<MemoryItem>, ServiceError>;

    /// Deletes memory `id`, or [`ServiceError::NotFound`].
    async fn delete(&self, id: u64) -> Result<(), ServiceError>;

    /// WorkingEntry-memory entry `key`, if present and not expired.
    async fn working_get(&self, key: &str) -> Result<Option<WorkingEntry>, ServiceError>;

    /// Writes working-memory entry `key` (not empty) as `value`, its writer having read
    /// `label`, expiring after `ttl_seconds` if given.
    async fn working_set(
        &self,
        key: &str,
        value: &str,
        label: &Label,
        ttl_seconds: Option<u64>,
    ) -> Result<(), ServiceError>;

    /// The live working-memory keys starting with `prefix`, sorted.
    async fn working_keys(&self, prefix: &str) -> Result<Vec<String>, ServiceError>;
}

/// A stored memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryItem {
    /// Its id.
    pub id: u64,
    /// e.g. `fact`, `decision`, `preference`, `observation`.
    pub kind: String,
    /// The text.
    pub content: String,
    /// 0.0 to 1.0.
    pub importance: f32,
    /// Who saved it, e.g. `worker:3`.
    pub source: Caller,
    /// Unix seconds.
    pub created_at: i64,
    /// What its writer had read.
    pub label: Label,
}

/// A working-memory entry.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkingEntry {
    /// What it holds.
    pub value: String,
    /// What its writer had read. An entry written before labels were kept is
    /// [`Label::unknown`].
    pub label: Label,
}

/// A memory to save.
#[derive(Debug, Clone)]
pub struct NewMemory {
    /// e.g. `fact`.
    pub kind: String,
    /// The text.
    pub content: String,
    /// 0.0 to 1.0; default 0.5.
    pub importance: Option<f32>,
    /// What its writer had read (trusted: a person's memory).
    pub label: Label,
}

/// The importance of a memory saved without one.
pub const DEFAULT_IMPORTANCE: f32 = 0.5;

/// The most memories one recall returns.
pub const RECALL_MAX: u32 = 100;

impl NewMemory {
    /// The memory as [`Memory::save`] stores it: with content, its kind trimmed (`fact`
    /// when blank) and its importance ([`DEFAULT_IMPORTANCE`] when none) in range.
    pub fn checked(mut self) -> Result<Self, ServiceError> {
        if self.content.trim().is_empty() {
            return Err(ServiceError::Invalid("a memory needs content".into()));
        }
        let importance = self.importance.unwrap_or(DEFAULT_IMPORTANCE);
        if !(0.0..=1.0).contains(&importance) {
            return Err(ServiceError::Invalid(format!(
                "importance must be between 0.0 and 1.0, got {importance}"
            )));
        }
        self.kind = match self.kind.trim() {
            "" => "fact".to_owned(),
            kind => kind.to_owned(),
        };
        self.importance = Some(importance);
        Ok(self)
    }

    /// Its importance, [`DEFAULT_IMPORTANCE`] when none was given.
    pub fn importance(&self) -> f32 {
        self.importance.unwrap_or(DEFAULT_IMPORTANCE)
    }
}

/// When a working-memory entry written at `now` with `ttl_seconds` expires: never without
/// a TTL, and a TTL too long to count in seconds since the epoch is as good as never.
pub fn expires_at(now: i64, ttl_seconds: Option<u64>) -> Option<i64> {
    ttl_seconds.map(|ttl| i64::try_from(ttl).map_or(i64::MAX, |ttl| now.saturating_add(ttl)))
}

/// Refuses an empty working-memory key.
pub fn check_working_key(key: &str) -> Result<(), ServiceError> {
    if key.is_empty() {
        return Err(ServiceError::Invalid(
            "a working-memory key must not be empty".into(),
        ));
    }
    Ok(())
}

/// Words too common to say what a query is about.
const STOP_WORDS: &[&str] = &[
    "a", "an", "and", "are", "at", "be", "did", "do", "does", "for", "how", "i", "in", "is", "it",
    "me", "of", "on", "or", "that", "the", "this", "to", "was", "we", "what", "when", "where",
    "which", "who", "why", "with", "you",
];

/// The words a memory is found by: the runs of letters and digits of its kind and content,
/// each lowercased (split first: lowercasing can turn one letter into a letter and a mark,
/// as "İ" does). [`recall_terms`] are matched against these.
///
/// ```
/// use capstan_host::services::memory_words;
///
/// assert_eq!(memory_words("fact", "See CHANGES.md"), ["fact", "see", "changes", "md"]);
/// ```
pub fn memory_words(kind: &str, content: &str) -> Vec<String> {
    [kind, content]
        .into_iter()
        .flat_map(|text| text.split(|c: char| !c.is_alphanumeric()))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// The [`recall_words`] of `query`, lowercased as [`memory_words`] are.
pub fn recall_terms(query: &str) -> Vec<String> {
    recall_words(query)
        .iter()
        .map(|w| w.to_lowercase())
        .collect()
}

/// The words of `query` a recall looks for: all but stop words (all of them if that is
/// all there is). Words are runs of letters and digits, so no input is query syntax.
pub fn recall_words(query: &str) -> Vec<&str> {
    let words: Vec<&str> = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let meaningful: Vec<&str> = words
        .iter()
        .copied()
        .filter(|w| !STOP_WORDS.contains(&w.to_lowercase().as_str()))
        .collect();
    if meaningful.is_empty() {
        words
    } else {
        meaningful
    }
}
