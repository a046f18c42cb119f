//! [`Runtime`]: one agent, as its users see it: send messages, wait, spawn, stop; and the
//! [`Starter`] that runs each kind of process.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::context::Context;
use super::conversations::ConversationError;
use super::events::Event;
use super::exchange::{
    End, Exchange, FORWARDED_ANSWER_LIMIT, Listener, ReplyPart, UserMessage, end_of,
};
use super::inbox::{ChannelHandle, ChannelInput};
use super::reservations::Reservation;
use super::spawning::{
    BranchKit, BranchSpec, ChannelKit, SpawnOutcome, Starter, WorkerKit, WorkerSpec, WorkerTask,
};
use super::stop::{NotSaved, StopReport};
use super::{branch, channel, forwarding, spilling, worker};
use crate::config::Config;
use crate::flow::Label;
use crate::ids::ProcessId;
use crate::llm::{Message, Provider, ToolDef};
use crate::plugin::Registry;
use crate::policy::ProcessKind;
use crate::secrets::Redactor;
use crate::services::{Answer, ForwardId, Forwarded, RunId, ServiceError, Services, Sessions};
use crate::tools::ToolRouter;

/// One agent: its config, plugins, services and model, and the channels, workers and branches
/// running on them.
///
/// The orchestration lives here, in the trusted host: plugins only ever see the sandbox of
/// one tool call. Each process's tool list comes from its profile ([`Runtime::tool_defs`]),
/// and each call it makes goes through the same catalog and policy decision
/// ([`ToolRouter`]).
pub struct Runtime {
    ctx: Arc<Context>,
    /// The tasks that take what other hosts forward and watch the run's lease: they hold
    /// the context weakly, and end with the runtime.
    _watchers: [AbortOnDropHandle<()>; 2],
    /// Cancelled by [`Runtime::shutdown`]: what waits on another host for a forwarded
    /// message's answer stops waiting, so a stop is never held up by it.
    stopping: CancellationToken,
}

/// Where [`Runtime::send_or_forward`] sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// To the conversation, on this host.
    Here,
    /// Into the inbox of the host that answers the conversation.
    Forwarded {
        /// That host's run.
        owner: RunId,
        /// The message's number, for [`Runtime::forwarded_answer`].
        number: ForwardId,
    },
}

/// Runs each kind of process: the one place that knows them all.
struct Processes;

impl Starter for Processes {
    fn channel(
        &self,
        kit: ChannelKit,
        id: ProcessId,
        handle: ChannelHandle,
        inbox: mpsc::UnboundedReceiver<ChannelInput>,
        history: Vec<Message>,
    ) {
        tokio::spawn(channel::run(kit, id, handle, inbox, history));
    }

    fn worker(
        &self,
        kit: WorkerKit,
        spec: WorkerSpec,
        channel: ChannelHandle,
        reservation: Reservation,
    ) {
        worker::start(kit, spec, channel, reservation);
    }

    fn branch(&self, kit: BranchKit, spec: BranchSpec, channel: ChannelHandle) {
        branch::start(kit, spec, channel);
    }
}

impl Runtime {
    /// A runtime over `registry` (whose host should be backed by the same `services`),
    /// talking to `provider` through its own dispatcher (with the config's gate timings).
    /// Returns the receiver of its [`Event`]s. [`AgentBuilder`](crate::app::AgentBuilder)
    /// assembles all of it from a config.
    ///
    /// It begins a run in the ledger, and marks the workers that a host which has since
    /// stopped (killed, crashed) left running as interrupted, reporting each as an
    /// [`Event::WorkerEnded`].
    pub async fn new(
        config: Config,
        registry: Arc<Registry>,
        services: Services,
        provider: Arc<dyn Provider>,
    ) -> Result<(Arc<Self>, mpsc::UnboundedReceiver<Event>), ServiceError> {
        let starter = Box::new(Processes);
        let (ctx, events) = Context::new(config, registry, services, provider, starter).await?;
        spilling::land_spill(&ctx).await;
        let watchers = [
            tokio::spawn(forwarding::take_forwarded(Arc::downgrade(&ctx))),
            tokio::spawn(forwarding::stop_when_lease_lost(Arc::downgrade(&ctx))),
        ];
        Ok((
            Arc::new(Runtime {
                ctx,
                _watchers: watchers.map(AbortOnDropHandle::new),
                stopping: CancellationToken::new(),
            }),
            events,
        ))
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.ctx.config
    }

