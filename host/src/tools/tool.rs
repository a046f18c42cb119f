//! [`CatalogTool`]: one tool of the catalog, and where it comes from ([`ToolOrigin`]).

use capstan_caps::{Capability, Effect};

use super::host::HostTool;
use crate::llm::ToolDef;
use crate::policy::ToolNeeds;

/// Where a tool comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOrigin {
    /// Run by the host itself, on the orchestration.
    Host(HostTool),
    /// A component's tool, run in a sandbox.
    Plugin {
        /// The plugin's name.
        plugin: String,
    },
    /// A tool of the `[mcp.NAME]` server `server`, named `server.tool`.
    Mcp {
        /// The server's name.
        server: String,
    },
}

/// One tool of the catalog.
#[derive(Debug, Clone)]
pub struct CatalogTool {
    /// The tool as a model is shown it.
    pub def: ToolDef,
    /// The capabilities it declares (none for a host tool).
    pub capabilities: Vec<Capability>,
    /// The effect it declares, if any ([`CatalogTool::effect`] is the one that counts).
    pub declared_effect: Option<Effect>,
    /// Where it comes from.
    pub origin: ToolOrigin,
}

impl CatalogTool {
    /// The tool's name.
    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The tool as policy sees it.
    pub fn needs(&self) -> ToolNeeds<'_> {
        ToolNeeds {
            name: &self.def.name,
            capabilities: &self.capabilities,
        }
    }
}
