//! Runs, process numbers and worker records.
//!
//! A run is a lease row: its host renews `expires_at` every [`LEASE_PERIOD`] on a
//! connection of its own, so a saturated pool cannot starve the renewal. A run is over
//! when its host ended it (the [`Run`] dropped) or when its lease expired by the
//! database's clock (the host died, or stopped renewing): only then are its workers
//! marked interrupted, by whichever host looks first.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio_postgres::{Client, NoTls, Row};

use super::{PgError, Postgres, now};
use crate::services::{
    Ledger, Run, RunId, ServiceError, WorkerRecord, WorkerState, interrupted_outcome,
    worker_already_recorded, worker_has_ended,
};

/// How often a run's lease is renewed.
const LEASE_PERIOD: Duration = Duration::from_secs(5);

/// How long a lease lasts unrenewed: three periods, so one slow renewal loses nothing.
const LEASE_TTL_SECONDS: f64 = 15.0;

/// Keeps a run's lease while held; dropping it ends the run.
struct RunLease {
    id: i64,
    stop: Option<oneshot::Sender<()>>,
    ending: Arc<Mutex<HashSet<i64>>>,
}

impl Drop for RunLease {
    fn drop(&mut self) {
        // Over at once for this host; the renewer writes the end for the others.
        self.ending.lock().unwrap().insert(self.id);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Renews run `id`'s lease until `stop`, then writes its end.
async fn renew(
    client: Client,
    id: i64,
    mut stop: oneshot::Receiver<()>,
    ending: Arc<Mutex<HashSet<i64>>>,
    location: String,
) {
    let mut tick = tokio::time::interval(LEASE_PERIOD);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                let renewed = client
                    .execute(
                        "UPDATE runs SET expires_at = now() + make_interval(secs => $2)
                         WHERE id = $1 AND ended_at IS NULL",
                        &[&id, &LEASE_TTL_SECONDS],
                    )
                    .await;
                if let Err(err) = renewed {
                    tracing::warn!(database = %location, run = id, "cannot renew the run's lease: {err}");
                }
            }
        }
    }
    let ended = client
        .execute("UPDATE runs SET ended_at = now() WHERE id = $1", &[&id])
        .await;
    match ended {
        // Written: the database says it for every host now.
        Ok(_) => {
            ending.lock().unwrap().remove(&id);
        }
        Err(err) => {
            tracing::warn!(database = %location, run = id, "cannot record the run's end (its lease expires instead): {err}");
        }
    }
}

fn worker_from(row: &Row) -> Result<WorkerRecord, ServiceError> {
    let state: String = row.get(3);
    Ok(WorkerRecord {
        id: row.get(0),
        channel: row.get(1),
        task: row.get(2),
        state: state.parse()?,
        outcome: row.get(4),
    })
}

/// This machine's name, for the runs table.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

