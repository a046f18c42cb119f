//! The store as [`Services`]: each call runs the store's blocking SQLite work on one of
//! tokio's blocking threads, so a database that another process holds locked makes that
//! one call wait, never the executor and the calls beside it. A caller that stops waiting
//! (a tool call at its deadline) abandons the wait; the work still finishes on its thread.

use std::sync::Arc;

use async_trait::async_trait;

use super::audit::StampedCall;
use super::group_commit::GroupCommit;
use super::{Store, StoreError};
use super::{audit, history, retry};
use crate::flow::ArgsDigest;
use crate::flow::Label;
use crate::ids::{Caller, ProcessId, ProcessKind, SessionKey};
use crate::services::Operation;
use crate::services::{
    Approval, ApprovalId, Approvals, AuditDestination, AuditEntry, AuditRecord, AuditSink,
    Committing, ConversationSummary, History, HistoryEntry, Ledger, Memory, MemoryItem,
    NewApproval, NewMemory, NewTask, RequestEntry, RequestRecord, Run, RunId, ServiceError,
    Services, Sessions, Task, TaskBoard, TaskFilter, TaskPatch, Verdict, WorkerRecord, WorkerState,
};
use crate::services::{ChainEntry, ChainRecord, ChainStore, Endorsement, HostKey, WorkingEntry};
use crate::services::{FileLabel, FileLabels, FileStamp};

impl Store {
    /// Every service, answered by this store.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use capstan_host::services::NewTask;
    /// use capstan_host::ids::{Caller, ProcessId, ProcessKind};
    /// use capstan_host::store::Store;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let dir = tempfile::tempdir().unwrap();
    /// let services = Arc::new(Store::open(dir.path()).unwrap()).services();
    /// let who = Caller::from(ProcessId::numbered(ProcessKind::Worker, 1));
    /// let task = services.tasks.create(&who, NewTask::titled("Sort")).await.unwrap();
    /// assert_eq!(task.number, 1);
    /// # });
    /// ```
    pub fn services(self: Arc<Self>) -> Services {
        Services::all_from(Arc::new(Sqlite {
            calls: GroupCommit::new(self.clone(), Operation::AuditRecord, audit::insert_stamped),
            requests: GroupCommit::new(
                self.clone(),
                Operation::AuditRecordRequest,
                audit::insert_requests,
            ),
            appends: GroupCommit::with_retry(
                self.clone(),
                Operation::HistoryAppend,
                history::append_all,
                retry::HISTORY_RETRY_FOR,
            ),
            store: self,
        }))
    }

    /// Opens the store in `data_dir` on a blocking thread (an open may wait for another
    /// process's and checks the whole file) and returns its [`Services`].
    pub async fn open_services(data_dir: &std::path::Path) -> Result<Services, ServiceError> {
        let dir = data_dir.to_owned();
        let opened = tokio::task::spawn_blocking(move || Store::open(&dir)).await;
        let store = opened.map_err(|_| ServiceError::Lost(Operation::StoreOpen))??;
        Ok(Arc::new(store).services())
    }
}

/// The store behind the service traits. Audit rows and history appends go through a
/// [`GroupCommit`] each, so a burst of them shares transactions; every caller still waits
/// for the commit that holds its rows.
struct Sqlite {
    store: Arc<Store>,
    calls: Arc<GroupCommit<StampedCall>>,
    requests: Arc<GroupCommit<RequestRecord>>,
    appends: Arc<GroupCommit<(String, Vec<String>)>>,
}

impl Sqlite {
    /// Runs `work` on a blocking thread and waits for it without holding the executor.
    async fn run<T: Send + 'static>(
        &self,
        what: Operation,
        work: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, ServiceError> {
        let store = self.store.clone();
        let done = tokio::task::spawn_blocking(move || work(&store))
            .await
            .map_err(|_| ServiceError::Lost(what))?;
        done.map_err(|err| ServiceError::from(self.store.locate(err)))
    }
}

#[async_trait]
impl TaskBoard for Sqlite {
    async fn create(&self, creator: &Caller, task: NewTask) -> Result<Task, ServiceError> {
        let creator = creator.clone();
        self.run(Operation::TasksCreate, move |s| {
            s.create_task(&creator, &task)
        })
        .await
    }

    async fn get(&self, number: u64) -> Result<Task, ServiceError> {
        self.run(Operation::TasksGet, move |s| s.get_task(number))
            .await
    }

