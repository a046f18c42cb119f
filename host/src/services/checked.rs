//! The services' rules on what goes in, applied once in front of any backend.
//!
//! [`Services::all_from`](super::Services::all_from) puts these in front of the backend it
//! is given, so a backend stores what it is handed: a task's title is checked and trimmed,
//! its metadata is a JSON object, a memory has content, a kind and an importance in range,
//! a working-memory key is not empty, an audited call's arguments are [`redact`]ed, an
//! approval's lease is in range, and each decision on a parked call is added to the audit
//! chain. Rules that need what is stored (a task's status moves, an
//! ended worker's record) stay with the backend, in the same transaction as the write.
//! The SQLite store's own writes of tasks, memories and audit rows are crate-private, so
//! its way in from outside is this one.

use std::sync::Arc;

use async_trait::async_trait;

use super::{
    Approval, ApprovalId, ApprovalState, Approvals, AuditChain, AuditDestination, AuditEntry,
    AuditRecord, AuditSink, ChainEvent, ChainRecord, Committing, Endorsement, Memory, MemoryItem,
    NewApproval, NewMemory, NewTask, RequestEntry, RequestRecord, ServiceError, Task, TaskBoard,
    TaskFilter, TaskPatch, Verdict, WorkingEntry, already_decided, check_working_key, redact,
};
use crate::flow::{ArgsDigest, Label};
use crate::ids::{Caller, ProcessId};

/// A [`TaskBoard`] that checks each new task and patch before its backend sees it.
pub(super) struct CheckedTasks(pub(super) Arc<dyn TaskBoard>);

#[async_trait]
impl TaskBoard for CheckedTasks {
    async fn create(&self, creator: &Caller, task: NewTask) -> Result<Task, ServiceError> {
        let task = task.checked()?;
        self.0.create(creator, task).await
    }

    async fn get(&self, number: u64) -> Result<Task, ServiceError> {
        self.0.get(number).await
    }

    async fn list(&self, filter: TaskFilter) -> Result<Vec<Task>, ServiceError> {
        self.0.list(filter).await
    }

    async fn update(&self, number: u64, patch: TaskPatch) -> Result<Task, ServiceError> {
        let patch = patch.checked()?;
        self.0.update(number, patch).await
    }
}

/// A [`Memory`] that checks each memory and working-memory key before its backend sees it.
pub(super) struct CheckedMemory(pub(super) Arc<dyn Memory>);

#[async_trait]
impl Memory for CheckedMemory {
    async fn save(&self, source: &Caller, memory: NewMemory) -> Result<MemoryItem, ServiceError> {
        let memory = memory.checked()?;
        self.0.save(source, memory).await
    }

    async fn recall(&self, query: &str, limit: u32) -> Result<Vec<MemoryItem>, ServiceError> {
        self.0.recall(query, limit).await
    }

    async fn delete(&self, id: u64) -> Result<(), ServiceError> {
        self.0.delete(id).await
    }

    async fn working_get(&self, key: &str) -> Result<Option<WorkingEntry>, ServiceError> {
        check_working_key(key)?;
        self.0.working_get(key).await
    }

    async fn working_set(
        &self,
        key: &str,
        value: &str,
        label: &Label,
        ttl_seconds: Option<u64>,
    ) -> Result<(), ServiceError> {
        check_working_key(key)?;
        self.0.working_set(key, value, label, ttl_seconds).await
    }

    async fn working_keys(&self, prefix: &str) -> Result<Vec<String>, ServiceError> {
        self.0.working_keys(prefix).await
    }
}

/// An [`AuditSink`] that redacts each call's arguments before its backend sees them.
pub(super) struct RedactedAudit(pub(super) Arc<dyn AuditSink>);

fn redacted(mut call: AuditRecord) -> AuditRecord {
    call.arguments = redact(&call.arguments);
    call
}

#[async_trait]
impl AuditSink for RedactedAudit {
    async fn record(&self, call: AuditRecord) -> Result<(), ServiceError> {
        self.0.record(redacted(call)).await
    }

    async fn record_soon(&self, call: AuditRecord) -> Committing {
        self.0.record_soon(redacted(call)).await
    }

    async fn recent(&self, limit: u32) -> Result<Vec<AuditEntry>, ServiceError> {
        self.0.recent(limit).await
    }

    async fn page(&self, before: Option<u64>, limit: u32) -> Result<Vec<AuditEntry>, ServiceError> {
        self.0.page(before, limit).await
    }

    async fn costs(
        &self,
        by: super::CostsBy,
        of: &super::CostsOf,
    ) -> Result<Vec<super::Costs>, ServiceError> {
        self.0.costs(by, of).await
    }

    async fn record_request(&self, request: RequestRecord) -> Result<(), ServiceError> {
        self.0.record_request(request).await
    }

    async fn recent_requests(&self, limit: u32) -> Result<Vec<RequestEntry>, ServiceError> {
        self.0.recent_requests(limit).await
    }

    fn destination(&self) -> AuditDestination {
        self.0.destination()
    }
}

