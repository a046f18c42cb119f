//! The questions an operator asks of a policy, answered from the catalog: `capstan policy
//! --lint`. Each [`Finding`] names the config key to change and how.

use std::fmt;

use capstan_caps::Capability;

use super::catalog::{CatalogTool, ToolCatalog, ToolOrigin, is_glob};
use super::host::HostTool;
use crate::policy::{Decision, ProcessKind, Profile};

/// What a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FindingKind {
    /// A profile names a tool (by its exact name) that its kind is never offered: a
    /// capability it needs is not granted, or it is a host tool the kind does not run.
    DeadCell,
    /// A kind can start workers, but a worker is offered no tool to work with.
    DelegationDeadEnd,
    /// A loaded tool that no profile names, so no process is ever offered it.
    OfferedToNobody,
    /// A profile grants a capability that no tool it is offered uses.
    UnusedGrant,
    /// A profile offers one process a tool that reads what outsiders wrote (the web, an
    /// MCP server) and a tool with an effect outside the host: a prompt injected into the
    /// first can drive the second.
    UntrustedInputWithEffect,
    /// A profile names (exactly) a tool that nothing provides: a typo, or a plugin missing
    /// from the plugins directory.
    UnknownTool,
    /// A plugin declares a tool with a host tool's name: it is left out.
    HostNameClash,
}

impl FindingKind {
    /// The finding's name, as printed: `dead-cell`.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::DeadCell => "dead-cell",
            FindingKind::DelegationDeadEnd => "delegation-dead-end",
            FindingKind::OfferedToNobody => "offered-to-nobody",
            FindingKind::UnusedGrant => "unused-grant",
            FindingKind::UntrustedInputWithEffect => "untrusted-input-with-effect",
            FindingKind::UnknownTool => "unknown-tool",
            FindingKind::HostNameClash => "host-name-clash",
        }
    }
}

/// One thing to change in a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What it is about.
    pub kind: FindingKind,
    /// The config key to change: `profiles.worker.capabilities`.
    pub key: String,
    /// What is wrong, and the change that mends it.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.kind.as_str(), self.key, self.message)
    }
}

/// A tool named by a profile and left unoffered on purpose: the profile grants no network
/// at all, and the network is all the tool lacks (the defaults name the web tools for a
/// worker this way, so that granting `net` offers them). Reported as a note, not a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The config key that would offer it: `profiles.worker.net`.
    pub key: String,
    /// What waits on it.
    pub message: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "note: {}: {}", self.key, self.message)
    }
}

/// What [`lint`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lint {
    /// Each thing to change, in the order checked.
    pub findings: Vec<Finding>,
    /// Tools waiting on a network grant.
    pub notes: Vec<Note>,
}

/// Checks the catalog's policy for dead cells, delegation dead ends, tools offered to
/// nobody, unused grants, and processes given untrusted input and an external effect at
/// once.
///
/// ```no_run
/// # fn demo(catalog: &capstan_host::tools::ToolCatalog) {
/// let lint = capstan_host::tools::lint::lint(catalog);
/// for finding in &lint.findings {
///     println!("{finding}");
/// }
/// # }
/// ```
pub fn lint(catalog: &ToolCatalog) -> Lint {
    let mut lint = Lint::default();
    dead_cells(catalog, &mut lint);
    unknown_tools(catalog, &mut lint);
    for clash in catalog.left_out() {
        lint.findings.push(Finding {
            kind: FindingKind::HostNameClash,
            key: "agent.plugins_dir".to_owned(),
            message: clash.clone(),
        });
    }
    delegation_dead_ends(catalog, &mut lint);
    offered_to_nobody(catalog, &mut lint);
    unused_grants(catalog, &mut lint);
    untrusted_input_with_effect(catalog, &mut lint);
    lint
}

fn profile_key(kind: ProcessKind, field: &str) -> String {
    format!("profiles.{kind}.{field}")
}

/// Whether `profile` names `tool` by its exact name (not only through a glob).
fn names_exactly(profile: &Profile, tool: &str) -> bool {
    profile
        .tool_patterns()
        .any(|pattern| !is_glob(pattern) && pattern == tool)
}

/// Whether the only thing keeping `tool` from `kind` is the network, which the profile
/// does not grant at all.
fn waits_for_net(profile: &Profile, missing: &Capability) -> bool {
    matches!(missing, Capability::Net(_)) && profile.grants().net_rules().next().is_none()
}

