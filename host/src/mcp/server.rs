//! [`ToolServer`]: one profile's tools as an MCP server.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

use super::fit::{DEFAULT_MESSAGE_BYTES, fit_message};
use crate::ids::{Caller, ProcessKind};
use crate::plugin::ToolError;
use crate::telemetry::{TraceParent, spans};
use crate::tools::{ToolOrigin, ToolRouter};

/// The plugin and MCP tools the catalog offers to processes of one kind, served over MCP
/// with that kind's grants, in the router's workspace.
///
/// Host tools (delegation, tasks as the runtime keeps them) need a running agent and are
/// not served.
///
/// ```no_run
/// # async fn serve(registry: std::sync::Arc<capstan_host::plugin::Registry>) -> anyhow::Result<()> {
/// use std::sync::Arc;
/// use capstan_host::config::Config;
/// use capstan_host::mcp::ToolServer;
/// use capstan_host::policy::ProcessKind;
/// use capstan_host::tools::{ToolCatalog, ToolRouter};
/// use rmcp::ServiceExt;
///
/// let config = Config::defaults(std::path::Path::new("."));
/// let catalog = Arc::new(ToolCatalog::new(&registry, &config.policy));
/// let router = Arc::new(ToolRouter::new(registry, catalog, ".".into()));
/// let server = ToolServer::new(router, ProcessKind::Worker);
/// server.serve(rmcp::transport::stdio()).await?.waiting().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ToolServer {
    router: Arc<ToolRouter>,
    kind: ProcessKind,
    /// The largest message a result is sent in ([`fit_message`]).
    max_message: usize,
}

impl ToolServer {
    /// Serves the tools `router`'s catalog offers to `kind`.
    pub fn new(router: Arc<ToolRouter>, kind: ProcessKind) -> Self {
        ToolServer {
            router,
            kind,
            max_message: DEFAULT_MESSAGE_BYTES,
        }
    }

    /// Sends each result in a message of at most `bytes` (`limits.mcp_message_kib`),
    /// cutting a longer one to fit; [`DEFAULT_MESSAGE_BYTES`] without it.
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// The tools served: every plugin and MCP tool the catalog offers to the kind, in
    /// load order. Host tools act on a running agent's processes and are not served.
    pub fn tools(&self) -> Vec<Tool> {
        let catalog = self.router.catalog();
        catalog
            .tools()
            .iter()
            .filter(|tool| !matches!(tool.origin, ToolOrigin::Host(_)))
            .filter(|tool| catalog.is_offered(self.kind, tool.name()))
            .map(|tool| {
                let schema = match &tool.def.parameters {
                    serde_json::Value::Object(object) => object.clone(),
                    _ => serde_json::Map::new(),
                };
                Tool::new(tool.def.name.clone(), tool.def.description.clone(), schema)
            })
            .collect()
    }

    /// Runs one call from `client`, stopped if `cancelled` completes first.
    async fn call(
        &self,
        caller: &Caller,
        params: &CallToolRequestParams,
        cancelled: impl Future<Output = ()>,
    ) -> Result<String, ToolError> {
        let args_json = match &params.arguments {
            Some(arguments) => serde_json::Value::Object(arguments.clone()).to_string(),
            None => "{}".to_owned(),
        };
        let ran = self
            .router
            .run(self.kind, caller, None, &params.name, &args_json, cancelled);
        ran.await.committed().await
    }
}

/// Who an MCP request over HTTP comes from, as the service that authenticated it names
/// them (a bearer token's name): put in the HTTP request's extensions, it is added to the
/// caller of every call the request makes (`mcp:CLIENT@PRINCIPAL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// The caller an audit row names: `mcp:CLIENT`, with `@PRINCIPAL` when the transport
/// authenticated one.
fn caller(context: &RequestContext<RoleServer>) -> Caller {
    let client = client_name(context);
    let principal = context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>());
    match principal {
        Some(Principal(name)) => Caller::client("mcp", Some(&format!("{client}@{name}"))),
        None => Caller::client("mcp", Some(&client)),
    }
}

/// The client's span: the request's `_meta.traceparent` (as MCP's trace context says),
/// else the HTTP request's `traceparent` header; none while traces are off.
fn trace_parent(context: &RequestContext<RoleServer>) -> TraceParent {
    if !crate::telemetry::traces_on() {
        return TraceParent::none();
    }
    let header = || {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("traceparent"))
            .and_then(|value| value.to_str().ok())
    };
    context
        .meta
        .get_traceparent()
        .or_else(header)
        .map(TraceParent::from_header)
        .unwrap_or_default()
}

/// The client's name as the request or its session's handshake gave it, cut to what an
/// audit row should hold: letters, digits, `.`, `-` and `_`, at most 48 of them.
fn client_name(context: &RequestContext<RoleServer>) -> String {
    // A request of the stateless revision names its client itself; an older session named
    // it once, in its handshake.
    let name: String = context
        .client_info()
        .map(|info| info.name)
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(48)
        .collect();
    if name.is_empty() {
        "client".to_owned()
    } else {
        name
    }
}

impl ServerHandler for ToolServer {
    fn get_info(&self) -> ServerConfig {
        let mut config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        config.server_info = Implementation::new("capstan", env!("CARGO_PKG_VERSION"));
        config.instructions = Some(format!(
            "Capstan's sandboxed tools, as a {} process is offered them: each call runs in a \
             fresh WebAssembly sandbox with that profile's grants, and is audited.",
            self.kind
        ));
        config
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools().into_iter().find(|tool| tool.name == name)
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // This server never asks for input (2026-07-28's `input_required`), so a retry
        // carrying answers or a state it never issued is refused, not run as a fresh call.
        if params.input_responses.is_some() || params.request_state.is_some() {
            return Err(McpError::invalid_params(
                "this server asked for no input: a tools/call carrying inputResponses or \
                 requestState answers nothing it sent; call the tool again without them",
                None,
            ));
        }
        let caller = caller(&context);
        let progress = context.meta.get_progress_token();
        if let Some(token) = &progress {
            let started = ProgressNotificationParam::new(token.clone(), 0.0)
                .with_total(1.0)
                .with_message(format!(
                    "running `{}` in a sandbox",
                    crate::text::echo_name(&params.name, 64)
                ));
            let _ = context.peer.notify_progress(started).await;
        }
        let mut span = spans::mcp_served(&trace_parent(&context), &params.name);
        let result = span
            .parent()
            .scope(self.call(&caller, &params, context.ct.cancelled()))
            .await;
        if let Err(err) = &result {
            span.fail(err.kind());
        }
        drop(span);
        if let Some(token) = progress {
            let done = ProgressNotificationParam::new(token, 1.0).with_total(1.0);
            let _ = context.peer.notify_progress(done).await;
        }
        // The id is the client's to choose, of any length: the message carries it too.
        let id_bytes = serde_json::to_string(&context.id).map_or(0, |id| id.len());
        let fit = |text: String| {
            vec![ContentBlock::text(fit_message(
                text,
                self.max_message,
                id_bytes,
            ))]
        };
        Ok(match result {
            Ok(text) => CallToolResult::success(fit(text)),
            Err(err) => {
                CallToolResult::error(fit(format!("error[{}]: {}", err.kind(), err.message())))
            }
        }
        .into())
    }
}
