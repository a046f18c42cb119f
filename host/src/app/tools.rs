//! Every tool an agent knows, host tools and plugin tools alike, as policy sees them.

use crate::agent::HOST_TOOLS;
use crate::plugin::Registry;
use crate::policy::ToolNeeds;

/// The host tools, then each loaded plugin's tools in load order, then each MCP server's:
/// the rows of the policy matrix, as `capstan policy` and `capstan serve` show it.
pub fn tool_needs(registry: &Registry) -> Vec<ToolNeeds<'_>> {
    let host_tools = HOST_TOOLS.iter().map(|tool| ToolNeeds {
        name: tool.name,
        capabilities: &[],
    });
    let plugin_tools = registry.tools().map(|tool| ToolNeeds {
        name: &tool.name,
        capabilities: &tool.capabilities,
    });
    host_tools.chain(plugin_tools).collect()
}
