//! `[serve]`: the address, limits and tokens of `capstan serve`, as serde reads them, and
//! their checks.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Deserialize;

use super::error::{KeyError, key_error};
use super::network::source_of;
use crate::secrets::SecretSource;

/// The largest request body cap, in KiB (64 MiB).
const MAX_BODY_KIB: u64 = 64 << 10;
/// The most events kept for resuming streams.
const MAX_EVENT_BUFFER: usize = 1 << 20;

/// `[serve]`: how `capstan serve` listens and whom it answers.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeSettings {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The largest request body, in bytes.
    pub max_request_body_bytes: usize,
    /// Requests per minute per token (or client address, with no tokens).
    pub requests_per_minute: u32,
    /// Events kept for `Last-Event-ID` resumes.
    pub event_buffer: usize,
    /// Origins allowed by CORS; empty: no CORS headers at all.
    pub cors_origins: Vec<String>,
    /// The bearer tokens, by name.
    pub tokens: Vec<TokenSpec>,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            addr: SocketAddr::from(([127, 0, 0, 1], 8787)),
            max_request_body_bytes: 256 << 10,
            requests_per_minute: 600,
            event_buffer: 4096,
            cors_origins: Vec::new(),
            tokens: Vec::new(),
        }
    }
}

/// `[serve.tokens.NAME]`: one bearer token, where its value comes from, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSpec {
    /// Its name, shown in the audit and the logs instead of its value.
    pub name: String,
    /// Where its value is read from.
    pub source: SecretSource,
    /// What it may do.
    pub scope: TokenScope,
}

/// What a token may do; each scope includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TokenScope {
    /// Read state and events.
    Read,
    /// Read, and talk in channels (the API's messages and chat completions).
    Chat,
    /// Chat, and talk to the cortex (the admin chat, with every tool by default).
    Admin,
}

impl TokenScope {
    /// Every scope, narrowest first.
    pub const ALL: [TokenScope; 3] = [TokenScope::Read, TokenScope::Chat, TokenScope::Admin];

    /// `read`, `chat` or `admin`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Read => "read",
            TokenScope::Chat => "chat",
            TokenScope::Admin => "admin",
        }
    }
}

impl fmt::Display for TokenScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TokenScope {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        TokenScope::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown scope `{}`; use \"read\", \"chat\" or \"admin\"",
                    text.escape_debug()
                )
            })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServe {
    addr: String,
    max_request_body_kib: u64,
    requests_per_minute: u32,
    event_buffer: usize,
    cors_origins: Vec<String>,
    #[serde(default)]
    tokens: BTreeMap<String, RawToken>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    env: Option<String>,
    file: Option<PathBuf>,
    scope: String,
    /// Never allowed: present only to refuse it with the reason.
    value: Option<toml::Value>,
    token: Option<toml::Value>,
}

impl RawServe {
    pub(super) fn check(
        self,
        resolve: &impl Fn(PathBuf) -> PathBuf,
    ) -> Result<ServeSettings, KeyError> {
        let addr = parse_addr(&self.addr).map_err(|msg| key_error("serve.addr", msg))?;
        if !(1..=MAX_BODY_KIB).contains(&self.max_request_body_kib) {
            return Err(key_error(
                "serve.max_request_body_kib",
                format!(
                    "must be 1 to {MAX_BODY_KIB}, got {}",
                    self.max_request_body_kib
                ),
            ));
        }
        if self.requests_per_minute == 0 {
            return Err(key_error("serve.requests_per_minute", "must be at least 1"));
        }
        if !(1..=MAX_EVENT_BUFFER).contains(&self.event_buffer) {
            return Err(key_error(
                "serve.event_buffer",
                format!("must be 1 to {MAX_EVENT_BUFFER}, got {}", self.event_buffer),
            ));
        }
        for (i, origin) in self.cors_origins.iter().enumerate() {
            check_origin(origin)
                .map_err(|msg| key_error(&format!("serve.cors_origins[{i}]"), msg))?;
        }
        let mut tokens = Vec::new();
        for (name, raw) in self.tokens {
            let table = format!("serve.tokens.{name}");
            if !valid_token_name(&name) {
                return Err(key_error(
                    &table,
                    "a token's name is 1 to 64 ASCII letters, digits, '-' or '_'",
                ));
            }
            if raw.value.is_some() || raw.token.is_some() {
                return Err(key_error(
                    &table,
                    "a token's value is never written in the config; read it from \
                     `env = \"VAR\"` or `file = \"/path\"`",
                ));
            }
            let source = source_of(&table, raw.env, raw.file, resolve)?;
            let scope = raw
                .scope
                .parse()
                .map_err(|msg| key_error(&format!("{table}.scope"), msg))?;
            tokens.push(TokenSpec {
                name,
                source,
                scope,
            });
        }
        Ok(ServeSettings {
            addr,
            max_request_body_bytes: (self.max_request_body_kib << 10) as usize,
            requests_per_minute: self.requests_per_minute,
            event_buffer: self.event_buffer,
            cors_origins: self.cors_origins,
            tokens,
        })
    }
}

/// Reads `HOST:PORT` with an IP address for host (`127.0.0.1:8787`, `[::1]:8787`); a name
/// such as `localhost:8787` is refused, since what it resolves to decides who can connect.
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!(
            "`{}` is not an address to listen on; write IP:PORT, such as 127.0.0.1:8787 or \
             [::1]:8787 (0.0.0.0:8787 for every interface, which needs a token)",
            text.escape_debug()
        )
    })
}

fn check_origin(origin: &str) -> Result<(), String> {
    let valid = (origin.starts_with("http://") || origin.starts_with("https://"))
        && !origin.ends_with('/')
        && !origin.contains(char::is_whitespace)
        && http::HeaderValue::from_str(origin).is_ok();
    if valid {
        Ok(())
    } else {
        Err(format!(
            "`{}` is not an origin; write scheme://host[:port] with no path, such as \
             https://dashboard.example.com",
            origin.escape_debug()
        ))
    }
}

fn valid_token_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
