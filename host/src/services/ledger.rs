//! The ledger: this host's runs, the numbers of its processes, and its workers' records.
//!
//! A run is one host process using the services. Its workers are recorded under it, so a
//! worker left "running" by a host that died (killed, crashed) can be told from the
//! workers of a host still alive, and marked interrupted.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::ServiceError;
use crate::ids::{ProcessId, ProcessKind};

/// Runs, process numbers and worker records.
///
/// ```
/// use capstan_host::ids::{ProcessId, ProcessKind};
/// use capstan_host::services::{Services, WorkerState};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let run = services.ledger.begin_run().await.unwrap();
/// let n = services.ledger.next_process_number(ProcessKind::Worker).await.unwrap();
/// let worker = ProcessId::numbered(ProcessKind::Worker, n);
/// let main = ProcessId::channel("main");
/// services.ledger.worker_started(run.id(), &worker, &main, "sort").await.unwrap();
/// // This run is alive: its worker is left alone.
/// assert!(services.ledger.mark_interrupted_workers().await.unwrap().is_empty());
/// drop(run);
/// let marked = services.ledger.mark_interrupted_workers().await.unwrap();
/// assert_eq!((n, marked[0].state), (1, WorkerState::Interrupted));
/// # });
/// ```
#[async_trait]
pub trait Ledger: Send + Sync {
    /// Starts a run of this host; it lasts until the returned [`Run`] is dropped, or the
    /// host dies.
    async fn begin_run(&self) -> Result<Run, ServiceError>;

    /// The next number of `kind` (e.g. a worker): 1 the first time, then one more than
    /// the last number any run or host drew, so no two draws ever share a number.
    async fn next_process_number(&self, kind: ProcessKind) -> Result<u64, ServiceError>;

    /// Records a new running worker `id` of `run`, spawned by `channel` on `task`.
    async fn worker_started(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), ServiceError>;

    /// Records a new running worker as [`Ledger::worker_started`] does, if `channel` has
    /// fewer than `limit` workers running or waiting (of live runs) among every host
    /// sharing the store; the count and the record are one step, so hosts admitting at
    /// once never pass the limit between them. The default only records: a store one host
    /// uses alone leaves admission to the host's own count.
    async fn admit_worker(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
        limit: u32,
    ) -> Result<(), ServiceError> {
        let _ = limit;
        self.worker_started(run, id, channel, task).await
    }

    /// Sets worker `id`'s state and, if given, its outcome; [`ServiceError::NotFound`] if
    /// no such worker was recorded. An ended worker's record is final: moving it out of a
    /// terminal state is refused ([`worker_has_ended`]), so a late write cannot revive it.
    async fn set_worker_state(
        &self,
        id: &ProcessId,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError>;

    /// Worker `id`'s record.
    async fn worker(&self, id: &ProcessId) -> Result<Option<WorkerRecord>, ServiceError>;

    /// The `limit` workers started last, in any state, newest first.
    async fn workers(&self, limit: u32) -> Result<Vec<WorkerRecord>, ServiceError>;

    /// Marks every running or waiting worker whose run is over as
    /// [`WorkerState::Interrupted`] (outcome [`interrupted_outcome`]) and returns them,
    /// sorted by id. Workers of live runs, in this host or any other, are left alone.
    async fn mark_interrupted_workers(&self) -> Result<Vec<WorkerRecord>, ServiceError>;

    /// Reserves task `key` (a normalized task description) for `worker`, of `run`, among
    /// every host sharing the store: `None` when reserved, or the worker that holds it (a
    /// worker that has not ended, of a run that is live). A backend one host uses alone
    /// reserves nothing here (the default): the runtime's own reservations decide.
    async fn reserve_task(
        &self,
        run: RunId,
        key: &str,
        worker: &ProcessId,
    ) -> Result<Option<ProcessId>, ServiceError> {
        let _ = (run, key, worker);
        Ok(None)
    }

    /// Releases `worker`'s reservation of task `key`, once it ended. A reservation whose
    /// worker ended or whose run is over is free anyway; releasing only makes it so sooner.
    async fn release_task(&self, key: &str, worker: &ProcessId) -> Result<(), ServiceError> {
        let _ = (key, worker);
        Ok(())
    }

    /// Returns once the end of every run this host dropped is recorded where other hosts
    /// see it, for a backend that records it after the drop; call it before the process
    /// exits. The default has nothing to wait for.
    async fn settle(&self) {}
}

/// A run's number, unique among the runs sharing the services. Its JSON form is the
/// number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(u64);

impl RunId {
    /// The run numbered `number`.
    pub fn new(number: u64) -> Self {
        RunId(number)
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run:{}", self.0)
    }
}

/// A live run: the run lasts while this is held. Keep it for as long as the run's workers
/// may be running; dropping it says they are not.
pub struct Run {
    id: RunId,
    // Whatever keeps the run alive in its backend (a lock, a token); dropped with the run.
    _alive: Box<dyn Send + Sync>,
    /// The lease's term by this host's clock, for a backend whose runs expire.
    lease: Option<LeaseClock>,
}

impl Run {
    /// Run `id`, alive while `alive` is held, and never expiring meanwhile.
    pub fn new(id: RunId, alive: impl Send + Sync + 'static) -> Self {
        Run {
            id,
            _alive: Box::new(alive),
            lease: None,
        }
    }

