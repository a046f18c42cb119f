//! The host side of the plugin's imports: `log`, `tasks` and `memory`.
//!
//! Every function checks the call's capabilities first, so a tool that did not declare
//! (or was not granted) `tasks.*` or `memory.*` is refused with the capability named. Then
//! the host's [`Services`] answer; a host without them answers `denied` with "not
//! available in this host". Never a trap, never a panic.
//!
//! Scope: `tasks.write` updates any task; `tasks.write-own` creates tasks and updates only
//! those the caller created or is assigned, and refuses others naming the task.
//!
//! The services never hold the executor (the SQLite store runs on blocking threads), so a
//! guest waiting in an import stays abandonable at its deadline. An abandoned call's work
//! still finishes; the guest never sees the answer.
//!
//! Log lines are put on one line with their control characters escaped before they reach
//! tracing, so a plugin cannot forge a log line or send terminal escapes.

use capstan_caps::Capability;

use super::bindings::capstan::plugin::log::Level;
use super::bindings::capstan::plugin::memory::{MemoryItem, NewMemory};
use super::bindings::capstan::plugin::tasks::{
    NewTask, Priority, Task, TaskFilter, TaskPatch, TaskStatus,
};
use super::bindings::capstan::plugin::types::HostError;
use super::bindings::capstan::plugin::{log, memory, secrets, tasks, types};
use super::limits::{LOG_LINE_BYTES, LOG_LINES_PER_CALL};
use super::sandbox::Sandbox;
use crate::flow::{Label, Origin, Scope};
use crate::ids::Caller;
use crate::services::{self, Operation, ServiceError, Services};
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
        let message = scope
            .network
            .secrets()
            .redactor()
            .redact(&message)
            .into_owned();
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

impl secrets::Host for Sandbox {
    fn exists(&mut self, name: String) -> bool {
        self.granted_secret(&name).is_some()
    }

    fn hmac_sha256(&mut self, name: String, data: Vec<u8>) -> Result<Vec<u8>, HostError> {
        use hmac::{Hmac, Mac};
        let Some(secret) = self.granted_secret(&name) else {
            return Err(HostError::Denied(format!(
                "secret `{}` is not granted to tool `{}` (grant secret:{0} in its profile's \
                 `secrets`, and declare it or secret:* in the tool)",
                echo_name(&name, 64),
                self.scope.tool
            )));
        };
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.value().as_bytes())
            .expect("HMAC takes a key of any length");
        mac.update(&data);
        Ok(mac.finalize().into_bytes().to_vec())
    }
}

impl Sandbox {
    /// Secret `name`, if the call holds `secret:NAME` and the host has it.
    fn granted_secret(&self, name: &str) -> Option<&crate::secrets::Secret> {
        let granted = self
            .scope
            .capabilities
            .iter()
            .any(|cap| matches!(cap, Capability::Secret(n) if n == name));
        granted
            .then(|| self.scope.network.secrets().get(name))
            .flatten()
    }

