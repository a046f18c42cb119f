//! [`Runtime`]: the processes of one agent, their tools, and the plumbing between them.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore, mpsc};

use super::channel::{ChannelInput, run_channel};
use super::events::Event;
use super::host_tools::HOST_TOOLS;
use super::notifications::NotificationIndex;
use super::reservations::TaskReservations;
use super::turn::{TurnError, Unanswered};
use super::worker::{WorkerSpec, supervise_worker};
use crate::config::Config;
use crate::dispatch::{Dispatcher, Lease, Reserved};
use crate::ids::ProcessId;
use crate::llm::{Message, Provider, ToolDef};
use crate::plugin::{CallRequest, Registry};
use crate::policy::{Decision, ProcessKind, ToolNeeds};
use crate::store::{RunGuard, RunId, Store, StoreError, TaskPatch};

/// One agent: its config, plugins, store and model, and the channels, workers and branches
/// running on them.
///
/// The orchestration lives here, in the trusted host: plugins only ever see the sandbox of
/// one tool call. Each process's tool list comes from its profile ([`Runtime::tool_defs`]),
/// and each plugin call it makes goes through the same policy decision
/// ([`Registry::call_as`]).
pub struct Runtime {
    pub(crate) config: Config,
    pub(crate) registry: Arc<Registry>,
    pub(crate) store: Arc<Store>,
    pub(crate) dispatcher: Dispatcher,
    events: mpsc::UnboundedSender<Event>,
    /// Conversations (user channels and admin sessions), by process id.
    channels: Mutex<HashMap<ProcessId, ChannelHandle>>,
    pub(crate) workers: Mutex<HashMap<ProcessId, WorkerHandle>>,
    /// Branches still thinking; a worker a branch spawned reports late once it is gone.
    branches: Mutex<HashSet<ProcessId>>,
    reservations: Arc<TaskReservations>,
    pub(crate) notification_index: NotificationIndex,
    /// This host's run in the store: owns the worker rows it writes, and holds the lock
    /// that tells a later start whether this run is still alive.
    run: RunGuard,
}

/// What [`Runtime::spawn_worker`] did.
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

/// The way into a running channel.
#[derive(Clone)]
pub(crate) struct ChannelHandle {
    pub(crate) inbox: mpsc::UnboundedSender<ChannelInput>,
    /// Inputs not yet handled plus workers and branches still running for this channel.
    pub(crate) pending: Arc<AtomicUsize>,
    pub(crate) settled: Arc<Notify>,
    /// Admission of workers: a permit is held for a worker's whole life.
    pub(crate) worker_slots: Arc<Semaphore>,
    /// Admission of branches, likewise.
    pub(crate) branch_slots: Arc<Semaphore>,
}

impl ChannelHandle {
    pub(crate) fn add_pending(&self) {
        self.pending.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn done_pending(&self) {
        if self.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.settled.notify_waiters();
        }
    }

    /// Queues `input`, counted until the turn that handles it ends.
    pub(crate) fn send(&self, input: ChannelInput) -> bool {
        self.try_send(input).is_ok()
    }

    /// [`ChannelHandle::send`], giving `input` back if the channel is gone.
    pub(crate) fn try_send(&self, input: ChannelInput) -> Result<(), ChannelInput> {
        self.add_pending();
        self.inbox.send(input).map_err(|returned| {
            self.done_pending();
            returned.0
        })
    }
}

/// The way into a running worker.
pub(crate) struct WorkerHandle {
    pub(crate) inbox: mpsc::UnboundedSender<String>,
    pub(crate) cancel: Arc<Notify>,
    /// Set before `cancel` is notified when the host is stopping rather than the
    /// channel cancelling: the worker ends interrupted, not cancelled.
    pub(crate) interrupted: Arc<AtomicBool>,
}

