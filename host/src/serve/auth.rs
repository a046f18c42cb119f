//! Who may call the service: bearer tokens with scopes, compared in constant time, a rate
//! limit per token, and, with no token configured, loopback only.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::config::{ServeSettings, TokenScope};
use crate::net::RateLimiter;
use crate::secrets::{SecretName, read_source};

/// The shortest token accepted: a shorter one could be guessed.
pub(crate) const MIN_TOKEN_BYTES: usize = 16;

/// The tokens and the rate limit of one server.
pub(crate) struct Access {
    tokens: Vec<Token>,
    /// The values, named `token.NAME`, for the redactor of everything served.
    values: Vec<(SecretName, Arc<str>)>,
    limiter: RateLimiter,
    per_minute: u32,
}

struct Token {
    name: String,
    /// SHA-256 of the value: compared in constant time whatever the presented length.
    digest: [u8; 32],
    scope: TokenScope,
}

/// Who is calling, once authenticated.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The token's name, or `local` on a loopback server with no tokens.
    pub(crate) name: String,
    /// What it may do.
    pub(crate) scope: TokenScope,
}

impl Caller {
    /// Refuses a caller whose scope does not include `needed`, naming both.
    pub(crate) fn require(&self, needed: TokenScope) -> Result<(), ApiError> {
        if self.scope >= needed {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            format!(
                "token `{}` has scope \"{}\"; this needs \"{needed}\" (set scope = \"{needed}\" \
                 in [serve.tokens.{}])",
                self.name, self.scope, self.name
            ),
        ))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::internal("the request was not authenticated"))
    }
}

/// A token that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("[serve.tokens.{name}]: {problem}; {fix}")]
pub struct TokenError {
    name: String,
    problem: String,
    fix: String,
}

impl Access {
    /// Reads every token's value from its source.
    pub(crate) fn load(settings: &ServeSettings) -> Result<Access, TokenError> {
        let mut tokens: Vec<Token> = Vec::new();
        let mut values = Vec::new();
        for spec in &settings.tokens {
            let table = format!("[serve.tokens.{}]", spec.name);
            let fail = |problem: String, fix: String| TokenError {
                name: spec.name.clone(),
                problem,
                fix,
            };
            let value = read_source(&spec.source, &table, MIN_TOKEN_BYTES)
                .map_err(|(problem, fix)| fail(problem, fix))?;
            let digest: [u8; 32] = Sha256::digest(value.as_bytes()).into();
            if let Some(same) = tokens.iter().find(|t| t.digest == digest) {
                return Err(fail(
                    format!("its value is the same as token {}'s", same.name),
                    "give each token its own value".into(),
                ));
            }
            if let Ok(name) = format!("token.{}", spec.name).parse() {
                values.push((name, Arc::from(value)));
            }
            tokens.push(Token {
                name: spec.name.clone(),
                digest,
                scope: spec.scope,
            });
        }
        let access = Access {
            tokens,
            values,
            limiter: RateLimiter::default(),
            per_minute: settings.requests_per_minute,
        };
        Ok(access)
    }

    /// Whether no token is configured: the server then answers loopback only.
    pub(crate) fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Authenticates a request: its bearer token (or, on an open server, that it names a
    /// loopback host), then the rate limit of the token (or client address).
    pub(crate) fn check(&self, headers: &HeaderMap, peer: SocketAddr) -> Result<Caller, ApiError> {
        let caller = if self.is_open() {
            check_loopback_host(headers)?;
            Caller {
                name: "local".into(),
                scope: TokenScope::Admin,
            }
        } else {
            self.check_token(headers)?
        };
        let key = if self.is_open() {
            peer.ip().to_string()
        } else {
            caller.name.clone()
        };
        if let Err(wait) = self.limiter.take(&key, "serve", self.per_minute) {
            let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
            let mut refused = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                format!(
                    "`{}` made more than serve.requests_per_minute ({}) requests this minute; \
                     retry in {secs} s, or raise the limit in capstan.toml",
                    caller.name, self.per_minute
                ),
            );
            refused.retry_after = Some(secs);
            return Err(refused);
        }
        Ok(caller)
    }

    fn check_token(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let unauthorized =
            |code, message: &str| ApiError::new(StatusCode::UNAUTHORIZED, code, message);
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(unauthorized(
                "missing_token",
                "this server needs a token: send `Authorization: Bearer TOKEN` with a token \
                 from [serve.tokens] in its config",
            ));
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or_else(|| {
                unauthorized(
                    "missing_token",
                    "the Authorization header is not `Bearer TOKEN`",
                )
            })?;
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        // Every token is compared, whichever matches, so the time taken tells nothing.
        let mut found: Option<&Token> = None;
        for token in &self.tokens {
            if bool::from(token.digest.ct_eq(&digest)) {
                found = Some(token);
            }
        }
        let token = found.ok_or_else(|| {
            unauthorized(
                "invalid_token",
                "the token is not one of this server's tokens",
            )
        })?;
        Ok(Caller {
            name: token.name.clone(),
            scope: token.scope,
        })
    }

    /// The tokens' values, named `token.NAME`, for a redactor.
    pub(crate) fn values(&self) -> impl Iterator<Item = (SecretName, Arc<str>)> + '_ {
        self.values.iter().cloned()
    }
}

/// On a server with no tokens, a request must name a loopback host: a web page whose name
/// an attacker points at 127.0.0.1 (DNS rebinding) sends its own name, and is refused.
fn check_loopback_host(headers: &HeaderMap) -> Result<(), ApiError> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let name = host_name(host).unwrap_or("");
    let loopback = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        return Ok(());
    }
    // The refusal does not quote the name: it is answered before any check, and an echo
    // passed through the redactor would confirm a guess of a secret's value.
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "host_not_allowed",
        "this server has no tokens, so it answers only requests addressed to localhost or a \
         loopback address (the Host header); configure [serve.tokens] to serve other names",
    ))
}

/// The name of a `Host` value that is exactly `name[:port]` or `[ip6][:port]`, with a
/// port that is a port; `None` for anything else.
fn host_name(host: &str) -> Option<&str> {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => {
            let (name, after) = rest.split_once(']')?;
            let port = match after {
                "" => None,
                _ => Some(after.strip_prefix(':')?),
            };
            (name, port)
        }
        None => match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    match port {
        Some(port) if port.parse::<u16>().is_err() => None,
        _ => Some(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, value.parse().unwrap());
        headers
    }

    #[test]
    fn an_open_server_answers_loopback_names_only() {
        for ok in [
            "localhost:8787",
            "127.0.0.1:8787",
            "[::1]:8787",
            "LOCALHOST",
            "127.0.0.2",
        ] {
            assert!(check_loopback_host(&host(ok)).is_ok(), "{ok}");
        }
        for bad in [
            "evil.example:8787",
            "localhost.evil.example",
            "10.0.0.1:80",
            "[::2]:1",
            "localhost:80@evil.example",
            "user@localhost",
            "localhost:http",
            "[::1]evil",
            "localhost:99999",
        ] {
            let err = check_loopback_host(&host(bad)).unwrap_err();
            assert_eq!(err.status, StatusCode::FORBIDDEN, "{bad}");
        }
        assert!(check_loopback_host(&HeaderMap::new()).is_err());
    }
}
