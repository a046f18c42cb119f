//! The host's Prometheus metrics: one set per process, counted where each fact happens and
//! rendered as OpenMetrics text for `GET /metrics`.
//!
//! Every label value is one of a few fixed words or a name from the config (a tool that is
//! loaded, a network rule that is granted): a model, a client or a plugin cannot add
//! label values, so no one can grow the set without bound.

use std::sync::LazyLock;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::ids::ProcessKind;

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The label a tool that is not loaded is counted under: a name a model or a client made
/// up never becomes a label value.
pub const UNKNOWN_TOOL: &str = "(unknown)";

/// The label an outbound request no rule allowed is counted under.
pub const NO_RULE: &str = "(none)";

/// Why a call was denied, for `capstan_tool_denials_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenialReason {
    /// The caller's profile does not offer the tool (or a door runs no host tool).
    Policy,
    /// A flow rule refused what the call would send, or where.
    Flow,
    /// The caller's grants do not cover a capability the tool declares.
    Capability,
    /// The tool itself answered `denied` (a host import it called refused it).
    Tool,
}

impl DenialReason {
    /// `policy`, `flow`, `capability` or `tool`.
    pub fn as_str(self) -> &'static str {
        match self {
            DenialReason::Policy => "policy",
            DenialReason::Flow => "flow",
            DenialReason::Capability => "capability",
            DenialReason::Tool => "tool",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolOutcome {
    tool: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ChatLabel {
    channel: String,
    direction: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabel {
    rule: String,
    decision: &'static str,
}

type Seconds = Family<ToolLabel, Histogram, fn() -> Histogram>;

/// Durations from 100 µs to about 100 s, each bucket 4 times the one before.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 4.0, 11))
}

/// The host's metrics. One set per process ([`metrics`]), shared by every runtime in it.
///
/// ```
/// use std::time::Duration;
/// use capstan_host::telemetry::{DenialReason, metrics};
///
/// metrics().tool_call("file_read", "ok", Duration::from_millis(2));
/// metrics().denied(DenialReason::Policy);
/// let text = metrics().render();
/// assert!(text.contains(r#"capstan_tool_calls_total{tool="file_read",outcome="ok"}"#));
/// assert!(text.contains(r#"capstan_tool_denials_total{reason="policy"}"#));
/// assert!(text.ends_with("# EOF\n"));
/// ```
pub struct Metrics {
    registry: Registry,
    turns: Family<KindLabel, Counter>,
    tool_calls: Family<ToolOutcome, Counter>,
    tool_call_seconds: Seconds,
    denials: Family<ReasonLabel, Counter>,
    model_requests: Family<OutcomeLabel, Counter>,
    model_request_seconds: Histogram,
    model_tokens: Counter,
    warm_instances: Gauge<i64, AtomicI64>,
    live_workers: Gauge<i64, AtomicI64>,
    calls_waiting: Gauge<i64, AtomicI64>,
    lease_renewals: Counter,
    lease_takeovers: Counter,
    outbound_requests: Family<RequestLabel, Counter>,
    chat_messages: Family<ChatLabel, Counter>,
}

impl Metrics {
    fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::with_prefix("capstan"),
            turns: Family::default(),
            tool_calls: Family::default(),
            tool_call_seconds: Family::new_with_constructor(seconds),
            denials: Family::default(),
            model_requests: Family::default(),
            model_request_seconds: seconds(),
            model_tokens: Counter::default(),
            warm_instances: Gauge::default(),
            live_workers: Gauge::default(),
            calls_waiting: Gauge::default(),
            lease_renewals: Counter::default(),
            lease_takeovers: Counter::default(),
            outbound_requests: Family::default(),
            chat_messages: Family::default(),
        };
        let r = &mut m.registry;
        r.register(
            "turns",
            "Turns begun, by the kind of process that took them",
            m.turns.clone(),
        );
        r.register(
            "tool_calls",
            "Tool calls ended (refusals included), by tool and outcome",
            m.tool_calls.clone(),
        );
        r.register(
            "tool_call_seconds",
            "Wall time of tool calls, by tool",
            m.tool_call_seconds.clone(),
        );
        r.register(
            "tool_denials",
            "Tool calls denied, by what denied them",
            m.denials.clone(),
        );
        r.register(
            "model_requests",
            "Requests to the model, by outcome (ok, failed, timed_out)",
            m.model_requests.clone(),
        );
        r.register(
            "model_request_seconds",
            "Wall time of model requests that answered",
            m.model_request_seconds.clone(),
        );
        r.register(
            "model_tokens",
            "Tokens the provider reported for answered requests",
            m.model_tokens.clone(),
        );
        r.register(
            "warm_instances",
            "Plugin instances kept between calls",
            m.warm_instances.clone(),
        );
        r.register(
            "live_workers",
            "Workers running now",
            m.live_workers.clone(),
        );
        r.register(
            "calls_waiting",
            "Tool calls waiting for a free slot (limits.max_concurrent_calls)",
            m.calls_waiting.clone(),
        );
        r.register(
            "lease_renewals",
            "Renewals of this host's lease on its conversations (a shared store)",
            m.lease_renewals.clone(),
        );
        r.register(
            "lease_takeovers",
            "Conversations this host took over from a host whose lease ended",
            m.lease_takeovers.clone(),
        );
        r.register(
            "outbound_requests",
            "Outbound requests of tools, by the rule that allowed them and the decision",
            m.outbound_requests.clone(),
        );
        r.register(
            "chat_messages",
            "Messages through messaging channels ([channels.NAME]), by channel, direction \
             (in, out) and outcome",
            m.chat_messages.clone(),
        );
        m
    }

    /// A turn of a `kind` process began.
    pub fn turn_started(&self, kind: ProcessKind) {
        self.turns
            .get_or_create(&KindLabel {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// A call of `tool` (a loaded tool's name, or [`UNKNOWN_TOOL`]) ended with `outcome`
    /// (`ok` or an error kind) after `took`.
    pub fn tool_call(&self, tool: &str, outcome: &'static str, took: Duration) {
        self.tool_calls
            .get_or_create(&ToolOutcome {
                tool: tool.to_owned(),
                outcome,
            })
            .inc();
        self.tool_call_seconds
            .get_or_create(&ToolLabel {
                tool: tool.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// A call was denied, for `reason`.
    pub fn denied(&self, reason: DenialReason) {
        self.denials
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// A model request answered after `took`, with `tokens` if the provider said.
    pub fn model_answered(&self, took: Duration, tokens: Option<u32>) {
        self.model_requests
            .get_or_create(&OutcomeLabel { outcome: "ok" })
            .inc();
        self.model_request_seconds.observe(took.as_secs_f64());
        if let Some(tokens) = tokens {
            self.model_tokens.inc_by(u64::from(tokens));
        }
    }

    /// A model request failed (`failed`) or ran out of time (`timed_out`).
    pub fn model_failed(&self, outcome: &'static str) {
        self.model_requests
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// The host keeps `held` instances between calls now (set as the metrics are read).
    pub fn set_warm_instances(&self, held: usize) {
        self.warm_instances.set(held as i64);
    }

    /// `running` workers run now (set as the metrics are read).
    pub fn set_live_workers(&self, running: usize) {
        self.live_workers.set(running as i64);
    }

    /// A call began (`1`) or stopped (`-1`) waiting for a slot.
    pub fn calls_waiting(&self, change: i64) {
        self.calls_waiting.inc_by(change);
    }

    /// This host renewed its lease.
    pub fn lease_renewed(&self) {
        self.lease_renewals.inc();
    }

    /// This host took over a conversation.
    pub fn lease_taken_over(&self) {
        self.lease_takeovers.inc();
    }

    /// An outbound request ended with `decision` (`allowed`, `refused`, `failed`), allowed
    /// by `rule` (a granted rule, or [`NO_RULE`]).
    pub fn outbound_request(&self, rule: &str, decision: &'static str) {
        self.outbound_requests
            .get_or_create(&RequestLabel {
                rule: rule.to_owned(),
                decision,
            })
            .inc();
    }

    /// A message came `direction` (`in`, `out`) through channel `channel` (a name from the
    /// config) with `outcome` (`taken`, `sent`, `refused`, `ignored`, `failed`).
    pub fn chat_message(&self, channel: &str, direction: &'static str, outcome: &'static str) {
        self.chat_messages
            .get_or_create(&ChatLabel {
                channel: channel.to_owned(),
                direction,
                outcome,
            })
            .inc();
    }

    /// Every metric, as OpenMetrics text ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// This process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}
