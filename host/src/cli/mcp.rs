//! `capstan mcp`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use rmcp::ServiceExt as _;

use super::HostArgs;
use super::store::StoreArgs;
use crate::ids::ProcessKind;
use crate::mcp::ToolServer;
use crate::tools::{ToolCatalog, ToolRouter};

#[derive(Debug, Args)]
pub(crate) struct McpCommand {
    /// Serve the tools this profile is offered, with its grants (channel, branch, worker,
    /// compactor, cortex).
    #[arg(long, value_name = "PROFILE")]
    profile: ProcessKind,
    /// The workspace the fs capabilities apply to [default: agent.workspace].
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    host: HostArgs,
}

impl McpCommand {
    /// Serves MCP on standard input and output until the client closes them. Standard
    /// output carries the protocol only; warnings and logs go to standard error.
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        let workspace = self
            .workspace
            .unwrap_or_else(|| config.agent.workspace.clone());
        let grants = config.policy.profile(self.profile).grants().clone();
        let locations = self
            .host
            .check_call_locations(&config, &workspace, &grants)?;
        crate::config::make_workspace(&workspace)?;
        super::record_if_writable(locations)?;
        // The audit rows go where the agent's do (so `capstan serve` and the API show them),
        // or with `--store memory` nowhere that outlives the command.
        let services = self.store.open(&config).await?;
        let host = self.host.host(&config)?.with_services(services);
        let registry = Arc::new(
            self.host
                .registry_on(&config, host, Some(crate::mcp::Servers::Named))
                .await?,
        );
        let catalog = Arc::new(ToolCatalog::new(&registry, &config.policy));
        let router = Arc::new(ToolRouter::new(registry.clone(), catalog, workspace));
        let server = ToolServer::new(router, self.profile)
            .with_max_message_bytes(config.limits.mcp_message_bytes);
        let tools = server.tools().len();
        crate::say!(
            "capstan mcp: serving {tools} tool(s) of the {} profile on stdio",
            self.profile
        );
        // Standard output carries nothing that did not pass the redactor.
        let redactor = registry.host().network().secrets().redactor().clone();
        #[allow(clippy::disallowed_methods)] // its standard output is wrapped just below
        let (stdin, stdout) = rmcp::transport::stdio();
        let running = server
            .serve((stdin, redactor.outbound_writer(stdout)))
            .await
            .context("the MCP handshake on stdio failed")?;
        running.waiting().await.context("serving MCP on stdio")?;
        Ok(ExitCode::SUCCESS)
    }
}
