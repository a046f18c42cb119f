//! The `capstan` command line.

mod agent;
mod approvals;
mod audit;
mod build_plugin;
mod follow;
mod init;
mod mcp;
mod network;
mod new_plugin;
mod paths;
mod plugins;
mod policy;
mod serve;
mod status;
mod store;
mod table;
mod tool;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use clap::{Args, Parser, Subcommand};

use capstan_caps::Capability;

use crate::config::{
    Config, LocationKind, Locations, Override, ProviderSettings, WritableWorkspaces,
};
use crate::mcp::Servers;
use crate::net::NetHost;
use crate::plugin::{ArtifactCache, CallLog, Limits, LoadProgress, PluginHost, Registry};
use crate::policy::{Grants, ProcessKind};
use crate::secrets::SecretSource;

/// Capstan: a host runtime for LLM agents whose tools run as sandboxed WebAssembly components.
#[derive(Debug, Parser)]
#[command(name = "capstan", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Chat with the agent in the terminal; worker and branch status lines show as they run.
    Chat(agent::ChatCommand),
    /// Run the demo: gather open items from notes, create tasks, answer follow-ups.
    Demo(agent::DemoCommand),
    /// Send one message, print the replies, and exit when all delegated work is done.
    Run(agent::RunCommand),
    /// List the taskboard.
    Tasks(agent::TasksCommand),
    /// Show where the store is; on PostgreSQL, the hosts' runs and who owns each session.
    Status(status::StatusCommand),
    /// List the tool calls parked for a person's approval, and approve or deny them.
    Approvals(approvals::ApprovalsCommand),
    /// Verify the signed audit chain of approvals and refusals, or print this host's key.
    Audit(audit::AuditCommand),
    /// Write a commented default capstan.toml.
    Init(init::InitCommand),
    /// List and inspect tool plugins.
    #[command(subcommand)]
    Plugins(plugins::PluginsCommand),
    /// Print the tool x process matrix, with the reason for every tool a process is not offered.
    Policy(policy::PolicyCommand),
    /// Call tools.
    #[command(subcommand)]
    Tool(tool::ToolCommand),
    /// Serve the agent over HTTP: a JSON API, live events, an OpenAI-compatible chat
    /// endpoint and a web page.
    Serve(serve::ServeCommand),
    /// Serve one profile's tools over the Model Context Protocol on stdio, for any MCP
    /// client: each call runs sandboxed with the profile's grants and is audited.
    Mcp(mcp::McpCommand),
}

/// The config file, where plugins come from and how calls are bounded; shared by the
/// subcommands. Flags override the config file.
#[derive(Debug, Clone, Args)]
pub(crate) struct HostArgs {
    /// The config file [default: ./capstan.toml if present, else the built-in defaults].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A plugins directory, instead of agent.plugins_dir (repeatable: searched in order).
    /// The first-party plugins load after them unless agent.first_party_plugins = false:
    /// from $CAPSTAN_PLUGINS_DIR, else the `plugins` directory beside the binary's build
    /// directory, else ./target/plugins.
    #[arg(long, value_name = "DIR")]
    plugins_dir: Vec<PathBuf>,
    /// Where compiled components are cached [default: $CAPSTAN_CACHE_DIR, else
    /// $XDG_CACHE_HOME/capstan, else ~/.cache/capstan].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Compile every time; use no artifact cache.
    #[arg(long)]
    no_cache: bool,
    /// Seconds one call may run, at most 3600: `--set limits.tool_deadline_secs=SECS`
    /// [default: 10].
    #[arg(long, value_name = "SECS")]
    deadline: Option<f64>,
    /// MiB of linear memory one call may use, 1 to 4096: `--set limits.tool_memory_mib=MIB`
    /// [default: 64].
    #[arg(long, value_name = "MIB")]
    memory: Option<u64>,
    /// Sets a config key for this command, with the names and checks of capstan.toml, e.g.
    /// `--set limits.max_turns=4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// The record of writable workspaces, once read.
    #[arg(skip)]
    recorded: OnceLock<WritableWorkspaces>,
}

