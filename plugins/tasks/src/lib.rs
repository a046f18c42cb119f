//! Capstan's task tools: `task_create`, `task_list` and `task_update`.
//!
//! They declare `tasks.read` / `tasks.write-own`; the caller's grant decides the scope. A
//! worker (`tasks.write-own`) updates only the tasks it created or is assigned; a branch or
//! the cortex (`tasks.write`) updates any. The host enforces it and names the task it refuses.

use capstan_sdk::host::{NewTask, Priority, Task, TaskFilter, TaskPatch, TaskStatus, tasks};
use capstan_sdk::{Capability, Context, Json, Tool, ToolError, Toolbox};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A task as the tools return it.
#[derive(Serialize)]
struct TaskView {
    number: u64,
    title: String,
    description: String,
    status: TaskStatus,
    priority: Priority,
    creator: String,
    assigned_worker: Option<String>,
    parent: Option<u64>,
    metadata: serde_json::Value,
}

impl From<Task> for TaskView {
    fn from(t: Task) -> Self {
        TaskView {
            number: t.number,
            title: t.title,
            description: t.description,
            status: t.status,
            priority: t.priority,
            creator: t.creator,
            assigned_worker: t.assigned_worker,
            parent: t.parent,
            metadata: serde_json::from_str(&t.metadata).unwrap_or_default(),
        }
    }
}

/// Arguments of `task_create`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateArgs {
    /// A short title.
    title: String,
    /// What is to be done, with enough detail to act on it.
    #[serde(default)]
    description: String,
    /// Default normal.
    #[serde(default)]
    priority: Option<Priority>,
    /// Make this a subtask of task `parent`.
    #[serde(default)]
    parent: Option<u64>,
    /// Free-form details, a JSON object.
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

fn task_create(args: CreateArgs, _: &Context) -> Result<Json<TaskView>, ToolError> {
    let task = tasks::create(&NewTask {
        title: args.title,
        description: args.description,
        priority: args.priority,
        parent: args.parent,
        metadata: args
            .metadata
            .map(|m| serde_json::Value::Object(m).to_string()),
    })?;
    Ok(Json(task.into()))
}

/// Arguments of `task_list`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    /// Only tasks in this status.
    #[serde(default)]
    status: Option<TaskStatus>,
    /// At most this many (default 100).
    #[serde(default)]
    limit: Option<u32>,
}

fn task_list(args: ListArgs, _: &Context) -> Result<Json<Vec<TaskView>>, ToolError> {
    let found = tasks::list(&TaskFilter {
        status: args.status,
        limit: args.limit,
    })?;
    Ok(Json(found.into_iter().map(Into::into).collect()))
}

/// Arguments of `task_update`. Fields left out stay as they are.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateArgs {
    /// The task's number.
    number: u64,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    description: Option<String>,
    /// The new status, along the allowed transitions: backlog to ready, in-progress or
    /// cancelled; ready to backlog, in-progress or cancelled; in-progress to ready, done or
    /// cancelled; done back to in-progress; cancelled back to backlog.
    #[serde(default)]
    status: Option<TaskStatus>,
    /// The new priority.
    #[serde(default)]
    priority: Option<Priority>,
    /// Replaces the metadata object.
    #[serde(default)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

fn task_update(args: UpdateArgs, _: &Context) -> Result<Json<TaskView>, ToolError> {
    let task = tasks::update(
        args.number,
        &TaskPatch {
            title: args.title,
            description: args.description,
            status: args.status,
            priority: args.priority,
            metadata: args
                .metadata
                .map(|m| serde_json::Value::Object(m).to_string()),
        },
    )?;
    Ok(Json(task.into()))
}

fn tools() -> Toolbox {
    Toolbox::new()
        .tool(
            Tool::new(
                "task_create",
                "Creates a task on the taskboard.",
                task_create,
            )
            .needs(Capability::TasksWriteOwn),
        )
        .tool(
            Tool::new("task_list", "Lists tasks, optionally by status.", task_list)
                .needs(Capability::TasksRead),
        )
        .tool(
            Tool::new(
                "task_update",
                "Changes a task: status, title, description, priority or metadata.",
                task_update,
            )
            .needs(Capability::TasksWriteOwn),
        )
}

capstan_sdk::export_plugin!(tools);
