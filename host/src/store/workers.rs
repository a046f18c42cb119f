//! Worker records in SQLite: which worker ran which task, and how it ended. The types
//! are the services' (`services::ledger`).

use rusqlite::{OptionalExtension, Transaction, params};

use super::rows::{parsed, readable};
use super::runs::run_is_over;
use super::{Store, StoreError, now};
use crate::ids::ProcessId;
use crate::services::{
    RunId, WorkerRecord, WorkerState, interrupted_outcome, worker_already_recorded,
    worker_has_ended,
};

impl Store {
    /// Records a new running worker that belongs to no run, so
    /// [`Store::mark_interrupted_workers`] never touches it; prefer
    /// [`Store::insert_worker_in_run`].
    pub fn insert_worker(
        &self,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), StoreError> {
        self.insert_worker_row(None, id, channel, task)
    }

    /// Records a new running worker of `run` (from [`Store::begin_run`]), so it is marked
    /// interrupted if the run ends while it is still running.
    pub fn insert_worker_in_run(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), StoreError> {
        self.insert_worker_row(Some(run), id, channel, task)
    }

    fn insert_worker_row(
        &self,
        run: Option<RunId>,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), StoreError> {
        self.write(|tx| insert_worker_in(tx, run, id, channel, task))
    }

    /// Sets a worker's state and, if given, its outcome.
    pub fn set_worker_state(
        &self,
        id: &ProcessId,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), StoreError> {
        self.write(|tx| set_state_in(tx, id, state, outcome))
    }

    /// Worker `id`'s record.
    pub fn get_worker(&self, id: &ProcessId) -> Result<Option<WorkerRecord>, StoreError> {
        let conn = self.conn();
        let row = conn
            .query_row(
                "SELECT id, channel, task, state, outcome FROM workers WHERE id = ?1",
                [id.to_string()],
                worker_record,
            )
            .optional()?;
        Ok(row)
    }

    /// The `limit` workers started last, newest first.
    pub fn list_workers(&self, limit: u32) -> Result<Vec<WorkerRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT id, channel, task, state, outcome FROM workers
             ORDER BY started_at DESC, rowid DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit], worker_record)?;
        Ok(readable("a worker record", rows)?)
    }

    /// Marks every running or waiting worker whose run is over (its lock is free: its
    /// process ended or was killed) as [`WorkerState::Interrupted`], and returns them as
    /// they are now. Workers of live runs, in this process or any other, are left alone,
    /// and so are workers recorded without a run.
    pub fn mark_interrupted_workers(&self) -> Result<Vec<WorkerRecord>, StoreError> {
        let data_dir = self.data_dir.clone();
        let ids = self.write(|tx| {
            let mut stmt = tx.prepare(
                "SELECT DISTINCT run FROM workers WHERE run IS NOT NULL AND state IN (?1, ?2)",
            )?;
            let runs: Vec<i64> = stmt
                .query_map(
                    params![
                        WorkerState::Running.as_str(),
                        WorkerState::WaitingForInput.as_str()
                    ],
                    |row| row.get(0),
                )?
                .collect::<Result<_, _>>()?;
            drop(stmt);
            let mut marked = Vec::new();
            for run in runs {
                let run = RunId::new(run as u64);
                if !run_is_over(&data_dir, run)? {
                    continue;
                }
                let mut stmt = tx.prepare(
                    "UPDATE workers SET state = ?2, outcome = ?3, updated_at = ?4
                     WHERE run = ?1 AND state IN (?5, ?6) RETURNING id",
                )?;
                let ids = stmt.query_map(
                    params![
                        run.get() as i64,
                        WorkerState::Interrupted.as_str(),
                        interrupted_outcome(run),
                        now(),
                        WorkerState::Running.as_str(),
                        WorkerState::WaitingForInput.as_str()
                    ],
                    |row| row.get::<_, String>(0),
                )?;
                for id in ids {
                    marked.push(id?);
                }
            }
            Ok(marked)
        })?;
        let mut records = Vec::with_capacity(ids.len());
        for text in ids {
            // Marked all the same; one whose id does not read back is only not reported.
            match text.parse::<ProcessId>() {
                Ok(id) => records.extend(self.get_worker(&id)?),
                Err(err) => tracing::warn!(
                    database = %self.path().display(),
                    "a worker marked interrupted has a stored id that cannot be read, so it is not reported: {err}"
                ),
            }
        }
        records.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(records)
    }
}

/// A worker row (id, channel, task, state, outcome) read back typed.
fn worker_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<WorkerRecord> {
    Ok(WorkerRecord {
        id: parsed(row, 0)?,
        channel: parsed(row, 1)?,
        task: row.get(2)?,
        state: parsed(row, 3)?,
        outcome: row.get(4)?,
    })
}

/// Records worker `id` of `run` as running, inside `tx`; refused if it is recorded.
fn insert_worker_in(
    tx: &Transaction<'_>,
    run: Option<RunId>,
    id: &ProcessId,
    channel: &ProcessId,
    task: &str,
) -> Result<(), StoreError> {
    let exists: bool = tx
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM workers WHERE id = ?1)")?
        .query_row([id.to_string()], |row| row.get(0))?;
    if exists {
        return Err(worker_already_recorded(id).into());
    }
    let at = now();
    tx.prepare_cached(
        "INSERT INTO workers (id, channel, task, state, started_at, updated_at, run)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)",
    )?
    .execute(params![
        id.to_string(),
        channel.to_string(),
        task,
        WorkerState::Running.as_str(),
        at,
        run.map(|r| r.get() as i64)
    ])?;
    Ok(())
}

/// Sets worker `id`'s state and, if given, its outcome, inside `tx`; a worker that has
/// ended keeps its end.
fn set_state_in(
    tx: &Transaction<'_>,
    id: &ProcessId,
    state: WorkerState,
    outcome: Option<&str>,
) -> Result<(), StoreError> {
    let current: Option<String> = tx
        .prepare_cached("SELECT state FROM workers WHERE id = ?1")?
        .query_row([id.to_string()], |row| row.get(0))
        .optional()?;
    let Some(current) = current else {
        return Err(StoreError::NotFound(format!("worker {id} does not exist")));
    };
    let current: WorkerState = current.parse()?;
    if current.is_terminal() && state != current {
        return Err(worker_has_ended(id, current).into());
    }
    tx.prepare_cached(
        "UPDATE workers SET state = ?2, outcome = COALESCE(?3, outcome), updated_at = ?4 WHERE id = ?1",
    )?
    .execute(params![id.to_string(), state.as_str(), outcome, now()])?;
    Ok(())
}
