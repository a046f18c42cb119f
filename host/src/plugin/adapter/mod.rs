//! Messaging adapters: plugins that also export `capstan:channel/adapter`
//! (`wit/channel/channel.wit`).
//!
//! An adapter is loaded as a tool plugin is (checked, signed, pinned, cached), and each of
//! its calls runs in a fresh sandbox under the plugin limits. It runs with what it declares
//! in `describe` intersected with what its `[channels.NAME]` table grants: the platform's
//! hosts and the secret the egress injects. Nothing here knows about conversations: the
//! door that drives an adapter (`crate::messaging`) does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use capstan_caps::{Capability, NetRule};
use wasmtime::Store;

use crate::flow::Label;
use crate::ids::Caller;
use crate::net::mail::Mailbox;
use crate::net::{Egress, GrantSource};
use crate::plugin::error::{LoadError, ToolError};
use crate::plugin::host::{PluginHost, impl_linked};
use crate::plugin::loaded::LoadedPlugin;
use crate::plugin::sandbox::{CallScope, Sandbox};
use crate::policy::Grants;

pub use super::channel::bindings::capstan::channel::types::{
    AdapterError as PlatformError, Attachment, Batch, Feature, Inbound, Outbound, Platform,
    Received, Sender,
};
use super::channel::bindings::{MessagingAdapter as Adapter, MessagingAdapterPre as AdapterPre};

pub use crate::plugin::contract::CHANNEL_WIT_VERSION;

/// Why an adapter's call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum AdapterFailure {
    /// The adapter returned the platform's error (its text is the platform's, redacted).
    #[error("{}", describe_platform_error(.0))]
    Platform(PlatformError),
    /// The sandbox stopped it: a trap, its deadline, its memory limit.
    #[error("{0}")]
    Sandbox(ToolError),
}

/// `err` in a sentence.
fn describe_platform_error(err: &PlatformError) -> String {
    match err {
        PlatformError::RateLimited(ms) => format!("rate limited: retry after {ms} ms"),
        PlatformError::TooLong(max) => format!("too long: the platform takes {max} characters"),
        PlatformError::Malformed(m) => format!("malformed answer: {m}"),
        PlatformError::Denied(m) => format!("denied: {m}"),
        PlatformError::Conflict(m) => format!("conflict: {m}"),
        PlatformError::Failed(m) => format!("failed: {m}"),
    }
}

/// Why an adapter could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AdapterLoadError {
    /// The component is not a plugin the host loads.
    #[error(transparent)]
    Plugin(#[from] LoadError),
    /// The plugin does not export `capstan:channel/adapter`.
    #[error(
        "{}: is not a messaging adapter ({reason}); an adapter exports \
         capstan:channel/adapter@{CHANNEL_WIT_VERSION} (`capstan_sdk::export_adapter!`)",
        path.display()
    )]
    NotAnAdapter {
        /// The file.
        path: PathBuf,
        /// What linking its export said.
        reason: String,
    },
    /// Its `describe` failed or returned what the host does not take.
    #[error("{}: describe failed: {reason}", path.display())]
    Describe {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// It needs a capability its channel does not grant.
    #[error("{}: {reason}", path.display())]
    NotGranted {
        /// The file.
        path: PathBuf,
        /// The missing grant and the fix.
        reason: String,
    },
}

/// What an adapter may use, from its `[channels.NAME]` table.
#[derive(Debug, Clone, Default)]
pub struct AdapterGrants {
    /// The channel's name: the caller its requests are audited under (`adapter:NAME`) and
    /// where a missing grant would go.
    pub channel: String,
    /// The hosts it may reach.
    pub net: Vec<NetRule>,
    /// The secrets its requests may carry.
    pub secrets: Vec<String>,
    /// The mailbox its `capstan:channel/mail` import reaches, for an email channel.
    pub mail: Option<Arc<Mailbox>>,
}

/// An adapter, loaded and described, with what its calls run with.
pub struct LoadedAdapter {
    plugin: LoadedPlugin,
    pre: AdapterPre<Sandbox>,
    caller: Caller,
    platform: Platform,
    declared: Vec<Capability>,
    capabilities: Vec<Capability>,
    granted: Vec<NetRule>,
    source: GrantSource,
    settings: String,
    mail: Option<Arc<Mailbox>>,
}

impl std::fmt::Debug for LoadedAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedAdapter")
            .field("plugin", &self.plugin.path)
            .field("platform", &self.platform.name)
            .field("capabilities", &self.capabilities)
            .finish_non_exhaustive()
    }
}

impl LoadedAdapter {
    /// What the adapter said of its platform.
    pub fn platform(&self) -> &Platform {
        &self.platform
    }

