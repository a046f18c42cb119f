//! Spans as the OTLP/HTTP protobuf body (`ExportTraceServiceRequest` of
//! opentelemetry-proto 1.x): each span's fields written as the span is given them (its
//! head as it starts, each attribute as it is added, its tail as it ends), each string
//! through the log's redactor as it is written, and a batch framed around the spans once.
//!
//! The generated message types would copy every string of every span into a tree of
//! owned messages and encode that: most of what a span cost to export, in a process whose
//! spans come by the thousand a second. Only the messages a span batch uses are written,
//! always in canonical form (field order, minimal lengths), so any decoder reads them.

use std::time::SystemTime;

use opentelemetry::trace::{SpanId, SpanKind, TraceId};

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
    service: String,
    pid: i64,
    scope: Vec<u8>,
}

impl EncodedResource {
    /// The resource of service `service` in this process, and the host's scope.
    pub(super) fn new(service: &str) -> Self {
        let mut scope = Vec::new();
        string(&mut scope, 1, "capstan");
        string(&mut scope, 2, env!("CARGO_PKG_VERSION"));
        EncodedResource {
            service: service.to_owned(),
            pid: i64::from(std::process::id()),
            scope,
        }
    }

    /// The `Resource` message's attributes, appended to `out`.
    fn write_attributes(&self, out: &mut Vec<u8>, redactor: &Redactor) {
        use AttributeValue::{Int, Text};
        for (key, value) in [
            (semconv::SERVICE_NAME, Text(&self.service)),
            (semconv::TELEMETRY_SDK_NAME, Text("capstan")),
            (semconv::TELEMETRY_SDK_LANGUAGE, Text("rust")),
            (
                semconv::TELEMETRY_SDK_VERSION,
                Text(env!("CARGO_PKG_VERSION")),
            ),
            // Which host of several sharing a store made the span.
            (semconv::PROCESS_PID, Int(self.pid)),
        ] {
            attribute(out, RESOURCE_ATTRIBUTES, key, value, redactor);
        }
    }
}

/// The field of a `Span` message that holds its attributes.
pub(super) const SPAN_ATTRIBUTES: u32 = 9;

/// The field of a `Resource` message that holds its attributes.
const RESOURCE_ATTRIBUTES: u32 = 1;

/// The field of a `ScopeSpans` message that holds its spans.
const SCOPE_SPANS_SPANS: u32 = 2;

/// An attribute's value, as it is given.
#[derive(Debug, Clone, Copy)]
pub(super) enum AttributeValue<'a> {
    /// A string, passed through the redactor.
    Text(&'a str),
    /// An integer.
    Int(i64),
}

/// A `KeyValue` message as field `field`, appended to `out`, its key and text through
/// `redactor`; every length is known before it is written.
pub(super) fn attribute(
    out: &mut Vec<u8>,
    field: u32,
    key: &str,
    value: AttributeValue<'_>,
    redactor: &Redactor,
) {
    let key = redactor.redact(key);
    // AnyValue's one field.
    let (text, number) = match value {
        AttributeValue::Text(text) => (Some(redactor.redact(text)), 0),
        AttributeValue::Int(number) => (None, number as u64),
    };
    let any = match &text {
        // Written even when empty: an empty string value is still a string value.
        Some(text) => 1 + varint_len(text.len() as u64) + text.len(),
        None => 1 + varint_len(number),
    };
    let key_field = if key.is_empty() {
        0
    } else {
        1 + varint_len(key.len() as u64) + key.len()
    };
    let key_value = key_field + 1 + varint_len(any as u64) + any;
    tag(out, field, LEN);
    varint(out, key_value as u64);
    string(out, 1, &key);
    tag(out, 2, LEN);
    varint(out, any as u64);
    match &text {
        Some(text) => {
            tag(out, 1, LEN);
            varint(out, text.len() as u64);
            out.extend_from_slice(text.as_bytes());
        }
        None => tag_varint(out, 3, number),
    }
}

