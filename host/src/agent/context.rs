//! [`Context`]: what the processes of one agent share, and everything a process may ask of
//! the runtime: its config and the tool router; its handles for asking the model
//! ([`ModelGate`]), for telling what it does ([`Reporter`]), for its conversation's store
//! ([`Conversations`]) and for a worker's records ([`WorkerRecords`]); starting and
//! reaching other processes. No process
//! reaches into the services behind the handles.
//!
//! Processes (channel, branch, worker, compactor) depend on this module and on the modules
//! below it, never on each other's modules (but for the channel running the compactor
//! inside its own turn) or on [`Runtime`](super::Runtime). Starting a
//! process is the one thing that needs the process modules; the runtime hands the context
//! a [`Starter`] that does it.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::audience::Scope;
use super::conversations::{ConversationError, Conversations};
use super::events::{Event, EventSink};
use super::inbox::{ChannelHandle, ChannelInput};
use super::model_gate::ModelGate;
use super::reporter::{Audiences, Reporter};
use super::reservations::{Reservation, TaskReservations, task_key};
use super::spill::Spill;
use super::supervisor::{ShuttingDown, Supervisor};
use super::worker_records::WorkerRecords;
use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::ids::ProcessId;
use crate::llm::{Message, Provider};
use crate::plugin::Registry;
use crate::policy::ProcessKind;
use crate::services::{Run, RunId, ServiceError, Services, TaskPatch, WorkerState};
use crate::tools::{ToolCatalog, ToolRouter};

/// What the processes of one agent share.
pub(crate) struct Context {
    pub(crate) config: Config,
    /// Where each tool call goes, and which tools each kind is offered.
    pub(crate) router: Arc<ToolRouter>,
    /// The services, for starting processes and for the runtime; processes use the
    /// handles below.
    pub(crate) services: Services,
    /// How processes ask the model.
    pub(crate) gate: Arc<ModelGate>,
    /// Which processes are alive.
    pub(crate) supervisor: Arc<Supervisor>,
    /// How processes tell what they do.
    pub(crate) reporter: Arc<Reporter>,
    /// What workers write of themselves in the ledger.
    pub(crate) workers: WorkerRecords,
    /// What conversations ask of the store.
    pub(crate) conversations: Conversations,
    /// Task descriptions held by live workers.
    pub(crate) reservations: Arc<TaskReservations>,
    /// Held while a conversation is opened: its history is read before it is registered,
    /// and no other caller may open it from a read of its own in between.
    opening: tokio::sync::Mutex<()>,
    /// This host's run in the ledger: owns the worker records it writes, and tells a later
    /// start whether this run is still alive.
    run: Arc<Run>,
    starter: Box<dyn Starter>,
    /// Whether this host takes over conversations whose owner's run is over, with what
    /// was forwarded to them.
    pub(crate) adopts: std::sync::atomic::AtomicBool,
    /// What the start found of runs that ended before it (their workers, interrupted):
    /// no exchange waits on it, so a door shows it as it starts.
    pub(crate) found_at_start: Vec<Event>,
}

/// Starts processes: implemented above the process modules (by the runtime), so that
/// they reach each other only through the [`Context`].
pub(crate) trait Starter: Send + Sync {
    /// Runs conversation `id`'s loop over `inbox`, from its stored `history`.
    fn channel(
        &self,
        ctx: &Arc<Context>,
        id: ProcessId,
        handle: ChannelHandle,
        inbox: mpsc::UnboundedReceiver<ChannelInput>,
        history: Vec<Message>,
    );

    /// Runs a worker, supervised, for `channel`.
    fn worker(
        &self,
        ctx: &Arc<Context>,
        spec: WorkerSpec,
        channel: ChannelHandle,
        reservation: Reservation,
    );

    /// Runs a branch, supervised, for `channel`.
    fn branch(&self, ctx: &Arc<Context>, spec: BranchSpec, channel: ChannelHandle);
}

/// What a worker is started with.
pub(crate) struct WorkerSpec {
    pub(crate) id: ProcessId,
    /// The conversation it reports to.
    pub(crate) channel: ProcessId,
    pub(crate) task: String,
    pub(crate) interactive: bool,
    /// The branch that spawned it, if a branch did (else its channel did).
    pub(crate) requester: Option<ProcessId>,
}

/// What a branch is started with.
pub(crate) struct BranchSpec {
    pub(crate) id: ProcessId,
    /// The conversation it forks and reports to.
    pub(crate) channel: ProcessId,
    pub(crate) question: String,
    /// The conversation's history at the fork.
    pub(crate) history: Vec<Message>,
}

