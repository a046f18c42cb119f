//! [`McpClient`]: one external MCP server the host starts (or reaches at a URL), calls, and
//! restarts with backoff.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rmcp::ClientHandler;
use rmcp::model::ProtocolVersion;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, Implementation,
    PaginatedRequestParams,
};
use rmcp::service::{ClientInitializeError, RoleClient, RunningService, ServiceError};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt as _};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use tokio::sync::Mutex;

use super::ended::EndedBy;
use super::http::{EgressError, EgressHttp, server_net};
use super::remote_tool::{
    MAX_LIST_PAGES, MAX_TOOLS_PER_SERVER, asked_for_input, outcome, tool_info,
};
use super::stdio::{Launch, StderrTail, spawn};
use crate::config::{McpServerSpec, McpTransport};
use crate::plugin::{ExternalTools, PluginHost, ToolError, ToolInfo};
use crate::telemetry::spans;

/// The longest wait before restarting a server that keeps failing to start.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// The first wait after a failed start; each further failure doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Why a server that was never started is down.
const NOT_STARTED: &str = "not started yet";

/// One external MCP server: a program the host starts with only the environment its
/// config lists (in a process group of its own, restarted when it exits or hangs, never
/// more often than its backoff allows), or a server at a URL reached through the host's
/// egress (a new session when one ends).
///
/// A start runs on its own task: a call that stops waiting for it at its deadline leaves
/// it going, for the next call.
pub struct McpClient {
    inner: Arc<Inner>,
}

struct Inner {
    spec: McpServerSpec,
    /// An HTTP server's requests go through this egress.
    http: Option<EgressHttp>,
    /// A stdio server's secrets, as its variables.
    secret_env: Vec<(String, String)>,
    /// Where a relative `cwd` and the default one resolve from.
    base: PathBuf,
    /// How long starting (the handshake and the tool list) may take.
    start_timeout: Duration,
    /// The most of one answer read from a stdio server, and the key that sets it.
    max_message: usize,
    limit_key: String,
    state: Mutex<State>,
}

type Service = Arc<RunningService<RoleClient, Handler>>;

/// One start of the server (a program, or a session at a URL), and why the host ended its
/// transport if it did: each start has its own, so a reason is never reported for another.
#[derive(Clone)]
struct Session {
    service: Service,
    ended: EndedBy,
}

enum State {
    Running(Session),
    Down {
        /// Why it is down.
        reason: String,
        /// Starts failed in a row.
        failures: u32,
        /// No start before this.
        retry_at: Instant,
    },
}

/// How a start finds the server's revision, as the 2026-07-28 specification says a client
/// of both eras does: `server/discover` first, and a server that answers it as a server of
/// an earlier revision would (an error, such as method not found) gets the `initialize`
/// handshake instead.
fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    }
}

/// Why a start failed.
enum Restart {
    /// The server answered the revision probe with something neither era answers: worth
    /// one more start with the `initialize` handshake alone.
    Handshake(String),
    /// Anything else, said for the person reading it.
    Failed(String),
}

impl Restart {
    fn into_reason(self) -> String {
        match self {
            Restart::Handshake(reason) | Restart::Failed(reason) => reason,
        }
    }
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
    /// `host`'s network: its address checks, body caps, secrets and audit log; a stdio
    /// server gets the values of the secrets it names from `host` as variables.
    pub fn new(
        spec: McpServerSpec,
        base: &Path,
        start_timeout: Duration,
        host: &PluginHost,
    ) -> Self {
        let (http, secret_env) = match &spec.transport {
            McpTransport::Http {
                target, secrets, ..
            } => (
                Some(EgressHttp::new(Arc::new(server_net(
                    &spec.name, target, secrets, host,
                )))),
                Vec::new(),
            ),
            McpTransport::Stdio { secrets, .. } => (
                None,
                secrets
                    .iter()
                    .filter_map(|name| {
                        let secret = host.network().secrets().get(name)?;
                        Some((name.clone(), secret.value().to_owned()))
                    })
                    .collect(),
            ),
        };
        // A stdio server's messages are bounded as an HTTP server's answers are: by the
        // response cap of `[net]` (or `[net.tool.NAME]`).
        let settings = host.network().settings();
        let max_message = settings.for_tool(&spec.name).max_response_body_bytes as usize;
        let limit_key = settings.key_of(&spec.name, "max_response_body_kib");
        McpClient {
            inner: Arc::new(Inner {
                spec,
                http,
                secret_env,
                base: base.to_owned(),
                start_timeout,
                max_message,
                limit_key,
                state: Mutex::new(State::Down {
                    reason: NOT_STARTED.to_owned(),
                    failures: 0,
                    retry_at: Instant::now(),
                }),
            }),
        }
    }

