//! Spans as the OTLP/HTTP protobuf body (`ExportTraceServiceRequest` of
//! opentelemetry-proto 1.x): each span written straight from the host's span record as
//! it ends, each string through the log's redactor as it is written, and a batch framed
//! around the spans once.
//!
//! The generated message types would copy every string of every span into a tree of
//! owned messages and encode that: most of what a span cost to export, in a process whose
//! spans come by the thousand a second. Only the messages a span batch uses are written,
//! always in canonical form (field order, minimal lengths), so any decoder reads them.

use std::borrow::Cow;
use std::time::SystemTime;

use opentelemetry::trace::SpanKind;
use opentelemetry::{Array, KeyValue, StringValue, Value};

use super::record::{MAX_ATTRIBUTES, SpanRecord};
use super::semconv;
use crate::secrets::Redactor;

/// Protobuf wire types.
const LEN: u8 = 2;
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const FIXED32: u8 = 5;

/// `SpanFlags`: the flags say whether the parent is remote, and whether it is.
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// `Status.code`: an error.
const STATUS_ERROR: u64 = 2;

/// What names the process (the `Resource`'s attributes) and the instrumentation (an
/// `InstrumentationScope` message, written once); the resource is written with each
/// batch, through the redactor of the time.
#[derive(Debug, Clone, Default)]
pub(super) struct EncodedResource {
    attributes: Vec<(&'static str, Value)>,
    scope: Vec<u8>,
}

impl EncodedResource {
    /// The resource of service `service` in this process, and the host's scope.
    pub(super) fn new(service: &str) -> Self {
        let pid = i64::from(std::process::id());
        let attributes = vec![
            (semconv::SERVICE_NAME, Value::from(service.to_owned())),
            (semconv::TELEMETRY_SDK_NAME, Value::from("capstan")),
            (semconv::TELEMETRY_SDK_LANGUAGE, Value::from("rust")),
            (
                semconv::TELEMETRY_SDK_VERSION,
                Value::from(env!("CARGO_PKG_VERSION")),
            ),
            // Which host of several sharing a store made the span.
            (semconv::PROCESS_PID, Value::from(pid)),
        ];
        let mut scope = Vec::new();
        string(&mut scope, 1, "capstan");
        string(&mut scope, 2, env!("CARGO_PKG_VERSION"));
        EncodedResource { attributes, scope }
    }
}

/// One span as an entry of `ScopeSpans.spans`, appended to `out`, each string passed
/// through `redactor`: written by the thread that ended the span, so that the record is
/// freed where it was made and a batch is only framed.
pub(super) fn encode_span_entry(out: &mut Vec<u8>, span: &SpanRecord, redactor: &Redactor) {
    message(out, 2, |out| encode_span(out, span, redactor));
}

/// `spans`, entries of [`encode_span_entry`] one after another, in runs of whole entries
/// of at most `max` bytes each (an entry larger than `max` makes a run of its own).
pub(super) fn runs_of_entries(spans: &[u8], max: usize) -> impl Iterator<Item = &[u8]> {
    let mut rest = spans;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = entry_len(rest);
        while end < rest.len() {
            let next = end + entry_len(&rest[end..]);
            if next > max {
                break;
            }
            end = next;
        }
        let (run, after) = rest.split_at(end);
        rest = after;
        Some(run)
    })
}

/// The length of the entry `entries` starts with: its one-byte tag, its body's length
/// as a varint, and its body (at least one byte, at most what is there).
fn entry_len(entries: &[u8]) -> usize {
    let mut len = 0usize;
    let mut at = 1;
    while let Some(&byte) = entries.get(at) {
        len |= usize::from(byte & 0x7f) << (7 * (at - 1));
        at += 1;
        if byte < 0x80 {
            break;
        }
    }
    (at + len).min(entries.len()).max(1)
}

/// One `ExportTraceServiceRequest` around `spans`, entries of [`encode_span_entry`],
/// appended to `out`; the resource's strings pass through `redactor`. Every length is
/// known before it is written, so the spans are copied once.
pub(super) fn encode_batch(
    out: &mut Vec<u8>,
    resource: &EncodedResource,
    spans: &[u8],
    redactor: &Redactor,
) {
    // ResourceSpans.resource
    let mut head = Vec::new();
    message(&mut head, 1, |out| {
        for (key, value) in &resource.attributes {
            message(out, 1, |out| key_value(out, key, value, redactor));
        }
    });
    // ScopeSpans.scope, then (after the spans) ScopeSpans.schema_url, which
    // ResourceSpans.schema_url repeats: one tracer makes every span.
    let mut scope = Vec::new();
    bytes(&mut scope, 1, &resource.scope);
    let mut schema = Vec::new();
    string(&mut schema, 3, semconv::SCHEMA_URL);
    let scope_spans = scope.len() + spans.len() + schema.len();
    // ResourceSpans.scope_spans
    tag(&mut head, 2, LEN);
    varint(&mut head, scope_spans as u64);
    let resource_spans = head.len() + scope_spans + schema.len();
    out.reserve(resource_spans + 16);
    // ExportTraceServiceRequest.resource_spans
    tag(out, 1, LEN);
    varint(out, resource_spans as u64);
    out.extend_from_slice(&head);
    out.extend_from_slice(&scope);
    out.extend_from_slice(spans);
    out.extend_from_slice(&schema);
    out.extend_from_slice(&schema);
}

