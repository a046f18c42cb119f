//! [`ProcessIds`]: fresh process ids, numbered by the ledger.

use std::sync::Arc;

use crate::ids::{ProcessId, ProcessKind};
use crate::services::{Ledger, ServiceError};

/// Fresh process ids such as `worker:3`, numbered by the ledger's persisted counter, so
/// no id repeats across runs or across hosts sharing the services.
#[derive(Clone)]
pub(crate) struct ProcessIds(Arc<dyn Ledger>);

impl ProcessIds {
    /// Ids numbered by `ledger`.
    pub(crate) fn new(ledger: Arc<dyn Ledger>) -> Self {
        ProcessIds(ledger)
    }

    /// The next id of `kind`.
    pub(crate) async fn next(&self, kind: ProcessKind) -> Result<ProcessId, ServiceError> {
        let number = self.0.next_process_number(kind).await?;
        Ok(ProcessId::numbered(kind, number))
    }
}
