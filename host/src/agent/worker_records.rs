//! [`WorkerRecords`]: what a worker writes of itself where every host sharing the store
//! sees it: its admission, its state, and the release of its task.

use std::sync::Arc;

use crate::ids::ProcessId;
use crate::services::{Ledger, RunId, ServiceError, WorkerState};

/// A worker's records in the ledger, written under this host's run.
pub(crate) struct WorkerRecords {
    ledger: Arc<dyn Ledger>,
    run: RunId,
    /// `limits.max_workers_per_channel`, counted by the store among the hosts.
    limit: u32,
}

impl WorkerRecords {
    /// Records in `ledger` under `run`, admitting at most `limit` workers per channel.
    pub(crate) fn new(ledger: Arc<dyn Ledger>, run: RunId, limit: u32) -> Self {
        WorkerRecords { ledger, run, limit }
    }

    /// Admits worker `id` on `task` for `channel` among the hosts, and records it running.
    pub(crate) async fn admit(
        &self,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), ServiceError> {
        self.ledger
            .admit_worker(self.run, id, channel, task, self.limit)
            .await
    }

    /// Records worker `id`'s `state`, with its `outcome` once it ended.
    pub(crate) async fn set_state(
        &self,
        id: &ProcessId,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError> {
        self.ledger.set_worker_state(id, state, outcome).await
    }

    /// Reserves the task `key` for worker `id` among the hosts sharing the store; the
    /// worker that holds it already, if another does.
    pub(crate) async fn reserve_task(
        &self,
        key: &str,
        id: &ProcessId,
    ) -> Result<Option<ProcessId>, ServiceError> {
        self.ledger.reserve_task(self.run, key, id).await
    }

    /// Frees the task `key` worker `id` held, for a worker of any host.
    pub(crate) async fn release_task(&self, key: &str, id: &ProcessId) -> Result<(), ServiceError> {
        self.ledger.release_task(key, id).await
    }
}
