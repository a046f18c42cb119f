//! The decision on one request: which rule allows it, or why none does and what would.

use std::fmt;
use std::net::IpAddr;

use capstan_caps::{Capability, HostRule, NetRule, NetTarget, SchemeRule, TargetHost};

use super::AddressClass;
use crate::policy::{ProcessKind, Profile};

/// Where a call's network grant comes from, to say what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantSource {
    /// A process kind's profile, and whether the tool's own `[profiles.KIND.tool.NAME]`
    /// narrows it.
    Profile {
        /// The kind, e.g. `worker`.
        kind: String,
        /// The tool, when it has narrower grants of its own.
        narrowed_for: Option<String>,
    },
    /// `capstan tool call --grant`.
    Flag,
    /// The URL of `[mcp.NAME]`, the one place an MCP server at a URL may be reached.
    McpServer {
        /// The server's name.
        name: String,
    },
}

impl GrantSource {
    /// The grant of tool `tool` in `kind`'s profile: narrowed if the profile has a
    /// `[profiles.KIND.tool.NAME]` table for it.
    pub fn profile(kind: ProcessKind, profile: &Profile, tool: &str) -> Self {
        GrantSource::Profile {
            kind: kind.to_string(),
            narrowed_for: profile
                .tool_grants()
                .contains_key(tool)
                .then(|| tool.to_owned()),
        }
    }

    /// Where a rule would be added: "`net` in [profiles.worker] of capstan.toml".
    pub fn place(&self) -> String {
        match self {
            GrantSource::Profile {
                kind,
                narrowed_for: None,
            } => format!("`net` in [profiles.{kind}] of capstan.toml"),
            GrantSource::Profile {
                kind,
                narrowed_for: Some(tool),
            } => format!(
                "`net` in [profiles.{kind}] and in [profiles.{kind}.tool.{tool}] of capstan.toml"
            ),
            GrantSource::Flag => "--grant".to_owned(),
            GrantSource::McpServer { name } => format!("`url` in [mcp.{name}] of capstan.toml"),
        }
    }
}

/// The network a call holds: the rules it runs with (each both declared by the tool and
/// granted to the caller) and, to explain a refusal, the two sides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetScope {
    /// The tool's name.
    pub tool: String,
    /// Declared and granted: a request must match one of these.
    pub effective: Vec<NetRule>,
    /// What the tool declares.
    pub declared: Vec<NetRule>,
    /// What the caller was granted (for this tool).
    pub granted: Vec<NetRule>,
    /// Where the grant comes from.
    pub source: GrantSource,
}

/// A request the host did not send, with what would allow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Which grant or limit refused it and why.
    pub reason: String,
    /// The change that would allow it.
    pub fix: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.reason, self.fix)
    }
}

impl NetScope {
    /// The scope of a call of `tool` that declares `declared` and runs with `effective`
    /// (declared and granted, see [`Grants::effective`](crate::policy::Grants::effective)),
    /// its caller granted `granted`; `None` when it holds no network rule.
    pub fn new<'a>(
        tool: &str,
        effective: &[Capability],
        declared: &[Capability],
        granted: impl IntoIterator<Item = &'a NetRule>,
        source: GrantSource,
    ) -> Option<NetScope> {
        let rules = |caps: &[Capability]| -> Vec<NetRule> {
            caps.iter()
                .filter_map(|cap| match cap {
                    Capability::Net(rule) => Some(rule.clone()),
                    _ => None,
                })
                .collect()
        };
        let effective = rules(effective);
        (!effective.is_empty()).then(|| NetScope {
            tool: tool.to_owned(),
            effective,
            declared: rules(declared),
            granted: granted.into_iter().cloned().collect(),
            source,
        })
    }

    /// The rule that allows `target`, or why none does.
    pub fn check(&self, target: &NetTarget) -> Result<&NetRule, Refusal> {
        if let Some(rule) = self.effective.iter().find(|rule| rule.allows(target)) {
            return Ok(rule);
        }
        let suggested = rule_for(target);
        if !self.declared.iter().any(|rule| rule.allows(target)) {
            return Err(Refusal {
                reason: format!(
                    "{target} is outside what tool `{}` declares (net: {})",
                    self.tool,
                    list(&self.declared)
                ),
                fix: "the plugin must declare it; a grant cannot widen a tool's declaration".into(),
            });
        }
        Err(Refusal {
            reason: format!(
                "{target} is not granted to this call (granted net: {})",
                list(&self.granted)
            ),
            fix: format!(
                "to allow it, add \"{suggested}\" to {}",
                self.source.place()
            ),
        })
    }

    /// Whether `target`, allowed by `rule`, may connect to `ip`: an address that is not
    /// public needs a *granted* rule naming the host or address exactly. A tool's own
    /// declaration never counts here: a plugin declaring `http://169.254.169.254` under a
    /// `*` grant does not reach the metadata service.
    pub fn check_address(
        &self,
        rule: &NetRule,
        target: &NetTarget,
        ip: IpAddr,
    ) -> Result<(), Refusal> {
        let class = AddressClass::of(ip);
        let named = self
            .granted
            .iter()
            .any(|grant| grant.names_host_exactly() && grant.allows(target));
        if class.is_public() || named {
            return Ok(());
        }
        let how = match &target.host {
            TargetHost::Name(name) => format!("{name} resolves to {ip}, {class}"),
            TargetHost::Ip(_) => format!("{ip} is {class}"),
        };
        Err(Refusal {
            reason: format!("{how}, which no grant names (the request matched \"{rule}\")"),
            fix: format!(
                "only a grant naming the host exactly (\"{}\" in {}) reaches private, \
                 loopback, link-local and metadata addresses",
                rule_for(target),
                self.source.place()
            ),
        })
    }
}

