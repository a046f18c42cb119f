//! Network rules: the hosts a `net:` capability names, and the requests they allow.
//!
//! A rule is `[METHOD ][SCHEME://]HOST[:PORT]`:
//!
//! | part | forms | absent |
//! |---|---|---|
//! | method | `GET`, `POST`, ... (one token, any case) | any method |
//! | scheme | `https://`, `http://`, `*://` (either) | `https` only |
//! | host | `api.example.com`, `127.0.0.1`, `[::1]` (exactly), `*.example.com` (its public subdomains, not itself), `*` (any public host), `{loopback}`, `{private}`, `{link-local}`, `{unique-local}`, `{internal}` (an [`AddressRange`]) | required |
//! | port | `8443`, `*` (any) | the scheme's default port (443 for https, 80 for http) |
//!
//! So the rule `*` on its own is `https://*:443`: any public host, over https, on its
//! default port. Everything wider is spelled out: `*://*:*` is any public host, scheme and
//! port. Host names are ASCII: write an internationalized name in its `xn--` form, as the
//! host compares requests after converting them to that form.
//!
//! Wildcards reach public addresses only. A loopback, private, link-local or unique-local
//! address is reached by a rule naming its host or address exactly, or its range; a cloud
//! metadata or special-purpose address only by a rule naming it exactly
//! ([`NetRule::covers`]). The host asks this of both the tool's declaration and the
//! caller's grant.
//!
//! ```
//! use capstan_caps::{NetRule, NetTarget, TargetHost, Scheme};
//!
//! let rule: NetRule = "GET *.example.org:8443".parse().unwrap();
//! let target = NetTarget {
//!     method: "GET".into(),
//!     scheme: Scheme::Https,
//!     host: TargetHost::Name("api.example.org".into()),
//!     port: 8443,
//! };
//! assert!(rule.allows(&target));
//! assert!(!rule.allows(&NetTarget { method: "POST".into(), ..target.clone() }));
//! assert!(!rule.allows(&NetTarget { port: 443, ..target }));
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use crate::{AddressClass, AddressRange};

/// A request's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scheme {
    /// `http`: only where a rule says `http://` or `*://`.
    Http,
    /// `https`.
    Https,
}

impl Scheme {
    /// The port a URL of this scheme means when it names none.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The host of a request, in canonical form: a lowercase ASCII name without a trailing
/// dot, or an address (an IPv4-mapped IPv6 address is its IPv4 address).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetHost {
    /// A DNS name.
    Name(String),
    /// An address literal.
    Ip(IpAddr),
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Name(name) => f.write_str(name),
            TargetHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            TargetHost::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// One request as rules see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetTarget {
    /// The method, uppercase.
    pub method: String,
    /// The scheme.
    pub scheme: Scheme,
    /// The host, canonical.
    pub host: TargetHost,
    /// The port (the scheme's default when the URL names none).
    pub port: u16,
}

impl fmt::Display for NetTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}://{}:{}",
            self.method, self.scheme, self.host, self.port
        )
    }
}

/// Which schemes a rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SchemeRule {
    /// `https` only (a rule without a scheme).
    Https,
    /// `http` only.
    Http,
    /// Either.
    Any,
}

impl SchemeRule {
    fn allows(self, scheme: Scheme) -> bool {
        matches!(
            (self, scheme),
            (SchemeRule::Any, _)
                | (SchemeRule::Https, Scheme::Https)
                | (SchemeRule::Http, Scheme::Http)
        )
    }

    fn intersect(self, other: SchemeRule) -> Option<SchemeRule> {
        match (self, other) {
            (SchemeRule::Any, x) | (x, SchemeRule::Any) => Some(x),
            (a, b) if a == b => Some(a),
            _ => None,
        }
    }

    /// The one scheme it allows, if one.
    fn only(self) -> Option<Scheme> {
        match self {
            SchemeRule::Https => Some(Scheme::Https),
            SchemeRule::Http => Some(Scheme::Http),
            SchemeRule::Any => None,
        }
    }
}

