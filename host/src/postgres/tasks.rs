//! The taskboard. A status change is checked against the row locked for the update, so
//! two hosts moving one task cannot both pass on the same old status.

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::prepared::Prepared;
use super::rows::{label, label_text, parsed, parsed_opt, readable};
use super::sessions::live_run;
use super::{Postgres, now};
use crate::ids::Caller;
use crate::services::Operation;
use crate::services::{
    DEFAULT_LIST_LIMIT, NewTask, Priority, ServiceError, Task, TaskBoard, TaskFilter, TaskPatch,
    TaskStatus,
};

const COLUMNS: &str = "number, title, description, status, priority, creator, assigned_worker, parent, metadata, \
     label";

fn task_from(row: &Row) -> Result<Task, ServiceError> {
    Ok(Task {
        number: row.get::<_, i64>(0) as u64,
        title: row.get(1),
        description: row.get(2),
        status: parsed(row, 3)?,
        priority: parsed(row, 4)?,
        creator: parsed(row, 5)?,
        assigned_worker: parsed_opt(row, 6)?,
        parent: row.get::<_, Option<i64>>(7).map(|n| n as u64),
        metadata: row.get(8),
        label: label(row, 9),
    })
}

fn not_found(number: u64) -> ServiceError {
    ServiceError::NotFound(format!("task #{number} does not exist"))
}

impl Postgres {
    /// Task `number`, read on `client` for operation `what` (`FOR UPDATE` locks it for the
    /// transaction).
    async fn read_task(
        &self,
        client: &impl GenericClient,
        what: Operation,
        number: u64,
        lock: &str,
    ) -> Result<Task, ServiceError> {
        let sql = format!("SELECT {COLUMNS} FROM tasks WHERE number = $1 {lock}");
        let row = client
            .query_opt_cached(&sql, &[&(number as i64)])
            .await
            .map_err(|err| self.failed(what, err))?;
        task_from(&row.ok_or_else(|| not_found(number))?)
    }
}

#[async_trait]
impl TaskBoard for Postgres {
    async fn create(&self, creator: &Caller, task: NewTask) -> Result<Task, ServiceError> {
        let failed = |err| self.failed(Operation::TasksCreate, err);
        let client = self.client().await?;
        if let Some(parent) = task.parent {
            let exists = client
                .query_opt_cached("SELECT 1 FROM tasks WHERE number = $1", &[&(parent as i64)])
                .await
                .map_err(failed)?;
            if exists.is_none() {
                return Err(ServiceError::NotFound(format!(
                    "parent task #{parent} does not exist"
                )));
            }
        }
        let sql = format!(
            "INSERT INTO tasks (title, description, status, priority, creator, assigned_worker,
                                parent, metadata, created_at, updated_at, label)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10 WHERE {} RETURNING {COLUMNS}",
            live_run(11)
        );
        let row = client
            .query_opt_cached(
                &sql,
                &[
                    &task.title,
                    &task.description,
                    &TaskStatus::Backlog.as_str(),
                    &task.priority.unwrap_or(Priority::Normal).as_str(),
                    &creator.to_string(),
                    &task.assigned_worker.as_ref().map(ToString::to_string),
                    &task.parent.map(|n| n as i64),
                    &task.metadata.as_deref().unwrap_or("{}"),
                    &now(),
                    &label_text(&task.label),
                    &self.writer_run(),
                ],
            )
            .await
            .map_err(failed)?;
        match row {
            Some(row) => task_from(&row),
            None => Err(self.dropped(&format!("{creator}'s new task"))),
        }
    }

    async fn get(&self, number: u64) -> Result<Task, ServiceError> {
        let client = self.client().await?;
        self.read_task(&client, Operation::TasksGet, number, "")
            .await
    }

    async fn list(&self, filter: TaskFilter) -> Result<Vec<Task>, ServiceError> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT {COLUMNS} FROM tasks
             WHERE ($1::TEXT IS NULL OR status = $1) AND ($2::BIGINT IS NULL OR parent = $2)
             ORDER BY number LIMIT $3"
        );
        let limit = i64::from(filter.limit.unwrap_or(DEFAULT_LIST_LIMIT));
        let rows = client
            .query_cached(
                &sql,
                &[
                    &filter.status.map(TaskStatus::as_str),
                    &filter.parent.map(|n| n as i64),
                    &limit,
                ],
            )
            .await
            .map_err(|err| self.failed(Operation::TasksList, err))?;
        Ok(readable("a task", &rows, task_from))
    }

    async fn update(&self, number: u64, patch: TaskPatch) -> Result<Task, ServiceError> {
        let failed = |err| self.failed(Operation::TasksUpdate, err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let task = self
            .read_task(&tx, Operation::TasksUpdate, number, "FOR UPDATE")
            .await?;
        if let Some(to) = patch.status {
            task.status.check_move(number, to)?;
        }
        let sql = format!(
            "UPDATE tasks SET
                title = COALESCE($2, title),
                description = COALESCE($3, description),
                status = COALESCE($4, status),
                priority = COALESCE($5, priority),
                metadata = COALESCE($6, metadata),
                assigned_worker = COALESCE($7, assigned_worker),
                updated_at = $8,
                label = $9
             WHERE number = $1 AND {} RETURNING {COLUMNS}",
            live_run(10)
        );
        let row = tx
            .query_opt_cached(
                &sql,
                &[
                    &(number as i64),
                    &patch.title,
                    &patch.description,
                    &patch.status.map(TaskStatus::as_str),
                    &patch.priority.map(Priority::as_str),
                    &patch.metadata,
                    &patch.assigned_worker.as_ref().map(ToString::to_string),
                    &now(),
                    // What was in it stays: the writer's label joins it.
                    &label_text(&task.label.joined(&patch.label)),
                    &self.writer_run(),
                ],
            )
            .await
            .map_err(failed)?;
        let Some(row) = row else {
            return Err(self.dropped(&format!("the update of task #{number}")));
        };
        let task = task_from(&row)?;
        tx.commit().await.map_err(failed)?;
        Ok(task)
    }
}
