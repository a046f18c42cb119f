//! [`Spawner`]: how processes come to run. A conversation is opened (its session claimed,
//! its history read, what was forwarded to it sent in), a worker is started on a task no
//! live worker of any host holds, a branch is forked; each is handed the kit its kind
//! works with ([`kits`]): the [`Handles`] built once, each kit a share of them.
//!
//! Processes (channel, branch, worker, compactor) depend on their kits and on the modules
//! below them, never on each other's modules (but for the channel running the compactor
//! inside its own turn) or on the [`Runtime`](super::Runtime). Running a process is the
//! one thing that needs the process modules; the runtime hands the spawner a [`Starter`]
//! that does it.

mod kits;

use std::sync::Arc;

use serde_json::json;
use tokio::sync::mpsc;

use super::audience::Scope;
use super::conversations::ConversationError;
use super::inbox::{ChannelHandle, ChannelInput};
use super::reservations::{Reservation, TaskReservations, task_key};
use super::stop::Running;
use super::supervisor::{Holder, ShuttingDown};
use crate::flow::Label;
use crate::ids::{ProcessId, ProcessKind};
use crate::llm::Message;
use crate::plugin::ToolError;
use crate::services::{TaskBoard, TaskPatch};
use crate::telemetry::TraceParent;
use crate::tools::SpawnArgs;

pub(crate) use kits::{BranchKit, ChannelKit, CompactorKit, Handles, Settings, WorkerKit};

/// Runs processes: implemented above the process modules (by the runtime), so that they
/// reach each other only through the [`Spawner`].
pub(crate) trait Starter: Send + Sync {
    /// Runs conversation `id`'s loop over `inbox`, from its stored `history`.
    fn channel(
        &self,
        kit: ChannelKit,
        id: ProcessId,
        handle: ChannelHandle,
        inbox: mpsc::UnboundedReceiver<ChannelInput>,
        history: Vec<Message>,
    );

    /// Runs a worker, supervised, for `channel`.
    fn worker(
        &self,
        kit: WorkerKit,
        spec: WorkerSpec,
        channel: ChannelHandle,
        reservation: Reservation,
    );

    /// Runs a branch, supervised, for `channel`.
    fn branch(&self, kit: BranchKit, spec: BranchSpec, channel: ChannelHandle);
}

/// What a worker is started with.
pub(crate) struct WorkerSpec {
    pub(crate) id: ProcessId,
    /// The conversation it reports to.
    pub(crate) channel: ProcessId,
    pub(crate) task: String,
    /// What the process that asked for it had read: its task carries it.
    pub(crate) task_label: Label,
    pub(crate) interactive: bool,
    /// The branch that spawned it, if a branch did (else its channel did).
    pub(crate) requester: Option<ProcessId>,
    /// The span that spawned it (the tool call of its requester's turn): its turns are
    /// children of it.
    pub(crate) trace: TraceParent,
}

/// What a worker is asked to do.
pub(crate) struct WorkerTask<'a> {
    /// The task, as the model (or a person) wrote it.
    pub(crate) text: &'a str,
    /// What the process that asked for it had read: the worker's task carries it.
    pub(crate) label: &'a Label,
    /// Whether it may ask for input and wait for it.
    pub(crate) interactive: bool,
    /// The board's task it is assigned, if any.
    pub(crate) number: Option<u64>,
}

/// What a branch is started with.
pub(crate) struct BranchSpec {
    pub(crate) id: ProcessId,
    /// The conversation it forks and reports to.
    pub(crate) channel: ProcessId,
    pub(crate) question: String,
    /// What the process that asked had read when it wrote the question: the turn's own
    /// tool results, which the fork (taken before the turn) does not hold.
    pub(crate) question_label: Label,
    /// The conversation's history at the fork.
    pub(crate) history: Vec<Message>,
    /// The span that forked it: its turn is a child of it.
    pub(crate) trace: TraceParent,
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

/// Opens conversations and starts workers and branches; see the [module](self).
pub(crate) struct Spawner {
    handles: Handles,
    /// Where a worker started on a task is assigned it.
    tasks: Arc<dyn TaskBoard>,
    /// Task descriptions held by this host's live workers.
    reservations: Arc<TaskReservations>,
    /// Held while a conversation is opened: its history is read before it is registered,
    /// and no other caller may open it from a read of its own in between.
    opening: tokio::sync::Mutex<()>,
    starter: Box<dyn Starter>,
    /// The token every process it starts holds; given up by [`Spawner::stop`], after
    /// which nothing starts, so the stop report waits for processes, not for whoever
    /// still holds the runtime (an HTTP connection the server left open).
    running: std::sync::Mutex<Option<Running>>,
}

impl Spawner {
    /// A spawner giving processes their share of `handles` and a clone of `running`,
    /// assigning tasks on `tasks`, running each process with `starter`.
    pub(crate) fn new(
        handles: Handles,
        tasks: Arc<dyn TaskBoard>,
        starter: Box<dyn Starter>,
        running: Running,
    ) -> Self {
        Spawner {
            handles,
            tasks,
            reservations: Arc::default(),
            opening: tokio::sync::Mutex::default(),
            starter,
            running: std::sync::Mutex::new(Some(running)),
        }
    }

