//! The spans the host makes, named and attributed as the OpenTelemetry GenAI, MCP and HTTP
//! semantic conventions say at the version `semconv.rs` pins (1.41.0): one function
//! per kind of span, so the conventions live here.
//!
//! What the host adds of its own is under `capstan.`: a tool call's receipt, an outbound
//! request's decision.

use std::borrow::Cow;
use std::time::SystemTime;

use super::semconv as sc;

use super::traces::{Span, SpanKind, TraceParent};
use crate::ids::{ProcessId, ProcessKind};

/// A tool call's receipt figure, as a span attribute: `capstan.receipt.<name>`.
pub const RECEIPT: &str = "capstan.receipt.";

/// `invoke_agent {kind}`: one turn of `process`, working for `conversation`, under
/// `parent` (the message, spawn or report that started it).
pub fn turn(parent: &TraceParent, process: &ProcessId, conversation: Option<&str>) -> Span {
    let name = || {
        [match process.kind() {
            ProcessKind::Channel => "invoke_agent channel",
            ProcessKind::Branch => "invoke_agent branch",
            ProcessKind::Worker => "invoke_agent worker",
            ProcessKind::Compactor => "invoke_agent compactor",
            ProcessKind::Cortex => "invoke_agent cortex",
        }]
    };
    Span::start(SpanKind::Internal, parent, name, |attributes| {
        attributes.text(sc::GEN_AI_OPERATION_NAME, "invoke_agent");
        attributes.text(sc::GEN_AI_AGENT_NAME, process.kind().as_str());
        attributes.text(sc::GEN_AI_AGENT_ID, &process.to_string());
        if let Some(conversation) = conversation {
            attributes.text(sc::GEN_AI_CONVERSATION_ID, conversation);
        }
    })
}

/// What every `chat` span of one provider says, worked out once, as the provider's name
/// does not change.
#[derive(Debug, Default)]
pub struct ChatSpans(std::sync::OnceLock<ChatNames>);

/// A provider's `chat` span name and the parts of its provider name.
#[derive(Debug)]
struct ChatNames {
    name: String,
    system: String,
    model: String,
}

impl ChatSpans {
    /// `chat {model}`: one request to the model `provider` names (`openai:gpt-4o-mini`,
    /// `scripted:demo`; asked once), under the current span.
    pub fn start(&self, provider: impl FnOnce() -> String) -> Span {
        // Asked at most once, by whichever of the span's name and attributes comes first.
        let provider = std::cell::Cell::new(Some(provider));
        let names = || {
            self.0.get_or_init(|| {
                let provider = provider
                    .take()
                    .map(|provider| provider())
                    .unwrap_or_default();
                let (system, model) = provider.split_once(':').unwrap_or((&provider, ""));
                ChatNames {
                    name: format!("chat {model}"),
                    system: system.to_owned(),
                    model: model.to_owned(),
                }
            })
        };
        Span::start(
            SpanKind::Client,
            &TraceParent::current(),
            || [names().name.as_str()],
            |attributes| {
                let names = names();
                attributes.text(sc::GEN_AI_OPERATION_NAME, "chat");
                attributes.text(sc::GEN_AI_PROVIDER_NAME, &names.system);
                attributes.text(sc::GEN_AI_REQUEST_MODEL, &names.model);
            },
        )
    }
}

/// The tokens a model request used, where the provider reported them.
pub fn chat_usage(span: &mut Span, input: Option<u32>, output: Option<u32>) {
    span.set(|attributes| {
        if let Some(n) = input {
            attributes.int(sc::GEN_AI_USAGE_INPUT_TOKENS, i64::from(n));
        }
        if let Some(n) = output {
            attributes.int(sc::GEN_AI_USAGE_OUTPUT_TOKENS, i64::from(n));
        }
    });
}

/// Where a tool runs, for `gen_ai.tool.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSite {
    /// A plugin in its sandbox, or a tool of an MCP server.
    Extension,
    /// A tool of the host itself (spawn a worker, reply, ...).
    Host,
}

/// `execute_tool {name}`: one call of tool `name` (`id`: the model's id for the call),
/// under the current span.
pub fn tool(name: &str, id: Option<&str>, site: ToolSite) -> Span {
    Span::start(
        SpanKind::Internal,
        &TraceParent::current(),
        || ["execute_tool ", name],
        |attributes| {
            attributes.text(sc::GEN_AI_OPERATION_NAME, "execute_tool");
            attributes.text(sc::GEN_AI_TOOL_NAME, name);
            attributes.text(
                sc::GEN_AI_TOOL_TYPE,
                match site {
                    ToolSite::Extension => "extension",
                    ToolSite::Host => "function",
                },
            );
            if let Some(id) = id {
                attributes.text(sc::GEN_AI_TOOL_CALL_ID, id);
            }
        },
    )
}

/// The most bytes of a tool call's arguments or result a span carries: a span is for
/// finding a call, the audit row and the history for reading it whole.
pub const MAX_CONTENT_BYTES: usize = 4096;

