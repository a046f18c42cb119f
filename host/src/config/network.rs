//! `[net]`, `[secrets.NAME]` and the network grants of profiles, as serde reads them, and
//! their checks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use capstan_caps::NetRule;
use serde::Deserialize;

use super::error::{KeyError, key_error};
use crate::net::{NetLimits, NetSettings};
use crate::secrets::{HeaderTemplate, PathTemplate, SecretName, SecretSource, SecretSpec};

/// The largest body cap, in KiB (1 GiB).
const MAX_BODY_KIB: u64 = 1 << 20;
/// The longest network timeout, in seconds.
const MAX_TIMEOUT_SECS: f64 = 3600.0;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNet {
    max_concurrent_requests: u32,
    max_request_body_kib: u64,
    max_response_body_kib: u64,
    connect_timeout_secs: f64,
    first_byte_timeout_secs: f64,
    request_timeout_secs: f64,
    requests_per_minute: u32,
    #[serde(default)]
    tool: BTreeMap<String, RawNetPatch>,
}

/// `[net.tool.NAME]`: any of `[net]`'s limits, for one tool.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNetPatch {
    max_concurrent_requests: Option<u32>,
    max_request_body_kib: Option<u64>,
    max_response_body_kib: Option<u64>,
    connect_timeout_secs: Option<f64>,
    first_byte_timeout_secs: Option<f64>,
    request_timeout_secs: Option<f64>,
    requests_per_minute: Option<u32>,
}

impl RawNet {
    pub(super) fn check(self, tool_deadline: Duration) -> Result<NetSettings, KeyError> {
        let limits = check_limits(
            "net",
            &self.patch_all(),
            &NetLimits::default(),
            tool_deadline,
        )?;
        let mut per_tool = BTreeMap::new();
        for (tool, patch) in &self.tool {
            let key = format!("net.tool.{tool}");
            per_tool.insert(
                tool.clone(),
                check_limits(&key, patch, &limits, tool_deadline)?,
            );
        }
        Ok(NetSettings { limits, per_tool })
    }

    fn patch_all(&self) -> RawNetPatch {
        RawNetPatch {
            max_concurrent_requests: Some(self.max_concurrent_requests),
            max_request_body_kib: Some(self.max_request_body_kib),
            max_response_body_kib: Some(self.max_response_body_kib),
            connect_timeout_secs: Some(self.connect_timeout_secs),
            first_byte_timeout_secs: Some(self.first_byte_timeout_secs),
            request_timeout_secs: Some(self.request_timeout_secs),
            requests_per_minute: Some(self.requests_per_minute),
        }
    }
}

fn check_limits(
    table: &str,
    patch: &RawNetPatch,
    base: &NetLimits,
    tool_deadline: Duration,
) -> Result<NetLimits, KeyError> {
    let count = |key: &str, value: Option<u32>, default: u32, max: u32| match value {
        None => Ok(default),
        Some(v) if (1..=max).contains(&v) => Ok(v),
        Some(v) => Err(key_error(
            &format!("{table}.{key}"),
            format!("must be 1 to {max}, got {v}"),
        )),
    };
    let kib = |key: &str, value: Option<u64>, default: u64| match value {
        None => Ok(default),
        Some(v) if (1..=MAX_BODY_KIB).contains(&v) => Ok(v << 10),
        Some(v) => Err(key_error(
            &format!("{table}.{key}"),
            format!("must be 1 to {MAX_BODY_KIB} KiB, got {v}"),
        )),
    };
    let secs = |key: &str, value: Option<f64>, default: Duration| match value {
        None => Ok(default),
        Some(v) if v.is_finite() && v > 0.0 && v <= MAX_TIMEOUT_SECS => {
            Ok(Duration::from_secs_f64(v))
        }
        Some(v) => Err(key_error(
            &format!("{table}.{key}"),
            format!("must be more than 0 and at most {MAX_TIMEOUT_SECS} seconds, got {v}"),
        )),
    };
    let limits = NetLimits {
        max_concurrent_requests: count(
            "max_concurrent_requests",
            patch.max_concurrent_requests,
            base.max_concurrent_requests,
            1024,
        )?,
        max_request_body_bytes: kib(
            "max_request_body_kib",
            patch.max_request_body_kib,
            base.max_request_body_bytes,
        )?,
        max_response_body_bytes: kib(
            "max_response_body_kib",
            patch.max_response_body_kib,
            base.max_response_body_bytes,
        )?,
        connect_timeout: secs(
            "connect_timeout_secs",
            patch.connect_timeout_secs,
            base.connect_timeout,
        )?,
        first_byte_timeout: secs(
            "first_byte_timeout_secs",
            patch.first_byte_timeout_secs,
            base.first_byte_timeout,
        )?,
        request_timeout: secs(
            "request_timeout_secs",
            patch.request_timeout_secs,
            base.request_timeout,
        )?,
        requests_per_minute: count(
            "requests_per_minute",
            patch.requests_per_minute,
            base.requests_per_minute,
            1_000_000,
        )?,
    };
    // A request cannot outlive the call that makes it.
    Ok(NetLimits {
        request_timeout: limits.request_timeout.min(tool_deadline),
        ..limits
    })
}

/// `[secrets.NAME]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecret {
    env: Option<String>,
    file: Option<PathBuf>,
    /// Caught to say why a value is never written here.
    value: Option<toml::Value>,
    #[serde(default)]
    hosts: Vec<String>,
    header: Option<String>,
    path_prefix: Option<String>,
}

