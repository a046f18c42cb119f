//! The configuration as serde reads it ([`RawConfig`]), and the checks that turn it into a
//! [`Config`]: each failure names the dotted key and what would be right.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use capstan_caps::Capability;

use super::channels::{RawChannel, check_channels};
use super::error::{KeyError, key_error};
use super::mcp::{RawMcpServer, check_mcp};
use super::network::{RawNet, RawSecret, check_secrets, parse_rules};
use super::serve::RawServe;
use super::store::RawStore;
use super::telemetry::RawTelemetry;
use super::{
    AgentLimits, AgentSettings, Config, MAX_TOOL_DEADLINE_SECS, MAX_TOOL_MEMORY_MIB,
    ProviderSettings,
};
use crate::dispatch::GateSettings;
use crate::flow::{FlowRule, FlowRules, Holding, WorkspaceLabel};
use crate::plugin::Limits;
use crate::plugin::trust::{LOCK_FILE, Signer, Signers};
use crate::policy::{Grants, InstanceReuse, Policy, ProcessKind, Profile, ReuseRules, ToolGrants};
use crate::secrets::SecretSpec;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    agent: RawAgent,
    limits: RawLimits,
    plugins: RawPlugins,
    provider: RawProvider,
    net: RawNet,
    serve: RawServe,
    store: RawStore,
    telemetry: RawTelemetry,
    #[serde(default)]
    secrets: BTreeMap<String, RawSecret>,
    #[serde(default)]
    mcp: BTreeMap<String, RawMcpServer>,
    #[serde(default)]
    channels: BTreeMap<String, RawChannel>,
    profiles: BTreeMap<String, RawProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    name: String,
    workspace: PathBuf,
    #[serde(default)]
    workspace_label: Option<String>,
    data_dir: PathBuf,
    /// One path, or a list of them: read by [`plugin_dirs`].
    #[serde(default)]
    plugins_dir: Option<toml::Value>,
    first_party_plugins: bool,
}

