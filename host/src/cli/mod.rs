//! The `capstan` command line.

mod paths;
mod plugins;
mod tool;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use crate::plugin::{ArtifactCache, Limits, PluginHost, Registry};

/// Capstan: a host runtime for LLM agents whose tools run as sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "capstan", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List and inspect tool plugins.
    #[command(subcommand)]
    Plugins(plugins::PluginsCommand),
    /// Call tools.
    #[command(subcommand)]
    Tool(tool::ToolCommand),
}

/// Where plugins come from and how calls are bounded; shared by the subcommands.
#[derive(Debug, Clone, Args)]
pub(crate) struct HostArgs {
    /// The plugins directory [default: $CAPSTAN_PLUGINS_DIR, else the `plugins` directory
    /// beside the binary's build directory, else ./target/plugins].
    #[arg(long, value_name = "DIR")]
    plugins_dir: Option<PathBuf>,
    /// Where compiled components are cached [default: $CAPSTAN_CACHE_DIR, else
    /// $XDG_CACHE_HOME/capstan, else ~/.cache/capstan].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile every time; use no artifact cache.
    #[arg(long)]
    no_cache: bool,
    /// Seconds one call may run.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    deadline: f64,
    /// MiB of linear memory one call may use.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    memory: usize,
}

impl HostArgs {
    fn limits(&self) -> anyhow::Result<Limits> {
        anyhow::ensure!(
            self.deadline.is_finite() && self.deadline > 0.0,
            "--deadline must be a positive number of seconds, got {}",
            self.deadline
        );
        anyhow::ensure!(
            (1..=4096).contains(&self.memory),
            "--memory must be between 1 and 4096 MiB, got {}",
            self.memory
        );
        Ok(Limits {
            deadline: Duration::from_secs_f64(self.deadline),
            memory_bytes: self.memory << 20,
            ..Limits::default()
        })
    }

    fn cache(&self) -> ArtifactCache {
        if self.no_cache {
            return ArtifactCache::disabled();
        }
        match self.cache_dir.clone().or_else(paths::default_cache_dir) {
            Some(dir) => ArtifactCache::new(dir),
            None => ArtifactCache::disabled(),
        }
    }

    pub(crate) fn host(&self) -> anyhow::Result<Arc<PluginHost>> {
        Ok(Arc::new(PluginHost::new(self.limits()?, self.cache())?))
    }

    pub(crate) async fn registry(&self) -> anyhow::Result<Registry> {
        let dir = match &self.plugins_dir {
            Some(dir) => dir.clone(),
            None => paths::default_plugins_dir()?,
        };
        let registry = Registry::load_dir(self.host()?, &dir)
            .await
            .with_context(|| format!("loading plugins from {}", dir.display()))?;
        for refused in registry.refused() {
            eprintln!("warning: plugin refused: {refused}");
        }
        Ok(registry)
    }
}

impl Cli {
    /// Runs the parsed command; the exit code says how it ended.
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Plugins(cmd) => cmd.run().await,
            Command::Tool(cmd) => cmd.run().await,
        }
    }
}
