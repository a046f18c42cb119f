//! Runs, process numbers and worker records.
//!
//! A run is a lease row: its host renews `expires_at` every [`Lease::period`] on a
//! connection of its own, so a saturated pool cannot starve the renewal. A run is over
//! when its host ended it (the [`Run`] dropped) or when its lease expired by the
//! database's clock (the host died, or stopped renewing): only then are its workers
//! marked interrupted, by whichever host looks first.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio_postgres::{Client, NoTls, Row, Statement};

use super::inbox::forward_on;
use super::prepared::Prepared;
use super::rows::{parsed, readable};
use super::sessions::{Owner, run_is_live};
use super::{Ending, Lease, Postgres, now};
use crate::ids::{ProcessId, ProcessKind};
use crate::services::Operation;
use crate::services::{
    Forwarded, LeaseClock, Ledger, Run, RunId, ServiceError, WorkerRecord, WorkerState,
    interrupted_outcome, worker_already_recorded, worker_has_ended,
};

/// Keeps a run's lease while held; dropping it ends the run.
struct RunLease {
    id: i64,
    stop: Option<oneshot::Sender<()>>,
    ending: Arc<Ending>,
    owner: Arc<std::sync::Mutex<Owner>>,
}

impl Drop for RunLease {
    fn drop(&mut self) {
        // Over at once for this host; the renewer writes the end for the others (unless
        // it stopped already: the lease was lost, and is over for everyone).
        let mut ending = self.ending.runs.lock().unwrap();
        ending.insert(self.id);
        let renewer = self.stop.take().map(|stop| stop.send(()));
        if !matches!(renewer, Some(Ok(()))) {
            ending.remove(&self.id);
        }
        drop(ending);
        // The host's writes stay fenced by the run (refused once its end is written), never
        // unfenced: a late write of one of its processes lands nothing. Only its being held
        // ends here.
        let mut owner = self.owner.lock().unwrap();
        if owner.run == Some(RunId::new(self.id as u64)) {
            owner.held = false;
        }
        drop(owner);
        self.ending.written.notify_waiters();
    }
}

/// The connection a run's lease is renewed on: its own, made again when it is lost.
struct LeaseConnection {
    config: tokio_postgres::Config,
    lease: Lease,
    location: String,
    client: Option<Client>,
    /// The renewal, prepared on `client`.
    renewal: Option<Statement>,
}

/// What renews a run's lease: prepared once per lease connection.
const RENEWAL: &str = "UPDATE runs SET expires_at = now() + make_interval(secs => $2)
                       WHERE id = $1 AND ended_at IS NULL AND expires_at > now()";

impl LeaseConnection {
    /// The connection, made if there is none or it closed.
    async fn client(&mut self) -> Result<&Client, tokio_postgres::Error> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let (client, connection) = self.config.connect(NoTls).await?;
            let location = self.location.clone();
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    tracing::warn!(database = %location, "a run lease's connection ended: {err}");
                }
            });
            self.client = Some(client);
            self.renewal = None;
        }
        Ok(self.client.as_ref().expect("just made"))
    }

    /// Extends run `id`'s lease, if it is still live by the database's clock: whether it
    /// was. A lease that expired stays expired (the host's workers may have been marked
    /// interrupted by another host already).
    async fn renew(&mut self, id: i64) -> Result<bool, tokio_postgres::Error> {
        let renewed = self.renew_on_connection(id).await;
        if renewed.is_err() {
            // Made again at the next renewal.
            self.client = None;
        }
        Ok(renewed? == 1)
    }

    /// [`LeaseConnection::renew`] on the connection as it is: the rows changed.
    async fn renew_on_connection(&mut self, id: i64) -> Result<u64, tokio_postgres::Error> {
        let ttl = self.lease.ttl_seconds();
        self.client().await?;
        let client = self.client.as_ref().expect("just made");
        let renewal = match &self.renewal {
            Some(renewal) => renewal.clone(),
            None => self.renewal.insert(client.prepare(RENEWAL).await?).clone(),
        };
        client.execute(&renewal, &[&id, &ttl]).await
    }

    /// Writes run `id`'s end.
    async fn end(&mut self, id: i64) -> Result<(), tokio_postgres::Error> {
        self.client()
            .await?
            .execute("UPDATE runs SET ended_at = now() WHERE id = $1", &[&id])
            .await
            .map(drop)
    }
}

