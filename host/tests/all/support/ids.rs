//! Ids from text, as the tests write them.

use capstan_host::ids::{Caller, ProcessId, SessionKey};

/// The caller `text` names, e.g. `worker:1` or `mcp:ci`.
pub fn by(text: &str) -> Caller {
    text.parse().unwrap()
}

/// The process `text` names, e.g. `worker:1`.
pub fn pid(text: &str) -> ProcessId {
    text.parse().unwrap()
}

/// The session of `text`: a process id, or a channel's name.
pub fn key(text: &str) -> SessionKey {
    text.parse()
        .unwrap_or_else(|_| ProcessId::channel(text).session())
}