impl HostArgs {
    /// The config named by `--config`, else `./capstan.toml`, else the defaults. A config
    /// inside a workspace an earlier command let plugins write is refused unread: a plugin
    /// may have planted it. So is a config whose cache, plugins, data dir or script lies
    /// in one, before any command uses them.
    pub(crate) fn config(&self) -> anyhow::Result<Config> {
        let path = self
            .config
            .clone()
            .unwrap_or_else(|| PathBuf::from(crate::config::CONFIG_FILE));
        check_config_path(self.writable_workspaces()?.clone(), &path)?;
        let overrides = self.overrides()?;
        let config = match &self.config {
            Some(path) => Config::load_with(path, &overrides)?,
            None => Config::load_or_default_with(&overrides)?,
        };
        self.locations(&config, Path::new("."), false)?.check()?;
        // Whatever the command prints (a task a model titled, an error) passes the
        // terminal's redactor, which knows every value that can be read.
        crate::app::hide_readable_values(&config);
        Ok(config)
    }

    /// The workspaces earlier commands let plugins write, read once per command.
    pub(crate) fn writable_workspaces(&self) -> anyhow::Result<&WritableWorkspaces> {
        if let Some(recorded) = self.recorded.get() {
            return Ok(recorded);
        }
        let recorded = read_writable_workspaces()?;
        Ok(self.recorded.get_or_init(|| recorded))
    }

    /// `--set`, `--deadline` and `--memory`, as config overrides.
    pub(crate) fn overrides(&self) -> anyhow::Result<Vec<Override>> {
        let mut overrides = Vec::new();
        if let Some(secs) = self.deadline {
            let flag = format!("--deadline {secs}");
            let value = toml::Value::Float(secs);
            overrides.push(Override::new(flag, "limits.tool_deadline_secs", value));
        }
        if let Some(mib) = self.memory {
            let flag = format!("--memory {mib}");
            // Past i64, TOML's integer: refused by the same range check, naming the flag.
            let value = toml::Value::Integer(i64::try_from(mib).unwrap_or(i64::MAX));
            overrides.push(Override::new(flag, "limits.tool_memory_mib", value));
        }
        for assignment in &self.set {
            overrides.push(Override::parse("--set", assignment)?);
        }
        Ok(overrides)
    }

    /// The artifact cache directory, unless `--no-cache`.
    fn cache_dir(&self) -> Option<PathBuf> {
        if self.no_cache {
            return None;
        }
        self.cache_dir.clone().or_else(paths::default_cache_dir)
    }

    /// The artifact cache, opened and checked now.
    pub(crate) fn cache(&self) -> anyhow::Result<ArtifactCache> {
        Ok(match self.cache_dir() {
            Some(dir) => ArtifactCache::open(dir)?,
            None => ArtifactCache::disabled(),
        })
    }

    /// The plugin search path: `--plugins-dir` (else `agent.plugins_dir`), then the
    /// first-party plugins' directory unless `agent.first_party_plugins = false`.
    pub(crate) fn plugins_dirs(&self, config: &Config) -> anyhow::Result<Vec<PathBuf>> {
        let mut dirs = if self.plugins_dir.is_empty() {
            config.agent.plugins_dirs.clone()
        } else {
            self.plugins_dir.clone()
        };
        if config.agent.first_party_plugins {
            match paths::default_plugins_dir() {
                Ok(first_party) => {
                    let same = |dir: &PathBuf| paths::same_dir(dir, &first_party);
                    if !dirs.iter().any(same) {
                        dirs.push(first_party);
                    }
                }
                // Your own directories are enough; with none, say where to find plugins.
                Err(err) if dirs.is_empty() => return Err(err),
                Err(_) => {}
            }
        }
        anyhow::ensure!(
            !dirs.is_empty(),
            "no plugins directory: agent.first_party_plugins is false and neither \
             agent.plugins_dir nor --plugins-dir names one"
        );
        Ok(dirs)
    }

    /// Every one of the host's own files this command or a later one uses (the config or
    /// where it is looked up, the record of writable workspaces, the cache, the plugins,
    /// the data dir, the script), for `workspace`, which plugins may write if `writable`.
    pub(crate) fn locations(
        &self,
        config: &Config,
        workspace: &Path,
        writable: bool,
    ) -> anyhow::Result<Locations> {
        let mut locations = Locations::new(workspace, writable);
        locations.recorded = self.writable_workspaces()?.clone();
        if let Some(file) = locations.recorded.file() {
            locations.add(LocationKind::WorkspaceRecord, file.to_owned());
        }
        if let Some(path) = &config.source {
            locations.add(LocationKind::Config, path);
        }
        if config.source.is_none() && self.config.is_none() {
            // Where the next command looks for its config, whether or not a file is
            // there yet: a plugin must not be able to plant one.
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            locations.add(
                LocationKind::ConfigLookup,
                cwd.join(crate::config::CONFIG_FILE),
            );
        }
        if let Some(dir) = self.cache_dir() {
            locations.add(LocationKind::CacheDir, dir);
        }
        for dir in self.plugins_dirs(config).unwrap_or_default() {
            locations.add(LocationKind::PluginsDir, dir);
        }
        locations.add(LocationKind::DataDir, &config.agent.data_dir);
        locations.add(LocationKind::LockFile, &config.lock_file);
        if let Some(spill) = &config.spill_file {
            locations.add(LocationKind::SpillFile, spill);
        }
        let secret_files = config.secrets.iter().map(|s| &s.source);
        for source in secret_files.chain(config.serve.tokens.iter().map(|t| &t.source)) {
            if let SecretSource::File(path) = source {
                locations.add(LocationKind::SecretFile, path);
            }
        }
        if let ProviderSettings::Scripted {
            script: Some(script),
        } = &config.provider
        {
            locations.add(LocationKind::Script, script);
        }
        Ok(locations)
    }