/// Renews run `id`'s lease every [`Lease::period`] until `stop`, then writes its end. Each
/// renewal, a new connection included, gets one period: a connection that hangs is
/// dropped and made again, and `stop` is heard meanwhile. A lease not renewed by `term`
/// (this host's clock) is over: the database may have been unreachable all along, and
/// once it is back other hosts may take this host's conversations.
async fn renew(
    mut lease: LeaseConnection,
    id: i64,
    clock: LeaseClock,
    mut term: Instant,
    mut stop: oneshot::Receiver<()>,
    ending: Arc<Ending>,
) {
    let terms = lease.lease;
    let period = terms.period();
    let mut tick = tokio::time::interval(period);
    tick.tick().await;
    let location = lease.location.clone();
    let out_of_term = || {
        format!(
            "it could not be renewed for {} s (the database unreachable)",
            terms.ttl().as_secs()
        )
    };
    let lost = |why: String| {
        clock.lose();
        tracing::error!(
            database = %location,
            run = id,
            "this host's run lease is over: {why}; other hosts may have marked its workers \
             interrupted and may answer its conversations, so it lands nothing more and stops"
        );
    };
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep_until(term.into()) => {
                return lost(out_of_term());
            }
            _ = tick.tick() => {}
        }
        let sent = Instant::now();
        let renewed = tokio::select! {
            _ = &mut stop => break,
            // A renewal that hangs past the term does not hold the loss back.
            _ = tokio::time::sleep_until(term.into()) => {
                return lost(out_of_term());
            }
            renewed = tokio::time::timeout(period, lease.renew(id)) => renewed,
        };
        match renewed {
            Ok(Ok(true)) => {
                term = terms.local_term(sent);
                clock.renewed(term);
                crate::telemetry::metrics().lease_renewed();
            }
            Ok(Ok(false)) => {
                return lost(format!(
                    "it expired before it was renewed (the host was paused or cut off for \
                     longer than {} s)",
                    terms.ttl().as_secs()
                ));
            }
            Ok(Err(err)) => {
                tracing::warn!(database = %location, run = id, "cannot renew the run's lease: {err}");
            }
            Err(_) => {
                lease.client = None;
                tracing::warn!(database = %location, run = id, "renewing the run's lease took longer than {} s; connecting again", period.as_secs());
            }
        }
    }
    match tokio::time::timeout(period, lease.end(id)).await {
        // Written: the database says it for every host now.
        Ok(Ok(())) => {
            ending.runs.lock().unwrap().remove(&id);
            ending.written.notify_waiters();
        }
        Ok(Err(err)) => {
            tracing::warn!(database = %location, run = id, "cannot record the run's end (its lease expires instead): {err}");
        }
        Err(_) => {
            tracing::warn!(database = %location, run = id, "recording the run's end timed out (its lease expires instead)");
        }
    }
    // Written or not, nobody waits for it any more.
    ending.runs.lock().unwrap().remove(&id);
    ending.written.notify_waiters();
}

fn worker_from(row: &Row) -> Result<WorkerRecord, ServiceError> {
    Ok(WorkerRecord {
        id: parsed(row, 0)?,
        channel: parsed(row, 1)?,
        task: row.get(2),
        state: parsed(row, 3)?,
        outcome: row.get(4),
    })
}

/// This machine's name, for the runs table.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

