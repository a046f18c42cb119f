//! [`Lock`]: `capstan.lock`, the components and MCP tools a deployment offers, pinned.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use capstan_caps::{Capability, Effect};
use serde::{Deserialize, Serialize};

use super::digest::{ComponentDigest, TextDigest};
use crate::text::{read_text, toml_error_message, toml_key_line};

/// The lock file's name, beside the config file.
pub const LOCK_FILE: &str = "capstan.lock";

/// The format this host writes and reads.
const LOCK_VERSION: u32 = 1;

/// What the lock file starts with.
const HEADER: &str = "\
# capstan.lock: the plugins and MCP tools this deployment offers, pinned.
# Written by `capstan plugins lock`; changed by `capstan plugins accept NAME`.
# While this file exists, a component whose digest is not here, or an MCP tool whose
# description or schema changed, is not offered to any process until it is accepted.
# Keep it beside capstan.toml, in version control, and out of any workspace.

";

/// One tool as the lock pins it: its capabilities and effect, and digests of its
/// description and argument schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPin {
    /// What the tool declares it needs (none for an MCP tool).
    pub capabilities: Vec<Capability>,
    /// The effect it declares, if it declares one.
    pub effect: Option<Effect>,
    /// The digest of its description.
    pub description: TextDigest,
    /// The digest of its argument schema, as canonical JSON.
    pub schema: TextDigest,
}

/// One plugin as the lock pins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginPin {
    /// The digest of the component's bytes.
    pub digest: ComponentDigest,
    /// The `capstan:plugin` version it was built against.
    pub contract: String,
    /// Its tools, by name.
    pub tools: BTreeMap<String, ToolPin>,
}

/// One MCP server as the lock pins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPin {
    /// Where it is reached: `stdio: COMMAND ARGS` or `http: URL`.
    pub server: String,
    /// Its tools, by the server's own name (without the `SERVER.` prefix).
    pub tools: BTreeMap<String, ToolPin>,
}

impl ServerPin {
    /// The server reached at `server` offering `tools`, each by the server's own name.
    pub fn of<N: Into<String>>(
        server: &str,
        tools: impl IntoIterator<Item = (N, ToolPin)>,
    ) -> Self {
        ServerPin {
            server: server.to_owned(),
            tools: tools
                .into_iter()
                .map(|(name, pin)| (name.into(), pin))
                .collect(),
        }
    }
}

/// `capstan.lock`: for each plugin its digest, contract version, tools and their
/// capabilities; for each MCP server where it is reached and each tool's digests.
///
/// ```
/// use capstan_host::plugin::trust::{Lock, ServerPin};
///
/// let mut lock = Lock::default();
/// let server = ServerPin::of("http: https://docs.example.com/mcp", Vec::<(String, _)>::new());
/// lock.mcp.insert("docs".into(), server);
/// let text = lock.to_toml();
/// assert_eq!(Lock::parse(&text, "capstan.lock".as_ref()).unwrap(), lock);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lock {
    /// Each plugin by name (its file name without `.wasm`).
    pub plugins: BTreeMap<String, PluginPin>,
    /// Each MCP server by its `[mcp.NAME]`.
    pub mcp: BTreeMap<String, ServerPin>,
}

/// A lock file that cannot be read or used.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}; fix it, or write it anew with `capstan plugins lock`", path.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct LockError {
    /// The lock file.
    pub path: PathBuf,
    /// The line the problem is on, when it is one entry.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl Lock {
    /// The lock at `path`, or `None` if there is no file there.
    pub fn read(path: &Path) -> Result<Option<Lock>, LockError> {
        match std::fs::symlink_metadata(path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            _ => {}
        }
        let text = read_text(path).map_err(|err| LockError {
            path: path.to_owned(),
            line: None,
            message: err.to_string(),
        })?;
        Lock::parse(&text, path).map(Some)
    }

    /// The lock written in `text`, read from `path` (named in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Lock, LockError> {
        let error = |line, message| LockError {
            path: path.to_owned(),
            line,
            message,
        };
        let raw: RawLock =
            toml::from_str(text).map_err(|err| error(None, toml_error_message(text, &err)))?;
        if raw.version != LOCK_VERSION {
            return Err(error(
                toml_key_line(text, "version"),
                format!(
                    "version {} is not one this host reads (it reads {LOCK_VERSION})",
                    raw.version
                ),
            ));
        }
        let tools = |section: &str, tools: BTreeMap<String, RawToolPin>| {
            tools
                .into_iter()
                .map(|(name, raw)| {
                    let key = format!("{section}.tools.{name}");
                    raw.check()
                        .map(|pin| (name, pin))
                        .map_err(|why| error(toml_key_line(text, &key), format!("`{key}`: {why}")))
                })
                .collect::<Result<BTreeMap<_, _>, _>>()
        };
        let mut lock = Lock::default();
        for (name, plugin) in raw.plugins {
            let section = format!("plugins.{name}");
            lock.plugins.insert(
                name,
                PluginPin {
                    digest: plugin.digest,
                    contract: plugin.contract,
                    tools: tools(&section, plugin.tools)?,
                },
            );
        }
        for (name, server) in raw.mcp {
            let section = format!("mcp.{name}");
            lock.mcp.insert(
                name,
                ServerPin {
                    server: server.server,
                    tools: tools(&section, server.tools)?,
                },
            );
        }
        Ok(lock)
    }

    /// The lock as its file holds it, header comment included.
    pub fn to_toml(&self) -> String {
        let raw = RawLock {
            version: LOCK_VERSION,
            plugins: self
                .plugins
                .iter()
                .map(|(name, pin)| {
                    let raw = RawPluginPin {
                        digest: pin.digest,
                        contract: pin.contract.clone(),
                        tools: raw_tools(&pin.tools),
                    };
                    (name.clone(), raw)
                })
                .collect(),
            mcp: self
                .mcp
                .iter()
                .map(|(name, pin)| {
                    let raw = RawServerPin {
                        server: pin.server.clone(),
                        tools: raw_tools(&pin.tools),
                    };
                    (name.clone(), raw)
                })
                .collect(),
        };
        let body = toml::to_string(&raw).expect("a lock serializes");
        format!("{HEADER}{body}")
    }

    /// Writes the lock to `path` whole: to a new file beside it, then renamed into place,
    /// so a reader (or a crash) never sees half a lock.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        super::write_whole(path, self.to_toml().as_bytes())
    }
}