/// `agent.plugins_dir`: one directory, or a list searched in order.
fn plugin_dirs(value: Option<toml::Value>) -> Result<Vec<PathBuf>, String> {
    let path = |value: &toml::Value| match value {
        toml::Value::String(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        other => Err(format!(
            "must be a directory or a list of directories (e.g. \"plugins\" or [\"plugins\", \
             \"more-plugins\"]), got {other}"
        )),
    };
    match &value {
        None => Ok(Vec::new()),
        Some(toml::Value::Array(dirs)) => dirs.iter().map(path).collect(),
        Some(one) => Ok(vec![path(one)?]),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    tool_deadline_secs: f64,
    tool_memory_mib: u32,
    tool_output_kib: u32,
    mcp_message_kib: u32,
    store_retry_ms: u64,
    unstored_reply_secs: u64,
    stop_flush_attempts: u32,
    max_workers_per_channel: u32,
    max_branches_per_channel: u32,
    max_open_conversations: u32,
    max_warm_instances: u32,
    tool_fuel: bool,
    max_turns: u32,
    context_window_tokens: u32,
    compaction_threshold: f64,
    worker_timeout_secs: u64,
    approval_wait_secs: u64,
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
    /// `call` or `process`, by plugin name.
    #[serde(default)]
    instance_reuse: BTreeMap<String, String>,
    #[serde(default)]
    require_signatures: bool,
    #[serde(default)]
    accept_narrowing: bool,
    #[serde(default)]
    require_lock: bool,
    /// `[plugins.signers.NAME]`.
    #[serde(default)]
    signers: BTreeMap<String, RawSigner>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSigner {
    public: String,
    plugins: Vec<String>,
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
    /// Network rules granted (`net:` capabilities, written without the prefix).
    #[serde(default)]
    net: Vec<String>,
    /// Secrets granted (`secret:` capabilities, by name).
    #[serde(default)]
    secrets: Vec<String>,
    /// `[profiles.KIND.tool.NAME]`: narrower grants for one tool.
    #[serde(default)]
    tool: BTreeMap<String, RawToolGrants>,
    /// `call` or `process`: for every plugin this kind calls, over `[plugins]`'s choice.
    instance_reuse: Option<String>,
    /// `[profiles.KIND.flow]`: the action for each flow rule, by its key.
    #[serde(default)]
    flow: BTreeMap<String, String>,
    /// `[profiles.KIND.handles]`: which tool results are held back as handles.
    #[serde(default)]
    handles: RawHandles,
}

/// `[profiles.KIND.handles]`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawHandles {
    /// Hold every result labelled untrusted.
    #[serde(default)]
    untrusted: bool,
    /// Hold every result longer than this many bytes.
    above_bytes: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolGrants {
    net: Option<Vec<String>>,
    secrets: Option<Vec<String>>,
}

/// The most workers (or branches) one channel may run at once.
const MAX_PROCESSES_PER_CHANNEL: u32 = 1024;
const MAX_OPEN_CONVERSATIONS: u32 = 1_000_000;
/// The most instances kept between calls: each reserves a pooling-allocator slot (address
/// space for its memories) and holds its memory while it waits.
const MAX_WARM_INSTANCES: u32 = 4096;
/// The most model turns one process may take for one input.
const MAX_TURNS: u32 = 10_000;
/// The largest context window, in tokens.
const MAX_CONTEXT_WINDOW_TOKENS: u32 = 100_000_000;

impl RawConfig {
    pub(super) fn check(self, base: &Path) -> Result<Config, KeyError> {
        let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
        if self.agent.name.trim().is_empty() {
            return Err(key_error("agent.name", "must not be empty"));
        }
        let workspace_label = match self.agent.workspace_label {
            Some(text) => text
                .parse()
                .map_err(|err| key_error("agent.workspace_label", format!("{err}")))?,
            None => WorkspaceLabel::default(),
        };
        let agent = AgentSettings {
            name: self.agent.name,
            workspace: resolve(self.agent.workspace),
            workspace_label,
            data_dir: resolve(self.agent.data_dir),
            plugins_dirs: plugin_dirs(self.agent.plugins_dir)
                .map_err(|err| key_error("agent.plugins_dir", err))?
                .into_iter()
                .map(resolve)
                .collect(),
            first_party_plugins: self.agent.first_party_plugins,
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
        let mut keys = Vec::new();
        for (name, signer) in &self.plugins.signers {
            let key = format!("plugins.signers.{name}");
            if signer.plugins.is_empty() {
                return Err(key_error(
                    &format!("{key}.plugins"),
                    "names no plugin; list the plugins (file names without `.wasm`) this key \
                     may sign, or \"*\" for any",
                ));
            }
            let trusted = Signer::new(name, &signer.public, signer.plugins.iter().cloned())
                .map_err(|why| key_error(&format!("{key}.public"), why))?;
            keys.push(trusted);
        }
        if self.plugins.require_signatures && keys.is_empty() {
            return Err(key_error(
                "plugins.require_signatures",
                "no key is trusted: add a [plugins.signers.NAME] with `public` (from `capstan \
                 plugins keygen`) and `plugins`",
            ));
        }
        let signers = if self.plugins.require_signatures {
            Signers::required(keys)
        } else {
            Signers::optional(keys)
        };
        let mut reuse = ReuseRules::default();
        for (plugin, text) in &self.plugins.instance_reuse {
            let key = format!("plugins.instance_reuse.{plugin}");
            reuse = reuse.with_plugin(plugin, parse_reuse(&key, text)?);
        }
        let provider = self.provider.check(&resolve)?;
        let net = self.net.check(limits.tool.deadline)?;
        let serve = self.serve.check(&resolve)?;
        let (store, spill_file) = self.store.check(resolve)?;
        let telemetry = self.telemetry.check()?;
        let secrets = check_secrets(self.secrets, &resolve)?;
        let policy = check_profiles(self.profiles, &secrets, reuse)?;
        let mcp = check_mcp(self.mcp, &secrets, &resolve)?;
        let channels = check_channels(self.channels, &secrets, &resolve)?;
        Ok(Config {
            source: None,
            agent,
            limits,
            prefer,
            signers,
            accept_narrowing: self.plugins.accept_narrowing,
            require_lock: self.plugins.require_lock,
            lock_file: base.join(LOCK_FILE),
            provider,
            net,
            serve,
            store,
            spill_file,
            telemetry,
            secrets,
            mcp,
            channels,
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
            (
                "limits.max_open_conversations",
                self.max_open_conversations,
                MAX_OPEN_CONVERSATIONS,
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
        if self.max_warm_instances > MAX_WARM_INSTANCES {
            return Err(key_error(
                "limits.max_warm_instances",
                format!(
                    "must be at most {MAX_WARM_INSTANCES}, got {} (0 keeps no instance)",
                    self.max_warm_instances
                ),
            ));
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
        if !(1..=86_400).contains(&self.approval_wait_secs) {
            return Err(key_error(
                "limits.approval_wait_secs",
                format!(
                    "must be 1 to 86400 seconds, got {}",
                    self.approval_wait_secs
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
        for (key, value, range) in [
            ("limits.tool_output_kib", self.tool_output_kib, 1..=16_384),
            ("limits.mcp_message_kib", self.mcp_message_kib, 64..=65_536),
        ] {
            if !range.contains(&value) {
                return Err(key_error(
                    key,
                    format!(
                        "must be {} to {} KiB, got {value}",
                        range.start(),
                        range.end()
                    ),
                ));
            }
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
        if !(10..=60_000).contains(&self.store_retry_ms) {
            return Err(key_error(
                "limits.store_retry_ms",
                format!("must be 10 to 60000 ms, got {}", self.store_retry_ms),
            ));
        }
        if !(1..=100).contains(&self.stop_flush_attempts) {
            return Err(key_error(
                "limits.stop_flush_attempts",
                format!("must be 1 to 100, got {}", self.stop_flush_attempts),
            ));
        }
        if self.unstored_reply_secs > 3600 {
            return Err(key_error(
                "limits.unstored_reply_secs",
                format!(
                    "must be at most 3600 seconds, got {}",
                    self.unstored_reply_secs
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
                max_output_bytes: (self.tool_output_kib as usize) << 10,
                max_warm_instances: self.max_warm_instances,
                fuel: self.tool_fuel,
                ..Limits::default()
            },
            max_workers_per_channel: self.max_workers_per_channel,
            max_branches_per_channel: self.max_branches_per_channel,
            max_open_conversations: self.max_open_conversations,
            max_turns: self.max_turns,
            context_window_tokens: self.context_window_tokens,
            compaction_threshold: share,
            worker_timeout: Duration::from_secs(self.worker_timeout_secs),
            approval_wait: Duration::from_secs(self.approval_wait_secs),
            dispatch: GateSettings {
                settle: Duration::from_millis(self.settle_ms),
                timeout: Duration::from_secs_f64(timeout),
                total: Duration::from_secs_f64(total),
                hold: Duration::from_millis(self.dispatch_hold_ms),
            },
            max_answer_bytes: (self.max_answer_kib as usize) << 10,
            mcp_message_bytes: (self.mcp_message_kib as usize) << 10,
            store_retry: Duration::from_millis(self.store_retry_ms),
            unstored_reply: Duration::from_secs(self.unstored_reply_secs),
            stop_flush_attempts: self.stop_flush_attempts,
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

/// `call` or `process`, at `key`.
fn parse_reuse(key: &str, text: &str) -> Result<InstanceReuse, KeyError> {
    text.parse().map_err(|msg: String| key_error(key, msg))
}

fn check_profiles(
    raw: BTreeMap<String, RawProfile>,
    secrets: &[SecretSpec],
    mut reuse: ReuseRules,
) -> Result<Policy, KeyError> {
    let mut profiles = BTreeMap::new();
    for (name, profile) in raw {
        let kind: ProcessKind = name
            .parse()
            .map_err(|msg: String| key_error(&format!("profiles.{name}"), msg))?;
        if let Some(text) = &profile.instance_reuse {
            let key = format!("profiles.{name}.instance_reuse");
            reuse = reuse.with_kind(kind, parse_reuse(&key, text)?);
        }
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
        let net = parse_rules(&format!("profiles.{name}.net"), &profile.net)?;
        caps.extend(net.into_iter().map(Capability::Net));
        check_secret_names(
            &format!("profiles.{name}.secrets"),
            &profile.secrets,
            secrets,
        )?;
        caps.extend(profile.secrets.iter().cloned().map(Capability::Secret));
        let mut checked = Profile::new(&profile.tools, Grants::new(caps))
            .map_err(|msg| key_error(&format!("profiles.{name}.tools"), msg))?;
        for (tool, grants) in profile.tool {
            let table = format!("profiles.{name}.tool.{tool}");
            let net = match &grants.net {
                Some(rules) => Some(parse_rules(&format!("{table}.net"), rules)?),
                None => None,
            };
            if let Some(names) = &grants.secrets {
                let key = format!("{table}.secrets");
                check_secret_names(&key, names, secrets)?;
                if let Some((i, missing)) = names
                    .iter()
                    .enumerate()
                    .find(|(_, n)| !profile.secrets.contains(n))
                {
                    return Err(key_error(
                        &format!("{key}[{i}]"),
                        format!(
                            "secret {missing} is not granted to the {name} profile; a tool's \
                             grants narrow its profile's, so add it to profiles.{name}.secrets too"
                        ),
                    ));
                }
            }
            checked = checked.with_tool_grants(
                tool,
                ToolGrants {
                    net,
                    secrets: grants.secrets,
                },
            );
        }
        let flow = check_flow(&name, &profile.flow)?;
        let holding = Holding {
            untrusted: profile.handles.untrusted,
            above_bytes: profile.handles.above_bytes,
        };
        profiles.insert(kind, checked.with_flow(flow).with_holding(holding));
    }
    Ok(Policy::new(profiles).with_reuse(reuse))
}

/// `[profiles.NAME.flow]`: each key a rule, each value an action; the rest default.
fn check_flow(name: &str, raw: &BTreeMap<String, String>) -> Result<FlowRules, KeyError> {
    let mut rules = FlowRules::default();
    for (key, text) in raw {
        let at = format!("profiles.{name}.flow.{key}");
        let rule = FlowRule::ALL
            .into_iter()
            .find(|rule| rule.key() == key)
            .ok_or_else(|| {
                let keys: Vec<&str> = FlowRule::ALL.iter().map(|r| r.key()).collect();
                key_error(
                    &at,
                    format!("not a flow rule; the rules are {}", keys.join(", ")),
                )
            })?;
        let action = text.parse().map_err(|msg: String| key_error(&at, msg))?;
        rules.set(rule, action);
    }
    Ok(rules)
}

/// Every name in `names` must be a declared secret.
fn check_secret_names(key: &str, names: &[String], secrets: &[SecretSpec]) -> Result<(), KeyError> {
    for (i, name) in names.iter().enumerate() {
        if !secrets.iter().any(|s| s.name.as_str() == name) {
            return Err(key_error(
                &format!("{key}[{i}]"),
                format!(
                    "no secret `{}` is declared; add a [secrets.{0}] table with `env` or `file`",
                    name.escape_debug()
                ),
            ));
        }
    }
    Ok(())
}