/// The narrowest rule allowing `target`.
pub fn rule_for(target: &NetTarget) -> NetRule {
    NetRule {
        method: None,
        scheme: match target.scheme {
            capstan_caps::Scheme::Http => SchemeRule::Http,
            capstan_caps::Scheme::Https => SchemeRule::Https,
        },
        host: match &target.host {
            TargetHost::Name(name) => HostRule::Name(name.clone()),
            TargetHost::Ip(ip) => HostRule::Ip(*ip),
        },
        port: Some(target.port),
    }
}

fn list(rules: &[NetRule]) -> String {
    if rules.is_empty() {
        return "none".into();
    }
    rules
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::target_of;

    fn scope(declared: &[&str], granted: &[&str]) -> NetScope {
        let parse =
            |rules: &[&str]| -> Vec<NetRule> { rules.iter().map(|r| r.parse().unwrap()).collect() };
        let (declared, granted) = (parse(declared), parse(granted));
        let effective = declared
            .iter()
            .flat_map(|d| granted.iter().filter_map(|g| d.intersect(g)))
            .collect();
        NetScope {
            tool: "http_request".into(),
            effective,
            declared,
            granted,
            source: GrantSource::Profile {
                kind: "worker".into(),
                narrowed_for: None,
            },
        }
    }

    fn target(url: &str) -> NetTarget {
        target_of(&http::Method::GET, &url.parse().unwrap()).unwrap()
    }

    #[test]
    fn a_refusal_names_the_grants_and_the_line_that_would_allow_it() {
        let scope = scope(&["*"], &["api.example.com"]);
        assert!(scope.check(&target("https://api.example.com/v1")).is_ok());
        let refusal = scope.check(&target("http://evil.com:8080/")).unwrap_err();
        let text = refusal.to_string();
        assert!(
            text.contains("GET http://evil.com:8080 is not granted"),
            "{text}"
        );
        assert!(text.contains("granted net: api.example.com"), "{text}");
        assert!(
            text.contains("add \"http://evil.com:8080\" to `net` in [profiles.worker]"),
            "{text}"
        );
    }

    #[test]
    fn a_declaration_limits_what_a_grant_allows() {
        let scope = scope(&["api.github.com"], &["*"]);
        let text = scope
            .check(&target("https://example.com/"))
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("outside what tool `http_request` declares"),
            "{text}"
        );
    }

    #[test]
    fn private_addresses_need_an_exact_grant() {
        let wildcard = scope(&["*"], &["*"]);
        let exact = scope(&["*"], &["http://127.0.0.1:8080"]);
        let any: NetRule = "*".parse().unwrap();
        let t = target("http://127.0.0.1:8080/");
        let ip = "127.0.0.1".parse().unwrap();
        let text = wildcard
            .check_address(&any, &t, ip)
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("127.0.0.1 is a loopback address, which no grant names"),
            "{text}"
        );
        assert!(exact.check_address(&any, &t, ip).is_ok());
        let named = target("https://internal.example.com/");
        let text = wildcard
            .check_address(&any, &named, "10.0.0.7".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("internal.example.com resolves to 10.0.0.7, a private address"),
            "{text}"
        );
        assert!(
            wildcard
                .check_address(&any, &named, "93.184.216.34".parse().unwrap())
                .is_ok()
        );
    }

    /// The operator grants `net = ["*"]` (documented: wildcards never reach private,
    /// loopback or metadata addresses). A plugin that *declares* the metadata address
    /// exactly gets an effective rule that "names the host exactly", so the wildcard
    /// grant reaches 169.254.169.254 after all.
    #[test]
    fn a_declared_exact_address_does_not_make_a_wildcard_grant_exact() {
        let scope = scope(&["http://169.254.169.254"], &["*"]);
        let t = target_of(
            &http::Method::GET,
            &"http://169.254.169.254/latest/meta-data/iam/"
                .parse()
                .unwrap(),
        )
        .unwrap();
        let rule = scope.check(&t).expect("declared and inside the wildcard");
        let ip = "169.254.169.254".parse().unwrap();
        assert!(
            scope.check_address(rule, &t, ip).is_err(),
            "the wildcard grant `*` reached the cloud metadata address via rule {rule}"
        );
    }

    /// The same with a name: a plugin declaring `http://localhost:6379` (or an internal
    /// name) under a `*` grant reaches loopback.
    #[test]
    fn a_declared_exact_name_does_not_let_a_wildcard_grant_reach_loopback() {
        let scope = scope(&["http://localhost:6379"], &["*"]);
        let t = target_of(
            &http::Method::POST,
            &"http://localhost:6379/".parse().unwrap(),
        )
        .unwrap();
        let rule = scope.check(&t).expect("declared and inside the wildcard");
        assert!(
            scope
                .check_address(rule, &t, "127.0.0.1".parse().unwrap())
                .is_err(),
            "the wildcard grant `*` reached loopback via rule {rule}"
        );
    }
}
