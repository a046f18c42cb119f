//! [`AgentBuilder`]: config, services, plugins and provider, assembled in one place.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::error::BuildError;
use crate::agent::{Event, Runtime};
use crate::config::{Config, ProviderSettings};
use crate::llm::{OpenAiProvider, Provider, Recorder, Script, ScriptedProvider};
use crate::net::NetHost;
use crate::plugin::{ArtifactCache, CallLog, PluginHost, Registry};
use crate::services::Services;

/// Assembles an agent from its [`Config`]: creates the workspace, opens the SQLite store
/// in `agent.data_dir` (unless other [`Services`] are given), loads the plugins on a host
/// backed by those services, makes the model provider from `[provider]` (unless one is
/// given), and starts the [`Runtime`].
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use capstan_host::app::AgentBuilder;
/// use capstan_host::config::Config;
///
/// let config = Config::load(std::path::Path::new("capstan.toml"))?;
/// let agent = AgentBuilder::new(config)
///     .plugins_dir("target/plugins")
///     .build()
///     .await?;
/// agent.runtime.send_user_message("main", "hello").await?;
/// agent.runtime.wait_idle("main").await;
/// # Ok(()) }
/// ```
#[must_use = "an AgentBuilder does nothing until built"]
pub struct AgentBuilder {
    config: Config,
    plugins_dirs: Option<Vec<PathBuf>>,
    plugin_files: Vec<PathBuf>,
    cache: ArtifactCache,
    provider: Option<Arc<dyn Provider>>,
    services: Option<Services>,
    default_script: Option<(String, String)>,
    record: Option<PathBuf>,
}

/// A started agent.
pub struct Agent {
    /// The runtime: send messages, wait, stop.
    pub runtime: Arc<Runtime>,
    /// Everything the runtime reports, in order.
    pub events: mpsc::UnboundedReceiver<Event>,
    /// The plugins, loaded and refused.
    pub registry: Arc<Registry>,
}

impl AgentBuilder {
    /// A builder on `config`. By default: the plugins of `agent.plugins_dir` (none if it
    /// is unset; the first-party ones are the command line's to add), no artifact cache, and the provider
    /// `[provider]` describes.
    pub fn new(config: Config) -> Self {
        AgentBuilder {
            config,
            plugins_dirs: None,
            plugin_files: Vec::new(),
            cache: ArtifactCache::disabled(),
            provider: None,
            services: None,
            default_script: None,
            record: None,
        }
    }

