//! The host side of the plugin's imports: `log`, `tasks` and `memory`.
//!
//! Every function checks the call's capabilities first, so a tool that did not declare
//! (or was not granted) `tasks.*` or `memory.*` is refused with the capability named. Until
//! the store exists, `tasks` and `memory` then answer `denied` with "not available in this
//! host": never a trap, never a panic.

use capstan_caps::Capability;

use super::bindings::capstan::plugin::log::Level;
use super::bindings::capstan::plugin::memory::{MemoryItem, NewMemory};
use super::bindings::capstan::plugin::tasks::{NewTask, Task, TaskFilter, TaskPatch};
use super::bindings::capstan::plugin::types::HostError;
use super::bindings::capstan::plugin::{log, memory, tasks, types};
use super::limits::{LOG_LINE_BYTES, LOG_LINES_PER_CALL};
use super::sandbox::Sandbox;

impl types::Host for Sandbox {}

impl log::Host for Sandbox {
    fn write(&mut self, level: Level, message: String) {
        let scope = &mut self.scope;
        scope.log_lines += 1;
        if scope.log_lines > LOG_LINES_PER_CALL {
            if scope.log_lines == LOG_LINES_PER_CALL + 1 {
                tracing::warn!(
                    plugin = %scope.plugin,
                    tool = %scope.tool,
                    "plugin log limit of {LOG_LINES_PER_CALL} lines per call reached; dropping the rest"
                );
            }
            return;
        }
        let message = truncate(&message, LOG_LINE_BYTES);
        let (plugin, tool) = (&*scope.plugin, scope.tool.as_str());
        match level {
            Level::Trace => tracing::trace!(target: "plugin", plugin, tool, "{message}"),
            Level::Debug => tracing::debug!(target: "plugin", plugin, tool, "{message}"),
            Level::Info => tracing::info!(target: "plugin", plugin, tool, "{message}"),
            Level::Warn => tracing::warn!(target: "plugin", plugin, tool, "{message}"),
            Level::Error => tracing::error!(target: "plugin", plugin, tool, "{message}"),
        }
    }
}

/// The longest prefix of `text` within `max` bytes, on a character boundary.
pub(crate) fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl Sandbox {
    /// Refuses unless the call runs with one of `caps`; `what` names the import function.
    fn require(&self, what: &str, caps: &[Capability]) -> Result<(), HostError> {
        if self.scope.has_any(caps) {
            return Ok(());
        }
        let names: Vec<String> = caps.iter().map(ToString::to_string).collect();
        Err(HostError::Denied(format!(
            "{what} needs capability {}; tool `{}` does not run with it (declare it in the tool \
             and grant it to the caller)",
            names.join(" or "),
            self.scope.tool
        )))
    }
}

fn not_available(interface: &str) -> HostError {
    HostError::Denied(format!(
        "the {interface} store is not available in this host"
    ))
}

const TASKS_READ: &[Capability] = &[
    Capability::TasksRead,
    Capability::TasksWrite,
    Capability::TasksWriteOwn,
];
const TASKS_WRITE: &[Capability] = &[Capability::TasksWrite, Capability::TasksWriteOwn];
const MEMORY_READ: &[Capability] = &[Capability::MemoryRead];
const MEMORY_WRITE: &[Capability] = &[Capability::MemoryWrite];

impl tasks::Host for Sandbox {
    fn create(&mut self, _task: NewTask) -> Result<Task, HostError> {
        self.require("tasks.create", TASKS_WRITE)?;
        Err(not_available("tasks"))
    }

    fn get(&mut self, _number: u64) -> Result<Task, HostError> {
        self.require("tasks.get", TASKS_READ)?;
        Err(not_available("tasks"))
    }

    fn list(&mut self, _filter: TaskFilter) -> Result<Vec<Task>, HostError> {
        self.require("tasks.list", TASKS_READ)?;
        Err(not_available("tasks"))
    }

    fn update(&mut self, _number: u64, _patch: TaskPatch) -> Result<Task, HostError> {
        self.require("tasks.update", TASKS_WRITE)?;
        Err(not_available("tasks"))
    }
}

impl memory::Host for Sandbox {
    fn save(&mut self, _item: NewMemory) -> Result<MemoryItem, HostError> {
        self.require("memory.save", MEMORY_WRITE)?;
        Err(not_available("memory"))
    }

    fn recall(&mut self, _query: String, _limit: u32) -> Result<Vec<MemoryItem>, HostError> {
        self.require("memory.recall", MEMORY_READ)?;
        Err(not_available("memory"))
    }

    fn delete(&mut self, _id: String) -> Result<(), HostError> {
        self.require("memory.delete", MEMORY_WRITE)?;
        Err(not_available("memory"))
    }

    fn working_get(&mut self, _key: String) -> Result<Option<String>, HostError> {
        self.require("memory.working-get", MEMORY_READ)?;
        Err(not_available("memory"))
    }

    fn working_set(
        &mut self,
        _key: String,
        _value: String,
        _ttl_seconds: Option<u64>,
    ) -> Result<(), HostError> {
        self.require("memory.working-set", MEMORY_WRITE)?;
        Err(not_available("memory"))
    }
}
