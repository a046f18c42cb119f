//! `[mcp.NAME]`: external MCP servers whose tools the agent may be granted, as serde reads
//! them, and their checks.

use std::collections::BTreeMap;

use capstan_caps::Effect;
use std::path::PathBuf;

use capstan_caps::NetTarget;
use serde::Deserialize;

use super::error::{KeyError, key_error};
use crate::net::target_of;
use crate::secrets::SecretSpec;

/// The longest server name: it prefixes each of its tools' names, which models limit.
pub const MAX_MCP_SERVER_NAME: usize = 24;

/// `[mcp.NAME]`: one external MCP server. Its tools are named `NAME.tool` and offered to
/// a process kind only when its profile names them (`tools = ["NAME.*"]`); a glob without
/// a `.` such as `*` never matches them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerSpec {
    /// The namespace of its tools: a lowercase letter, then lowercase letters, digits and
    /// `_`.
    pub name: String,
    /// How the host reaches it.
    pub transport: McpTransport,
    /// The operator's word on what some of its tools do (`effects = { TOOL = "read" }`),
    /// by the tool's own name: it replaces what the server's `readOnlyHint` says.
    pub effects: BTreeMap<String, Effect>,
}

/// How the host reaches an MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A program the host starts, speaking MCP on its standard input and output.
    Stdio {
        /// The program: a path, or a name looked up in the host's `PATH`.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its whole environment: nothing of the host's is passed but these variables.
        env: BTreeMap<String, String>,
        /// Where it runs [default: the config file's directory].
        cwd: Option<PathBuf>,
        /// `[secrets.NAME]` passed as variables of the same name (and redacted from
        /// whatever the server answers).
        secrets: Vec<String>,
    },
    /// A server at a URL, reached over MCP's streamable HTTP transport through the host's
    /// egress: the address checks, limits, secret injection and audit of `wasi:http`.
    Http {
        /// The endpoint, e.g. `https://mcp.example.com/mcp`.
        url: http::Uri,
        /// The endpoint's target, as the egress reads it.
        target: NetTarget,
        /// `[secrets.NAME]` injected into its requests (each bound to the URL's host).
        secrets: Vec<String>,
    },
}

