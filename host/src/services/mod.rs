//! The services every process and plugin shares, behind traits: the [`TaskBoard`], the
//! [`Memory`], the conversation [`History`], the [`AuditSink`], the [`Ledger`] of runs
//! and workers, the [`Sessions`] each run owns, the [`Approvals`] of parked calls and the
//! signed [`AuditChain`] of decisions.
//!
//! The agent and the plugin imports hold a [`Services`] and never a backend: SQLite
//! ([`Store::services`](crate::store::Store::services)) is one implementation, whose
//! blocking calls run off the async executor; [`InMemory`] is another, for tests and
//! embedders that keep nothing; [`Postgres`](crate::postgres::Postgres) is the third, for
//! hosts sharing one database. A new backend implements the nine traits (a store one host
//! uses alone takes [`Sessions`]' defaults), applies the rules that need what it stores
//! ([`TaskStatus::check_move`], [`worker_has_ended`]) in the same transaction as the
//! write, and passes the same conformance checks the three backends pass. The rules on
//! what goes in ([`NewTask::checked`], [`NewMemory::checked`], [`redact`]) are applied in
//! front of every backend by [`Services::all_from`].
//!
//! ```
//! use capstan_host::services::{NewTask, Services};
//! use capstan_host::ids::{Caller, ProcessId, ProcessKind};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let services = Services::in_memory();
//! let who = Caller::from(ProcessId::numbered(ProcessKind::Worker, 1));
//! let task = services.tasks.create(&who, NewTask::titled("Write the report")).await.unwrap();
//! assert_eq!(services.tasks.get(task.number).await.unwrap().title, "Write the report");
//! # });
//! ```

mod approvals;
mod audit;
mod chain;
mod checked;
mod error;
mod file_labels;
mod history;
mod in_memory;
mod ledger;
mod memory;
mod operation;
mod receipt;
mod sessions;
mod tasks;

#[cfg(test)]
pub(crate) mod conformance;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

pub use approvals::{
    APPROVALS_LIST_MAX, Approval, ApprovalId, ApprovalState, Approvals, Endorsement, Lease,
    NewApproval, Verdict, already_decided, endorsements, no_approval,
};
pub use audit::{
    AuditDestination, AuditEntry, AuditRecord, AuditSink, Committing, NO_STORE, REDACTED,
    RequestDecision, RequestEntry, RequestRecord, redact, sum_costs,
};
pub use chain::{
    AuditChain, ChainBreak, ChainEntry, ChainEvent, ChainRecord, ChainStore, GENESIS, HostKey,
    Verifier, entry_hash, hash_bytes, sealed,
};
pub use error::ServiceError;
pub use file_labels::{FILE_LABELS_MAX, FileLabel, FileLabels, FileStamp};
pub(crate) use file_labels::{lies_beneath, stored_file_label};
pub use history::{ConversationSummary, History, HistoryEntry};
pub use in_memory::InMemory;
pub use ledger::{
    LeaseClock, Ledger, Run, RunId, WorkerRecord, WorkerState, interrupted_outcome,
    worker_already_recorded, worker_has_ended,
};
pub use memory::{
    DEFAULT_IMPORTANCE, Memory, MemoryItem, NewMemory, RECALL_MAX, WorkingEntry, check_working_key,
    expires_at, memory_words, recall_terms, recall_words,
};
pub use operation::Operation;
pub use receipt::{CostReport, Costs, CostsBy, CostsOf, Receipt, day_of};
pub use sessions::{Answer, AnswerOutcome, Claim, Epoch, ForwardId, Forwarded, Sessions};
pub use tasks::{
    DEFAULT_LIST_LIMIT, NewTask, Priority, Task, TaskBoard, TaskFilter, TaskPatch, TaskStatus,
    check_metadata, checked_title,
};

/// One handle on each service. Cloning it is cheap and shares the services.
#[derive(Clone)]
pub struct Services {
    /// The taskboard.
    pub tasks: Arc<dyn TaskBoard>,
    /// Long-term and working memory.
    pub memory: Arc<dyn Memory>,
    /// Conversation history.
    pub history: Arc<dyn History>,
    /// The audit log of tool calls.
    pub audit: Arc<dyn AuditSink>,
    /// Runs, process numbers and worker records.
    pub ledger: Arc<dyn Ledger>,
    /// Which run owns each session, and the inboxes of sessions owned elsewhere.
    pub sessions: Arc<dyn Sessions>,
    /// Parked calls and the approvals a person gave them.
    pub approvals: Arc<dyn Approvals>,
    /// The signed chain of approvals, denials and flow refusals.
    pub chain: AuditChain,
    /// The labels of the workspace files processes wrote.
    pub files: Arc<dyn FileLabels>,
}

impl Services {
    /// Every service answered by `backend`, behind the rules on what goes in (checked
    /// tasks and memories, redacted audit arguments), so a backend applies none of them.
    pub fn all_from<B>(backend: Arc<B>) -> Self
    where
        B: TaskBoard
            + Memory
            + History
            + AuditSink
            + Ledger
            + Sessions
            + Approvals
            + ChainStore
            + FileLabels
            + 'static,
    {
        let chain = AuditChain::new(backend.clone());
        Services {
            tasks: Arc::new(checked::CheckedTasks(backend.clone())),
            memory: Arc::new(checked::CheckedMemory(backend.clone())),
            history: backend.clone(),
            audit: Arc::new(checked::RedactedAudit(backend.clone())),
            ledger: backend.clone(),
            sessions: backend.clone(),
            files: backend.clone(),
            approvals: Arc::new(checked::RedactedApprovals {
                approvals: backend,
                chain: chain.clone(),
            }),
            chain,
        }
    }

    /// These services, their audit chain signed with `key` from now on.
    pub fn signed_by(self, key: HostKey) -> Self {
        self.chain.sign_with(key);
        self
    }

    /// Fresh services that keep everything in this process's memory, and lose it when
    /// the last clone is dropped.
    pub fn in_memory() -> Self {
        Services::all_from(Arc::new(InMemory::default()))
    }
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("history", &self.history.location())
            .finish_non_exhaustive()
    }
}

/// Seconds since the Unix epoch: the clock of every timestamp and expiry the services keep.
pub(crate) fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