    /// The services: taskboard, memory, history, audit log and ledger.
    pub fn services(&self) -> &Services {
        &self.ctx.services
    }

    /// The model provider's name, e.g. `scripted:demo`.
    pub fn provider_name(&self) -> String {
        self.ctx.gate.dispatcher().provider_name()
    }

    /// Sends a user message to channel `name` (opened on first use, with its stored
    /// history).
    pub async fn send_user_message(
        &self,
        channel: &str,
        text: &str,
    ) -> Result<(), ConversationError> {
        self.send_to(&ProcessId::channel(channel), text).await
    }

    /// Sends a message to the admin chat `session`, a cortex process with the cortex
    /// profile's tools (by default every tool). It is its own process, with its own
    /// history and its own session at the gate: the cortex `main` never shares anything
    /// with the user channel `main`. Wait for it with [`Runtime::wait_admin_idle`].
    pub async fn send_admin_message(
        &self,
        session: &str,
        text: &str,
    ) -> Result<(), ConversationError> {
        self.send_to(&ProcessId::named(ProcessKind::Cortex, session), text)
            .await
    }

    /// Sends a user message to conversation `id`, opening it on first use. Fails if its
    /// stored history cannot be read, or once the host is shutting down.
    ///
    /// When hosts share a store and another host answers the conversation, the message is
    /// forwarded to that host (reported as [`Event::Forwarded`]): its turn, its reply and
    /// their events happen there. [`Runtime::send_or_forward`] says which it was.
    pub async fn send_to(&self, id: &ProcessId, text: &str) -> Result<(), ConversationError> {
        self.send_or_forward(id, text).await.map(drop)
    }

    /// [`Runtime::send_to`], saying where the message went: here, or forwarded to the
    /// host that answers the conversation, whose answer [`Runtime::forwarded_answer`]
    /// waits for.
    pub async fn send_or_forward(
        &self,
        id: &ProcessId,
        text: &str,
    ) -> Result<Sent, ConversationError> {
        match self.ctx.spawner.conversation(id).await {
            Ok(handle) => {
                handle.send(ChannelInput::user(text));
                Ok(Sent::Here)
            }
            Err(ConversationError::OwnedElsewhere(elsewhere)) => {
                let number = self.forward(id, text.into(), elsewhere.owner).await?;
                Ok(Sent::Forwarded {
                    owner: elsewhere.owner,
                    number,
                })
            }
            Err(err) => Err(err),
        }
    }

