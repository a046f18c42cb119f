//! The trace pipeline: started once per process from [`TraceSettings`], exported in
//! batches on a thread of its own, and [`Span`]s that cost nothing while it is off.
//!
//! Parents are explicit: a [`TraceParent`] is carried where work crosses a task or a host
//! (a spawned worker, a forwarded message, a door's `traceparent`), and within one task
//! the span a piece of work runs under is its [`TraceParent::current`], set by
//! [`TraceParent::scope`].

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use opentelemetry::trace::{SpanId, TraceId};

pub use opentelemetry::trace::SpanKind;
use tokio::task::futures::TaskLocalFuture;

use super::batch::Batches;
use super::export;
use super::otlp::EncodedResource;
use super::record::{Attributes, SAMPLED, SpanIds, SpanRecord};
use super::sampler::Sampler;

/// What starts the trace pipeline (`[telemetry]` in the config).
///
/// ```
/// use capstan_host::telemetry::TraceSettings;
///
/// let settings = TraceSettings::default();
/// // Nothing set here or in the environment: no span is ever built.
/// assert!(settings.otlp_endpoint.is_none() && !settings.content);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceSettings {
    /// The OTLP/HTTP receiver's base URL (`otlp_endpoint`, e.g. `http://127.0.0.1:4318`);
    /// spans go to its `/v1/traces`. Unset: the `OTEL_EXPORTER_OTLP_*` variables decide.
    pub otlp_endpoint: Option<String>,
    /// Whether tool arguments and results go into spans (`content`), each through the
    /// redactor. Off by default: spans carry names, ids, sizes and times only.
    pub content: bool,
    /// The `service.name` of every span.
    pub service_name: String,
}

/// Why the trace pipeline did not start.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The exporter refused its configuration (an endpoint, a protocol, a header).
    #[error(
        "cannot export traces ({0}): check [telemetry] otlp_endpoint and the OTEL_EXPORTER_OTLP_* variables"
    )]
    Exporter(String),
    /// The thread that sends the batches could not be started.
    #[error("cannot start the thread that sends spans: {0}")]
    Thread(std::io::Error),
}

struct Traces {
    batches: &'static Batches,
    sampler: Sampler,
    content: bool,
}

static TRACES: OnceLock<Traces> = OnceLock::new();

fn traces() -> Option<&'static Traces> {
    TRACES.get()
}

/// Whether this process exports spans.
pub fn traces_on() -> bool {
    TRACES.get().is_some()
}

/// Whether spans may carry content (tool arguments and results), as
/// [`TraceSettings::content`] asked; always false while traces are off.
pub fn content_on() -> bool {
    traces().is_some_and(|traces| traces.content)
}

/// Starts exporting spans if `settings` or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables name a receiver (and neither
/// `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none` turns them off): whether
/// they are on. The first start of a process wins; later ones change nothing. Call
/// [`shutdown_traces`] before the process ends, so the last batch is sent.
pub fn start_traces(settings: &TraceSettings) -> Result<bool, TraceError> {
    if TRACES.get().is_some() {
        return Ok(true);
    }
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED")
        .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim() == "none");
    let asked = settings.otlp_endpoint.is_some()
        || set("OTEL_EXPORTER_OTLP_ENDPOINT")
        || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    if disabled || !asked {
        return Ok(false);
    }
    let (sampler, set_aside) = Sampler::from_env(|name| std::env::var(name).ok());
    if let Some(note) = set_aside {
        tracing::warn!("{note}");
    }
    if sampler.records_nothing() {
        return Ok(false);
    }
    let target = export::Target::resolve(settings.otlp_endpoint.as_deref(), |name| {
        std::env::var(name).ok()
    })
    .map_err(TraceError::Exporter)?;
    let resource = EncodedResource::new(&settings.service_name);
    let exporter = export::exporter(target, resource).map_err(TraceError::Exporter)?;
    // Started once: a second start, racing this one, finds it set above or here.
    static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = STARTING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if TRACES.get().is_some() {
        return Ok(true);
    }
    let batches = Batches::start(exporter).map_err(TraceError::Thread)?;
    let _ = TRACES.set(Traces {
        batches,
        sampler,
        content: settings.content,
    });
    Ok(true)
}

/// Returns once every span ended before the call has been sent (or its batch failed, or
/// the exporter's timeout passed); the pipeline goes on. It blocks the thread: from
/// async code, call it in `spawn_blocking`.
pub fn flush_traces() {
    if let Some(traces) = traces() {
        traces.batches.flush();
    }
}