fn encode_span(out: &mut Vec<u8>, span: &SpanRecord, redactor: &Redactor) {
    let ids = &span.ids;
    bytes(out, 1, &ids.trace.to_bytes());
    bytes(out, 2, &ids.span.to_bytes());
    if let Some((parent, _)) = span.parent {
        bytes(out, 4, &parent.to_bytes());
    }
    string(out, 5, &redactor.redact(&span.name));
    let kind = match span.kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    uint(out, 6, kind);
    fixed64(out, 7, nanos(span.start));
    fixed64(out, 8, nanos(span.end));
    for attribute in &span.attributes {
        message(out, 9, |out| attribute_of(out, attribute, redactor));
    }
    let mut dropped = span.dropped_attributes;
    if let Some(error) = &span.error {
        // `error.type` is one of the span's attributes, and counts within its limit.
        if span.attributes.len() < MAX_ATTRIBUTES {
            let value = Value::String(StringValue::from(error.to_string()));
            message(out, 9, |out| {
                key_value(out, semconv::ERROR_TYPE, &value, redactor)
            });
        } else {
            dropped = dropped.saturating_add(1);
        }
    }
    uint(out, 10, dropped.into());
    if let Some(error) = &span.error {
        message(out, 15, |out| {
            string(out, 2, &redactor.redact(error));
            uint(out, 3, STATUS_ERROR);
        });
    }
    let remote = span.parent.is_some_and(|(_, remote)| remote);
    fixed32(out, 16, flags(ids.flags, remote));
}

/// `SpanFlags`: the W3C trace flags, and whether the span's parent is remote, which is
/// always known here.
fn flags(trace_flags: u8, remote: bool) -> u32 {
    let known = u32::from(trace_flags) | HAS_IS_REMOTE;
    if remote { known | IS_REMOTE } else { known }
}

fn attribute_of(out: &mut Vec<u8>, attribute: &KeyValue, redactor: &Redactor) {
    key_value(out, attribute.key.as_str(), &attribute.value, redactor);
}

/// A `KeyValue` message's fields.
fn key_value(out: &mut Vec<u8>, key: &str, value: &Value, redactor: &Redactor) {
    string(out, 1, &redactor.redact(key));
    message(out, 2, |out| any_value(out, value, redactor));
}

/// An `AnyValue` message's one field.
fn any_value(out: &mut Vec<u8>, value: &Value, redactor: &Redactor) {
    match value {
        Value::String(text) => text_value(out, text, redactor),
        Value::Bool(flag) => tag_varint(out, 2, u64::from(*flag)),
        Value::I64(number) => tag_varint(out, 3, *number as u64),
        Value::F64(number) => {
            tag(out, 4, FIXED64);
            out.extend_from_slice(&number.to_le_bytes());
        }
        Value::Array(array) => message(out, 5, |out| {
            // ArrayValue.values
            let mut each = |value: Value| message(out, 1, |out| any_value(out, &value, redactor));
            match array {
                Array::Bool(values) => values.iter().for_each(|v| each(Value::Bool(*v))),
                Array::I64(values) => values.iter().for_each(|v| each(Value::I64(*v))),
                Array::F64(values) => values.iter().for_each(|v| each(Value::F64(*v))),
                Array::String(values) => values.iter().for_each(|v| each(Value::String(v.clone()))),
                // A kind of array a later API may add: written as its text.
                other => each(Value::String(other.to_string().into())),
            }
        }),
        // A kind of value a later API may add: written as its text.
        other => text_value(out, &StringValue::from(other.to_string()), redactor),
    }
}

fn text_value(out: &mut Vec<u8>, text: &StringValue, redactor: &Redactor) {
    let text: Cow<'_, str> = redactor.redact(text.as_str());
    // Written even when empty: an empty string value is still a string value.
    tag(out, 1, LEN);
    varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
        })
}

/// A length-delimited field `field` whose body `write` appends: its length is known only
/// once written, so one byte is kept for it and the body moved on in the rare case it
/// needs more.
fn message(out: &mut Vec<u8>, field: u32, write: impl FnOnce(&mut Vec<u8>)) {
    tag(out, field, LEN);
    let at = out.len();
    out.push(0);
    write(out);
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
    } else {
        let mut prefix = Vec::with_capacity(10);
        varint(&mut prefix, len as u64);
        out.splice(at..=at, prefix);
    }
}

/// A string field, left out when empty (proto3's default).
fn string(out: &mut Vec<u8>, field: u32, text: &str) {
    bytes(out, field, text.as_bytes());
}

/// A bytes field, left out when empty.
fn bytes(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    if !data.is_empty() {
        tag(out, field, LEN);
        varint(out, data.len() as u64);
        out.extend_from_slice(data);
    }
}

