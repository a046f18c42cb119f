//! `/mcp` and `/mcp/{profile}`: each profile's tools over MCP's streamable HTTP transport,
//! behind the service's tokens.
//!
//! `/mcp` serves the worker profile, the one meant for tasks; `/mcp/channel`,
//! `/mcp/branch`, `/mcp/worker`, `/mcp/compactor` and `/mcp/cortex` serve each profile.
//! A call needs a `chat` token (`admin` for the cortex's tools), as the profile's chat
//! would; its audit row names the MCP client and the token (`mcp:CLIENT@TOKEN`).

use std::sync::Arc;

use axum::Router;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;

use super::app::App;
use crate::config::{ServeSettings, TokenScope};
use crate::ids::ProcessKind;
use crate::mcp::{Principal, ToolServer};

/// The profile `/mcp` serves.
pub(crate) const DEFAULT_PROFILE: ProcessKind = ProcessKind::Worker;

/// The MCP routes, their sessions ended when `stopping` is cancelled (so a client's open
/// event stream does not hold a stopping server).
pub(crate) fn routes(
    app: &Arc<App>,
    settings: &ServeSettings,
    stopping: &CancellationToken,
) -> Router<Arc<App>> {
    let config = app.runtime.config();
    let mut routes = Router::new();
    for kind in ProcessKind::ALL {
        let server = ToolServer::new(app.runtime.router().clone(), kind)
            .with_max_message_bytes(config.limits.mcp_message_bytes);
        let transport = StreamableHttpServerConfig::default()
            // The service's own Host check (loopback names on an open server) already ran.
            .disable_allowed_hosts()
            .with_max_request_body_bytes(settings.max_request_body_bytes)
            .with_cancellation_token(stopping.child_token());
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            transport,
        );
        let gate = middleware::from_fn_with_state((app.clone(), kind), authenticate);
        let mut router = Router::new().route_service(&format!("/mcp/{kind}"), service.clone());
        if kind == DEFAULT_PROFILE {
            router = router.route_service("/mcp", service);
        }
        routes = routes.merge(router.layer(gate));
    }
    routes
}

/// Authenticates every MCP request as the API's are (see [`Access::check`]), refuses a
/// token whose scope cannot use `kind`'s tools, and names the token for the audit. A
/// refusal is a JSON-RPC error, which an MCP client shows.
///
/// [`Access::check`]: super::auth::Access::check
async fn authenticate(
    State((app, kind)): State<(Arc<App>, ProcessKind)>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let needed = if kind == ProcessKind::Cortex {
        TokenScope::Admin
    } else {
        TokenScope::Chat
    };
    let caller = app
        .access
        .check(request.headers(), peer)
        .and_then(|caller| caller.require(needed).map(|()| caller));
    let caller = match caller {
        Ok(caller) => caller,
        Err(refused) => return refused.into_jsonrpc_response(),
    };
    request.extensions_mut().insert(Principal(caller.name));
    let ending_session = request.method() == Method::DELETE;
    let mut response = next.run(request).await;
    // rmcp answers an ended session 202; MCP clients expect 200 or 204 and warn of a
    // failed termination otherwise, though the session did end.
    if ending_session && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}