/// Which ports a rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortRule {
    /// No port given: the scheme's default (443 for https, 80 for http).
    Default,
    /// One port.
    Is(u16),
    /// `:*`: any port.
    Any,
}

impl PortRule {
    fn allows(self, scheme: Scheme, port: u16) -> bool {
        match self {
            PortRule::Default => port == scheme.default_port(),
            PortRule::Is(rule) => rule == port,
            PortRule::Any => true,
        }
    }
}

/// Which hosts a rule allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostRule {
    /// `*`: any host at a public address.
    Any,
    /// `*.example.com`: the subdomains of `example.com` (stored without `*.`), not itself,
    /// at public addresses.
    Subdomains(String),
    /// One name, wherever it resolves.
    Name(String),
    /// One address.
    Ip(IpAddr),
    /// `{internal}`: any host, at an address of the range.
    Range(AddressRange),
}

impl HostRule {
    /// Whether a request naming `host` may go on to have its addresses checked
    /// ([`HostRule::covers`]).
    fn allows(&self, host: &TargetHost) -> bool {
        match (self, host) {
            (HostRule::Any, TargetHost::Name(_)) => true,
            (HostRule::Any, TargetHost::Ip(ip)) => AddressClass::of(*ip).is_public(),
            (HostRule::Subdomains(suffix), TargetHost::Name(name)) => is_subdomain(name, suffix),
            (HostRule::Name(rule), TargetHost::Name(name)) => rule == name,
            (HostRule::Ip(rule), TargetHost::Ip(ip)) => rule == ip,
            (HostRule::Range(_), TargetHost::Name(_)) => true,
            (HostRule::Range(range), TargetHost::Ip(ip)) => range.contains(AddressClass::of(*ip)),
            _ => false,
        }
    }

    /// Whether an address of `class` is one this host part reaches: a wildcard only a
    /// public one, a range its own, an exact name any but a metadata or special-purpose
    /// one (a name's DNS may change), an exact address itself.
    fn covers(&self, class: AddressClass) -> bool {
        match self {
            HostRule::Any | HostRule::Subdomains(_) => class.is_public(),
            HostRule::Name(_) => {
                !matches!(class, AddressClass::CloudMetadata | AddressClass::Special)
            }
            HostRule::Ip(_) => true,
            HostRule::Range(range) => range.contains(class),
        }
    }

    fn intersect(&self, other: &HostRule) -> Option<HostRule> {
        match (self, other) {
            (HostRule::Range(a), HostRule::Range(b)) => a.intersect(*b).map(HostRule::Range),
            // Public wildcards and ranges share no address.
            (HostRule::Range(_), HostRule::Any | HostRule::Subdomains(_))
            | (HostRule::Any | HostRule::Subdomains(_), HostRule::Range(_)) => None,
            (HostRule::Range(range), HostRule::Ip(ip))
            | (HostRule::Ip(ip), HostRule::Range(range)) => range
                .contains(AddressClass::of(*ip))
                .then_some(HostRule::Ip(*ip)),
            (HostRule::Range(_), HostRule::Name(name))
            | (HostRule::Name(name), HostRule::Range(_)) => Some(HostRule::Name(name.clone())),
            (HostRule::Any, HostRule::Ip(ip)) | (HostRule::Ip(ip), HostRule::Any) => {
                AddressClass::of(*ip)
                    .is_public()
                    .then_some(HostRule::Ip(*ip))
            }
            (HostRule::Any, x) | (x, HostRule::Any) => Some(x.clone()),
            (HostRule::Subdomains(a), HostRule::Subdomains(b)) => {
                if a == b || is_subdomain(a, b) {
                    Some(self.clone())
                } else if is_subdomain(b, a) {
                    Some(other.clone())
                } else {
                    None
                }
            }
            (HostRule::Subdomains(suffix), HostRule::Name(name))
            | (HostRule::Name(name), HostRule::Subdomains(suffix)) => {
                is_subdomain(name, suffix).then(|| HostRule::Name(name.clone()))
            }
            (a, b) => (a == b).then(|| a.clone()),
        }
    }
}