    /// Sends `text` to conversation `id` (opened on first use) and returns the
    /// [`Exchange`] that brings its answer: the parts of the turn that takes it in, of the
    /// workers and branches that turn starts or routes to, and of the turns that take
    /// their reports in, ending once that work is over and the history stored. Messages
    /// the conversation takes in together (they arrived while it was busy) share a turn.
    /// When another host answers the conversation the message is forwarded there and
    /// the exchange brings that host's answer, or ends [`End::Pending`] if it does not
    /// come within five minutes.
    ///
    /// Fails, sending nothing, if the conversation cannot be opened (its history cannot be
    /// read, the host is shutting down, too many are open) or the message cannot be
    /// forwarded.
    ///
    /// ```no_run
    /// # async fn example(runtime: &capstan_host::agent::Runtime) -> anyhow::Result<()> {
    /// use capstan_host::agent::{End, ReplyPart};
    /// use capstan_host::ids::ProcessId;
    ///
    /// let mut exchange = runtime.exchange(&ProcessId::channel("main"), "hello").await?;
    /// while let Some(part) = exchange.next().await {
    ///     match part {
    ///         ReplyPart::Reply { text, .. } => println!("{text}"),
    ///         ReplyPart::End(End::Complete) => println!("(stored)"),
    ///         ReplyPart::End(other) => println!("({other})"),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn exchange(
        &self,
        id: &ProcessId,
        message: impl Into<UserMessage>,
    ) -> Result<Exchange, ConversationError> {
        let message = message.into();
        let (listener, exchange) = Exchange::new(message.key.clone());
        match self.ctx.spawner.conversation(id).await {
            Ok(handle) => {
                // Refused only if the conversation closed meanwhile: the exchange then
                // ends lost, as its listener drops untaken.
                handle.send(ChannelInput::exchange(message, listener));
            }
            Err(ConversationError::OwnedElsewhere(elsewhere)) => {
                let number = self.forward(id, message, elsewhere.owner).await?;
                listener.send(ReplyPart::Activity(Event::Forwarded {
                    channel: id.clone(),
                    owner: elsewhere.owner,
                }));
                // Only the sessions: the wait holds nothing of the runtime, so a stop of
                // this host is never held up by an answer still to come.
                let sessions = self.ctx.services.sessions.clone();
                let redactor = self.ctx.reporter.redactor().clone();
                let stopping = self.stopping.clone();
                tokio::spawn(async move {
                    let owner = elsewhere.owner;
                    let relayed = relay_answer(&*sessions, &redactor, &listener, number);
                    let end = tokio::select! {
                        end = relayed => end,
                        () = stopping.cancelled() => Err(
                            "this host stopped before the answer came".to_owned()
                        ),
                    };
                    listener.end(end.unwrap_or_else(|reason| End::Pending {
                        message: number,
                        owner,
                        reason,
                    }));
                });
            }
            Err(err) => return Err(err),
        }
        Ok(exchange)
    }

    /// Tells observers (the event stream, the metrics) what became of a message through
    /// a messaging channel: a door's own step, as [`Event::ChatMessage`]. The conversation
    /// itself hears nothing of it.
    pub fn note_chat(
        &self,
        channel: &ProcessId,
        via: &str,
        step: crate::agent::ChatStep,
        who: &str,
        chars: usize,
    ) {
        crate::telemetry::metrics().chat_message(via, step.direction(), step.as_str());
        self.ctx.reporter.emit(Event::ChatMessage {
            channel: channel.clone(),
            via: via.to_owned(),
            step,
            who: self.ctx.reporter.redactor().redact_owned(who.to_owned()),
            chars: chars as u64,
        });
    }

    /// The conversations that stopped so far with their history not stored (the store
    /// refused it to the end), each with the store's last error: a stop that lists any
    /// did not save everything it held. [`Runtime::stop_report`] waits for them all.
    pub fn not_saved(&self) -> Vec<NotSaved> {
        self.ctx.conversations.stop.so_far()
    }

    /// A report of what a stop could not store, read once every process has ended: take
    /// it before stopping and dropping the runtime.
    pub fn stop_report(&self) -> StopReport {
        self.ctx.conversations.stop.report()
    }

    /// Forwards `message` to the inbox of `owner`, the run that answers conversation
    /// `id`.
    async fn forward(
        &self,
        id: &ProcessId,
        message: UserMessage,
        owner: RunId,
    ) -> Result<ForwardId, ConversationError> {
        let message = Forwarded::User {
            text: message.text,
            key: message.key,
            traceparent: message.trace.header(),
            label: message.label,
        };
        let number = self
            .ctx
            .services
            .sessions
            .forward(&id.session(), &message)
            .await
            .map_err(ConversationError::Session)?;
        self.ctx.reporter.emit(Event::Forwarded {
            channel: id.clone(),
            owner,
        });
        Ok(number)
    }

    /// Waits, up to `limit`, for the answer to forwarded message `number`: the replies of
    /// the turn that took it in on the host that answers its conversation.
    pub async fn forwarded_answer(
        &self,
        number: ForwardId,
        limit: std::time::Duration,
    ) -> Result<Answer, ServiceError> {
        wait_for_answer(&*self.ctx.services.sessions, number, limit).await
    }

    /// Whether this host takes over a conversation whose owner's run is over (its host
    /// stopped or died) when something was forwarded to it, and answers it. Yes by
    /// default, as a service should; a one-shot session at the terminal says no, so it
    /// never answers conversations it was not asked about. Either way it answers what is
    /// forwarded to its own open conversations.
    pub fn adopt_conversations(&self, adopt: bool) {
        self.ctx
            .adopts
            .store(adopt, std::sync::atomic::Ordering::Relaxed);
    }

    /// Returns once this host's run lease is lost (never, on a store one host uses
    /// alone): it was paused or cut off from the database past the lease, and another
    /// host may answer its conversations now. By then its workers are stopping and its
    /// conversations closing; nothing more is prompted or stored under the run. The host
    /// should exit, and be started again.
    pub async fn lease_lost(&self) {
        self.ctx.run().lost().await
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
        if let Some(handle) = self.ctx.supervisor.channel(id) {
            handle.settled().await;
        }
    }

    /// Starts a worker on `task` for channel `channel`, unless a live worker already has
    /// the same task (compared normalized), in which case nothing starts and the existing
    /// worker is named. With `task_number`, the worker is assigned that task on the board.
    /// No exchange follows it: its report goes into a turn of the channel's own, seen on
    /// the event stream and in the history.
    pub async fn spawn_worker(
        &self,
        channel: &str,
        task: &str,
        interactive: bool,
        task_number: Option<u64>,
    ) -> Result<SpawnOutcome, String> {
        let channel = ProcessId::channel(channel);
        self.ctx
            .spawner
            .spawn_worker(
                &channel,
                None,
                None,
                WorkerTask {
                    text: task,
                    // A person's (or a client's) own words.
                    label: &Label::trusted(),
                    interactive,
                    number: task_number,
                },
            )
            .await
    }

    /// Task descriptions reserved by live workers.
    pub fn reserved_tasks(&self) -> usize {
        self.ctx.spawner.reserved_tasks()
    }

    /// Workers running now (admitted, not yet ended).
    pub fn live_workers(&self) -> usize {
        self.ctx.supervisor.live_workers()
    }

    /// Reservations held at the prompt gate now.
    pub fn gate_reservations(&self) -> usize {
        self.ctx.gate.dispatcher().gate().reservations()
    }

    /// Sends `message` to worker `id`: a waiting worker takes it as its answer, a running
    /// one at its next turn boundary. False if no such worker is running; a message
    /// accepted here is delivered, or reported to the channel as not delivered if the
    /// worker ends first. Any conversation's worker: this is the operator's way in (a
    /// conversation's model reaches only its own workers).
    pub fn route_to_worker(&self, id: &ProcessId, message: &str) -> bool {
        self.ctx.supervisor.route_to_worker(id, message)
    }

    /// Cancels worker `id`; false if no such worker is running.
    pub fn cancel_worker(&self, id: &ProcessId) -> bool {
        self.ctx.supervisor.cancel_worker(id)
    }

    /// Stops the host gracefully after a signal: every running worker ends interrupted
    /// (recorded so, its reservations released, its report kept), the channels finish
    /// the turn in progress and store their history, and the event stream ends once the
    /// last process has finished.
    pub fn interrupt(&self) {
        self.ctx.supervisor.stop_workers(true);
        self.shutdown();
    }

    /// Stops the channels (their loops end once their inboxes close) and cancels running
    /// workers, so the event stream ends once the last process has finished.
    pub fn shutdown(&self) {
        self.stopping.cancel();
        self.ctx.supervisor.close_channels();
        self.ctx.supervisor.stop_workers(false);
        // What still holds the runtime (a connection a server left open) holds no process.
        self.ctx.spawner.stop();
    }

    /// The tools a `kind` process is offered, host tools and plugin tools alike: exactly
    /// those its profile names and grants the capabilities of.
    pub fn tool_defs(&self, kind: ProcessKind) -> Arc<[ToolDef]> {
        self.ctx.gate.tool_defs(kind)
    }

    /// What the start found of runs that ended before it (as [`Event::WorkerEnded`], one
    /// per worker they left running, now interrupted), also on the event stream: no
    /// exchange waits on it, so a door shows it as it starts.
    pub fn found_at_start(&self) -> &[Event] {
        &self.ctx.found_at_start
    }

    /// Where this agent's tool calls go, and its catalog of tools: a door to the tools
    /// alone (MCP) calls them through it, with the agent's policy.
    pub fn router(&self) -> &Arc<ToolRouter> {
        &self.ctx.router
    }

    /// What hides the values of the configured secrets in what leaves the host: every
    /// event, reply and result this runtime tells is passed through it, and a door
    /// passes what it writes through it again ([`OutboundBody`](crate::secrets::OutboundBody)).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use capstan_host::app::AgentBuilder;
    /// use capstan_host::config::Config;
    ///
    /// let agent = AgentBuilder::new(Config::load_or_default()?).build().await?;
    /// let shown = agent.runtime.redactor().redact("what a tool printed");
    /// println!("{shown}");
    /// # Ok(()) }
    /// ```
    pub fn redactor(&self) -> &Redactor {
        self.ctx.reporter.redactor()
    }
}