    /// Refuses unless the call runs with one of `caps`; `what` names the import function.
    fn require(&self, what: Operation, caps: &[Capability]) -> Result<(), HostError> {
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

    /// The services, after checking the call may use `what`.
    fn services_for(&self, what: Operation, caps: &[Capability]) -> Result<&Services, HostError> {
        self.require(what, caps)?;
        let interface = what.service();
        self.scope.services.as_ref().ok_or_else(|| {
            HostError::Denied(format!(
                "the {interface} store is not available in this host"
            ))
        })
    }
}

/// Under `tasks.write-own` only (`write_any` false), refuses a task `caller` neither created
/// nor is assigned. Ids are compared, not their text.
fn check_task_scope(
    write_any: bool,
    caller: &Caller,
    task: &services::Task,
) -> Result<(), HostError> {
    let assigned =
        task.assigned_worker.is_some() && task.assigned_worker.as_ref() == caller.process();
    if write_any || task.creator == *caller || assigned {
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

fn host_error(err: ServiceError) -> HostError {
    match err {
        ServiceError::NotFound(m) => HostError::NotFound(m),
        ServiceError::Invalid(m) => HostError::Invalid(m),
        other => HostError::Failed(other.to_string()),
    }
}

fn from_wit_status(status: TaskStatus) -> services::TaskStatus {
    match status {
        TaskStatus::Backlog => services::TaskStatus::Backlog,
        TaskStatus::Ready => services::TaskStatus::Ready,
        TaskStatus::InProgress => services::TaskStatus::InProgress,
        TaskStatus::Done => services::TaskStatus::Done,
        TaskStatus::Cancelled => services::TaskStatus::Cancelled,
    }
}

fn to_wit_status(status: services::TaskStatus) -> TaskStatus {
    match status {
        services::TaskStatus::Backlog => TaskStatus::Backlog,
        services::TaskStatus::Ready => TaskStatus::Ready,
        services::TaskStatus::InProgress => TaskStatus::InProgress,
        services::TaskStatus::Done => TaskStatus::Done,
        services::TaskStatus::Cancelled => TaskStatus::Cancelled,
    }
}

fn from_wit_priority(priority: Priority) -> services::Priority {
    match priority {
        Priority::Low => services::Priority::Low,
        Priority::Normal => services::Priority::Normal,
        Priority::High => services::Priority::High,
        Priority::Urgent => services::Priority::Urgent,
    }
}

fn to_wit_priority(priority: services::Priority) -> Priority {
    match priority {
        services::Priority::Low => Priority::Low,
        services::Priority::Normal => Priority::Normal,
        services::Priority::High => Priority::High,
        services::Priority::Urgent => Priority::Urgent,
    }
}

fn to_wit_task(task: services::Task) -> Task {
    Task {
        number: task.number,
        title: task.title,
        description: task.description,
        status: to_wit_status(task.status),
        priority: to_wit_priority(task.priority),
        creator: task.creator.to_string(),
        assigned_worker: task.assigned_worker.as_ref().map(ToString::to_string),
        parent: task.parent,
        metadata: task.metadata,
    }
}

fn to_wit_memory(memory: services::MemoryItem) -> MemoryItem {
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

impl Sandbox {
    /// Notes that the guest was given data labelled `label` (a task, a memory).
    fn gave(&mut self, label: &Label) {
        self.file_access().touched().labels.join(label);
    }

    /// The label of what the guest writes through an import now: what its caller put
    /// into the call, each secret it holds, and what the call has read so far: what
    /// imports gave it, each host its requests reached, and each file it read or listed,
    /// by the label its writer left (private to the workspace, whatever that was). A call
    /// whose caller keeps no file labels takes what it read as untrusted from its plugin.
    async fn writes_label(&mut self) -> Label {
        let mut label = self.scope.label.clone();
        for cap in &self.scope.capabilities {
            if let Capability::Secret(name) = cap {
                label.join(&Label::secret(name.clone()));
            }
        }
        for host in self.hosts_reached() {
            label.join(&Label::untrusted(Origin::Net(host)));
        }
        // A copy: the log is not held across the lookup.
        let touched = self.file_access().touched().clone();
        label.join(&touched.labels);
        if touched.read.is_empty() && touched.listed.is_empty() && !touched.overflowed {
            return label;
        }
        label.join(&Label::private(Scope::Workspace));
        match self.scope.reads.clone() {
            Some(reads) => label.join(&reads.read_label(&touched).await),
            None => label.join(&Label::untrusted(Origin::Plugin(
                self.scope.plugin.to_string(),
            ))),
        }
        label
    }
}

/// `task` for the guest, noting its label as given.
fn given_task(sandbox: &mut Sandbox, task: services::Task) -> Task {
    sandbox.gave(&task.label);
    to_wit_task(task)
}

impl tasks::Host for Sandbox {
    async fn create(&mut self, task: NewTask) -> Result<Task, HostError> {
        let services = self
            .services_for(Operation::TasksCreate, TASKS_WRITE)?
            .clone();
        let new = services::NewTask {
            title: task.title,
            description: task.description,
            priority: task.priority.map(from_wit_priority),
            parent: task.parent,
            metadata: task.metadata,
            assigned_worker: None,
            label: self.writes_label().await,
        };
        let created = services.tasks.create(&self.scope.caller, new).await;
        let created = created.map_err(host_error)?;
        Ok(given_task(self, created))
    }

    async fn get(&mut self, number: u64) -> Result<Task, HostError> {
        let services = self.services_for(Operation::TasksGet, TASKS_READ)?.clone();
        let task = services.tasks.get(number).await.map_err(host_error)?;
        Ok(given_task(self, task))
    }

    async fn list(&mut self, filter: TaskFilter) -> Result<Vec<Task>, HostError> {
        let services = self.services_for(Operation::TasksList, TASKS_READ)?.clone();
        let filter = services::TaskFilter {
            status: filter.status.map(from_wit_status),
            parent: None,
            limit: filter.limit,
        };
        let tasks = services.tasks.list(filter).await.map_err(host_error)?;
        Ok(tasks.into_iter().map(|t| given_task(self, t)).collect())
    }

    async fn update(&mut self, number: u64, patch: TaskPatch) -> Result<Task, HostError> {
        let services = self
            .services_for(Operation::TasksUpdate, TASKS_WRITE)?
            .clone();
        let patch = services::TaskPatch {
            title: patch.title,
            description: patch.description,
            status: patch.status.map(from_wit_status),
            priority: patch.priority.map(from_wit_priority),
            metadata: patch.metadata,
            assigned_worker: None,
            label: self.writes_label().await,
        };
        let write_any = self.scope.capabilities.contains(&Capability::TasksWrite);
        // Who created a task never changes; the host may assign it to another worker
        // between this read and the write, and the caller's update then still lands (it
        // was the owner when it asked).
        let task = services.tasks.get(number).await.map_err(host_error)?;
        check_task_scope(write_any, &self.scope.caller, &task)?;
        let updated = services.tasks.update(number, patch).await;
        let updated = updated.map_err(host_error)?;
        Ok(given_task(self, updated))
    }
}

impl memory::Host for Sandbox {
    async fn save(&mut self, item: NewMemory) -> Result<MemoryItem, HostError> {
        let services = self
            .services_for(Operation::MemorySave, MEMORY_WRITE)?
            .clone();
        let new = services::NewMemory {
            kind: item.kind,
            content: item.content,
            importance: item.importance,
            label: self.writes_label().await,
        };
        let saved = services.memory.save(&self.scope.caller, new).await;
        let saved = saved.map_err(host_error)?;
        self.gave(&saved.label);
        Ok(to_wit_memory(saved))
    }

    async fn recall(&mut self, query: String, limit: u32) -> Result<Vec<MemoryItem>, HostError> {
        let services = self
            .services_for(Operation::MemoryRecall, MEMORY_READ)?
            .clone();
        let found = services.memory.recall(&query, limit).await;
        let found = found.map_err(host_error)?;
        for memory in &found {
            self.gave(&memory.label);
        }
        Ok(found.into_iter().map(to_wit_memory).collect())
    }

    async fn delete(&mut self, id: String) -> Result<(), HostError> {
        let services = self
            .services_for(Operation::MemoryDelete, MEMORY_WRITE)?
            .clone();
        let id: u64 = id.parse().map_err(|_| {
            HostError::Invalid(format!(
                "memory id `{}` is not a number",
                echo_name(&id, 64)
            ))
        })?;
        services.memory.delete(id).await.map_err(host_error)
    }

    async fn working_get(&mut self, key: String) -> Result<Option<String>, HostError> {
        let services = self
            .services_for(Operation::MemoryWorkingGet, MEMORY_READ)?
            .clone();
        let entry = services
            .memory
            .working_get(&key)
            .await
            .map_err(host_error)?;
        Ok(entry.map(|entry| {
            self.gave(&entry.label);
            entry.value
        }))
    }

    async fn working_set(
        &mut self,
        key: String,
        value: String,
        ttl_seconds: Option<u64>,
    ) -> Result<(), HostError> {
        let services = self
            .services_for(Operation::MemoryWorkingSet, MEMORY_WRITE)?
            .clone();
        let label = self.writes_label().await;
        let set = services
            .memory
            .working_set(&key, &value, &label, ttl_seconds);
        set.await.map_err(host_error)
    }
}

#[cfg(test)]
mod tests {
    use super::check_task_scope;
    use crate::ids::testing::{by, pid};
    use crate::services::{Priority, Task, TaskStatus};

    fn task(creator: &str, assigned: Option<&str>) -> Task {
        Task {
            number: 7,
            title: "t".into(),
            description: String::new(),
            status: TaskStatus::Ready,
            priority: Priority::Normal,
            creator: by(creator),
            assigned_worker: assigned.map(pid),
            parent: None,
            metadata: "{}".into(),
            label: crate::flow::Label::trusted(),
        }
    }

    #[test]
    fn write_own_compares_ids_so_no_label_passes_for_a_process() {
        let own = |caller: &str, task: &Task| check_task_scope(false, &by(caller), task).is_ok();
        let mine = task("worker:3", None);
        assert!(own("worker:3", &mine));
        assert!(!own("worker:30", &mine));
        // A client at a door naming itself after a process is still a client.
        assert!(!own("mcp:worker:3", &mine));
        let assigned = task("branch:1", Some("worker:3"));
        assert!(own("worker:3", &assigned));
        assert!(!own("branch:2", &assigned));
        // An unassigned task is nobody's by assignment, a client's included.
        let unassigned = task("branch:1", None);
        assert!(!own("mcp:ci", &unassigned));
        assert!(own("mcp:ci", &task("mcp:ci", None)));
        assert!(check_task_scope(true, &by("mcp:ci"), &unassigned).is_ok());
    }
}