    /// Starts the server and lists its tools, named `SERVER.tool`, each with the tool's
    /// own name. The tools a plugin could not offer are left out, each with why (the
    /// second list), as are those past `MAX_TOOLS_PER_SERVER`; at most
    /// `MAX_LIST_PAGES` pages of the list are read.
    pub async fn list_tools(&self) -> Result<(Vec<(String, ToolInfo)>, Vec<String>), String> {
        let inner = &self.inner;
        let name = &inner.spec.name;
        let Session { service, ended } = inner
            .clone()
            .ready()
            .await
            .map_err(|e| e.message().to_owned())?;
        let listing = async {
            let mut listed = Vec::new();
            let mut cursor = None;
            for _ in 0..MAX_LIST_PAGES {
                let page = service
                    .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
                    .await?;
                listed.extend(page.tools);
                cursor = page.next_cursor;
                if cursor.is_none() || listed.len() > MAX_TOOLS_PER_SERVER {
                    break;
                }
            }
            Ok::<_, ServiceError>((listed, cursor.is_some()))
        };
        let (listed, more) = tokio::time::timeout(inner.start_timeout, listing)
            .await
            .map_err(|_| {
                format!(
                    "MCP server `{name}` did not list its tools within {} s",
                    inner.start_timeout.as_secs_f64()
                )
            })?
            .map_err(|err| {
                format!(
                    "MCP server `{name}` did not list its tools: {}",
                    ended.reason().unwrap_or_else(|| service_cause(&err))
                )
            })?;
        let mut tools = Vec::new();
        let mut skipped = Vec::new();
        for tool in listed {
            if tools.len() == MAX_TOOLS_PER_SERVER {
                skipped.push(format!(
                    "MCP server `{name}` offers more than {MAX_TOOLS_PER_SERVER} tools; the \
                     first {MAX_TOOLS_PER_SERVER} are offered, the rest left out"
                ));
                break;
            }
            if tools.iter().any(|(remote, _)| *remote == tool.name) {
                skipped.push(format!(
                    "MCP server `{name}` lists tool `{}` twice; the first is offered",
                    crate::text::echo_name(&tool.name, 64)
                ));
                continue;
            }
            match tool_info(name, &tool, &self.inner.spec.effects) {
                Ok(info) => tools.push((tool.name.to_string(), info)),
                Err(why) => skipped.push(why),
            }
        }
        if more && tools.len() < MAX_TOOLS_PER_SERVER {
            skipped.push(format!(
                "MCP server `{name}` lists its tools in more than {MAX_LIST_PAGES} pages; \
                 the rest are left out"
            ));
        }
        Ok((tools, skipped))
    }
}

impl Inner {
    /// The running server: started now on a task of its own if it is down and its
    /// backoff has passed, so that a caller that stops waiting does not stop the start.
    async fn ready(self: Arc<Self>) -> Result<Session, ToolError> {
        match tokio::spawn(self.clone().running()).await {
            Ok(result) => result,
            Err(err) => Err(ToolError::Failed(format!(
                "MCP server `{}` could not be started: {err}",
                self.spec.name
            ))),
        }
    }

