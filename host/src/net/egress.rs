//! The egress: the `wasi:http` send hook that checks, connects and accounts for every
//! request a guest makes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capstan_caps::NetTarget;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::body::{CappedRequest, GuardedResponse};
use super::connect::{connect, resolve};
use super::limits::RateLimiter;
use super::log::{AuditWriter, RequestLog};
use super::{NetLimits, NetScope, NetSettings, Refusal, target_of};
use crate::secrets::Secrets;
use crate::services::AuditSink;

/// What every call's requests share: the limits, the rate buckets and the secrets.
///
/// ```
/// use capstan_host::net::{NetHost, NetSettings};
/// use capstan_host::secrets::Secrets;
///
/// let net = NetHost::new(NetSettings::default(), Secrets::none());
/// assert_eq!(net.settings().limits.max_concurrent_requests, 4);
/// ```
#[derive(Debug, Default)]
pub struct NetHost {
    settings: NetSettings,
    rates: RateLimiter,
    pub(crate) secrets: Secrets,
}

impl NetHost {
    /// A network with `settings` and `secrets`.
    pub fn new(settings: NetSettings, secrets: Secrets) -> Self {
        NetHost {
            settings,
            rates: RateLimiter::default(),
            secrets,
        }
    }

    /// The limits.
    pub fn settings(&self) -> &NetSettings {
        &self.settings
    }

    /// The secrets.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }
}

/// One call's network: who calls, what it may reach, and the requests it has made.
pub(crate) struct CallNet {
    pub(crate) host: Arc<NetHost>,
    pub(crate) process: String,
    pub(crate) scope: NetScope,
    /// The secrets the call is granted.
    secrets: Vec<String>,
    limits: NetLimits,
    in_flight: Arc<Semaphore>,
    /// Where the call's request rows go.
    audit: Arc<AuditWriter>,
}

impl CallNet {
    pub(crate) fn new(
        host: Arc<NetHost>,
        process: String,
        scope: NetScope,
        secrets: Vec<String>,
        audit: Option<Arc<dyn AuditSink>>,
    ) -> Self {
        let limits = host.settings.for_tool(&scope.tool).clone();
        let audit = Arc::new(AuditWriter::new(
            process.clone(),
            scope.tool.clone(),
            host.secrets.redactor().clone(),
            audit,
        ));
        CallNet {
            in_flight: Arc::new(Semaphore::new(limits.max_concurrent_requests as usize)),
            host,
            process,
            scope,
            secrets,
            limits,
            audit,
        }
    }

    /// Waits for every audit row of the call's requests to be written.
    pub(crate) async fn flush(&self) {
        self.audit.flush().await;
    }

    fn key(&self, key: &str) -> String {
        self.host.settings.key_of(&self.scope.tool, key)
    }

