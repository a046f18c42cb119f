//! The decision on one request: which rule allows it, or why none does and what would.

use std::fmt;
use std::net::IpAddr;

use crate::policy::{ProcessKind, Profile};
use capstan_caps::{
    AddressClass, AddressRange, Capability, HostRule, NetRule, NetTarget, PortRule, SchemeRule,
    TargetHost,
};

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
    /// `net` in `[channels.NAME]`: what a messaging adapter may reach.
    Channel {
        /// The channel's name.
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

    /// `rule` as it is written where it would be added: `"api.example.com"` in a profile's
    /// `net` list, `net:api.example.com` in `--grant`.
    pub fn spell(&self, rule: &NetRule) -> String {
        match self {
            GrantSource::Flag => format!("net:{rule}"),
            _ => format!("\"{rule}\""),
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
            GrantSource::Channel { name } => format!("`net` in [channels.{name}] of capstan.toml"),
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

    /// The rule of the caller's grant (the config's text, never the tool's) that allows
    /// `target`: what the metrics count a request under.
    pub fn granted_rule(&self, target: &NetTarget) -> Option<&NetRule> {
        self.granted.iter().find(|rule| rule.allows(target))
    }

    /// The rule that allows `target`, or why none does, naming the half that refused:
    /// the tool's declaration or the caller's grant.
    pub fn check(&self, target: &NetTarget) -> Result<&NetRule, Refusal> {
        if let Some(rule) = self.effective.iter().find(|rule| rule.allows(target)) {
            return Ok(rule);
        }
        // An address that is not public is refused as the address check would say it.
        if let TargetHost::Ip(ip) = target.host
            && !AddressClass::of(ip).is_public()
            && let Err(refusal) = self.address_halves(target, ip, None)
        {
            return Err(refusal);
        }
        let suggested = rule_for(target);
        if !self.declared.iter().any(|rule| rule.allows(target)) {
            return Err(self.undeclared(format!("{target} is")));
        }
        if !self.granted.iter().any(|rule| rule.allows(target)) {
            return Err(Refusal {
                reason: format!(
                    "{target} is not granted to this call (granted net: {})",
                    list(&self.granted)
                ),
                fix: format!(
                    "to allow it, add {} to {}",
                    self.source.spell(&suggested),
                    self.source.place()
                ),
            });
        }
        // Each half allows it alone, but no rule of one meets a rule of the other.
        Err(Refusal {
            reason: format!(
                "{target} is allowed by the tool's declaration (net: {}) and by the grant (net: \
                 {}), but by no one rule of both",
                list(&self.declared),
                list(&self.granted)
            ),
            fix: format!(
                "add {} to {}, inside what the tool declares",
                self.source.spell(&suggested),
                self.source.place()
            ),
        })
    }

    /// Whether `target`, allowed by `rule`, may connect to `ip`. Both halves must reach
    /// the address by themselves: a rule of the tool's declaration and a rule of the
    /// caller's grant, each allowing the request and covering the address's class
    /// ([`NetRule::covers`]: wildcards only public addresses, a range its own, an exact
    /// host or address any). So a tool declaring `*` never reaches an internal address,
    /// whatever the caller grants, and a grant of `*` never lets a tool's own
    /// declaration of `http://169.254.169.254` reach the metadata service.
    pub fn check_address(
        &self,
        rule: &NetRule,
        target: &NetTarget,
        ip: IpAddr,
    ) -> Result<(), Refusal> {
        self.address_halves(target, ip, Some(rule))
    }

    /// Whether each half reaches `ip` for `target` (see [`NetScope::check_address`]);
    /// `matched` is the rule the request matched, when it did.
    fn address_halves(
        &self,
        target: &NetTarget,
        ip: IpAddr,
        matched: Option<&NetRule>,
    ) -> Result<(), Refusal> {
        let class = AddressClass::of(ip);
        let covers = |rules: &[NetRule]| rules.iter().any(|r| r.covers(target, class));
        let how = match &target.host {
            TargetHost::Name(name) => format!("{name} resolves to {ip}, {class}"),
            TargetHost::Ip(_) => format!("{ip} is {class}"),
        };
        let matched = matched.map_or(String::new(), |rule| {
            format!("; the request matched \"{rule}\"")
        });
        if !covers(&self.declared) {
            let mut refusal = self.undeclared(format!("{how}, which is"));
            refusal.reason.push_str(&format!(
                " (wildcards reach public addresses only{matched})"
            ));
            return Err(refusal);
        }
        if covers(&self.granted) {
            return Ok(());
        }
        Err(Refusal {
            reason: format!(
                "{how}, which the grant does not name (granted net: {}{matched})",
                list(&self.granted)
            ),
            fix: format!(
                "only a grant naming the host or address exactly ({}) or its range ({}) in {} \
                 reaches loopback, private, link-local and unique-local addresses; cloud \
                 metadata and special-purpose addresses only one naming the address itself",
                self.source.spell(&rule_for(target)),
                range_rule(target, class)
                    .map_or_else(|| "none".to_owned(), |r| self.source.spell(&r)),
                self.source.place()
            ),
        })
    }

    /// The rule of each half, the tool's declaration and the caller's grant, that allows
    /// `target` (at an address of `class`, when given), as `capstan policy --why` shows
    /// them.
    pub fn halves(
        &self,
        target: &NetTarget,
        class: Option<AddressClass>,
    ) -> (Option<&NetRule>, Option<&NetRule>) {
        let find = |rules: &'_ [NetRule]| -> Option<usize> {
            rules.iter().position(|r| match class {
                Some(class) => r.covers(target, class),
                None => r.allows(target),
            })
        };
        (
            find(&self.declared).map(|i| &self.declared[i]),
            find(&self.granted).map(|i| &self.granted[i]),
        )
    }

    /// The refusal of what the tool's declaration does not allow: `what` (a request, an
    /// address, and its verb) is outside it.
    fn undeclared(&self, what: String) -> Refusal {
        Refusal {
            reason: format!(
                "{what} outside what tool `{}` declares (net: {})",
                self.tool,
                list(&self.declared)
            ),
            fix: "the plugin must declare it; a grant cannot widen a tool's declaration".into(),
        }
    }
}

/// The rule naming `target`'s address range, when its class has one.
fn range_rule(target: &NetTarget, class: AddressClass) -> Option<NetRule> {
    let range = AddressRange::ALL
        .into_iter()
        .find(|range| *range != AddressRange::Internal && range.contains(class))?;
    Some(NetRule {
        host: HostRule::Range(range),
        ..rule_for(target)
    })
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
        port: if target.port == target.scheme.default_port() {
            PortRule::Default
        } else {
            PortRule::Is(target.port)
        },
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

    /// What a generic HTTP tool declares: any public host, any internal address a grant
    /// names, either scheme, any port.
    const GENERIC: [&str; 2] = ["*://*:*", "*://{internal}:*"];

    #[test]
    fn a_refusal_names_the_grants_and_the_line_that_would_allow_it() {
        let scope = scope(&GENERIC, &["api.example.com"]);
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

    /// The fix is written as `--grant` takes it: a capability, `net:RULE`.
    #[test]
    fn a_refusal_of_a_flag_grant_spells_the_fix_as_the_flag_takes_it() {
        let mut scope = scope(&GENERIC, &["api.example.com"]);
        scope.source = GrantSource::Flag;
        let text = scope
            .check(&target("http://evil.com:8080/"))
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("add net:http://evil.com:8080 to --grant"),
            "{text}"
        );
    }

    #[test]
    fn a_declaration_limits_what_a_grant_allows() {
        let scope = scope(&["api.github.com"], &["*://*:*"]);
        let text = scope
            .check(&target("https://example.com/"))
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("outside what tool `http_request` declares"),
            "{text}"
        );
    }

    /// `*` is https on 443 to public hosts, in a declaration as in a grant; a rule without
    /// a port means the scheme's default port.
    #[test]
    fn a_bare_star_is_https_to_public_hosts_on_the_default_port() {
        let star = scope(&["*"], &["*://*:*"]);
        assert!(star.check(&target("https://example.com/")).is_ok());
        for url in ["http://example.com/", "https://example.com:8443/"] {
            let text = star.check(&target(url)).unwrap_err().to_string();
            assert!(text.contains("outside what tool"), "{url}: {text}");
        }
        let either = scope(&["*://*:*"], &["*://example.com"]);
        assert!(either.check(&target("http://example.com/")).is_ok());
        assert!(either.check(&target("https://example.com/")).is_ok());
        let text = either
            .check(&target("http://example.com:8080/"))
            .unwrap_err()
            .to_string();
        assert!(text.contains("is not granted"), "{text}");
    }

    /// A profile grants `*` for one tool and an internal address for another; a tool that
    /// declares `*` (public https) never reaches the internal one, whatever is granted.
    #[test]
    fn a_tool_declaring_public_hosts_never_reaches_an_address_another_tools_grant_names() {
        let scope = scope(
            &["*"],
            &["*", "https://10.0.0.5", "https://intranet.example"],
        );
        let t = target("https://10.0.0.5/admin");
        let refused = match scope.check(&t) {
            Err(refusal) => refusal,
            Ok(rule) => scope
                .check_address(rule, &t, "10.0.0.5".parse().unwrap())
                .unwrap_err(),
        };
        let text = refused.to_string();
        assert!(
            text.contains("outside what tool `http_request` declares (net: *)"),
            "{text}"
        );
        let t = target("https://intranet.example/");
        let rule = scope.check(&t).expect("a name inside both halves");
        let text = scope
            .check_address(rule, &t, "10.0.0.9".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            text.contains(
                "intranet.example resolves to 10.0.0.9, a private address, which is outside what \
                 tool"
            ),
            "{text}"
        );
        assert!(
            scope
                .check_address(rule, &t, "93.184.216.34".parse().unwrap())
                .is_ok()
        );
    }

    #[test]
    fn internal_addresses_need_both_halves_to_name_them() {
        let wildcard = scope(&GENERIC, &["*://*:*"]);
        let exact = scope(&GENERIC, &["http://127.0.0.1:8080"]);
        let ranged = scope(&GENERIC, &["http://{loopback}:*"]);
        let t = target("http://127.0.0.1:8080/");
        let ip = "127.0.0.1".parse().unwrap();
        assert!(
            wildcard.check(&t).is_err(),
            "a wildcard never allows an internal address"
        );
        let rule = exact.check(&t).unwrap().clone();
        assert!(exact.check_address(&rule, &t, ip).is_ok());
        let rule = ranged.check(&t).unwrap().clone();
        assert!(ranged.check_address(&rule, &t, ip).is_ok());
        assert!(
            ranged
                .check_address(&rule, &t, "10.0.0.1".parse().unwrap())
                .is_err()
        );
        let named = target("https://internal.example.com/");
        let rule = wildcard.check(&named).unwrap().clone();
        let text = wildcard
            .check_address(&rule, &named, "10.0.0.7".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            text.contains(
                "internal.example.com resolves to 10.0.0.7, a private address, which the grant \
                 does not name"
            ),
            "{text}"
        );
        assert!(
            text.contains("\"{private}\""),
            "names the range that would: {text}"
        );
        assert!(
            wildcard
                .check_address(&rule, &named, "93.184.216.34".parse().unwrap())
                .is_ok()
        );
    }

    /// The operator grants `net = ["*"]` (documented: wildcards never reach private,
    /// loopback or metadata addresses). A plugin that *declares* the metadata address
    /// exactly gets an effective rule that "names the host exactly", so the wildcard
    /// grant reaches 169.254.169.254 after all.
    #[test]
    fn a_declared_exact_address_does_not_make_a_wildcard_grant_exact() {
        let scope = scope(
            &["http://169.254.169.254"],
            &["*://*:*", "*://{internal}:*"],
        );
        let t = target_of(
            &http::Method::GET,
            &"http://169.254.169.254/latest/meta-data/iam/"
                .parse()
                .unwrap(),
        )
        .unwrap();
        assert!(
            scope.check(&t).is_err(),
            "neither a wildcard nor a range of the grant reaches the cloud metadata address"
        );
    }

    /// The same with a name: a plugin declaring `http://localhost:6379` (or an internal
    /// name) under a `*` grant reaches loopback.
    #[test]
    fn a_declared_exact_name_does_not_let_a_wildcard_grant_reach_loopback() {
        let scope = scope(&["http://localhost:6379"], &["*://*:*"]);
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