impl Runtime {
    /// A runtime over `registry` (whose host should be backed by `store`), talking to
    /// `provider` through its own [`Dispatcher`] (with the config's gate timings). Returns
    /// the receiver of its [`Event`]s.
    ///
    /// It begins a run in the store, and marks the workers that a host which has since
    /// stopped (killed, crashed) left running as interrupted, reporting each as a status
    /// event.
    pub fn new(
        config: Config,
        registry: Arc<Registry>,
        store: Arc<Store>,
        provider: Arc<dyn Provider>,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<Event>), StoreError> {
        let run = store.begin_run()?;
        let stale = store.mark_interrupted_workers()?;
        let (events, receiver) = mpsc::unbounded_channel();
        for worker in stale {
            if let Ok(id) = worker.id.parse::<ProcessId>() {
                let _ = events.send(Event::Status {
                    source: id,
                    text: "interrupted: the host running it stopped before it ended".into(),
                });
            }
        }
        let dispatcher = Dispatcher::new(provider, config.limits.dispatch.clone());
        let runtime = Arc::new(Runtime {
            config,
            registry,
            store,
            dispatcher,
            events,
            channels: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
            branches: Mutex::new(HashSet::new()),
            reservations: Arc::new(TaskReservations::default()),
            notification_index: NotificationIndex::default(),
            run,
        });
        Ok((runtime, receiver))
    }

