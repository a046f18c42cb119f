//! [`Server`]: binds the address, checks who may connect, and serves the API, the events,
//! the OpenAI-compatible door and the page until it is told to stop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use axum::Router;
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::app::App;
use super::auth::{Access, TokenError};
use super::branches::Branches;
use super::error::BodyCap;
use super::hub::EventHub;
use super::{api, approvals, hooks, mcp, metrics, openai, openapi, page, stream};
use crate::agent::{Event, Runtime};
use crate::config::ServeSettings;

/// How long a stopping server waits for requests in progress (a turn finishing, a model
/// request timing out) before it returns anyway.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address is taken, not this machine's, or not allowed.
    #[error("cannot listen on {addr}: {problem}; {fix}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What went wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// No token on an address other than loopback.
    #[error(
        "capstan serve would listen on {addr}, which is not a loopback address, with no token: \
         anyone who reaches it could use the agent. Configure a token ([serve.tokens.NAME] \
         with env or file, and a scope) or listen on 127.0.0.1"
    )]
    NoToken {
        /// The address.
        addr: SocketAddr,
    },
    /// A token could not be read.
    #[error(transparent)]
    Token(#[from] TokenError),
}

/// A bound, not yet serving, `capstan serve`.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use capstan_host::app::AgentBuilder;
/// use capstan_host::config::Config;
/// use capstan_host::serve::Server;
///
/// let config = Config::load_or_default()?;
/// let settings = config.serve.clone();
/// let agent = AgentBuilder::new(config).build().await?;
/// let server = Server::bind(&settings, agent.runtime, agent.events).await?;
/// println!("listening on http://{}", server.local_addr());
/// server.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
pub struct Server {
    listener: TcpListener,
    app: Arc<App>,
    router: OneWayOut,
    /// Cancelled on stop: ends the MCP sessions and their open streams.
    stopping: CancellationToken,
}

impl Server {
    /// Binds `settings.addr` and prepares the routes. Refuses an address other than
    /// loopback without a token, an address in use, and a token it cannot read.
    pub async fn bind(
        settings: &ServeSettings,
        runtime: Arc<Runtime>,
        events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    ) -> Result<Server, ServeError> {
        let access = Access::load(settings)?;
        if access.is_open() && !settings.addr.ip().is_loopback() {
            return Err(ServeError::NoToken {
                addr: settings.addr,
            });
        }
        let listener = TcpListener::bind(settings.addr)
            .await
            .map_err(|err| listen_error(settings.addr, &err))?;
        let redactor = runtime.redactor().with(access.values());
        let hub = EventHub::start(events, settings.event_buffer, redactor.clone());
        let branches = Arc::new(Branches::default());
        {
            let (branches, events) = (branches.clone(), hub.subscribe(Some(0)));
            tokio::spawn(async move { branches.follow(events).await });
        }
        let app = Arc::new(App {
            runtime,
            hub,
            branches,
            access,
            redactor,
            started: crate::services::now(),
            completions: AtomicU64::new(0),
            hooks: crate::messaging::Hooks::new(),
        });
        let stopping = CancellationToken::new();
        let router = router(app.clone(), settings, &stopping);
        Ok(Server {
            listener,
            app,
            router,
            stopping,
        })
    }

    /// The address it listens on (with the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Where the messaging channels whose platforms push their events open their hooks
    /// (`POST /hooks/{name}`): [`Channels::start`](crate::messaging::Channels::start)
    /// takes it.
    pub fn hooks(&self) -> Arc<crate::messaging::Hooks> {
        self.app.hooks.clone()
    }

    /// Whether a token is needed (false: loopback only, no tokens configured).
    pub fn needs_token(&self) -> bool {
        !self.app.access.is_open()
    }

    /// Serves until `shutdown` completes, then stops gracefully: no new connections,
    /// running workers end interrupted and the histories are stored, event streams end once
    /// the runtime's last event is out, and requests in progress finish.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let (runtime, hub) = (self.app.runtime.clone(), self.app.hub.clone());
        let stopping = Arc::new(tokio::sync::Notify::new());
        let stop = {
            let (stopping, sessions) = (stopping.clone(), self.stopping.clone());
            async move {
                shutdown.await;
                runtime.interrupt();
                // Streams get what is buffered, then end, so their connections close.
                hub.close();
                sessions.cancel();
                stopping.notify_one();
            }
        };
        let serving = self.router.serve(self.listener, stop);
        tokio::select! {
            served = serving => served,
            () = async {
                stopping.notified().await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => {
                tracing::warn!(
                    "stopped with requests still open after {} s",
                    SHUTDOWN_GRACE.as_secs()
                );
                Ok(())
            }
        }
    }
}

fn listen_error(addr: SocketAddr, err: &std::io::Error) -> ServeError {
    use std::io::ErrorKind;
    let (problem, fix) = match err.kind() {
        ErrorKind::AddrInUse => (
            "the address is in use (another capstan serve, or another program)".to_owned(),
            "stop it, or pick another port with --addr (serve.addr)".to_owned(),
        ),
        ErrorKind::AddrNotAvailable => (
            "no interface of this machine has that address".to_owned(),
            "use 127.0.0.1, 0.0.0.0 or an address of this machine with --addr".to_owned(),
        ),
        ErrorKind::PermissionDenied => (
            "permission denied (ports below 1024 need privileges)".to_owned(),
            "pick a port of 1024 or more with --addr".to_owned(),
        ),
        _ => (err.to_string(), "check --addr (serve.addr)".to_owned()),
    };
    ServeError::Listen { addr, problem, fix }
}