/// What a request for a worker did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpawnOutcome {
    /// A new worker started.
    Spawned {
        /// Its id.
        worker: ProcessId,
    },
    /// A live worker already has this task; nothing started.
    Duplicate {
        /// The worker on it.
        existing: ProcessId,
    },
}

impl Context {
    /// A context over `registry` (whose host should be backed by `services`), talking to
    /// `provider` through its own [`Dispatcher`] (with the config's gate timings), starting
    /// processes with `starter`. Returns the receiver of its [`Event`]s.
    ///
    /// It begins a run in the ledger, and marks the workers that a host which has since
    /// stopped (killed, crashed) left running as interrupted, reporting each as an event.
    pub(crate) async fn new(
        config: Config,
        registry: Arc<Registry>,
        services: Services,
        provider: Arc<dyn Provider>,
        starter: Box<dyn Starter>,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<Event>), ServiceError> {
        // Opened before the run begins: a spill file that cannot be used stops the start.
        let spill = match &config.spill_file {
            Some(path) => {
                let spill =
                    Spill::open(path).map_err(|err| ServiceError::Invalid(err.to_string()))?;
                Some(Arc::new(spill))
            }
            None => None,
        };
        let run = Arc::new(services.ledger.begin_run().await?);
        let stale = services.ledger.mark_interrupted_workers().await?;
        let (events, receiver) = EventSink::new();
        let mut found_at_start = Vec::new();
        for worker in stale {
            let ended = Event::WorkerEnded {
                worker: worker.id,
                state: WorkerState::Interrupted,
                outcome: "the host running it stopped before it ended".into(),
            };
            found_at_start.push(ended.clone());
            events.emit(ended);
        }
        let dispatcher = Dispatcher::new(provider, config.limits.dispatch.clone());
        let catalog = Arc::new(ToolCatalog::new(&registry, &config.policy));
        let workspace = config.agent.workspace.clone();
        let redactor = registry.host().network().secrets().redactor().clone();
        let router = Arc::new(ToolRouter::new(registry, catalog, workspace));
        let supervisor = Arc::<Supervisor>::default();
        let audiences = Audiences {
            events,
            supervisor: supervisor.clone(),
            memory: services.memory.clone(),
            sessions: services.sessions.clone(),
        };
        let retry = config.limits.store_retry;
        let reporter = Arc::new(Reporter::new(audiences, redactor, run.clone(), retry));
        let limit = config.limits.max_workers_per_channel;
        let workers = WorkerRecords::new(services.ledger.clone(), run.id(), limit);
        let stores = (services.history.clone(), services.sessions.clone());
        let unstored_reply = config.limits.unstored_reply;
        let conversations =
            Conversations::new(stores, reporter.clone(), run.clone(), unstored_reply, spill);
        let max_turns = config.limits.max_turns;
        let gate = ModelGate::new(
            dispatcher,
            router.clone(),
            reporter.clone(),
            run.clone(),
            max_turns,
        );
        let ctx = Arc::new(Context {
            config,
            router,
            services,
            gate: Arc::new(gate),
            supervisor,
            reporter,
            workers,
            conversations,
            reservations: Arc::default(),
            opening: tokio::sync::Mutex::default(),
            run,
            starter,
            adopts: std::sync::atomic::AtomicBool::new(true),
            found_at_start,
        });
        Ok((ctx, receiver))
    }

    /// This host's run id in the ledger.
    pub(crate) fn run_id(&self) -> RunId {
        self.run.id()
    }

    /// This host's run in the ledger.
    pub(crate) fn run(&self) -> &Run {
        &self.run
    }

    /// A fresh id such as `worker:3`, numbered by the ledger's persisted counter, so no
    /// id repeats across runs or across hosts sharing the services.
    pub(crate) async fn new_id(&self, kind: ProcessKind) -> Result<ProcessId, ServiceError> {
        let number = self.services.ledger.next_process_number(kind).await?;
        Ok(ProcessId::numbered(kind, number))
    }