    /// This host's run id in the store.
    pub(crate) fn run_id(&self) -> RunId {
        self.run.id()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The model provider's name, e.g. `scripted:demo`.
    pub fn provider_name(&self) -> String {
        self.dispatcher.provider_name()
    }

    /// Sends a user message to channel `name` (opened on first use, with its stored
    /// history).
    pub fn send_user_message(
        self: &Arc<Self>,
        channel: &str,
        text: &str,
    ) -> Result<(), StoreError> {
        self.send_to(&ProcessId::channel(channel), text)
    }

    /// Sends a message to the admin chat `session`, a cortex process with the cortex
    /// profile's tools (by default every tool). It is its own process, with its own
    /// history and its own session at the gate: the cortex `main` never shares anything
    /// with the user channel `main`. Wait for it with [`Runtime::wait_admin_idle`].
    pub fn send_admin_message(
        self: &Arc<Self>,
        session: &str,
        text: &str,
    ) -> Result<(), StoreError> {
        self.send_to(&ProcessId::named(ProcessKind::Cortex, session), text)
    }

    /// Sends a user message to conversation `id`, opening it on first use. Fails if its
    /// stored history cannot be read.
    pub fn send_to(self: &Arc<Self>, id: &ProcessId, text: &str) -> Result<(), StoreError> {
        let handle = self.conversation(id)?;
        handle.send(ChannelInput::User(text.to_owned()));
        Ok(())
    }

    /// Waits until channel `name` has handled every input and its workers and branches have
    /// all reported back.
    pub async fn wait_idle(&self, channel: &str) {
        self.wait_conversation_idle(&ProcessId::channel(channel))
            .await
    }

    /// [`Runtime::wait_idle`] for the admin chat `session`.
    pub async fn wait_admin_idle(&self, session: &str) {
        self.wait_conversation_idle(&ProcessId::named(ProcessKind::Cortex, session))
            .await
    }

    /// Waits until conversation `id` is idle: every input handled, every worker and
    /// branch it started reported back.
    pub async fn wait_conversation_idle(&self, id: &ProcessId) {
        let Some(handle) = self.channels.lock().unwrap().get(id).cloned() else {
            return;
        };
        loop {
            let settled = handle.settled.notified();
            if handle.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            settled.await;
        }
    }

    /// Starts a worker on `task` for channel `channel`, unless a live worker already has
    /// the same task (compared normalized), in which case nothing starts and the existing
    /// worker is named. With `task_number`, the worker is assigned that task on the board.
    pub fn spawn_worker(
        self: &Arc<Self>,
        channel: &str,
        task: &str,
        interactive: bool,
        task_number: Option<u64>,
    ) -> Result<SpawnOutcome, String> {
        self.spawn_worker_for(
            &ProcessId::channel(channel),
            None,
            task,
            interactive,
            task_number,
        )
    }

    /// [`Runtime::spawn_worker`] for conversation `conversation` on behalf of `requester`,
    /// the branch that asked (`None`: the conversation did). Its report is late, and
    /// folded back, if the branch has ended.
    pub(crate) fn spawn_worker_for(
        self: &Arc<Self>,
        conversation: &ProcessId,
        requester: Option<&ProcessId>,
        task: &str,
        interactive: bool,
        task_number: Option<u64>,
    ) -> Result<SpawnOutcome, String> {
        let handle = self
            .conversation(conversation)
            .map_err(|err| format!("cannot open {conversation}: {err}"))?;
        let id = self
            .new_id(ProcessKind::Worker)
            .map_err(|err| format!("cannot number a new worker: {err}"))?;
        let reservation = match self.reservations.reserve(task, &id) {
            Ok(reservation) => reservation,
            Err(existing) => return Ok(SpawnOutcome::Duplicate { existing }),
        };
        if let Some(number) = task_number {
            let patch = TaskPatch {
                assigned_worker: Some(id.to_string()),
                ..TaskPatch::default()
            };
            self.store
                .update_task(number, &patch)
                .map_err(|err| format!("cannot assign task #{number}: {err}"))?;
        }
        handle.add_pending();
        let spec = WorkerSpec {
            id: id.clone(),
            channel: conversation.clone(),
            task: task.to_owned(),
            interactive,
            requester: requester.cloned(),
        };
        tokio::spawn(supervise_worker(self.clone(), spec, handle, reservation));
        Ok(SpawnOutcome::Spawned { worker: id })
    }

    /// Task descriptions reserved by live workers.
    pub fn reserved_tasks(&self) -> usize {
        self.reservations.len()
    }

    /// Workers running now (admitted, not yet ended).
    pub fn live_workers(&self) -> usize {
        self.workers.lock().unwrap().len()
    }

    /// Reservations held at the prompt gate now.
    pub fn gate_reservations(&self) -> usize {
        self.dispatcher.gate().reservations()
    }

    /// Sends `message` to worker `id`: a waiting worker takes it as its answer, a running
    /// one at its next turn boundary. False if no such worker is running; a message
    /// accepted here is delivered, or reported to the channel as not delivered if the
    /// worker ends first.
    pub fn route_to_worker(&self, id: &ProcessId, message: &str) -> bool {
        // Under the registry lock: a worker leaves the registry before it drains its
        // inbox, so every accepted message is either taken or drained.
        let workers = self.workers.lock().unwrap();
        workers
            .get(id)
            .is_some_and(|worker| worker.inbox.send(message.to_owned()).is_ok())
    }

    /// Cancels worker `id`; false if no such worker is running.
    pub fn cancel_worker(&self, id: &ProcessId) -> bool {
        match self.workers.lock().unwrap().get(id) {
            Some(worker) => {
                worker.cancel.notify_one();
                true
            }
            None => false,
        }
    }

    /// Stops the host gracefully after a signal: every running worker ends interrupted
    /// (recorded so, its reservations released, its report kept), the channels finish
    /// the turn in progress and store their history, and the event stream ends once the
    /// last process has finished.
    pub fn interrupt(&self) {
        for worker in self.workers.lock().unwrap().values() {
            worker.interrupted.store(true, Ordering::SeqCst);
            worker.cancel.notify_one();
        }
        self.shutdown();
    }

    /// Stops the channels (their loops end once their inboxes close) and cancels running
    /// workers, so the event stream ends once the last process has finished.
    pub fn shutdown(&self) {
        for (_, channel) in self.channels.lock().unwrap().drain() {
            // The loop holds a sender of its own inbox, so it must be told to stop.
            let _ = channel.inbox.send(ChannelInput::Close);
        }
        for worker in self.workers.lock().unwrap().values() {
            worker.cancel.notify_one();
        }
    }

    /// The tools a `kind` process is offered, host tools and plugin tools alike: exactly
    /// those its profile names and grants the capabilities of.
    pub fn tool_defs(&self, kind: ProcessKind) -> Vec<ToolDef> {
        let policy = &self.config.policy;
        let offered = |name: &str, caps| {
            policy.decide(
                kind,
                name,
                Some(ToolNeeds {
                    name,
                    capabilities: caps,
                }),
            ) == Decision::Offered
        };
        let host = HOST_TOOLS
            .iter()
            .filter(|tool| offered(tool.name, &[]))
            .map(|tool| tool.def());
        let plugins = self
            .registry
            .plugins()
            .iter()
            .flat_map(|plugin| plugin.tools())
            .filter(|tool| offered(&tool.name, &tool.capabilities))
            .map(|tool| ToolDef {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.args_schema.clone(),
            });
        host.chain(plugins).collect()
    }

    /// Runs plugin tool `name` for process `caller` of `kind`, with the kind's grants.
    /// Errors come back as text for the model, `error[kind]: message`.
    pub(crate) async fn call_plugin(
        &self,
        kind: ProcessKind,
        caller: &ProcessId,
        name: &str,
        arguments: &str,
    ) -> String {
        let caller_name = caller.to_string();
        let workspace: PathBuf = self.config.agent.workspace.clone();
        let grants = self.config.policy.profile(kind).grants().clone();
        let request = CallRequest {
            tool: name,
            args_json: arguments,
            grants: &grants,
            workspace: Some(&workspace),
            caller: &caller_name,
        };
        let result = self
            .registry
            .call_as(&self.config.policy, kind, request)
            .await;
        match result {
            Ok(text) => {
                self.status(caller, format!("{name} ok"));
                text
            }
            Err(err) => {
                self.status(caller, format!("{name} {}: {}", err.kind(), err.message()));
                format!("error[{}]: {}", err.kind(), err.message())
            }
        }
    }

    /// The answer to a call of a tool `kind` was not offered: for a host tool, a denial
    /// with the policy's reason; for anything else, the registry's own (audited) refusal.
    pub(crate) async fn refuse(
        &self,
        kind: ProcessKind,
        caller: &ProcessId,
        name: &str,
        arguments: &str,
    ) -> String {
        if HOST_TOOLS.iter().any(|tool| tool.name == name) {
            let decision = self.config.policy.decide(
                kind,
                name,
                Some(ToolNeeds {
                    name,
                    capabilities: &[],
                }),
            );
            self.status(caller, format!("{name} denied: {decision}"));
            return format!(
                "error[denied]: tool `{name}` is not offered to a {kind} process: {decision}"
            );
        }
        self.call_plugin(kind, caller, name, arguments).await
    }

    /// A fresh id such as `worker:3`, numbered by the store's persisted counter, so no
    /// id repeats across runs or across hosts sharing the database.
    pub(crate) fn new_id(&self, kind: ProcessKind) -> Result<ProcessId, StoreError> {
        let number = self.store.next_process_number(kind.as_str())?;
        Ok(ProcessId::numbered(kind, number))
    }

    /// Reserves the session of process `id` for its loop (owner `<id>:loop`) at the gate;
    /// see [`Dispatcher::lease_loop`].
    pub(crate) fn lease_loop(&self, id: &ProcessId) -> Result<Lease<'_>, Reserved> {
        self.dispatcher
            .lease_loop(id.session().as_str(), &id.to_string())
    }

