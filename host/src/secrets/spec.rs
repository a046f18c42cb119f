//! A secret as the config declares it.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use capstan_caps::{NetRule, NetTarget};

/// A secret's name: 1 to 64 ASCII letters, digits, `.`, `-` or `_`, as `secret:NAME`
/// grants spell it.
///
/// ```
/// use capstan_host::secrets::SecretName;
///
/// let name: SecretName = "GITHUB_TOKEN".parse().unwrap();
/// assert_eq!(name.as_str(), "GITHUB_TOKEN");
/// assert!("no spaces".parse::<SecretName>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretName(String);

impl SecretName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for SecretName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let valid = !text.is_empty()
            && text.len() <= 64
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
        if valid {
            Ok(SecretName(text.to_owned()))
        } else {
            Err(format!(
                "bad secret name `{}`: use 1 to 64 ASCII letters, digits, '.', '-' or '_'",
                text.escape_debug()
            ))
        }
    }
}

/// Where a secret's value is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// An environment variable of the host process.
    Env(String),
    /// A file (its contents, without a trailing newline).
    File(PathBuf),
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Env(var) => write!(f, "environment variable {var}"),
            SecretSource::File(path) => write!(f, "file {}", path.display()),
        }
    }
}

/// A header the host adds to requests that carry a secret, such as
/// `Authorization: Bearer {API_KEY}`: the name, and the value with `{NAME}` where the
/// secret goes.
///
/// ```
/// use capstan_host::secrets::HeaderTemplate;
///
/// let header = HeaderTemplate::parse("Authorization: Bearer {API_KEY}", "API_KEY").unwrap();
/// assert_eq!(header.name(), "authorization");
/// assert_eq!(header.render("s3cr3t"), "Bearer s3cr3t");
/// assert!(HeaderTemplate::parse("Authorization: Bearer", "API_KEY").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTemplate {
    name: http::HeaderName,
    before: String,
    after: String,
}

impl HeaderTemplate {
    /// Parses `Name: value with {SECRET}`; the value must hold `{secret}` exactly once.
    pub fn parse(text: &str, secret: &str) -> Result<Self, String> {
        let (name, value) = text.split_once(':').ok_or_else(|| {
            format!("expected `Header-Name: value with {{{secret}}}`, e.g. \"Authorization: Bearer {{{secret}}}\"")
        })?;
        let name = http::HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| format!("`{}` is not a valid header name", name.trim()))?;
        let value = value.trim();
        let placeholder = format!("{{{secret}}}");
        let Some((before, after)) = value.split_once(&placeholder) else {
            return Err(format!(
                "the value must contain {placeholder} where the secret goes"
            ));
        };
        if after.contains(&placeholder) {
            return Err(format!("the value holds {placeholder} more than once"));
        }
        if http::HeaderValue::from_str(&value.replace(&placeholder, "x")).is_err() {
            return Err("the value holds characters a header cannot carry".into());
        }
        Ok(HeaderTemplate {
            name,
            before: before.to_owned(),
            after: after.to_owned(),
        })
    }

    /// The header's name, lowercase.
    pub fn name(&self) -> &http::HeaderName {
        &self.name
    }

    /// The header's value with `secret` in place.
    pub fn render(&self, secret: &str) -> String {
        format!("{}{secret}{}", self.before, self.after)
    }
}

/// A path prefix the host puts in front of the path of requests that carry a secret, for
/// APIs that want the credential in the URL (`/bot{TOKEN}` before Telegram's
/// `/getUpdates`): the guest asks for the path without it, and never holds the value.
///
/// ```
/// use capstan_host::secrets::PathTemplate;
///
/// let prefix = PathTemplate::parse("/bot{TOKEN}", "TOKEN").unwrap();
/// assert_eq!(prefix.render("123:abc"), "/bot123:abc");
/// assert_eq!(prefix.render("a b/c"), "/bota%20b%2Fc");
/// assert!(PathTemplate::parse("bot{TOKEN}", "TOKEN").is_err());
/// assert!(PathTemplate::parse("/bot?{TOKEN}", "TOKEN").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    before: String,
    after: String,
}

impl PathTemplate {
    /// Parses `/prefix{SECRET}rest`: it starts with `/`, holds `{secret}` exactly once,
    /// and otherwise only what a path may carry unencoded.
    pub fn parse(text: &str, secret: &str) -> Result<Self, String> {
        let placeholder = format!("{{{secret}}}");
        if !text.starts_with('/') {
            return Err(format!(
                "the prefix starts with `/`, e.g. \"/bot{placeholder}\""
            ));
        }
        let Some((before, after)) = text.split_once(&placeholder) else {
            return Err(format!(
                "the prefix must contain {placeholder} where the secret goes"
            ));
        };
        if after.contains(&placeholder) {
            return Err(format!("the prefix holds {placeholder} more than once"));
        }
        let plain = |part: &str| part.bytes().all(|b| is_path_byte(b) || b == b'/');
        if !plain(before) || !plain(after) {
            return Err(
                "the prefix may hold only letters, digits, `/` and `-._~:@!$&'()*+,;=`".into(),
            );
        }
        Ok(PathTemplate {
            before: before.to_owned(),
            after: after.trim_end_matches('/').to_owned(),
        })
    }

    /// The prefix with `secret` in place, [encoded](PathTemplate::encode). It never ends
    /// in `/`: the request's own path follows.
    pub fn render(&self, secret: &str) -> String {
        format!("{}{}{}", self.before, Self::encode(secret), self.after)
    }

    /// `value` as a path segment carries it: each byte a segment may not carry as is,
    /// percent-encoded.
    ///
    /// ```
    /// use capstan_host::secrets::PathTemplate;
    ///
    /// assert_eq!(PathTemplate::encode("123:abc"), "123:abc");
    /// assert_eq!(PathTemplate::encode("a/b c"), "a%2Fb%20c");
    /// ```
    pub fn encode(value: &str) -> std::borrow::Cow<'_, str> {
        if value.bytes().all(is_path_byte) {
            return std::borrow::Cow::Borrowed(value);
        }
        let mut out = String::with_capacity(value.len() * 3);
        for b in value.bytes() {
            if is_path_byte(b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        std::borrow::Cow::Owned(out)
    }
}

/// Whether `b` may stand in a path segment as is (RFC 3986's `pchar` less `%`).
fn is_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&b)
}

/// One `[secrets.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretSpec {
    /// Its name.
    pub name: SecretName,
    /// Where its value comes from.
    pub source: SecretSource,
    /// The requests it may be injected into; a request to another host never carries it.
    pub hosts: Vec<NetRule>,
    /// The header it is injected in.
    pub header: Option<HeaderTemplate>,
    /// The path prefix it is injected as. With neither a header nor a prefix it is only
    /// used to sign (`hmac-sha256`).
    pub path_prefix: Option<PathTemplate>,
}

impl SecretSpec {
    /// Whether the secret may be sent with a request to `target`.
    pub fn bound_to(&self, target: &NetTarget) -> bool {
        self.hosts.iter().any(|rule| rule.allows(target))
    }
}
