//! [`EgressHttp`]: MCP's streamable HTTP transport, each request sent through the host's
//! egress.
//!
//! rmcp drives the protocol (sessions, the handshake, SSE answers, cancellation); this
//! client only moves its requests, so each one takes the checks a plugin's request takes:
//! the server's URL as the one rule, every address the name resolves to vetted, body caps
//! and timeouts, the secrets bound to the host injected, redaction, an audit row.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt as _, Full};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
};
use sse_stream::{Error as SseError, Sse, SseStream};
use wasmtime_wasi_http::WasiBody;

use super::ended::EndedBy;
use crate::net::{CallNet, GrantSource, NetScope, rule_for};
use crate::plugin::PluginHost;
use capstan_caps::Capability;

/// The session header of MCP's streamable HTTP transport.
const SESSION_HEADER: &str = "mcp-session-id";
const JSON: &str = "application/json";
const EVENT_STREAM: &str = "text/event-stream";
/// The most of an error answer's body quoted in a message.
const MAX_QUOTED_BODY: usize = 512;

/// An HTTP client for rmcp whose every request goes through one server's [`CallNet`].
#[derive(Clone)]
pub(super) struct EgressHttp {
    net: Arc<CallNet>,
    /// Where an answer stopped on its way (over the body cap) is reported.
    ended: EndedBy,
}

/// Why a request to the server did not get an answer: the egress's refusal or failure,
/// which names the limit or rule and the fix.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct EgressError(String);

type Failure = StreamableHttpError<EgressError>;

impl EgressHttp {
    /// A client sending through `net`.
    pub(super) fn new(net: Arc<CallNet>) -> Self {
        EgressHttp {
            net,
            ended: EndedBy::default(),
        }
    }

    /// This client for one session, reporting an answer the egress stopped (over its body
    /// cap) in `ended`.
    pub(super) fn reporting(&self, ended: &EndedBy) -> Self {
        EgressHttp {
            net: self.net.clone(),
            ended: ended.clone(),
        }
    }

    async fn send(
        &self,
        method: Method,
        uri: &str,
        headers: HashMap<HeaderName, HeaderValue>,
        session_id: Option<&str>,
        auth_header: Option<String>,
        body: Bytes,
    ) -> Result<http::Response<WasiBody>, Failure> {
        let mut request = http::Request::builder().method(method).uri(uri);
        // The egress sends the path alone on the request line, as HTTP/1.1 wants.
        if let Some(authority) = uri
            .parse::<http::Uri>()
            .ok()
            .and_then(|u| u.into_parts().authority)
        {
            request = request.header(http::header::HOST, authority.as_str());
        }
        for (name, value) in headers {
            request = request.header(name, value);
        }
        if let Some(session) = session_id {
            request = request.header(SESSION_HEADER, session);
        }
        if let Some(token) = auth_header {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body: WasiBody = Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync();
        let request = request
            .body(body)
            .map_err(|err| StreamableHttpError::Client(EgressError(err.to_string())))?;
        self.net
            .request(request)
            .await
            .map_err(|message| StreamableHttpError::Client(EgressError(message)))
    }
}

/// The whole body, within the egress's cap on response bodies.
async fn read_body(body: WasiBody) -> Result<Bytes, Failure> {
    body.collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|err| StreamableHttpError::Client(EgressError(crate::net::error_text(&err))))
}

fn content_type(response: &http::Response<WasiBody>) -> Option<String> {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
}

impl StreamableHttpClient for EgressHttp {
    type Error = EgressError;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        mut headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, Failure> {
        let body = serde_json::to_vec(&message)?;
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(JSON));
        headers.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        let response = self
            .send(
                Method::POST,
                &uri,
                headers,
                session_id.as_deref(),
                auth_header,
                body.into(),
            )
            .await?;
        let status = response.status();
        if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if status == StatusCode::NOT_FOUND && session_id.is_some() {
            return Err(StreamableHttpError::SessionExpired);
        }
        let session = response
            .headers()
            .get(SESSION_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        let kind = content_type(&response);
        if !status.is_success() {
            let body = read_body(response.into_body()).await?;
            // A JSON-RPC error in an error answer is the server's word on the request.
            if let Ok(error @ ServerJsonRpcMessage::Error(_)) = serde_json::from_slice(&body) {
                return Ok(StreamableHttpPostResponse::Json(error, session));
            }
            let text = String::from_utf8_lossy(&body);
            return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                format!(
                    "HTTP {status}: {}",
                    crate::text::truncate(text.trim(), MAX_QUOTED_BODY)
                ),
            )));
        }
        match kind.as_deref() {
            Some(EVENT_STREAM) => {
                // rmcp ends the session on a stream's error without saying why: the
                // egress's reason (an answer over the body cap) is kept for the call.
                let ended = self.ended.clone();
                let events: BoxStream<'static, Result<Sse, SseError>> =
                    SseStream::new(response.into_body())
                        .inspect(move |event| {
                            if let Err(SseError::Body(err)) = event
                                && let Some(over) = err
                                    .downcast_ref::<wasmtime_wasi_http::Error>()
                                    .and_then(crate::net::over_body_cap)
                            {
                                ended.set(over);
                            }
                        })
                        .boxed();
                Ok(StreamableHttpPostResponse::Sse(events, session))
            }
            Some(JSON) => {
                let body = read_body(response.into_body()).await?;
                let message = serde_json::from_slice(&body)?;
                Ok(StreamableHttpPostResponse::Json(message, session))
            }
            // A notification may be answered with an empty 200 rather than a 202.
            _ if !matches!(message, ClientJsonRpcMessage::Request(_)) => {
                Ok(StreamableHttpPostResponse::Accepted)
            }
            other => Err(StreamableHttpError::UnexpectedContentType(
                other.map(str::to_owned),
            )),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), Failure> {
        let response = self
            .send(
                Method::DELETE,
                &uri,
                headers,
                Some(&session_id),
                auth_header,
                Bytes::new(),
            )
            .await?;
        if response.status() == StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportDeleteSession);
        }
        Ok(())
    }

    /// The host takes no requests from a server (no sampling, no elicitation), so it
    /// opens no stream for them: each call's answer comes on its own POST.
    async fn get_stream(
        &self,
        _uri: Arc<str>,
        _session_id: Option<Arc<str>>,
        _last_event_id: Option<String>,
        _auth_header: Option<String>,
        _headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, Failure> {
        Err(StreamableHttpError::ServerDoesNotSupportSse)
    }
}

/// The network of an HTTP server's requests: the process `mcp:NAME`, its URL the one
/// rule, the config's secrets for it, and `[net]`'s body caps and connect timeout (or
/// `[net.tool.NAME]`'s). The tool deadline bounds its calls, so the time to an answer
/// and for the whole of it are at least that deadline, and rmcp bounds the requests in
/// flight, so no rate or in-flight limit of `[net]` applies.
pub(super) fn server_net(
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
        host.audit().clone(),
    )
}
