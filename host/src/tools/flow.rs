//! What the flow check knows of a tool, from facts the host holds: where a call's
//! arguments go ([`Sink`]) and the label of what it returns. Never from the tool's own word
//! about its data: a plugin's result is labelled by the capabilities it ran with, an MCP
//! server's by the server.

use capstan_caps::{Capability, Effect};

use super::host::HostTool;
use super::tool::{CatalogTool, ToolOrigin};
use crate::flow::{Label, Origin, Scope, Sink};
use crate::policy::{Policy, ProcessKind};

/// What the flow check knows of one tool called by one kind of process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowFacts {
    /// Where a call's arguments go, and what it does.
    pub sink: Sink,
    /// The label of what a call returns, before what it reaches is joined in.
    pub result: Label,
    /// Whether a call may read workspace files: each one it reads joins its label in.
    pub reads_files: bool,
    /// Whether a call may make requests: each host it reaches joins `net:HOST` in.
    pub reaches_hosts: bool,
}

impl FlowFacts {
    /// What a call's result is labelled, as a person reads it: `untrusted(mcp:bank),
    /// private(mcp:bank)`, or `trusted, private(workspace), joined with each file's label`.
    pub fn result_text(&self) -> String {
        let mut text = self.result.to_string();
        if self.reads_files {
            text.push_str(", joined with the label of each file it reads");
        }
        if self.reaches_hosts {
            text.push_str(", joined with untrusted(net:HOST) for each host it reaches");
        }
        text
    }
}

impl FlowFacts {
    /// What the flow check knows of `tool` called by a `kind` process under `policy`, with
    /// the kind's grants (narrowed for the tool), or as the tool declares itself if the
    /// kind does not grant it. Worked out once, when the catalog is built.
    pub(super) fn of(policy: &Policy, kind: ProcessKind, tool: &CatalogTool) -> FlowFacts {
        let name = tool.name();
        let grants = policy.profile(kind).grants_for(name);
        let effective = grants
            .effective(name, &tool.capabilities)
            .unwrap_or_else(|_| tool.capabilities.clone());
        let plugin = matches!(tool.origin, ToolOrigin::Plugin { .. });
        let has = |f: fn(&Capability) -> bool| plugin && effective.iter().any(f);
        FlowFacts {
            sink: tool.sink(&effective),
            result: tool.result_label(&effective),
            reads_files: has(|c| matches!(c, Capability::FsRead | Capability::FsWrite)),
            reaches_hosts: has(|c| matches!(c, Capability::Net(_))),
        }
    }
}

impl CatalogTool {
    /// The tool's effect: the higher of what it declares and what its declared
    /// capabilities imply (an MCP tool that does not say it is read-only may change the
    /// world).
    pub fn effect(&self) -> Effect {
        match &self.origin {
            ToolOrigin::Host(tool) => tool.effect(),
            ToolOrigin::Plugin { .. } => {
                Effect::derived(&self.capabilities).max(self.declared_effect.unwrap_or_default())
            }
            ToolOrigin::Mcp { .. } => self.declared_effect.unwrap_or(Effect::Send),
        }
    }

    /// Where a call's arguments go, for a call that runs with `effective` capabilities
    /// (declared and granted).
    pub fn sink(&self, effective: &[Capability]) -> Sink {
        match &self.origin {
            ToolOrigin::Host(tool) => Sink::local(tool.effect()),
            ToolOrigin::Plugin { .. } => Sink::plugin(effective, self.declared_effect),
            ToolOrigin::Mcp { server } => Sink::mcp(server, self.effect()),
        }
    }

