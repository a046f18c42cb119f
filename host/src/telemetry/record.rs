//! What a span is once started: its ids, and the record the exporter writes out when it
//! ends. Lean on purpose (no events, links or trace state, none of which the host makes):
//! a span is built on the hot path of every tool call.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::KeyValue;
use opentelemetry::trace::{SpanId, SpanKind, TraceId};

use super::sampler::Sampler;

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
    /// A new span's ids: a child of `parent`, or the first span of a new trace; recorded
    /// as `sampler` decides.
    pub(super) fn child_of(parent: Option<&SpanIds>, sampler: &Sampler) -> SpanIds {
        let span = loop {
            // Zero is the invalid id.
            let id = fastrand::u64(..);
            if id != 0 {
                break SpanId::from(id);
            }
        };
        let trace = parent.map_or_else(|| TraceId::from(fastrand::u128(1..)), |p| p.trace);
        let sampled = sampler.samples(trace, parent.map(SpanIds::sampled));
        let flags = if sampled { SAMPLED } else { 0 };
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

/// The most attributes a span keeps, as the SDK's default limit: more are counted, not kept.
pub(super) const MAX_ATTRIBUTES: usize = 128;

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
    /// Attributes left out over [`MAX_ATTRIBUTES`].
    pub(super) dropped_attributes: u32,
    /// Why it failed (written as `error.type` and the error status), if it did.
    pub(super) error: Option<Cow<'static, str>>,
}

impl SpanRecord {
    /// Adds `more`, up to [`MAX_ATTRIBUTES`].
    pub(super) fn add(&mut self, more: impl IntoIterator<Item = KeyValue>) {
        for attribute in more {
            if self.attributes.len() < MAX_ATTRIBUTES {
                self.attributes.push(attribute);
            } else {
                self.dropped_attributes = self.dropped_attributes.saturating_add(1);
            }
        }
    }
}
