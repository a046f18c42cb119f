//! [`ToolCatalog`]: every tool an agent knows (host, plugin and MCP), what each needs, and
//! which process kinds the policy offers it to. The one answer to "which tools is this
//! process offered": the agent's requests, the MCP door, `/v1/tools`, `/v1/policy` and
//! `capstan policy` all read it.

use std::collections::HashMap;
use std::sync::Arc;

use super::flow::FlowFacts;
use super::host::HostTool;
pub use super::tool::{CatalogTool, ToolOrigin};
use crate::flow::{self, FlowCall, FlowDecision, Label, Sink};
use crate::llm::ToolDef;
use crate::plugin::{Registry, ToolInfo};
use crate::policy::{Decision, Policy, ProcessKind};

/// A row of the policy matrix: a tool and the decision for each kind, in
/// [`ProcessKind::ALL`]'s order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatrixRow {
    /// The tool's name.
    pub tool: String,
    /// One decision per kind.
    pub cells: Vec<Decision>,
}

/// Every tool an agent knows, and which process kinds the policy offers each.
///
/// Built once from the registry and the policy: the host tools first, then each plugin's
/// in load order, then each MCP server's. A plugin tool that takes a host tool's name is
/// left out (the host tool keeps it; [`ToolCatalog::clashes`] names it).
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// use std::path::Path;
/// use capstan_host::config::Config;
/// use capstan_host::plugin::{ArtifactCache, CallLog, Limits, PluginHost, Registry};
/// use capstan_host::policy::ProcessKind;
/// use capstan_host::tools::ToolCatalog;
///
/// let config = Config::defaults(Path::new("."));
/// let host = PluginHost::new(Limits::default(), ArtifactCache::disabled())?;
/// let registry = Registry::load_dir(host.into(), CallLog::disabled(), Path::new("target/plugins")).await?;
/// let catalog = ToolCatalog::new(&registry, &config.policy);
/// for tool in catalog.offered(ProcessKind::Worker).iter() {
///     println!("{}", tool.name);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ToolCatalog {
    policy: Arc<Policy>,
    tools: Vec<CatalogTool>,
    /// Where each name is in `tools` (its first, as a call finds it), for the decision
    /// every call asks.
    by_name: HashMap<String, usize>,
    /// The tools offered to each kind, in [`ProcessKind::ALL`]'s order.
    offered: [Arc<[ToolDef]>; ProcessKind::ALL.len()],
    /// The plugin tools left out for taking a host tool's name, a line each.
    left_out: Vec<String>,
    /// What the flow check knows of each tool, for each kind in [`ProcessKind::ALL`]'s
    /// order, in `tools`' order: every call reads it, so it is worked out once.
    facts: Vec<[FlowFacts; ProcessKind::ALL.len()]>,
}

impl ToolCatalog {
    /// The catalog of the host tools and `registry`'s, offered as `policy` decides.
    pub fn new(registry: &Registry, policy: &Policy) -> Self {
        let mut tools: Vec<CatalogTool> = HostTool::ALL
            .iter()
            .map(|tool| CatalogTool {
                def: tool.def(),
                capabilities: Vec::new(),
                declared_effect: None,
                origin: ToolOrigin::Host(*tool),
            })
            .collect();
        for plugin in registry.plugins() {
            for tool in plugin.tools() {
                if HostTool::named(&tool.name).is_none() {
                    let plugin = plugin.name().to_owned();
                    tools.push(from_info(tool, ToolOrigin::Plugin { plugin }));
                }
            }
        }
        for (server, tool) in registry.external_tools() {
            let server = server.to_owned();
            tools.push(from_info(tool, ToolOrigin::Mcp { server }));
        }
        let policy = Arc::new(policy.clone());
        let offered = ProcessKind::ALL.map(|kind| {
            tools
                .iter()
                .filter(|tool| decide(&policy, kind, tool) == Decision::Offered)
                .map(|tool| tool.def.clone())
                .collect()
        });
        let facts = tools
            .iter()
            .map(|tool| ProcessKind::ALL.map(|kind| FlowFacts::of(&policy, kind, tool)))
            .collect();
        let mut by_name = HashMap::with_capacity(tools.len());
        for (index, tool) in tools.iter().enumerate() {
            by_name.entry(tool.name().to_owned()).or_insert(index);
        }
        ToolCatalog {
            policy,
            tools,
            by_name,
            offered,
            left_out: ToolCatalog::clashes(registry),
            facts,
        }
    }

    /// What the flow check knows of tool `name` called by a `kind` process: where its
    /// arguments go and how its result is labelled, with the kind's grants (or as the tool
    /// declares itself, if the kind does not grant it); `None` if there is no such tool.
    pub fn flow_facts(&self, kind: ProcessKind, name: &str) -> Option<&FlowFacts> {
        self.by_name
            .get(name)
            .map(|index| &self.facts[*index][kind_index(kind)])
    }

