//! What the host tells an operator about itself beyond the audit log: Prometheus
//! [`Metrics`] of turns, tool calls, denials, model requests, kept instances, waiting
//! calls, leases and outbound requests, served by `capstan serve` at `GET /metrics`; and
//! OpenTelemetry traces of turns, model requests, tool calls and outbound requests
//! ([`spans`]), exported over OTLP when the config or the environment names a receiver.
//!
//! A leaf room: it names only the ids, and the log's redactor every exported span passes,
//! so every other room may count and trace into it.

mod batch;
mod export;
mod metrics;
mod otlp;
mod record;
mod sampler;
mod semconv;
pub mod spans;
mod traces;

pub use metrics::{CONTENT_TYPE, DenialReason, Metrics, NO_RULE, UNKNOWN_TOOL, metrics};
pub use record::Attributes;
pub use traces::{
    Span, SpanKind, TraceError, TraceParent, TraceSettings, content_on, flush_traces,
    shutdown_traces, start_traces, traces_on,
};