/// Sends the spans still batched and stops the pipeline; blocks until they are sent or
/// the exporter's timeout passes. It blocks the thread: call it as the process ends,
/// outside async code.
pub fn shutdown_traces() {
    if let Some(traces) = traces() {
        traces.batches.close();
    }
}

tokio::task_local! {
    static CURRENT: TraceParent;
}

/// The span a piece of work is part of, or none: what a new span's parent is, carried
/// across tasks and hosts as the W3C `traceparent` text. One pointer wide, so the
/// messages that carry it stay small; nothing is allocated while traces are off.
///
/// ```
/// use capstan_host::telemetry::TraceParent;
///
/// let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let parent = TraceParent::from_header(header);
/// assert_eq!(parent.header().as_deref(), Some(header));
/// assert!(TraceParent::from_header("00-not-a-trace").is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceParent(Option<Arc<SpanIds>>);

impl TraceParent {
    /// No parent: a span started under it begins a trace.
    pub fn none() -> Self {
        TraceParent(None)
    }

    /// The parent set by the innermost [`TraceParent::scope`] of this task, or none.
    pub fn current() -> Self {
        if !traces_on() {
            return TraceParent(None);
        }
        CURRENT.try_with(Clone::clone).unwrap_or_default()
    }

    /// Whether there is no parent.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }

