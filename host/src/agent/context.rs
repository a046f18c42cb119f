//! [`Context`]: what the runtime holds of one agent: its config, its services, and the
//! handles it builds once for the processes: the tool router, asking the model
//! ([`ModelGate`]), telling what processes do ([`Reporter`]), the conversations' store
//! ([`Conversations`]), which processes are alive ([`Supervisor`]) and starting them
//! ([`Spawner`]).
//!
//! No process holds the context: the spawner hands each its kit, and no process reaches
//! into the services behind the handles.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::conversations::Conversations;
use super::events::{Event, EventSink};
use super::model_gate::ModelGate;
use super::process_ids::ProcessIds;
use super::reporter::{Audiences, Reporter};
use super::spawning::{Handles, Settings, Spawner, Starter};
use super::spill::Spill;
use super::stop::StopLedger;
use super::supervisor::Supervisor;
use super::worker_records::WorkerRecords;
use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::llm::Provider;
use crate::plugin::Registry;
use crate::services::{Run, RunId, ServiceError, Services, WorkerState};
use crate::tools::{ToolCatalog, ToolRouter};

/// What the runtime holds of one agent: its config and services, and the handles it built
/// for the processes.
pub(crate) struct Context {
    pub(super) config: Config,
    /// Where each tool call goes, and which tools each kind is offered.
    pub(super) router: Arc<ToolRouter>,
    /// The services, for the runtime; processes use the handles of their kits.
    pub(super) services: Services,
    /// How processes ask the model.
    pub(super) gate: Arc<ModelGate>,
    /// Which processes are alive.
    pub(super) supervisor: Arc<Supervisor>,
    /// How processes tell what they do.
    pub(super) reporter: Arc<Reporter>,
    /// What conversations ask of the store.
    pub(super) conversations: Arc<Conversations>,
    /// Opens conversations and starts workers and branches.
    pub(super) spawner: Arc<Spawner>,
    /// This host's run in the ledger: owns the worker records it writes, and tells a later
    /// start whether this run is still alive.
    run: Arc<Run>,
    /// Whether this host takes over conversations whose owner's run is over, with what
    /// was forwarded to them.
    pub(super) adopts: std::sync::atomic::AtomicBool,
    /// What the start found of runs that ended before it (their workers, interrupted):
    /// no exchange waits on it, so a door shows it as it starts.
    pub(super) found_at_start: Vec<Event>,
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
        withdraw_stale_approvals(&services, &stale).await?;
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
        let router = ToolRouter::new(registry, catalog, workspace)
            .with_approvals(
                services.approvals.clone(),
                services.chain.clone(),
                config.limits.approval_wait,
            )
            .with_file_labels(services.files.clone(), config.agent.workspace_label);
        let router = Arc::new(router);
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
        let records = WorkerRecords::new(services.ledger.clone(), run.id(), limit);
        let (stop, running) = StopLedger::new();
        let conversations = Conversations::new(
            services.history.clone(),
            services.sessions.clone(),
            reporter.clone(),
            run.clone(),
            config.limits.unstored_reply,
            spill,
            stop,
        );
        let conversations = Arc::new(conversations);
        let max_turns = config.limits.max_turns;
        let gate = ModelGate::new(
            dispatcher,
            router.clone(),
            reporter.clone(),
            run.clone(),
            max_turns,
        );
        let gate = Arc::new(gate);
        let settings = Settings {
            agent_name: config.agent.name.clone(),
            limits: config.limits.clone(),
        };
        let handles = Handles {
            gate: gate.clone(),
            reporter: reporter.clone(),
            supervisor: supervisor.clone(),
            conversations: conversations.clone(),
            records: Arc::new(records),
            ids: ProcessIds::new(services.ledger.clone()),
            settings: Arc::new(settings),
        };
        let spawner = Spawner::new(handles, services.tasks.clone(), starter, running);
        let ctx = Arc::new(Context {
            config,
            router,
            services,
            gate,
            supervisor,
            reporter,
            conversations,
            spawner: Arc::new(spawner),
            run,
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
}

/// Withdraws the approvals still pending for `stale` workers (those a stopped host left
/// running): nothing waits for them any more, and a person should not be asked.
async fn withdraw_stale_approvals(
    services: &Services,
    stale: &[crate::services::WorkerRecord],
) -> Result<(), ServiceError> {
    if stale.is_empty() {
        return Ok(());
    }
    let pending = services
        .approvals
        .list(true, crate::services::APPROVALS_LIST_MAX)
        .await?;
    for approval in pending {
        if stale.iter().any(|worker| worker.id == approval.process) {
            services.approvals.withdraw(approval.id).await?;
        }
    }
    Ok(())
}
