//! The taskboard: numbered tasks whose status moves along allowed transitions.
//!
//! The rules every backend applies (a title, metadata that is a JSON object, the status
//! transitions) live here with the types, so a task means the same in SQLite, in memory
//! and in any store to come.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde::Serialize;

use super::ServiceError;
use crate::flow::Label;
use crate::ids::{Caller, ProcessId};

/// The taskboard every process and plugin shares.
///
/// ```
/// use capstan_host::ids::{Caller, ProcessId, ProcessKind};
/// use capstan_host::services::{NewTask, Services, TaskPatch, TaskStatus};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let who = Caller::from(ProcessId::numbered(ProcessKind::Worker, 1));
/// let task = services.tasks.create(&who, NewTask::titled("Sort the inbox")).await.unwrap();
/// let started = TaskPatch { status: Some(TaskStatus::InProgress), ..TaskPatch::default() };
/// let task = services.tasks.update(task.number, started).await.unwrap();
/// assert_eq!(task.status, TaskStatus::InProgress);
/// # });
/// ```
#[async_trait]
pub trait TaskBoard: Send + Sync {
    /// Creates a task in the backlog, recording `creator`. Refuses an empty title,
    /// metadata that is not a JSON object and a parent that does not exist.
    async fn create(&self, creator: &Caller, task: NewTask) -> Result<Task, ServiceError>;

    /// Task `number`, or [`ServiceError::NotFound`].
    async fn get(&self, number: u64) -> Result<Task, ServiceError>;

    /// The tasks matching `filter`, by number.
    async fn list(&self, filter: TaskFilter) -> Result<Vec<Task>, ServiceError>;

    /// Applies `patch` to task `number`. A status change must be an allowed transition
    /// ([`TaskStatus::check_move`]), checked against the status at the moment of the
    /// write, so two processes moving one task cannot both pass on the same old status.
    async fn update(&self, number: u64, patch: TaskPatch) -> Result<Task, ServiceError>;
}

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TaskStatus {
    /// Noted, not yet ready to start.
    Backlog,
    /// Ready to start.
    Ready,
    /// Someone is on it.
    InProgress,
    /// Finished.
    Done,
    /// Dropped.
    Cancelled,
}

impl TaskStatus {
    const ALL: [TaskStatus; 5] = [
        TaskStatus::Backlog,
        TaskStatus::Ready,
        TaskStatus::InProgress,
        TaskStatus::Done,
        TaskStatus::Cancelled,
    ];

    /// The name stored and shown: `backlog`, `ready`, `in-progress`, `done`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Backlog => "backlog",
            TaskStatus::Ready => "ready",
            TaskStatus::InProgress => "in-progress",
            TaskStatus::Done => "done",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// The statuses a task in this status may move to. Done tasks can be reopened and
    /// cancelled ones restored, but never straight to done.
    pub fn next(self) -> &'static [TaskStatus] {
        use TaskStatus::*;
        match self {
            Backlog => &[Ready, InProgress, Cancelled],
            Ready => &[Backlog, InProgress, Cancelled],
            InProgress => &[Ready, Done, Cancelled],
            Done => &[InProgress],
            Cancelled => &[Backlog],
        }
    }

    /// Refuses moving task `number` from `self` to `to` unless [`TaskStatus::next`]
    /// allows it (staying put is always allowed), naming the moves that are.
    pub fn check_move(self, number: u64, to: TaskStatus) -> Result<(), ServiceError> {
        if to == self || self.next().contains(&to) {
            return Ok(());
        }
        let allowed: Vec<&str> = self.next().iter().map(|s| s.as_str()).collect();
        Err(ServiceError::Invalid(format!(
            "task #{number} cannot move from {self} to {to}; from {self} it can move to {}",
            allowed.join(", ")
        )))
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskStatus {
    type Err = ServiceError;

    fn from_str(text: &str) -> Result<Self, ServiceError> {
        TaskStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                ServiceError::Invalid(format!(
                    "unknown task status `{text}`; expected backlog, ready, in-progress, done or cancelled"
                ))
            })
    }
}

/// How urgent a task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    /// Whenever.
    Low,
    /// The default.
    Normal,
    /// Soon.
    High,
    /// Now.
    Urgent,
}

impl Priority {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Urgent => "urgent",
        }
    }
}

impl FromStr for Priority {
    type Err = ServiceError;

