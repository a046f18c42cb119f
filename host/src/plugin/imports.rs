//! The host side of the plugin's imports: `log`, `tasks` and `memory`.
//!
//! Every function checks the call's capabilities first, so a tool that did not declare
//! (or was not granted) `tasks.*` or `memory.*` is refused with the capability named. Then
//! the host's [`Store`](crate::store::Store) answers; a host without one answers `denied`
//! with "not available in this host". Never a trap, never a panic.
//!
//! Scope: `tasks.write` updates any task; `tasks.write-own` creates tasks and updates only
//! those the caller created or is assigned, and refuses others naming the task.
//!
//! The store work runs on a blocking thread ([`on_store`]): SQLite may wait for a lock, and
//! a guest waiting in an import must stay abandonable at its deadline. An abandoned call's
//! store work still finishes on its thread; the guest never sees the answer.
//!
//! Log lines are put on one line with their control characters escaped before they reach
//! tracing, so a plugin cannot forge a log line or send terminal escapes.

use std::sync::Arc;

use capstan_caps::Capability;

use super::bindings::capstan::plugin::log::Level;
use super::bindings::capstan::plugin::memory::{MemoryItem, NewMemory};
use super::bindings::capstan::plugin::tasks::{NewTask, Task, TaskFilter, TaskPatch};
use super::bindings::capstan::plugin::types::HostError;
use super::bindings::capstan::plugin::{log, memory, tasks, types};
use super::limits::{LOG_LINE_BYTES, LOG_LINES_PER_CALL};
use super::sandbox::Sandbox;
use crate::store::{self, Store, StoreError};
use crate::text::{echo_name, one_line, truncate};

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
        let message = one_line(truncate(&message, LOG_LINE_BYTES));
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

    /// The store, after checking the call may use `what`.
    fn store_for(&self, what: &str, caps: &[Capability]) -> Result<Arc<Store>, HostError> {
        self.require(what, caps)?;
        let interface = what.split('.').next().unwrap_or(what);
        self.scope.store.clone().ok_or_else(|| {
            HostError::Denied(format!(
                "the {interface} store is not available in this host"
            ))
        })
    }
}

/// Under `tasks.write-own` only (`write_any` false), refuses a task `caller` neither created
/// nor is assigned.
fn check_task_scope(write_any: bool, caller: &str, task: &store::Task) -> Result<(), HostError> {
    if write_any || task.creator == caller || task.assigned_worker.as_deref() == Some(caller) {
        return Ok(());
    }
    Err(HostError::Denied(format!(
        "task #{} was created by {} and is {}; {caller} holds tasks.write-own, which updates \
         only the tasks it created or is assigned",
        task.number,
        task.creator,
        match &task.assigned_worker {
            Some(worker) => format!("assigned to {worker}"),
            None => "assigned to no one".into(),
        }
    )))
}

/// Runs `work` against `store` on a blocking thread and waits for it without holding the
/// executor. Dropping the returned future (the call hit its deadline) abandons the wait.
async fn on_store<T: Send + 'static>(
    store: Arc<Store>,
    work: impl FnOnce(&Store) -> Result<T, HostError> + Send + 'static,
) -> Result<T, HostError> {
    tokio::task::spawn_blocking(move || work(&store))
        .await
        .map_err(|err| HostError::Failed(format!("the store operation did not finish: {err}")))?
}

fn host_error(err: StoreError) -> HostError {
    match err {
        StoreError::NotFound(m) => HostError::NotFound(m),
        StoreError::Invalid(m) => HostError::Invalid(m),
        other => HostError::Failed(other.to_string()),
    }
}

fn parse<T: std::str::FromStr<Err = StoreError>>(
    text: Option<String>,
) -> Result<Option<T>, HostError> {
    text.map(|t| t.parse().map_err(host_error)).transpose()
}

fn to_wit_task(task: store::Task) -> Task {
    Task {
        number: task.number,
        title: task.title,
        description: task.description,
        status: task.status.as_str().to_owned(),
        priority: task.priority.as_str().to_owned(),
        creator: task.creator,
        assigned_worker: task.assigned_worker,
        parent: task.parent,
        metadata: task.metadata,
    }
}

