//! A loaded plugin and the tools it offers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use capstan_caps::{Capability, Effect};

use super::bindings::PluginPre;
use super::bindings::exports::capstan::plugin::tool::ToolSpec;
use super::cache::CacheOutcome;
use super::error::LoadError;
use super::sandbox::Sandbox;
use super::schema::check_args_schema;
use super::trust::{ComponentDigest, PluginPin, TextDigest, ToolPin};
use crate::text::{echo_name, one_line};

/// The longest tool name accepted; names go into model tool lists, which limit them.
pub(crate) const MAX_TOOL_NAME: usize = 64;

/// Tools one plugin may describe; every tool lands in model tool lists.
pub(crate) const MAX_TOOLS_PER_PLUGIN: usize = 64;

/// The longest tool description accepted, in bytes; it is sent with every prompt.
pub(crate) const MAX_DESCRIPTION_BYTES: usize = 4 * 1024;

/// The longest `args-schema` accepted, in bytes of JSON.
pub(crate) const MAX_SCHEMA_BYTES: usize = 32 * 1024;

/// A component that passed every load check, ready to instantiate.
pub struct LoadedPlugin {
    /// Unique among the plugins this process loaded: what kept instances are keyed by.
    pub(crate) serial: u64,
    pub(crate) path: PathBuf,
    pub(crate) name: Arc<str>,
    pub(crate) wit_version: String,
    pub(crate) imports: Vec<String>,
    pub(crate) tools: Vec<ToolInfo>,
    pub(crate) cache: CacheOutcome,
    /// The digest of the component's bytes.
    pub(crate) digest: ComponentDigest,
    /// The config's name for the key that signed it, where signatures are checked.
    pub(crate) signer: Option<String>,
    /// Its pin, made when first asked for (and before any tool is shadowed).
    pub(crate) pin: OnceLock<PluginPin>,
    /// Whether the tool list came from the cache rather than a `describe()` call.
    pub(crate) tools_cached: bool,
    /// What a call links: `wasi:http`, if the component imports it, as traps.
    pub(crate) pre: PluginPre<Sandbox>,
    /// For a component importing `wasi:http`, what a call with a network grant links.
    pub(crate) online_pre: Option<PluginPre<Sandbox>>,
}

impl LoadedPlugin {
    /// The component file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's name: the file name without `.wasm`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The `capstan:plugin` version the component was built against.
    pub fn wit_version(&self) -> &str {
        &self.wit_version
    }

    /// Every interface the component imports.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// The tools it offers, in its order.
    pub fn tools(&self) -> &[ToolInfo] {
        &self.tools
    }

    /// What a call links: with `networked`, `wasi:http` where the component imports it.
    pub(crate) fn pre(&self, networked: bool) -> &PluginPre<Sandbox> {
        match (&self.online_pre, networked) {
            (Some(online), true) => online,
            _ => &self.pre,
        }
    }

    /// The digest of the component's bytes, as `capstan.lock` pins it.
    pub fn digest(&self) -> ComponentDigest {
        self.digest
    }

    /// The component as `capstan.lock` pins it: digest, contract and every tool it
    /// declares (a tool another plugin provides by `plugins.prefer` included).
    pub fn pin(&self) -> &PluginPin {
        self.pin.get_or_init(|| PluginPin {
            digest: self.digest,
            contract: self.wit_version.clone(),
            tools: self
                .tools
                .iter()
                .map(|tool| (tool.name.clone(), tool.pin()))
                .collect(),
        })
    }

    /// The config's name for the key whose signature let it in (`[plugins.signers.NAME]`);
    /// `None` where the config requires no signature.
    pub fn signer(&self) -> Option<&str> {
        self.signer.as_deref()
    }

    /// Whether the compiled component came from the artifact cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.cache
    }

    /// Whether the tool list came from the artifact cache, sealed beside the artifact,
    /// rather than from running `describe()`.
    pub fn tools_cached(&self) -> bool {
        self.tools_cached
    }
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("path", &self.path)
            .field("wit_version", &self.wit_version)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