    async fn list(&self, filter: TaskFilter) -> Result<Vec<Task>, ServiceError> {
        self.run(Operation::TasksList, move |s| s.list_tasks(&filter))
            .await
    }

    async fn update(&self, number: u64, patch: TaskPatch) -> Result<Task, ServiceError> {
        self.run(Operation::TasksUpdate, move |s| {
            s.update_task(number, &patch)
        })
        .await
    }
}

#[async_trait]
impl Memory for Sqlite {
    async fn save(&self, source: &Caller, memory: NewMemory) -> Result<MemoryItem, ServiceError> {
        let source = source.clone();
        self.run(Operation::MemorySave, move |s| {
            s.save_memory(&source, &memory)
        })
        .await
    }

    async fn recall(&self, query: &str, limit: u32) -> Result<Vec<MemoryItem>, ServiceError> {
        let query = query.to_owned();
        self.run(Operation::MemoryRecall, move |s| s.recall(&query, limit))
            .await
    }

    async fn delete(&self, id: u64) -> Result<(), ServiceError> {
        self.run(Operation::MemoryDelete, move |s| s.delete_memory(id))
            .await
    }

    async fn working_get(&self, key: &str) -> Result<Option<WorkingEntry>, ServiceError> {
        let key = key.to_owned();
        self.run(Operation::MemoryWorkingGet, move |s| s.working_get(&key))
            .await
    }

    async fn working_set(
        &self,
        key: &str,
        value: &str,
        label: &Label,
        ttl_seconds: Option<u64>,
    ) -> Result<(), ServiceError> {
        let (key, value, label) = (key.to_owned(), value.to_owned(), label.clone());
        self.run(Operation::MemoryWorkingSet, move |s| {
            s.working_set(&key, &value, &label, ttl_seconds)
        })
        .await
    }

    async fn working_keys(&self, prefix: &str) -> Result<Vec<String>, ServiceError> {
        let prefix = prefix.to_owned();
        self.run(Operation::MemoryWorkingKeys, move |s| {
            s.working_keys(&prefix)
        })
        .await
    }
}

#[async_trait]
impl History for Sqlite {
    fn location(&self) -> String {
        self.store.path().display().to_string()
    }

    async fn load(&self, channel: &SessionKey) -> Result<Vec<HistoryEntry>, ServiceError> {
        let channel = channel.as_str().to_owned();
        self.run(Operation::HistoryLoad, move |s| s.load_history(&channel))
            .await
    }

    async fn append(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.appends
            .submit((channel.as_str().to_owned(), messages))
            .await
    }

    async fn replace(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        let channel = channel.as_str().to_owned();
        self.run(Operation::HistoryReplace, move |s| {
            s.replace_history(&channel, &messages)
        })
        .await
    }

    async fn conversations(&self) -> Result<Vec<ConversationSummary>, ServiceError> {
        self.run(Operation::HistoryConversations, Store::conversations)
            .await
    }
}

#[async_trait]
impl AuditSink for Sqlite {
    async fn record(&self, call: AuditRecord) -> Result<(), ServiceError> {
        self.calls.submit(StampedCall::now(call)).await
    }

    async fn record_soon(&self, call: AuditRecord) -> Committing {
        Committing::new(self.calls.enqueue(StampedCall::now(call)).wait())
    }

    async fn page(&self, before: Option<u64>, limit: u32) -> Result<Vec<AuditEntry>, ServiceError> {
        self.run(Operation::AuditPage, move |s| s.audit_page(before, limit))
            .await
    }

    async fn costs(
        &self,
        by: crate::services::CostsBy,
        of: &crate::services::CostsOf,
    ) -> Result<Vec<crate::services::Costs>, ServiceError> {
        let of = of.clone();
        self.run(Operation::AuditCosts, move |s| s.audit_costs(by, &of))
            .await
    }

    async fn record_request(&self, request: RequestRecord) -> Result<(), ServiceError> {
        self.requests.submit(request).await
    }

    async fn recent_requests(&self, limit: u32) -> Result<Vec<RequestEntry>, ServiceError> {
        self.run(Operation::AuditRecentRequests, move |s| {
            s.request_log(limit)
        })
        .await
    }

    fn destination(&self) -> AuditDestination {
        AuditDestination::Kept(format!("SQLite at {}", self.store.path().display()))
    }
}