impl McpServerSpec {
    /// Where the server is reached, as `capstan.lock` pins it: `stdio: COMMAND ARGS` (an
    /// argument with spaces or quotes in double quotes; then its `cwd`, and a digest of
    /// its `env`, which may change the code it runs, when set) or `http: URL`.
    ///
    /// ```
    /// use capstan_host::config::Config;
    ///
    /// let text = "[mcp.docs]\ncommand = [\"python3\", \"my server.py\"]\n";
    /// let config = Config::parse(text, "capstan.toml".as_ref()).unwrap();
    /// assert_eq!(config.mcp[0].endpoint(), r#"stdio: python3 "my server.py""#);
    /// let text = "[mcp.docs]\ncommand = [\"node\", \"s.js\"]\nenv = { NODE_OPTIONS = \"--require x\" }\n";
    /// let config = Config::parse(text, "capstan.toml".as_ref()).unwrap();
    /// assert!(config.mcp[0].endpoint().starts_with("stdio: node s.js (env NODE_OPTIONS: sha256:"));
    /// ```
    pub fn endpoint(&self) -> String {
        match &self.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
                ..
            } => {
                let words: Vec<String> = std::iter::once(command)
                    .chain(args)
                    .map(|word| {
                        let plain = !word.is_empty()
                            && !word
                                .chars()
                                .any(|c| c.is_whitespace() || c == '"' || c == '\\');
                        if plain {
                            word.clone()
                        } else {
                            format!("{word:?}")
                        }
                    })
                    .collect();
                let mut endpoint = format!("stdio: {}", words.join(" "));
                if let Some(cwd) = cwd {
                    endpoint.push_str(&format!(" (cwd {})", cwd.display()));
                }
                if !env.is_empty() {
                    // A digest, not the values: the lock is kept in version control.
                    let mut text = String::new();
                    for (name, value) in env {
                        text.push_str(&format!("{name}={value}\0"));
                    }
                    let digest = crate::plugin::trust::TextDigest::of_text(&text).to_string();
                    let names: Vec<&str> = env.keys().map(String::as_str).collect();
                    endpoint.push_str(&format!(" (env {}: {})", names.join(","), &digest[..19]));
                }
                endpoint
            }
            McpTransport::Http { url, .. } => format!("http: {url}"),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpServer {
    command: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    effects: BTreeMap<String, String>,
}

/// Checks every `[mcp.NAME]` table; `secrets` are the config's `[secrets.NAME]`.
pub(super) fn check_mcp(
    raw: BTreeMap<String, RawMcpServer>,
    secrets: &[SecretSpec],
    resolve: &impl Fn(PathBuf) -> PathBuf,
) -> Result<Vec<McpServerSpec>, KeyError> {
    raw.into_iter()
        .map(|(name, server)| server.check(name, secrets, resolve))
        .collect()
}

impl RawMcpServer {
    fn check(
        self,
        name: String,
        secrets: &[SecretSpec],
        resolve: &impl Fn(PathBuf) -> PathBuf,
    ) -> Result<McpServerSpec, KeyError> {
        let table = format!("mcp.{name}");
        let effects = check_effects(&table, self.effects)?;
        if !is_server_name(&name) {
            return Err(key_error(
                &table,
                format!(
                    "the name `{}` is not a server name: a lowercase letter, then lowercase \
                     letters, digits and `_`, at most {MAX_MCP_SERVER_NAME} (it prefixes its \
                     tools' names: `{}.TOOL`)",
                    name.escape_debug(),
                    name.escape_debug()
                ),
            ));
        }
        let mut command = match (self.command, self.url) {
            (Some(_), Some(_)) => {
                return Err(key_error(
                    &table,
                    "give either `command` (a program the host starts) or `url` (a server \
                     over HTTP), not both",
                ));
            }
            (None, None) => {
                return Err(key_error(
                    &table,
                    "say how to reach the server: command = [\"PROGRAM\", \"ARG\", ...] or \
                     url = \"https://HOST/mcp\"",
                ));
            }
            (None, Some(url)) => {
                if !self.env.is_empty() || self.cwd.is_some() {
                    return Err(key_error(
                        &table,
                        "`env` and `cwd` are for a server the host starts (`command`); a \
                         server at a `url` takes `secrets`",
                    ));
                }
                let transport = check_url(&table, &url, self.secrets, secrets)?;
                return Ok(McpServerSpec {
                    name,
                    transport,
                    effects,
                });
            }
            (Some(command), None) => command,
        };
        for (i, secret) in self.secrets.iter().enumerate() {
            if !secrets.iter().any(|spec| spec.name.as_str() == secret) {
                return Err(key_error(
                    &format!("{table}.secrets[{i}]"),
                    format!(
                        "no secret `{}`; declare it in [secrets.{}]",
                        secret.escape_debug(),
                        secret.escape_debug()
                    ),
                ));
            }
            if self.env.contains_key(secret) {
                return Err(key_error(
                    &format!("{table}.env.{secret}"),
                    format!("`{secret}` is also in mcp.{name}.secrets; set it in one place"),
                ));
            }
        }
        if command.is_empty() || command[0].trim().is_empty() {
            return Err(key_error(
                &format!("{table}.command"),
                "must name a program first, e.g. command = [\"python3\", \"server.py\"]",
            ));
        }
        for key in self.env.keys() {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(key_error(
                    &format!("{table}.env"),
                    format!(
                        "`{}` is not a variable name (no `=`, no NUL, not empty)",
                        key.escape_debug()
                    ),
                ));
            }
        }
        if let Some((key, _)) = self.env.iter().find(|(_, value)| value.contains('\0')) {
            return Err(key_error(
                &format!("{table}.env.{key}"),
                "must not contain a NUL byte",
            ));
        }
        let args = command.split_off(1);
        let command = command.remove(0);
        Ok(McpServerSpec {
            name,
            transport: McpTransport::Stdio {
                command,
                args,
                env: self.env,
                cwd: self.cwd.map(resolve),
                secrets: self.secrets,
            },
            effects,
        })
    }
}

/// The `effects` table of `table`: each key a tool name as the server lists it, each value
/// an effect.
fn check_effects(
    table: &str,
    raw: BTreeMap<String, String>,
) -> Result<BTreeMap<String, Effect>, KeyError> {
    raw.into_iter()
        .map(|(tool, effect)| {
            let key = format!("{table}.effects.{tool}");
            let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
            if tool.is_empty() || !tool.chars().all(plain) || tool.contains('.') {
                return Err(key_error(
                    &key,
                    "name the tool as the server lists it, without the server's prefix \
                     (letters, digits, `_` and `-`)",
                ));
            }
            let effect = effect
                .parse::<Effect>()
                .map_err(|err| key_error(&key, err.to_string()))?;
            Ok((tool, effect))
        })
        .collect()
}