fn to_wit_memory(memory: store::Memory) -> MemoryItem {
    MemoryItem {
        id: memory.id.to_string(),
        kind: memory.kind,
        content: memory.content,
        importance: memory.importance,
        created_at: memory.created_at.max(0) as u64,
    }
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
    async fn create(&mut self, task: NewTask) -> Result<Task, HostError> {
        let store = self.store_for("tasks.create", TASKS_WRITE)?;
        let new = store::NewTask {
            title: task.title,
            description: task.description,
            priority: parse(task.priority)?,
            parent: task.parent,
            metadata: task.metadata,
            assigned_worker: None,
        };
        let caller = self.scope.caller.clone();
        on_store(store, move |store| {
            store
                .create_task(&caller, &new)
                .map(to_wit_task)
                .map_err(host_error)
        })
        .await
    }

    async fn get(&mut self, number: u64) -> Result<Task, HostError> {
        let store = self.store_for("tasks.get", TASKS_READ)?;
        on_store(store, move |store| {
            store.get_task(number).map(to_wit_task).map_err(host_error)
        })
        .await
    }

    async fn list(&mut self, filter: TaskFilter) -> Result<Vec<Task>, HostError> {
        let store = self.store_for("tasks.list", TASKS_READ)?;
        let filter = store::TaskFilter {
            status: parse(filter.status)?,
            parent: None,
            limit: filter.limit,
        };
        on_store(store, move |store| {
            let tasks = store.list_tasks(&filter).map_err(host_error)?;
            Ok(tasks.into_iter().map(to_wit_task).collect())
        })
        .await
    }

    async fn update(&mut self, number: u64, patch: TaskPatch) -> Result<Task, HostError> {
        let store = self.store_for("tasks.update", TASKS_WRITE)?;
        let patch = store::TaskPatch {
            title: patch.title,
            description: patch.description,
            status: parse(patch.status)?,
            priority: parse(patch.priority)?,
            metadata: patch.metadata,
            assigned_worker: None,
        };
        let write_any = self.scope.capabilities.contains(&Capability::TasksWrite);
        let caller = self.scope.caller.clone();
        on_store(store, move |store| {
            let task = store.get_task(number).map_err(host_error)?;
            check_task_scope(write_any, &caller, &task)?;
            store
                .update_task(number, &patch)
                .map(to_wit_task)
                .map_err(host_error)
        })
        .await
    }
}

impl memory::Host for Sandbox {
    async fn save(&mut self, item: NewMemory) -> Result<MemoryItem, HostError> {
        let store = self.store_for("memory.save", MEMORY_WRITE)?;
        let new = store::NewMemory {
            kind: item.kind,
            content: item.content,
            importance: item.importance,
        };
        let caller = self.scope.caller.clone();
        on_store(store, move |store| {
            store
                .save_memory(&caller, &new)
                .map(to_wit_memory)
                .map_err(host_error)
        })
        .await
    }

    async fn recall(&mut self, query: String, limit: u32) -> Result<Vec<MemoryItem>, HostError> {
        let store = self.store_for("memory.recall", MEMORY_READ)?;
        on_store(store, move |store| {
            let found = store.recall(&query, limit).map_err(host_error)?;
            Ok(found.into_iter().map(to_wit_memory).collect())
        })
        .await
    }

    async fn delete(&mut self, id: String) -> Result<(), HostError> {
        let store = self.store_for("memory.delete", MEMORY_WRITE)?;
        let id: u64 = id.parse().map_err(|_| {
            HostError::Invalid(format!(
                "memory id `{}` is not a number",
                echo_name(&id, 64)
            ))
        })?;
        on_store(store, move |store| {
            store.delete_memory(id).map_err(host_error)
        })
        .await
    }

    async fn working_get(&mut self, key: String) -> Result<Option<String>, HostError> {
        let store = self.store_for("memory.working-get", MEMORY_READ)?;
        on_store(store, move |store| {
            store.working_get(&key).map_err(host_error)
        })
        .await
    }

    async fn working_set(
        &mut self,
        key: String,
        value: String,
        ttl_seconds: Option<u64>,
    ) -> Result<(), HostError> {
        let store = self.store_for("memory.working-set", MEMORY_WRITE)?;
        on_store(store, move |store| {
            store
                .working_set(&key, &value, ttl_seconds)
                .map_err(host_error)
        })
        .await
    }
}