impl HostRule {
    /// Whether every address a request allowed by `other` may reach, `self` allows too:
    /// a wildcard reaches only public addresses and an exact name any but a metadata one,
    /// so `*` holds `*.example.com` but not `api.example.com`.
    fn contains(&self, other: &HostRule) -> bool {
        match (self, other) {
            (HostRule::Any, HostRule::Any | HostRule::Subdomains(_)) => true,
            (HostRule::Any, HostRule::Ip(ip)) => AddressClass::of(*ip).is_public(),
            (HostRule::Subdomains(wide), HostRule::Subdomains(narrow)) => {
                wide == narrow || is_subdomain(narrow, wide)
            }
            (HostRule::Range(wide), HostRule::Range(narrow)) => {
                wide == narrow || *wide == AddressRange::Internal
            }
            (HostRule::Range(range), HostRule::Ip(ip)) => range.contains(AddressClass::of(*ip)),
            (HostRule::Name(a), HostRule::Name(b)) => a == b,
            (HostRule::Ip(a), HostRule::Ip(b)) => a == b,
            _ => false,
        }
    }
}

/// Whether `name` is a strict subdomain of `suffix`.
fn is_subdomain(name: &str, suffix: &str) -> bool {
    name.strip_suffix(suffix)
        .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

/// One `net:` rule: which method, scheme, host and port a request may use.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetRule {
    /// `None`: any method.
    pub method: Option<String>,
    /// The schemes allowed.
    pub scheme: SchemeRule,
    /// The hosts allowed.
    pub host: HostRule,
    /// The ports allowed.
    pub port: PortRule,
}

impl NetRule {
    /// The rule `*`: any public host over https on port 443.
    pub fn public_https() -> Self {
        NetRule {
            method: None,
            scheme: SchemeRule::Https,
            host: HostRule::Any,
            port: PortRule::Default,
        }
    }

    /// The rule `*://*:*`: any public host, either scheme, any port.
    pub fn any_public() -> Self {
        NetRule {
            method: None,
            scheme: SchemeRule::Any,
            host: HostRule::Any,
            port: PortRule::Any,
        }
    }

    /// Whether this rule allows `target` by its method, scheme, host and port. Where the
    /// host is a name, the addresses it resolves to are asked of [`NetRule::covers`].
    pub fn allows(&self, target: &NetTarget) -> bool {
        self.method
            .as_ref()
            .is_none_or(|method| *method == target.method)
            && self.scheme.allows(target.scheme)
            && self.host.allows(&target.host)
            && self.port.allows(target.scheme, target.port)
    }

    /// Whether this rule allows `target` connecting to an address of `class`: it allows
    /// the target, and a wildcard host reaches public addresses only, a range its own, an
    /// exact name any but a cloud metadata or special-purpose address, an exact address
    /// itself.
    ///
    /// ```
    /// use capstan_caps::{AddressClass, NetRule, NetTarget, Scheme, TargetHost};
    ///
    /// let target = NetTarget {
    ///     method: "GET".into(),
    ///     scheme: Scheme::Https,
    ///     host: TargetHost::Name("intranet.example.com".into()),
    ///     port: 443,
    /// };
    /// let any: NetRule = "*".parse().unwrap();
    /// let exact: NetRule = "intranet.example.com".parse().unwrap();
    /// assert!(any.covers(&target, AddressClass::Public));
    /// assert!(!any.covers(&target, AddressClass::Private));
    /// assert!(exact.covers(&target, AddressClass::Private));
    /// ```
    pub fn covers(&self, target: &NetTarget, class: AddressClass) -> bool {
        self.allows(target) && self.host.covers(class)
    }

