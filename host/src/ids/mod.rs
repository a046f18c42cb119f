//! Typed identities: which process, who a tool call runs for, which session a prompt goes
//! to, and which tool call a result answers.
//!
//! A process is named by its kind and, for a conversation, the name the user gave it
//! (`channel:main`, `cortex:main`) or, for a branch, worker or compactor run, a number
//! drawn from the store's persisted counter (`worker:17`), so ids never repeat across runs
//! or across hosts sharing a database. Two kinds never share an id: the admin chat
//! `cortex:main` and the user's `channel:main` are different processes with different
//! histories and different sessions at the prompt gate.
//!
//! ```
//! use capstan_host::ids::ProcessId;
//! use capstan_host::policy::ProcessKind;
//!
//! let worker = ProcessId::numbered(ProcessKind::Worker, 17);
//! assert_eq!(worker.to_string(), "worker:17");
//! assert_eq!("worker:17".parse::<ProcessId>().unwrap(), worker);
//!
//! let chat = ProcessId::named(ProcessKind::Channel, "main");
//! let admin = ProcessId::named(ProcessKind::Cortex, "main");
//! assert_ne!(chat.session(), admin.session());
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize, Serializer};

mod caller;
mod kind;

pub use caller::{Caller, ClientLabel, ParseCallerError};
pub use kind::ProcessKind;

/// One process of the agent: its kind and its name within the kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId {
    kind: ProcessKind,
    name: String,
}

impl ProcessId {
    /// A conversation process (a channel or the cortex) called `name`.
    pub fn named(kind: ProcessKind, name: &str) -> Self {
        ProcessId {
            kind,
            name: name.to_owned(),
        }
    }

    /// The conversation `name` of `kind`, with `name` checked as one from outside the host
    /// (a URL, a request body): 1 to 64 ASCII letters, digits, `.`, `-` or `_`.
    pub fn conversation(kind: ProcessKind, name: &str) -> Result<Self, String> {
        let valid = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
        if !valid {
            return Err(format!(
                "`{}` is not a conversation name; use 1 to 64 ASCII letters, digits, '.', '-' \
                 or '_'",
                crate::text::truncate(name, 64).escape_debug()
            ));
        }
        if !kind.is_conversation() {
            return Err(format!("a {kind} is not a conversation"));
        }
        Ok(ProcessId::named(kind, name))
    }

    /// A process known by its number, e.g. `worker:17`.
    pub fn numbered(kind: ProcessKind, number: u64) -> Self {
        ProcessId {
            kind,
            name: number.to_string(),
        }
    }

    /// The user channel `name`.
    pub fn channel(name: &str) -> Self {
        ProcessId::named(ProcessKind::Channel, name)
    }

    /// Its kind.
    pub fn kind(&self) -> ProcessKind {
        self.kind
    }

    /// Its name within the kind: `main` of `channel:main`, `17` of `worker:17`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The session a prompt to this process goes to, at the gate and in the history.
    pub fn session(&self) -> SessionKey {
        SessionKey(self.to_string())
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

/// Why a text is not a process id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a process id; ids look like `worker:3` or `channel:main`")]
pub struct ParseProcessIdError {
    text: String,
}

impl FromStr for ProcessId {
    type Err = ParseProcessIdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || ParseProcessIdError {
            text: crate::text::truncate(text, 64).to_owned(),
        };
        // Every id's text reads back as that id, `channel:` (a name left empty by an
        // embedder) included: what a store keeps is always found again.
        let (kind, name) = text.split_once(':').ok_or_else(bad)?;
        let kind: ProcessKind = kind.parse().map_err(|_| bad())?;
        Ok(ProcessId::named(kind, name))
    }
}

/// The key of one conversation session: what the prompt gate reserves and what the
/// history is stored under. One per process; see [`ProcessId::session`].
///
/// ```
/// use capstan_host::ids::{ProcessId, SessionKey};
///
/// let key = ProcessId::channel("main").session();
/// assert_eq!(key.as_str(), "channel:main");
/// assert_eq!("channel:main".parse::<SessionKey>().unwrap(), key);
/// assert_eq!(key.process(), ProcessId::channel("main"));
/// assert!("main".parse::<SessionKey>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionKey(String);

impl SessionKey {
    /// The key as text, e.g. `channel:main`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The process whose session this is.
    pub fn process(&self) -> ProcessId {
        self.0
            .parse()
            .expect("a session key is made from a process id")
    }
}

impl FromStr for SessionKey {
    type Err = ParseProcessIdError;