pub(super) fn check_secrets(
    raw: BTreeMap<String, RawSecret>,
    resolve: &impl Fn(PathBuf) -> PathBuf,
) -> Result<Vec<SecretSpec>, KeyError> {
    let mut specs = Vec::new();
    for (name, secret) in raw {
        let table = format!("secrets.{name}");
        let parsed: SecretName = name.parse().map_err(|msg: String| key_error(&table, msg))?;
        if secret.value.is_some() {
            return Err(key_error(
                &format!("{table}.value"),
                "a secret's value is never written in the config; read it from `env = \"VAR\"` \
                 or `file = \"/path\"`",
            ));
        }
        let source = source_of(&table, secret.env, secret.file, resolve)?;
        let hosts = parse_rules(&format!("{table}.hosts"), &secret.hosts)?;
        let header = match secret.header {
            None => None,
            Some(text) => Some(
                HeaderTemplate::parse(&text, &name)
                    .map_err(|msg| key_error(&format!("{table}.header"), msg))?,
            ),
        };
        let path_prefix = match secret.path_prefix {
            None => None,
            Some(text) => Some(
                PathTemplate::parse(&text, &name)
                    .map_err(|msg| key_error(&format!("{table}.path_prefix"), msg))?,
            ),
        };
        if (header.is_some() || path_prefix.is_some()) && hosts.is_empty() {
            return Err(key_error(
                &format!("{table}.hosts"),
                "name the hosts the secret may be sent to, e.g. hosts = [\"api.example.com\"]",
            ));
        }
        specs.push(SecretSpec {
            name: parsed,
            source,
            hosts,
            header,
            path_prefix,
        });
    }
    Ok(specs)
}

/// Where the value of table `table` comes from: `env = "VAR"` or `file = "/path"`
/// (resolved with `resolve`), exactly one of them.
pub(super) fn source_of(
    table: &str,
    env: Option<String>,
    file: Option<PathBuf>,
    resolve: &impl Fn(PathBuf) -> PathBuf,
) -> Result<SecretSource, KeyError> {
    match (env, file) {
        (Some(var), None) if !var.trim().is_empty() => Ok(SecretSource::Env(var)),
        (None, Some(path)) => Ok(SecretSource::File(resolve(path))),
        (Some(_), Some(_)) => Err(key_error(table, "set `env` or `file`, not both")),
        _ => Err(key_error(
            table,
            "say where the value comes from: `env = \"VAR\"` or `file = \"/path\"`",
        )),
    }
}

/// Parses `rules`, naming `key[i]` in an error.
pub(super) fn parse_rules(key: &str, rules: &[String]) -> Result<Vec<NetRule>, KeyError> {
    rules
        .iter()
        .enumerate()
        .map(|(i, text)| {
            text.parse()
                .map_err(|err: capstan_caps::ParseNetRuleError| {
                    key_error(&format!("{key}[{i}]"), err.to_string())
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use capstan_caps::Capability;

    use crate::config::Config;
    use crate::policy::ProcessKind;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("capstan.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn network_grants_limits_and_secrets_are_read_and_checked() {
        let config = parse(
            "[net]\nrequests_per_minute = 30\n[net.tool.web_fetch]\nmax_response_body_kib = 8\n\
             [secrets.KEY]\nfile = \"key.txt\"\nhosts = [\"api.example.com\"]\n\
             header = \"X-Api-Key: {KEY}\"\n\
             [profiles.worker]\nnet = [\"api.example.com\", \"GET *.example.org\"]\n\
             secrets = [\"KEY\"]\n[profiles.worker.tool.web_fetch]\nnet = [\"*.example.org\"]\n\
             secrets = []\n",
        )
        .unwrap();
        assert_eq!(config.net.limits.requests_per_minute, 30);
        let fetch = config.net.for_tool("web_fetch");
        assert_eq!(fetch.max_response_body_bytes, 8 << 10);
        assert_eq!(fetch.requests_per_minute, 30, "unset keys come from [net]");
        assert_eq!(
            config.net.key_of("web_fetch", "x"),
            "[net.tool.web_fetch] x"
        );
        assert_eq!(config.secrets[0].name.as_str(), "KEY");
        let worker = config.policy.profile(ProcessKind::Worker);
        let fetch = worker.grants_for("web_fetch");
        let rules: Vec<String> = fetch.net_rules().map(ToString::to_string).collect();
        assert_eq!(rules, ["GET *.example.org"]);
        assert_eq!(fetch.secret_names().count(), 0);
        let request = worker.grants_for("http_request");
        assert!(request.allows(&Capability::Secret("KEY".into())));
    }

    #[test]
    fn bad_network_config_names_the_key_and_the_fix() {
        for (text, says) in [
            (
                "[profiles.worker]\nnet = [\"ftp://x.org\"]\n",
                "profiles.worker.net[0]",
            ),
            (
                "[profiles.worker]\nsecrets = [\"NOPE\"]\n",
                "add a [secrets.NOPE] table",
            ),
            (
                "[secrets.K]\nvalue = \"hunter22\"\n",
                "never written in the config",
            ),
            (
                "[secrets.K]\nhosts = [\"a.org\"]\n",
                "`env = \"VAR\"` or `file",
            ),
            (
                "[secrets.K]\nenv = \"K\"\nheader = \"Authorization: Bearer\"\n",
                "must contain {K}",
            ),
            (
                "[secrets.K]\nenv = \"K\"\nheader = \"A: {K}\"\n",
                "name the hosts",
            ),
            (
                "[net]\nmax_request_body_kib = 0\n",
                "net.max_request_body_kib",
            ),
            (
                "[net.tool.t]\nconnect_timeout_secs = -1\n",
                "net.tool.t.connect_timeout_secs",
            ),
            (
                "[secrets.K]\nenv = \"K\"\n[profiles.worker]\nsecrets = []\n\
                 [profiles.worker.tool.t]\nsecrets = [\"K\"]\n",
                "add it to profiles.worker.secrets too",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
