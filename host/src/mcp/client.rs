//! [`McpClient`]: one external MCP server the host starts (or reaches at a URL), calls, and
//! restarts with backoff.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
};
use rmcp::service::{ClientInitializeError, RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt as _};
use tokio::io::AsyncReadExt as _;
use tokio::sync::Mutex;

use super::http::{EgressError, EgressHttp};
use crate::config::{McpServerSpec, McpTransport};
use crate::net::{CallNet, GrantSource, NetScope, rule_for};
use crate::plugin::{ExternalTools, PluginHost, ToolError, ToolInfo};
use capstan_caps::Capability;

/// The longest tool name, namespace included, a model's tool list accepts.
const MAX_NAMESPACED_NAME: usize = 64;
/// The longest tool description kept; it is sent with every prompt.
const MAX_DESCRIPTION_BYTES: usize = 4 * 1024;
/// The largest argument schema kept, in bytes of JSON.
const MAX_SCHEMA_BYTES: usize = 32 * 1024;
/// The longest wait before restarting a server that keeps failing to start.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The first wait after a failed start; each further failure doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// One external MCP server: a program the host starts with only the environment its
/// config lists (restarted when it exits or hangs, never more often than its backoff
/// allows), or a server at a URL reached through the host's egress (a new session when
/// one ends).
pub struct McpClient {
    spec: McpServerSpec,
    /// An HTTP server's requests go through this egress.
    http: Option<EgressHttp>,
    /// Where a relative `cwd` and the default one resolve from.
    base: PathBuf,
    /// How long starting (the handshake and the tool list) may take.
    start_timeout: Duration,
    state: Mutex<State>,
    /// Whether a start ever succeeded.
    started: AtomicBool,
}

enum State {
    Running(Arc<RunningService<RoleClient, Handler>>),
    Down {
        /// Why it is down.
        reason: String,
        /// Starts failed in a row.
        failures: u32,
        /// No start before this.
        retry_at: Instant,
    },
}

/// The host's side of the handshake: it names itself and offers nothing back.
#[derive(Clone)]
struct Handler;

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("capstan", env!("CARGO_PKG_VERSION")),
        )
    }
}

impl McpClient {
    /// A client of the server `spec` declares, not yet started. `base` is the config
    /// file's directory; `start_timeout` bounds each start. An HTTP server's requests take
    /// `host`'s network: its address checks, body caps, secrets and audit log.
    pub fn new(
        spec: McpServerSpec,
        base: &Path,
        start_timeout: Duration,
        host: &PluginHost,
    ) -> Self {
        let http = match &spec.transport {
            McpTransport::Http {
                target, secrets, ..
            } => Some(EgressHttp::new(Arc::new(server_net(
                &spec.name, target, secrets, host,
            )))),
            McpTransport::Stdio { .. } => None,
        };
        McpClient {
            spec,
            http,
            base: base.to_owned(),
            start_timeout,
            state: Mutex::new(State::Down {
                reason: "not started yet".to_owned(),
                failures: 0,
                retry_at: Instant::now(),
            }),
            started: AtomicBool::new(false),
        }
    }

    /// The server's name from the config.
    pub fn server_name(&self) -> &str {
        &self.spec.name
    }

    /// Starts the server and lists its tools, named `SERVER.tool`, each with the tool's
    /// own name. Tools whose names a model could not be given are left out, each with
    /// why (the second list).
    pub async fn list_tools(&self) -> Result<(Vec<(String, ToolInfo)>, Vec<String>), String> {
        let service = self.running().await.map_err(|e| e.message().to_owned())?;
        let listed = tokio::time::timeout(self.start_timeout, service.list_all_tools())
            .await
            .map_err(|_| {
                format!(
                    "MCP server `{}` did not list its tools within {} s",
                    self.spec.name,
                    self.start_timeout.as_secs_f64()
                )
            })?
            .map_err(|err| {
                format!(
                    "MCP server `{}` did not list its tools: {}",
                    self.spec.name,
                    service_cause(&err)
                )
            })?;
        let mut tools = Vec::new();
        let mut skipped = Vec::new();
        for tool in listed {
            match self.tool_info(&tool) {
                Ok(info) => tools.push((tool.name.to_string(), info)),
                Err(why) => skipped.push(why),
            }
        }
        Ok((tools, skipped))
    }