/// One host alone: it owns every session.
#[async_trait]
impl Sessions for Sqlite {}

#[async_trait]
impl Ledger for Sqlite {
    async fn begin_run(&self) -> Result<Run, ServiceError> {
        let guard = self
            .run(Operation::LedgerBeginRun, Store::begin_run)
            .await?;
        Ok(Run::new(guard.id(), guard))
    }

    async fn next_process_number(&self, kind: ProcessKind) -> Result<u64, ServiceError> {
        self.run(Operation::LedgerNextProcessNumber, move |s| {
            s.next_process_number(kind)
        })
        .await
    }

    async fn worker_started(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), ServiceError> {
        let (id, channel, task) = (id.clone(), channel.clone(), task.to_owned());
        self.run(Operation::LedgerWorkerStarted, move |s| {
            s.insert_worker_in_run(run, &id, &channel, &task)
        })
        .await
    }

    async fn set_worker_state(
        &self,
        id: &ProcessId,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError> {
        let (id, outcome) = (id.clone(), outcome.map(str::to_owned));
        self.run(Operation::LedgerSetWorkerState, move |s| {
            s.set_worker_state(&id, state, outcome.as_deref())
        })
        .await
    }

    async fn worker(&self, id: &ProcessId) -> Result<Option<WorkerRecord>, ServiceError> {
        let id = id.clone();
        self.run(Operation::LedgerWorker, move |s| s.get_worker(&id))
            .await
    }

    async fn workers(&self, limit: u32) -> Result<Vec<WorkerRecord>, ServiceError> {
        self.run(Operation::LedgerWorkers, move |s| s.list_workers(limit))
            .await
    }

    async fn mark_interrupted_workers(&self) -> Result<Vec<WorkerRecord>, ServiceError> {
        self.run(
            Operation::LedgerMarkInterruptedWorkers,
            Store::mark_interrupted_workers,
        )
        .await
    }
}

#[async_trait]
impl Approvals for Sqlite {
    async fn park(&self, call: NewApproval) -> Result<Approval, ServiceError> {
        self.run(Operation::ApprovalsPark, move |s| s.park_call(&call))
            .await
    }

    async fn get(&self, id: ApprovalId) -> Result<Approval, ServiceError> {
        self.run(Operation::ApprovalsGet, move |s| s.approval(id))
            .await
    }

    async fn list(&self, pending_only: bool, limit: u32) -> Result<Vec<Approval>, ServiceError> {
        self.run(Operation::ApprovalsList, move |s| {
            s.approvals(pending_only, limit)
        })
        .await
    }

    async fn decide(
        &self,
        id: ApprovalId,
        verdict: Verdict,
        by: &str,
    ) -> Result<Approval, ServiceError> {
        let by = by.to_owned();
        self.run(Operation::ApprovalsDecide, move |s| {
            s.decide_approval(id, verdict, &by)
        })
        .await
    }

    async fn take(
        &self,
        process: &ProcessId,
        tool: &str,
        digest: ArgsDigest,
    ) -> Result<Option<Approval>, ServiceError> {
        let (process, tool) = (process.clone(), tool.to_owned());
        self.run(Operation::ApprovalsTake, move |s| {
            s.take_lease(&process, &tool, digest)
        })
        .await
    }

    async fn withdraw(&self, id: ApprovalId) -> Result<bool, ServiceError> {
        self.run(Operation::ApprovalsWithdraw, move |s| {
            s.withdraw_approval(id)
        })
        .await
    }

    async fn endorsed(&self, process: &ProcessId) -> Result<Vec<Endorsement>, ServiceError> {
        let process = process.clone();
        self.run(Operation::ApprovalsEndorsed, move |s| {
            s.endorsed_handles(&process)
        })
        .await
    }
}

#[async_trait]
impl ChainStore for Sqlite {
    async fn append(
        &self,
        record: ChainRecord,
        key: Arc<HostKey>,
    ) -> Result<ChainEntry, ServiceError> {
        self.run(Operation::ChainAppend, move |s| {
            s.append_chain(&record, &key)
        })
        .await
    }

