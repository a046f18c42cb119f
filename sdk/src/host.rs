//! Typed access to the host's imports: logging, the taskboard and memory. A task's
//! [`TaskStatus`] and [`Priority`] are WIT enums that read and write their WIT names.
//!
//! Each call is checked against the call's grants by the host; a refusal comes back as
//! [`HostError::Denied`], which `?` turns into [`ToolError::Denied`](crate::ToolError).

pub use crate::bindings::capstan::plugin::memory::{MemoryItem, NewMemory};
pub use crate::bindings::capstan::plugin::tasks::{NewTask, Task, TaskFilter, TaskPatch};
pub use crate::bindings::capstan::plugin::types::HostError;
pub use crate::task_enums::{Priority, TaskStatus, UnknownName};

/// Writing to the host's log. Lines are tagged with the plugin and tool, and rate-limited.
pub mod log {
    use crate::bindings::capstan::plugin::log::{Level, write};

    /// Logs `message` at debug level.
    pub fn debug(message: &str) {
        write(Level::Debug, message);
    }

    /// Logs `message` at info level.
    pub fn info(message: &str) {
        write(Level::Info, message);
    }

    /// Logs `message` at warn level.
    pub fn warn(message: &str) {
        write(Level::Warn, message);
    }

    /// Logs `message` at error level.
    pub fn error(message: &str) {
        write(Level::Error, message);
    }
}

/// The taskboard. Needs `tasks.read`, `tasks.write` or `tasks.write-own`.
pub mod tasks {
    use super::{HostError, NewTask, Task, TaskFilter, TaskPatch};
    use crate::bindings::capstan::plugin::tasks as wit;

    /// Creates a task; the host records the caller as its creator.
    pub fn create(task: &NewTask) -> Result<Task, HostError> {
        wit::create(task)
    }

    /// Reads task `number`.
    pub fn get(number: u64) -> Result<Task, HostError> {
        wit::get(number)
    }

    /// Lists tasks matching `filter`.
    pub fn list(filter: &TaskFilter) -> Result<Vec<Task>, HostError> {
        wit::list(*filter)
    }

    /// Changes task `number`; with `tasks.write-own`, only the caller's own tasks.
    pub fn update(number: u64, patch: &TaskPatch) -> Result<Task, HostError> {
        wit::update(number, patch)
    }
}

/// Long-term memories and working memory. Needs `memory.read` or `memory.write`.
pub mod memory {
    use super::{HostError, MemoryItem, NewMemory};
    use crate::bindings::capstan::plugin::memory as wit;

    /// Saves a memory.
    pub fn save(item: &NewMemory) -> Result<MemoryItem, HostError> {
        wit::save(item)
    }

    /// The memories most relevant to `query`, best first.
    pub fn recall(query: &str, limit: u32) -> Result<Vec<MemoryItem>, HostError> {
        wit::recall(query, limit)
    }

    /// Deletes memory `id`.
    pub fn delete(id: &str) -> Result<(), HostError> {
        wit::delete(id)
    }

    /// Reads working-memory entry `key`.
    pub fn working_get(key: &str) -> Result<Option<String>, HostError> {
        wit::working_get(key)
    }

    /// Writes working-memory entry `key`, expiring after `ttl_seconds` if given.
    pub fn working_set(key: &str, value: &str, ttl_seconds: Option<u64>) -> Result<(), HostError> {
        wit::working_set(key, value, ttl_seconds)
    }
}
