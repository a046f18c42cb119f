//! The configuration file, `capstan.toml`.
//!
//! Every key is optional: a file is laid over the embedded defaults ([`DEFAULT_CONFIG`],
//! which `capstan init` writes out with comments), table by table. A bad file fails at start
//! with the file, the key and what is wrong.
//!
//! ```
//! use capstan_host::config::Config;
//! use capstan_host::policy::ProcessKind;
//!
//! let config = Config::parse("[limits]\nmax_turns = 4\n", "capstan.toml".as_ref()).unwrap();
//! assert_eq!(config.limits.max_turns, 4);
//! assert!(config.policy.profile(ProcessKind::Worker).names_tool("file_write"));
//!
//! let err = Config::parse("[limits]\nmax_turns = \"four\"\n", "capstan.toml".as_ref()).unwrap_err();
//! assert!(err.to_string().starts_with("capstan.toml:2:1: `limits.max_turns`:"));
//! ```

mod channels;
mod error;
mod locations;
mod mcp;
mod network;
mod overrides;
mod raw;
mod resolve;
mod serve;
mod store;
mod telemetry;
mod workspace;
mod writable_workspaces;

pub use crate::text::{SourceError, read_text, toml_error_message};
pub use channels::{
    ChannelSpec, ConversationPer, HookSignature, MAX_CHANNEL_NAME, MAX_POLL_WAIT_SECS, Senders,
};
pub use error::ConfigError;
use error::locate;
pub use locations::{GrantedBy, InsideWorkspace, LocationKind, Locations};
pub use mcp::{MAX_MCP_SERVER_NAME, McpServerSpec, McpTransport};
pub use overrides::Override;
pub use resolve::resolve;
pub use serve::{ServeSettings, TokenScope, TokenSpec, parse_addr};
pub use store::{DatabaseUrl, StoreSettings};
pub use workspace::{WorkspaceError, check_workspace, make_workspace};
pub use writable_workspaces::{RecordError, WRITABLE_WORKSPACES_FILE, WritableWorkspaces};

use std::path::{Path, PathBuf};
use std::time::Duration;

use overrides::{merge, set_dotted};
use raw::RawConfig;

use crate::dispatch::GateSettings;
use crate::flow::WorkspaceLabel;
use crate::net::NetSettings;
use crate::plugin::trust::Signers;
use crate::plugin::{Limits, Preferences};
use crate::policy::Policy;
use crate::secrets::SecretSpec;

/// The default configuration, with a comment on every key.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// The longest deadline one tool call may be given, in seconds (`limits.tool_deadline_secs`,
/// `--deadline`).
pub const MAX_TOOL_DEADLINE_SECS: f64 = 3600.0;

/// The most linear memory one tool call may be given, in MiB (`limits.tool_memory_mib`,
/// `--memory`).
pub const MAX_TOOL_MEMORY_MIB: u32 = 4096;

/// The file name `capstan` looks for in the current directory.
pub const CONFIG_FILE: &str = "capstan.toml";

/// A loaded, checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from; `None` for the embedded defaults.
    pub source: Option<PathBuf>,
    /// Name and directories.
    pub agent: AgentSettings,
    /// Bounds on tool calls and processes.
    pub limits: AgentLimits,
    /// `[plugins]`: which plugin provides a tool name several declare.
    pub prefer: Preferences,
    /// `[plugins.signers.NAME]` and `plugins.require_signatures`: the keys components may
    /// be signed by, and whether every one must be.
    pub signers: Signers,
    /// `plugins.accept_narrowing`: whether an update the lock does not pin is let in when
    /// it only narrows (no tool, capability or higher effect added; no description or
    /// schema changed).
    pub accept_narrowing: bool,
    /// `plugins.require_lock`: whether a missing `capstan.lock` lets nothing in (rather
    /// than pinning nothing), so a command started where the lock is not found never runs
    /// unpinned.
    pub require_lock: bool,
    /// `capstan.lock`, beside the config file (in the current directory without one).
    pub lock_file: PathBuf,
    /// The model provider.
    pub provider: ProviderSettings,
    /// `[net]`: the limits of plugins' outbound requests.
    pub net: NetSettings,
    /// `[serve]`: the address, limits and tokens of `capstan serve`.
    pub serve: ServeSettings,
    /// `[store]`: where the services keep what they keep.
    pub store: StoreSettings,
    /// `store.spill_file`: where a history the store refused is kept besides memory, so
    /// a stop or a crash during an outage loses none of it; it is written to the store at
    /// the next start.
    pub spill_file: Option<PathBuf>,
    /// `[telemetry]`: where traces go, and whether they carry content.
    pub telemetry: crate::telemetry::TraceSettings,
    /// `[secrets.NAME]`: the secrets plugins may use, and where their values come from.
    pub secrets: Vec<SecretSpec>,
    /// `[mcp.NAME]`: external MCP servers whose tools profiles may name (`NAME.*`).
    pub mcp: Vec<McpServerSpec>,
    /// `[channels.NAME]`: the messaging adapters `capstan serve` runs.
    pub channels: Vec<ChannelSpec>,
    /// One profile per process kind.
    pub policy: Policy,
}

