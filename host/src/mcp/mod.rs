//! Capstan and the Model Context Protocol, both ways.
//!
//! - [`ToolServer`] serves the plugin tools one profile is offered to any MCP client
//!   (`capstan mcp --profile worker` over stdio, `/mcp/worker` on `capstan serve`). A
//!   call from the client takes the path an agent's call takes: the policy's decision for
//!   the profile, the profile's grants, a fresh sandbox under the deadline and memory
//!   limits, and an audit row whose process is the client (`mcp:NAME`). A denial, a trap
//!   or a deadline is a tool error carrying the reason, never a dropped connection; a
//!   result too long for one message is cut to fit it ([`fit_message`]), saying so.
//! - [`McpClient`] reaches an external MCP server of `[mcp.NAME]`: its tools join the
//!   registry as `NAME.tool` ([`add_servers`]), offered to the profiles that name them,
//!   each call bounded by the tool deadline and audited like a plugin's.

mod client;
mod ended;
mod fit;
mod http;
mod remote_tool;
mod server;
mod stdio;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use client::McpClient;
pub use fit::{DEFAULT_MESSAGE_BYTES, MESSAGE_KEY, fit_message};
pub use server::{Principal, ToolServer};

use crate::config::{Config, McpServerSpec, McpTransport};
use crate::plugin::{ExternalTools as _, Registry};

/// The least time a server is given to start: interpreters take a while to load.
const MIN_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Which `[mcp.NAME]` servers a command starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Servers<'a> {
    /// Every server some profile can be offered tools of (`NAME.*`, `*.search`): the
    /// agent, `capstan serve`, `capstan mcp`, `capstan policy`. The others are reported
    /// and not started.
    Named,
    /// Only the server of one tool (`NAME.tool`), as `capstan tool call` needs; none for
    /// a tool without a `.`.
    OfTool(&'a str),
}

/// Starts the `[mcp.NAME]` servers `which` selects, all at once, and adds their tools to
/// `registry`. What did not work is recorded in the registry
/// ([`Registry::external_problems`]): a server that did not start offers no tools until
/// the host starts again, and a call of one of its tools says why; a tool a plugin could
/// not offer is left out.
pub async fn add_servers(config: &Config, registry: &mut Registry, which: Servers<'_>) {
    let base = config_dir(config);
    let start_timeout = config.limits.tool.deadline.max(MIN_START_TIMEOUT);
    let mut starting = Vec::new();
    for spec in &config.mcp {
        let name = &spec.name;
        match which {
            Servers::OfTool(tool) if tool.split_once('.').map(|(ns, _)| ns) != Some(name) => {
                continue;
            }
            Servers::Named if !config.policy.names_namespace(name) => {
                registry.add_source_down(
                    name,
                    format!(
                        "MCP server [mcp.{name}] is not started: no profile names its tools \
                         (add \"{name}.*\" to a profile's tools)"
                    ),
                );
                continue;
            }
            _ => {}
        }
        let missing: Vec<&str> = secrets_of(spec)
            .iter()
            .filter(|secret| registry.host().network().secrets().get(secret).is_none())
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            registry.add_source_down(
                name,
                format!(
                    "MCP server [mcp.{name}] is not started by this command, which reads no \
                     secrets (it needs {}); `capstan serve`, `run` and `tool call` reach it",
                    missing.join(", ")
                ),
            );
            continue;
        }
        let client = Arc::new(McpClient::new(
            spec.clone(),
            &base,
            start_timeout,
            registry.host(),
        ));
        starting.push(async move {
            let listed = client.list_tools().await;
            (client, listed)
        });
    }
    for (client, listed) in futures_util::future::join_all(starting).await {
        let name = client.name().to_owned();
        match listed {
            Ok((tools, skipped)) => {
                for taken in registry.add_external(client, tools) {
                    registry.add_external_problem(format!(
                        "tool `{taken}` is left out: the name is taken"
                    ));
                }
                for problem in skipped {
                    registry.add_external_problem(problem);
                }
            }
            Err(reason) => registry.add_source_down(
                &name,
                format!("{reason}; its tools are not offered until capstan starts again"),
            ),
        }
    }
}

/// The secrets a server's config names.
fn secrets_of(spec: &McpServerSpec) -> &[String] {
    match &spec.transport {
        McpTransport::Stdio { secrets, .. } | McpTransport::Http { secrets, .. } => secrets,
    }
}

/// The directory of the config file, where a stdio server runs unless its `cwd` says.
fn config_dir(config: &Config) -> PathBuf {
    match config.source.as_deref().and_then(Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}