    /// What the agent commands (run, chat, demo) use: every location, with the configured
    /// workspace, writable when some profile grants `fs.write`.
    pub(crate) fn agent_locations(&self, config: &Config) -> anyhow::Result<Locations> {
        let writable = ProcessKind::ALL.iter().any(|kind| {
            config
                .policy
                .profile(*kind)
                .grants()
                .allows(&Capability::FsWrite)
        });
        let mut locations = self.locations(config, &config.agent.workspace, writable)?;
        locations.alternative =
            Some("remove fs.write from every profile's capabilities".to_owned());
        Ok(locations)
    }

    /// Refuses a tool call granted `fs.write` on `workspace` when any of the host's files
    /// lies inside it; the locations, checked, to record just before the call.
    pub(crate) fn check_call_locations(
        &self,
        config: &Config,
        workspace: &Path,
        grants: &Grants,
    ) -> anyhow::Result<Locations> {
        let writable = grants.allows(&Capability::FsWrite);
        let mut locations = self.locations(config, workspace, writable)?;
        locations.alternative = Some("call without granting fs.write".to_owned());
        locations.check()?;
        Ok(locations)
    }

    /// A plugin host that runs calls: the secrets' values are read (and a missing one
    /// stops the command, naming it).
    pub(crate) fn host(&self, config: &Config) -> anyhow::Result<PluginHost> {
        self.host_with(config, config.limits.tool.clone())
    }

    /// [`HostArgs::host`] for a command that makes one call and exits: its pool is sized
    /// for that ([`Limits::for_one_call`]).
    pub(crate) fn one_call_host(&self, config: &Config) -> anyhow::Result<PluginHost> {
        self.host_with(config, config.limits.tool.for_one_call())
    }

    fn host_with(&self, config: &Config, limits: Limits) -> anyhow::Result<PluginHost> {
        let secrets = crate::app::load_secrets(config)?;
        // Its calls are traced as an agent's are, through the redactor that knows the
        // secrets from here.
        crate::telemetry::start_traces(&config.telemetry)?;
        Ok(self
            .new_host(limits)?
            .with_network(NetHost::new(config.net.clone(), secrets))
            .with_trust(crate::app::trust(config)?))
    }

    /// A plugin host for commands that load plugins but run no call (`policy`, `plugins`):
    /// no secret is read, so they work where the secrets' sources are absent.
    pub(crate) fn inspecting_host(&self, config: &Config) -> anyhow::Result<PluginHost> {
        Ok(self
            .new_host(config.limits.tool.clone())?
            .with_trust(crate::app::trust(config)?))
    }

    /// A plugin host that calls nothing and checks signatures but no lock: what `capstan
    /// plugins lock` and `accept` pin, and `diff` compares. It reads the secrets an MCP
    /// server needs to start.
    pub(crate) fn unpinned_host(&self, config: &Config) -> anyhow::Result<PluginHost> {
        // The lock itself is not read: `plugins lock` writes a damaged one anew.
        let trust = crate::plugin::trust::Trust {
            signers: config.signers.clone(),
            pins: None,
        };
        let secrets = crate::app::load_secrets(config)?;
        Ok(self
            .new_host(config.limits.tool.clone())?
            .with_network(NetHost::new(config.net.clone(), secrets))
            .with_trust(trust))
    }

    /// A plugin host with `limits` and the cache, saying on standard error when it
    /// compiles a large component (a Python or JavaScript one takes seconds).
    fn new_host(&self, limits: Limits) -> anyhow::Result<PluginHost> {
        Ok(PluginHost::new(limits, self.cache()?)?.with_progress(Arc::new(show_long_compile)))
    }