/// `[agent]`: name and directories, resolved against the config file's directory.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSettings {
    /// The agent's name.
    pub name: String,
    /// The directory file tools work in.
    pub workspace: PathBuf,
    /// What a workspace file no process was seen writing is taken to be.
    pub workspace_label: WorkspaceLabel,
    /// Where the database and caches live.
    pub data_dir: PathBuf,
    /// The plugin directories the config names (`agent.plugins_dir`, one or a list), in
    /// the order they are searched; empty if unset.
    pub plugins_dirs: Vec<PathBuf>,
    /// Whether the first-party plugins (files, tasks, memory, web) load after them
    /// (`agent.first_party_plugins`, default true), wherever this capstan finds them.
    pub first_party_plugins: bool,
}

/// `[limits]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentLimits {
    /// Bounds on each tool call.
    pub tool: Limits,
    /// Workers one channel may run at once.
    pub max_workers_per_channel: u32,
    /// Branches one channel may run at once.
    pub max_branches_per_channel: u32,
    /// Conversations (channels and admin sessions) open at once in one host: each holds
    /// its history in memory, so this bounds what clients of `capstan serve` can make it
    /// hold.
    pub max_open_conversations: u32,
    /// Model turns one process may take for one input.
    pub max_turns: u32,
    /// The context window in tokens.
    pub context_window_tokens: u32,
    /// The share of the window that triggers compaction, in (0, 1].
    pub compaction_threshold: f64,
    /// How long a worker may run before it is stopped.
    pub worker_timeout: Duration,
    /// How long a parked call waits for a person's decision before its request is
    /// withdrawn (`limits.approval_wait_secs`).
    pub approval_wait: Duration,
    /// The prompt gate's timings.
    pub dispatch: GateSettings,
    /// The most one model answer may hold (its text, tool names and arguments), in bytes.
    pub max_answer_bytes: usize,
    /// The largest message an MCP result is sent in, in bytes (`limits.mcp_message_kib`):
    /// a longer result is cut to fit, saying so.
    pub mcp_message_bytes: usize,
    /// How often a conversation's history the store refused is written again
    /// (`limits.store_retry_ms`).
    pub store_retry: Duration,
    /// How long a door waits, once the store refused an exchange's history, before it
    /// answers with the reply marked as not yet stored (`limits.unstored_reply_secs`).
    pub unstored_reply: Duration,
    /// How many times a conversation that stops writes a history the store refused,
    /// `store_retry` apart, before it reports it not stored (`limits.stop_flush_attempts`).
    pub stop_flush_attempts: u32,
}

/// `[provider]`.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderSettings {
    /// Plays a script file; `None`: the built-in demo script.
    Scripted {
        /// The script file.
        script: Option<PathBuf>,
    },
    /// An OpenAI-compatible Chat Completions endpoint.
    OpenAi {
        /// e.g. `https://api.openai.com/v1`.
        base_url: String,
        /// The environment variable holding the API key.
        api_key_env: String,
        /// The model name.
        model: String,
    },
}

impl Config {
    /// The embedded defaults, with relative paths resolved against `base`.
    pub fn defaults(base: &Path) -> Self {
        Config::defaults_with(base, &[]).expect("the embedded default configuration is valid")
    }

    /// [`Config::defaults`] with `overrides` laid over them.
    pub fn defaults_with(base: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let mut config = Config::parse_in(DEFAULT_CONFIG, "<defaults>", base, overrides)?;
        config.source = None;
        Ok(config)
    }

