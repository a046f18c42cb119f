//! Conversation history: an ordered list of messages (JSON) per channel.

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use super::ServiceError;
use crate::ids::SessionKey;

/// Where each conversation's messages are kept between turns and runs.
///
/// ```
/// use capstan_host::services::Services;
/// use capstan_host::ids::ProcessId;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let main = ProcessId::channel("main").session();
/// services.history.append(&main, vec!["1".into(), "2".into()]).await.unwrap();
/// let numbers: Vec<u32> = services.history.load_as(&main).await.unwrap();
/// assert_eq!(numbers, [1, 2]);
/// # });
/// ```
#[async_trait]
pub trait History: Send + Sync {
    /// Where the history is kept, as errors name it (e.g. the database file).
    fn location(&self) -> String;

    /// `channel`'s whole history, in order. Fails with [`ServiceError::UnreadableHistory`]
    /// if any stored message is not JSON text, rather than return it short.
    async fn load(&self, channel: &SessionKey) -> Result<Vec<HistoryEntry>, ServiceError>;

    /// Appends `messages` (JSON) to `channel`'s history, all or none. Appends to one
    /// channel from several hosts at once lose no message.
    async fn append(&self, channel: &SessionKey, messages: Vec<String>)
    -> Result<(), ServiceError>;

    /// Replaces `channel`'s whole history (after compaction or a rollback), all or none.
    async fn replace(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError>;

    /// Every conversation with a stored message, sorted by name, with how many it holds.
    async fn conversations(&self) -> Result<Vec<ConversationSummary>, ServiceError>;
}

impl dyn History {
    /// `channel`'s whole history, each message parsed as a `T`. Fails with
    /// [`ServiceError::UnreadableHistory`], naming the first message that does not parse,
    /// rather than return the history without it.
    pub async fn load_as<T: DeserializeOwned>(
        &self,
        channel: &SessionKey,
    ) -> Result<Vec<T>, ServiceError> {
        self.load(channel)
            .await?
            .into_iter()
            .map(|entry| {
                serde_json::from_str(&entry.message).map_err(|err| {
                    ServiceError::UnreadableHistory {
                        location: self.location(),
                        channel: channel.to_string(),
                        seq: entry.seq,
                        reason: format!("not a valid message: {err}"),
                    }
                })
            })
            .collect()
    }
}

/// A conversation the history holds messages of.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConversationSummary {
    /// Its session key, e.g. `channel:main`.
    pub channel: SessionKey,
    /// Messages stored.
    pub messages: u64,
}

/// One stored message of a channel's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// Its position, from 0.
    pub seq: u64,
    /// The message as JSON.
    pub message: String,
}