/// Checks a server's URL and the secrets its requests carry: each one declared in
/// `[secrets.NAME]`, with a header to go in, and bound to the URL's host.
fn check_url(
    table: &str,
    url: &str,
    names: Vec<String>,
    secrets: &[SecretSpec],
) -> Result<McpTransport, KeyError> {
    let key = format!("{table}.url");
    let uri: http::Uri = url.parse().map_err(|err| {
        key_error(
            &key,
            format!("`{}` is not a URL: {err}", url.escape_debug()),
        )
    })?;
    let target = target_of(&http::Method::POST, &uri)
        .map_err(|reason| key_error(&key, format!("`{}`: {reason}", url.escape_debug())))?;
    for (i, name) in names.iter().enumerate() {
        let key = format!("{table}.secrets[{i}]");
        let Some(spec) = secrets.iter().find(|spec| spec.name.as_str() == name) else {
            return Err(key_error(
                &key,
                format!(
                    "no secret `{}`; declare it in [secrets.{}]",
                    name.escape_debug(),
                    name.escape_debug()
                ),
            ));
        };
        if spec.header.is_none() {
            return Err(key_error(
                &key,
                format!("[secrets.{name}] has no `header` to send it in"),
            ));
        }
        if !spec.bound_to(&target) {
            return Err(key_error(
                &key,
                format!(
                    "[secrets.{name}] is not bound to {target}; add it to secrets.{name}.hosts \
                     to send it there"
                ),
            ));
        }
    }
    Ok(McpTransport::Http {
        url: uri,
        target,
        secrets: names,
    })
}