    /// Run `id`, alive while `alive` is held and `lease` says so.
    pub fn leased(id: RunId, alive: impl Send + Sync + 'static, lease: LeaseClock) -> Self {
        Run {
            id,
            _alive: Box::new(alive),
            lease: Some(lease),
        }
    }

    /// The run's id, for [`Ledger::worker_started`].
    pub fn id(&self) -> RunId {
        self.id
    }

    /// Whether this host may act for the run now: its lease is live by this host's clock,
    /// judged on the safe side of the database's. Checked before each model request, so
    /// a host paused past its lease sends nothing more once it sees it.
    pub fn is_live(&self) -> bool {
        self.lease.as_ref().is_none_or(LeaseClock::is_live)
    }

    /// The run's lease as this host sees it, for a backend whose runs expire.
    pub fn lease(&self) -> Option<&LeaseClock> {
        self.lease.as_ref()
    }

    /// Returns once the run's lease is lost for good (it expired before it was renewed:
    /// other hosts may have taken its sessions and marked its workers interrupted). A run
    /// that does not expire: never.
    pub async fn lost(&self) {
        match &self.lease {
            Some(lease) => lease.lost().await,
            None => std::future::pending().await,
        }
    }
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run").field("id", &self.id).finish()
    }
}

/// A run's lease as its host sees it: live until an instant of the host's own monotonic
/// clock, pushed on by each renewal; or lost for good. The backend that renews the lease
/// keeps a clone, and sets each term shorter than the database grants, so the host stops
/// acting before another host may take over.
#[derive(Debug, Clone)]
pub struct LeaseClock(Arc<tokio::sync::watch::Sender<LeaseTerm>>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseTerm {
    Until(Instant),
    Lost,
}

impl LeaseClock {
    /// A lease live until `until`.
    pub fn new(until: Instant) -> Self {
        LeaseClock(Arc::new(tokio::sync::watch::Sender::new(LeaseTerm::Until(
            until,
        ))))
    }

    /// Extends the lease to `until` (never shortens it; a lost lease stays lost).
    pub fn renewed(&self, until: Instant) {
        self.0.send_if_modified(|term| match term {
            LeaseTerm::Until(old) if *old < until => {
                *old = until;
                true
            }
            _ => false,
        });
    }

    /// Marks the lease lost for good.
    pub fn lose(&self) {
        self.0.send_replace(LeaseTerm::Lost);
    }

    /// Whether the lease is live now.
    pub fn is_live(&self) -> bool {
        matches!(*self.0.borrow(), LeaseTerm::Until(until) if Instant::now() < until)
    }

    /// Returns once the lease is lost.
    pub async fn lost(&self) {
        let mut term = self.0.subscribe();
        // The sender lives in `self`, so the wait ends only with a loss.
        let _ = term.wait_for(|term| *term == LeaseTerm::Lost).await;
    }
}

/// The refusal of changing worker `id`, which has ended in `state`.
pub fn worker_has_ended(id: &ProcessId, state: WorkerState) -> ServiceError {
    ServiceError::Invalid(format!(
        "worker {id} has ended ({state}); its record is final"
    ))
}

/// The refusal of recording worker `id` a second time.
pub fn worker_already_recorded(id: &ProcessId) -> ServiceError {
    ServiceError::Invalid(format!(
        "worker {id} is already recorded; worker ids come from next_process_number and are never reused"
    ))
}

/// The outcome recorded for a worker whose `run` ended while it was working.
pub fn interrupted_outcome(run: RunId) -> String {
    format!("interrupted: its {run} ended while it was working")
}

/// A worker's state. Its JSON form is its name in kebab-case ([`WorkerState::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum WorkerState {
    /// Working.
    Running,
    /// Asked for input and waits for it.
    WaitingForInput,
    /// Finished with a result.
    Done,
    /// Stopped by an error.
    Failed,
    /// Stopped on request.
    Cancelled,
    /// Its run ended (the host was stopped or killed) while it was running or waiting.
    Interrupted,
}