/// One tool as its plugin describes it, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolInfo {
    /// Unique across the loaded plugins.
    pub name: String,
    /// For the model.
    pub description: String,
    /// The JSON Schema of the arguments object.
    pub args_schema: serde_json::Value,
    /// What the tool needs to run.
    pub capabilities: Vec<Capability>,
    /// The effect the tool declares (`effect:send` in a plugin's list; an MCP tool's
    /// `readOnlyHint`), if it declares one; the host takes the higher of it and what
    /// the capabilities imply.
    pub effect: Option<Effect>,
}

impl ToolInfo {
    /// The tool as `capstan.lock` pins it: its capabilities and effect, and digests of its
    /// description and schema.
    pub fn pin(&self) -> ToolPin {
        ToolPin {
            capabilities: self.capabilities.clone(),
            effect: self.effect,
            description: TextDigest::of_text(&self.description),
            schema: TextDigest::of_json(&self.args_schema),
        }
    }

    /// Checks the specs `describe()` returned: how many, names, descriptions, schemas and
    /// capabilities. Each refusal names the file, the tool (escaped and cut) and the limit.
    pub(crate) fn from_specs(
        path: &Path,
        specs: Vec<ToolSpec>,
    ) -> Result<Vec<ToolInfo>, LoadError> {
        if specs.len() > MAX_TOOLS_PER_PLUGIN {
            return Err(LoadError::TooManyTools {
                path: path.to_owned(),
                count: specs.len(),
                max: MAX_TOOLS_PER_PLUGIN,
            });
        }
        let mut tools: Vec<ToolInfo> = Vec::with_capacity(specs.len());
        for spec in specs {
            let bad = |reason: String| LoadError::BadToolSpec {
                path: path.to_owned(),
                tool: echo_name(&spec.name, MAX_TOOL_NAME),
                reason,
            };
            if !valid_tool_name(&spec.name) {
                return Err(bad(format!(
                    "invalid name; use 1 to {MAX_TOOL_NAME} lowercase ASCII letters, digits and \
                     `_`, starting with a letter"
                )));
            }
            if tools.iter().any(|t| t.name == spec.name) {
                return Err(bad("declared twice by this plugin".into()));
            }
            check_description(&spec.description).map_err(bad)?;
            let args_schema = parse_args_schema(&spec.args_schema).map_err(bad)?;
            let mut capabilities = Vec::with_capacity(spec.capabilities.len());
            let mut effect = None;
            for entry in &spec.capabilities {
                match Effect::declared(entry) {
                    Some(Ok(declared)) => {
                        if effect.is_some_and(|e| e != declared) {
                            return Err(bad(format!(
                                "declares two effects (`{}` and `{entry}`); declare one",
                                effect.map(Effect::declaration).unwrap_or_default()
                            )));
                        }
                        effect = Some(declared);
                    }
                    Some(Err(err)) => return Err(bad(one_line(&err.to_string()).into_owned())),
                    None => capabilities.push(
                        entry
                            .parse::<Capability>()
                            .map_err(|err| bad(one_line(&err.to_string()).into_owned()))?,
                    ),
                }
            }
            tools.push(ToolInfo {
                name: spec.name,
                description: spec.description,
                args_schema,
                capabilities,
                effect,
            });
        }
        Ok(tools)
    }
}

/// Checks a tool's description as every prompt carries it: at most
/// [`MAX_DESCRIPTION_BYTES`], text, newlines and tabs only.
pub(crate) fn check_description(description: &str) -> Result<(), String> {
    if description.len() > MAX_DESCRIPTION_BYTES {
        return Err(format!(
            "description is {} bytes, over the limit of {MAX_DESCRIPTION_BYTES}; shorten it",
            description.len()
        ));
    }
    if let Some(c) = description
        .chars()
        .find(|&c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(format!(
            "description contains the control character U+{:04X}; only text, newlines and \
             tabs are allowed",
            c as u32
        ));
    }
    Ok(())
}