    /// Whether the rule names one host or address rather than a pattern or a range.
    pub fn names_host_exactly(&self) -> bool {
        matches!(self.host, HostRule::Name(_) | HostRule::Ip(_))
    }

    /// Whether every request `other` allows, `self` allows too, to the same addresses:
    /// what tells a narrowed declaration from a widened one. Stricter than overlapping
    /// ([`NetRule::intersect`]): a wildcard reaches public addresses only, so `*` does not
    /// hold `localhost`, and `{internal}` does not hold a name.
    ///
    /// ```
    /// use capstan_caps::NetRule;
    ///
    /// let rule = |text: &str| text.parse::<NetRule>().unwrap();
    /// assert!(rule("*.example.com").contains(&rule("*.api.example.com")));
    /// assert!(rule("*://*:*").contains(&rule("https://*.example.com")));
    /// assert!(!rule("*://*:*").contains(&rule("http://localhost:80")));
    /// assert!(!rule("*://{internal}:*").contains(&rule("http://attack.example")));
    /// assert!(!rule("GET api.example.com").contains(&rule("api.example.com")));
    /// ```
    pub fn contains(&self, other: &NetRule) -> bool {
        let method = match (&self.method, &other.method) {
            (None, _) => true,
            (Some(a), Some(b)) => a == b,
            (Some(_), None) => false,
        };
        let scheme = self.scheme == SchemeRule::Any || self.scheme == other.scheme;
        let port = self.port == PortRule::Any || self.port == other.port;
        method && scheme && port && self.host.contains(&other.host)
    }

    /// The requests both rules allow, as one rule; `None` if there are none.
    ///
    /// ```
    /// use capstan_caps::NetRule;
    ///
    /// let declared: NetRule = "*://{loopback}:*".parse().unwrap();
    /// let granted: NetRule = "http://127.0.0.1:8080".parse().unwrap();
    /// assert_eq!(declared.intersect(&granted), Some(granted.clone()));
    /// let public: NetRule = "*".parse().unwrap();
    /// assert_eq!(public.intersect(&granted), None, "`*` is https on 443 to public hosts");
    /// ```
    pub fn intersect(&self, other: &NetRule) -> Option<NetRule> {
        let method = match (&self.method, &other.method) {
            (None, m) | (m, None) => m.clone(),
            (Some(a), Some(b)) if a == b => Some(a.clone()),
            _ => return None,
        };
        let mut scheme = self.scheme.intersect(other.scheme)?;
        let host = self.host.intersect(&other.host)?;
        let port = match (self.port, other.port) {
            (PortRule::Any, p) | (p, PortRule::Any) => p,
            (a, b) if a == b => a,
            (PortRule::Default, PortRule::Is(port)) | (PortRule::Is(port), PortRule::Default) => {
                // The one scheme whose default port it is, if the rules allow it.
                let only = [Scheme::Https, Scheme::Http]
                    .into_iter()
                    .find(|s| s.default_port() == port && scheme.allows(*s))?;
                scheme = match only {
                    Scheme::Https => SchemeRule::Https,
                    Scheme::Http => SchemeRule::Http,
                };
                PortRule::Default
            }
            _ => return None,
        };
        Some(NetRule {
            method,
            scheme,
            host,
            port,
        })
    }
}

impl fmt::Display for NetRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == NetRule::public_https() {
            return f.write_str("*");
        }
        if let Some(method) = &self.method {
            write!(f, "{method} ")?;
        }
        match self.scheme {
            SchemeRule::Https => {}
            SchemeRule::Http => f.write_str("http://")?,
            SchemeRule::Any => f.write_str("*://")?,
        }
        match &self.host {
            HostRule::Any => f.write_str("*")?,
            HostRule::Subdomains(suffix) => write!(f, "*.{suffix}")?,
            HostRule::Name(name) => f.write_str(name)?,
            HostRule::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]")?,
            HostRule::Ip(ip) => write!(f, "{ip}")?,
            HostRule::Range(range) => write!(f, "{range}")?,
        }
        match self.port {
            PortRule::Default => Ok(()),
            PortRule::Is(port) => write!(f, ":{port}"),
            PortRule::Any => f.write_str(":*"),
        }
    }
}

