//! What the host tells an operator about itself beyond the audit log: Prometheus
//! [`Metrics`] of turns, tool calls, denials, model requests, kept instances, waiting
//! calls, leases and outbound requests, served by `capstan serve` at `GET /metrics`.
//!
//! A leaf room: it names only the ids, so every other room may count into it.

mod metrics;

pub use metrics::{CONTENT_TYPE, DenialReason, Metrics, NO_RULE, UNKNOWN_TOOL, metrics};
