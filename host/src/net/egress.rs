//! The egress: the `wasi:http` send hook that checks, connects and accounts for every
//! request a guest makes.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capstan_caps::{NetRule, NetTarget};
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::body::{CappedRequest, GuardedResponse};
use super::connect::{connect, resolve};
use super::limits::RateLimiter;
use super::log::{AuditWriter, RequestLog};
use super::{NetLimits, NetScope, NetSettings, Refusal, target_of};
use crate::secrets::{PathTemplate, Redactor, Secret, SecretName, Secrets};
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
    /// The hosts its requests connected to: what answered them, for the label of what
    /// the call returns.
    reached: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl CallNet {
    pub(crate) fn new(
        host: Arc<NetHost>,
        process: String,
        scope: NetScope,
        secrets: Vec<String>,
        audit: Arc<dyn AuditSink>,
    ) -> Self {
        let limits = host.settings.for_tool(&scope.tool).clone();
        CallNet::with_limits(host, process, scope, secrets, limits, audit)
    }

    /// A network whose requests run under `limits` rather than its tool's: the host's own
    /// client of a server (an MCP server at a URL), whose calls are bounded elsewhere.
    pub(crate) fn with_limits(
        host: Arc<NetHost>,
        process: String,
        scope: NetScope,
        secrets: Vec<String>,
        limits: NetLimits,
        audit: Arc<dyn AuditSink>,
    ) -> Self {
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
            reached: Default::default(),
        }
    }

    /// The hosts the call's requests have connected to.
    pub(crate) fn reached(&self) -> std::collections::BTreeSet<String> {
        self.reached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends one request the host makes itself through the checks a guest's request takes
    /// (target, rule, rate, in flight, every address, body caps, timeouts, secrets bound to
    /// the host, redaction, an audit row); an error says which refused or failed it.
    pub(crate) async fn request(
        self: &Arc<Self>,
        request: http::Request<WasiBody>,
    ) -> Result<http::Response<WasiBody>, String> {
        let admitted = self.admit(&request).map_err(|err| error_text(&err))?;
        let (response, _io) = self
            .clone()
            .send(request, None, admitted)
            .await
            .map_err(|err| error_text(&err))?;
        Ok(response)
    }

    /// Waits for every audit row of the call's requests to be written.
    pub(crate) async fn flush(&self) {
        self.audit.flush().await;
    }

    /// What the call's ended requests add up to, for its receipt.
    pub(crate) fn tally(&self) -> &super::log::RequestTally {
        self.audit.tally()
    }

    fn key(&self, key: &str) -> String {
        self.host.settings.key_of(&self.scope.tool, key)
    }

    /// The checks that need no waiting: the target, the grant, the rate and the number of
    /// requests in flight.
    fn admit(self: &Arc<Self>, request: &http::Request<WasiBody>) -> Result<Admitted, Error> {
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
        log.granted = self.scope.granted_rule(&target).map(ToString::to_string);
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
        Ok(Admitted {
            rule: rule.clone(),
            log,
            permit,
        })
    }

    /// Sends an admitted request: resolves, checks each address, connects, injects the
    /// secrets bound to the host, and hands back the guarded response.
    async fn send(
        self: Arc<Self>,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        admitted: Admitted,
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let Admitted {
            rule,
            mut log,
            permit,
        } = admitted;
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
        // Every address the name stands for must pass: a resolver answering with one public
        // and one private address must not get to choose which is used.
        for addr in &addrs {
            if let Err(refusal) = self.scope.check_address(&rule, &target, addr.ip()) {
                log.refused(&refusal.to_string());
                return Err(refused(&refusal));
            }
        }
        let connect_deadline = started + connect_timeout;
        let stream = match connect_any(&target, &addrs, connect_deadline).await {
            Ok((addr, stream)) => {
                log.address = Some(addr);
                // Whatever comes back from here on is the host's to say.
                self.reached
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(target.host.to_string());
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

        // The request line carries the path only; the host is in the Host header. A secret
        // bound as a path prefix goes in front of it here, after every check and the log's
        // target were made of the guest's own path.
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let (prefix, in_path) = self.path_secrets(&target);
        *request.uri_mut() = format!("{prefix}{path}")
            .parse()
            .map_err(|_| Error::HttpRequestUriInvalid)?;
        let injected = self.inject_secrets(&target, request.headers_mut(), in_path);
        let carries_secret = !injected.is_empty();
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

        // The connection runs on its own task for as long as the response body is held
        // (the guard in the body aborts it), so a server that answers and closes at once
        // never races its own answer.
        let connection = ConnectionGuard(tokio::spawn(conn));
        let first_byte = Instant::now() + first_byte_timeout;
        let response = tokio::time::timeout_at(
            first_byte.min(deadline).into(),
            sender.send_request(request),
        )
        .await;
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
        let (mut parts, incoming) = response.into_parts();
        if carries_secret && parts.status == http::StatusCode::PARTIAL_CONTENT {
            let message = "capstan stopped this response: it is a part of the whole (206), \
                           which could cut a secret the request carried in two, hidden from \
                           redaction; the host asks for whole answers"
                .to_owned();
            log.failed(0, &message);
            return Err(Error::InternalError(Some(message)));
        }
        if carries_secret
            && let Some(encoding) = parts.headers.get(http::header::CONTENT_ENCODING)
            && !encoding.as_bytes().eq_ignore_ascii_case(b"identity")
        {
            let message = format!(
                "capstan stopped this response: it is encoded ({}), which would hide from \
                 redaction a secret the request carried; the server must answer unencoded",
                String::from_utf8_lossy(encoding.as_bytes())
            );
            log.failed(0, &message);
            return Err(Error::InternalError(Some(message)));
        }
        // Only the secrets this request carried are looked for in its response: what is
        // held back or rewritten then tells the guest nothing of any other secret.
        let redactor = Redactor::new(injected);
        redact_headers(&redactor, &mut parts.headers);
        if carries_secret {
            // Redaction changes the body's length: what the server says of the unredacted
            // body (its length, a digest, a validator built from them) would tell the
            // secret's.
            for name in UNREDACTED_BODY_HEADERS {
                parts.headers.remove(name);
            }
        }
        let body = GuardedResponse {
            inner: incoming,
            cap: self.limits.max_response_body_bytes,
            limit_key: self.key("max_response_body_kib"),
            redactor: redactor.steady_stream(),
            deadline: Box::pin(tokio::time::sleep_until(deadline.into())),
            timeout_key: self.key("request_timeout_secs"),
            received: 0,
            done: false,
            log: Some(log),
            _held: Box::new((connection, permit)),
        };
        let io: IoFuture = Box::new(std::future::ready(Ok(())));
        Ok((http::Response::from_parts(parts, body.boxed_unsync()), io))
    }

    /// The granted secrets bound to `target`'s host, in the config's order.
    fn bound_secrets<'a>(&'a self, target: &'a NetTarget) -> impl Iterator<Item = &'a Secret> {
        self.secrets
            .iter()
            .filter_map(|name| self.host.secrets.get(name))
            .filter(|secret| secret.spec().bound_to(target))
    }

    /// The path prefix of every granted secret bound to `target`'s host that is injected
    /// as one, and the secrets it carries (by name, and by the value as it is written into
    /// the path too, when encoding changed it).
    fn path_secrets(&self, target: &NetTarget) -> (String, Vec<(SecretName, Arc<str>)>) {
        let mut prefix = String::new();
        let mut carried = Vec::new();
        for secret in self.bound_secrets(target) {
            let Some(template) = &secret.spec().path_prefix else {
                continue;
            };
            prefix.push_str(&template.render(secret.value()));
            let name = &secret.spec().name;
            carried.push((name.clone(), Arc::from(secret.value())));
            // As the path carries it, and as a server that echoes it might write it: with
            // its `:` (which most tokens hold, and a path keeps) encoded, in either case.
            let encoded = PathTemplate::encode(secret.value());
            let mut forms = vec![encoded.to_string()];
            if encoded.contains(':') {
                forms.push(encoded.replace(':', "%3A"));
                forms.push(encoded.replace(':', "%3a"));
            }
            for form in forms.into_iter().filter(|f| f != secret.value()) {
                carried.push((name.clone(), Arc::from(form)));
            }
        }
        (prefix, carried)
    }

    /// Sets the header of every granted secret bound to `target`'s host, over any the
    /// guest set; returns the secrets the request carries, by name and value: those and
    /// `in_path`, already in its path. A request carrying a secret asks for an unencoded
    /// answer: a compressed echo of the secret would pass the redactor unseen.
    fn inject_secrets(
        &self,
        target: &NetTarget,
        headers: &mut http::HeaderMap,
        in_path: Vec<(SecretName, Arc<str>)>,
    ) -> Vec<(SecretName, Arc<str>)> {
        let mut injected = in_path;
        for secret in self.bound_secrets(target) {
            let Some(header) = &secret.spec().header else {
                continue;
            };
            if let Ok(mut value) = http::HeaderValue::from_str(&header.render(secret.value())) {
                value.set_sensitive(true);
                headers.insert(header.name().clone(), value);
                injected.push((secret.spec().name.clone(), Arc::from(secret.value())));
            }
        }
        if !injected.is_empty() {
            headers.insert(
                http::header::ACCEPT_ENCODING,
                http::HeaderValue::from_static("identity"),
            );
            // The whole answer, never a slice the guest picks: a slice of an echo of the
            // secret is no whole value, and would pass the redactor.
            for name in [http::header::RANGE, http::header::IF_RANGE] {
                headers.remove(name);
            }
        }
        injected
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

/// Headers of a response that describe its body as the server sent it: dropped when the
/// request carried a secret, as the guest reads the body redacted.
const UNREDACTED_BODY_HEADERS: [&str; 6] = [
    "content-length",
    "content-range",
    "etag",
    "digest",
    "repr-digest",
    "content-digest",
];

/// The header a response header whose name held a secret is handed on as.
pub(crate) const REDACTED_HEADER: &str = "x-capstan-redacted-header";

/// Redacts `redactor`'s secrets from every header of a response: from its value, and from
/// its name, which HTTP compares ignoring case (so a server echoing a secret as a header
/// name is caught however it spelled it). A header whose name held one is handed on as
/// [`REDACTED_HEADER`], its name and value redacted in its value.
fn redact_headers(redactor: &Redactor, headers: &mut http::HeaderMap) {
    if redactor.is_empty() {
        return;
    }
    let mut clean = http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers.iter() {
        let value = match redactor.redact_bytes(value.as_bytes()) {
            Some(clean) => http::HeaderValue::from_bytes(&clean)
                .unwrap_or_else(|_| http::HeaderValue::from_static("[redacted]")),
            None => value.clone(),
        };
        match redactor.redact_ignoring_case(name.as_str()) {
            None => {
                clean.append(name.clone(), value);
            }
            Some(name) => {
                let both = format!("{name}: {}", String::from_utf8_lossy(value.as_bytes()));
                let value = http::HeaderValue::from_str(&both)
                    .unwrap_or_else(|_| http::HeaderValue::from_static("[redacted]"));
                clean.append(REDACTED_HEADER, value);
            }
        }
    }
    *headers = clean;
}

/// A request past the checks that need no waiting: the rule that allowed it, its audit
/// row to be, and its in-flight slot.
struct Admitted {
    rule: NetRule,
    log: RequestLog,
    permit: OwnedSemaphorePermit,
}

/// Aborts the task driving a request's connection when the response is dropped.
struct ConnectionGuard(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What an egress error says, without wasi:http's own prefix.
pub(crate) fn error_text(err: &Error) -> String {
    match err {
        Error::InternalError(Some(message)) => message.clone(),
        other => other.to_string(),
    }
}

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

    /// The hosts the call's requests have connected to so far.
    pub(crate) fn reached(&self) -> std::collections::BTreeSet<String> {
        self.call
            .as_ref()
            .map(|call| call.reached())
            .unwrap_or_default()
    }
}

impl WasiHttpHooks for Egress {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_done: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send> {
        // A call without a grant has wasi:http linked as traps and never gets here; this
        // refusal is the backstop should a networkless egress ever be linked.
        let Some(call) = self.call.clone() else {
            let refusal = Refusal {
                reason: "this call holds no network grant".into(),
                fix: "grant the tool a `net` rule in its profile".into(),
            };
            return Box::new(std::future::ready(Err(refused(&refusal))));
        };
        match call.admit(&request) {
            Err(err) => Box::new(std::future::ready(Err(err))),
            Ok(admitted) => Box::new(call.clone().send(request, options, admitted)),
        }
    }
}

#[cfg(test)]
mod hostile_servers {
    use std::net::SocketAddr;

    use capstan_caps::NetRule;
    use http_body_util::{BodyExt as _, Empty};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::net::GrantSource;
    use crate::secrets::{HeaderTemplate, SecretSource, SecretSpec};

    const KEY: &str = "sk-attack-0123456789abcdef";

    /// A server that answers one request with `response` verbatim and hands back what it
    /// received.
    async fn serve_once(
        response: Vec<u8>,
    ) -> (SocketAddr, tokio::sync::oneshot::Receiver<Vec<u8>>) {
        serve_once_then(response, false).await
    }

    async fn serve_once_then(
        response: Vec<u8>,
        close: bool,
    ) -> (SocketAddr, tokio::sync::oneshot::Receiver<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 16384];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ = tx.send(buf[..n].to_vec());
            s.write_all(&response).await.unwrap();
            if close {
                let _ = s.shutdown().await;
            } else {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            }
        });
        (addr, rx)
    }

    fn call_net(addr: SocketAddr, dir: &tempfile::TempDir) -> Arc<CallNet> {
        call_net_with(addr, dir, false)
    }

    /// A secret configured beside `API_KEY`, granted to no call and bound to no host the
    /// tests reach. No prefix of it ends in a byte that begins `KEY`, so nothing of it is
    /// held back for `KEY`'s sake.
    const OTHER: &str = "zq-0ther-pr1vate-55aa77";

    /// `call_net`, with `OTHER` configured too when `other` is set.
    fn call_net_with(addr: SocketAddr, dir: &tempfile::TempDir, other: bool) -> Arc<CallNet> {
        let file = dir.path().join("key");
        std::fs::write(&file, KEY).unwrap();
        let bound: NetRule = format!("http://{addr}").parse().unwrap();
        let spec = SecretSpec {
            name: "API_KEY".parse().unwrap(),
            source: SecretSource::File(file),
            hosts: vec![bound.clone()],
            header: Some(
                HeaderTemplate::parse("Authorization: Bearer {API_KEY}", "API_KEY").unwrap(),
            ),
            path_prefix: None,
        };
        let mut specs = vec![spec];
        if other {
            let file = dir.path().join("other");
            std::fs::write(&file, OTHER).unwrap();
            specs.push(SecretSpec {
                name: "OTHER".parse().unwrap(),
                source: SecretSource::File(file),
                hosts: vec!["elsewhere.example".parse().unwrap()],
                header: Some(HeaderTemplate::parse("X-Other: {OTHER}", "OTHER").unwrap()),
                path_prefix: None,
            });
        }
        let secrets = Secrets::load(&specs).unwrap();
        let host = Arc::new(NetHost::new(NetSettings::default(), secrets));
        let scope = NetScope {
            tool: "t".into(),
            effective: vec![bound.clone()],
            declared: vec!["*://{internal}:*".parse().unwrap()],
            granted: vec![bound],
            source: GrantSource::Flag,
        };
        Arc::new(CallNet::new(
            host,
            "worker:1".into(),
            scope,
            vec!["API_KEY".into()],
            <dyn AuditSink>::disabled(),
        ))
    }

    /// GETs `url` with `headers` through `call`'s egress.
    async fn send(
        call: Arc<CallNet>,
        url: String,
        headers: &[(&str, &str)],
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let mut builder = http::Request::builder().method("GET").uri(url);
        for (n, v) in headers {
            builder = builder.header(*n, *v);
        }
        let request = builder
            .body(
                Empty::<bytes::Bytes>::new()
                    .map_err(|_| unreachable!())
                    .boxed_unsync(),
            )
            .unwrap();
        let mut egress = Egress::new(Some(call));
        Box::into_pin(egress.send_request(request, None, Box::new(async { Ok(()) }))).await
    }

    async fn get(
        call: Arc<CallNet>,
        url: String,
        headers: &[(&str, &str)],
    ) -> http::Response<WasiBody> {
        let (response, io) = send(call, url, headers).await.unwrap();
        tokio::spawn(Box::into_pin(io));
        response
    }

    /// A secret bound as a path prefix (Telegram's `/bot<TOKEN>/METHOD`) goes in front of
    /// the guest's path on the wire, the guest never writes it, and the server's echo of
    /// the path comes back redacted, its length headers dropped.
    #[tokio::test]
    async fn a_path_prefix_secret_is_sent_in_the_path_and_its_echo_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "123456:AAH-tok/en").unwrap();
        let body = "you asked for /bot123456:AAH-tok%2Fen/getMe";
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        let (addr, seen) = serve_once(response.into_bytes()).await;
        let bound: NetRule = format!("http://{addr}").parse().unwrap();
        let spec = SecretSpec {
            name: "TG".parse().unwrap(),
            source: SecretSource::File(file),
            hosts: vec![bound.clone()],
            header: None,
            path_prefix: Some(crate::secrets::PathTemplate::parse("/bot{TG}", "TG").unwrap()),
        };
        let host = Arc::new(NetHost::new(
            NetSettings::default(),
            Secrets::load(&[spec]).unwrap(),
        ));
        let scope = NetScope {
            tool: "t".into(),
            effective: vec![bound.clone()],
            declared: vec!["*://{internal}:*".parse().unwrap()],
            granted: vec![bound],
            source: GrantSource::Flag,
        };
        let call = Arc::new(CallNet::new(
            host,
            "adapter:tg".into(),
            scope,
            vec!["TG".into()],
            <dyn AuditSink>::disabled(),
        ));
        let response = get(call, format!("http://{addr}/getMe"), &[]).await;
        let seen = String::from_utf8_lossy(&seen.await.unwrap()).into_owned();
        assert!(
            seen.starts_with("GET /bot123456:AAH-tok%2Fen/getMe HTTP/1.1\r\n"),
            "the token went in front of the path, encoded: {seen}"
        );
        assert!(response.headers().get("content-length").is_none());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert!(!body.contains("AAH-tok"), "the echo is redacted: {body}");
        assert!(body.starts_with("you asked for /bot"), "{body}");
    }

    /// The bound host reflects the injected Authorization header in a response header
    /// whose value holds one non-visible-ASCII byte (obs-text, which HTTP/1.1 allows):
    /// `to_str()` fails, so the header is handed to the guest unredacted.
    #[tokio::test]
    async fn a_reflected_secret_in_an_obs_text_header_is_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let mut response = b"HTTP/1.1 200 OK\r\nx-echo: \xab".to_vec();
        response.extend_from_slice(format!("Bearer {KEY}\r\ncontent-length: 0\r\n\r\n").as_bytes());
        let (addr, seen) = serve_once(response).await;
        let response = get(call_net(addr, &dir), format!("http://{addr}/"), &[]).await;
        let seen = String::from_utf8_lossy(&seen.await.unwrap()).into_owned();
        assert!(seen.contains(KEY), "the secret was injected: {seen}");
        let echoed = response.headers().get("x-echo").unwrap().as_bytes();
        let echoed = String::from_utf8_lossy(echoed);
        assert!(
            !echoed.contains(KEY),
            "the guest reads the secret in a header: {echoed}"
        );
    }

    /// A server the guest controls answers with a chunked body, one chunk per message on
    /// `chunks`, so the test decides when each chunk is sent.
    async fn serve_chunks(
        head: &'static str,
    ) -> (SocketAddr, tokio::sync::mpsc::UnboundedSender<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 16384];
            let _ = s.read(&mut buf).await;
            s.write_all(head.as_bytes()).await.unwrap();
            while let Some(chunk) = rx.recv().await {
                let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
                frame.extend_from_slice(&chunk);
                frame.extend_from_slice(b"\r\n");
                s.write_all(&frame).await.unwrap();
            }
            let _ = s.write_all(b"0\r\n\r\n").await;
        });
        (addr, tx)
    }

    /// What the guest reads of a response as a server it controls sends `chunks` one by
    /// one: after each chunk, how many bytes in all were released. The guest reads until it
    /// has what a steady stream releases by then (all but the injected `KEY`'s length less
    /// one); had more been released, the count would overshoot, and had less, the read
    /// would not end and the response would fail at the request timeout (a failure, never
    /// a wait the test relies on). Also returns the whole text the guest read.
    async fn released_per_chunk(chunks: &[&[u8]], other: bool) -> (Vec<usize>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let (addr, sender) =
            serve_chunks("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").await;
        let call = call_net_with(addr, &dir, other);
        let response = get(call, format!("http://{addr}/"), &[]).await;
        let mut body = response.into_body();
        let lag = (KEY.len() - 1).next_multiple_of(crate::secrets::STEADY_LAG_STEP);
        let (mut sent, mut got, mut released) = (0, Vec::new(), Vec::new());
        for chunk in chunks {
            sender.send(chunk.to_vec()).unwrap();
            sent += chunk.len();
            let due = sent.saturating_sub(lag);
            while got.len() < due {
                let frame = body
                    .frame()
                    .await
                    .expect("the body goes on")
                    .unwrap_or_else(|err| panic!("{due} bytes due, {} read: {err:?}", got.len()));
                got.extend_from_slice(&frame.into_data().unwrap());
            }
            assert_eq!(got.len(), due, "released more than the lag allows");
            released.push(got.len());
        }
        drop(sender);
        while let Some(frame) = body.frame().await {
            got.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        (released, got)
    }

    /// What the egress holds back of a response depends on neither what the response
    /// says nor which other secrets are configured: a server the guest controls, sending
    /// each prefix of a secret the call was not granted, or of the secret it carried, sees
    /// the same bytes released after each chunk as for any text of those lengths, with or
    /// without the other secret configured. So neither what it reads nor when tells the
    /// guest anything of a secret.
    #[tokio::test]
    async fn what_is_held_back_depends_only_on_the_secrets_sent() {
        let prefixes = |value: &'static str| -> Vec<&'static [u8]> {
            (1..=22).map(|n| &value.as_bytes()[..n]).collect()
        };
        let filler: String = "x".repeat(22);
        let filler: &'static str = Box::leak(filler.into_boxed_str());
        let (plain, _) = released_per_chunk(&prefixes(filler), false).await;
        for (chunks, other) in [
            (prefixes(OTHER), false),
            (prefixes(OTHER), true),
            (prefixes(KEY), false),
            (prefixes(KEY), true),
        ] {
            let (released, text) = released_per_chunk(&chunks, other).await;
            assert_eq!(released, plain);
            assert_eq!(
                text,
                chunks.concat(),
                "no prefix is redacted, nothing is lost"
            );
        }
    }

    /// A request carrying a secret asks for the whole answer (the guest's Range is
    /// dropped), a partial answer is refused, and headers describing the unredacted body
    /// are dropped.
    #[tokio::test]
    async fn a_request_carrying_a_secret_gets_whole_answers_only() {
        let dir = tempfile::tempdir().unwrap();
        let (addr, seen) = serve_once(
            b"HTTP/1.1 206 Partial Content\r\ncontent-range: bytes 0-9/99\r\ncontent-length: 0\r\n\r\n"
                .to_vec(),
        )
        .await;
        let err = match send(
            call_net(addr, &dir),
            format!("http://{addr}/"),
            &[("range", "bytes=30-40")],
        )
        .await
        {
            Err(err) => format!("{err:?}"),
            Ok(_) => panic!("a partial answer was passed on"),
        };
        assert!(err.contains("a part of the whole (206)"), "{err}");
        let seen = String::from_utf8_lossy(&seen.await.unwrap()).to_ascii_lowercase();
        assert!(!seen.contains("range:"), "{seen}");

        let (addr, _) = serve_once(
            b"HTTP/1.1 200 OK\r\netag: W/\"1a-abc\"\r\ndigest: sha-256=xyz\r\ncontent-length: 2\r\n\r\nok"
                .to_vec(),
        )
        .await;
        let response = get(call_net(addr, &dir), format!("http://{addr}/"), &[]).await;
        for name in ["etag", "digest", "content-length"] {
            assert!(response.headers().get(name).is_none(), "{name} passed on");
        }
    }

    /// A bound server echoes the injected secret as a header's name (in whatever case):
    /// the guest gets the header redacted, name and value.
    #[tokio::test]
    async fn a_secret_echoed_in_a_header_name_is_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let upper = KEY.to_ascii_uppercase();
        let response = format!(
            "HTTP/1.1 200 OK\r\nx-{upper}: yes\r\nx-plain: Bearer {KEY}\r\ncontent-length: 0\r\n\r\n"
        );
        let (addr, seen) = serve_once(response.into_bytes()).await;
        let response = get(call_net(addr, &dir), format!("http://{addr}/"), &[]).await;
        let seen = String::from_utf8_lossy(&seen.await.unwrap()).into_owned();
        assert!(seen.contains(KEY), "the secret was injected: {seen}");
        let headers: Vec<String> = response
            .headers()
            .iter()
            .map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v.as_bytes())))
            .collect();
        let all = headers.join("\n").to_ascii_lowercase();
        assert!(
            !all.contains(&KEY.to_ascii_lowercase()),
            "the guest reads the secret in a header: {all}"
        );
        assert!(
            all.contains("x-capstan-redacted-header: x-[redacted secret api_key]: yes"),
            "{all}"
        );
        assert!(
            all.contains("x-plain: bearer [redacted secret api_key]"),
            "{all}"
        );
    }

    /// The guest may ask the bound host to compress (`accept-encoding: gzip` is passed on
    /// as is); a compressed reflection of the injected header is never redacted, as the
    /// redactor only sees compressed bytes. Shown here by the header reaching the server.
    #[tokio::test]
    async fn a_request_carrying_a_secret_asks_for_an_unencoded_answer() {
        let dir = tempfile::tempdir().unwrap();
        let (addr, seen) =
            serve_once(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec()).await;
        let _ = get(
            call_net(addr, &dir),
            format!("http://{addr}/"),
            &[("accept-encoding", "gzip")],
        )
        .await;
        let seen = String::from_utf8_lossy(&seen.await.unwrap()).to_ascii_lowercase();
        assert!(seen.contains(&KEY.to_ascii_lowercase()), "{seen}");
        assert!(
            !seen.contains("accept-encoding: gzip"),
            "a request carrying a secret asks for a compressed answer the redactor cannot read: {seen}"
        );
    }

    /// An HTTP/1.1 server that answers in full with `connection: close` and closes: the
    /// `select!` in `send` races the connection's end against the response, and when the
    /// connection future wins, a complete answer is reported as "closed the connection
    /// A bound server that answers a secret-bearing request compressed anyway is refused:
    /// the redactor could not see a secret inside.
    #[tokio::test]
    async fn an_encoded_answer_to_a_request_carrying_a_secret_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (addr, _seen) = serve_once(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 0\r\n\r\n".to_vec(),
        )
        .await;
        let err = match send(call_net(addr, &dir), format!("http://{addr}/"), &[]).await {
            Err(err) => format!("{err:?}"),
            Ok(_) => panic!("an encoded answer was passed on"),
        };
        assert!(err.contains("it is encoded (gzip)"), "{err}");
    }

    /// before answering".
    #[tokio::test]
    async fn a_server_that_answers_then_closes_is_heard() {
        let dir = tempfile::tempdir().unwrap();
        let mut failures = Vec::new();
        for _ in 0..20 {
            let (addr, _seen) = serve_once_then(
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".to_vec(),
                true,
            )
            .await;
            if let Err(err) = send(call_net(addr, &dir), format!("http://{addr}/"), &[]).await {
                failures.push(format!("{err:?}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of 20 complete answers lost: {:?}",
            failures.len(),
            failures.first()
        );
    }
}