impl NetRule {
    /// The rule with every part spelled out, as `capstan policy` prints it:
    /// `"*"` is `any method https://* (public addresses):443`.
    ///
    /// ```
    /// use capstan_caps::NetRule;
    ///
    /// let rule: NetRule = "*".parse().unwrap();
    /// assert_eq!(rule.expanded(), "any method, https, any public host, port 443");
    /// let rule: NetRule = "GET *://{loopback}".parse().unwrap();
    /// assert_eq!(rule.expanded(), "GET, http or https, any loopback address, port 80 (http) or 443 (https)");
    /// ```
    pub fn expanded(&self) -> String {
        let method = self.method.as_deref().unwrap_or("any method");
        let scheme = match self.scheme {
            SchemeRule::Https => "https",
            SchemeRule::Http => "http",
            SchemeRule::Any => "http or https",
        };
        let host = match &self.host {
            HostRule::Any => "any public host".to_owned(),
            HostRule::Subdomains(suffix) => format!("subdomains of {suffix} at public addresses"),
            HostRule::Name(name) => format!("{name} (any address it resolves to)"),
            HostRule::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            HostRule::Ip(ip) => ip.to_string(),
            HostRule::Range(AddressRange::Internal) => {
                "any loopback, private, link-local or unique-local address".to_owned()
            }
            HostRule::Range(range) => format!("any {} address", range.as_str()),
        };
        let port = match (self.port, self.scheme.only()) {
            (PortRule::Default, Some(scheme)) => format!("port {}", scheme.default_port()),
            (PortRule::Default, None) => "port 80 (http) or 443 (https)".to_owned(),
            (PortRule::Is(port), _) => format!("port {port}"),
            (PortRule::Any, _) => "any port".to_owned(),
        };
        format!("{method}, {scheme}, {host}, {port}")
    }
}

/// A `net:` rule that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseNetRuleError {
    /// The text given.
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for ParseNetRuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad network rule `{}`: {}; a rule is [METHOD ][https://|http://|*://]HOST[:PORT], \
             e.g. \"api.example.com\", \"GET *.example.org:8443\", \"http://127.0.0.1:8080\"",
            self.text.escape_debug(),
            self.reason
        )
    }
}

impl std::error::Error for ParseNetRuleError {}

/// The longest rule text accepted: a host name is at most 253 bytes.
const MAX_RULE_LEN: usize = 300;

impl FromStr for NetRule {
    type Err = ParseNetRuleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| ParseNetRuleError {
            text: text.chars().take(80).collect(),
            reason: reason.to_owned(),
        };
        if text.len() > MAX_RULE_LEN {
            return Err(err("longer than any host name"));
        }
        if !text.is_ascii() {
            return Err(err(
                "not ASCII; write an internationalized host name in its xn-- form",
            ));
        }
        let text = text.trim();
        if text == "*" {
            return Ok(NetRule::public_https());
        }
        let (method, rest) = match text.split_once(' ') {
            Some((method, rest)) => (Some(parse_method(method).map_err(&err)?), rest.trim()),
            None => (None, text),
        };
        let (scheme, rest) = if let Some(rest) = rest.strip_prefix("https://") {
            (SchemeRule::Https, rest)
        } else if let Some(rest) = rest.strip_prefix("http://") {
            (SchemeRule::Http, rest)
        } else if let Some(rest) = rest.strip_prefix("*://") {
            (SchemeRule::Any, rest)
        } else if rest.contains("://") {
            return Err(err("the scheme must be https, http or *"));
        } else {
            (SchemeRule::Https, rest)
        };
        if rest.contains(['/', '?', '#', '@', ' ']) {
            return Err(err(
                "a rule names a host and port, without a path, query or user name",
            ));
        }
        if text.contains("{") && !rest.starts_with('{') {
            return Err(err(
                "an address range stands in place of the host: http://{loopback}:8080",
            ));
        }
        let (host, port) = split_host_port(rest).map_err(&err)?;
        let host = parse_host(host).map_err(&err)?;
        let port = match port {
            None => PortRule::Default,
            Some("*") => PortRule::Any,
            Some(port) => {
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| err("the port must be 1 to 65535 or *"))?;
                // `https://x:443` is `x`; `*://x:443` stays one port for either scheme.
                match scheme.only() {
                    Some(only) if only.default_port() == port => PortRule::Default,
                    _ => PortRule::Is(port),
                }
            }
        };
        Ok(NetRule {
            method,
            scheme,
            host,
            port,
        })
    }
}