    /// The label of what a call returns, for a call that runs with `effective`
    /// capabilities, before what it reached is known: an MCP server's answer is
    /// untrusted and private to that server; a plugin's result is private to each store
    /// it could read (or secret if it held a secret). What it read (each file, task and
    /// memory by the label its writer left, each host its requests reached) is joined in
    /// after the call ([`ToolRouter`](super::ToolRouter)). A host tool's result is the
    /// host's own words.
    pub fn result_label(&self, effective: &[Capability]) -> Label {
        match &self.origin {
            ToolOrigin::Host(_) => Label::trusted(),
            ToolOrigin::Mcp { server } => Label::untrusted(Origin::Mcp(server.clone()))
                .joined(&Label::private(Scope::Mcp(server.clone()))),
            ToolOrigin::Plugin { .. } => {
                let mut label = Label::trusted();
                for cap in effective {
                    let part = match cap {
                        Capability::FsRead | Capability::FsWrite => {
                            Label::private(Scope::Workspace)
                        }
                        Capability::TasksRead
                        | Capability::TasksWrite
                        | Capability::TasksWriteOwn => Label::private(Scope::Tasks),
                        Capability::MemoryRead => Label::private(Scope::Memory),
                        Capability::Secret(name) => Label::secret(name.clone()),
                        // What it reached is joined in after the call; saving a memory
                        // reads nothing back.
                        Capability::Net(_) | Capability::MemoryWrite => continue,
                    };
                    label.join(&part);
                }
                label
            }
        }
    }
}

impl HostTool {
    /// What a call of it does: a reply or a report goes to the process's own audience; a
    /// worker, branch, routed message or cancel acts on another process, which carries
    /// the caller's label.
    pub fn effect(self) -> Effect {
        match self {
            // A question goes to the model, as every result does.
            HostTool::Reply | HostTool::Skip | HostTool::SetStatus | HostTool::AskAbout => {
                Effect::Read
            }
            HostTool::SpawnWorker | HostTool::Branch | HostTool::Route | HostTool::Cancel => {
                Effect::WriteLocal
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolDef;

    fn tool(origin: ToolOrigin, capabilities: &[&str], declared: Option<Effect>) -> CatalogTool {
        CatalogTool {
            def: ToolDef {
                name: "t".into(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            },
            capabilities: capabilities.iter().map(|c| c.parse().unwrap()).collect(),
            declared_effect: declared,
            origin,
        }
    }

    #[test]
    fn a_plugin_s_result_is_labelled_by_what_the_call_could_read() {
        let plugin = || ToolOrigin::Plugin {
            plugin: "files".into(),
        };
        // Which files it read is joined in after the call.
        let files = tool(plugin(), &["fs.read"], None);
        let label = files.result_label(&files.capabilities);
        assert_eq!(label.to_string(), "trusted, private(workspace)");
        let board = tool(plugin(), &["tasks.read"], None);
        let label = board.result_label(&board.capabilities);
        assert_eq!(label.to_string(), "trusted, private(tasks)");
        let fetch = tool(plugin(), &["net:example.com"], None);
        assert!(fetch.result_label(&fetch.capabilities).is_clear());
        let pure = tool(plugin(), &[], None);
        assert!(pure.result_label(&[]).is_clear());
        let saver = tool(plugin(), &["memory.write"], None);
        assert!(saver.result_label(&saver.capabilities).is_clear());
        assert_eq!(saver.effect(), Effect::WriteLocal);
        // A declaration raises the effect, never lowers it.
        let declared = tool(plugin(), &["fs.write"], Some(Effect::Read));
        assert_eq!(declared.effect(), Effect::WriteLocal);
        let mailer = tool(plugin(), &[], Some(Effect::Send));
        assert_eq!(mailer.effect(), Effect::Send);
    }

    #[test]
    fn an_mcp_tool_sends_unless_it_says_it_only_reads() {
        let mcp = || ToolOrigin::Mcp {
            server: "bank".into(),
        };
        assert_eq!(tool(mcp(), &[], None).effect(), Effect::Send);
        let reader = tool(mcp(), &[], Some(Effect::Read));
        assert_eq!(reader.effect(), Effect::Read);
        assert_eq!(
            reader.result_label(&[]).to_string(),
            "untrusted(mcp:bank), private(mcp:bank)"
        );
        assert!(reader.sink(&[]).outside.is_some());
    }
}
