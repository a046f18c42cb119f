//! The ledger: this host's runs, the numbers of its processes, and its workers' records.
//!
//! A run is one host process using the services. Its workers are recorded under it, so a
//! worker left "running" by a host that died (killed, crashed) can be told from the
//! workers of a host still alive, and marked interrupted.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::ServiceError;

/// Runs, process numbers and worker records.
///
/// ```
/// use capstan_host::services::{Services, WorkerState};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let run = services.ledger.begin_run().await.unwrap();
/// let n = services.ledger.next_process_number("worker").await.unwrap();
/// services.ledger.worker_started(run.id(), "worker:1", "channel:main", "sort").await.unwrap();
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

    /// The next number of `kind` (e.g. `"worker"`): 1 the first time, then one more than
    /// the last number any run or host drew, so no two draws ever share a number.
    async fn next_process_number(&self, kind: &str) -> Result<u64, ServiceError>;

    /// Records a new running worker `id` of `run`, spawned by `channel` on `task`.
    async fn worker_started(
        &self,
        run: RunId,
        id: &str,
        channel: &str,
        task: &str,
    ) -> Result<(), ServiceError>;

    /// Sets worker `id`'s state and, if given, its outcome; [`ServiceError::NotFound`] if
    /// no such worker was recorded. An ended worker's record is final: moving it out of a
    /// terminal state is refused ([`worker_has_ended`]), so a late write cannot revive it.
    async fn set_worker_state(
        &self,
        id: &str,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError>;

    /// Worker `id`'s record.
    async fn worker(&self, id: &str) -> Result<Option<WorkerRecord>, ServiceError>;

    /// The `limit` workers started last, in any state, newest first.
    async fn workers(&self, limit: u32) -> Result<Vec<WorkerRecord>, ServiceError>;

    /// Marks every running or waiting worker whose run is over as
    /// [`WorkerState::Interrupted`] (outcome [`interrupted_outcome`]) and returns them,
    /// sorted by id. Workers of live runs, in this host or any other, are left alone.
    async fn mark_interrupted_workers(&self) -> Result<Vec<WorkerRecord>, ServiceError>;

    /// Returns once the end of every run this host dropped is recorded where other hosts
    /// see it, for a backend that records it after the drop; call it before the process
    /// exits. The default has nothing to wait for.
    async fn settle(&self) {}
}

/// A run's number, unique among the runs sharing the services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
}

impl Run {
    /// Run `id`, alive while `alive` is held.
    pub fn new(id: RunId, alive: impl Send + Sync + 'static) -> Self {
        Run {
            id,
            _alive: Box::new(alive),
        }
    }

    /// The run's id, for [`Ledger::worker_started`].
    pub fn id(&self) -> RunId {
        self.id
    }
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run").field("id", &self.id).finish()
    }
}

/// The refusal of changing worker `id`, which has ended in `state`.
pub fn worker_has_ended(id: &str, state: WorkerState) -> ServiceError {
    ServiceError::Invalid(format!(
        "worker {id} has ended ({state}); its record is final"
    ))
}

/// The refusal of recording worker `id` a second time.
pub fn worker_already_recorded(id: &str) -> ServiceError {
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
    pub id: String,
    /// The channel that spawned it.
    pub channel: String,
    /// The task description it was given.
    pub task: String,
    /// Where it stands.
    pub state: WorkerState,
    /// Its result or error, once ended.
    pub outcome: Option<String>,
}
