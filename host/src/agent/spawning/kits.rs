//! What each kind of process is started with: the handles its work needs and no other.
//!
//! A process never holds the runtime's [`Context`](crate::agent::context::Context): a
//! worker gets no way to start processes or open conversations, a branch none to save a
//! conversation, the compactor none to reach any process. The [`Spawner`] hands each
//! process its kit as it starts it, from the one set of [`Handles`] the runtime built.
//! Every kit also carries the spawner's [`Running`] token, so a stop report waits for the
//! last process to end.
//!
//! | kit | model | reporter | supervisor | conversations | spawner | worker records | ids |
//! |-----|-------|----------|------------|---------------|---------|----------------|-----|
//! | [`ChannelKit`] | yes | yes | yes | yes | yes | | (its compactor's) |
//! | [`BranchKit`] | yes | yes | yes | | yes | | |
//! | [`WorkerKit`] | yes | yes | yes | | | yes | |
//! | [`CompactorKit`] | yes | yes | | | | | yes |

use std::sync::Arc;

use super::Spawner;
use crate::agent::conversations::Conversations;
use crate::agent::model_gate::ModelGate;
use crate::agent::process_ids::ProcessIds;
use crate::agent::reporter::Reporter;
use crate::agent::stop::Running;
use crate::agent::supervisor::Supervisor;
use crate::agent::worker_records::WorkerRecords;
use crate::config::AgentLimits;

/// What every process's prompt and bounds are made of: the agent's name and its limits.
#[derive(Debug)]
pub(crate) struct Settings {
    /// `agent.name`, in every system prompt.
    pub(crate) agent_name: String,
    /// `[limits]`.
    pub(crate) limits: AgentLimits,
}

/// Every handle some kind of process is given, built once by the runtime; each kit takes
/// its share.
#[derive(Clone)]
pub(crate) struct Handles {
    pub(crate) gate: Arc<ModelGate>,
    pub(crate) reporter: Arc<Reporter>,
    pub(crate) supervisor: Arc<Supervisor>,
    pub(crate) conversations: Arc<Conversations>,
    pub(crate) records: Arc<WorkerRecords>,
    pub(crate) ids: ProcessIds,
    pub(crate) settings: Arc<Settings>,
}

/// What a conversation (channel or cortex) is started with.
#[derive(Clone)]
pub(crate) struct ChannelKit {
    /// How it asks the model.
    pub(crate) gate: Arc<ModelGate>,
    /// How it tells what it does, and delivers its replies.
    pub(crate) reporter: Arc<Reporter>,
    /// Its own workers, which it routes messages to and cancels.
    pub(crate) supervisor: Arc<Supervisor>,
    /// Its history's store.
    pub(crate) conversations: Arc<Conversations>,
    /// How it starts workers and branches.
    pub(crate) spawner: Arc<Spawner>,
    /// What its compactor runs with, inside its turn.
    pub(crate) compactor: CompactorKit,
    pub(crate) settings: Arc<Settings>,
    _running: Running,
}

/// What a branch is started with.
#[derive(Clone)]
pub(crate) struct BranchKit {
    pub(crate) gate: Arc<ModelGate>,
    pub(crate) reporter: Arc<Reporter>,
    /// Where it says it is alive.
    pub(crate) supervisor: Arc<Supervisor>,
    /// How it starts workers (its one host tool).
    pub(crate) spawner: Arc<Spawner>,
    pub(crate) settings: Arc<Settings>,
    _running: Running,
}

/// What a worker is started with.
#[derive(Clone)]
pub(crate) struct WorkerKit {
    pub(crate) gate: Arc<ModelGate>,
    pub(crate) reporter: Arc<Reporter>,
    /// Where it says it is alive, waiting or over.
    pub(crate) supervisor: Arc<Supervisor>,
    /// What it writes of itself in the ledger.
    pub(crate) records: Arc<WorkerRecords>,
    pub(crate) settings: Arc<Settings>,
    _running: Running,
}

/// What the compactor runs with.
#[derive(Clone)]
pub(crate) struct CompactorKit {
    pub(crate) gate: Arc<ModelGate>,
    pub(crate) reporter: Arc<Reporter>,
    /// Numbers each compactor run.
    pub(crate) ids: ProcessIds,
    pub(crate) settings: Arc<Settings>,
    _running: Running,
}

impl Handles {
    /// A conversation's kit, starting processes through `spawner`, holding `running`.
    pub(crate) fn channel(&self, spawner: &Arc<Spawner>, running: Running) -> ChannelKit {
        ChannelKit {
            gate: self.gate.clone(),
            reporter: self.reporter.clone(),
            supervisor: self.supervisor.clone(),
            conversations: self.conversations.clone(),
            spawner: spawner.clone(),
            compactor: self.compactor(running.clone()),
            settings: self.settings.clone(),
            _running: running,
        }
    }

    /// A branch's kit, starting workers through `spawner`, holding `running`.
    pub(crate) fn branch(&self, spawner: &Arc<Spawner>, running: Running) -> BranchKit {
        BranchKit {
            gate: self.gate.clone(),
            reporter: self.reporter.clone(),
            supervisor: self.supervisor.clone(),
            spawner: spawner.clone(),
            settings: self.settings.clone(),
            _running: running,
        }
    }

    /// A worker's kit, holding `running`.
    pub(crate) fn worker(&self, running: Running) -> WorkerKit {
        WorkerKit {
            gate: self.gate.clone(),
            reporter: self.reporter.clone(),
            supervisor: self.supervisor.clone(),
            records: self.records.clone(),
            settings: self.settings.clone(),
            _running: running,
        }
    }

    /// The compactor's kit, holding `running`.
    pub(crate) fn compactor(&self, running: Running) -> CompactorKit {
        CompactorKit {
            gate: self.gate.clone(),
            reporter: self.reporter.clone(),
            ids: self.ids.clone(),
            settings: self.settings.clone(),
            _running: running,
        }
    }
}
