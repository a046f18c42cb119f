//! [`InMemory`]: every service kept in this process's memory, behind one lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use async_trait::async_trait;

use super::{
    APPROVALS_LIST_MAX, Approval, ApprovalId, ApprovalState, Approvals, AuditDestination,
    AuditEntry, AuditRecord, AuditSink, ConversationSummary, DEFAULT_LIST_LIMIT, Endorsement,
    History, HistoryEntry, Ledger, Memory, MemoryItem, NewApproval, NewMemory, NewTask, Priority,
    RECALL_MAX, RequestEntry, RequestRecord, Run, RunId, ServiceError, Sessions, Task, TaskBoard,
    TaskFilter, TaskPatch, TaskStatus, Verdict, WorkerRecord, WorkerState, already_decided,
    expires_at, interrupted_outcome, memory_words, no_approval, now, recall_terms,
    worker_already_recorded, worker_has_ended,
};
use super::{
    ChainEntry, ChainRecord, ChainStore, GENESIS, HostKey, WorkingEntry, hash_bytes, sealed,
};
use super::{FileLabel, FileLabels, FileStamp, lies_beneath};
use crate::flow::{ArgsDigest, Label};
use crate::ids::{Caller, ProcessId, ProcessKind, SessionKey};

/// Every service kept in this process's memory, behind one lock, and lost when dropped.
///
/// It stores what the rules in front of it let through, as the SQLite store does, and
/// passes the same conformance checks, so tests and embedders that keep nothing can use it in its
/// place. Recall matches whole words of a memory's kind and content, whatever their case,
/// and ranks by how many of the query's words a memory holds, weighted by its importance.
/// SQLite ranks by BM25 and also matches words that differ only in accents (`cafe` finds
/// `Café`); here they must be spelled the same.
#[derive(Default)]
pub struct InMemory {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    tasks: BTreeMap<u64, Task>,
    memories: BTreeMap<u64, MemoryItem>,
    next_memory: u64,
    /// Key to value and expiry (Unix seconds).
    working: HashMap<String, (WorkingEntry, Option<i64>)>,
    history: HashMap<SessionKey, Vec<String>>,
    audit: Vec<AuditEntry>,
    requests: Vec<RequestEntry>,
    /// Each run's liveness token: the run is over once its token is gone.
    runs: Vec<Weak<()>>,
    counters: HashMap<ProcessKind, u64>,
    workers: BTreeMap<ProcessId, (RunId, WorkerRecord)>,
    /// Worker ids in the order they started.
    worker_order: Vec<ProcessId>,
    /// Approval `n` at index `n - 1`.
    approvals: Vec<Approval>,
    /// Audit chain row `n` at index `n - 1`.
    chain: Vec<ChainEntry>,
    /// Per workspace, each written file's label by (device, inode).
    files: HashMap<String, HashMap<(u64, u64), FileLabel>>,
}

impl InMemory {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every change below is made whole under the lock before anything can panic, so a
        // poisoned lock still guards consistent data.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn no_task(number: u64) -> ServiceError {
    ServiceError::NotFound(format!("task #{number} does not exist"))
}

#[async_trait]
impl TaskBoard for InMemory {
    async fn create(&self, creator: &Caller, task: NewTask) -> Result<Task, ServiceError> {
        let mut state = self.state();
        if let Some(parent) = task.parent
            && !state.tasks.contains_key(&parent)
        {
            return Err(ServiceError::NotFound(format!(
                "parent task #{parent} does not exist"
            )));
        }
        let number = state.tasks.keys().next_back().map_or(1, |last| last + 1);
        let created = Task {
            number,
            title: task.title,
            description: task.description,
            status: TaskStatus::Backlog,
            priority: task.priority.unwrap_or(Priority::Normal),
            creator: creator.clone(),
            assigned_worker: task.assigned_worker,
            parent: task.parent,
            metadata: task.metadata.unwrap_or_else(|| "{}".into()),
            label: task.label,
        };
        state.tasks.insert(number, created.clone());
        Ok(created)
    }

    async fn get(&self, number: u64) -> Result<Task, ServiceError> {
        self.state()
            .tasks
            .get(&number)
            .cloned()
            .ok_or_else(|| no_task(number))
    }

