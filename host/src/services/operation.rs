//! The operations of the services, each named once: backends label their errors and
//! lost work with an [`Operation`], and the plugin imports name the one a refused call
//! asked for.

use std::fmt;

macro_rules! operations {
    ($($(#[$doc:meta])* $variant:ident = $label:literal,)*) => {
        /// One operation of one service, e.g. [`Operation::TasksCreate`] (`tasks.create`).
        ///
        /// ```
        /// use capstan_host::services::Operation;
        ///
        /// assert_eq!(Operation::MemoryWorkingGet.to_string(), "memory.working-get");
        /// assert_eq!(Operation::MemoryWorkingGet.service(), "memory");
        /// ```
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Operation {
            $($(#[$doc])* $variant,)*
        }

        impl Operation {
            /// Every operation.
            pub const ALL: &'static [Operation] = &[$(Operation::$variant,)*];

            /// Its label, `service.operation`: the name a plugin's import has for the
            /// tasks and memory operations (`memory.working-get`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Operation::$variant => $label,)*
                }
            }
        }
    };
}

operations! {
    /// [`TaskBoard::create`](super::TaskBoard::create).
    TasksCreate = "tasks.create",
    /// [`TaskBoard::get`](super::TaskBoard::get).
    TasksGet = "tasks.get",
    /// [`TaskBoard::list`](super::TaskBoard::list).
    TasksList = "tasks.list",
    /// [`TaskBoard::update`](super::TaskBoard::update).
    TasksUpdate = "tasks.update",
    /// [`Approvals::park`](super::Approvals::park).
    ApprovalsPark = "approvals.park",
    /// [`Approvals::get`](super::Approvals::get).
    ApprovalsGet = "approvals.get",
    /// [`Approvals::list`](super::Approvals::list).
    ApprovalsList = "approvals.list",
    /// [`Approvals::decide`](super::Approvals::decide).
    ApprovalsDecide = "approvals.decide",
    /// [`Approvals::take`](super::Approvals::take).
    ApprovalsTake = "approvals.take",
    /// [`Approvals::withdraw`](super::Approvals::withdraw).
    ApprovalsWithdraw = "approvals.withdraw",
    /// [`Approvals::endorsed`](super::Approvals::endorsed).
    ApprovalsEndorsed = "approvals.endorsed",
    /// [`FileLabels::record`](super::FileLabels::record).
    FilesRecord = "files.record",
    /// [`FileLabels::get`](super::FileLabels::get).
    FilesGet = "files.get",
    /// [`FileLabels::beneath`](super::FileLabels::beneath).
    FilesBeneath = "files.beneath",
    /// [`ChainStore::append`](super::ChainStore::append).
    ChainAppend = "chain.append",
    /// [`ChainStore::entries`](super::ChainStore::entries).
    ChainEntries = "chain.entries",
    /// [`Memory::save`](super::Memory::save).
    MemorySave = "memory.save",
    /// [`Memory::recall`](super::Memory::recall).
    MemoryRecall = "memory.recall",
    /// [`Memory::delete`](super::Memory::delete).
    MemoryDelete = "memory.delete",
    /// [`Memory::working_get`](super::Memory::working_get).
    MemoryWorkingGet = "memory.working-get",
    /// [`Memory::working_set`](super::Memory::working_set).
    MemoryWorkingSet = "memory.working-set",
    /// [`Memory::working_keys`](super::Memory::working_keys).
    MemoryWorkingKeys = "memory.working-keys",
    /// [`History::load`](super::History::load).
    HistoryLoad = "history.load",
    /// [`History::append`](super::History::append).
    HistoryAppend = "history.append",
    /// [`History::replace`](super::History::replace).
    HistoryReplace = "history.replace",
    /// [`History::conversations`](super::History::conversations).
    HistoryConversations = "history.conversations",
    /// [`AuditSink::record`](super::AuditSink::record).
    AuditRecord = "audit.record",
    /// [`AuditSink::page`](super::AuditSink::page).
    AuditPage = "audit.page",
    /// [`AuditSink::costs`](super::AuditSink::costs).
    AuditCosts = "audit.costs",
    /// [`AuditSink::record_request`](super::AuditSink::record_request).
    AuditRecordRequest = "audit.record-request",
    /// [`AuditSink::recent_requests`](super::AuditSink::recent_requests).
    AuditRecentRequests = "audit.recent-requests",
    /// [`Ledger::begin_run`](super::Ledger::begin_run).
    LedgerBeginRun = "ledger.begin-run",
    /// [`Ledger::next_process_number`](super::Ledger::next_process_number).
    LedgerNextProcessNumber = "ledger.next-process-number",
    /// [`Ledger::worker_started`](super::Ledger::worker_started).
    LedgerWorkerStarted = "ledger.worker-started",
    /// [`Ledger::admit_worker`](super::Ledger::admit_worker).
    LedgerAdmitWorker = "ledger.admit-worker",
    /// [`Ledger::set_worker_state`](super::Ledger::set_worker_state).
    LedgerSetWorkerState = "ledger.set-worker-state",
    /// [`Ledger::worker`](super::Ledger::worker).
    LedgerWorker = "ledger.worker",
    /// [`Ledger::workers`](super::Ledger::workers).
    LedgerWorkers = "ledger.workers",
    /// [`Ledger::mark_interrupted_workers`](super::Ledger::mark_interrupted_workers).
    LedgerMarkInterruptedWorkers = "ledger.mark-interrupted-workers",
    /// [`Ledger::reserve_task`](super::Ledger::reserve_task).
    LedgerReserveTask = "ledger.reserve-task",
    /// [`Ledger::release_task`](super::Ledger::release_task).
    LedgerReleaseTask = "ledger.release-task",
    /// [`Sessions::claim`](super::Sessions::claim).
    SessionsClaim = "sessions.claim",
    /// A history write checked against the session's owner and epoch.
    SessionsFence = "sessions.fence",
    /// [`Sessions::forward`](super::Sessions::forward).
    SessionsForward = "sessions.forward",
    /// [`Sessions::forwarded_sessions`](super::Sessions::forwarded_sessions).
    SessionsForwardedSessions = "sessions.forwarded-sessions",
    /// [`Sessions::take_forwarded`](super::Sessions::take_forwarded).
    SessionsTakeForwarded = "sessions.take-forwarded",
    /// [`Sessions::answer`](super::Sessions::answer).
    SessionsAnswer = "sessions.answer",
    /// [`Sessions::take_answer`](super::Sessions::take_answer).
    SessionsTakeAnswer = "sessions.take-answer",
    /// The runs a status report lists.
    StatusRuns = "status.runs",
    /// The sessions a status report lists.
    StatusSessions = "status.sessions",
    /// Opening the store.
    StoreOpen = "store.open",
    /// Bringing the store's schema to this version.
    StoreMigrate = "store.migrate",
}

impl Operation {
    /// The service it belongs to: `tasks` of `tasks.create`.
    pub fn service(self) -> &'static str {
        let label = self.as_str();
        label.split_once('.').map_or(label, |(service, _)| service)
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct_and_well_formed() {
        let labels: std::collections::HashSet<_> =
            Operation::ALL.iter().map(|op| op.as_str()).collect();
        assert_eq!(labels.len(), Operation::ALL.len());
        for label in labels {
            let (service, operation) = label.split_once('.').unwrap();
            assert!(!service.is_empty() && !operation.is_empty(), "{label}");
            assert!(
                label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'.' || b == b'-'),
                "{label}"
            );
        }
    }
}