/// Reads a tool's arguments schema: at most [`MAX_SCHEMA_BYTES`] of JSON, a valid JSON
/// Schema for an object (as model APIs require of a tool's parameters).
pub(crate) fn parse_args_schema(text: &str) -> Result<serde_json::Value, String> {
    if text.len() > MAX_SCHEMA_BYTES {
        return Err(format!(
            "args-schema is {} bytes, over the limit of {MAX_SCHEMA_BYTES}; simplify the \
             arguments",
            text.len()
        ));
    }
    let schema: serde_json::Value = serde_json::from_str(text)
        .map_err(|err| format!("args-schema is not valid JSON: {err}"))?;
    check_args_schema(&schema)
        .map_err(|err| format!("args-schema is not a valid JSON Schema: {err}"))?;
    Ok(schema)
}

/// One tool as a `describe()` returns it, before any check: the input of
/// [`check_describe_output`], and what the artifact cache keeps of a component.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RawToolSpec {
    /// The tool's name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// Its arguments' JSON Schema, as text.
    pub args_schema: String,
    /// Its capabilities, as text.
    pub capabilities: Vec<String>,
}

/// Runs the load path's checks of `describe()` output on `specs`, as if `path` had
/// returned them. A hook for property tests; plugins are checked by
/// [`PluginHost::load`](super::PluginHost::load).
#[doc(hidden)]
pub fn check_describe_output(
    path: &Path,
    specs: Vec<RawToolSpec>,
) -> Result<Vec<ToolInfo>, LoadError> {
    ToolInfo::from_specs(path, specs.into_iter().map(ToolSpec::from).collect())
}

impl From<RawToolSpec> for ToolSpec {
    fn from(s: RawToolSpec) -> Self {
        ToolSpec {
            name: s.name,
            description: s.description,
            args_schema: s.args_schema,
            capabilities: s.capabilities,
        }
    }
}

impl From<ToolSpec> for RawToolSpec {
    fn from(s: ToolSpec) -> Self {
        RawToolSpec {
            name: s.name,
            description: s.description,
            args_schema: s.args_schema,
            capabilities: s.capabilities,
        }
    }
}

fn valid_tool_name(name: &str) -> bool {
    crate::text::is_plain_name(name, MAX_TOOL_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, schema: &str, caps: &[&str]) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: "d".into(),
            args_schema: schema.into(),
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn specs_are_checked_and_errors_name_the_tool() {
        let path = Path::new("x.wasm");
        let ok = ToolInfo::from_specs(path, vec![spec("file_read", "{}", &["fs.read"])]).unwrap();
        assert_eq!(ok[0].capabilities, vec![Capability::FsRead]);

        for (bad, why) in [
            (spec("File", "{}", &[]), "invalid name"),
            (spec("a", "not json", &[]), "not valid JSON"),
            (spec("a", "[]", &[]), "JSON Schema object"),
            (
                spec("a", r#"{"type": "objekt"}"#, &[]),
                "not a valid JSON Schema",
            ),
            (spec("a", "{}", &["fs.root"]), "fs.root"),
        ] {
            let err = ToolInfo::from_specs(path, vec![bad])
                .unwrap_err()
                .to_string();
            assert!(err.contains(why) && err.contains("x.wasm"), "{err}");
        }
        let twice = vec![spec("a", "{}", &[]), spec("a", "{}", &[])];
        assert!(ToolInfo::from_specs(path, twice).is_err());
    }

    #[test]
    fn an_effect_is_read_from_the_list_and_is_no_capability() {
        let path = Path::new("x.wasm");
        let mailer = spec("mail_send", "{}", &["effect:send", "secret:MAIL"]);
        let tools = ToolInfo::from_specs(path, vec![mailer]).unwrap();
        assert_eq!(tools[0].effect, Some(Effect::Send));
        assert_eq!(
            tools[0].capabilities,
            vec![Capability::Secret("MAIL".into())]
        );
        let plain = ToolInfo::from_specs(path, vec![spec("a", "{}", &["fs.read"])]).unwrap();
        assert_eq!(plain[0].effect, None);
        for (caps, why) in [
            (
                &["effect:launch"][..],
                "`launch` is not an effect; use read, write-local or send",
            ),
            (&["effect:read", "effect:send"][..], "declares two effects"),
        ] {
            let err = ToolInfo::from_specs(path, vec![spec("a", "{}", caps)])
                .unwrap_err()
                .to_string();
            assert!(err.contains(why) && err.contains("x.wasm"), "{err}");
        }
    }
}
