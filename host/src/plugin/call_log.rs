//! Where a registry records each call it runs or refuses, and what it hides from the
//! record.

use std::sync::Arc;

use crate::secrets::Redactor;
use crate::services::AuditSink;

/// The audit sink a [`Registry`](super::Registry) hands a row for every call, and the
/// redactor each row's arguments (and an external tool's answer) pass through first.
/// Given to the registry by whoever builds it, beside the host the calls run on.
///
/// ```
/// use capstan_host::plugin::CallLog;
/// use capstan_host::secrets::Redactor;
/// use capstan_host::services::{AuditDestination, Services};
///
/// let services = Services::in_memory();
/// let log = CallLog::new(services.audit.clone(), Redactor::default());
/// assert!(matches!(log.audit().destination(), AuditDestination::Kept(_)));
/// assert!(matches!(CallLog::disabled().audit().destination(), AuditDestination::Disabled(_)));
/// ```
#[derive(Clone)]
pub struct CallLog {
    audit: Arc<dyn AuditSink>,
    redactor: Redactor,
}

impl CallLog {
    /// Rows to `audit`, their arguments redacted by `redactor`.
    pub fn new(audit: Arc<dyn AuditSink>, redactor: Redactor) -> Self {
        CallLog { audit, redactor }
    }

    /// No rows kept (`AuditSink::disabled`, which says so), nothing to redact.
    pub fn disabled() -> Self {
        CallLog::new(<dyn AuditSink>::disabled(), Redactor::default())
    }

    /// Where the rows go.
    pub fn audit(&self) -> &Arc<dyn AuditSink> {
        &self.audit
    }

    /// What hides the secrets' values in a row and in an external tool's answer.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }
}

impl std::fmt::Debug for CallLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallLog")
            .field("audit", &self.audit.destination())
            .finish_non_exhaustive()
    }
}