    /// The checks that need no waiting: the target, the grant, the rate and the number of
    /// requests in flight.
    fn admit(
        self: &Arc<Self>,
        request: &http::Request<WasiBody>,
    ) -> Result<(RequestLog, OwnedSemaphorePermit), Error> {
        let target = target_of(request.method(), request.uri()).map_err(|reason| {
            refused(&Refusal {
                reason: format!("the request's URL is not accepted: {reason}"),
                fix: "send an http or https URL with a plain host".into(),
            })
        })?;
        let mut log = RequestLog::new(self.audit.clone(), target.clone());
        let deny = |log: RequestLog, refusal: Refusal| {
            log.refused(&refusal.to_string());
            refused(&refusal)
        };
        let rule = match self.scope.check(&target) {
            Ok(rule) => rule,
            Err(refusal) => return Err(deny(log, refusal)),
        };
        log.grant = rule.to_string();
        let rates: &RateLimiter = &self.host.rates;
        if let Err(wait) = rates.take(
            &self.process,
            &self.scope.tool,
            self.limits.requests_per_minute,
        ) {
            let refusal = Refusal {
                reason: format!(
                    "{} has made its {} requests per minute with tool `{}` (next one in {:.1} s)",
                    self.process,
                    self.limits.requests_per_minute,
                    self.scope.tool,
                    wait.as_secs_f64()
                ),
                fix: format!("raise {} to allow more", self.key("requests_per_minute")),
            };
            return Err(deny(log, refusal));
        }
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            let refusal = Refusal {
                reason: format!(
                    "this call already has {} requests in flight",
                    self.limits.max_concurrent_requests
                ),
                fix: format!(
                    "wait for one to end, or raise {}",
                    self.key("max_concurrent_requests")
                ),
            };
            return Err(deny(log, refusal));
        };
        if let Some(length) = content_length(request)
            && length > self.limits.max_request_body_bytes
        {
            let refusal = Refusal {
                reason: format!(
                    "its body is {length} bytes, over the {} KiB limit",
                    self.limits.max_request_body_bytes >> 10
                ),
                fix: format!("raise {} to send more", self.key("max_request_body_kib")),
            };
            return Err(deny(log, refusal));
        }
        Ok((log, permit))
    }

    /// Sends an admitted request: resolves, checks each address, connects, injects the
    /// secrets bound to the host, and hands back the guarded response.
    async fn send(
        self: Arc<Self>,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        mut log: RequestLog,
        permit: OwnedSemaphorePermit,
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let started = Instant::now();
        let deadline = started + self.limits.request_timeout;
        let target = log.target.clone();
        let fail = |log: RequestLog, message: String| {
            log.failed(0, &message);
            Error::InternalError(Some(format!("capstan: {message}")))
        };
        let pick = |guest: Option<Duration>, ours: Duration| guest.map_or(ours, |g| g.min(ours));
        let connect_timeout = pick(
            options.and_then(|o| o.connect_timeout),
            self.limits.connect_timeout,
        );
        let first_byte_timeout = pick(
            options.and_then(|o| o.first_byte_timeout),
            self.limits.first_byte_timeout,
        );

        let addrs = match resolve(&target, connect_timeout).await {
            Ok(addrs) if addrs.is_empty() => {
                return Err(fail(log, format!("{} has no address", target.host)));
            }
            Ok(addrs) => addrs,
            Err(message) => return Err(fail(log, message)),
        };
        let rule = self
            .scope
            .check(&target)
            .expect("admitted requests were checked")
            .clone();
        // Every address the name stands for must pass: a resolver answering with one public
        // and one private address must not get to choose which is used.
        for addr in &addrs {
            if let Err(refusal) = NetScope::check_address(&rule, &target, addr.ip()) {
                log.refused(&refusal.to_string());
                return Err(refused(&refusal));
            }
        }
        let connect_deadline = started + connect_timeout;
        let stream = match connect_any(&target, &addrs, connect_deadline).await {
            Ok((addr, stream)) => {
                log.address = Some(addr);
                stream
            }
            Err(message) => {
                let message = if message.is_empty() {
                    format!(
                        "no connection to {} within {:.1} s ({})",
                        target.host,
                        connect_timeout.as_secs_f64(),
                        self.key("connect_timeout_secs")
                    )
                } else {
                    message
                };
                return Err(fail(log, message));
            }
        };
        let handshake =
            hyper::client::conn::http1::handshake(wasmtime_wasi_http::io::TokioIo::new(stream));
        let (mut sender, conn) =
            match tokio::time::timeout_at(connect_deadline.into(), handshake).await {
                Ok(Ok(pair)) => pair,
                Ok(Err(err)) => {
                    return Err(fail(
                        log,
                        format!("HTTP handshake with {} failed: {err}", target.host),
                    ));
                }
                Err(_) => {
                    return Err(fail(
                        log,
                        format!(
                            "no connection to {} within the connect timeout ({})",
                            target.host,
                            self.key("connect_timeout_secs")
                        ),
                    ));
                }
            };

        // The request line carries the path only; the host is in the Host header.
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        *request.uri_mut() = path.parse().map_err(|_| Error::HttpRequestUriInvalid)?;
        self.inject_secrets(&target, request.headers_mut());
        let refused_body = Arc::new(Mutex::new(None));
        let sent = log.sent.clone();
        let request = request.map(|body| {
            CappedRequest {
                inner: body,
                cap: self.limits.max_request_body_bytes,
                sent,
                refused: refused_body.clone(),
                limit_key: self.key("max_request_body_kib"),
            }
            .boxed_unsync()
        });

        let mut conn = Box::pin(conn);
        let first_byte = Instant::now() + first_byte_timeout;
        let response = tokio::select! {
            response = tokio::time::timeout_at(first_byte.min(deadline).into(), sender.send_request(request)) => response,
            ended = &mut conn => Ok(Err(match ended {
                Ok(()) => return Err(fail(log, format!("{} closed the connection before answering", target.host))),
                Err(err) => err,
            })),
        };
        let response = match response {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => {
                let cap = refused_body
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take();
                let message = match cap {
                    Some(message) => {
                        log.failed(0, &message);
                        return Err(Error::InternalError(Some(message)));
                    }
                    None => format!("the request to {} failed: {err}", target.host),
                };
                return Err(fail(log, message));
            }
            Err(_) => {
                let (what, key) = if first_byte <= deadline {
                    ("first_byte_timeout_secs", first_byte_timeout)
                } else {
                    ("request_timeout_secs", self.limits.request_timeout)
                };
                return Err(fail(
                    log,
                    format!(
                        "no response from {} within {:.1} s ({})",
                        target.host,
                        key.as_secs_f64(),
                        self.key(what)
                    ),
                ));
            }
        };
        log.status = Some(response.status().as_u16());
        let redactor = self.host.secrets.redactor();
        let (mut parts, incoming) = response.into_parts();
        if !redactor.is_empty() {
            for value in parts.headers.values_mut() {
                if let Ok(text) = value.to_str()
                    && let std::borrow::Cow::Owned(clean) = redactor.redact(text)
                {
                    *value = http::HeaderValue::from_str(&clean)
                        .unwrap_or_else(|_| http::HeaderValue::from_static("[redacted]"));
                }
            }
        }
        let body = GuardedResponse {
            inner: incoming,
            cap: self.limits.max_response_body_bytes,
            limit_key: self.key("max_response_body_kib"),
            redactor: redactor.stream(),
            deadline: Box::pin(tokio::time::sleep_until(deadline.into())),
            timeout_key: self.key("request_timeout_secs"),
            received: 0,
            done: false,
            log: Some(log),
        };
        let io: IoFuture = Box::new(async move {
            let _permit = permit;
            conn.await.map_err(Error::from)
        });
        Ok((http::Response::from_parts(parts, body.boxed_unsync()), io))
    }

    /// Sets the header of every granted secret bound to `target`'s host, over any the
    /// guest set.
    fn inject_secrets(&self, target: &NetTarget, headers: &mut http::HeaderMap) {
        for name in &self.secrets {
            let Some(secret) = self.host.secrets.get(name) else {
                continue;
            };
            let Some(header) = &secret.spec().header else {
                continue;
            };
            if !secret.bound_to(target) {
                continue;
            }
            if let Ok(value) = http::HeaderValue::from_str(&header.render(secret.value())) {
                let mut value = value;
                value.set_sensitive(true);
                headers.insert(header.name().clone(), value);
            }
        }
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

/// The error a guest gets for a refused request: its message says which grant or limit
/// refused it and what would allow it.
fn refused(refusal: &Refusal) -> Error {
    Error::InternalError(Some(format!("capstan refused this request: {refusal}")))
}

fn content_length(request: &http::Request<WasiBody>) -> Option<u64> {
    request
        .headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Connects to the first of `addrs` that answers before `deadline`. An empty error
/// means the deadline passed.
async fn connect_any(
    target: &NetTarget,
    addrs: &[SocketAddr],
    deadline: Instant,
) -> Result<(SocketAddr, Box<dyn super::connect::Stream>), String> {
    let mut last = String::new();
    for addr in addrs {
        match tokio::time::timeout_at(deadline.into(), connect(target, *addr)).await {
            Ok(Ok(stream)) => return Ok((*addr, stream)),
            Ok(Err(message)) => last = message,
            Err(_) => return Err(String::new()),
        }
    }
    Err(last)
}

/// The `wasi:http` hooks of one call's sandbox. Without a network grant every request is
/// refused before anything is resolved or connected.
#[derive(Default)]
pub(crate) struct Egress {
    call: Option<Arc<CallNet>>,
}

impl Egress {
    pub(crate) fn new(call: Option<Arc<CallNet>>) -> Self {
        Egress { call }
    }
}

impl WasiHttpHooks for Egress {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_done: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send> {
        let Some(call) = self.call.clone() else {
            let refusal = Refusal {
                reason: "this call holds no network grant".into(),
                fix: "grant the tool a `net` rule in its profile".into(),
            };
            return Box::new(std::future::ready(Err(refused(&refusal))));
        };
        match call.admit(&request) {
            Err(err) => Box::new(std::future::ready(Err(err))),
            Ok((log, permit)) => Box::new(call.clone().send(request, options, log, permit)),
        }
    }
}