/// An unsigned varint field, left out when zero.
fn uint(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        tag_varint(out, field, value);
    }
}

fn tag_varint(out: &mut Vec<u8>, field: u32, value: u64) {
    tag(out, field, VARINT);
    varint(out, value);
}

fn fixed64(out: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        tag(out, field, FIXED64);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

fn fixed32(out: &mut Vec<u8>, field: u32, value: u32) {
    if value != 0 {
        tag(out, field, FIXED32);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire)));
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_minimal_varints_however_long_the_body() {
        for (len, prefix) in [
            (0usize, vec![0u8]),
            (127, vec![127]),
            (128, vec![0x80, 1]),
            (300, vec![0xac, 2]),
            (16_384, vec![0x80, 0x80, 1]),
        ] {
            let mut out = vec![0xff];
            message(&mut out, 2, |out| out.extend(std::iter::repeat_n(7, len)));
            let mut expected = vec![0xff, 2 << 3 | LEN];
            expected.extend(prefix);
            expected.extend(std::iter::repeat_n(7, len));
            assert_eq!(out, expected, "a body of {len} bytes");
        }
    }

    #[test]
    fn a_batch_is_framed_as_the_nested_messages_would_be_written() {
        let resource = EncodedResource::new("framed");
        let redactor = Redactor::default();
        // Long enough that every length takes more than one byte.
        let spans: Vec<u8> = (0..300u32)
            .flat_map(|i| [2 << 3 | LEN, 1, i as u8])
            .collect();
        let mut framed = Vec::new();
        encode_batch(&mut framed, &resource, &spans, &redactor);
        let mut nested = Vec::new();
        message(&mut nested, 1, |out| {
            message(out, 1, |out| {
                for (key, value) in &resource.attributes {
                    message(out, 1, |out| key_value(out, key, value, &redactor));
                }
            });
            message(out, 2, |out| {
                bytes(out, 1, &resource.scope);
                out.extend_from_slice(&spans);
                string(out, 3, semconv::SCHEMA_URL);
            });
            string(out, 3, semconv::SCHEMA_URL);
        });
        assert_eq!(framed, nested);
    }

    #[test]
    fn a_backlog_is_cut_into_runs_of_whole_entries() {
        // Entries of 3, 130 (a two-byte length) and 40 bytes' bodies.
        let mut spans = Vec::new();
        for body in [3usize, 130, 40, 3] {
            message(&mut spans, 2, |out| {
                out.extend(std::iter::repeat_n(9, body))
            });
        }
        let sizes = |max| {
            runs_of_entries(&spans, max)
                .map(<[u8]>::len)
                .collect::<Vec<_>>()
        };
        assert_eq!(sizes(1 << 20), [spans.len()]);
        // 5 + 133 + 42 + 5: the large entry alone, the next two together.
        assert_eq!(sizes(100), [5, 133, 47]);
        assert_eq!(sizes(1), [5, 133, 42, 5]);
        assert_eq!(
            runs_of_entries(&spans, 100).collect::<Vec<_>>().concat(),
            spans
        );
        assert_eq!(runs_of_entries(&[], 100).count(), 0);
    }

    #[test]
    fn error_type_counts_within_the_attribute_limit() {
        use crate::telemetry::record::SpanIds;
        use crate::telemetry::sampler::Sampler;
        let encoded = |attributes: usize| {
            let now = SystemTime::now();
            let span = SpanRecord {
                ids: SpanIds::child_of(None, &Sampler::default()),
                parent: None,
                kind: SpanKind::Internal,
                name: "full".into(),
                start: now,
                end: now,
                attributes: (0..attributes as i64)
                    .map(|i| KeyValue::new("n", i))
                    .collect(),
                dropped_attributes: 0,
                error: Some("timeout".into()),
            };
            let mut out = Vec::new();
            encode_span(&mut out, &span, &Redactor::default());
            out
        };
        let holds = |out: &[u8], part: &[u8]| out.windows(part.len()).any(|w| w == part);
        // Room for one more: `error.type` is written, and nothing is counted dropped.
        let roomy = encoded(MAX_ATTRIBUTES - 1);
        assert!(holds(&roomy, semconv::ERROR_TYPE.as_bytes()));
        assert!(!holds(&roomy, &[10 << 3 | VARINT, 1, 15 << 3 | LEN]));
        // Full: it is counted dropped (field 10 is 1, just before the status).
        let full = encoded(MAX_ATTRIBUTES);
        assert!(!holds(&full, semconv::ERROR_TYPE.as_bytes()));
        assert!(holds(&full, &[10 << 3 | VARINT, 1, 15 << 3 | LEN]));
    }

    #[test]
    fn defaults_are_left_out_but_an_empty_string_value_is_kept() {
        let mut out = Vec::new();
        string(&mut out, 1, "");
        uint(&mut out, 2, 0);
        fixed64(&mut out, 3, 0);
        assert!(out.is_empty());
        any_value(&mut out, &Value::from(""), &Redactor::default());
        assert_eq!(out, [1 << 3 | LEN, 0]);
    }
}