    /// The tool as policy and models see it, or why it cannot be offered.
    fn tool_info(&self, tool: &rmcp::model::Tool) -> Result<ToolInfo, String> {
        let name = format!("{}.{}", self.spec.name, tool.name);
        let shown = crate::text::echo_name(&name, MAX_NAMESPACED_NAME);
        if name.len() > MAX_NAMESPACED_NAME {
            return Err(format!(
                "tool `{shown}` is left out: its name is over {MAX_NAMESPACED_NAME} bytes, \
                 which models refuse"
            ));
        }
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if tool.name.is_empty() || !tool.name.chars().all(plain) {
            return Err(format!(
                "tool `{shown}` is left out: a tool name a model accepts has only letters, \
                 digits, `_` and `-`"
            ));
        }
        let schema = serde_json::Value::Object((*tool.input_schema).clone());
        if schema.to_string().len() > MAX_SCHEMA_BYTES {
            return Err(format!(
                "tool `{shown}` is left out: its input schema is over {} KiB",
                MAX_SCHEMA_BYTES >> 10
            ));
        }
        let description = tool.description.as_deref().unwrap_or_default();
        Ok(ToolInfo {
            name,
            description: crate::text::truncate(description, MAX_DESCRIPTION_BYTES).to_owned(),
            args_schema: schema,
            capabilities: Vec::new(),
        })
    }

    /// The running server, started now if it is down and its backoff has passed.
    async fn running(&self) -> Result<Arc<RunningService<RoleClient, Handler>>, ToolError> {
        let mut state = self.state.lock().await;
        if let State::Running(service) = &*state {
            if !service.is_closed() {
                return Ok(service.clone());
            }
            tracing::warn!(
                server = %self.spec.name,
                "MCP server `{}` exited; starting it again",
                self.spec.name
            );
            *state = State::Down {
                reason: "it exited".to_owned(),
                failures: 0,
                retry_at: Instant::now(),
            };
        }
        let State::Down {
            reason,
            failures,
            retry_at,
        } = &*state
        else {
            unreachable!("a running server returned above");
        };
        let now = Instant::now();
        if now < *retry_at {
            return Err(ToolError::Failed(format!(
                "MCP server `{}` is down ({reason}); the next start is in {:.1} s",
                self.spec.name,
                // Rounded up: a wait of 0.04 s is not "0.0 s".
                ((*retry_at - now).as_secs_f64() * 10.0).ceil() / 10.0
            )));
        }
        let failures = *failures;
        match self.start().await {
            Ok(service) => {
                self.started.store(true, Ordering::Relaxed);
                let service = Arc::new(service);
                *state = State::Running(service.clone());
                Ok(service)
            }
            Err(reason) => {
                let wait = backoff(failures);
                // The first start's failure is reported by whoever listed the tools.
                if self.started.load(Ordering::Relaxed) {
                    tracing::warn!(
                        server = %self.spec.name,
                        "{reason}; the next start is in {:.1} s",
                        wait.as_secs_f64()
                    );
                }
                *state = State::Down {
                    reason: reason.clone(),
                    failures: failures + 1,
                    retry_at: Instant::now() + wait,
                };
                Err(ToolError::Failed(reason))
            }
        }
    }