/// A `Span` message's first fields, ids to start time, appended to `out`, and room for
/// its end time: where that room is. The name's pieces are written one after another,
/// each through `redactor`.
pub(super) fn span_head(
    out: &mut Vec<u8>,
    (trace, span): (TraceId, SpanId),
    parent: Option<SpanId>,
    kind: SpanKind,
    name: &[&str],
    start: SystemTime,
    redactor: &Redactor,
) -> usize {
    bytes(out, 1, &trace.to_bytes());
    bytes(out, 2, &span.to_bytes());
    if let Some(parent) = parent {
        bytes(out, 4, &parent.to_bytes());
    }
    match name {
        [] => {}
        [whole] => string(out, 5, &redactor.redact(whole)),
        // Redacted whole: a value may run from one piece into the next.
        pieces if redactor.is_empty() => message(out, 5, |out| {
            pieces
                .iter()
                .for_each(|piece| out.extend_from_slice(piece.as_bytes()))
        }),
        pieces => string(out, 5, &redactor.redact(&pieces.concat())),
    }
    let kind = match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
    };
    uint(out, 6, kind);
    fixed64(out, 7, nanos(start));
    // The end time, written when the span ends: always written, so that its place is
    // known (a time at or before 1970 is zero, which proto3 would leave out).
    tag(out, 8, FIXED64);
    let end_at = out.len();
    out.extend_from_slice(&[0; 8]);
    end_at
}

/// What a span adds to its fields as it ends.
pub(super) struct Tail<'a> {
    /// `error.type`, if it failed and the span has room for one more attribute.
    pub(super) error_type: Option<&'a str>,
    /// Attributes left out over the limit.
    pub(super) dropped_attributes: u32,
    /// Why it failed, for its status.
    pub(super) error: Option<&'a str>,
    /// Its W3C trace flags.
    pub(super) flags: u8,
    /// Whether its parent is another process's span.
    pub(super) remote_parent: bool,
}

/// Ends the `Span` message whose fields [`span_head`] began in `fields` (its end time's
/// room at `end_at`) and [`attribute`] went on with: its end time `end` and `tail`.
pub(super) fn span_tail(
    fields: &mut Vec<u8>,
    end_at: usize,
    end: SystemTime,
    tail: Tail<'_>,
    redactor: &Redactor,
) {
    fields[end_at..end_at + 8].copy_from_slice(&nanos(end).to_le_bytes());
    if let Some(error) = tail.error_type {
        attribute(
            fields,
            SPAN_ATTRIBUTES,
            semconv::ERROR_TYPE,
            AttributeValue::Text(error),
            redactor,
        );
    }
    uint(fields, 10, tail.dropped_attributes.into());
    if let Some(error) = tail.error {
        message(fields, 15, |out| {
            string(out, 2, &redactor.redact(error));
            uint(out, 3, STATUS_ERROR);
        });
    }
    fixed32(fields, 16, flags(tail.flags, tail.remote_parent));
}

/// The head of one entry of `ScopeSpans.spans` whose `Span` message is `len` bytes: its
/// tag and length, written into `room`.
pub(super) fn entry_head(len: usize, room: &mut [u8; 11]) -> &[u8] {
    room[0] = (SCOPE_SPANS_SPANS << 3) as u8 | LEN;
    let mut at = 1;
    let mut value = len as u64;
    while value >= 0x80 {
        room[at] = value as u8 | 0x80;
        value >>= 7;
        at += 1;
    }
    room[at] = value as u8;
    &room[..=at]
}

/// `spans`, entries of [`entry_head`] and their spans one after another, in runs of whole entries
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

/// One `ExportTraceServiceRequest` around `spans`, entries of [`entry_head`] and spans,
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
    message(&mut head, 1, |out| resource.write_attributes(out, redactor));
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