    async fn entries(&self, after: u64, limit: u32) -> Result<Vec<ChainEntry>, ServiceError> {
        self.run(Operation::ChainEntries, move |s| {
            s.chain_entries(after, limit)
        })
        .await
    }
}

#[async_trait]
impl FileLabels for Sqlite {
    async fn record(&self, workspace: &str, rows: Vec<FileLabel>) -> Result<(), ServiceError> {
        let workspace = workspace.to_owned();
        self.run(Operation::FilesRecord, move |s| {
            s.record_file_labels(&workspace, &rows)
        })
        .await
    }

    async fn get(
        &self,
        workspace: &str,
        stamps: Vec<FileStamp>,
    ) -> Result<Vec<FileLabel>, ServiceError> {
        let workspace = workspace.to_owned();
        self.run(Operation::FilesGet, move |s| {
            s.file_labels(&workspace, &stamps)
        })
        .await
    }

    async fn beneath(&self, workspace: &str, dir: &str) -> Result<Label, ServiceError> {
        let (workspace, dir) = (workspace.to_owned(), dir.to_owned());
        self.run(Operation::FilesBeneath, move |s| {
            s.file_labels_beneath(&workspace, &dir)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::services::conformance;
    use crate::store::Store;

    /// Rows whose ids do not read back (a channel named before ids were typed, with a
    /// colon in it; a kind a newer host knows) are left out of every listing, with a
    /// warning, and never stop the others being listed, marked or started.
    #[tokio::test]
    async fn a_row_whose_id_does_not_read_back_hides_nothing_else() {
        use crate::ids::testing::{key, pid};
        use crate::services::WorkerState;

        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let services = store.clone().services();
        let run = services.ledger.begin_run().await.unwrap();
        let main = pid("channel:main");
        services
            .ledger
            .worker_started(run.id(), &pid("worker:1"), &main, "t")
            .await
            .unwrap();
        services
            .history
            .append(&key("channel:main"), vec!["1".into()])
            .await
            .unwrap();
        let raw = rusqlite::Connection::open(store.path()).unwrap();
        raw.execute(
            "INSERT INTO workers (id, channel, task, state, started_at, updated_at, run)
             VALUES ('robot:1', 'old:name', 't', 'running', 0, 0, ?1)",
            [run.id().get() as i64],
        )
        .unwrap();
        raw.execute(
            "INSERT INTO history (channel, seq, message) VALUES ('old:name', 0, '1')",
            [],
        )
        .unwrap();
        drop(run);

        let marked = services.ledger.mark_interrupted_workers().await.unwrap();
        let marked: Vec<_> = marked.iter().map(|w| (w.id.to_string(), w.state)).collect();
        assert_eq!(marked, [("worker:1".to_owned(), WorkerState::Interrupted)]);
        let listed = services.ledger.workers(10).await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        let conversations = services.history.conversations().await.unwrap();
        let names: Vec<_> = conversations.iter().map(|c| c.channel.as_str()).collect();
        assert_eq!(names, ["channel:main"]);
        let state: String = raw
            .query_row(
                "SELECT state FROM workers WHERE id = 'robot:1'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(state, "interrupted", "marked all the same");
    }

    /// One thread runs this test's runtime. Had the history append waited for SQLite's
    /// lock on it, the task would have ended (after the busy retries ran out) before this
    /// test ran again; instead it waits off the executor until the lock is let go.
    #[tokio::test(flavor = "current_thread")]
    async fn a_call_waiting_for_a_locked_database_leaves_the_executor_free() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let services = store.clone().services();
        let holder = rusqlite::Connection::open(store.path()).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let append = tokio::spawn({
            let (services, started) = (services.clone(), started.clone());
            async move {
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                services
                    .history
                    .append(&crate::ids::testing::key("main"), vec!["1".into()])
                    .await
            }
        });
        while !started.load(std::sync::atomic::Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
        assert!(
            !append.is_finished(),
            "the append held the executor while it waited for the lock"
        );
        holder.execute_batch("ROLLBACK").unwrap();
        append.await.unwrap().unwrap();
        assert_eq!(store.load_history("channel:main").unwrap().len(), 1);
    }

    #[tokio::test]
    async fn sqlite_services_pass_the_conformance_checks() {
        let dirs = std::sync::Mutex::new(Vec::new());
        conformance::check_all(async || {
            let dir = tempfile::tempdir().unwrap();
            let store = Arc::new(Store::open(dir.path()).unwrap());
            dirs.lock().unwrap().push(dir);
            store.services()
        })
        .await;
    }
}
