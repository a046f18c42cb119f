//! What a span is once started: its ids, and its record, which is its OTLP encoding
//! written as it goes. Lean on purpose (no events, links or trace state, none of which the
//! host makes): a span is built on the hot path of every tool call, so what it is given
//! is written where it is given, through the redactor, and nothing is copied into owned
//! values to be written again when it ends.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::{SpanId, SpanKind, TraceId};

use super::otlp::{self, AttributeValue};
use super::sampler::Sampler;
use crate::secrets::Redactor;

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
const MAX_ATTRIBUTES: u32 = 128;

/// Room for a common span's fields from the start: its ids, name and a dozen attributes.
const ROOM: usize = 384;

/// One span, from its start to its end: its `Span` message's fields as written so far.
#[derive(Debug)]
pub(super) struct SpanRecord {
    pub(super) ids: SpanIds,
    /// Whether the parent is another process's span.
    remote_parent: bool,
    /// The `Span` message's fields, in order: ids, parent, name, kind, start, room for
    /// the end time, then each attribute kept; once ended, its tail too. Empty while the
    /// span is not recorded.
    fields: Vec<u8>,
    /// Where the end time's eight bytes go in `fields`.
    end_at: usize,
    /// Attributes written.
    attributes: u32,
    /// Attributes left out over [`MAX_ATTRIBUTES`].
    dropped_attributes: u32,
    /// Why it failed (written as `error.type` and the error status), if it did.
    error: Option<Cow<'static, str>>,
}

impl SpanRecord {
    /// A span with `ids` under `parent` that is not recorded: only its ids, for its
    /// children to name.
    pub(super) fn unrecorded(ids: SpanIds, parent: Option<&SpanIds>) -> Self {
        SpanRecord {
            ids,
            remote_parent: parent.is_some_and(|parent| parent.remote),
            fields: Vec::new(),
            end_at: 0,
            attributes: 0,
            dropped_attributes: 0,
            error: None,
        }
    }

    /// A recorded span of `kind` named `name` (its pieces one after another), begun at
    /// `start`; each piece passes through `redactor`.
    pub(super) fn open(
        ids: SpanIds,
        parent: Option<&SpanIds>,
        kind: SpanKind,
        name: &[&str],
        start: SystemTime,
        redactor: &Redactor,
    ) -> Self {
        let mut span = SpanRecord::unrecorded(ids, parent);
        span.fields.reserve(ROOM);
        span.end_at = otlp::span_head(
            &mut span.fields,
            (ids.trace, ids.span),
            parent.map(|parent| parent.span),
            kind,
            name,
            start,
            redactor,
        );
        span
    }

    /// Whether the span is recorded (and so exported when it ends).
    pub(super) fn recorded(&self) -> bool {
        !self.fields.is_empty()
    }

    /// Where the span's attributes are added, each through `redactor`.
    pub(super) fn attributes<'a>(&'a mut self, redactor: &'a Redactor) -> Attributes<'a> {
        Attributes {
            span: self,
            redactor,
        }
    }

    /// Marks the span failed, of kind `kind`.
    pub(super) fn fail(&mut self, kind: Cow<'static, str>) {
        self.error = Some(kind);
    }

    /// Ends the span `at`: its fields are then the whole `Span` message's body.
    pub(super) fn end(&mut self, at: SystemTime, redactor: &Redactor) -> &[u8] {
        let error = self.error.as_deref();
        // `error.type` is one of the span's attributes, and counts within its limit.
        let mut dropped = self.dropped_attributes;
        let mut error_type = None;
        if let Some(error) = error {
            if self.attributes < MAX_ATTRIBUTES {
                error_type = Some(error);
            } else {
                dropped = dropped.saturating_add(1);
            }
        }
        otlp::span_tail(
            &mut self.fields,
            self.end_at,
            at,
            otlp::Tail {
                error_type,
                dropped_attributes: dropped,
                error,
                flags: self.ids.flags,
                remote_parent: self.remote_parent,
            },
            redactor,
        );
        &self.fields
    }
}