    /// Reads and checks `path`, which must be UTF-8 TOML.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Config::load_with(path, &[])
    }

    /// [`Config::load`] with `overrides` laid over the file.
    pub fn load_with(path: &Path, overrides: &[Override]) -> Result<Self, ConfigError> {
        let text = read_text(path).map_err(|err| ConfigError {
            file: path.display().to_string(),
            key: None,
            position: None,
            message: match err {
                SourceError::Read { source, .. } => format!("cannot read: {source}"),
                SourceError::NotUtf8 { line, column, .. } => {
                    format!("not valid UTF-8 at line {line}, column {column}; save it as UTF-8")
                }
            },
        })?;
        Config::parse_with(&text, path, overrides)
    }

    /// `./capstan.toml` if it exists, else the defaults resolved against the current
    /// directory.
    pub fn load_or_default() -> Result<Self, ConfigError> {
        Config::load_or_default_with(&[])
    }

    /// [`Config::load_or_default`] with `overrides` laid over it.
    pub fn load_or_default_with(overrides: &[Override]) -> Result<Self, ConfigError> {
        let path = Path::new(CONFIG_FILE);
        if path.is_file() {
            return Config::load_with(path, overrides);
        }
        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
        Config::defaults_with(&cwd, overrides)
    }

    /// Checks `text` as the contents of `path` (used for messages and to resolve paths).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        Config::parse_with(text, path, &[])
    }

    /// [`Config::parse`] with `overrides` laid over `text`.
    pub fn parse_with(
        text: &str,
        path: &Path,
        overrides: &[Override],
    ) -> Result<Self, ConfigError> {
        let base = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
            _ => PathBuf::from("."),
        };
        let mut config = Config::parse_in(text, &path.display().to_string(), &base, overrides)?;
        config.source = Some(path.to_owned());
        Ok(config)
    }

    /// The defaults, `text` over them, then `overrides`: the file is checked on its own
    /// first, so that an error is blamed on the file or on the override that caused it.
    fn parse_in(
        text: &str,
        file: &str,
        base: &Path,
        overrides: &[Override],
    ) -> Result<Self, ConfigError> {
        let mut table = Config::layered(text, file)?;
        let config = Config::check_table(table.clone(), text, file, base)?;
        if overrides.is_empty() {
            return Ok(config);
        }
        for o in overrides {
            set_dotted(&mut table, &o.key, o.value.clone()).map_err(|message| ConfigError {
                file: o.flag.clone(),
                key: Some(o.key.clone()),
                position: None,
                message,
            })?;
        }
        Config::check_table(table, text, file, base).map_err(|err| {
            // The file alone was fine: the override of this key (else the last) broke it.
            let blamed = overrides
                .iter()
                .rev()
                .find(|o| {
                    err.key
                        .as_deref()
                        .is_some_and(|key| key.starts_with(&o.key))
                })
                .or(overrides.last())
                .expect("there are overrides");
            ConfigError {
                file: blamed.flag.clone(),
                position: None,
                ..err
            }
        })
    }

    /// The defaults with `text` laid over them.
    fn layered(text: &str, file: &str) -> Result<toml::Table, ConfigError> {
        let mut merged: toml::Table =
            toml::from_str(DEFAULT_CONFIG).expect("the embedded default configuration parses");
        let theirs: toml::Table = toml::from_str(text).map_err(|err| ConfigError {
            file: file.to_owned(),
            key: None,
            position: None,
            message: toml_error_message(text, &err),
        })?;
        merge(&mut merged, theirs);
        Ok(merged)
    }

    /// Reads `table` into a config and checks every key.
    fn check_table(
        table: toml::Table,
        text: &str,
        file: &str,
        base: &Path,
    ) -> Result<Self, ConfigError> {
        let error = |key: Option<String>, message: String| ConfigError {
            file: file.to_owned(),
            position: key.as_deref().and_then(|key| locate(text, key)),
            key,
            message,
        };
        let raw: RawConfig =
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|err| {
                let key = err.path().to_string();
                error(Some(key), err.into_inner().message().to_owned())
            })?;
        raw.check(base)
            .map_err(|(key, message)| error(Some(key), message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ProcessKind;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/capstan/capstan.toml"))
    }

    #[test]
    fn a_key_error_points_at_the_line_and_column_the_key_is_written_at() {
        let text = "# limits\n[agent]\nname = \"x\"\n\n[limits]\n  max_turns = 0\n";
        let err = Config::parse(text, Path::new("capstan.toml")).unwrap_err();
        assert_eq!(err.position, Some((6, 3)));
        assert!(
            err.to_string()
                .starts_with("capstan.toml:6:3: `limits.max_turns`: must be at least 1"),
            "{err}"
        );
        let dotted = Config::parse("limits.max_turns = 0\n", Path::new("c.toml")).unwrap_err();
        assert_eq!(dotted.position, Some((1, 1)), "{dotted}");
        let nested = "[profiles.worker]\ntools = [\"file_read\", 3]\n";
        let err = Config::parse(nested, Path::new("c.toml")).unwrap_err();
        assert_eq!(err.position, Some((2, 1)), "{err}");
        // Not written in the file (an override broke it): no position.
        let set = Override::parse("--set", "limits.max_turns=0").unwrap();
        let err = Config::parse_with("", Path::new("c.toml"), &[set]).unwrap_err();
        assert_eq!(err.position, None);
    }

    #[test]
    fn an_error_is_blamed_on_the_file_or_on_the_override_that_caused_it() {
        let path = Path::new("capstan.toml");
        let set = |assignment: &str| Override::parse("--set", assignment).unwrap();
        let err = Config::parse_with(
            "[limits]\nmax_turns = 0\n",
            path,
            &[set("limits.max_turns=5")],
        )
        .unwrap_err();
        assert_eq!(
            err.file, "capstan.toml",
            "the file is checked on its own first"
        );
        let err = Config::parse_with(
            "[limits]\ndispatch_timeout_secs = 30\n",
            path,
            &[
                set("agent.name=helper"),
                set("limits.dispatch_total_secs=10"),
            ],
        )
        .unwrap_err();
        assert_eq!(err.file, "--set limits.dispatch_total_secs=10");
        assert_eq!(err.key.as_deref(), Some("limits.dispatch_total_secs"));
        let ok = Config::parse_with(
            "",
            path,
            &[set("agent.name=helper"), set("limits.settle_ms=0")],
        )
        .unwrap();
        assert_eq!(ok.agent.name, "helper", "a bare word is a string");
        assert_eq!(ok.limits.dispatch.settle, std::time::Duration::ZERO);
    }

    #[test]
    fn the_defaults_are_the_design_matrix() {
        let config = Config::defaults(Path::new("/srv/agent"));
        assert_eq!(config.agent.workspace, Path::new("/srv/agent/workspace"));
        assert_eq!(config.limits.tool, Limits::default());
        let policy = &config.policy;
        let channel = policy.profile(ProcessKind::Channel);
        assert!(channel.names_tool("spawn_worker") && !channel.names_tool("file_read"));
        assert!(channel.grants().iter().next().is_none());
        let branch = policy.profile(ProcessKind::Branch);
        assert!(branch.names_tool("memory_recall") && !branch.names_tool("file_write"));
        let worker = policy.profile(ProcessKind::Worker);
        assert!(worker.names_tool("task_update") && !worker.names_tool("memory_recall"));
        assert!(
            policy
                .profile(ProcessKind::Cortex)
                .names_tool("anything_at_all")
        );
    }

    #[test]
    fn a_file_overrides_only_the_keys_it_sets_and_resolves_paths_beside_itself() {
        let config =
            parse("[agent]\nworkspace = \"ws\"\n[profiles.worker]\ntools = [\"file_read\"]\n")
                .unwrap();
        assert_eq!(config.agent.workspace, Path::new("/etc/capstan/ws"));
        assert_eq!(config.agent.data_dir, Path::new("/etc/capstan/.capstan"));
        let worker = config.policy.profile(ProcessKind::Worker);
        assert!(worker.names_tool("file_read") && !worker.names_tool("file_write"));
        assert!(
            worker.grants().allows(&capstan_caps::Capability::FsWrite),
            "capabilities kept"
        );
    }

    #[test]
    fn errors_name_the_file_the_key_and_the_problem() {
        let cases = [
            (
                "[limits]\nmax_turns = 0\n",
                "`limits.max_turns`: must be at least 1",
            ),
            (
                "[limits]\ntool_memory_mib = \"lots\"\n",
                "`limits.tool_memory_mib`: invalid type",
            ),
            (
                "[limits]\ncompaction_threshold = 1.5\n",
                "`limits.compaction_threshold`",
            ),
            ("[agent]\nwrokspace = \"x\"\n", "unknown field `wrokspace`"),
            (
                "[profiles.workr]\ntools = []\ncapabilities = []\n",
                "`profiles.workr`: unknown process kind",
            ),
            (
                "[profiles.worker]\ncapabilities = [\"fs.read\", \"fs.root\"]\n",
                "`profiles.worker.capabilities[1]`: unknown capability `fs.root`",
            ),
            (
                "[profiles.branch]\ntools = [\"file_[\"]\n",
                "`profiles.branch.tools`: bad tool pattern",
            ),
            (
                "[provider]\nkind = \"openai\"\n",
                "`provider.base_url`: required",
            ),
            (
                "[provider]\nkind = \"claude\"\n",
                "`provider.kind`: unknown provider",
            ),
            ("[agent\n", "not valid TOML at line 1, column "),
            (
                "[limits]\ndispatch_hold_ms = 600000\n",
                "`limits.dispatch_hold_ms`: must be at most 60000 ms",
            ),
            (
                "[limits]\ndispatch_timeout_secs = 0\n",
                "`limits.dispatch_timeout_secs`: must be more than 0",
            ),
            (
                "[limits]\ndispatch_timeout_secs = 60\ndispatch_total_secs = 30\n",
                "`limits.dispatch_total_secs`: must be at least limits.dispatch_timeout_secs (60)",
            ),
            (
                "[limits]\ndispatch_total_secs = 1e9\n",
                "`limits.dispatch_total_secs`: must be at least",
            ),
            (
                "[limits]\nmax_answer_kib = 0\n",
                "`limits.max_answer_kib`: must be 1 to 262144 KiB",
            ),
            (
                "[limits]\nmax_answer_kib = 99999999\n",
                "`limits.max_answer_kib`: must be 1 to 262144 KiB",
            ),
            (
                "[limits]\ntool_output_kib = 0\n",
                "`limits.tool_output_kib`: must be 1 to 16384 KiB, got 0",
            ),
            (
                "[limits]\nmcp_message_kib = 8\n",
                "`limits.mcp_message_kib`: must be 64 to 65536 KiB, got 8",
            ),
            (
                "[limits]\nworker_timeout_secs = 0\n",
                "`limits.worker_timeout_secs`: must be 1 to 86400 seconds",
            ),
            (
                "[limits]\nmax_warm_instances = 5000\n",
                "`limits.max_warm_instances`: must be at most 4096, got 5000",
            ),
            (
                "[plugins]\ninstance_reuse = { files = \"forever\" }\n",
                "`plugins.instance_reuse.files`: must be \"call\"",
            ),
            (
                "[profiles.worker]\ninstance_reuse = \"always\"\n",
                "`profiles.worker.instance_reuse`: must be \"call\" (a fresh instance per call)",
            ),
        ];
        for (text, expected) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.starts_with("/etc/capstan/capstan.toml:"), "{err}");
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_openai_provider_takes_its_settings() {
        let config = parse(
            "[provider]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:8080/v1\"\napi_key_env = \"KEY\"\nmodel = \"m\"\n",
        )
        .unwrap();
        assert_eq!(
            config.provider,
            ProviderSettings::OpenAi {
                base_url: "http://127.0.0.1:8080/v1".into(),
                api_key_env: "KEY".into(),
                model: "m".into()
            }
        );
    }

    #[test]
    fn instance_reuse_is_call_unless_a_level_says_process_and_none_says_call() {
        use crate::policy::InstanceReuse::{Call, Process};
        let defaults = Config::defaults(Path::new("/srv/agent"));
        let reuse = defaults.policy.reuse();
        assert_eq!(reuse.decide(ProcessKind::Worker, "files"), Process);
        assert_eq!(reuse.decide(ProcessKind::Worker, "web"), Call);
        assert_eq!(reuse.decide(ProcessKind::Branch, "someone_elses"), Call);
        let config = parse(
            "[plugins]\ninstance_reuse = { files = \"call\", mine = \"process\" }\n\
             [profiles.cortex]\ninstance_reuse = \"call\"\n\
             [profiles.branch]\ninstance_reuse = \"process\"\n",
        )
        .unwrap();
        let reuse = config.policy.reuse();
        assert_eq!(reuse.decide(ProcessKind::Worker, "files"), Call);
        assert_eq!(
            reuse.decide(ProcessKind::Worker, "tasks"),
            Process,
            "merged"
        );
        assert_eq!(reuse.decide(ProcessKind::Worker, "mine"), Process);
        assert_eq!(reuse.decide(ProcessKind::Cortex, "mine"), Call);
        assert_eq!(reuse.decide(ProcessKind::Branch, "web"), Process);
        assert_eq!(
            reuse.decide(ProcessKind::Branch, "files"),
            Call,
            "call wins"
        );
    }
}