fn dead_cells(catalog: &ToolCatalog, lint: &mut Lint) {
    for kind in ProcessKind::ALL {
        let profile = catalog.policy().profile(kind);
        for tool in catalog.tools() {
            let name = tool.name();
            if !names_exactly(profile, name) {
                continue;
            }
            match catalog.decide(kind, name) {
                Decision::NotGranted(missing) if waits_for_net(profile, &missing) => {
                    lint.notes.push(Note {
                        key: profile_key(kind, "net"),
                        message: format!(
                            "`{name}` is named in {} and offered once a network rule is \
                             granted ({missing})",
                            profile_key(kind, "tools")
                        ),
                    });
                }
                Decision::NotGranted(missing) => {
                    let key = grant_key(kind, profile, name, &missing);
                    lint.findings.push(Finding {
                        kind: FindingKind::DeadCell,
                        message: format!(
                            "`{name}` is named in {} but never offered to a {kind}: it needs \
                             {missing}, which {key} does not grant; grant it there, or drop \
                             `{name}` from {}",
                            profile_key(kind, "tools"),
                            profile_key(kind, "tools"),
                        ),
                        key,
                    });
                }
                Decision::NotRunByKind => {
                    if let ToolOrigin::Host(host) = tool.origin {
                        lint.findings.push(Finding {
                            kind: FindingKind::DeadCell,
                            key: profile_key(kind, "tools"),
                            message: format!(
                                "`{name}` is a host tool a {kind} does not run (only {}), so \
                                 naming it offers nothing; drop it",
                                host.kinds_running().join(", ")
                            ),
                        });
                    }
                }
                _ => {}
            }
        }
    }
}

/// Tools a profile names by their exact name that nothing provides. An MCP server's tools
/// (`server.tool`) are left to the server's own check when it starts.
fn unknown_tools(catalog: &ToolCatalog, lint: &mut Lint) {
    let missing = catalog.missing();
    for kind in ProcessKind::ALL {
        let profile = catalog.policy().profile(kind);
        for name in &missing {
            if name.contains('.') || !names_exactly(profile, name) {
                continue;
            }
            lint.findings.push(Finding {
                kind: FindingKind::UnknownTool,
                key: profile_key(kind, "tools"),
                message: format!(
                    "`{name}` is named, but no plugin, MCP server or host tool provides it (a \
                     typo, or a plugin missing from the plugins directory); `capstan plugins \
                     list` shows the tools loaded"
                ),
            });
        }
    }
}

/// The key whose grant `missing` lacks for tool `name` of `kind`: the tool's own narrower
/// grants if they are what leave it out, else the profile's list for that capability.
fn grant_key(kind: ProcessKind, profile: &Profile, name: &str, missing: &Capability) -> String {
    if profile.tool_grants().contains_key(name) && profile.grants().allows(missing) {
        return profile_key(kind, &format!("tool.{name}"));
    }
    let field = match missing {
        Capability::Net(_) => "net",
        Capability::Secret(_) => "secrets",
        _ => "capabilities",
    };
    profile_key(kind, field)
}

fn delegation_dead_ends(catalog: &ToolCatalog, lint: &mut Lint) {
    let spawn = HostTool::SpawnWorker.name();
    let works = catalog
        .offered(ProcessKind::Worker)
        .iter()
        .any(|tool| HostTool::named(&tool.name).is_none());
    if works {
        return;
    }
    for kind in catalog.offered_to(spawn) {
        lint.findings.push(Finding {
            kind: FindingKind::DelegationDeadEnd,
            key: profile_key(ProcessKind::Worker, "tools"),
            message: format!(
                "a {kind} can start workers (`{spawn}`), but a worker is offered no tool to \
                 work with; name and grant tools in profiles.worker, or drop `{spawn}` from {}",
                profile_key(kind, "tools")
            ),
        });
    }
}

fn offered_to_nobody(catalog: &ToolCatalog, lint: &mut Lint) {
    for tool in catalog.tools() {
        if matches!(tool.origin, ToolOrigin::Host(_)) {
            continue;
        }
        let named = ProcessKind::ALL
            .iter()
            .any(|kind| catalog.policy().profile(*kind).names_tool(tool.name()));
        if named {
            continue;
        }
        let from = match &tool.origin {
            ToolOrigin::Plugin { plugin } => format!("plugin `{plugin}`"),
            ToolOrigin::Mcp { server } => format!("MCP server `{server}`"),
            ToolOrigin::Host(_) => unreachable!("skipped above"),
        };
        let needs = if tool.capabilities.is_empty() {
            "nothing".to_owned()
        } else {
            let caps: Vec<String> = tool.capabilities.iter().map(ToString::to_string).collect();
            caps.join(", ")
        };
        lint.findings.push(Finding {
            kind: FindingKind::OfferedToNobody,
            key: "profiles".to_owned(),
            message: format!(
                "`{}` ({from}) is loaded but named by no profile, so no process is offered \
                 it; name it in the tools of the kinds that should have it (it needs {needs}), \
                 or remove it",
                tool.name()
            ),
        });
    }
}

