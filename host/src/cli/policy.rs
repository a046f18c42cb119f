//! `capstan policy`.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use super::HostArgs;
use super::table::print_table;
use crate::agent::HOST_TOOLS;
use crate::policy::{Decision, ProcessKind, ToolNeeds};

#[derive(Debug, Args)]
pub(crate) struct PolicyCommand {
    #[command(flatten)]
    host: HostArgs,
}

impl PolicyCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        let registry = self.host.registry(&config).await?;
        let host_tools = HOST_TOOLS.iter().map(|tool| ToolNeeds {
            name: tool.name,
            capabilities: &[],
        });
        let plugin_tools = registry
            .plugins()
            .iter()
            .flat_map(|plugin| plugin.tools())
            .map(|tool| ToolNeeds {
                name: &tool.name,
                capabilities: &tool.capabilities,
            });
        let tools: Vec<ToolNeeds<'_>> = host_tools.chain(plugin_tools).collect();
        let header: Vec<&str> = std::iter::once("TOOL")
            .chain(ProcessKind::ALL.iter().map(|kind| kind.as_str()))
            .collect();
        let rows: Vec<Vec<String>> = config
            .policy
            .matrix(&tools)
            .into_iter()
            .map(|(tool, cells)| {
                std::iter::once(tool)
                    .chain(cells.iter().map(cell))
                    .collect()
            })
            .collect();
        let mut out = std::io::stdout().lock();
        match &config.source {
            Some(path) => writeln!(out, "policy from {}", path.display())?,
            None => writeln!(out, "policy from the built-in defaults")?,
        }
        print_table(&mut out, &header, &rows)?;
        Ok(ExitCode::SUCCESS)
    }
}

fn cell(decision: &Decision) -> String {
    match decision {
        Decision::Offered => "on".into(),
        Decision::NotInProfile => "- not in profile".into(),
        Decision::NotGranted(cap) => format!("- {cap} not granted"),
        Decision::NotLoaded => "- not loaded".into(),
    }
}