    async fn list(&self, filter: TaskFilter) -> Result<Vec<Task>, ServiceError> {
        let limit = filter.limit.unwrap_or(DEFAULT_LIST_LIMIT) as usize;
        Ok(self
            .state()
            .tasks
            .values()
            .filter(|t| filter.status.is_none_or(|s| t.status == s))
            .filter(|t| filter.parent.is_none_or(|p| t.parent == Some(p)))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn update(&self, number: u64, patch: TaskPatch) -> Result<Task, ServiceError> {
        let mut state = self.state();
        let task = state
            .tasks
            .get_mut(&number)
            .ok_or_else(|| no_task(number))?;
        if let Some(to) = patch.status {
            task.status.check_move(number, to)?;
            task.status = to;
        }
        if let Some(title) = patch.title {
            task.title = title;
        }
        if let Some(description) = patch.description {
            task.description = description;
        }
        if let Some(priority) = patch.priority {
            task.priority = priority;
        }
        if let Some(metadata) = patch.metadata {
            task.metadata = metadata;
        }
        if let Some(worker) = patch.assigned_worker {
            task.assigned_worker = Some(worker);
        }
        task.label.join(&patch.label);
        Ok(task.clone())
    }
}

/// Whether `value`, stored with `expires`, is still live at `at`.
fn live(expires: Option<i64>, at: i64) -> bool {
    expires.is_none_or(|expires| expires > at)
}

#[async_trait]
impl Memory for InMemory {
    async fn save(&self, source: &Caller, memory: NewMemory) -> Result<MemoryItem, ServiceError> {
        let importance = memory.importance();
        let mut state = self.state();
        state.next_memory += 1;
        let item = MemoryItem {
            id: state.next_memory,
            kind: memory.kind,
            content: memory.content,
            importance,
            source: source.clone(),
            created_at: now(),
            label: memory.label,
        };
        state.memories.insert(item.id, item.clone());
        Ok(item)
    }

    async fn recall(&self, query: &str, limit: u32) -> Result<Vec<MemoryItem>, ServiceError> {
        let wanted = recall_terms(query);
        let state = self.state();
        let mut scored: Vec<(f32, &MemoryItem)> = state
            .memories
            .values()
            .filter_map(|item| {
                let words = memory_words(&item.kind, &item.content);
                let hits = wanted.iter().filter(|w| words.contains(w)).count();
                (hits > 0).then_some((hits as f32 * (0.5 + item.importance), item))
            })
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
        Ok(scored
            .into_iter()
            .take(limit.clamp(1, RECALL_MAX) as usize)
            .map(|(_, item)| item.clone())
            .collect())
    }

    async fn delete(&self, id: u64) -> Result<(), ServiceError> {
        match self.state().memories.remove(&id) {
            Some(_) => Ok(()),
            None => Err(ServiceError::NotFound(format!(
                "memory {id} does not exist"
            ))),
        }
    }

    async fn working_get(&self, key: &str) -> Result<Option<WorkingEntry>, ServiceError> {
        let at = now();
        Ok(self
            .state()
            .working
            .get(key)
            .filter(|(_, expires)| live(*expires, at))
            .map(|(entry, _)| entry.clone()))
    }

    async fn working_set(
        &self,
        key: &str,
        value: &str,
        label: &Label,
        ttl_seconds: Option<u64>,
    ) -> Result<(), ServiceError> {
        let expires = expires_at(now(), ttl_seconds);
        let entry = WorkingEntry {
            value: value.to_owned(),
            label: label.clone(),
        };
        self.state()
            .working
            .insert(key.to_owned(), (entry, expires));
        Ok(())
    }

    async fn working_keys(&self, prefix: &str) -> Result<Vec<String>, ServiceError> {
        let at = now();
        let mut keys: Vec<String> = self
            .state()
            .working
            .iter()
            .filter(|(key, (_, expires))| key.starts_with(prefix) && live(*expires, at))
            .map(|(key, _)| key.clone())
            .collect();
        keys.sort();
        Ok(keys)
    }
}

#[async_trait]
impl History for InMemory {
    fn location(&self) -> String {
        "the in-memory history".into()
    }

    async fn load(&self, channel: &SessionKey) -> Result<Vec<HistoryEntry>, ServiceError> {
        let state = self.state();
        let messages = state.history.get(channel).map(Vec::as_slice).unwrap_or(&[]);
        messages
            .iter()
            .enumerate()
            .map(|(seq, message)| {
                serde_json::from_str::<serde::de::IgnoredAny>(message).map_err(|err| {
                    ServiceError::UnreadableHistory {
                        location: self.location(),
                        channel: channel.to_string(),
                        seq: seq as u64,
                        reason: format!("not valid JSON: {err}"),
                    }
                })?;
                Ok(HistoryEntry {
                    seq: seq as u64,
                    message: message.clone(),
                })
            })
            .collect()
    }

    async fn append(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.state()
            .history
            .entry(channel.clone())
            .or_default()
            .extend(messages);
        Ok(())
    }

    async fn replace(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.state().history.insert(channel.clone(), messages);
        Ok(())
    }

    async fn conversations(&self) -> Result<Vec<ConversationSummary>, ServiceError> {
        let mut all: Vec<ConversationSummary> = self
            .state()
            .history
            .iter()
            .filter(|(_, messages)| !messages.is_empty())
            .map(|(channel, messages)| ConversationSummary {
                channel: channel.clone(),
                messages: messages.len() as u64,
            })
            .collect();
        all.sort_by(|a, b| a.channel.cmp(&b.channel));
        Ok(all)
    }
}

#[async_trait]
impl AuditSink for InMemory {
    async fn record(&self, call: AuditRecord) -> Result<(), ServiceError> {
        let mut state = self.state();
        let entry = AuditEntry {
            id: state.audit.len() as u64 + 1,
            at: now(),
            conversation: call.conversation,
            arguments: call.arguments,
            process: call.process,
            tool: call.tool,
            grants: call.grants,
            outcome: call.outcome,
            detail: call.detail,
            duration_us: call.duration_us,
            receipt: call.receipt,
        };
        state.audit.push(entry);
        Ok(())
    }

    async fn page(&self, before: Option<u64>, limit: u32) -> Result<Vec<AuditEntry>, ServiceError> {
        Ok(self
            .state()
            .audit
            .iter()
            .rev()
            .filter(|entry| before.is_none_or(|before| entry.id < before))
            .take(limit as usize)
            .cloned()
            .collect())
    }

    async fn record_request(&self, request: RequestRecord) -> Result<(), ServiceError> {
        self.state()
            .requests
            .push(RequestEntry { at: now(), request });
        Ok(())
    }

    async fn recent_requests(&self, limit: u32) -> Result<Vec<RequestEntry>, ServiceError> {
        Ok(self
            .state()
            .requests
            .iter()
            .rev()
            .take(limit as usize)
            .cloned()
            .collect())
    }

    fn destination(&self) -> AuditDestination {
        AuditDestination::Kept("this process's memory (lost at exit)".into())
    }
}

/// One host alone: it owns every session.
#[async_trait]
impl Sessions for InMemory {}

#[async_trait]
impl Ledger for InMemory {
    async fn begin_run(&self) -> Result<Run, ServiceError> {
        let alive = Arc::new(());
        let mut state = self.state();
        state.runs.push(Arc::downgrade(&alive));
        Ok(Run::new(RunId::new(state.runs.len() as u64), alive))
    }

    async fn next_process_number(&self, kind: ProcessKind) -> Result<u64, ServiceError> {
        let mut state = self.state();
        let last = state.counters.entry(kind).or_default();
        *last += 1;
        Ok(*last)
    }

    async fn worker_started(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), ServiceError> {
        let mut state = self.state();
        if state.workers.contains_key(id) {
            return Err(worker_already_recorded(id));
        }
        let record = WorkerRecord {
            id: id.clone(),
            channel: channel.clone(),
            task: task.to_owned(),
            state: WorkerState::Running,
            outcome: None,
        };
        state.workers.insert(id.clone(), (run, record));
        state.worker_order.push(id.clone());
        Ok(())
    }

    async fn set_worker_state(
        &self,
        id: &ProcessId,
        to: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError> {
        let mut state = self.state();
        let (_, record) = state
            .workers
            .get_mut(id)
            .ok_or_else(|| ServiceError::NotFound(format!("worker {id} does not exist")))?;
        if record.state.is_terminal() && to != record.state {
            return Err(worker_has_ended(id, record.state));
        }
        record.state = to;
        if let Some(outcome) = outcome {
            record.outcome = Some(outcome.to_owned());
        }
        Ok(())
    }

    async fn worker(&self, id: &ProcessId) -> Result<Option<WorkerRecord>, ServiceError> {
        Ok(self.state().workers.get(id).map(|(_, r)| r.clone()))
    }

    async fn workers(&self, limit: u32) -> Result<Vec<WorkerRecord>, ServiceError> {
        let state = self.state();
        Ok(state
            .worker_order
            .iter()
            .rev()
            .take(limit as usize)
            .filter_map(|id| state.workers.get(id).map(|(_, r)| r.clone()))
            .collect())
    }

    async fn mark_interrupted_workers(&self) -> Result<Vec<WorkerRecord>, ServiceError> {
        let mut state = self.state();
        let State { runs, workers, .. } = &mut *state;
        let over = |run: RunId| {
            let index = run.get() as usize;
            index == 0
                || runs
                    .get(index - 1)
                    .is_none_or(|alive| alive.upgrade().is_none())
        };
        let mut marked = Vec::new();
        for (run, record) in workers.values_mut() {
            let working = matches!(
                record.state,
                WorkerState::Running | WorkerState::WaitingForInput
            );
            if working && over(*run) {
                record.state = WorkerState::Interrupted;
                record.outcome = Some(interrupted_outcome(*run));
                marked.push(record.clone());
            }
        }
        Ok(marked)
    }
}

#[async_trait]
impl Approvals for InMemory {
    async fn park(&self, call: NewApproval) -> Result<Approval, ServiceError> {
        let mut state = self.state();
        let waiting = state.approvals.iter().find(|a| {
            a.state == ApprovalState::Pending
                && a.process == call.process
                && a.tool == call.tool
                && a.digest == call.digest
        });
        if let Some(waiting) = waiting {
            return Ok(waiting.clone());
        }
        let approval = Approval {
            id: ApprovalId::new(state.approvals.len() as u64 + 1),
            process: call.process,
            tool: call.tool,
            arguments: call.arguments,
            digest: call.digest,
            reason: call.reason,
            label: call.label,
            state: ApprovalState::Pending,
            requested_at: now(),
            decided_at: None,
            decided_by: None,
            expires_at: None,
            uses_left: 0,
            handles: call.handles,
            endorsed: false,
        };
        state.approvals.push(approval.clone());
        Ok(approval)
    }

    async fn get(&self, id: ApprovalId) -> Result<Approval, ServiceError> {
        let state = self.state();
        let found = approval_at(&state.approvals, id);
        found.cloned().ok_or_else(|| no_approval(id))
    }

    async fn list(&self, pending_only: bool, limit: u32) -> Result<Vec<Approval>, ServiceError> {
        Ok(self
            .state()
            .approvals
            .iter()
            .rev()
            .filter(|a| !pending_only || a.state == ApprovalState::Pending)
            .take(limit.clamp(1, APPROVALS_LIST_MAX) as usize)
            .cloned()
            .collect())
    }

    async fn decide(
        &self,
        id: ApprovalId,
        verdict: Verdict,
        by: &str,
    ) -> Result<Approval, ServiceError> {
        let mut state = self.state();
        let index = approval_at(&state.approvals, id)
            .map(|_| id.get() as usize - 1)
            .ok_or_else(|| no_approval(id))?;
        let approval = &mut state.approvals[index];
        if approval.state != ApprovalState::Pending {
            return Err(already_decided(id, approval.state));
        }
        let at = now();
        approval.decided_at = Some(at);
        approval.decided_by = Some(by.to_owned());
        (approval.state, approval.expires_at, approval.uses_left) = verdict.outcome(at);
        approval.endorsed = verdict.endorses();
        Ok(approval.clone())
    }

    async fn take(
        &self,
        process: &ProcessId,
        tool: &str,
        digest: ArgsDigest,
    ) -> Result<Option<Approval>, ServiceError> {
        let at = now();
        let mut state = self.state();
        let lease = state.approvals.iter_mut().find(|a| {
            a.state == ApprovalState::Approved
                && a.uses_left > 0
                && a.expires_at.is_some_and(|end| end > at)
                && &a.process == process
                && a.tool == tool
                && a.digest == digest
        });
        Ok(lease.map(|lease| {
            lease.uses_left -= 1;
            lease.clone()
        }))
    }

    async fn withdraw(&self, id: ApprovalId) -> Result<bool, ServiceError> {
        let mut state = self.state();
        let index = id.get().checked_sub(1).map(|n| n as usize);
        match index.and_then(|n| state.approvals.get_mut(n)) {
            Some(approval) if approval.state == ApprovalState::Pending => {
                approval.state = ApprovalState::Withdrawn;
                approval.decided_at = Some(now());
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Err(no_approval(id)),
        }
    }

    async fn endorsed(&self, process: &ProcessId) -> Result<Vec<Endorsement>, ServiceError> {
        let (state, at) = (self.state(), now());
        let endorsed = state.approvals.iter().filter(|a| {
            a.endorsed && &a.process == process && a.expires_at.is_some_and(|e| e > at)
        });
        Ok(endorsed
            .flat_map(|a| {
                a.handles.iter().map(|value| Endorsement {
                    approval: a.id,
                    value: *value,
                })
            })
            .collect())
    }
}

#[async_trait]
impl ChainStore for InMemory {
    async fn append(
        &self,
        record: ChainRecord,
        key: Arc<HostKey>,
    ) -> Result<ChainEntry, ServiceError> {
        let mut state = self.state();
        let prev = state
            .chain
            .last()
            .and_then(|last| hash_bytes(&last.hash))
            .unwrap_or(GENESIS);
        let entry = sealed(&prev, state.chain.len() as u64 + 1, now(), record, &key);
        state.chain.push(entry.clone());
        Ok(entry)
    }

    async fn entries(&self, after: u64, limit: u32) -> Result<Vec<ChainEntry>, ServiceError> {
        Ok(self
            .state()
            .chain
            .iter()
            .skip(after as usize)
            .take(limit.clamp(1, 1000) as usize)
            .cloned()
            .collect())
    }
}

/// Approval `id` of `approvals`, which holds approval `n` at index `n - 1`.
fn approval_at(approvals: &[Approval], id: ApprovalId) -> Option<&Approval> {
    id.get()
        .checked_sub(1)
        .and_then(|n| approvals.get(n as usize))
}

#[async_trait]
impl FileLabels for InMemory {
    async fn record(&self, workspace: &str, rows: Vec<FileLabel>) -> Result<(), ServiceError> {
        let mut state = self.state();
        let files = state.files.entry(workspace.to_owned()).or_default();
        for row in rows {
            files.insert((row.stamp.dev, row.stamp.ino), row);
        }
        Ok(())
    }

    async fn get(
        &self,
        workspace: &str,
        stamps: Vec<FileStamp>,
    ) -> Result<Vec<FileLabel>, ServiceError> {
        let state = self.state();
        let Some(files) = state.files.get(workspace) else {
            return Ok(Vec::new());
        };
        Ok(stamps
            .iter()
            .filter_map(|stamp| files.get(&(stamp.dev, stamp.ino)))
            .cloned()
            .collect())
    }

    async fn beneath(&self, workspace: &str, dir: &str) -> Result<Label, ServiceError> {
        let state = self.state();
        let rows = state
            .files
            .get(workspace)
            .into_iter()
            .flat_map(|f| f.values());
        Ok(Label::join_all(
            rows.filter(|row| lies_beneath(&row.path, dir))
                .map(|row| &row.label),
        ))
    }
}

#[cfg(test)]
mod tests {
    use crate::services::{Services, conformance};

    #[tokio::test]
    async fn in_memory_services_pass_the_conformance_checks() {
        conformance::check_all(async || Services::in_memory()).await;
    }
}
