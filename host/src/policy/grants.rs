//! The capabilities a caller holds, and the decision for one call.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use capstan_caps::{Capability, NetRule, ParseCapabilityError};

/// The capabilities a caller holds.
///
/// ```
/// use capstan_caps::Capability;
/// use capstan_host::policy::Grants;
///
/// let grants: Grants = "fs.read,memory.read".parse().unwrap();
/// let effective = grants.effective("file_read", &[Capability::FsRead]).unwrap();
/// assert_eq!(effective, vec![Capability::FsRead]);
///
/// let denial = grants.effective("file_write", &[Capability::FsWrite]).unwrap_err();
/// assert_eq!(denial.missing, Capability::FsWrite);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    caps: BTreeSet<Capability>,
}

impl Grants {
    /// No grants: only tools that declare no capability may run.
    pub fn none() -> Self {
        Self::default()
    }

    /// Grants exactly `caps`.
    pub fn new(caps: impl IntoIterator<Item = Capability>) -> Self {
        Grants {
            caps: caps.into_iter().collect(),
        }
    }

    /// The granted capabilities, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &Capability> {
        self.caps.iter()
    }

    /// Whether some grant allows `needed`.
    pub fn allows(&self, needed: &Capability) -> bool {
        self.caps.iter().any(|grant| grant.allows(needed))
    }

    /// The capabilities a call of `tool`, which declares `declared`, runs with: all of
    /// `declared`, if every one is granted. Otherwise the first one missing.
    ///
    /// One capability is scoped by the caller rather than the tool: a tool declaring
    /// `tasks.write-own` writes tasks on the caller's behalf, so a caller granted
    /// `tasks.write` runs it with `tasks.write` (any task), and a caller granted only
    /// `tasks.write-own` runs it scoped to its own and created tasks.
    ///
    /// The network and secrets are intersected: a call may make the requests that both a
    /// declared and a granted `net:` rule allow (the intersections are what it runs with,
    /// and at least one must exist), and use the secrets both name (`secret:*` in the
    /// declaration: every granted secret, none required).
    pub fn effective(
        &self,
        tool: &str,
        declared: &[Capability],
    ) -> Result<Vec<Capability>, Denial> {
        let denial = |missing: &Capability| Denial {
            tool: tool.to_owned(),
            missing: missing.clone(),
            granted: self.clone(),
        };
        let mut effective = Vec::new();
        let mut first_net = None;
        for cap in declared {
            match cap {
                Capability::Net(rule) => {
                    first_net.get_or_insert(cap);
                    for grant in self.net_rules() {
                        if let Some(both) = rule.intersect(grant) {
                            effective.push(Capability::Net(both));
                        }
                    }
                }
                Capability::Secret(name) if name == "*" => {
                    effective.extend(
                        self.secret_names()
                            .filter(|granted| *granted != "*")
                            .map(|granted| Capability::Secret(granted.to_owned())),
                    );
                }
                Capability::TasksWriteOwn if self.caps.contains(&Capability::TasksWrite) => {
                    effective.push(Capability::TasksWrite);
                }
                other if self.allows(other) => effective.push(other.clone()),
                other => return Err(denial(other)),
            }
        }
        if let Some(net) = first_net
            && !effective
                .iter()
                .any(|cap| matches!(cap, Capability::Net(_)))
        {
            return Err(denial(net));
        }
        let mut seen = BTreeSet::new();
        effective.retain(|cap| seen.insert(cap.clone()));
        Ok(effective)
    }

    /// The granted network rules.
    pub fn net_rules(&self) -> impl Iterator<Item = &NetRule> {
        self.caps.iter().filter_map(|cap| match cap {
            Capability::Net(rule) => Some(rule),
            _ => None,
        })
    }

    /// The granted secret names.
    pub fn secret_names(&self) -> impl Iterator<Item = &str> {
        self.caps.iter().filter_map(|cap| match cap {
            Capability::Secret(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// These grants narrowed by a tool's own grants: network rules intersected with
    /// `narrow`'s rules, secrets limited to the ones `narrow` names. Other capabilities
    /// stay as they are.
    pub fn narrowed(&self, narrow: &ToolGrants) -> Grants {
        let mut caps: BTreeSet<Capability> = self
            .caps
            .iter()
            .filter(|cap| !matches!(cap, Capability::Net(_) | Capability::Secret(_)))
            .cloned()
            .collect();
        match &narrow.net {
            Some(rules) => {
                for grant in self.net_rules() {
                    caps.extend(
                        rules
                            .iter()
                            .filter_map(|rule| grant.intersect(rule))
                            .map(Capability::Net),
                    );
                }
            }
            None => caps.extend(self.net_rules().cloned().map(Capability::Net)),
        }
        caps.extend(
            self.secret_names()
                .filter(|name| {
                    narrow
                        .secrets
                        .as_ref()
                        .is_none_or(|only| only.iter().any(|n| n == name))
                })
                .map(|name| Capability::Secret(name.to_owned())),
        );
        Grants { caps }
    }
}

/// What a profile grants one tool beyond (within) its own grants:
/// `[profiles.KIND.tool.NAME]` in the config. `None` keeps the profile's grant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolGrants {
    /// Network rules the tool is limited to, within the profile's.
    pub net: Option<Vec<NetRule>>,
    /// Secrets the tool is limited to, within the profile's.
    pub secrets: Option<Vec<String>>,
}

impl fmt::Display for Grants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.caps.is_empty() {
            return f.write_str("(none)");
        }
        let mut first = true;
        for cap in &self.caps {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{cap}")?;
        }
        Ok(())
    }
}