    /// Loads the plugins of `dir` instead of `agent.plugins_dir`.
    pub fn plugins_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugins_dirs = Some(vec![dir.into()]);
        self
    }

    /// Loads the plugins of `dirs`, searched in order, instead of `agent.plugins_dir`: a
    /// file in an earlier one hides a file of the same name in a later one.
    pub fn plugins_dirs(mut self, dirs: impl IntoIterator<Item = PathBuf>) -> Self {
        self.plugins_dirs = Some(dirs.into_iter().collect());
        self
    }

    /// Loads the plugin file `path` too; building fails if it is refused.
    pub fn plugin_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.plugin_files.push(path.into());
        self
    }

    /// Keeps compiled plugins in `cache`.
    pub fn cache(mut self, cache: ArtifactCache) -> Self {
        self.cache = cache;
        self
    }

    /// Talks to `provider` instead of the one `[provider]` describes.
    pub fn provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Keeps tasks, memories, history, the audit log and worker records in `services`
    /// instead of the store the config's `[store]` names, which is then not opened.
    pub fn services(mut self, services: Services) -> Self {
        self.services = Some(services);
        self
    }

    /// The script `[provider] kind = "scripted"` plays when it names none; `name` is the
    /// provider's name in logs (`scripted:<name>`).
    pub fn default_script(mut self, script: &str, name: &str) -> Self {
        self.default_script = Some((script.to_owned(), name.to_owned()));
        self
    }

    /// Saves every model exchange to `path` as a script the scripted provider can replay.
    pub fn record(mut self, path: impl Into<PathBuf>) -> Self {
        self.record = Some(path.into());
        self
    }

    /// Assembles and starts the agent.
    pub async fn build(self) -> Result<Agent, BuildError> {
        let config = self.config;
        let workspace = &config.agent.workspace;
        crate::config::make_workspace(workspace)?;
        let services = match self.services {
            Some(services) => services,
            None => super::open_services(&config).await?,
        };
        let secrets = super::load_secrets(&config)?;
        let redactor = secrets.redactor().clone();
        // Every span leaves through the log's redactor, which knows the secrets from here.
        crate::telemetry::start_traces(&config.telemetry)?;
        let host = PluginHost::new(config.limits.tool.clone(), self.cache)
            .map_err(BuildError::Host)?
            .with_services(services.clone())
            .with_network(NetHost::new(config.net.clone(), secrets))
            .with_trust(super::trust(&config)?);
        let host = Arc::new(host);
        let log = CallLog::new(services.audit.clone(), redactor.clone());
        let dirs = self
            .plugins_dirs
            .unwrap_or_else(|| config.agent.plugins_dirs.clone());
        let mut registry = if dirs.is_empty() {
            Registry::new(host, log)
        } else {
            Registry::load_dirs_preferring(host, log, &dirs, &config.prefer)
                .await
                .map_err(|source| BuildError::Plugins { dirs, source })?
        };
        for path in self.plugin_files {
            if let Err(err) = registry.add_file(&path).await {
                let message = err.to_string();
                return Err(BuildError::Plugin { path, message });
            }
        }
        crate::mcp::add_servers(&config, &mut registry, crate::mcp::Servers::Named).await;
        let provider = match self.provider {
            Some(provider) => provider,
            None => from_settings(&config, self.default_script)?,
        };
        let provider: Arc<dyn Provider> = match self.record {
            Some(path) => Arc::new(Recorder::new(provider, &path, redactor)),
            None => provider,
        };
        let registry = Arc::new(registry);
        let (runtime, events) = Runtime::new(config, registry.clone(), services, provider).await?;
        Ok(Agent {
            runtime,
            events,
            registry,
        })
    }
}

/// The provider `[provider]` describes.
fn from_settings(
    config: &Config,
    default_script: Option<(String, String)>,
) -> Result<Arc<dyn Provider>, BuildError> {
    Ok(match &config.provider {
        ProviderSettings::Scripted { script: Some(path) } => {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            Arc::new(ScriptedProvider::new(Script::load(path)?, &name))
        }
        ProviderSettings::Scripted { script: None } => {
            let (text, name) = default_script.ok_or(BuildError::NoScript)?;
            let source = format!("the {name} script");
            Arc::new(ScriptedProvider::new(Script::parse(&text, &source)?, &name))
        }
        ProviderSettings::OpenAi {
            base_url,
            api_key_env,
            model,
        } => Arc::new(
            OpenAiProvider::from_env(base_url, api_key_env, model)?
                .with_max_answer_bytes(config.limits.max_answer_bytes),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scripted_provider_without_a_script_is_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::parse("", &dir.path().join("capstan.toml")).unwrap();
        let err = AgentBuilder::new(config)
            .build()
            .await
            .err()
            .expect("no script");
        assert!(matches!(err, BuildError::NoScript), "{err}");
        assert!(err.to_string().contains("script = "), "{err}");
    }

    #[tokio::test]
    async fn a_refused_plugin_file_fails_the_build_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::parse("", &dir.path().join("capstan.toml")).unwrap();
        let bad = dir.path().join("bad.wasm");
        std::fs::write(&bad, b"not a component").unwrap();
        let err = AgentBuilder::new(config)
            .plugin_file(&bad)
            .default_script("", "empty")
            .build()
            .await
            .err()
            .expect("refused");
        assert!(
            matches!(&err, BuildError::Plugin { path, .. } if *path == bad),
            "{err}"
        );
        assert!(err.to_string().contains("bad.wasm"), "{err}");
    }
}