    /// The session of the process `text` names, e.g. `channel:main`, as a store keeps it.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.parse::<ProcessId>().map(|id| id.session())
    }
}

impl Serialize for SessionKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id a model gave one tool call; the result message carries it back. Serialized as
/// the bare string, as the Chat Completions shape has it.
///
/// ```
/// use capstan_host::ids::ToolCallId;
///
/// let id = ToolCallId::from("call_7");
/// assert_eq!(id.as_str(), "call_7");
/// assert_eq!(serde_json::to_string(&id)?, "\"call_7\"");
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ToolCallId(String);

impl ToolCallId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for ToolCallId {
    fn from(id: String) -> Self {
        ToolCallId(id)
    }
}

impl From<&str> for ToolCallId {
    fn from(id: &str) -> Self {
        ToolCallId(id.to_owned())
    }
}

impl fmt::Display for ToolCallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client's idempotency key for a message (HTTP `Idempotency-Key`, the API's
/// `idempotency_key`): a message sent again with the key of one its conversation already
/// took is not taken again; the answer it got is given again. Kept with the message in
/// the conversation's history, so it holds across restarts and hosts. 1 to 255 visible
/// ASCII characters.
///
/// ```
/// use capstan_host::ids::MessageKey;
///
/// let key: MessageKey = "order-7f3a".parse().unwrap();
/// assert_eq!(key.as_str(), "order-7f3a");
/// assert!("".parse::<MessageKey>().is_err());
/// assert!("two words".parse::<MessageKey>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MessageKey(String);

impl MessageKey {
    /// The most characters a key may have.
    pub const MAX_LEN: usize = 255;

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for MessageKey {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() || text.len() > Self::MAX_LEN {
            return Err(format!(
                "an idempotency key has 1 to {} characters, not {}",
                Self::MAX_LEN,
                text.len()
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "an idempotency key is visible ASCII characters (no spaces or control \
                 characters), e.g. a UUID"
                    .into(),
            );
        }
        Ok(MessageKey(text.to_owned()))
    }
}

impl TryFrom<String> for MessageKey {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl From<MessageKey> for String {
    fn from(key: MessageKey) -> String {
        key.0
    }
}

impl fmt::Display for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

crate::text::serde_as_text!(ProcessId);

/// Ids from text, for tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Caller, ProcessId, SessionKey};

    /// The caller `text` names.
    pub(crate) fn by(text: &str) -> Caller {
        text.parse().unwrap()
    }

    /// The process `text` names.
    pub(crate) fn pid(text: &str) -> ProcessId {
        text.parse().unwrap()
    }

    /// The session of `text`: a process id, or a channel's name.
    pub(crate) fn key(text: &str) -> SessionKey {
        text.parse()
            .unwrap_or_else(|_| ProcessId::channel(text).session())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_kinds_never_collide() {
        for kind in ProcessKind::ALL {
            let id = ProcessId::named(kind, "main");
            assert_eq!(id.to_string().parse::<ProcessId>().unwrap(), id);
        }
        let sessions: std::collections::HashSet<_> = ProcessKind::ALL
            .iter()
            .map(|kind| ProcessId::named(*kind, "main").session())
            .collect();
        assert_eq!(sessions.len(), ProcessKind::ALL.len());
        for bad in ["", "worker", "robot:1", ":1", "mcp:worker:3"] {
            assert!(bad.parse::<ProcessId>().is_err(), "{bad}");
        }
        for odd in ["", "a:b", " ", "\u{1b}[2J"] {
            let id = ProcessId::named(ProcessKind::Channel, odd);
            assert_eq!(id.to_string().parse::<ProcessId>().unwrap(), id, "{odd:?}");
            assert_eq!(id.session().process(), id);
        }
        let json = serde_json::to_string(&ProcessId::numbered(ProcessKind::Branch, 4)).unwrap();
        assert_eq!(json, "\"branch:4\"");
    }
}