    /// The registry of the configured plugins directory on `host`, with the tools of the
    /// `[mcp.NAME]` servers `servers` selects (none for `None`).
    pub(crate) async fn registry_on(
        &self,
        config: &Config,
        host: PluginHost,
        servers: Option<Servers<'_>>,
    ) -> anyhow::Result<Registry> {
        let dirs = self.plugins_dirs(config)?;
        // Calls are recorded where the host's services keep them (nowhere, for a host
        // without), redacted by the host's secrets.
        let log = CallLog::new(
            host.audit().clone(),
            host.network().secrets().redactor().clone(),
        );
        let mut registry =
            Registry::load_dirs_preferring(Arc::new(host), log, &dirs, &config.prefer).await?;
        if let Some(servers) = servers {
            crate::mcp::add_servers(config, &mut registry, servers).await;
        }
        warn_refused(&registry);
        Ok(registry)
    }
}

/// Components at least this large take long enough to compile to say so.
const LONG_COMPILE_BYTES: usize = 4 << 20;

/// Shows the compile of a large component on standard error, with how long it took.
fn show_long_compile(step: LoadProgress<'_>) {
    let name = |path: &Path| {
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    match step {
        LoadProgress::Compiling { path, bytes } if bytes >= LONG_COMPILE_BYTES => {
            crate::say!(
                "compiling {} ({:.1} MB) for this machine; the artifact cache keeps it for \
                 later loads",
                name(path),
                bytes as f64 / 1e6
            );
        }
        LoadProgress::Compiled { path, bytes, took } if bytes >= LONG_COMPILE_BYTES => {
            crate::say!("compiled {} in {:.1} s", name(path), took.as_secs_f64());
        }
        _ => {}
    }
}

/// Warns of every plugin `registry` refused, every MCP server or tool it could not add,
/// and every plugin tool the catalog leaves out for taking a host tool's name, one line
/// each.
pub(crate) fn warn_refused(registry: &Registry) {
    for refused in registry.refused() {
        crate::say!(
            "warning: plugin refused: {}",
            crate::text::one_line(&refused.to_string())
        );
    }
    for problem in registry.external_problems() {
        crate::say!("warning: {}", crate::text::one_line(problem));
    }
    for clash in crate::tools::ToolCatalog::clashes(registry) {
        crate::say!("warning: {}", crate::text::one_line(&clash));
    }
}

/// The record of the workspaces earlier commands let plugins write, from the state dir.
pub(crate) fn read_writable_workspaces() -> anyhow::Result<WritableWorkspaces> {
    let state_dir = paths::default_state_dir()?;
    if state_dir.is_none() {
        crate::say!(
            "warning: no state dir (set CAPSTAN_STATE_DIR, XDG_STATE_HOME or HOME): a config \
             plugins planted in an earlier workspace cannot be told apart"
        );
    }
    Ok(WritableWorkspaces::in_state_dir(state_dir.as_deref())?)
}

/// Refuses a config file (to read or to write) at `path` inside a workspace in `recorded`.
pub(crate) fn check_config_path(recorded: WritableWorkspaces, path: &Path) -> anyhow::Result<()> {
    let kind = if path.exists() {
        LocationKind::Config
    } else {
        LocationKind::ConfigLookup
    };
    let mut locations = Locations::new(".", false);
    locations.recorded = recorded;
    locations.add(kind, path);
    Ok(locations.check()?)
}

/// Records the workspace of `locations`, already checked, just before plugins are let
/// write it.
pub(crate) fn record_if_writable(mut locations: Locations) -> anyhow::Result<()> {
    if locations.workspace_writable {
        locations.recorded.add(&locations.workspace)?;
    }
    Ok(())
}

impl Cli {
    /// Runs the parsed command; the exit code says how it ended.
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Chat(cmd) => cmd.run().await,
            Command::Demo(cmd) => cmd.run().await,
            Command::Run(cmd) => cmd.run().await,
            Command::Serve(cmd) => cmd.run().await,
            Command::Mcp(cmd) => cmd.run().await,
            Command::Tasks(cmd) => cmd.run().await,
            Command::Status(cmd) => cmd.run().await,
            Command::Approvals(cmd) => cmd.run().await,
            Command::Audit(cmd) => cmd.run().await,
            Command::Init(cmd) => cmd.run(),
            Command::Plugins(cmd) => cmd.run().await,
            Command::Policy(cmd) => cmd.run().await,
            Command::Tool(cmd) => cmd.run().await,
        }
    }
}