    /// The capabilities its calls run with.
    pub fn capabilities(&self) -> &[Capability] {
        &self.capabilities
    }

    /// The plugin it is.
    pub fn plugin(&self) -> &LoadedPlugin {
        &self.plugin
    }

    /// Whether it supports `feature`.
    pub fn supports(&self, feature: Feature) -> bool {
        self.platform.features.contains(&feature)
    }
}

impl_linked!(AdapterPre<Sandbox> => Adapter);

impl PluginHost {
    /// Loads the adapter at `path` for the channel `grants` names, with its
    /// `[channels.NAME.settings]` as JSON: loaded as a plugin, described in a sandbox
    /// without capabilities, and refused if it needs what the channel does not grant.
    pub async fn load_adapter(
        &self,
        path: &Path,
        settings: String,
        grants: AdapterGrants,
    ) -> Result<LoadedAdapter, AdapterLoadError> {
        let plugin = self.load(path).await?;
        let not_an_adapter = |err: wasmtime::Error| AdapterLoadError::NotAnAdapter {
            path: path.to_owned(),
            reason: format!("{err:#}"),
        };
        let offline =
            AdapterPre::new(plugin.pre(false).instance_pre().clone()).map_err(not_an_adapter)?;
        let describe_failed = |reason: String| AdapterLoadError::Describe {
            path: path.to_owned(),
            reason,
        };
        let caller = Caller::client("adapter", Some(&grants.channel));
        let scope = self.adapter_scope(&plugin, &caller, "describe", Vec::new(), None);
        let sandbox = Sandbox::new(self.limits(), scope, None, Egress::default())
            .map_err(|e| describe_failed(e.to_string()))?;
        let said = self
            .run(&offline, sandbox, async |adapter, store| {
                adapter
                    .capstan_channel_adapter()
                    .call_describe(store, &settings)
                    .await
            })
            .await
            .outcome
            .map_err(|e| describe_failed(e.to_string()))?;
        let platform = said.map_err(|e| describe_failed(describe_platform_error(&e)))?;
        let platform = checked_platform(platform).map_err(describe_failed)?;
        let declared = platform
            .capabilities
            .iter()
            .map(|text| text.parse::<Capability>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| describe_failed(format!("a capability it declares: {e}")))?;
        let held = Grants::new(
            grants
                .net
                .iter()
                .cloned()
                .map(Capability::Net)
                .chain(grants.secrets.iter().cloned().map(Capability::Secret)),
        );
        let capabilities = held
            .effective(&platform.name, &declared)
            .map_err(|denial| AdapterLoadError::NotGranted {
                path: path.to_owned(),
                reason: format!(
                    "adapter `{}` needs `{}`, which [channels.{}] does not grant; add it to \
                     that table's `{}`",
                    platform.name,
                    denial.missing,
                    grants.channel,
                    match denial.missing {
                        Capability::Secret(_) => "secrets",
                        _ => "net",
                    }
                ),
            })?;
        let networked = capabilities.iter().any(|c| matches!(c, Capability::Net(_)));
        let pre = if networked {
            AdapterPre::new(plugin.pre(true).instance_pre().clone()).map_err(not_an_adapter)?
        } else {
            offline
        };
        Ok(LoadedAdapter {
            plugin,
            pre,
            caller,
            platform,
            declared,
            capabilities,
            granted: grants.net,
            source: GrantSource::Channel {
                name: grants.channel,
            },
            settings,
            mail: grants.mail,
        })
    }

    /// Asks `adapter` for new messages since `cursor`, waiting up to `wait_ms` for one.
    pub async fn adapter_poll(
        &self,
        adapter: &LoadedAdapter,
        cursor: Option<&str>,
        wait_ms: u32,
    ) -> Result<Batch, AdapterFailure> {
        let settings = adapter.settings.as_str();
        self.adapter_call(adapter, "poll", async |a, store| {
            a.capstan_channel_adapter()
                .call_poll(store, settings, cursor, wait_ms)
                .await
        })
        .await
    }

    /// Has `adapter` read `body`, an event its platform pushed (its signature checked).
    pub async fn adapter_receive(
        &self,
        adapter: &LoadedAdapter,
        body: &str,
    ) -> Result<Received, AdapterFailure> {
        let settings = adapter.settings.as_str();
        self.adapter_call(adapter, "receive", async |a, store| {
            a.capstan_channel_adapter()
                .call_receive(store, settings, body)
                .await
        })
        .await
    }

    /// Sends `message` through `adapter`; the platform's id for it.
    pub async fn adapter_send(
        &self,
        adapter: &LoadedAdapter,
        message: &Outbound,
    ) -> Result<String, AdapterFailure> {
        let settings = adapter.settings.as_str();
        self.adapter_call(adapter, "send", async |a, store| {
            a.capstan_channel_adapter()
                .call_send(store, settings, message)
                .await
        })
        .await
    }