    /// Starts the server (or opens a session with it) and completes the handshake.
    async fn start(&self) -> Result<RunningService<RoleClient, Handler>, String> {
        let name = &self.spec.name;
        let handshake = match (&self.spec.transport, &self.http) {
            (McpTransport::Http { url, .. }, Some(http)) => {
                let config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
                let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
                tokio::time::timeout(self.start_timeout, Handler.serve(transport)).await
            }
            (McpTransport::Stdio { .. }, _) => {
                let transport = self.spawn()?;
                tokio::time::timeout(self.start_timeout, Handler.serve(transport)).await
            }
            (McpTransport::Http { .. }, None) => unreachable!("an HTTP server has its egress"),
        };
        match handshake {
            Ok(Ok(service)) => Ok(service),
            Ok(Err(err)) => Err(format!(
                "MCP server [mcp.{name}] failed its handshake: {}; {}",
                crate::text::one_line(&init_cause(&err)),
                match self.spec.transport {
                    McpTransport::Stdio { .. } =>
                        format!("run mcp.{name}.command by hand to see why"),
                    McpTransport::Http { .. } => format!("check mcp.{name}.url"),
                }
            )),
            Err(_) => Err(format!(
                "MCP server [mcp.{name}] did not complete its handshake within {} s",
                self.start_timeout.as_secs_f64()
            )),
        }
    }

    /// Starts the program of a stdio server with the config's environment only.
    fn spawn(&self) -> Result<TokioChildProcess, String> {
        let name = &self.spec.name;
        let McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } = &self.spec.transport
        else {
            unreachable!("only a stdio server is spawned");
        };
        let program = find_program(command).ok_or_else(|| {
            format!(
                "MCP server [mcp.{name}]: no program `{command}` (as a path, or in PATH); \
                 fix mcp.{name}.command"
            )
        })?;
        let mut process = tokio::process::Command::new(&program);
        process
            .args(args)
            .env_clear()
            .envs(env)
            .current_dir(cwd.as_deref().unwrap_or(&self.base))
            .kill_on_drop(true);
        let (transport, stderr) = TokioChildProcess::builder(process)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| {
                format!(
                    "MCP server [mcp.{name}]: cannot start {}: {err}; check mcp.{name}.command",
                    program.display()
                )
            })?;
        if let Some(stderr) = stderr {
            tokio::spawn(forward_stderr(name.clone(), stderr));
        }
        Ok(transport)
    }

    /// Stops the running server, so the next call starts a fresh one.
    async fn restart_later(&self, reason: String) {
        let mut state = self.state.lock().await;
        *state = State::Down {
            reason,
            failures: 0,
            retry_at: Instant::now(),
        };
    }
}

#[async_trait]
impl ExternalTools for McpClient {
    fn name(&self) -> &str {
        &self.spec.name
    }

    async fn ready(&self) -> Result<(), ToolError> {
        self.running().await.map(drop)
    }

    async fn call(&self, tool: &str, args_json: &str) -> Result<String, ToolError> {
        let arguments: serde_json::Map<String, serde_json::Value> = serde_json::from_str(args_json)
            .map_err(|err| ToolError::InvalidArgs(format!("arguments: {err}")))?;
        let service = self.running().await?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        match service.call_tool(params).await {
            Ok(result) => outcome(result),
            Err(ServiceError::McpError(err)) => Err(ToolError::Failed(format!(
                "MCP server `{}` refused the call: {}",
                self.spec.name, err.message
            ))),
            Err(err) => {
                let cause = service_cause(&err);
                self.restart_later(format!("it stopped during a call ({cause})"))
                    .await;
                let again = if self.http.is_some() {
                    "the next call opens a new session"
                } else {
                    "the next call starts it again"
                };
                Err(ToolError::Failed(format!(
                    "MCP server `{}` stopped during the call ({cause}); {again}",
                    self.spec.name
                )))
            }
        }
    }

    fn abandoned(&self, _tool: &str) {
        // A program that kept a call past the deadline may be stuck on it: the next call
        // gets a fresh one (dropping the service kills the process). A server at a URL
        // serves each call on its own request, and rmcp tells it the call was cancelled.
        if self.http.is_some() {
            return;
        }
        if let Ok(mut state) = self.state.try_lock() {
            *state = State::Down {
                reason: "a call ran past the deadline".to_owned(),
                failures: 0,
                retry_at: Instant::now(),
            };
        }
    }
}