/// Where a recorded span's attributes are added, each as it is given: keys are the
/// conventions' names, values pass through the log's redactor.
pub struct Attributes<'a> {
    span: &'a mut SpanRecord,
    redactor: &'a Redactor,
}

impl Attributes<'_> {
    /// Adds a text attribute.
    pub fn text(&mut self, key: &str, value: &str) {
        self.add(key, AttributeValue::Text(value));
    }

    /// Adds an integer attribute.
    pub fn int(&mut self, key: &str, value: i64) {
        self.add(key, AttributeValue::Int(value));
    }

    fn add(&mut self, key: &str, value: AttributeValue<'_>) {
        let span = &mut *self.span;
        if span.attributes < MAX_ATTRIBUTES {
            otlp::attribute(
                &mut span.fields,
                otlp::SPAN_ATTRIBUTES,
                key,
                value,
                self.redactor,
            );
            span.attributes += 1;
        } else {
            span.dropped_attributes = span.dropped_attributes.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds(out: &[u8], part: &[u8]) -> bool {
        out.windows(part.len()).any(|w| w == part)
    }

    /// A failed span with `attributes` attributes, ended.
    fn ended(attributes: u32) -> Vec<u8> {
        let redactor = Redactor::default();
        let now = SystemTime::now();
        let ids = SpanIds::child_of(None, &Sampler::default());
        let mut span = SpanRecord::open(ids, None, SpanKind::Internal, &["full"], now, &redactor);
        let mut adding = span.attributes(&redactor);
        for n in 0..attributes {
            adding.int("n", n.into());
        }
        span.fail("timeout".into());
        span.end(now, &redactor).to_vec()
    }

    #[test]
    fn error_type_counts_within_the_attribute_limit() {
        const DROPPED_ONE_THEN_STATUS: [u8; 3] = [10 << 3, 1, 15 << 3 | 2];
        // Room for one more: `error.type` is written, and nothing is counted dropped.
        let roomy = ended(MAX_ATTRIBUTES - 1);
        assert!(holds(&roomy, b"error.type"));
        assert!(!holds(&roomy, &DROPPED_ONE_THEN_STATUS));
        // Full: it is counted dropped (field 10 is 1, just before the status).
        let full = ended(MAX_ATTRIBUTES);
        assert!(!holds(&full, b"error.type"));
        assert!(holds(&full, &DROPPED_ONE_THEN_STATUS));
        // Over: each attribute past the limit is counted too.
        let over = ended(MAX_ATTRIBUTES + 2);
        assert!(holds(&over, &[10 << 3, 3, 15 << 3 | 2]));
    }

    #[test]
    fn the_end_time_goes_in_the_room_kept_for_it() {
        let redactor = Redactor::default();
        let start = SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(1_000);
        let end = SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(0x0102_0304);
        // Ids of no byte that reads as a field's tag below.
        let ids = SpanIds {
            trace: TraceId::from(1u128),
            span: SpanId::from(1u64),
            flags: SAMPLED,
            remote: false,
        };
        let mut span = SpanRecord::open(ids, None, SpanKind::Client, &["a", "b"], start, &redactor);
        span.attributes(&redactor).text("k", "v");
        let fields = span.end(end, &redactor);
        let mut end_field = vec![8 << 3 | 1];
        end_field.extend_from_slice(&0x0102_0304u64.to_le_bytes());
        assert!(holds(fields, &end_field));
        assert!(holds(fields, &[5 << 3 | 2, 2, b'a', b'b']));
        // Field order stays canonical: the end time comes before the attributes.
        let end_at = fields.windows(9).position(|w| w == end_field).unwrap();
        let attribute_at = fields.iter().position(|b| *b == 9 << 3 | 2).unwrap();
        assert!(end_at < attribute_at);
    }

    #[test]
    fn a_span_not_recorded_holds_no_fields_and_ends_as_nothing() {
        let ids = SpanIds {
            trace: TraceId::from(1u128),
            span: SpanId::from(1u64),
            flags: 0,
            remote: false,
        };
        let span = SpanRecord::unrecorded(ids, None);
        assert!(!span.recorded());
        assert_eq!(
            span.fields.capacity(),
            0,
            "nothing is allocated for its fields"
        );
    }
}