impl WorkerState {
    const ALL: [WorkerState; 6] = [
        WorkerState::Running,
        WorkerState::WaitingForInput,
        WorkerState::Done,
        WorkerState::Failed,
        WorkerState::Cancelled,
        WorkerState::Interrupted,
    ];

    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::WaitingForInput => "waiting-for-input",
            WorkerState::Done => "done",
            WorkerState::Failed => "failed",
            WorkerState::Cancelled => "cancelled",
            WorkerState::Interrupted => "interrupted",
        }
    }

    /// Whether the worker has ended.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkerState::Done
                | WorkerState::Failed
                | WorkerState::Cancelled
                | WorkerState::Interrupted
        )
    }
}

impl fmt::Display for WorkerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkerState {
    type Err = ServiceError;

    fn from_str(text: &str) -> Result<Self, ServiceError> {
        WorkerState::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| ServiceError::Invalid(format!("unknown worker state `{text}`")))
    }
}

/// A stored worker record.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct WorkerRecord {
    /// e.g. `worker:3`.
    #[schema(value_type = String)]
    pub id: ProcessId,
    /// The channel that spawned it.
    #[schema(value_type = String)]
    pub channel: ProcessId,
    /// The task description it was given.
    pub task: String,
    /// Where it stands.
    pub state: WorkerState,
    /// Its result or error, once ended.
    pub outcome: Option<String>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_lease_is_live_until_its_term_and_lost_for_good() {
        let now = Instant::now();
        let lease = LeaseClock::new(now + Duration::from_secs(60));
        let run = Run::leased(RunId::new(1), (), lease.clone());
        assert!(run.is_live());
        // A renewal never shortens the term.
        lease.renewed(now);
        assert!(run.is_live());
        let ended = LeaseClock::new(now);
        assert!(!ended.is_live(), "over once its term is past");
        ended.renewed(now + Duration::from_secs(60));
        assert!(ended.is_live(), "until renewed");

        let waiting = tokio::spawn({
            let lease = lease.clone();
            async move { lease.lost().await }
        });
        lease.lose();
        waiting.await.unwrap();
        lease.renewed(now + Duration::from_secs(3600));
        assert!(!run.is_live(), "a lost lease stays lost");
        run.lost().await;
        assert!(
            Run::new(RunId::new(2), ()).is_live(),
            "a run without a lease"
        );
    }
}
