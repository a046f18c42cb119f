//! Capstan and the Model Context Protocol, both ways.
//!
//! - [`ToolServer`] serves the plugin tools one profile is offered to any MCP client
//!   (`capstan mcp --profile worker` over stdio, `/mcp/worker` on `capstan serve`). A
//!   call from the client takes the path an agent's call takes: the policy's decision for
//!   the profile, the profile's grants, a fresh sandbox under the deadline and memory
//!   limits, and an audit row whose process is the client (`mcp:NAME`). A denial, a trap
//!   or a deadline is a tool error carrying the reason, never a dropped connection.
//! - [`McpClient`] reaches an external MCP server of `[mcp.NAME]`: its tools join the
//!   registry as `NAME.tool` ([`add_servers`]), offered to the profiles that name them,
//!   each call bounded by the tool deadline and audited like a plugin's.

mod client;
mod http;
mod server;

use std::sync::Arc;
use std::time::Duration;

pub use client::McpClient;
pub use server::{Principal, ToolServer};

use crate::config::Config;
use crate::plugin::Registry;

/// The least time a server is given to start: interpreters take a while to load.
const MIN_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts every `[mcp.NAME]` server of `config` and adds its tools to `registry`. What
/// did not work is recorded in the registry ([`Registry::external_problems`]): a server
/// that did not start offers no tools until the host starts again; a tool a model could
/// not be given is left out.
pub async fn add_servers(config: &Config, registry: &mut Registry) {
    let base = config
        .source
        .as_deref()
        .and_then(|path| path.parent())
        .map(|dir| {
            if dir.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                dir
            }
        })
        .unwrap_or(std::path::Path::new("."))
        .to_owned();
    let start_timeout = config.limits.tool.deadline.max(MIN_START_TIMEOUT);
    for spec in &config.mcp {
        let client = Arc::new(McpClient::new(
            spec.clone(),
            &base,
            start_timeout,
            registry.host(),
        ));
        match client.list_tools().await {
            Ok((tools, skipped)) => {
                for name in registry.add_external(client.clone(), tools) {
                    registry.add_external_problem(format!(
                        "tool `{name}` is left out: the name is taken"
                    ));
                }
                for problem in skipped {
                    registry.add_external_problem(problem);
                }
            }
            Err(reason) => registry.add_external_problem(format!(
                "{reason}; its tools are not offered until capstan starts again"
            )),
        }
    }
}