    /// Releases everything process `id` holds at the gate, when it ends.
    pub(crate) fn release_process(&self, id: &ProcessId) {
        self.dispatcher.release_process(&id.to_string());
    }

    /// Reports that a request of `process` got no answer (a suppressed turn is not a
    /// failure: someone else answers).
    pub(crate) fn model_failed(&self, process: &ProcessId, err: &TurnError) {
        if matches!(err.reason, Unanswered::Suppressed(_)) {
            return;
        }
        self.emit(Event::ModelFailed {
            process: process.clone(),
            error: err.to_string(),
        });
    }

    pub(crate) fn emit(&self, event: Event) {
        // A closed receiver means nobody is watching; the work goes on.
        let _ = self.events.send(event);
    }

    pub(crate) fn status(&self, source: &ProcessId, text: impl Into<String>) {
        self.emit(Event::Status {
            source: source.clone(),
            text: text.into(),
        });
    }

    /// Marks branch `id` as thinking until the guard drops.
    pub(crate) fn branch_started(self: &Arc<Self>, id: &ProcessId) -> BranchAlive {
        self.branches.lock().unwrap().insert(id.clone());
        BranchAlive {
            rt: self.clone(),
            id: id.clone(),
        }
    }

    /// Whether branch `id` is still thinking.
    pub(crate) fn branch_alive(&self, id: &ProcessId) -> bool {
        self.branches.lock().unwrap().contains(id)
    }