    /// The handle of conversation `id` (a channel or an admin session), starting it (with
    /// its stored history) if needed.
    ///
    /// A stored history that cannot be read is an error: the conversation does not start
    /// rather than start from an empty or partial history.
    pub(crate) async fn conversation(
        self: &Arc<Self>,
        id: &ProcessId,
    ) -> Result<ChannelHandle, ConversationError> {
        if let Some(handle) = self.supervisor.channel(id) {
            return Ok(handle);
        }
        let _opening = self.opening.lock().await;
        if self.supervisor.is_closed() {
            return Err(ShuttingDown.into());
        }
        if let Some(handle) = self.supervisor.channel(id) {
            return Ok(handle);
        }
        let (epoch, history, unstored) = self.conversations.claim(id).await?;
        let limit = self.config.limits.max_open_conversations as usize;
        let handle = self
            .supervisor
            .channel_or_open::<ConversationError>(id, limit, || {
                let (inbox, receiver) = mpsc::unbounded_channel();
                let limits = &self.config.limits;
                let handle = ChannelHandle::new(
                    inbox,
                    epoch,
                    limits.max_workers_per_channel as usize,
                    limits.max_branches_per_channel as usize,
                );
                if unstored {
                    // The conversation's loop writes it first.
                    handle.audience.held_from_spill();
                }
                self.starter
                    .channel(self, id.clone(), handle.clone(), receiver, history);
                Ok(handle)
            })?;
        // What waited for the conversation goes in before anything sent with its opening.
        self.conversations.take_forwarded(id, &handle).await;
        Ok(handle)
    }

    /// Starts a worker on `task` for conversation `conversation` on behalf of `requester`
    /// (the branch that asked; `None`: the conversation did), as part of the work `origin`
    /// (if any: its exchanges follow the worker), unless a live worker already
    /// has the same task (compared normalized), in which case nothing starts and the
    /// existing worker is named. With `task_number`, the worker is assigned that task on
    /// the board. Its report is late, and folded back, if the branch has ended.
    pub(crate) async fn spawn_worker(
        self: &Arc<Self>,
        conversation: &ProcessId,
        requester: Option<&ProcessId>,
        origin: Option<&Scope>,
        task: &str,
        interactive: bool,
        task_number: Option<u64>,
    ) -> Result<SpawnOutcome, String> {
        // A duplicate is answered before a number is drawn, so it costs no write; the
        // reservation below still settles a race between two first spawns.
        if let Some(existing) = self.reservations.holder(task) {
            return Ok(SpawnOutcome::Duplicate { existing });
        }
        let handle = self
            .conversation(conversation)
            .await
            .map_err(|err| format!("cannot open {conversation}: {err}"))?;
        let id = self
            .new_id(ProcessKind::Worker)
            .await
            .map_err(|err| format!("cannot number a new worker: {err}"))?;
        // Among the hosts sharing the store first: a worker of another host may hold it.
        // Only a worker whose reservation the store granted is named to anyone.
        let key = task_key(task);
        let elsewhere = self
            .services
            .ledger
            .reserve_task(self.run_id(), &key, &id)
            .await
            .map_err(|err| format!("cannot reserve the task among the hosts: {err}"))?;
        if let Some(existing) = elsewhere {
            return Ok(SpawnOutcome::Duplicate { existing });
        }
        let reservation = match self.reservations.reserve(task, &id) {
            Ok(reservation) => reservation,
            Err(existing) => {
                let _ = self.services.ledger.release_task(&key, &id).await;
                return Ok(SpawnOutcome::Duplicate { existing });
            }
        };
        if let Some(number) = task_number {
            let patch = TaskPatch {
                assigned_worker: Some(id.clone()),
                ..TaskPatch::default()
            };
            let assigned = self.services.tasks.update(number, patch).await;
            if let Err(err) = assigned {
                // Nothing starts: the task is free again on every host.
                let _ = self.services.ledger.release_task(&key, &id).await;
                return Err(format!("cannot assign task #{number}: {err}"));
            }
        }
        let spec = WorkerSpec {
            id: id.clone(),
            channel: conversation.clone(),
            task: task.to_owned(),
            interactive,
            requester: requester.cloned(),
        };
        if let Some(origin) = origin {
            origin.include(&id);
        }
        self.starter.worker(self, spec, handle, reservation);
        Ok(SpawnOutcome::Spawned { worker: id })
    }

    /// Starts a branch of conversation `channel` (through `handle`) on `question`, forked
    /// from `history`, as part of the turn `origin` (its exchanges follow the branch).
    pub(crate) async fn spawn_branch(
        self: &Arc<Self>,
        channel: &ProcessId,
        handle: &ChannelHandle,
        origin: &Scope,
        question: String,
        history: Vec<Message>,
    ) -> Result<ProcessId, ServiceError> {
        let id = self.new_id(ProcessKind::Branch).await?;
        let spec = BranchSpec {
            id: id.clone(),
            channel: channel.clone(),
            question,
            history,
        };
        origin.include(&id);
        self.starter.branch(self, spec, handle.clone());
        Ok(id)
    }
}
