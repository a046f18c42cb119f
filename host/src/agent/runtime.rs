//! [`Runtime`]: the processes of one agent, their tools, and the plumbing between them.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore, mpsc};

use super::channel::{ChannelInput, run_channel};
use super::events::Event;
use super::host_tools::HOST_TOOLS;
use super::notifications::NotificationIndex;
use super::reservations::TaskReservations;
use super::worker::{WorkerSpec, supervise_worker};
use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::llm::{Message, Provider, ToolDef};
use crate::plugin::{CallRequest, Registry};
use crate::policy::{Decision, ProcessKind, ToolNeeds};
use crate::store::{Store, TaskPatch};

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
    next_id: AtomicU64,
    channels: Mutex<HashMap<String, ChannelHandle>>,
    pub(crate) workers: Mutex<HashMap<String, WorkerHandle>>,
    /// Branches still thinking; a worker a branch spawned reports late once it is gone.
    branches: Mutex<HashSet<String>>,
    reservations: Arc<TaskReservations>,
    pub(crate) notification_index: NotificationIndex,
}

/// What [`Runtime::spawn_worker`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpawnOutcome {
    /// A new worker started.
    Spawned {
        /// Its id.
        worker: String,
    },
    /// A live worker already has this task; nothing started.
    Duplicate {
        /// The worker on it.
        existing: String,
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
}