    /// Starts nothing from now on, and gives up the spawner's [`Running`] token: the
    /// stop report ends once the last process has.
    pub(crate) fn stop(&self) {
        self.running.lock().unwrap().take();
    }

    /// The token a process started now holds; [`ShuttingDown`] once [`Spawner::stop`]
    /// was called.
    fn running(&self) -> Result<Running, ShuttingDown> {
        self.running.lock().unwrap().clone().ok_or(ShuttingDown)
    }

    /// How many task descriptions this host's live workers hold.
    pub(crate) fn reserved_tasks(&self) -> usize {
        self.reservations.len()
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
        let Handles {
            supervisor,
            conversations,
            settings,
            ..
        } = &self.handles;
        if let Some(handle) = supervisor.channel(id) {
            return Ok(handle);
        }
        let _opening = self.opening.lock().await;
        if supervisor.is_closed() {
            return Err(ShuttingDown.into());
        }
        if let Some(handle) = supervisor.channel(id) {
            return Ok(handle);
        }
        let (epoch, history, unstored) = conversations.claim(id).await?;
        let limits = &settings.limits;
        let limit = limits.max_open_conversations as usize;
        let handle = supervisor.channel_or_open::<ConversationError>(id, limit, || {
            let (inbox, receiver) = mpsc::unbounded_channel();
            let handle = ChannelHandle::new(
                inbox,
                epoch,
                limits.max_workers_per_channel as usize,
                limits.max_branches_per_channel as usize,
            );
            let kit = self.handles.channel(self, self.running()?);
            if unstored {
                // The conversation's loop writes it first.
                handle.audience.held_from_spill();
            }
            self.starter
                .channel(kit, id.clone(), handle.clone(), receiver, history);
            Ok(handle)
        })?;
        // What waited for the conversation goes in before anything sent with its opening.
        conversations.take_forwarded(id, &handle).await;
        Ok(handle)
    }

    /// Starts a worker on `task` for conversation `conversation` on behalf of `requester`
    /// (the branch that asked; `None`: the conversation did), as part of the work `origin`
    /// (if any: its exchanges follow the worker), unless a live worker already
    /// has the same task (compared normalized), in which case nothing starts and the
    /// existing worker is named. With a task number, the worker is assigned that task on
    /// the board. Its report is late, and folded back, if the branch has ended.
    pub(crate) async fn spawn_worker(
        self: &Arc<Self>,
        conversation: &ProcessId,
        requester: Option<&ProcessId>,
        origin: Option<&Scope>,
        task: WorkerTask<'_>,
    ) -> Result<SpawnOutcome, String> {
        let WorkerTask {
            text: task,
            label: task_label,
            interactive,
            number: task_number,
        } = task;
        // A duplicate is answered before a number is drawn, so it costs no write; the
        // reservation below still settles a race between two first spawns.
        if let Some(existing) = self.reservations.holder(task) {
            return Ok(SpawnOutcome::Duplicate { existing });
        }
        let handle = self
            .conversation(conversation)
            .await
            .map_err(|err| format!("cannot open {conversation}: {err}"))?;
        // Taken before anything is reserved: a worker started from here on is stopped as it
        // registers if the host stops meanwhile (`Supervisor::worker_started`).
        let running = self.running().map_err(|err| err.to_string())?;
        let id = self
            .handles
            .ids
            .next(ProcessKind::Worker)
            .await
            .map_err(|err| format!("cannot number a new worker: {err}"))?;
        // Among the hosts sharing the store first: a worker of another host may hold it.
        // Only a worker whose reservation the store granted is named to anyone.
        let records = &self.handles.records;
        let key = task_key(task);
        let elsewhere = records
            .reserve_task(&key, &id)
            .await
            .map_err(|err| format!("cannot reserve the task among the hosts: {err}"))?;
        if let Some(existing) = elsewhere {
            return Ok(SpawnOutcome::Duplicate { existing });
        }
        let reservation = match self.reservations.reserve(task, &id) {
            Ok(reservation) => reservation,
            Err(existing) => {
                let _ = records.release_task(&key, &id).await;
                return Ok(SpawnOutcome::Duplicate { existing });
            }
        };
        if let Some(number) = task_number {
            let patch = TaskPatch {
                assigned_worker: Some(id.clone()),
                ..TaskPatch::default()
            };
            if let Err(err) = self.tasks.update(number, patch).await {
                // Nothing starts: the task is free again on every host.
                let _ = records.release_task(&key, &id).await;
                return Err(format!("cannot assign task #{number}: {err}"));
            }
        }
        let spec = WorkerSpec {
            id: id.clone(),
            channel: conversation.clone(),
            task: task.to_owned(),
            task_label: task_label.clone(),
            interactive,
            requester: requester.cloned(),
            trace: TraceParent::current(),
        };
        if let Some(origin) = origin {
            origin.include(&id);
        }
        let kit = self.handles.worker(running);
        self.starter.worker(kit, spec, handle, reservation);
        Ok(SpawnOutcome::Spawned { worker: id })
    }

