//! [`ToolServer`]: one profile's tools as an MCP server.

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};

use super::fit::{DEFAULT_MESSAGE_BYTES, fit_message};
use crate::agent::HOST_TOOLS;
use crate::plugin::{CallRequest, Registry, ToolError};
use crate::policy::{Decision, Policy, ProcessKind, ToolNeeds};

/// The plugin tools `policy` offers to processes of one kind, served over MCP with that
/// kind's grants, in `workspace`.
///
/// Host tools (delegation, tasks as the runtime keeps them) need a running agent and are
/// not served.
///
/// ```no_run
/// # async fn serve(registry: std::sync::Arc<capstan_host::plugin::Registry>) -> anyhow::Result<()> {
/// use capstan_host::config::Config;
/// use capstan_host::mcp::ToolServer;
/// use capstan_host::policy::ProcessKind;
/// use rmcp::ServiceExt;
///
/// let config = Config::defaults(std::path::Path::new("."));
/// let server = ToolServer::new(registry, config.policy, ProcessKind::Worker, ".".into());
/// server.serve(rmcp::transport::stdio()).await?.waiting().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ToolServer {
    registry: Arc<Registry>,
    policy: Arc<Policy>,
    kind: ProcessKind,
    workspace: Arc<PathBuf>,
    /// The largest message a result is sent in ([`fit_message`]).
    max_message: usize,
}

impl ToolServer {
    /// Serves the tools `policy` offers to `kind`, run in `workspace`.
    pub fn new(
        registry: Arc<Registry>,
        policy: Policy,
        kind: ProcessKind,
        workspace: PathBuf,
    ) -> Self {
        ToolServer {
            registry,
            policy: Arc::new(policy),
            kind,
            workspace: Arc::new(workspace),
            max_message: DEFAULT_MESSAGE_BYTES,
        }
    }

    /// Sends each result in a message of at most `bytes` (`limits.mcp_message_kib`),
    /// cutting a longer one to fit; [`DEFAULT_MESSAGE_BYTES`] without it.
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// The tools served: every plugin tool the policy offers to the kind, in load order.
    pub fn tools(&self) -> Vec<Tool> {
        self.registry
            .tools()
            .filter(|tool| !HOST_TOOLS.iter().any(|host| host.name == tool.name))
            .filter(|tool| {
                let needs = ToolNeeds {
                    name: &tool.name,
                    capabilities: &tool.capabilities,
                };
                self.policy.decide(self.kind, &tool.name, Some(needs)) == Decision::Offered
            })
            .map(|tool| {
                let schema = match &tool.args_schema {
                    serde_json::Value::Object(object) => object.clone(),
                    _ => serde_json::Map::new(),
                };
                Tool::new(tool.name.clone(), tool.description.clone(), schema)
            })
            .collect()
    }

    /// Runs one call from `client`, stopped if `cancelled` completes first.
    async fn call(
        &self,
        caller: &str,
        params: &CallToolRequestParams,
        cancelled: impl Future<Output = ()>,
    ) -> Result<String, ToolError> {
        let args_json = match &params.arguments {
            Some(arguments) => serde_json::Value::Object(arguments.clone()).to_string(),
            None => "{}".to_owned(),
        };
        let grants = self.policy.profile(self.kind).grants_for(&params.name);
        let request = CallRequest {
            tool: &params.name,
            args_json: &args_json,
            grants: &grants,
            workspace: Some(&self.workspace),
            caller,
            instances: None,
        };
        self.registry
            .call_as_until(&self.policy, self.kind, request, cancelled)
            .await
    }
}

/// Who an MCP request over HTTP comes from, as the service that authenticated it names
/// them (a bearer token's name): put in the HTTP request's extensions, it is added to the
/// caller of every call the request makes (`mcp:CLIENT@PRINCIPAL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal(pub String);

/// The caller an audit row names: `mcp:CLIENT`, with `@PRINCIPAL` when the transport
/// authenticated one.
fn caller(context: &RequestContext<RoleServer>) -> String {
    let client = client_name(context);
    let principal = context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>());
    match principal {
        Some(Principal(name)) => format!("mcp:{client}@{name}"),
        None => format!("mcp:{client}"),
    }
}

/// The client's name as its handshake gave it, cut to what an audit row should hold:
/// letters, digits, `.`, `-` and `_`, at most 48 of them.
fn client_name(context: &RequestContext<RoleServer>) -> String {
    let name: String = context
        .peer
        .peer_info()
        .map(|info| info.client_info.name.clone())
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
        let result = self.call(&caller, &params, context.ct.cancelled()).await;
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