/// The network of an HTTP server's requests: the process `mcp:NAME`, its URL the one
/// rule, the config's secrets for it, and `[net]`'s body caps and connect timeout (or
/// `[net.tool.NAME]`'s). The tool deadline bounds its calls, so the time to an answer
/// and for the whole of it are at least that deadline, and rmcp bounds the requests in
/// flight, so no rate or in-flight limit of `[net]` applies.
fn server_net(
    name: &str,
    target: &capstan_caps::NetTarget,
    secrets: &[String],
    host: &PluginHost,
) -> CallNet {
    let rule = rule_for(target);
    let declared = vec![Capability::Net(rule.clone())];
    let scope = NetScope::new(
        name,
        &declared,
        &declared,
        [&rule],
        GrantSource::McpServer {
            name: name.to_owned(),
        },
    )
    .expect("a server's URL is a net rule");
    let network = host.network_handle();
    let deadline = host.limits().deadline;
    let mut limits = network.settings().for_tool(name).clone();
    limits.first_byte_timeout = limits.first_byte_timeout.max(deadline);
    limits.request_timeout = limits.request_timeout.max(deadline);
    limits.max_concurrent_requests = u32::MAX;
    limits.requests_per_minute = u32::MAX;
    CallNet::with_limits(
        network,
        format!("mcp:{name}"),
        scope,
        secrets.to_vec(),
        limits,
        host.services().map(|services| services.audit.clone()),
    )
}

/// A tool's result as the model reads it: its text, or an error with the server's text.
fn outcome(result: CallToolResult) -> Result<String, ToolError> {
    let mut text = String::new();
    for block in &result.content {
        if !text.is_empty() {
            text.push('\n');
        }
        match block.as_text() {
            Some(part) => text.push_str(&part.text),
            None => text.push_str(&serde_json::to_string(block).unwrap_or_default()),
        }
    }
    if text.is_empty()
        && let Some(structured) = &result.structured_content
    {
        text = structured.to_string();
    }
    if result.is_error == Some(true) {
        Err(ToolError::Failed(text))
    } else {
        Ok(text)
    }
}

/// What went wrong in a transport, as a person reads it: the egress's own words for an
/// HTTP server, the innermost cause otherwise, never rmcp's transport type names.
fn transport_cause(err: &(dyn std::error::Error + 'static)) -> String {
    if let Some(http) = err.downcast_ref::<StreamableHttpError<EgressError>>() {
        return match http {
            StreamableHttpError::Client(egress) => egress.to_string(),
            other => other.to_string(),
        };
    }
    match err.source() {
        Some(inner) => transport_cause(inner),
        None => err.to_string(),
    }
}

/// Why a request to a server failed.
fn service_cause(err: &ServiceError) -> String {
    match err {
        ServiceError::TransportSend(sent) => transport_cause(sent.error.as_ref()),
        other => other.to_string(),
    }
}

/// Why a handshake failed.
fn init_cause(err: &ClientInitializeError) -> String {
    match err {
        ClientInitializeError::TransportError { error, .. } => {
            transport_cause(error.error.as_ref())
        }
        other => other.to_string(),
    }
}

/// The wait after `failures` failed starts in a row.
fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << failures.min(16))
        .min(MAX_BACKOFF)
}

/// `command` as a path, or found in the host's `PATH` (the server's own environment has
/// no `PATH` unless the config lists one).
fn find_program(command: &str) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(PathBuf::from(command));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|candidate| candidate.is_file())
}

/// Logs what the server writes on standard error, a bounded chunk at a time.
async fn forward_stderr(server: String, mut stderr: tokio::process::ChildStderr) {
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        tracing::info!(target: "capstan::mcp", server = %server, "{}", text.trim_end());
    }
}