    /// Replaces the text of message `id` in `room`, which `adapter` sent.
    pub async fn adapter_edit(
        &self,
        adapter: &LoadedAdapter,
        room: &str,
        id: &str,
        text: &str,
    ) -> Result<(), AdapterFailure> {
        let settings = adapter.settings.as_str();
        self.adapter_call(adapter, "edit", async |a, store| {
            a.capstan_channel_adapter()
                .call_edit(store, settings, room, id, text)
                .await
        })
        .await
    }

    /// Shows that the bot is writing in `room` (and `thread`).
    pub async fn adapter_typing(
        &self,
        adapter: &LoadedAdapter,
        room: &str,
        thread: Option<&str>,
    ) -> Result<(), AdapterFailure> {
        let settings = adapter.settings.as_str();
        self.adapter_call(adapter, "typing", async |a, store| {
            a.capstan_channel_adapter()
                .call_typing(store, settings, room, thread)
                .await
        })
        .await
    }

    /// Runs one call of `adapter`'s export in a fresh sandbox holding its capabilities;
    /// its requests audited under `adapter:NAME`, what it returns redacted.
    async fn adapter_call<R: Send>(
        &self,
        adapter: &LoadedAdapter,
        what: &str,
        f: impl AsyncFnOnce(&Adapter, &mut Store<Sandbox>) -> wasmtime::Result<Result<R, PlatformError>>,
    ) -> Result<R, AdapterFailure> {
        let call_net = self.call_net(
            &adapter.platform.name,
            &adapter.caller,
            &adapter.capabilities,
            &adapter.declared,
            &adapter.granted,
            adapter.source.clone(),
        );
        let scope = self.adapter_scope(
            &adapter.plugin,
            &adapter.caller,
            what,
            adapter.capabilities.clone(),
            adapter.mail.clone(),
        );
        let sandbox = Sandbox::new(self.limits(), scope, None, Egress::new(call_net.clone()))
            .map_err(AdapterFailure::Sandbox)?;
        let ran = self.run(&adapter.pre, sandbox, f).await;
        if let Some(call_net) = &call_net {
            call_net.flush().await;
        }
        // The platform's text is the guest's: redacted as a tool's output is.
        let redactor = self.network().secrets().redactor();
        match ran.outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(AdapterFailure::Platform(redact_platform_error(err, |m| {
                redactor.redact_owned(m)
            }))),
            Err(err) => Err(AdapterFailure::Sandbox(
                err.map_message(|m| redactor.redact_owned(m)),
            )),
        }
    }

    /// The sandbox scope of one of `plugin`'s adapter calls.
    fn adapter_scope(
        &self,
        plugin: &LoadedPlugin,
        caller: &Caller,
        what: &str,
        capabilities: Vec<Capability>,
        mail: Option<Arc<Mailbox>>,
    ) -> CallScope {
        CallScope {
            plugin: plugin.name.clone(),
            contract: plugin.wit_version.clone(),
            tool: format!("adapter.{what}"),
            caller: caller.clone(),
            capabilities,
            services: None,
            network: self.network_handle(),
            log_lines: 0,
            label: Label::trusted(),
            reads: None,
            mail,
        }
    }
}

/// `err` with its message passed through `redact`.
fn redact_platform_error(err: PlatformError, redact: impl Fn(String) -> String) -> PlatformError {
    match err {
        PlatformError::Malformed(m) => PlatformError::Malformed(redact(m)),
        PlatformError::Denied(m) => PlatformError::Denied(redact(m)),
        PlatformError::Conflict(m) => PlatformError::Conflict(redact(m)),
        PlatformError::Failed(m) => PlatformError::Failed(redact(m)),
        other => other,
    }
}

/// The most characters a platform may say one message holds: past it a reply is split
/// by the host all the same.
const MAX_TEXT_LIMIT: u32 = 1 << 20;

/// `platform` if the host can work with it: a name of letters, digits, `-` and `_`, and
/// a text limit of at least 64 characters.
fn checked_platform(platform: Platform) -> Result<Platform, String> {
    let name_ok = !platform.name.is_empty()
        && platform.name.len() <= 32
        && platform
            .name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !name_ok {
        return Err(format!(
            "platform name `{}` is not 1 to 32 lowercase letters, digits, '-' or '_'",
            platform.name.escape_debug()
        ));
    }
    if platform.max_text < 64 {
        return Err(format!(
            "max-text {} is under 64 characters, too little to split a reply into",
            platform.max_text
        ));
    }
    Ok(Platform {
        max_text: platform.max_text.min(MAX_TEXT_LIMIT),
        ..platform
    })
}