    fn from_str(text: &str) -> Result<Self, ServiceError> {
        [
            Priority::Low,
            Priority::Normal,
            Priority::High,
            Priority::Urgent,
        ]
        .into_iter()
        .find(|p| p.as_str() == text)
        .ok_or_else(|| {
            ServiceError::Invalid(format!(
                "unknown priority `{text}`; expected low, normal, high or urgent"
            ))
        })
    }
}

/// A stored task.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Task {
    /// Its number, from 1.
    pub number: u64,
    /// A short title.
    pub title: String,
    /// What is to be done.
    pub description: String,
    /// Where it stands.
    pub status: TaskStatus,
    /// How urgent.
    pub priority: Priority,
    /// Who created it, e.g. `worker:3`.
    #[schema(value_type = String)]
    pub creator: Caller,
    /// The worker it is assigned to, if any.
    #[schema(value_type = Option<String>)]
    pub assigned_worker: Option<ProcessId>,
    /// The task it is a subtask of.
    pub parent: Option<u64>,
    /// A JSON object.
    pub metadata: String,
    /// What went into it: the join of the labels of everyone who wrote it (what each
    /// writer had read), so a process that reads it reads that too.
    #[schema(value_type = Object)]
    pub label: Label,
}

/// A task to create.
#[derive(Debug, Clone, Default)]
pub struct NewTask {
    /// A short title; required.
    pub title: String,
    /// What is to be done.
    pub description: String,
    /// Default normal.
    pub priority: Option<Priority>,
    /// Make it a subtask of this task.
    pub parent: Option<u64>,
    /// A JSON object; default `{}`.
    pub metadata: Option<String>,
    /// Assign it to this worker.
    pub assigned_worker: Option<ProcessId>,
    /// What its writer had read (trusted: a person's task).
    pub label: Label,
}

impl NewTask {
    /// A task with just a title.
    pub fn titled(title: &str) -> Self {
        NewTask {
            title: title.to_owned(),
            ..NewTask::default()
        }
    }

    /// The task as [`TaskBoard::create`] stores it: its title checked and trimmed, its
    /// metadata (`{}` when none) a JSON object.
    pub fn checked(mut self) -> Result<Self, ServiceError> {
        self.title = checked_title(&self.title)?.to_owned();
        let metadata = self.metadata.take().unwrap_or_else(|| "{}".into());
        check_metadata(&metadata)?;
        self.metadata = Some(metadata);
        Ok(self)
    }
}

/// Changes to a task; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct TaskPatch {
    /// New title.
    pub title: Option<String>,
    /// New description.
    pub description: Option<String>,
    /// New status; must be an allowed transition.
    pub status: Option<TaskStatus>,
    /// New priority.
    pub priority: Option<Priority>,
    /// New metadata (a JSON object).
    pub metadata: Option<String>,
    /// New assignee.
    pub assigned_worker: Option<ProcessId>,
    /// What its writer had read: joined into the task's label.
    pub label: Label,
}

/// Which tasks to list.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// Only this status.
    pub status: Option<TaskStatus>,
    /// Only subtasks of this task.
    pub parent: Option<u64>,
    /// At most this many (default 100).
    pub limit: Option<u32>,
}

/// The most tasks a list returns when the filter names no limit.
pub const DEFAULT_LIST_LIMIT: u32 = 100;

/// Refuses an empty (or blank) title; returns it trimmed.
pub fn checked_title(title: &str) -> Result<&str, ServiceError> {
    let title = title.trim();
    if title.is_empty() {
        return Err(ServiceError::Invalid("a task needs a title".into()));
    }
    Ok(title)
}

/// Refuses metadata that is not a JSON object.
pub fn check_metadata(metadata: &str) -> Result<(), ServiceError> {
    match serde_json::from_str::<serde_json::Value>(metadata) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        _ => Err(ServiceError::Invalid(format!(
            "task metadata must be a JSON object, got `{metadata}`"
        ))),
    }
}

impl TaskPatch {
    /// The patch with the fields it can get wrong on its own checked, before anything is
    /// written: a new title trimmed and not blank, new metadata a JSON object.
    pub fn checked(mut self) -> Result<Self, ServiceError> {
        if let Some(title) = &self.title {
            self.title = Some(checked_title(title)?.to_owned());
        }
        if let Some(metadata) = &self.metadata {
            check_metadata(metadata)?;
        }
        Ok(self)
    }
}