    async fn running(self: Arc<Self>) -> Result<Session, ToolError> {
        let mut state = self.state.lock().await;
        if let State::Running(session) = &*state {
            if !session.service.is_closed() {
                return Ok(session.clone());
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
        let was_running = reason != NOT_STARTED;
        match self.start().await {
            Ok(session) => {
                *state = State::Running(session.clone());
                Ok(session)
            }
            Err(reason) => {
                let wait = backoff(failures);
                // The first start's failure is reported by whoever listed the tools.
                if was_running {
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

    /// Starts the server (or opens a session with it) and completes the handshake: the
    /// discovery of its revision first. A server that answers `server/discover` with
    /// something neither era answers (an empty result, say), that offers no revision the
    /// host speaks by discovery, or that answers it only after rmcp's 10 s probe gave up
    /// (a slow first start of `npx` or `uv run`), is started again and greeted with
    /// `initialize` alone, as the servers of earlier revisions expect.
    async fn start(&self) -> Result<Session, String> {
        match self.start_with(lifecycle()).await {
            Err(Restart::Handshake(reason)) => {
                tracing::debug!(
                    server = %self.spec.name,
                    "`server/discover` got an answer of neither revision ({reason}); starting \
                     it again with the initialize handshake"
                );
                self.start_with(ClientLifecycleMode::Initialize)
                    .await
                    .map_err(Restart::into_reason)
            }
            other => other.map_err(Restart::into_reason),
        }
    }

    /// One start, in `lifecycle`.
    async fn start_with(&self, lifecycle: ClientLifecycleMode) -> Result<Session, Restart> {
        let name = &self.spec.name;
        let ended = EndedBy::default();
        let (handshake, stderr) = match (&self.spec.transport, &self.http) {
            (McpTransport::Http { url, .. }, Some(http)) => {
                let config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
                let transport =
                    StreamableHttpClientTransport::with_client(http.reporting(&ended), config);
                let handshake = tokio::time::timeout(
                    self.start_timeout,
                    Handler.serve_with_lifecycle(transport, lifecycle.clone()),
                )
                .await;
                (handshake, None)
            }
            (
                McpTransport::Stdio {
                    command,
                    args,
                    env,
                    cwd,
                    ..
                },
                _,
            ) => {
                let cwd = cwd.as_deref().unwrap_or(&self.base);
                let (transport, stderr) = spawn(&Launch {
                    name,
                    command,
                    args,
                    env,
                    secrets: &self.secret_env,
                    cwd,
                    max_message: self.max_message,
                    limit_key: self.limit_key.clone(),
                    ended: ended.clone(),
                })
                .map_err(Restart::Failed)?;
                let handshake = tokio::time::timeout(
                    self.start_timeout,
                    Handler.serve_with_lifecycle(transport, lifecycle.clone()),
                )
                .await;
                (handshake, Some(stderr))
            }
            (McpTransport::Http { .. }, None) => unreachable!("an HTTP server has its egress"),
        };
        let said = |stderr: Option<StderrTail>| {
            stderr
                .and_then(|tail| tail.text())
                .map(|text| format!("; it wrote: {text}"))
                .unwrap_or_default()
        };
        match handshake {
            Ok(Ok(service)) if speaks(&service) => Ok(Session {
                service: Arc::new(service),
                ended,
            }),
            Ok(Err(
                err @ (ClientInitializeError::ExpectedInitResult(_)
                | ClientInitializeError::ExpectedInitResponse(_)
                | ClientInitializeError::ConflictInitResponseId(..)
                | ClientInitializeError::UncorrelatedErrorResponse { .. }
                | ClientInitializeError::NoCompatibleProtocolVersion { .. }),
            )) if matches!(lifecycle, ClientLifecycleMode::Auto { .. }) => {
                Err(Restart::Handshake(capped(&err.to_string())))
            }
            Ok(Ok(service)) => {
                let version = service
                    .peer_info()
                    .map(|info| info.protocol_version.to_string())
                    .unwrap_or_default();
                Err(Restart::Failed(format!(
                    "MCP server [mcp.{name}] answered the handshake with protocol revision \
                     `{}`, which the host does not speak (it speaks {}); check mcp.{name}",
                    capped(&crate::text::one_line(&version)),
                    known_revisions()
                )))
            }
            Ok(Err(err)) => Err(Restart::Failed(format!(
                "MCP server [mcp.{name}] failed its handshake: {}{}; {}",
                capped(&crate::text::one_line(
                    &ended.reason().unwrap_or_else(|| init_cause(&err))
                )),
                said(stderr),
                match self.spec.transport {
                    McpTransport::Stdio { .. } => format!(
                        "check mcp.{name}.command (it runs with only the variables of \
                         mcp.{name}.env and mcp.{name}.secrets)"
                    ),
                    McpTransport::Http { .. } => format!("check mcp.{name}.url"),
                }
            ))),
            Err(_) => Err(Restart::Failed(format!(
                "MCP server [mcp.{name}] did not complete its handshake within {} s{}",
                self.start_timeout.as_secs_f64(),
                said(stderr)
            ))),
        }
    }

    /// Stops `failed` (a program: its whole process group), so the next call starts a
    /// fresh one; a start made since, by another call, is kept.
    async fn restart_later(&self, failed: &Session, reason: String) {
        let mut state = self.state.lock().await;
        if let State::Running(current) = &*state
            && Arc::ptr_eq(&current.service, &failed.service)
        {
            *state = State::Down {
                reason,
                failures: 0,
                retry_at: Instant::now(),
            };
        }
    }
}

#[async_trait]
impl ExternalTools for McpClient {
    fn name(&self) -> &str {
        &self.inner.spec.name
    }

    fn identity(&self) -> String {
        self.inner.spec.endpoint()
    }

    async fn call(&self, tool: &str, args_json: &str) -> Result<String, ToolError> {
        let transport = match &self.inner.spec.transport {
            McpTransport::Stdio { .. } => "pipe",
            McpTransport::Http { .. } => "tcp",
        };
        let mut span = spans::mcp_call(tool, &self.inner.spec.name, transport);
        let called = self.call_once(tool, args_json).await;
        if let Err(err) = &called {
            span.fail(err.kind());
        }
        called
    }

    fn abandoned(&self, _tool: &str) -> String {
        let name = &self.inner.spec.name;
        // A server at a URL serves each call on its own request; rmcp has told it the
        // call was cancelled.
        if self.inner.http.is_some() {
            return format!("the call was cancelled on MCP server `{name}`");
        }
        // A program that kept a call past the deadline may be stuck on it: the next call
        // gets a fresh one (dropping the service kills its process group).
        match self.inner.state.try_lock() {
            Ok(mut state) => {
                if matches!(*state, State::Running(_)) {
                    *state = State::Down {
                        reason: "a call ran past the deadline".to_owned(),
                        failures: 0,
                        retry_at: Instant::now(),
                    };
                }
                format!("MCP server `{name}` is restarted for the next call")
            }
            Err(_) => format!(
                "MCP server `{name}` is still starting; the next call uses it once it is up"
            ),
        }
    }
}

impl McpClient {
    /// One `tools/call` of `tool` with `args_json`.
    async fn call_once(&self, tool: &str, args_json: &str) -> Result<String, ToolError> {
        let inner = &self.inner;
        let arguments: serde_json::Map<String, serde_json::Value> = serde_json::from_str(args_json)
            .map_err(|err| ToolError::InvalidArgs(format!("arguments: {err}")))?;
        let session = inner.clone().ready().await?;
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        // One round: a result that asks for input (2026-07-28's `input_required`) is not
        // fulfilled, since nothing here may answer for a person, and says what it asked.
        match session.service.call_tool_once(params).await {
            Ok(CallToolResponse::Complete(result)) => outcome(result),
            Ok(CallToolResponse::InputRequired(asked)) => {
                Err(asked_for_input(&inner.spec.name, tool, &asked))
            }
            Ok(_) => Err(ToolError::Failed(format!(
                "MCP server `{}` answered `{tool}` with a task to follow later, which the host \
                 does not follow; the call ends here",
                inner.spec.name
            ))),
            Err(ServiceError::McpError(err)) => Err(ToolError::Failed(format!(
                "MCP server `{}` refused the call: {}",
                inner.spec.name, err.message
            ))),
            // An answer of no shape a tools/call has: the server is running, and wrong.
            Err(ServiceError::UnexpectedResponse) => Err(ToolError::Failed(format!(
                "MCP server `{}` answered `{tool}` with a result of no shape a tool call has; \
                 the call ends here",
                inner.spec.name
            ))),
            Err(err) => {
                let again = if inner.http.is_some() {
                    "the next call opens a new session"
                } else {
                    "the next call starts it again"
                };
                let name = &inner.spec.name;
                // The host ended the transport itself: that is the cause, not the closing
                // rmcp saw. (Every call waiting on it hears it: its session is over.)
                if let Some(refused) = session.ended.reason() {
                    inner
                        .restart_later(&session, format!("an answer was refused ({refused})"))
                        .await;
                    return Err(ToolError::Failed(format!(
                        "MCP server `{name}` sent an answer the host refused: {refused}; {again}"
                    )));
                }
                let cause = service_cause(&err);
                inner
                    .restart_later(&session, format!("it stopped during a call ({cause})"))
                    .await;
                Err(ToolError::Failed(format!(
                    "MCP server `{name}` stopped during the call ({cause}); {again}"
                )))
            }
        }
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
        ClientInitializeError::LegacyFallbackFailed { discover, fallback } => format!(
            "the `initialize` handshake failed: {} (after `server/discover` got: {})",
            init_cause(fallback),
            init_cause(discover)
        ),
        other => other.to_string(),
    }
}

/// The most of a server's own words a start's error quotes: a server that answers its
/// handshake with a megabyte is named, not copied.
const MAX_QUOTED: usize = 500;

/// `text`, cut to [`MAX_QUOTED`] bytes, saying so.
fn capped(text: &str) -> String {
    if text.len() <= MAX_QUOTED {
        return text.to_owned();
    }
    format!(
        "{}… ({} bytes in all)",
        crate::text::truncate(text, MAX_QUOTED),
        text.len()
    )
}

/// Whether the revision the server settled on is one the host speaks.
fn speaks(service: &RunningService<RoleClient, Handler>) -> bool {
    service
        .peer_info()
        .is_some_and(|info| ProtocolVersion::KNOWN_VERSIONS.contains(&info.protocol_version))
}

/// The revisions the host speaks, for a message.
fn known_revisions() -> String {
    let known: Vec<String> = ProtocolVersion::KNOWN_VERSIONS
        .iter()
        .map(ToString::to_string)
        .collect();
    known.join(", ")
}

/// The wait after `failures` failed starts in a row.
fn backoff(failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(1 << failures.min(16))
        .min(MAX_BACKOFF)
}