/// `SpanFlags`: the W3C trace flags, and whether the span's parent is remote, which is
/// always known here.
fn flags(trace_flags: u8, remote: bool) -> u32 {
    let known = u32::from(trace_flags) | HAS_IS_REMOTE;
    if remote { known | IS_REMOTE } else { known }
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

/// How many bytes [`varint`] writes for `value`.
fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
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
            message(out, 1, |out| resource.write_attributes(out, &redactor));
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
    fn an_attribute_and_an_entry_head_are_framed_as_nested_messages_would_be() {
        let redactor = Redactor::default();
        let long = "v".repeat(300);
        for (key, value) in [
            ("k", AttributeValue::Text("short")),
            ("key", AttributeValue::Text(&long)),
            (&*"k".repeat(200), AttributeValue::Text(&long)),
            ("n", AttributeValue::Int(-1)),
            ("n", AttributeValue::Int(0)),
            ("n", AttributeValue::Int(i64::MAX)),
        ] {
            let mut direct = Vec::new();
            attribute(&mut direct, SPAN_ATTRIBUTES, key, value, &redactor);
            let mut nested = Vec::new();
            message(&mut nested, SPAN_ATTRIBUTES, |out| {
                string(out, 1, key);
                message(out, 2, |out| match value {
                    AttributeValue::Text(text) => {
                        tag(out, 1, LEN);
                        varint(out, text.len() as u64);
                        out.extend_from_slice(text.as_bytes());
                    }
                    AttributeValue::Int(number) => tag_varint(out, 3, number as u64),
                });
            });
            assert_eq!(direct, nested, "{key:?} = {value:?}");
        }
        for len in [0usize, 127, 128, 300, 1 << 21] {
            let body = vec![7u8; len];
            let mut room = [0; 11];
            let mut direct = entry_head(len, &mut room).to_vec();
            direct.extend_from_slice(&body);
            let mut nested = Vec::new();
            message(&mut nested, SCOPE_SPANS_SPANS, |out| {
                out.extend_from_slice(&body)
            });
            assert_eq!(direct, nested, "a span of {len} bytes");
        }
    }

    #[test]
    fn a_secret_in_a_key_a_value_or_a_name_is_written_redacted() {
        let redactor = Redactor::new([("T".parse().unwrap(), "sk-canary-1234".into())]);
        let mut out = Vec::new();
        attribute(
            &mut out,
            SPAN_ATTRIBUTES,
            "sk-canary-1234",
            AttributeValue::Text("a sk-canary-1234 b"),
            &redactor,
        );
        for name in [
            &["execute_tool ", "sk-canary-1234"][..],
            &["a sk-canary-", "1234 b"],
        ] {
            span_head(
                &mut out,
                (TraceId::from(7u128), SpanId::from(9u64)),
                None,
                SpanKind::Internal,
                name,
                SystemTime::now(),
                &redactor,
            );
        }
        let holds = |part: &[u8]| out.windows(part.len()).any(|w| w == part);
        assert!(
            !holds(b"sk-canary"),
            "a secret whole or across two pieces of a name"
        );
        assert!(holds(b"execute_tool ") && holds(b"a ") && holds(b" b"));
    }

    #[test]
    fn defaults_are_left_out_but_an_empty_string_value_is_kept() {
        let mut out = Vec::new();
        string(&mut out, 1, "");
        uint(&mut out, 2, 0);
        fixed64(&mut out, 3, 0);
        assert!(out.is_empty());
        attribute(
            &mut out,
            SPAN_ATTRIBUTES,
            "k",
            AttributeValue::Text(""),
            &Redactor::default(),
        );
        assert_eq!(
            out,
            [
                9 << 3 | LEN,
                7,
                1 << 3 | LEN,
                1,
                b'k',
                2 << 3 | LEN,
                2,
                1 << 3 | LEN,
                0
            ]
        );
    }
}