/// The arguments and result of a tool call, already redacted, each cut to
/// [`MAX_CONTENT_BYTES`]: only with content on.
pub fn tool_content(
    span: &mut Span,
    arguments: impl FnOnce() -> String,
    result: impl FnOnce() -> String,
) {
    if super::traces::content_on() && span.is_recorded() {
        let clip = |text: String| {
            if text.len() <= MAX_CONTENT_BYTES {
                return text;
            }
            format!("{}…", crate::text::truncate(&text, MAX_CONTENT_BYTES))
        };
        let (arguments, result) = (clip(arguments()), clip(result()));
        span.set(|attributes| {
            attributes.text(sc::GEN_AI_TOOL_CALL_ARGUMENTS, &arguments);
            attributes.text(sc::GEN_AI_TOOL_CALL_RESULT, &result);
        });
    }
}

/// A tool call's outcome (`ok`, or the error's kind) and its receipt's figures, each as
/// `capstan.receipt.<name>`; a figure of zero is left out, as it would be summed as one.
pub fn tool_ended(span: &mut Span, outcome: &str, figures: &[(&'static str, Option<u64>)]) {
    span.set(|attributes| {
        for &(name, value) in figures {
            if let Some(value) = value.filter(|v| *v != 0) {
                let value = i64::try_from(value).unwrap_or(i64::MAX);
                attributes.int(&receipt_key(name), value);
            }
        }
    });
    if outcome != "ok" {
        span.fail(outcome);
    }
}

/// `capstan.receipt.<name>` for a receipt's figure `name`: spelled out here for the
/// receipt's figures, so that a span per call allocates no key.
pub fn receipt_key(name: &str) -> Cow<'static, str> {
    Cow::Borrowed(match name {
        "peak_memory_bytes" => "capstan.receipt.peak_memory_bytes",
        "bytes_in" => "capstan.receipt.bytes_in",
        "bytes_out" => "capstan.receipt.bytes_out",
        "requests" => "capstan.receipt.requests",
        "requests_refused" => "capstan.receipt.requests_refused",
        "request_bytes_sent" => "capstan.receipt.request_bytes_sent",
        "request_bytes_received" => "capstan.receipt.request_bytes_received",
        "fuel" => "capstan.receipt.fuel",
        other => return Cow::Owned(format!("{RECEIPT}{other}")),
    })
}

/// One outbound request that a tool made (or tried), whole, once it ended: `{method}`,
/// from `began` to now, under `parent` (the call that made it).
pub struct OutboundRequest<'a> {
    /// The call it was part of.
    pub parent: &'a TraceParent,
    /// When it began.
    pub began: SystemTime,
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The host it was for (redacted: a guest chooses it).
    pub host: &'a str,
    /// The port.
    pub port: u16,
    /// The response's status, if one came.
    pub status: Option<u16>,
    /// `allowed`, `refused` or `failed`.
    pub decision: &'a str,
}

/// Exports `request` as an HTTP client span.
pub fn outbound(request: OutboundRequest<'_>) {
    let mut span = Span::start_at(
        SpanKind::Client,
        request.parent,
        Some(request.began),
        || [request.method],
        |attributes| {
            attributes.text(sc::HTTP_REQUEST_METHOD, request.method);
            attributes.text(sc::SERVER_ADDRESS, request.host);
            attributes.int(sc::SERVER_PORT, i64::from(request.port));
            attributes.text("capstan.net.decision", request.decision);
            if let Some(status) = request.status {
                attributes.int(sc::HTTP_RESPONSE_STATUS_CODE, i64::from(status));
            }
        },
    );
    match (request.decision, request.status) {
        ("allowed", Some(status)) if status >= 400 => span.fail(&status.to_string()),
        ("allowed", _) => {}
        (other, _) => span.fail(other),
    }
    span.end_at(SystemTime::now());
}

/// `tools/call {tool}`: a call the host sends to MCP server `server` over `transport`
/// (`pipe` for a child's standard streams, `tcp` for a URL), under the current span.
pub fn mcp_call(tool: &str, server: &str, transport: &str) -> Span {
    Span::start(
        SpanKind::Client,
        &TraceParent::current(),
        || ["tools/call ", tool],
        |attributes| {
            attributes.text(sc::MCP_METHOD_NAME, "tools/call");
            attributes.text(sc::GEN_AI_OPERATION_NAME, "execute_tool");
            attributes.text(sc::GEN_AI_TOOL_NAME, tool);
            attributes.text(sc::SERVER_ADDRESS, server);
            attributes.text(sc::NETWORK_TRANSPORT, transport);
        },
    )
}

/// `tools/call {tool}`: a client's call of `tool` that the host serves over MCP, under
/// the client's `traceparent`.
pub fn mcp_served(parent: &TraceParent, tool: &str) -> Span {
    Span::start(
        SpanKind::Server,
        parent,
        || ["tools/call ", tool],
        |attributes| {
            attributes.text(sc::MCP_METHOD_NAME, "tools/call");
            attributes.text(sc::GEN_AI_OPERATION_NAME, "execute_tool");
            attributes.text(sc::GEN_AI_TOOL_NAME, tool);
        },
    )
}
