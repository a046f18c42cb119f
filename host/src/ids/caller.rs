//! Who a tool call runs for: a process of the agent, or a client at one of the host's doors.

use std::fmt;
use std::str::FromStr;

use super::ProcessId;

/// Who a tool call runs for, and so who a task or memory it makes is recorded as made by:
/// a process (`worker:3`), or a client at a door (`mcp:ci@alice`, `cli`).
///
/// A client's label starts with its door (`mcp`, `cli`, `host`), never a process kind, so
/// the text of a caller reads back as the same caller.
///
/// ```
/// use capstan_host::ids::{Caller, ProcessId};
/// use capstan_host::policy::ProcessKind;
///
/// let worker = Caller::from(ProcessId::numbered(ProcessKind::Worker, 3));
/// assert_eq!(worker.to_string(), "worker:3");
/// assert_eq!("worker:3".parse::<Caller>().unwrap(), worker);
/// assert_eq!(worker.process().map(ProcessId::kind), Some(ProcessKind::Worker));
///
/// let client = Caller::client("mcp", Some("ci"));
/// assert_eq!(client.to_string(), "mcp:ci");
/// assert_eq!(client.process(), None);
/// assert_eq!("mcp:ci".parse::<Caller>().unwrap(), client);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Caller {
    /// A process of the agent.
    Process(ProcessId),
    /// A client at a door, by its label (`mcp:ci@alice`, `cli`).
    Client(ClientLabel),
}

/// A client's label: its door, then what the door knows of it (`mcp:ci@alice`). Made only
/// by [`Caller::client`] and by reading a caller back, so it never reads as a process.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientLabel(String);

impl ClientLabel {
    /// The label as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Caller {
    /// A client at `door` (`mcp`, `cli`), named `name` when the door knows one.
    ///
    /// # Panics
    ///
    /// If `door` is empty, holds a `:`, or is a process kind: its callers would read back
    /// as processes. Doors are the host's own names, never a client's.
    pub fn client(door: &str, name: Option<&str>) -> Self {
        assert!(
            !door.is_empty() && !door.contains(':') && door.parse::<super::ProcessKind>().is_err(),
            "`{door}` cannot name a door: it is empty, holds a colon, or is a process kind"
        );
        let label = match name {
            Some(name) => format!("{door}:{name}"),
            None => door.to_owned(),
        };
        Caller::Client(ClientLabel(label))
    }

    /// The process, if the caller is one.
    pub fn process(&self) -> Option<&ProcessId> {
        match self {
            Caller::Process(id) => Some(id),
            Caller::Client(_) => None,
        }
    }
}

impl From<ProcessId> for Caller {
    fn from(id: ProcessId) -> Self {
        Caller::Process(id)
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Process(id) => id.fmt(f),
            Caller::Client(label) => f.write_str(&label.0),
        }
    }
}

/// Why a text is not a caller: it is empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a caller is not empty; callers look like `worker:3` or `mcp:ci`")]
pub struct ParseCallerError;

impl FromStr for Caller {
    type Err = ParseCallerError;

    /// A process id reads as that process; any other text as a client.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err(ParseCallerError);
        }
        Ok(match text.parse::<ProcessId>() {
            Ok(id) => Caller::Process(id),
            Err(_) => Caller::Client(ClientLabel(text.to_owned())),
        })
    }
}

crate::text::serde_as_text!(Caller);