fn raw_tools(tools: &BTreeMap<String, ToolPin>) -> BTreeMap<String, RawToolPin> {
    tools
        .iter()
        .map(|(name, pin)| {
            let raw = RawToolPin {
                capabilities: pin.capabilities.iter().map(ToString::to_string).collect(),
                effect: pin.effect.map(|effect| effect.as_str().to_owned()),
                description: pin.description,
                schema: pin.schema,
            };
            (name.clone(), raw)
        })
        .collect()
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLock {
    version: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    plugins: BTreeMap<String, RawPluginPin>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    mcp: BTreeMap<String, RawServerPin>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPluginPin {
    digest: ComponentDigest,
    contract: String,
    #[serde(default)]
    tools: BTreeMap<String, RawToolPin>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerPin {
    server: String,
    #[serde(default)]
    tools: BTreeMap<String, RawToolPin>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolPin {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    capabilities: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    effect: Option<String>,
    description: TextDigest,
    schema: TextDigest,
}

impl RawToolPin {
    fn check(self) -> Result<ToolPin, String> {
        let capabilities = self
            .capabilities
            .iter()
            .map(|text| text.parse::<Capability>().map_err(|err| err.to_string()))
            .collect::<Result<_, _>>()?;
        let effect = self
            .effect
            .map(|text| text.parse::<Effect>().map_err(|err| err.to_string()))
            .transpose()?;
        Ok(ToolPin {
            capabilities,
            effect,
            description: self.description,
            schema: self.schema,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::ToolInfo;

    fn tool(description: &str) -> ToolInfo {
        ToolInfo {
            name: "file_read".into(),
            description: description.into(),
            args_schema: serde_json::json!({"type": "object"}),
            capabilities: vec![Capability::FsRead, "net:api.example.com".parse().unwrap()],
            effect: Some(Effect::Read),
        }
    }

    #[test]
    fn a_lock_reads_back_as_written() {
        let mut lock = Lock::default();
        lock.plugins.insert(
            "files".into(),
            PluginPin {
                digest: ComponentDigest::of(b"component"),
                contract: "0.3.0".into(),
                tools: [("file_read".to_owned(), tool("Reads.").pin())].into(),
            },
        );
        lock.mcp.insert(
            "docs".into(),
            ServerPin::of(
                "stdio: python3 server.py",
                [("search", tool("Finds.").pin())],
            ),
        );
        let text = lock.to_toml();
        assert!(text.starts_with("# capstan.lock"), "{text}");
        assert_eq!(Lock::parse(&text, Path::new("capstan.lock")).unwrap(), lock);
    }

    #[test]
    fn a_bad_entry_is_named_with_its_line() {
        let text = "version = 1\n\n[plugins.files]\ndigest = \"blake3:00\"\ncontract = \"0.3.0\"\n";
        let err = Lock::parse(text, Path::new("/etc/capstan.lock")).unwrap_err();
        assert!(err.to_string().starts_with("/etc/capstan.lock: "), "{err}");
        assert!(err.to_string().contains("line 4"), "{err}");
        let text = format!(
            "version = 1\n[plugins.files]\ndigest = \"{}\"\ncontract = \"0.3.0\"\n\
             [plugins.files.tools.t]\ncapabilities = [\"fs.rite\"]\n\
             description = \"{}\"\nschema = \"{}\"\n",
            ComponentDigest::of(b"x"),
            TextDigest::of_text(""),
            TextDigest::of_text(""),
        );
        let err = Lock::parse(&text, Path::new("capstan.lock")).unwrap_err();
        assert_eq!(err.line, Some(5), "{err}");
        assert!(err.to_string().contains("plugins.files.tools.t"), "{err}");
        let err = Lock::parse("version = 9\n", Path::new("capstan.lock")).unwrap_err();
        assert!(err.to_string().contains("version 9"), "{err}");
    }
}
