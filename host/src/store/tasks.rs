//! The taskboard in SQLite. The types and the rules are the services' (`services::tasks`).

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::rows::{label, label_text, parsed, parsed_opt, readable};
use super::{Store, StoreError, now};
use crate::ids::Caller;
use crate::services::{
    DEFAULT_LIST_LIMIT, NewTask, Priority, Task, TaskFilter, TaskPatch, TaskStatus,
};

const COLUMNS: &str = "number, title, description, status, priority, creator, assigned_worker, parent, metadata, \
     label";

fn task_from_row(row: &Row<'_>) -> rusqlite::Result<Task> {
    Ok(Task {
        number: row.get::<_, i64>(0)? as u64,
        title: row.get(1)?,
        description: row.get(2)?,
        status: parsed(row, 3)?,
        priority: parsed(row, 4)?,
        creator: parsed(row, 5)?,
        assigned_worker: parsed_opt(row, 6)?,
        parent: row.get::<_, Option<i64>>(7)?.map(|n| n as u64),
        metadata: row.get(8)?,
        label: label(row, 9)?,
    })
}

impl Store {
    /// Creates a task in the backlog, recording `creator`.
    pub(crate) fn create_task(&self, creator: &Caller, task: &NewTask) -> Result<Task, StoreError> {
        let metadata = task.metadata.as_deref().unwrap_or("{}");
        let at = now();
        // The parent check, the insert and the read-back hold the write lock together, so
        // no other process deletes the parent or renumbers in between.
        self.write(|tx| {
            if let Some(parent) = task.parent {
                let exists: bool = tx.query_row(
                    "SELECT EXISTS(SELECT 1 FROM tasks WHERE number = ?1)",
                    [parent as i64],
                    |row| row.get(0),
                )?;
                if !exists {
                    return Err(StoreError::NotFound(format!(
                        "parent task #{parent} does not exist"
                    )));
                }
            }
            tx.execute(
                "INSERT INTO tasks (title, description, status, priority, creator, assigned_worker,
                                    parent, metadata, created_at, updated_at, label)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?9, ?10)",
                params![
                    task.title,
                    task.description,
                    TaskStatus::Backlog.as_str(),
                    task.priority.unwrap_or(Priority::Normal).as_str(),
                    creator.to_string(),
                    task.assigned_worker.as_ref().map(ToString::to_string),
                    task.parent.map(|n| n as i64),
                    metadata,
                    at,
                    label_text(&task.label)
                ],
            )?;
            read_task(tx, tx.last_insert_rowid() as u64)
        })
    }

    /// Reads task `number`.
    pub fn get_task(&self, number: u64) -> Result<Task, StoreError> {
        read_task(&self.conn(), number)
    }

    /// Tasks matching `filter`, by number.
    pub fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<Task>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM tasks
             WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR parent = ?2)
             ORDER BY number LIMIT ?3"
        ))?;
        let rows = stmt.query_map(
            params![
                filter.status.map(TaskStatus::as_str),
                filter.parent.map(|n| n as i64),
                filter.limit.unwrap_or(DEFAULT_LIST_LIMIT)
            ],
            task_from_row,
        )?;
        Ok(readable("a task", rows)?)
    }

    /// Applies `patch` to task `number`; a status change must be an allowed transition.
    pub(crate) fn update_task(&self, number: u64, patch: &TaskPatch) -> Result<Task, StoreError> {
        // The transition is checked against the status read under the write lock, so two
        // processes moving one task cannot both pass the check on the same old status.
        self.write(|tx| update_in(tx, number, patch))
    }
}

/// Applies `patch` to task `number` through `tx`, checking the transition.
fn update_in(tx: &Connection, number: u64, patch: &TaskPatch) -> Result<Task, StoreError> {
    let task = read_task(tx, number)?;
    if let Some(to) = patch.status {
        task.status.check_move(number, to)?;
    }
    tx.execute(
        "UPDATE tasks SET
                title = COALESCE(?2, title),
                description = COALESCE(?3, description),
                status = COALESCE(?4, status),
                priority = COALESCE(?5, priority),
                metadata = COALESCE(?6, metadata),
                assigned_worker = COALESCE(?7, assigned_worker),
                updated_at = ?8,
                label = ?9
             WHERE number = ?1",
        params![
            number as i64,
            patch.title,
            patch.description,
            patch.status.map(TaskStatus::as_str),
            patch.priority.map(Priority::as_str),
            patch.metadata,
            patch.assigned_worker.as_ref().map(ToString::to_string),
            now(),
            // What was in it stays: the writer's label joins it.
            label_text(&task.label.joined(&patch.label))
        ],
    )?;
    read_task(tx, number)
}

/// Reads task `number` through `conn` (the store's connection or a transaction on it).
fn read_task(conn: &Connection, number: u64) -> Result<Task, StoreError> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM tasks WHERE number = ?1"),
        [number as i64],
        task_from_row,
    )
    .optional()?
    .ok_or_else(|| StoreError::NotFound(format!("task #{number} does not exist")))
}