    /// Runs the `spawn_worker` host tool for `channel`, on behalf of `requester` (a branch;
    /// `None`: the channel), as part of the work `origin`, called by a model that had read
    /// what is labelled `context` (the worker's task carries it): the outcome as JSON for
    /// the model.
    pub(crate) async fn spawn_worker_tool(
        self: &Arc<Self>,
        channel: &ProcessId,
        requester: Option<&ProcessId>,
        origin: &Scope,
        args: SpawnArgs,
        context: &Label,
    ) -> Result<String, ToolError> {
        let outcome = self
            .spawn_worker(
                channel,
                requester,
                Some(origin),
                WorkerTask {
                    text: &args.task,
                    label: context,
                    interactive: args.interactive,
                    number: args.task_number,
                },
            )
            .await
            .map_err(|err| ToolError::InvalidArgs(format!("spawn_worker: {err}")))?;
        Ok(match outcome {
            SpawnOutcome::Spawned { worker } => {
                json!({ "spawned": true, "worker": worker, "task_number": args.task_number })
            }
            SpawnOutcome::Duplicate { existing } => {
                // Who waits on this work hears that worker's end too, if it is this
                // conversation's and still running here.
                let following = || origin.include(&existing);
                let supervisor = &self.handles.supervisor;
                let holder = supervisor.follow_worker(channel, &existing, following);
                if holder == Holder::OtherConversation {
                    // Neither its id nor its work is this conversation's to know.
                    return Ok(json!({
                        "spawned": false,
                        "reason": "a worker of another conversation is on this task; its \
                                   result goes to that conversation",
                    })
                    .to_string());
                }
                json!({
                "spawned": false,
                "existing_worker": existing,
                "hint": format!("{existing} is already on this task; use route to send it more input"),
                })
            }
        }
        .to_string())
    }

    /// Starts a branch of conversation `channel` (through `handle`) on `question`, forked
    /// from `history`, as part of the turn `origin` (its exchanges follow the branch); the
    /// question carries `context`, what the channel had read when it asked.
    pub(crate) async fn spawn_branch(
        self: &Arc<Self>,
        channel: &ProcessId,
        handle: &ChannelHandle,
        origin: &Scope,
        question: String,
        history: Vec<Message>,
        context: &Label,
    ) -> Result<ProcessId, String> {
        let running = self.running().map_err(|err| err.to_string())?;
        let id = self
            .handles
            .ids
            .next(ProcessKind::Branch)
            .await
            .map_err(|err| format!("cannot number a new branch: {err}"))?;
        let spec = BranchSpec {
            id: id.clone(),
            channel: channel.clone(),
            question,
            question_label: context.clone(),
            history,
            trace: TraceParent::current(),
        };
        origin.include(&id);
        let kit = self.handles.branch(self, running);
        self.starter.branch(kit, spec, handle.clone());
        Ok(id)
    }
}