    /// Reads a W3C `traceparent` value (`00-<trace id>-<span id>-<flags>`); anything else
    /// (another version's extra fields aside) is no parent, as the recommendation says.
    pub fn from_header(value: &str) -> Self {
        let mut parts = value.trim().split('-');
        let (Some(version), Some(trace), Some(span), Some(flags)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return TraceParent(None);
        };
        let hex = |text: &str, len: usize| {
            text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let extra = parts.next().is_some();
        if !hex(version, 2)
            || version == "ff"
            || (version == "00" && extra)
            || !hex(trace, 32)
            || !hex(span, 16)
            || !hex(flags, 2)
        {
            return TraceParent(None);
        }
        let (Ok(trace), Ok(span), Ok(flags)) = (
            TraceId::from_hex(trace),
            SpanId::from_hex(span),
            u8::from_str_radix(flags, 16),
        ) else {
            return TraceParent(None);
        };
        if trace == TraceId::INVALID || span == SpanId::INVALID {
            return TraceParent(None);
        }
        TraceParent(Some(Arc::new(SpanIds {
            trace,
            span,
            flags: flags & SAMPLED,
            remote: true,
        })))
    }

    /// The W3C `traceparent` value naming this parent, if there is one.
    pub fn header(&self) -> Option<String> {
        let ids = self.0.as_ref()?;
        Some(format!("00-{}-{}-{:02x}", ids.trace, ids.span, ids.flags))
    }

    /// `work`, run with this as its [`TraceParent::current`]: a future no larger than
    /// `work` but for one pointer.
    pub fn scope<F: Future>(self, work: F) -> TaskLocalFuture<TraceParent, F> {
        CURRENT.scope(self, work)
    }
}

/// One span under way, ended when dropped; while traces are off it is nothing (one
/// pointer, never allocated), and no closure given to it is called.
///
/// What a span is given is written there and then, in the form it is exported in, each
/// string through the log's redactor: names and attributes are borrowed, never copied
/// into owned values first.
#[derive(Debug, Default)]
pub struct Span(Option<Box<SpanRecord>>);

impl Span {
    /// Starts a span of `kind` under `parent`. `name` gives its name's pieces (written one
    /// after another) and `attributes` adds its first attributes; both are called only if
    /// the span is recorded. Every string is redacted as it is written, by the log's
    /// redactor of that moment.
    pub fn start<'n, const N: usize>(
        kind: SpanKind,
        parent: &TraceParent,
        name: impl FnOnce() -> [&'n str; N],
        attributes: impl FnOnce(&mut Attributes<'_>),
    ) -> Span {
        Span::start_at(kind, parent, None, name, attributes)
    }

    /// [`Span::start`] with the time it began, if it began earlier.
    pub fn start_at<'n, const N: usize>(
        kind: SpanKind,
        parent: &TraceParent,
        began: Option<SystemTime>,
        name: impl FnOnce() -> [&'n str; N],
        attributes: impl FnOnce(&mut Attributes<'_>),
    ) -> Span {
        let Some(traces) = traces() else {
            return Span(None);
        };
        let parent = parent.0.as_deref();
        let ids = SpanIds::child_of(parent, &traces.sampler);
        // A span not recorded is only its ids, for its children to name.
        if !ids.sampled() {
            return Span(Some(Box::new(SpanRecord::unrecorded(ids, parent))));
        }
        let start = began.unwrap_or_else(SystemTime::now);
        // A copy (one shared pointer): no lock is held while the closures run.
        let redactor = crate::secrets::log_redactor();
        let mut span = SpanRecord::open(ids, parent, kind, &name(), start, &redactor);
        attributes(&mut span.attributes(&redactor));
        Span(Some(Box::new(span)))
    }

    /// The parent a child of this span names: none while traces are off.
    pub fn parent(&self) -> TraceParent {
        TraceParent(self.0.as_ref().map(|span| Arc::new(span.ids)))
    }

    /// Whether the span is recorded: what it is given is exported.
    pub fn is_recorded(&self) -> bool {
        self.0.as_ref().is_some_and(|span| span.recorded())
    }

    /// Adds the attributes `more` gives, if the span is recorded.
    pub fn set(&mut self, more: impl FnOnce(&mut Attributes<'_>)) {
        if let Some(span) = &mut self.0
            && span.recorded()
        {
            more(&mut span.attributes(&crate::secrets::log_redactor()));
        }
    }

    /// Marks the span failed, with `error.type` set to `kind`.
    pub fn fail(&mut self, kind: &str) {
        if let Some(span) = &mut self.0
            && span.recorded()
        {
            span.fail(Cow::Owned(kind.to_owned()));
        }
    }

    /// Ends the span at `at` rather than now.
    pub fn end_at(mut self, at: SystemTime) {
        if let Some(mut span) = self.0.take() {
            finish(&mut span, at);
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(mut span) = self.0.take() {
            finish(&mut span, SystemTime::now());
        }
    }
}

/// Queues `span`, ended `at`, if it is recorded; the caller frees its record, on the
/// thread that ended it.
fn finish(span: &mut SpanRecord, at: SystemTime) {
    let Some(traces) = traces().filter(|_| span.recorded()) else {
        return;
    };
    traces
        .batches
        .push(span.end(at, &crate::secrets::log_redactor()));
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn a_traceparent_round_trips_and_keeps_only_the_sampled_flag() {
        let parent = TraceParent::from_header(&format!("00-{TRACE}-{SPAN}-01"));
        assert_eq!(parent.header(), Some(format!("00-{TRACE}-{SPAN}-01")));
        let unsampled = TraceParent::from_header(&format!(" 00-{TRACE}-{SPAN}-00 "));
        assert_eq!(unsampled.header(), Some(format!("00-{TRACE}-{SPAN}-00")));
        // Flags this version does not define are dropped, not passed on.
        let odd = TraceParent::from_header(&format!("00-{TRACE}-{SPAN}-ff"));
        assert_eq!(odd.header(), Some(format!("00-{TRACE}-{SPAN}-01")));
        // A later version may add fields; they are ignored.
        let later = TraceParent::from_header(&format!("01-{TRACE}-{SPAN}-01-more"));
        assert_eq!(later.header(), Some(format!("00-{TRACE}-{SPAN}-01")));
    }

    #[test]
    fn a_malformed_traceparent_is_no_parent() {
        let zeros_trace = "0".repeat(32);
        let zeros_span = "0".repeat(16);
        for bad in [
            String::new(),
            "00".into(),
            format!("ff-{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-01-extra"),
            format!("00-{}-{SPAN}-01", TRACE.to_uppercase()),
            format!("00-{zeros_trace}-{SPAN}-01"),
            format!("00-{TRACE}-{zeros_span}-01"),
            format!("00-{TRACE}-{SPAN}-1"),
            format!("00-{}-{SPAN}-01", &TRACE[1..]),
            format!("0x-{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-01\u{e9}"),
        ] {
            let parent = TraceParent::from_header(&bad);
            assert!(parent.is_none(), "{bad:?} was taken: {parent:?}");
            assert_eq!(parent.header(), None);
        }
    }

    #[tokio::test]
    async fn while_traces_are_off_nothing_is_made() {
        // This test binary never starts traces.
        assert!(!traces_on() && !content_on());
        let parent = TraceParent::from_header(&format!("00-{TRACE}-{SPAN}-01"));
        let called = std::cell::Cell::new(false);
        let span = Span::start(
            SpanKind::Internal,
            &parent,
            || {
                called.set(true);
                ["named"]
            },
            |_| called.set(true),
        );
        assert!(!called.get(), "no span is named while traces are off");
        assert!(span.parent().is_none());
        // A scope holds nothing to find either.
        let current = parent.scope(async { TraceParent::current() }).await;
        assert!(current.is_none());
    }
}