/// The router as it may be served: every response passes [`redact_responses`], its
/// outermost layer. Only [`OneWayOut::around`] makes one, and only [`OneWayOut::serve`]
/// reaches `axum::serve` (the crate's `clippy.toml` refuses that call anywhere else), so a
/// server that skips the redactor does not pass the lint.
struct OneWayOut(Router);

impl OneWayOut {
    /// `router` with [`redact_responses`] as its outermost layer.
    fn around(router: Router, app: Arc<App>) -> Self {
        OneWayOut(router.layer(middleware::from_fn_with_state(app, redact_responses)))
    }

    /// Serves on `listener` until `stop` completes, then ends gracefully.
    fn serve(
        self,
        listener: TcpListener,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = std::io::Result<()>> + Send {
        let service = self.0.into_make_service_with_connect_info::<SocketAddr>();
        #[allow(clippy::disallowed_methods)] // the one call, on the redacted router
        std::future::IntoFuture::into_future(
            axum::serve(listener, service).with_graceful_shutdown(stop),
        )
    }
}

/// The one way out of the server: every response of every route, whatever its type (JSON,
/// an event stream, the OpenAI-compatible stream, MCP's JSON and event streams, the page),
/// is sent as an [`OutboundBody`](crate::secrets::OutboundBody), redacted as it streams,
/// with its header values redacted. It is the outermost layer, so a route added anywhere
/// in [`router`] passes it.
async fn redact_responses(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if app.redactor.is_empty() {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    for value in parts.headers.values_mut() {
        if let Some(clean) = app.redactor.redact_bytes(value.as_bytes()) {
            *value = HeaderValue::from_bytes(&clean)
                .unwrap_or_else(|_| HeaderValue::from_static("[redacted]"));
        }
    }
    // Redaction changes the length: the body is sent chunked.
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(
        parts,
        axum::body::Body::new(app.redactor.outbound_body(body)),
    )
}

fn router(app: Arc<App>, settings: &ServeSettings, stopping: &CancellationToken) -> OneWayOut {
    let api = Router::new()
        .route("/v1/channels", get(api::channels))
        .route("/v1/channels/{name}/history", get(api::history))
        .route("/v1/channels/{name}/messages", post(api::post_message))
        .route("/v1/workers", get(api::workers))
        .route("/v1/branches", get(api::branches))
        .route("/v1/tasks", get(api::tasks))
        .route("/v1/policy", get(api::policy))
        .route("/v1/audit", get(api::audit))
        .route("/v1/audit/requests", get(api::requests))
        .route("/v1/audit/costs", get(api::costs))
        .route("/v1/approvals", get(approvals::list))
        .route("/v1/approvals/{id}", get(approvals::get))
        .route("/v1/approvals/{id}/approve", post(approvals::approve))
        .route("/v1/approvals/{id}/deny", post(approvals::deny))
        .route("/v1/plugins", get(api::plugins))
        .route("/v1/tools", get(api::tools))
        .route("/v1/events", get(stream::events))
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/metrics", get(metrics::scrape))
        .layer(middleware::from_fn_with_state(app.clone(), authenticate));
    let mut router = Router::new()
        .merge(api)
        .merge(mcp::routes(&app, settings, stopping))
        .route("/v1/openapi.json", get(openapi::document))
        .route("/healthz", get(|| async { "ok" }))
        .route("/hooks/{name}", post(hooks::receive))
        .merge(page::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::Extension(BodyCap(settings.max_request_body_bytes)))
        .layer(DefaultBodyLimit::max(settings.max_request_body_bytes))
        .with_state(app.clone());
    if !settings.cors_origins.is_empty() {
        let origins: Vec<HeaderValue> = settings
            .cors_origins
            .iter()
            .filter_map(|o| o.parse().ok())
            .collect();
        let cors = tower_http::cors::CorsLayer::new()
            .allow_origin(origins)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::HeaderName::from_static("last-event-id"),
                header::HeaderName::from_static(openai::CONVERSATION_HEADER),
            ]);
        router = router.layer(cors);
    }
    // Last, so outermost: nothing leaves but through it.
    OneWayOut::around(router, app)
}

/// Authenticates every API request (see [`Access::check`]) and hands the [`Caller`] on.
///
/// [`Caller`]: super::auth::Caller
async fn authenticate(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    match app.access.check(request.headers(), peer) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refused) => refused.into_response(),
    }
}

// Neither refusal quotes the method or the path: answered before any token is checked,
// an echo passed through the redactor would tell anyone whether a guess is a secret's value.

async fn method_not_allowed() -> super::error::ApiError {
    super::error::ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "that method is not one of this route's; GET /v1/openapi.json lists each route's",
    )
}

async fn not_found() -> super::error::ApiError {
    super::error::ApiError::not_found(
        "no route of that method and path; GET /v1/openapi.json lists them",
    )
}