/// Whether `name` may name an MCP server.
fn is_server_name(name: &str) -> bool {
    crate::text::is_plain_name(name, MAX_MCP_SERVER_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<Vec<McpServerSpec>, KeyError> {
        let raw: BTreeMap<String, RawMcpServer> = toml::from_str(text).unwrap();
        let secret = |name: &str, hosts: &[&str], header: bool| SecretSpec {
            name: name.parse().unwrap(),
            source: crate::secrets::SecretSource::Env(name.to_owned()),
            hosts: hosts.iter().map(|h| h.parse().unwrap()).collect(),
            header: header.then(|| {
                crate::secrets::HeaderTemplate::parse(&format!("X-Key: {{{name}}}"), name).unwrap()
            }),
            path_prefix: None,
        };
        let secrets = [
            secret("MCP_KEY", &["mcp.example.com"], true),
            secret("OTHER_KEY", &["api.example.com"], true),
            secret("SIGNING_KEY", &["mcp.example.com"], false),
        ];
        check_mcp(raw, &secrets, &|p| PathBuf::from("/base").join(p))
    }

    #[test]
    fn a_stdio_server_keeps_its_program_arguments_and_listed_environment() {
        let specs = check(
            "[notes]\ncommand = [\"python3\", \"server.py\", \"-v\"]\nenv = { LANG = \"C\" }\n\
             cwd = \"srv\"\n",
        )
        .unwrap();
        assert_eq!(specs[0].name, "notes");
        let McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
            ..
        } = &specs[0].transport
        else {
            panic!("a stdio server: {specs:?}");
        };
        assert_eq!(command, "python3");
        assert_eq!(args, &["server.py", "-v"]);
        assert_eq!(env.get("LANG").map(String::as_str), Some("C"));
        assert_eq!(cwd.as_deref(), Some(std::path::Path::new("/base/srv")));
    }

    #[test]
    fn an_operator_names_a_tool_s_effect_by_its_own_name() {
        let specs = check(
            "[search]\nurl = \"https://mcp.example.com/mcp\"\n\
             effects = { lookup = \"read\", book = \"send\" }\n",
        )
        .unwrap();
        assert_eq!(specs[0].effects.get("lookup"), Some(&Effect::Read));
        assert_eq!(specs[0].effects.get("book"), Some(&Effect::Send));
        let (key, message) = check(
            "[search]\nurl = \"https://mcp.example.com/mcp\"\neffects = { lookup = \"peek\" }\n",
        )
        .unwrap_err();
        assert_eq!(key, "mcp.search.effects.lookup");
        assert!(
            message.contains("use read, write-local or send"),
            "{message}"
        );
        let (key, message) =
            check("[search]\ncommand = [\"x\"]\neffects = { \"search.lookup\" = \"read\" }\n")
                .unwrap_err();
        assert_eq!(key, "mcp.search.effects.search.lookup");
        assert!(message.contains("without the server's prefix"), "{message}");
    }

    #[test]
    fn bad_names_commands_and_variables_are_refused_naming_the_key() {
        let (key, message) = check("[Notes]\ncommand = [\"x\"]\n").unwrap_err();
        assert_eq!(key, "mcp.Notes");
        assert!(message.contains("lowercase letter"), "{message}");
        let (key, message) = check("[notes]\n").unwrap_err();
        assert_eq!(key, "mcp.notes");
        assert!(message.contains("command = ["), "{message}");
        let (key, _) = check("[notes]\ncommand = []\n").unwrap_err();
        assert_eq!(key, "mcp.notes.command");
        let (key, _) =
            check("[notes]\ncommand = [\"x\"]\nenv = { \"A=B\" = \"1\" }\n").unwrap_err();
        assert_eq!(key, "mcp.notes.env");
    }

    #[test]
    fn a_server_at_a_url_keeps_its_target_and_the_secrets_bound_to_it() {
        let specs =
            check("[search]\nurl = \"https://mcp.example.com/mcp\"\nsecrets = [\"MCP_KEY\"]\n")
                .unwrap();
        let McpTransport::Http {
            url,
            target,
            secrets,
        } = &specs[0].transport
        else {
            panic!("an HTTP server: {specs:?}");
        };
        assert_eq!(url.to_string(), "https://mcp.example.com/mcp");
        assert_eq!(target.to_string(), "POST https://mcp.example.com:443");
        assert_eq!(secrets, &["MCP_KEY"]);
    }

    #[test]
    fn a_bad_url_or_secret_is_refused_naming_the_key_and_the_fix() {
        let refused = |text: &str| check(text).unwrap_err();
        let (key, message) = refused("[s]\nurl = \"ftp://mcp.example.com/\"\n");
        assert_eq!(key, "mcp.s.url");
        assert!(message.contains("not http or https"), "{message}");
        let (key, message) = refused("[s]\nurl = \"https://user@mcp.example.com/\"\n");
        assert_eq!(key, "mcp.s.url");
        assert!(message.contains("user info"), "{message}");
        let (key, message) = refused("[s]\nurl = \"https://x/\"\ncommand = [\"y\"]\n");
        assert_eq!(key, "mcp.s");
        assert!(message.contains("not both"), "{message}");
        let (key, message) = refused("[s]\nurl = \"https://x/\"\nenv = { A = \"1\" }\n");
        assert_eq!(key, "mcp.s");
        assert!(message.contains("takes `secrets`"), "{message}");
        let (key, message) = refused("[s]\ncommand = [\"y\"]\nsecrets = [\"NOPE\"]\n");
        assert_eq!(key, "mcp.s.secrets[0]");
        assert!(message.contains("[secrets.NOPE]"), "{message}");
        let (key, message) =
            refused("[s]\ncommand = [\"y\"]\nsecrets = [\"MCP_KEY\"]\nenv = { MCP_KEY = \"x\" }\n");
        assert_eq!(key, "mcp.s.env.MCP_KEY");
        assert!(message.contains("one place"), "{message}");
        let url = "[s]\nurl = \"https://mcp.example.com/mcp\"\n";
        let (key, message) = refused(&format!("{url}secrets = [\"NOPE\"]\n"));
        assert_eq!(key, "mcp.s.secrets[0]");
        assert!(message.contains("[secrets.NOPE]"), "{message}");
        // Bound to another host: it would never be sent, so it is refused at start.
        let (key, message) = refused(&format!("{url}secrets = [\"MCP_KEY\", \"OTHER_KEY\"]\n"));
        assert_eq!(key, "mcp.s.secrets[1]");
        assert!(message.contains("secrets.OTHER_KEY.hosts"), "{message}");
        let (key, message) = refused(&format!("{url}secrets = [\"SIGNING_KEY\"]\n"));
        assert_eq!(key, "mcp.s.secrets[0]");
        assert!(message.contains("no `header`"), "{message}");
    }
}