/// How long a failed look for a forwarded message's answer waits before the next.
const ANSWER_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// Waits, up to `limit`, for the answer to forwarded message `number`. A look that fails
/// (the store is out) is tried again until the limit: the message was taken, so a failure
/// to read its answer is never reported as the message failing.
async fn wait_for_answer(
    sessions: &dyn Sessions,
    number: ForwardId,
    limit: std::time::Duration,
) -> Result<Answer, ServiceError> {
    let mut last_error = None;
    let waiting = async {
        loop {
            match sessions.take_answer(number).await {
                Ok(Some(answer)) => return answer,
                Ok(None) => sessions.answer_wakeup().await,
                Err(err) => {
                    tracing::warn!(forwarded = %number, "cannot read the answer yet (trying again): {err}");
                    last_error = Some(err.to_string());
                    tokio::time::sleep(ANSWER_RETRY).await;
                }
            }
        }
    };
    match tokio::time::timeout(limit, waiting).await {
        Ok(answer) => Ok(answer),
        Err(_) => Err(ServiceError::Invalid(format!(
            "no answer to {number} within {} s{}: the host that answers the conversation \
             may answer it yet, or may have stopped first; send it again with the same \
             idempotency key to learn its answer",
            limit.as_secs(),
            last_error
                .map(|e| format!(" (the last look failed: {e})"))
                .unwrap_or_default(),
        ))),
    }
}

/// Brings the answer to forwarded message `number` to `listener`: how its exchange ends,
/// or why the answer is pending (redacted).
async fn relay_answer(
    sessions: &dyn Sessions,
    redactor: &Redactor,
    listener: &Listener,
    number: ForwardId,
) -> Result<End, String> {
    match wait_for_answer(sessions, number, FORWARDED_ANSWER_LIMIT).await {
        Ok(answer) => {
            let end = end_of(&answer);
            if !answer.reply.is_empty() {
                listener.send(ReplyPart::Reply {
                    text: answer.reply,
                    streamed: false,
                });
            }
            Ok(end)
        }
        Err(err) => Err(redactor.redact_owned(err.to_string())),
    }
}