/// Parses a comma-separated list such as `fs.read,tasks.write-own`; blanks are ignored.
impl FromStr for Grants {
    type Err = ParseCapabilityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let caps = text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(str::parse)
            .collect::<Result<BTreeSet<_>, _>>()?;
        Ok(Grants { caps })
    }
}

/// A call refused because the tool declares a capability the caller does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// The tool that was called.
    pub tool: String,
    /// The first declared capability no grant allows.
    pub missing: Capability,
    /// What the caller holds.
    pub granted: Grants,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tool `{}` needs capability `{}`, which this caller does not grant (granted: {}); \
             a grant of `{}` would allow it",
            self.tool, self.missing, self.granted, self.missing
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_is_the_declared_set_when_all_are_granted() {
        let grants: Grants = "fs.read, fs.write ,tasks.write".parse().unwrap();
        let caps = grants.effective("t", &[Capability::FsRead]).unwrap();
        assert_eq!(caps, vec![Capability::FsRead]);
        assert_eq!(grants.effective("t", &[]).unwrap(), vec![]);
    }

    #[test]
    fn task_writes_are_scoped_by_the_callers_grant() {
        let full: Grants = "tasks.write".parse().unwrap();
        let own: Grants = "tasks.write-own".parse().unwrap();
        let declared = [Capability::TasksWriteOwn];
        assert_eq!(
            full.effective("t", &declared).unwrap(),
            vec![Capability::TasksWrite]
        );
        assert_eq!(
            own.effective("t", &declared).unwrap(),
            vec![Capability::TasksWriteOwn]
        );
        assert!(own.effective("t", &[Capability::TasksWrite]).is_err());
    }

    #[test]
    fn a_denial_names_tool_capability_and_grants() {
        let grants: Grants = "fs.read".parse().unwrap();
        let denial = grants
            .effective("file_edit", &[Capability::FsRead, Capability::FsWrite])
            .unwrap_err();
        let text = denial.to_string();
        assert!(text.contains("file_edit"), "{text}");
        assert!(text.contains("`fs.write`"), "{text}");
        assert!(text.contains("granted: fs.read"), "{text}");
    }

    #[test]
    fn network_and_secrets_are_intersected() {
        let net = |t: &str| format!("net:{t}").parse::<Capability>().unwrap();
        let grants: Grants = "net:api.example.com,net:http://127.0.0.1:8080,secret:KEY"
            .parse()
            .unwrap();
        let generic = [
            net("*://*:*"),
            net("*://{internal}:*"),
            "secret:*".parse().unwrap(),
        ];
        let caps = grants.effective("http_request", &generic).unwrap();
        let text: Vec<String> = caps.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "net:api.example.com",
                "net:http://127.0.0.1:8080",
                "secret:KEY"
            ]
        );
        // `*` is public https: the loopback grant meets nothing of it.
        let caps = grants
            .effective("public", &[net("*"), "secret:*".parse().unwrap()])
            .unwrap();
        let text: Vec<String> = caps.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["net:api.example.com", "secret:KEY"]);
        let denial = grants
            .effective("gh", &[net("api.github.com")])
            .unwrap_err();
        assert_eq!(denial.missing, net("api.github.com"));
        let denial = grants
            .effective("t", &["secret:OTHER".parse().unwrap()])
            .unwrap_err();
        assert_eq!(denial.missing.to_string(), "secret:OTHER");
        let none = Grants::none();
        assert!(
            none.effective("t", &["secret:*".parse().unwrap()])
                .unwrap()
                .is_empty()
        );
        assert!(
            none.effective("t", &[net("*")]).is_err(),
            "a net tool needs some grant"
        );

        let narrowed = grants.narrowed(&ToolGrants {
            net: Some(vec!["*.example.com".parse().unwrap()]),
            secrets: Some(vec![]),
        });
        assert_eq!(narrowed.to_string(), "net:api.example.com");
    }

    #[test]
    fn grants_parse_and_print() {
        assert_eq!(Grants::none().to_string(), "(none)");
        assert_eq!("".parse::<Grants>().unwrap(), Grants::none());
        assert_eq!(
            "memory.read,fs.read".parse::<Grants>().unwrap().to_string(),
            "fs.read,memory.read"
        );
        assert!("fs.read,fs.root".parse::<Grants>().is_err());
    }
}
