//! A loaded plugin and the tools it offers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use capstan_caps::Capability;

use super::bindings::PluginPre;
use super::bindings::exports::capstan::plugin::tool::ToolSpec;
use super::cache::CacheOutcome;
use super::error::LoadError;
use super::sandbox::Sandbox;

/// The longest tool name accepted; names go into model tool lists, which limit them.
const MAX_TOOL_NAME: usize = 64;

/// A component that passed every load check, ready to instantiate.
pub struct LoadedPlugin {
    pub(crate) path: PathBuf,
    pub(crate) name: Arc<str>,
    pub(crate) wit_version: String,
    pub(crate) imports: Vec<String>,
    pub(crate) tools: Vec<ToolInfo>,
    pub(crate) cache: CacheOutcome,
    pub(crate) pre: PluginPre<Sandbox>,
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

    /// Whether the compiled component came from the artifact cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.cache
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
}

impl ToolInfo {
    /// Checks the specs `describe()` returned: names, schemas and capabilities.
    pub(crate) fn from_specs(
        path: &Path,
        specs: Vec<ToolSpec>,
    ) -> Result<Vec<ToolInfo>, LoadError> {
        let mut tools: Vec<ToolInfo> = Vec::with_capacity(specs.len());
        for spec in specs {
            let bad = |reason: String| LoadError::BadToolSpec {
                path: path.to_owned(),
                tool: spec.name.clone(),
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
            let args_schema: serde_json::Value = serde_json::from_str(&spec.args_schema)
                .map_err(|err| bad(format!("args-schema is not valid JSON: {err}")))?;
            if !args_schema.is_object() {
                return Err(bad("args-schema must be a JSON Schema object".into()));
            }
            let capabilities = spec
                .capabilities
                .iter()
                .map(|c| c.parse::<Capability>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| bad(err.to_string()))?;
            tools.push(ToolInfo {
                name: spec.name,
                description: spec.description,
                args_schema,
                capabilities,
            });
        }
        Ok(tools)
    }
}

fn valid_tool_name(name: &str) -> bool {
    name.len() <= MAX_TOOL_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
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
}
