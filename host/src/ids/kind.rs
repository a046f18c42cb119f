//! The kinds of process the host runs, each with its own profile.

use std::fmt;
use std::str::FromStr;

/// A kind of LLM process. Each kind has one profile that decides its tools and grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProcessKind {
    /// Talks to the user and delegates; host tools only.
    Channel,
    /// Thinks with the channel's context and returns a conclusion.
    Branch,
    /// Does one task with a fresh prompt.
    Worker,
    /// Summarizes history when the context fills.
    Compactor,
    /// The supervisor / admin chat.
    Cortex,
}

impl ProcessKind {
    /// Every kind, in the order listings use.
    pub const ALL: [ProcessKind; 5] = [
        ProcessKind::Channel,
        ProcessKind::Branch,
        ProcessKind::Worker,
        ProcessKind::Compactor,
        ProcessKind::Cortex,
    ];

    /// Whether a process of this kind is a conversation a person talks in (a channel, or
    /// the cortex's admin chat), named by the person rather than numbered.
    pub fn is_conversation(self) -> bool {
        matches!(self, ProcessKind::Channel | ProcessKind::Cortex)
    }

    /// The name used in config files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessKind::Channel => "channel",
            ProcessKind::Branch => "branch",
            ProcessKind::Worker => "worker",
            ProcessKind::Compactor => "compactor",
            ProcessKind::Cortex => "cortex",
        }
    }
}

impl fmt::Display for ProcessKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ProcessKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ProcessKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown process kind `{text}`; expected one of channel, branch, worker, \
                     compactor, cortex"
                )
            })
    }
}
