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
//! assert!(err.to_string().starts_with("capstan.toml: `limits.max_turns`:"));
//! ```

mod locations;
mod writable_workspaces;

pub use crate::text::{SourceError, read_text, toml_error_message};
pub use locations::{GrantedBy, InsideWorkspace, LocationKind, Locations, resolve};
pub use writable_workspaces::{RecordError, WRITABLE_WORKSPACES_FILE, WritableWorkspaces};

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::dispatch::GateSettings;
use crate::plugin::{Limits, Preferences};
use crate::policy::{Grants, Policy, ProcessKind, Profile};

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
    /// The model provider.
    pub provider: ProviderSettings,
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
    /// Where the database and caches live.
    pub data_dir: PathBuf,
    /// The plugins directory, if set.
    pub plugins_dir: Option<PathBuf>,
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
    /// Model turns one process may take for one input.
    pub max_turns: u32,
    /// The context window in tokens.
    pub context_window_tokens: u32,
    /// The share of the window that triggers compaction, in (0, 1].
    pub compaction_threshold: f64,
    /// How long a worker may run before it is stopped.
    pub worker_timeout: Duration,
    /// The prompt gate's timings.
    pub dispatch: GateSettings,
    /// The most one model answer may hold (its text, tool names and arguments), in bytes.
    pub max_answer_bytes: usize,
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

/// A configuration that cannot be used: the file, the key and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<defaults>`).
    pub file: String,
    /// The dotted key, when the problem is one key.
    pub key: Option<String>,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{}: `{key}`: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// One key of the config set for one command (`--set limits.max_turns=4`), laid over the
/// file with the same names and the same checks; an error it causes names the flag.
///
/// ```
/// use capstan_host::config::{Config, Override};
///
/// let four = Override::parse("--set", "limits.max_turns=4").unwrap();
/// let config = Config::parse_with("", "capstan.toml".as_ref(), &[four]).unwrap();
/// assert_eq!(config.limits.max_turns, 4);
///
/// let zero = Override::parse("--set", "limits.max_turns=0").unwrap();
/// let err = Config::parse_with("", "capstan.toml".as_ref(), &[zero]).unwrap_err();
/// assert_eq!(err.to_string(), "--set limits.max_turns=0: `limits.max_turns`: must be at least 1");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// How it was given, for messages: `--set limits.max_turns=0`, `--deadline 0`.
    flag: String,
    /// The dotted key.
    key: String,
    value: toml::Value,
}

impl Override {
    /// `key` set to `value`, given as `flag`.
    pub fn new(flag: impl Into<String>, key: impl Into<String>, value: toml::Value) -> Self {
        Override {
            flag: flag.into(),
            key: key.into(),
            value,
        }
    }

    /// `key=value` given with `flag`: the value is read as TOML (`4`, `true`, `"text"`,
    /// `["a", "b"]`), or taken as a string if it is not TOML (`agent.name=helper`).
    pub fn parse(flag: &str, assignment: &str) -> Result<Self, ConfigError> {
        let given = format!("{flag} {assignment}");
        let Some((key, value)) = assignment.split_once('=') else {
            return Err(ConfigError {
                file: given,
                key: None,
                message: "expected KEY=VALUE, e.g. limits.max_turns=4".into(),
            });
        };
        let key = key.trim();
        if key.is_empty() || key.split('.').any(str::is_empty) {
            return Err(ConfigError {
                file: given,
                key: None,
                message: "the key is empty; name it as in capstan.toml, e.g. limits.max_turns"
                    .into(),
            });
        }
        let value = value.trim();
        let value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut table| table.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_owned()));
        Ok(Override::new(given, key, value))
    }
}

