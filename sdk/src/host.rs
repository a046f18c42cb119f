//! Typed access to the host's imports: logging, the taskboard, memory and secrets. A task's
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

/// Secrets the host holds for the call: `secret:NAME` grants them. A tool never sees a
/// secret's value: the host injects it into outgoing requests to the hosts it is bound to,
/// and signs with it here. A secret the call is not granted does not exist as far as the
/// tool can tell.
pub mod secrets {
    use super::HostError;
    use crate::bindings::capstan::plugin::secrets as wit;

    /// The length of an HMAC-SHA256, in bytes.
    pub const HMAC_SHA256_LEN: usize = 32;

    /// Whether secret `name` is granted to this call and has a value.
    ///
    /// ```no_run
    /// use capstan_sdk::host::secrets;
    ///
    /// if !secrets::exists("GITHUB_TOKEN") {
    ///     // Say what is missing instead of sending a request that will be refused.
    /// }
    /// ```
    pub fn exists(name: &str) -> bool {
        wit::exists(name)
    }

    /// The HMAC-SHA256 of `data` keyed with secret `name`, e.g. to sign a webhook payload.
    /// [`HostError::Denied`] when the call is not granted the secret.
    ///
    /// ```no_run
    /// use capstan_sdk::host::secrets;
    ///
    /// # fn sign() -> Result<(), capstan_sdk::ToolError> {
    /// let mac = secrets::hmac_sha256("WEBHOOK_KEY", b"{\"event\":\"push\"}")?;
    /// let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
    /// assert_eq!(hex.len(), 64);
    /// # Ok(())
    /// # }
    /// ```
    pub fn hmac_sha256(name: &str, data: &[u8]) -> Result<[u8; HMAC_SHA256_LEN], HostError> {
        let mac = wit::hmac_sha256(name, data)?;
        <[u8; HMAC_SHA256_LEN]>::try_from(mac.as_slice()).map_err(|_| {
            HostError::Failed(format!(
                "the host's HMAC-SHA256 of secret `{name}` has {} bytes, not {HMAC_SHA256_LEN}",
                mac.len()
            ))
        })
    }
}