impl Runtime {
    /// A runtime over `registry` (whose host should be backed by `store`), talking to
    /// `provider` through its own [`Dispatcher`] (with the config's gate timings). Returns
    /// the receiver of its [`Event`]s.
    pub fn new(
        config: Config,
        registry: Arc<Registry>,
        store: Arc<Store>,
        provider: Arc<dyn Provider>,
    ) -> (Arc<Self>, mpsc::UnboundedReceiver<Event>) {
        let (events, receiver) = mpsc::unbounded_channel();
        let dispatcher = Dispatcher::new(provider, config.limits.dispatch.clone());
        let runtime = Arc::new(Runtime {
            config,
            registry,
            store,
            dispatcher,
            events,
            next_id: AtomicU64::new(1),
            channels: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
            branches: Mutex::new(HashSet::new()),
            reservations: Arc::new(TaskReservations::default()),
            notification_index: NotificationIndex::default(),
        });
        (runtime, receiver)
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
    pub fn send_user_message(self: &Arc<Self>, channel: &str, text: &str) {
        let handle = self.channel(ProcessKind::Channel, channel);
        handle.send(ChannelInput::User(text.to_owned()));
    }

    /// Sends a message to the admin chat `session`, a cortex process with the cortex
    /// profile's tools (by default every tool). Wait for it with [`Runtime::wait_idle`].
    pub fn send_admin_message(self: &Arc<Self>, session: &str, text: &str) {
        let handle = self.channel(ProcessKind::Cortex, session);
        handle.send(ChannelInput::User(text.to_owned()));
    }

    /// Waits until channel `name` has handled every input and its workers and branches have
    /// all reported back.
    pub async fn wait_idle(&self, channel: &str) {
        let Some(handle) = self.channels.lock().unwrap().get(channel).cloned() else {
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

    /// Starts a worker on `task` for `channel`, unless a live worker already has the same
    /// task (compared normalized), in which case nothing starts and the existing worker is
    /// named. With `task_number`, the worker is assigned that task on the board.
    pub fn spawn_worker(
        self: &Arc<Self>,
        channel: &str,
        task: &str,
        interactive: bool,
        task_number: Option<u64>,
    ) -> Result<SpawnOutcome, String> {
        self.spawn_worker_for(channel, None, task, interactive, task_number)
    }

    /// [`Runtime::spawn_worker`] on behalf of `requester`, the branch that asked (`None`:
    /// the channel did). Its report is late, and folded back, if the branch has ended.
    pub(crate) fn spawn_worker_for(
        self: &Arc<Self>,
        channel: &str,
        requester: Option<&str>,
        task: &str,
        interactive: bool,
        task_number: Option<u64>,
    ) -> Result<SpawnOutcome, String> {
        let handle = self.channel(ProcessKind::Channel, channel);
        let id = self.new_id(ProcessKind::Worker);
        let reservation = match self.reservations.reserve(task, &id) {
            Ok(reservation) => reservation,
            Err(existing) => return Ok(SpawnOutcome::Duplicate { existing }),
        };
        if let Some(number) = task_number {
            let patch = TaskPatch {
                assigned_worker: Some(id.clone()),
                ..TaskPatch::default()
            };
            self.store
                .update_task(number, &patch)
                .map_err(|err| format!("cannot assign task #{number}: {err}"))?;
        }
        handle.add_pending();
        let spec = WorkerSpec {
            id: id.clone(),
            channel: channel.to_owned(),
            task: task.to_owned(),
            interactive,
            requester: requester.map(str::to_owned),
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
    pub fn route_to_worker(&self, id: &str, message: &str) -> bool {
        // Under the registry lock: a worker leaves the registry before it drains its
        // inbox, so every accepted message is either taken or drained.
        let workers = self.workers.lock().unwrap();
        workers
            .get(id)
            .is_some_and(|worker| worker.inbox.send(message.to_owned()).is_ok())
    }

    /// Cancels worker `id`; false if no such worker is running.
    pub fn cancel_worker(&self, id: &str) -> bool {
        match self.workers.lock().unwrap().get(id) {
            Some(worker) => {
                worker.cancel.notify_one();
                true
            }
            None => false,
        }
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
        caller: &str,
        name: &str,
        arguments: &str,
    ) -> String {
        let workspace: PathBuf = self.config.agent.workspace.clone();
        let grants = self.config.policy.profile(kind).grants().clone();
        let request = CallRequest {
            tool: name,
            args_json: arguments,
            grants: &grants,
            workspace: Some(&workspace),
            caller,
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
        caller: &str,
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

    /// A fresh id such as `worker:3`.
    pub(crate) fn new_id(&self, kind: ProcessKind) -> String {
        format!("{kind}:{}", self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn emit(&self, event: Event) {
        // A closed receiver means nobody is watching; the work goes on.
        let _ = self.events.send(event);
    }

    pub(crate) fn status(&self, source: &str, text: impl Into<String>) {
        self.emit(Event::Status {
            source: source.to_owned(),
            text: text.into(),
        });
    }

    /// Marks branch `id` as thinking until the guard drops.
    pub(crate) fn branch_started(self: &Arc<Self>, id: &str) -> BranchAlive {
        self.branches.lock().unwrap().insert(id.to_owned());
        BranchAlive {
            rt: self.clone(),
            id: id.to_owned(),
        }
    }

    /// Whether branch `id` is still thinking.
    pub(crate) fn branch_alive(&self, id: &str) -> bool {
        self.branches.lock().unwrap().contains(id)
    }

    /// The handle of channel `name` if it is open (not shut down).
    pub(crate) fn open_channel(&self, name: &str) -> Option<ChannelHandle> {
        self.channels.lock().unwrap().get(name).cloned()
    }

    /// The handle of channel `name`, starting it (with its stored history) if needed.
    /// A session opened first as one kind keeps that kind.
    pub(crate) fn channel(self: &Arc<Self>, kind: ProcessKind, name: &str) -> ChannelHandle {
        let mut channels = self.channels.lock().unwrap();
        if let Some(handle) = channels.get(name) {
            return handle.clone();
        }
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
        channels.insert(name.to_owned(), handle.clone());
        let history = self.load_history(name);
        tokio::spawn(run_channel(
            self.clone(),
            kind,
            name.to_owned(),
            handle.clone(),
            receiver,
            history,
        ));
        handle
    }

    fn load_history(&self, channel: &str) -> Vec<Message> {
        match self.store.load_history(channel) {
            Ok(entries) => entries
                .iter()
                .filter_map(|e| serde_json::from_str(&e.message).ok())
                .collect(),
            Err(err) => {
                tracing::error!(channel, "cannot load history, starting empty: {err}");
                Vec::new()
            }
        }
    }

    /// Stores `history`: only the messages from `from` on are appended when the store
    /// already holds the rest unchanged; `from == 0` rewrites it all.
    pub(crate) fn save_history(&self, channel: &str, history: &[Message], from: usize) {
        let rows: Vec<String> = history[from.min(history.len())..]
            .iter()
            .map(|m| serde_json::to_string(m).expect("messages serialize"))
            .collect();
        let saved = if from == 0 {
            self.store.replace_history(channel, &rows)
        } else {
            self.store.append_history(channel, &rows)
        };
        if let Err(err) = saved {
            tracing::error!(channel, "cannot save history: {err}");
        }
    }
}

/// A branch still thinking; see [`Runtime::branch_started`].
pub(crate) struct BranchAlive {
    rt: Arc<Runtime>,
    id: String,
}

impl Drop for BranchAlive {
    fn drop(&mut self) {
        self.rt.branches.lock().unwrap().remove(&self.id);
    }
}