fn unused_grants(catalog: &ToolCatalog, lint: &mut Lint) {
    for kind in ProcessKind::ALL {
        let profile = catalog.policy().profile(kind);
        let offered = catalog.offered(kind);
        let declared: Vec<&Capability> = offered
            .iter()
            .filter_map(|def| catalog.tool(&def.name))
            .flat_map(|tool| tool.capabilities.iter())
            .collect();
        for grant in profile.grants().iter() {
            if declared.iter().any(|need| grant.allows(need)) {
                continue;
            }
            let field = match grant {
                Capability::Net(_) => "net",
                Capability::Secret(_) => "secrets",
                _ => "capabilities",
            };
            lint.findings.push(Finding {
                kind: FindingKind::UnusedGrant,
                key: profile_key(kind, field),
                message: format!(
                    "grants {grant}, but no tool a {kind} is offered uses it; drop it (a grant \
                     nothing uses is one a tool added later gets without review)"
                ),
            });
        }
    }
}

/// What one tool lets a process do, as far as untrusted input and external effects go.
#[derive(Debug, Default)]
struct Reach {
    /// It reads what outsiders wrote: a response from the network, an MCP server's answer.
    untrusted_input: bool,
    /// It acts outside the host: a request that may change something, an MCP server's tool.
    external_effect: bool,
}

fn reach(catalog: &ToolCatalog, kind: ProcessKind, tool: &CatalogTool) -> Reach {
    if let ToolOrigin::Mcp { .. } = tool.origin {
        // Its answer comes from outside, and what it does there is its own.
        return Reach {
            untrusted_input: true,
            external_effect: true,
        };
    }
    let grants = catalog.policy().profile(kind).grants_for(tool.name());
    let Ok(effective) = grants.effective(tool.name(), &tool.capabilities) else {
        return Reach::default();
    };
    let mut reach = Reach::default();
    for cap in &effective {
        if let Capability::Net(rule) = cap {
            // A host the operator named is one it chose to trust; any other host's answer
            // is what anyone may have written.
            let named_host = rule.names_host_exactly();
            reach.untrusted_input |= !named_host;
            let reads = rule
                .method
                .as_deref()
                .is_some_and(|method| matches!(method, "GET" | "HEAD" | "OPTIONS"));
            // A read of a host nobody named can still carry data out in its URL.
            reach.external_effect |= !reads || !named_host;
        }
    }
    reach
}

fn untrusted_input_with_effect(catalog: &ToolCatalog, lint: &mut Lint) {
    for kind in ProcessKind::ALL {
        let mut inputs = Vec::new();
        let mut effects = Vec::new();
        // A tool of the kind's own that is both: a request to any host, any method.
        let mut both = Vec::new();
        for def in catalog.offered(kind).iter() {
            let Some(tool) = catalog.tool(&def.name) else {
                continue;
            };
            let reach = reach(catalog, kind, tool);
            if reach.untrusted_input {
                inputs.push(tool.name().to_owned());
            }
            if reach.external_effect {
                effects.push(tool.name().to_owned());
            }
            if reach.untrusted_input
                && reach.external_effect
                && !matches!(tool.origin, ToolOrigin::Mcp { .. })
            {
                both.push(tool.name().to_owned());
            }
        }
        let apart = inputs
            .iter()
            .any(|input| effects.iter().any(|effect| effect != input));
        if !apart && both.is_empty() {
            continue;
        }
        lint.findings.push(Finding {
            kind: FindingKind::UntrustedInputWithEffect,
            key: profile_key(kind, "tools"),
            message: format!(
                "one {kind} reads what outsiders wrote ({}) and acts outside the host ({}): \
                 text injected into the first can drive the second; give them to different \
                 kinds, or narrow profiles.{kind}.net to hosts you name",
                inputs.join(", "),
                effects.join(", ")
            ),
        });
    }
}