/// Sets dotted `key` in `table`, making the tables on the way.
fn set_dotted(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().unwrap_or(key);
    let mut here = table;
    for part in parts {
        let next = here
            .entry(part)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = next
            .as_table_mut()
            .ok_or_else(|| format!("`{part}` is not a table, so `{key}` cannot be set"))?;
    }
    here.insert(last.to_owned(), value);
    Ok(())
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
        let config = Config::check_table(table.clone(), file, base)?;
        if overrides.is_empty() {
            return Ok(config);
        }
        for o in overrides {
            set_dotted(&mut table, &o.key, o.value.clone()).map_err(|message| ConfigError {
                file: o.flag.clone(),
                key: Some(o.key.clone()),
                message,
            })?;
        }
        Config::check_table(table, file, base).map_err(|err| {
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
            message: toml_error_message(text, &err),
        })?;
        merge(&mut merged, theirs);
        Ok(merged)
    }

    /// Reads `table` into a config and checks every key.
    fn check_table(table: toml::Table, file: &str, base: &Path) -> Result<Self, ConfigError> {
        let error = |key: Option<String>, message: String| ConfigError {
            file: file.to_owned(),
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

/// Lays `theirs` over `ours`: tables merge key by key, anything else replaces.
fn merge(ours: &mut toml::Table, theirs: toml::Table) {
    for (key, value) in theirs {
        match (ours.get_mut(&key), value) {
            (Some(toml::Value::Table(mine)), toml::Value::Table(new)) => merge(mine, new),
            (_, value) => {
                ours.insert(key, value);
            }
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    agent: RawAgent,
    limits: RawLimits,
    plugins: RawPlugins,
    provider: RawProvider,
    profiles: BTreeMap<String, RawProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    name: String,
    workspace: PathBuf,
    data_dir: PathBuf,
    plugins_dir: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    tool_deadline_secs: f64,
    tool_memory_mib: u32,
    max_workers_per_channel: u32,
    max_branches_per_channel: u32,
    max_turns: u32,
    context_window_tokens: u32,
    compaction_threshold: f64,
    worker_timeout_secs: u64,
    settle_ms: u64,
    dispatch_timeout_secs: f64,
    dispatch_total_secs: f64,
    dispatch_hold_ms: u64,
    max_answer_kib: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlugins {
    prefer: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    kind: String,
    script: Option<PathBuf>,
    base_url: Option<String>,
    api_key_env: Option<String>,
    model: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    tools: Vec<String>,
    capabilities: Vec<String>,
}

type KeyError = (String, String);

/// The most workers (or branches) one channel may run at once.
const MAX_PROCESSES_PER_CHANNEL: u32 = 1024;
/// The most model turns one process may take for one input.
const MAX_TURNS: u32 = 10_000;
/// The largest context window, in tokens.
const MAX_CONTEXT_WINDOW_TOKENS: u32 = 100_000_000;

fn key_error(key: &str, message: impl Into<String>) -> KeyError {
    (key.to_owned(), message.into())
}

impl RawConfig {
    fn check(self, base: &Path) -> Result<Config, KeyError> {
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        if self.agent.name.trim().is_empty() {
            return Err(key_error("agent.name", "must not be empty"));
        }
        let agent = AgentSettings {
            name: self.agent.name,
            workspace: resolve(self.agent.workspace),
            data_dir: resolve(self.agent.data_dir),
            plugins_dir: self.agent.plugins_dir.map(resolve),
        };
        let limits = self.limits.check()?;
        if let Some((tool, _)) = self
            .plugins
            .prefer
            .iter()
            .find(|(_, p)| p.trim().is_empty())
        {
            return Err(key_error(
                &format!("plugins.prefer.{tool}"),
                "must name a plugin (its file name without `.wasm`)",
            ));
        }
        let prefer = self.plugins.prefer.into_iter().collect();
        let provider = self.provider.check(&resolve)?;
        let policy = check_profiles(self.profiles)?;
        Ok(Config {
            source: None,
            agent,
            limits,
            prefer,
            provider,
            policy,
        })
    }
}

impl RawLimits {
    fn check(self) -> Result<AgentLimits, KeyError> {
        let secs = self.tool_deadline_secs;
        if !(secs.is_finite() && secs > 0.0 && secs <= MAX_TOOL_DEADLINE_SECS) {
            return Err(key_error(
                "limits.tool_deadline_secs",
                format!(
                    "must be more than 0 and at most {MAX_TOOL_DEADLINE_SECS} seconds, got {secs}"
                ),
            ));
        }
        if !(1..=MAX_TOOL_MEMORY_MIB).contains(&self.tool_memory_mib) {
            return Err(key_error(
                "limits.tool_memory_mib",
                format!(
                    "must be 1 to {MAX_TOOL_MEMORY_MIB} MiB, got {}",
                    self.tool_memory_mib
                ),
            ));
        }
        for (key, value, max) in [
            (
                "limits.max_workers_per_channel",
                self.max_workers_per_channel,
                MAX_PROCESSES_PER_CHANNEL,
            ),
            (
                "limits.max_branches_per_channel",
                self.max_branches_per_channel,
                MAX_PROCESSES_PER_CHANNEL,
            ),
            ("limits.max_turns", self.max_turns, MAX_TURNS),
        ] {
            if value == 0 {
                return Err(key_error(key, "must be at least 1"));
            }
            if value > max {
                return Err(key_error(
                    key,
                    format!("must be at most {max}, got {value}"),
                ));
            }
        }
        if !(512..=MAX_CONTEXT_WINDOW_TOKENS).contains(&self.context_window_tokens) {
            return Err(key_error(
                "limits.context_window_tokens",
                format!(
                    "must be 512 to {MAX_CONTEXT_WINDOW_TOKENS}, got {}",
                    self.context_window_tokens
                ),
            ));
        }
        let share = self.compaction_threshold;
        if !(share > 0.0 && share <= 1.0) {
            return Err(key_error(
                "limits.compaction_threshold",
                format!("must be a share of the window in (0, 1], got {share}"),
            ));
        }
        if !(1..=86_400).contains(&self.worker_timeout_secs) {
            return Err(key_error(
                "limits.worker_timeout_secs",
                format!(
                    "must be 1 to 86400 seconds, got {}",
                    self.worker_timeout_secs
                ),
            ));
        }
        let timeout = self.dispatch_timeout_secs;
        if !(timeout.is_finite() && timeout > 0.0 && timeout <= 3600.0) {
            return Err(key_error(
                "limits.dispatch_timeout_secs",
                format!("must be more than 0 and at most 3600 seconds, got {timeout}"),
            ));
        }
        let total = self.dispatch_total_secs;
        if !(total.is_finite() && total >= timeout && total <= 86_400.0) {
            return Err(key_error(
                "limits.dispatch_total_secs",
                format!(
                    "must be at least limits.dispatch_timeout_secs ({timeout}) and at most \
                     86400 seconds, got {total}"
                ),
            ));
        }
        if !(1..=262_144).contains(&self.max_answer_kib) {
            return Err(key_error(
                "limits.max_answer_kib",
                format!(
                    "must be 1 to 262144 KiB (256 MiB), got {}",
                    self.max_answer_kib
                ),
            ));
        }
        for (key, value) in [
            ("limits.settle_ms", self.settle_ms),
            ("limits.dispatch_hold_ms", self.dispatch_hold_ms),
        ] {
            if value > 60_000 {
                return Err(key_error(
                    key,
                    format!("must be at most 60000 ms, got {value}"),
                ));
            }
        }
        Ok(AgentLimits {
            tool: Limits {
                deadline: Duration::from_secs_f64(secs),
                memory_bytes: (self.tool_memory_mib as usize) << 20,
                ..Limits::default()
            },
            max_workers_per_channel: self.max_workers_per_channel,
            max_branches_per_channel: self.max_branches_per_channel,
            max_turns: self.max_turns,
            context_window_tokens: self.context_window_tokens,
            compaction_threshold: share,
            worker_timeout: Duration::from_secs(self.worker_timeout_secs),
            dispatch: GateSettings {
                settle: Duration::from_millis(self.settle_ms),
                timeout: Duration::from_secs_f64(timeout),
                total: Duration::from_secs_f64(total),
                hold: Duration::from_millis(self.dispatch_hold_ms),
            },
            max_answer_bytes: (self.max_answer_kib as usize) << 10,
        })
    }
}

impl RawProvider {
    fn check(self, resolve: &impl Fn(PathBuf) -> PathBuf) -> Result<ProviderSettings, KeyError> {
        match self.kind.as_str() {
            "scripted" => Ok(ProviderSettings::Scripted {
                script: self.script.map(resolve),
            }),
            "openai" => {
                let need = |value: Option<String>, key: &str, example: &str| {
                    value.filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                        key_error(
                            &format!("provider.{key}"),
                            format!("required when provider.kind = \"openai\" (e.g. {example})"),
                        )
                    })
                };
                Ok(ProviderSettings::OpenAi {
                    base_url: need(self.base_url, "base_url", "\"https://api.openai.com/v1\"")?,
                    api_key_env: need(self.api_key_env, "api_key_env", "\"OPENAI_API_KEY\"")?,
                    model: need(self.model, "model", "\"gpt-4o-mini\"")?,
                })
            }
            other => Err(key_error(
                "provider.kind",
                format!("unknown provider `{other}`; expected \"scripted\" or \"openai\""),
            )),
        }
    }
}

fn check_profiles(raw: BTreeMap<String, RawProfile>) -> Result<Policy, KeyError> {
    let mut profiles = BTreeMap::new();
    for (name, profile) in raw {
        let kind: ProcessKind = name
            .parse()
            .map_err(|msg: String| key_error(&format!("profiles.{name}"), msg))?;
        let mut caps = Vec::with_capacity(profile.capabilities.len());
        for (i, text) in profile.capabilities.iter().enumerate() {
            let cap = text
                .parse()
                .map_err(|err: capstan_caps::ParseCapabilityError| {
                    key_error(
                        &format!("profiles.{name}.capabilities[{i}]"),
                        err.to_string(),
                    )
                })?;
            caps.push(cap);
        }
        let profile = Profile::new(&profile.tools, Grants::new(caps))
            .map_err(|msg| key_error(&format!("profiles.{name}.tools"), msg))?;
        profiles.insert(kind, profile);
    }
    Ok(Policy::new(profiles))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/capstan/capstan.toml"))
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
                "[limits]\nworker_timeout_secs = 0\n",
                "`limits.worker_timeout_secs`: must be 1 to 86400 seconds",
            ),
        ];
        for (text, expected) in cases {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.starts_with("/etc/capstan/capstan.toml: "), "{err}");
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
}