/// [`Approvals`] that check a lease's range and add each decision to the audit chain. A
/// parked call's arguments are stored as the person will be shown them, not passed
/// through [`redact`]'s guesses: a person approves what they can read, and a value hidden
/// from them could be what the call sends.
pub(super) struct RedactedApprovals {
    pub(super) approvals: Arc<dyn Approvals>,
    pub(super) chain: AuditChain,
}

#[async_trait]
impl Approvals for RedactedApprovals {
    async fn park(&self, call: NewApproval) -> Result<Approval, ServiceError> {
        self.approvals.park(call).await
    }

    async fn get(&self, id: ApprovalId) -> Result<Approval, ServiceError> {
        self.approvals.get(id).await
    }

    async fn list(&self, pending_only: bool, limit: u32) -> Result<Vec<Approval>, ServiceError> {
        self.approvals.list(pending_only, limit).await
    }

    async fn decide(
        &self,
        id: ApprovalId,
        verdict: Verdict,
        by: &str,
    ) -> Result<Approval, ServiceError> {
        if by.trim().is_empty() || by.len() > 200 {
            return Err(ServiceError::Invalid(
                "who decides an approval is named in 1 to 200 bytes".into(),
            ));
        }
        let current = self.approvals.get(id).await?;
        if current.state != ApprovalState::Pending {
            return Err(already_decided(id, current.state));
        }
        let (verdict, event, mut detail) = match verdict {
            Verdict::Approve(lease) | Verdict::Endorse(lease) => {
                let lease = lease.checked()?;
                let detail = format!("{} use(s), {} s", lease.uses, lease.ttl_seconds);
                let verdict = match verdict {
                    Verdict::Endorse(_) => Verdict::Endorse(lease),
                    _ => Verdict::Approve(lease),
                };
                (verdict, ChainEvent::Approved, detail)
            }
            Verdict::Deny => (Verdict::Deny, ChainEvent::Denied, String::new()),
        };
        if verdict.endorses() {
            if current.handles.is_empty() {
                return Err(ServiceError::Invalid(format!(
                    "approval {id}'s call carries no handle's value to endorse; approve it \
                     instead"
                )));
            }
            detail.push_str(&format!(", endorses {} value(s)", current.handles.len()));
        }
        // The chain first: a process that sees the decision in the store and uses it
        // appends its use after the decision's rows. A chain that cannot record it fails
        // the call, and nothing is decided.
        self.chain
            .record(ChainRecord::of_approval(&current, event, by, &detail))
            .await?;
        if verdict.endorses() {
            // A row for each value vouched for, bound to its digest.
            for carried in &current.handles {
                let endorsed = ChainRecord {
                    digest: carried.digest.to_string(),
                    ..ChainRecord::of_approval(
                        &current,
                        ChainEvent::Endorsed,
                        by,
                        &carried.handle.to_string(),
                    )
                };
                self.chain.record(endorsed).await?;
            }
        }
        match self.approvals.decide(id, verdict, by).await {
            Ok(decided) => Ok(decided),
            Err(err) => {
                // Decided or withdrawn since it was read: the rows above stand for nothing.
                let voided = ChainRecord::of_approval(&current, ChainEvent::Voided, by, "");
                if let Err(chain) = self.chain.record(voided).await {
                    tracing::warn!(
                        "approval {id}'s refused decision is not voided in the chain: {chain}"
                    );
                }
                Err(err)
            }
        }
    }

    async fn take(
        &self,
        process: &ProcessId,
        tool: &str,
        digest: ArgsDigest,
    ) -> Result<Option<Approval>, ServiceError> {
        let taken = self.approvals.take(process, tool, digest).await?;
        if let Some(lease) = &taken {
            let left = format!("{} use(s) left", lease.uses_left);
            let used = ChainRecord::of_approval(lease, ChainEvent::Used, "host", &left);
            self.chain.record(used).await?;
        }
        Ok(taken)
    }

    async fn endorsed(&self, process: &ProcessId) -> Result<Vec<Endorsement>, ServiceError> {
        self.approvals.endorsed(process).await
    }

    async fn vouched(
        &self,
        process: &ProcessId,
        tool: &str,
        used: &Endorsement,
    ) -> Result<(), ServiceError> {
        let record = ChainRecord {
            event: ChainEvent::Vouched,
            process: process.to_string(),
            tool: tool.to_owned(),
            digest: used.value.digest.to_string(),
            approval: Some(used.approval.get()),
            by: "host".into(),
            detail: used.value.handle.to_string(),
        };
        self.chain.record(record).await.map(drop)
    }

    async fn withdraw(&self, id: ApprovalId) -> Result<bool, ServiceError> {
        let withdrawn = self.approvals.withdraw(id).await?;
        if withdrawn {
            let approval = self.approvals.get(id).await?;
            let record = ChainRecord::of_approval(&approval, ChainEvent::Withdrawn, "host", "");
            self.chain.record(record).await?;
        }
        Ok(withdrawn)
    }
}
