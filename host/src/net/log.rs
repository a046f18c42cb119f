//! The audit row of one request, written when the request ends however it ends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use capstan_caps::NetTarget;
use tokio::task::JoinHandle;

use crate::secrets::Redactor;
use crate::services::{AuditSink, Receipt, RequestDecision, RequestRecord};
use crate::telemetry::spans::{self, OutboundRequest};
use crate::telemetry::{TraceParent, traces_on};

/// Where one call's request rows go: the audit sink, written in the background and
/// awaited before the call returns ([`AuditWriter::flush`]).
pub(crate) struct AuditWriter {
    pub(super) process: String,
    pub(super) tool: String,
    pub(super) redactor: Redactor,
    sink: Arc<dyn AuditSink>,
    pending: Mutex<Vec<JoinHandle<()>>>,
    tally: RequestTally,
}

/// The requests one call has ended so far, for its receipt: counted where each row is
/// written, so the receipt and the request log agree.
#[derive(Debug, Default)]
pub(crate) struct RequestTally {
    requests: AtomicU32,
    refused: AtomicU32,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
}

impl RequestTally {
    fn count(&self, record: &RequestRecord) {
        if record.decision == RequestDecision::Refused {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes_sent
            .fetch_add(record.bytes_sent, Ordering::Relaxed);
        self.bytes_received
            .fetch_add(record.bytes_received, Ordering::Relaxed);
    }

    /// Puts these counts into `receipt`.
    pub(crate) fn add_to(&self, receipt: &mut Receipt) {
        receipt.requests += self.requests.load(Ordering::Relaxed);
        receipt.requests_refused += self.refused.load(Ordering::Relaxed);
        receipt.request_bytes_sent += self.bytes_sent.load(Ordering::Relaxed);
        receipt.request_bytes_received += self.bytes_received.load(Ordering::Relaxed);
    }
}

impl AuditWriter {
    pub(super) fn new(
        process: String,
        tool: String,
        redactor: Redactor,
        sink: Arc<dyn AuditSink>,
    ) -> Self {
        AuditWriter {
            process,
            tool,
            redactor,
            sink,
            pending: Mutex::default(),
            tally: RequestTally::default(),
        }
    }

    /// What the requests ended so far add up to.
    pub(crate) fn tally(&self) -> &RequestTally {
        &self.tally
    }

    fn record(&self, record: RequestRecord) {
        self.tally.count(&record);
        let sink = self.sink.clone();
        let write = tokio::spawn(async move {
            if let Err(err) = sink.record_request(record).await {
                tracing::error!("cannot write the audit log of a request: {err}");
            }
        });
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(write);
    }

    /// Waits for every row written so far.
    pub(crate) async fn flush(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for write in pending {
            let _ = write.await;
        }
    }
}

/// One request on its way: what the row will say once it ends.
pub(super) struct RequestLog {
    pub(super) call: Arc<AuditWriter>,
    pub(super) target: NetTarget,
    pub(super) started: Instant,
    pub(super) address: Option<SocketAddr>,
    pub(super) grant: String,
    /// The caller's granted rule that allows it (the config's text): its metrics label.
    pub(super) granted: Option<String>,
    pub(super) status: Option<u16>,
    pub(super) sent: Arc<AtomicU64>,
    /// The call that made it (taken in the call's own task, before the request leaves
    /// it): the parent of its span.
    trace: TraceParent,
    /// When it began, for its span; none while traces are off.
    began: Option<SystemTime>,
}

impl RequestLog {
    pub(super) fn new(call: Arc<AuditWriter>, target: NetTarget) -> Self {
        RequestLog {
            call,
            target,
            started: Instant::now(),
            address: None,
            grant: String::new(),
            granted: None,
            status: None,
            sent: Arc::default(),
            trace: TraceParent::current(),
            began: traces_on().then(SystemTime::now),
        }
    }

    /// Not sent: a grant or a limit refused it.
    pub(super) fn refused(self, reason: &str) {
        self.write(RequestDecision::Refused, 0, reason);
    }

    /// Sent, and the response ended after `received` body bytes.
    pub(super) fn finished(self, received: u64) {
        self.write(RequestDecision::Allowed, received, "");
    }

    /// Ended by an error after `received` body bytes.
    pub(super) fn failed(self, received: u64, reason: &str) {
        self.write(RequestDecision::Failed, received, reason);
    }

    fn write(self, decision: RequestDecision, received: u64, detail: &str) {
        let call = &self.call;
        let record = RequestRecord {
            process: call.process.clone(),
            tool: call.tool.clone(),
            method: self.target.method.clone(),
            scheme: self.target.scheme.to_string(),
            // A guest chooses the host: a secret it was sent back could be spelled in it,
            // in any case (a host name is lowercased before it gets here).
            host: {
                let host = self.target.host.to_string();
                call.redactor
                    .redact_ignoring_case(&host)
                    .unwrap_or_else(|| call.redactor.redact(&host).into_owned())
            },
            port: self.target.port,
            address: self.address.map(|a| a.ip().to_string()),
            status: self.status,
            bytes_sent: self.sent.load(Ordering::Relaxed),
            bytes_received: received,
            duration_us: self.started.elapsed().as_micros() as u64,
            decision,
            grant: self.grant.clone(),
            detail: call.redactor.redact(detail).into_owned(),
        };
        tracing::info!(
            target: "capstan::net",
            process = %record.process,
            tool = %record.tool,
            method = %record.method,
            host = %record.host,
            port = record.port,
            status = ?record.status,
            decision = decision.as_str(),
            detail = %record.detail,
            "outbound request"
        );
        // Labelled by the config's rule, never by what the tool declared: a tool may
        // declare as many narrower rules as it likes.
        let rule = self.granted.as_deref().unwrap_or(crate::telemetry::NO_RULE);
        crate::telemetry::metrics().outbound_request(rule, decision.as_str());
        if let Some(began) = self.began {
            spans::outbound(OutboundRequest {
                parent: &self.trace,
                began,
                method: &record.method,
                host: &record.host,
                port: record.port,
                status: record.status,
                decision: decision.as_str(),
            });
        }
        call.record(record);
    }
}