#[async_trait]
impl Ledger for Postgres {
    async fn begin_run(&self) -> Result<Run, ServiceError> {
        let (client, connection) =
            self.config
                .connect(NoTls)
                .await
                .map_err(|err| PgError::Pool {
                    location: self.location.clone(),
                    reason: err.to_string(),
                })?;
        let location = self.location.clone();
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::warn!(database = %location, "the run lease's connection ended: {err}");
            }
        });
        let row = client
            .query_one(
                "INSERT INTO runs (host, pid, expires_at)
                 VALUES ($1, $2, now() + make_interval(secs => $3)) RETURNING id",
                &[
                    &host_name(),
                    &i64::from(std::process::id()),
                    &LEASE_TTL_SECONDS,
                ],
            )
            .await
            .map_err(|err| self.failed("ledger.begin_run", err))?;
        let id: i64 = row.get(0);
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(renew(
            client,
            id,
            stopped,
            self.ending.clone(),
            self.location.clone(),
        ));
        let lease = RunLease {
            id,
            stop: Some(stop),
            ending: self.ending.clone(),
        };
        Ok(Run::new(RunId::new(id as u64), lease))
    }

    async fn next_process_number(&self, kind: &str) -> Result<u64, ServiceError> {
        if kind.is_empty() {
            return Err(ServiceError::Invalid(
                "a process-number kind must not be empty".into(),
            ));
        }
        let client = self.client().await?;
        let row = client
            .query_one(
                "INSERT INTO counters (kind, last) VALUES ($1, 1)
                 ON CONFLICT (kind) DO UPDATE SET last = counters.last + 1
                 RETURNING last",
                &[&kind],
            )
            .await
            .map_err(|err| self.failed("ledger.next_process_number", err))?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn worker_started(
        &self,
        run: RunId,
        id: &str,
        channel: &str,
        task: &str,
    ) -> Result<(), ServiceError> {
        let client = self.client().await?;
        let inserted = client
            .query_opt(
                "INSERT INTO workers (id, channel, task, state, run, started_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $6)
                 ON CONFLICT (id) DO NOTHING RETURNING id",
                &[
                    &id,
                    &channel,
                    &task,
                    &WorkerState::Running.as_str(),
                    &(run.get() as i64),
                    &now(),
                ],
            )
            .await
            .map_err(|err| self.failed("ledger.worker_started", err))?;
        match inserted {
            Some(_) => Ok(()),
            None => Err(worker_already_recorded(id)),
        }
    }

    async fn set_worker_state(
        &self,
        id: &str,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError> {
        let failed = |err| self.failed("ledger.set_worker_state", err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let current = tx
            .query_opt("SELECT state FROM workers WHERE id = $1 FOR UPDATE", &[&id])
            .await
            .map_err(failed)?;
        let Some(current) = current else {
            return Err(ServiceError::NotFound(format!(
                "worker {id} does not exist"
            )));
        };
        let current: WorkerState = current.get::<_, String>(0).parse()?;
        if current.is_terminal() && state != current {
            return Err(worker_has_ended(id, current));
        }
        tx.execute(
            "UPDATE workers SET state = $2, outcome = COALESCE($3, outcome), updated_at = $4
             WHERE id = $1",
            &[&id, &state.as_str(), &outcome, &now()],
        )
        .await
        .map_err(failed)?;
        Ok(tx.commit().await.map_err(failed)?)
    }

    async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>, ServiceError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT id, channel, task, state, outcome FROM workers WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(|err| self.failed("ledger.worker", err))?;
        row.as_ref().map(worker_from).transpose()
    }

    async fn workers(&self, limit: u32) -> Result<Vec<WorkerRecord>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, channel, task, state, outcome FROM workers
                 ORDER BY started DESC LIMIT $1",
                &[&i64::from(limit)],
            )
            .await
            .map_err(|err| self.failed("ledger.workers", err))?;
        rows.iter().map(worker_from).collect()
    }

    async fn mark_interrupted_workers(&self) -> Result<Vec<WorkerRecord>, ServiceError> {
        let ending: Vec<i64> = self.ending.lock().unwrap().iter().copied().collect();
        let working = [
            WorkerState::Running.as_str(),
            WorkerState::WaitingForInput.as_str(),
        ];
        let failed = |err| self.failed("ledger.mark_interrupted_workers", err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let over = tx
            .query(
                "SELECT DISTINCT w.run FROM workers w JOIN runs r ON r.id = w.run
                 WHERE w.state IN ($1, $2)
                   AND (r.ended_at IS NOT NULL OR r.expires_at < now() OR r.id = ANY($3))",
                &[&working[0], &working[1], &ending],
            )
            .await
            .map_err(failed)?;
        let mut marked = Vec::new();
        for row in over {
            let run: i64 = row.get(0);
            // Only the rows still working: another host marking at once takes the rest.
            let rows = tx
                .query(
                    "UPDATE workers SET state = $2, outcome = $3, updated_at = $4
                     WHERE run = $1 AND state IN ($5, $6)
                     RETURNING id, channel, task, state, outcome",
                    &[
                        &run,
                        &WorkerState::Interrupted.as_str(),
                        &interrupted_outcome(RunId::new(run as u64)),
                        &now(),
                        &working[0],
                        &working[1],
                    ],
                )
                .await
                .map_err(failed)?;
            for row in &rows {
                marked.push(worker_from(row)?);
            }
        }
        tx.commit().await.map_err(failed)?;
        marked.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(marked)
    }
}