    /// The flow decision for a call of a tool going to `sink` by a `kind` process that
    /// read what is labelled `context`, its arguments carrying handles' values labelled
    /// `carried` (clear for none), by the kind's `[profiles.KIND.flow]`.
    pub fn decide_flow(
        &self,
        kind: ProcessKind,
        name: &str,
        context: &Label,
        carried: &Label,
        sink: &Sink,
    ) -> FlowDecision {
        let call = FlowCall {
            kind,
            tool: name,
            context,
            arguments: carried,
            sink,
        };
        flow::check(self.policy().profile(kind).flow(), &call)
    }

    /// The policy the catalog decides with.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Every tool, host tools first.
    pub fn tools(&self) -> &[CatalogTool] {
        &self.tools
    }

    /// The tool named `name`.
    pub fn tool(&self, name: &str) -> Option<&CatalogTool> {
        self.by_name.get(name).map(|index| &self.tools[*index])
    }

    /// The tools a `kind` process is offered, host tools and plugin tools alike: exactly
    /// those its profile names, that its kind runs (for a host tool), and whose
    /// capabilities it grants. Worked out once; every request of that kind shares it.
    pub fn offered(&self, kind: ProcessKind) -> Arc<[ToolDef]> {
        self.offered[kind_index(kind)].clone()
    }

    /// The kinds offered tool `name`, in [`ProcessKind::ALL`]'s order.
    pub fn offered_to(&self, name: &str) -> Vec<ProcessKind> {
        ProcessKind::ALL
            .into_iter()
            .filter(|kind| self.is_offered(*kind, name))
            .collect()
    }

    /// Whether a `kind` process is offered tool `name`.
    pub fn is_offered(&self, kind: ProcessKind, name: &str) -> bool {
        self.offered[kind_index(kind)]
            .iter()
            .any(|tool| tool.name == name)
    }

    /// Whether a `kind` process is offered tool `name`, and if not, why.
    pub fn decide(&self, kind: ProcessKind, name: &str) -> Decision {
        match self.tool(name) {
            Some(tool) => decide(&self.policy, kind, tool),
            None => self.policy.decide(kind, name, None),
        }
    }

    /// The tool x kind matrix: a row per tool, then one for each tool a profile names
    /// exactly (not by a glob) that is not in the catalog.
    pub fn matrix(&self) -> Vec<MatrixRow> {
        let row = |name: &str| MatrixRow {
            tool: name.to_owned(),
            cells: ProcessKind::ALL
                .iter()
                .map(|kind| self.decide(*kind, name))
                .collect(),
        };
        let mut rows: Vec<MatrixRow> = self.tools.iter().map(|t| row(t.name())).collect();
        for name in self.missing() {
            rows.push(row(name));
        }
        rows
    }

    /// The tools the profiles name exactly (not by a glob) that are not in the catalog,
    /// sorted.
    pub fn missing(&self) -> Vec<&str> {
        let mut missing: Vec<&str> = ProcessKind::ALL
            .iter()
            .flat_map(|kind| self.policy.profile(*kind).tool_patterns())
            .filter(|name| !is_glob(name))
            .filter(|name| self.tool(name).is_none())
            .collect();
        missing.sort_unstable();
        missing.dedup();
        missing
    }

    /// The plugin tools left out of this catalog for taking a host tool's name, a line
    /// each ([`ToolCatalog::clashes`]).
    pub fn left_out(&self) -> &[String] {
        &self.left_out
    }

    /// The plugin tools of `registry` a catalog leaves out because they take a host tool's
    /// name, a line each saying so and what to do.
    pub fn clashes(registry: &Registry) -> Vec<String> {
        let mut clashes = Vec::new();
        for plugin in registry.plugins() {
            for tool in plugin.tools() {
                if HostTool::named(&tool.name).is_some() {
                    clashes.push(format!(
                        "plugin {} ({}): tool `{}` takes the name of a host tool, so it is \
                         offered to no process and served by no door; rename the tool",
                        plugin.name(),
                        plugin.path().display(),
                        tool.name
                    ));
                }
            }
        }
        clashes
    }
}

/// Whether a profile's tool pattern is a glob rather than one tool's name.
pub(super) fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '['])
}

fn kind_index(kind: ProcessKind) -> usize {
    ProcessKind::ALL
        .iter()
        .position(|k| *k == kind)
        .expect("every kind is in ALL")
}

/// The decision for `tool`: a host tool is offered only to the kinds that run it.
fn decide(policy: &Policy, kind: ProcessKind, tool: &CatalogTool) -> Decision {
    let decision = policy.decide(kind, tool.name(), Some(tool.needs()));
    match tool.origin {
        ToolOrigin::Host(host) if decision == Decision::Offered && !host.is_run_by(kind) => {
            Decision::NotRunByKind
        }
        _ => decision,
    }
}

fn from_info(tool: &ToolInfo, origin: ToolOrigin) -> CatalogTool {
    CatalogTool {
        def: ToolDef {
            name: tool.name.clone(),
            description: tool.description.clone(),
            parameters: tool.args_schema.clone(),
        },
        capabilities: tool.capabilities.clone(),
        declared_effect: tool.effect,
        origin,
    }
}