impl Postgres {
    /// Records worker `id` of `run` for `channel`, fenced by the channel's owner, under a
    /// live run, and with `limit`, only while fewer workers of the channel are working.
    async fn record_worker(
        &self,
        run: RunId,
        worker: &ProcessId,
        channel: &ProcessId,
        task: &str,
        limit: Option<u32>,
    ) -> Result<(), ServiceError> {
        let (id, channel) = (worker.to_string(), channel.to_string());
        let channel = channel.as_str();
        // The run must own the worker's channel: a worker started for a conversation
        // another host took over would report to nobody.
        let refused = |err: ServiceError| match err {
            ServiceError::Invalid(why) => {
                ServiceError::Invalid(format!("worker {id} cannot start: {why}"))
            }
            other => other,
        };
        let fence = self.fence(channel, Some(run)).await.map_err(refused)?;
        let what = match limit {
            Some(_) => Operation::LedgerAdmitWorker,
            None => Operation::LedgerWorkerStarted,
        };
        let failed = |err| self.failed(what, err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        self.hold(&tx, channel, fence).await.map_err(refused)?;
        if let Some(limit) = limit {
            self.check_admission(&tx, channel, limit)
                .await
                .map_err(refused)?;
        }
        // Only under a live run: a host whose lease expired may have had its workers
        // marked interrupted already, and a worker started under it would never be.
        let sql = format!(
            "INSERT INTO workers (id, channel, task, state, run, started_at, updated_at)
             SELECT $1, $2, $3, $4, $5, $6, $6 WHERE {}
             ON CONFLICT (id) DO NOTHING RETURNING id",
            run_is_live("$5")
        );
        let inserted = tx
            .query_opt_cached(
                &sql,
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
            .map_err(failed)?;
        if inserted.is_some() {
            return Ok(tx.commit().await.map_err(failed)?);
        }
        let exists = tx
            .query_opt_cached("SELECT 1 FROM workers WHERE id = $1", &[&id])
            .await
            .map_err(failed)?;
        match exists {
            Some(_) => Err(worker_already_recorded(worker)),
            None => Err(ServiceError::Invalid(format!(
                "{run} is over (ended, or its lease expired): worker {id} cannot start under it; \
                 the host must start a new run"
            ))),
        }
    }

    /// Refuses unless `channel` has fewer than `limit` workers working under live runs.
    /// Admissions to one channel wait for each other (a lock for the transaction), so the
    /// count holds until the new worker's row commits.
    async fn check_admission(
        &self,
        tx: &deadpool_postgres::Transaction<'_>,
        channel: &str,
        limit: u32,
    ) -> Result<(), ServiceError> {
        let failed = |err| self.failed(Operation::LedgerAdmitWorker, err);
        tx.execute_cached(
            "SELECT pg_advisory_xact_lock(hashtext('capstan.workers:' || $1))",
            &[&channel],
        )
        .await
        .map_err(failed)?;
        let working: i64 = tx
            .query_one_cached(
                &format!(
                    "SELECT count(*) FROM workers w
                     WHERE w.channel = $1 AND w.state IN ($2, $3) AND {}",
                    run_is_live("w.run")
                ),
                &[
                    &channel,
                    &WorkerState::Running.as_str(),
                    &WorkerState::WaitingForInput.as_str(),
                ],
            )
            .await
            .map_err(failed)?
            .get(0);
        if working >= i64::from(limit) {
            return Err(ServiceError::Invalid(format!(
                "{channel} has {working} workers working among the hosts, the most \
                 limits.max_workers_per_channel ({limit}) allows"
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl Ledger for Postgres {
    async fn begin_run(&self) -> Result<Run, ServiceError> {
        let mut lease = LeaseConnection {
            config: self.config.clone(),
            lease: self.lease,
            location: self.location.clone(),
            client: None,
            renewal: None,
        };
        let client = lease.client().await.map_err(|err| self.unreachable(err))?;
        let sent = Instant::now();
        let row = client
            .query_one(
                "INSERT INTO runs (host, pid, expires_at)
                 VALUES ($1, $2, now() + make_interval(secs => $3)) RETURNING id",
                &[
                    &host_name(),
                    &i64::from(std::process::id()),
                    &self.lease.ttl_seconds(),
                ],
            )
            .await
            .map_err(|err| self.failed(Operation::LedgerBeginRun, err))?;
        let id: i64 = row.get(0);
        let (stop, stopped) = oneshot::channel();
        let term = self.lease.local_term(sent);
        let clock = LeaseClock::new(term);
        tokio::spawn(renew(
            lease,
            id,
            clock.clone(),
            term,
            stopped,
            self.ending.clone(),
        ));
        *self.owner.lock().unwrap() = Owner {
            run: Some(RunId::new(id as u64)),
            held: true,
            ..Owner::default()
        };
        let lease = RunLease {
            id,
            stop: Some(stop),
            ending: self.ending.clone(),
            owner: self.owner.clone(),
        };
        Ok(Run::leased(RunId::new(id as u64), lease, clock))
    }

    async fn reserve_task(
        &self,
        run: RunId,
        key: &str,
        worker: &ProcessId,
    ) -> Result<Option<ProcessId>, ServiceError> {
        self.reserve_task_row(run, key, worker).await
    }

    async fn release_task(&self, key: &str, worker: &ProcessId) -> Result<(), ServiceError> {
        self.release_task_row(key, worker).await
    }

    async fn next_process_number(&self, kind: ProcessKind) -> Result<u64, ServiceError> {
        let kind = kind.as_str();
        let client = self.client().await?;
        let row = client
            .query_one_cached(
                "INSERT INTO counters (kind, last) VALUES ($1, 1)
                 ON CONFLICT (kind) DO UPDATE SET last = counters.last + 1
                 RETURNING last",
                &[&kind],
            )
            .await
            .map_err(|err| self.failed(Operation::LedgerNextProcessNumber, err))?;
        Ok(row.get::<_, i64>(0) as u64)
    }

    async fn worker_started(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), ServiceError> {
        self.record_worker(run, id, channel, task, None).await
    }

    async fn admit_worker(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
        limit: u32,
    ) -> Result<(), ServiceError> {
        self.record_worker(run, id, channel, task, Some(limit))
            .await
    }

    async fn set_worker_state(
        &self,
        id: &ProcessId,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError> {
        let failed = |err| self.failed(Operation::LedgerSetWorkerState, err);
        let ended = |current| worker_has_ended(id, current);
        let id = id.to_string();
        // A worker's channel never changes: read first, and let go of the connection, so
        // the fence's claim never waits for a second one while holding the first.
        let channel: String = match self
            .client()
            .await?
            .query_opt_cached("SELECT channel FROM workers WHERE id = $1", &[&id])
            .await
            .map_err(failed)?
        {
            Some(row) => row.get(0),
            None => {
                return Err(ServiceError::NotFound(format!(
                    "worker {id} does not exist"
                )));
            }
        };
        // A late result of a host that lost the worker's conversation lands nothing.
        let fence = self.fence(&channel, None).await?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        self.hold(&tx, &channel, fence).await?;
        let current = tx
            .query_one_cached("SELECT state FROM workers WHERE id = $1 FOR UPDATE", &[&id])
            .await
            .map_err(failed)?;
        let current: WorkerState = current.get::<_, String>(0).parse()?;
        if current.is_terminal() && state != current {
            return Err(ended(current));
        }
        tx.execute_cached(
            "UPDATE workers SET state = $2, outcome = COALESCE($3, outcome), updated_at = $4
             WHERE id = $1",
            &[&id, &state.as_str(), &outcome, &now()],
        )
        .await
        .map_err(failed)?;
        Ok(tx.commit().await.map_err(failed)?)
    }

    async fn worker(&self, id: &ProcessId) -> Result<Option<WorkerRecord>, ServiceError> {
        let id = id.to_string();
        let client = self.client().await?;
        let row = client
            .query_opt_cached(
                "SELECT id, channel, task, state, outcome FROM workers WHERE id = $1",
                &[&id],
            )
            .await
            .map_err(|err| self.failed(Operation::LedgerWorker, err))?;
        row.as_ref().map(worker_from).transpose()
    }

    async fn workers(&self, limit: u32) -> Result<Vec<WorkerRecord>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query_cached(
                "SELECT id, channel, task, state, outcome FROM workers
                 ORDER BY started DESC LIMIT $1",
                &[&i64::from(limit)],
            )
            .await
            .map_err(|err| self.failed(Operation::LedgerWorkers, err))?;
        Ok(readable("a worker record", &rows, worker_from))
    }

    async fn settle(&self) {
        // Each end is written within one period, or given up on (the lease expires).
        let deadline = tokio::time::Instant::now() + 2 * self.lease.period();
        loop {
            let written = self.ending.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            // A run still held ends soon (its runtime is being dropped): wait for it too.
            let held = self.owner.lock().unwrap().held;
            if !held && self.ending.runs.lock().unwrap().is_empty() {
                return;
            }
            if tokio::time::timeout_at(deadline, written).await.is_err() {
                return;
            }
        }
    }

    async fn mark_interrupted_workers(&self) -> Result<Vec<WorkerRecord>, ServiceError> {
        let ending: Vec<i64> = self.ending.runs.lock().unwrap().iter().copied().collect();
        let working = [
            WorkerState::Running.as_str(),
            WorkerState::WaitingForInput.as_str(),
        ];
        let failed = |err| self.failed(Operation::LedgerMarkInterruptedWorkers, err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        let over = tx
            .query_cached(
                "SELECT DISTINCT w.run FROM workers w JOIN runs r ON r.id = w.run
                 WHERE w.state IN ($1, $2)
                   AND (r.ended_at IS NOT NULL OR r.expires_at <= now() OR r.id = ANY($3))
                 ORDER BY w.run",
                &[&working[0], &working[1], &ending],
            )
            .await
            .map_err(failed)?;
        let runs: Vec<i64> = over.iter().map(|row| row.get(0)).collect();
        // Locked in id order, so two hosts marking at once wait for each other instead of
        // deadlocking; the rows another host marked meanwhile are no longer working.
        tx.execute_cached(
            "SELECT 1 FROM workers WHERE run = ANY($1) AND state IN ($2, $3)
             ORDER BY id FOR UPDATE",
            &[&runs, &working[0], &working[1]],
        )
        .await
        .map_err(failed)?;
        let mut marked = Vec::new();
        for run in runs {
            let rows = tx
                .query_cached(
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
                // Marked all the same; one whose record does not read back is only not
                // reported, and never stops the others' being marked.
                let worker = match worker_from(row) {
                    Ok(worker) => worker,
                    Err(err) => {
                        tracing::warn!("a worker marked interrupted is not reported: {err}");
                        continue;
                    }
                };
                // Its conversation hears of it from whichever host answers it, even if
                // this one dies before saying anything.
                let lost = Forwarded::WorkerLost {
                    worker: worker.id.clone(),
                    outcome: worker.outcome.clone().unwrap_or_default(),
                };
                forward_on(&tx, worker.channel.session().as_str(), &lost)
                    .await
                    .map_err(failed)?;
                marked.push(worker);
            }
        }
        tx.commit().await.map_err(failed)?;
        marked.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(marked)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_cluster::{TestCluster, admin};
    use super::*;

    /// A lease connection to `url`, driven by the test.
    fn lease_on(url: &str, host: &Postgres) -> LeaseConnection {
        LeaseConnection {
            config: url.parse().unwrap(),
            lease: host.lease,
            location: host.location.clone(),
            client: None,
            renewal: None,
        }
    }

    async fn expires_in_past(db: &Client, id: i64) -> bool {
        db.query_one("SELECT expires_at <= now() FROM runs WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_expired_lease_is_never_renewed_and_no_worker_starts_under_it() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let host = Postgres::connect(&url).await.unwrap();
        let run = host.begin_run().await.unwrap();
        let id = run.id().get() as i64;
        let db = admin(&url).await;
        db.execute(
            "UPDATE runs SET expires_at = now() - interval '1 second' WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
        // What the renewer does at its next tick, done here at once.
        let mut lease = lease_on(&url, &host);
        assert!(!lease.renew(id).await.unwrap(), "reported lost");
        assert!(expires_in_past(&db, id).await, "and left expired");
        let refused = host
            .worker_started(
                run.id(),
                &crate::ids::testing::pid("worker:1"),
                &crate::ids::testing::pid("channel:main"),
                "t",
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("is over") && refused.contains("worker:1"),
            "{refused}"
        );
        assert_eq!(
            host.worker(&crate::ids::testing::pid("worker:1"))
                .await
                .unwrap(),
            None
        );
        // The host's own renewer finds the lease lost at its next tick, and says so.
        assert!(
            run.is_live(),
            "by the host's clock, until the renewer looks"
        );
        run.lost().await;
        assert!(!run.is_live());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_whose_connection_was_killed_connects_again() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let host = Postgres::connect(&url).await.unwrap();
        let run = host.begin_run().await.unwrap();
        let id = run.id().get() as i64;
        let mut lease = lease_on(&url, &host);
        assert!(lease.renew(id).await.unwrap());
        let db = admin(&url).await;
        let killed: i64 = db
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE pid <> pg_backend_pid() AND datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            killed >= 2,
            "the pool's and the leases' connections: {killed}"
        );
        // The first renewal may find the connection dead and fail; the next connects anew.
        let first = lease.renew(id).await;
        let renewed = match first {
            Ok(renewed) => renewed,
            Err(_) => lease.renew(id).await.unwrap(),
        };
        assert!(renewed);
        drop(run);
    }
}