    /// The handle of conversation `id` if it is open (not shut down).
    pub(crate) fn open_channel(&self, id: &ProcessId) -> Option<ChannelHandle> {
        self.channels.lock().unwrap().get(id).cloned()
    }

    /// The handle of conversation `id` (a channel or an admin session), starting it (with
    /// its stored history) if needed.
    ///
    /// A stored history that cannot be read is an error: the conversation does not start
    /// rather than start from an empty or partial history.
    pub(crate) fn conversation(
        self: &Arc<Self>,
        id: &ProcessId,
    ) -> Result<ChannelHandle, StoreError> {
        let mut channels = self.channels.lock().unwrap();
        if let Some(handle) = channels.get(id) {
            return Ok(handle.clone());
        }
        let history = self.load_history(id)?;
        let (inbox, receiver) = mpsc::unbounded_channel();
        let handle = ChannelHandle {
            inbox,
            pending: Arc::new(AtomicUsize::new(0)),
            settled: Arc::new(Notify::new()),
            worker_slots: Arc::new(Semaphore::new(
                self.config.limits.max_workers_per_channel as usize,
            )),
            branch_slots: Arc::new(Semaphore::new(
                self.config.limits.max_branches_per_channel as usize,
            )),
        };
        channels.insert(id.clone(), handle.clone());
        tokio::spawn(run_channel(
            self.clone(),
            id.clone(),
            handle.clone(),
            receiver,
            history,
        ));
        Ok(handle)
    }

    /// The stored history of conversation `id`; every message must read back.
    fn load_history(&self, id: &ProcessId) -> Result<Vec<Message>, StoreError> {
        self.store.load_history_as(id.session().as_str())
    }

    /// Stores `history`: only the messages from `from` on are appended when the store
    /// already holds the rest unchanged; `from == 0` rewrites it all. A failure is
    /// reported as [`Event::HistoryNotSaved`] and returned, so the caller rewrites the
    /// whole history at its next save.
    pub(crate) fn save_history(
        &self,
        id: &ProcessId,
        history: &[Message],
        from: usize,
    ) -> Result<(), StoreError> {
        let channel = id.session();
        let channel = channel.as_str();
        let rows: Vec<String> = history[from.min(history.len())..]
            .iter()
            .map(|m| serde_json::to_string(m).expect("messages serialize"))
            .collect();
        let saved = if from == 0 {
            self.store.replace_history(channel, &rows)
        } else {
            self.store.append_history(channel, &rows)
        };
        if let Err(err) = &saved {
            self.emit(Event::HistoryNotSaved {
                channel: id.clone(),
                error: err.to_string(),
            });
        }
        saved
    }
}

/// A branch still thinking; see [`Runtime::branch_started`].
pub(crate) struct BranchAlive {
    rt: Arc<Runtime>,
    id: ProcessId,
}

impl Drop for BranchAlive {
    fn drop(&mut self) {
        self.rt.branches.lock().unwrap().remove(&self.id);
    }
}
