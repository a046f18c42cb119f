//! `capstan plugins list|inspect|new`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use super::HostArgs;
use super::new_plugin::NewCommand;
use super::table::print_table;
use crate::plugin::{LoadedPlugin, ToolInfo};

#[derive(Debug, Subcommand)]
pub(crate) enum PluginsCommand {
    /// Every loaded tool with its plugin file, WIT version and declared capabilities.
    List {
        #[command(flatten)]
        host: HostArgs,
    },
    /// One component: its tools, capabilities and imports, or why it is refused.
    Inspect {
        /// The component file.
        file: PathBuf,
        #[command(flatten)]
        host: HostArgs,
    },
    /// Write a working plugin project: `--lang rust|python|js NAME`.
    New(NewCommand),
}

impl PluginsCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        match self {
            PluginsCommand::List { host } => {
                let config = host.config()?;
                let registry = host
                    .registry_on(&config, host.inspecting_host(&config)?, None)
                    .await?;
                let rows: Vec<Vec<String>> = registry
                    .plugins()
                    .iter()
                    .flat_map(|plugin| plugin.tools().iter().map(move |tool| row(plugin, tool)))
                    .collect();
                let mut out = crate::secrets::stdout();
                print_table(&mut out, &["TOOL", "PLUGIN", "WIT", "CAPABILITIES"], &rows)?;
                if rows.is_empty() {
                    writeln!(out, "(no tools loaded)")?;
                }
                Ok(ExitCode::SUCCESS)
            }
            PluginsCommand::New(new) => new.run(),
            PluginsCommand::Inspect { file, host } => {
                match host.host(&host.config()?)?.load(&file).await {
                    Ok(plugin) => {
                        print_plugin(&mut crate::secrets::stdout(), &plugin)?;
                        Ok(ExitCode::SUCCESS)
                    }
                    Err(err) => {
                        crate::say!("refused: {err}");
                        Ok(ExitCode::FAILURE)
                    }
                }
            }
        }
    }
}

fn row(plugin: &LoadedPlugin, tool: &ToolInfo) -> Vec<String> {
    vec![
        tool.name.clone(),
        plugin.path().display().to_string(),
        plugin.wit_version().to_owned(),
        capabilities(tool),
    ]
}

fn capabilities(tool: &ToolInfo) -> String {
    if tool.capabilities.is_empty() {
        return "(none)".into();
    }
    let names: Vec<String> = tool.capabilities.iter().map(ToString::to_string).collect();
    names.join(",")
}

fn print_plugin(out: &mut impl Write, plugin: &LoadedPlugin) -> std::io::Result<()> {
    writeln!(out, "plugin:  {}", plugin.name())?;
    writeln!(out, "file:    {}", plugin.path().display())?;
    writeln!(out, "wit:     capstan:plugin@{}", plugin.wit_version())?;
    writeln!(out, "compile: {}", plugin.cache_outcome().as_str())?;
    writeln!(out, "imports:")?;
    for import in plugin.imports() {
        writeln!(out, "  {import}")?;
    }
    writeln!(out, "tools:")?;
    for tool in plugin.tools() {
        writeln!(out, "  {}  [{}]", tool.name, capabilities(tool))?;
        writeln!(out, "    {}", tool.description)?;
        writeln!(out, "    args: {}", tool.args_schema)?;
    }
    Ok(())
}