/// The methods a rule may name.
pub const METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT",
];

fn parse_method(method: &str) -> Result<String, &'static str> {
    let upper = method.to_ascii_uppercase();
    if METHODS.contains(&upper.as_str()) {
        Ok(upper)
    } else {
        Err(
            "the method must be one of GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, CONNECT",
        )
    }
}

/// Splits `host[:port]`, where an IPv6 host is in brackets.
fn split_host_port(text: &str) -> Result<(&str, Option<&str>), &'static str> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address needs its closing `]`")?;
        return match after {
            "" => Ok((text[..host.len() + 2].as_ref(), None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((&text[..host.len() + 2], Some(port))),
                None => Err("only `:PORT` may follow an IPv6 address"),
            },
        };
    }
    match text.split_once(':') {
        Some((_, port)) if port.contains(':') => {
            Err("an IPv6 address must be written in brackets, like [::1]:8080")
        }
        Some((host, port)) => Ok((host, Some(port))),
        None => Ok((text, None)),
    }
}

fn parse_host(host: &str) -> Result<HostRule, &'static str> {
    if host.is_empty() {
        return Err("the host is missing");
    }
    if host == "*" {
        return Ok(HostRule::Any);
    }
    if let Some(range) = host.strip_prefix('{').and_then(|h| h.strip_suffix('}')) {
        return range.parse().map(HostRule::Range).map_err(|_| {
            "an address range is {loopback}, {private}, {link-local}, {unique-local} or {internal}"
        });
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let ip: Ipv6Addr = inner.parse().map_err(|_| "not a valid IPv6 address")?;
        return Ok(HostRule::Ip(canonical_ip(IpAddr::V6(ip))));
    }
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let (wildcard, name) = match host.strip_prefix("*.") {
        Some(name) => (true, name),
        None => (false, host.as_str()),
    };
    check_name(name)?;
    let last = name.rsplit('.').next().unwrap_or(name);
    if last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x") {
        if wildcard {
            return Err("a wildcard applies to names, not addresses");
        }
        let ip: Ipv4Addr = name
            .parse()
            .map_err(|_| "not a valid IPv4 address; write it as four decimal numbers")?;
        return Ok(HostRule::Ip(IpAddr::V4(ip)));
    }
    Ok(if wildcard {
        HostRule::Subdomains(name.to_owned())
    } else {
        HostRule::Name(name.to_owned())
    })
}

/// Letters, digits, `-` and `_` in dot-separated labels of 1 to 63 bytes.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.len() > 253 {
        return Err("a host name is at most 253 characters");
    }
    let valid_label = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.split('.').all(valid_label) {
        Ok(())
    } else {
        Err("a host is a name of letters, digits, `-` and `.`, an address, `*` or `*.NAME`")
    }
}

