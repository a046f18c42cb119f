//! What a span is once started: its ids, and the record the exporter writes out when it
//! ends. Lean on purpose (no events, links or trace state, none of which the host makes):
//! a span is built on the hot path of every tool call.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanId, SpanKind, TraceId};

/// The W3C trace flag that says a trace is recorded.
pub(super) const SAMPLED: u8 = 0x01;

/// Where a span sits: its trace, its own id, its trace flags, and whether it was made by
/// another process (a `traceparent` taken in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SpanIds {
    pub(super) trace: TraceId,
    pub(super) span: SpanId,
    pub(super) flags: u8,
    pub(super) remote: bool,
}

impl SpanIds {
    /// A new span's ids: a child of `parent`, or the first span of a new, recorded trace.
    pub(super) fn child_of(parent: Option<&SpanIds>) -> SpanIds {
        let span = loop {
            // Zero is the invalid id.
            let id = fastrand::u64(..);
            if id != 0 {
                break SpanId::from(id);
            }
        };
        let (trace, flags) = match parent {
            Some(parent) => (parent.trace, parent.flags),
            None => (TraceId::from(fastrand::u128(1..)), SAMPLED),
        };
        SpanIds {
            trace,
            span,
            flags,
            remote: false,
        }
    }

    /// Whether spans of this trace are exported: a caller that does not record its trace
    /// is not sent the host's part of it either.
    pub(super) fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

/// One span, from its start to its end: what a batch carries to the receiver.
#[derive(Debug)]
pub(super) struct SpanRecord {
    pub(super) ids: SpanIds,
    /// The parent's id, and whether the parent is another process's.
    pub(super) parent: Option<(SpanId, bool)>,
    pub(super) kind: SpanKind,
    pub(super) name: Cow<'static, str>,
    pub(super) start: SystemTime,
    pub(super) end: SystemTime,
    pub(super) attributes: Vec<KeyValue>,
    /// Why it failed (written as `error.type` and the error status), if it did.
    pub(super) error: Option<Cow<'static, str>>,
}