/// An address as rules and requests compare it: IPv4-mapped IPv6 as IPv4.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> NetRule {
        text.parse().unwrap_or_else(|err| panic!("{err}"))
    }

    fn target(text: &str) -> NetTarget {
        // "METHOD scheme host port"
        let parts: Vec<&str> = text.split(' ').collect();
        let host = parts[2];
        let host = match host.trim_matches(['[', ']']).parse::<IpAddr>() {
            Ok(ip) => TargetHost::Ip(canonical_ip(ip)),
            Err(_) => TargetHost::Name(host.into()),
        };
        NetTarget {
            method: parts[0].into(),
            scheme: if parts[1] == "http" {
                Scheme::Http
            } else {
                Scheme::Https
            },
            host,
            port: parts[3].parse().unwrap(),
        }
    }

    #[test]
    fn rules_round_trip_through_their_canonical_text() {
        for (given, canonical) in [
            ("*", "*"),
            ("api.example.com", "api.example.com"),
            ("API.Example.COM.", "api.example.com"),
            ("https://api.example.com:443", "api.example.com"),
            ("*.example.org:443", "*.example.org"),
            ("*.example.org:8443", "*.example.org:8443"),
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://localhost", "http://localhost"),
            ("get api.example.com", "GET api.example.com"),
            ("[::1]:9000", "[::1]:9000"),
            ("[::ffff:127.0.0.1]", "127.0.0.1"),
            ("*://example.com", "*://example.com"),
            ("*://example.com:443", "*://example.com:443"),
            ("example.com:*", "example.com:*"),
            ("https://*:443", "*"),
            ("*://*:*", "*://*:*"),
            ("http://{loopback}:*", "http://{loopback}:*"),
            ("GET {internal}:8443", "GET {internal}:8443"),
        ] {
            let parsed = rule(given);
            assert_eq!(parsed.to_string(), canonical, "{given}");
            assert_eq!(rule(canonical), parsed, "{canonical}");
        }
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        for (bad, says) in [
            ("", "missing"),
            ("ftp://x.org", "scheme"),
            ("x.org/path", "path"),
            ("user@x.org", "user"),
            ("x.org:0", "port"),
            ("x.org:70000", "port"),
            ("::1", "brackets"),
            ("[::1", "closing"),
            ("[zz]", "IPv6"),
            ("127.1", "four decimal"),
            ("0x7f.0.0.1", "four decimal"),
            ("2130706433", "four decimal"),
            ("*.10.0.0.1", "wildcard"),
            ("bücher.de", "xn--"),
            ("a..b", "letters"),
            ("GE/T x.org", "method"),
            ("x.org extra", "method"),
            ("{intranet}", "address range"),
            ("*.{private}", "in place of the host"),
        ] {
            let err = bad.parse::<NetRule>().unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn rules_allow_only_what_they_name() {
        let r = rule("api.example.com");
        assert!(r.allows(&target("GET https api.example.com 443")));
        assert!(
            !r.allows(&target("GET http api.example.com 80")),
            "http needs http://"
        );
        assert!(!r.allows(&target("GET https api.example.com 8443")));
        assert!(!r.allows(&target("GET https evil.com 443")));
        assert!(!r.allows(&target("GET https api.example.com.evil.com 443")));

        let w = rule("*.example.com");
        assert!(w.allows(&target("POST https a.b.example.com 443")));
        assert!(!w.allows(&target("POST https example.com 443")));
        assert!(!w.allows(&target("POST https badexample.com 443")));

        let any = rule("*");
        assert!(any.allows(&target("DELETE https x.org 443")));
        assert!(
            !any.allows(&target("GET http x.org 80")),
            "`*` is https only"
        );
        assert!(
            !any.allows(&target("GET https x.org 8443")),
            "`*` is port 443 only"
        );
        assert!(
            !any.allows(&target("GET https 10.0.0.1 443")),
            "`*` is public only"
        );
        assert!(!any.names_host_exactly());
        let wide = rule("*://*:*");
        assert!(wide.allows(&target("DELETE http 8.8.8.8 22")));
        assert!(!wide.allows(&target("DELETE http 10.0.0.1 22")));

        let either = rule("*://x.org");
        assert!(either.allows(&target("GET http x.org 80")));
        assert!(either.allows(&target("GET https x.org 443")));
        assert!(
            !either.allows(&target("GET http x.org 443")),
            "no port: the scheme's own"
        );
        assert!(!either.allows(&target("GET https x.org 8443")));

        let loopback = rule("http://{loopback}:*");
        assert!(loopback.allows(&target("GET http 127.0.0.1 6379")));
        assert!(!loopback.allows(&target("GET http 10.0.0.1 6379")));
        assert!(!loopback.allows(&target("GET http 8.8.8.8 6379")));
        assert!(
            loopback.allows(&target("GET http localhost 6379")),
            "addresses decide"
        );
        let named = target("GET http localhost 6379");
        assert!(loopback.covers(&named, AddressClass::Loopback));
        let exact = rule("http://localhost:6379");
        assert!(exact.covers(&named, AddressClass::Private));
        assert!(
            !exact.covers(&named, AddressClass::CloudMetadata),
            "a name whose DNS turns to a metadata address does not reach it"
        );
        assert!(!loopback.covers(&named, AddressClass::Private));
        assert!(!loopback.covers(&named, AddressClass::Public));

        let ip = rule("http://127.0.0.1:8080");
        assert!(ip.allows(&target("GET http 127.0.0.1 8080")));
        assert!(ip.allows(&target("GET http [::ffff:127.0.0.1] 8080")));
        assert!(!ip.allows(&target("GET http 127.0.0.2 8080")));
        assert!(!ip.allows(&target("GET http localhost 8080")));
        assert!(ip.names_host_exactly());

        let get = rule("GET *://x.org:*");
        assert!(get.allows(&target("GET http x.org 1234")));
        assert!(!get.allows(&target("PUT https x.org 443")));
    }

    #[test]
    fn intersections_allow_exactly_what_both_allow() {
        let cases = [
            ("*", "api.example.com", Some("api.example.com")),
            ("*.example.com", "api.example.com", Some("api.example.com")),
            ("*.example.com", "*.a.example.com", Some("*.a.example.com")),
            ("*.example.com", "example.com", None),
            ("*.example.com", "*.example.org", None),
            ("GET *", "POST x.org", None),
            ("GET *", "x.org", Some("GET x.org")),
            ("http://x.org", "x.org", None),
            ("*://x.org", "http://x.org:81", None),
            ("*://x.org:*", "http://x.org:81", Some("http://x.org:81")),
            ("*://x.org", "x.org:443", Some("x.org")),
            ("*://x.org", "*://x.org:80", Some("http://x.org")),
            ("*://x.org", "http://x.org", Some("http://x.org")),
            ("x.org:*", "x.org:8443", Some("x.org:8443")),
            ("10.0.0.1", "*", None),
            ("8.8.8.8", "*", Some("8.8.8.8")),
            ("*", "http://127.0.0.1:8080", None),
            ("*://*:*", "http://{loopback}:*", None),
            (
                "*://{internal}:*",
                "http://127.0.0.1:8080",
                Some("http://127.0.0.1:8080"),
            ),
            ("*://{private}:*", "http://127.0.0.1:8080", None),
            (
                "*://{internal}:*",
                "http://{loopback}:*",
                Some("http://{loopback}:*"),
            ),
            ("{loopback}", "{private}", None),
            (
                "*://{internal}:*",
                "http://localhost:6379",
                Some("http://localhost:6379"),
            ),
        ];
        for (a, b, want) in cases {
            let got = rule(a).intersect(&rule(b)).map(|r| r.to_string());
            assert_eq!(got.as_deref(), want, "{a} ∩ {b}");
            let back = rule(b).intersect(&rule(a)).map(|r| r.to_string());
            assert_eq!(back, got, "{b} ∩ {a} is symmetric");
        }
    }
}
