//! What a deployment trusts: which components and MCP tools it offers, pinned in
//! `capstan.lock` ([`Lock`]), and whose signatures a component must carry ([`Signers`]).
//!
//! Both are checked where tools come in, and only there: a component's signature when its
//! file is read ([`PluginHost::prepare`](crate::plugin::PluginHost)), before anything of
//! it is compiled; its pin once its tools are known, before the
//! [`Registry`](crate::plugin::Registry) offers any of them; an MCP server's tools when
//! they are added. A refusal says what changed ([`Changes`]) and how to accept it.

mod changes;
mod digest;
mod lock;
mod signature;

pub use changes::{Change, Changes, Direction};
pub use digest::{ComponentDigest, TextDigest};
pub use lock::{LOCK_FILE, Lock, LockError, PluginPin, ServerPin, ToolPin};
pub use signature::{
    SIGNATURE_FORMAT, SignatureError, SignatureFile, Signer, Signers, Verified, signature_path,
};

use std::path::{Path, PathBuf};

use super::error::LoadError;
use super::loaded::{LoadedPlugin, ToolInfo};

/// What the host trusts: the signers components must be signed by, and the lock their
/// tools must match. The default trusts every component that passes the load checks.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// The keys components may be signed by, and whether they must be.
    pub signers: Signers,
    /// The lock, if there is one.
    pub pins: Option<Pins>,
}

/// A lock in force: `capstan.lock`, where it was read, and whether an update that only
/// narrows is let in unasked.
#[derive(Debug, Clone)]
pub struct Pins {
    lock: Lock,
    path: PathBuf,
    accept_narrowing: bool,
    /// The config requires a lock and there is none: nothing is let in.
    file_missing: bool,
}

impl Pins {
    /// `lock`, read from `path`; with `accept_narrowing`, an update that adds nothing (no
    /// tool, capability or higher effect; no new description or schema) is let in.
    pub fn new(lock: Lock, path: impl Into<PathBuf>, accept_narrowing: bool) -> Self {
        Pins {
            lock,
            path: path.into(),
            accept_narrowing,
            file_missing: false,
        }
    }

    /// No lock at `path`, where the config requires one (`plugins.require_lock`): nothing
    /// is let in, and each refusal says to write it.
    pub fn missing(path: impl Into<PathBuf>) -> Self {
        Pins {
            file_missing: true,
            ..Pins::new(Lock::default(), path, false)
        }
    }

    /// The lock.
    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// Where it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lets `plugin` in if the lock pins it as it is (or it only narrows, where the
    /// config accepts that); else why not, with what changed.
    pub fn admit_plugin(&self, plugin: &LoadedPlugin) -> Result<(), LoadError> {
        let changes = match self.lock.plugins.get(plugin.name()) {
            _ if self.file_missing => Changes::no_lock_file(),
            Some(pinned) => Changes::of_plugin(pinned, plugin.pin()),
            None => Changes::not_locked(),
        };
        if self.lets_in(&changes) {
            if !changes.is_empty() {
                tracing::info!(
                    plugin = plugin.name(),
                    "an update that only narrows is accepted (plugins.accept_narrowing): \
                     {changes}"
                );
            }
            return Ok(());
        }
        Err(LoadError::Unpinned {
            path: plugin.path().to_owned(),
            plugin: plugin.name().to_owned(),
            lock: self.path.clone(),
            changes,
        })
    }

    /// The tools of MCP server `server` (reached at `identity`) that the lock lets in,
    /// each the server's own name and the tool; and a line for each one left out, with
    /// what changed.
    pub fn admit_server(
        &self,
        server: &str,
        identity: &str,
        tools: Vec<(String, ToolInfo)>,
    ) -> (Vec<(String, ToolInfo)>, Vec<String>) {
        let lock = self.path.display();
        let accept = format!("`capstan plugins accept {server}` offers it");
        if self.file_missing {
            let problem = (!tools.is_empty()).then(|| {
                format!(
                    "MCP server `{server}`: none of its tools is offered: there is no {lock}, \
                     and the config requires one (plugins.require_lock); `capstan plugins \
                     lock` writes it"
                )
            });
            return (Vec::new(), problem.into_iter().collect());
        }
        let Some(pinned) = self.lock.mcp.get(server) else {
            let problem = (!tools.is_empty()).then(|| {
                format!(
                    "MCP server `{server}` is not in {lock}: none of its {} tools is offered; \
                     {accept}",
                    tools.len()
                )
            });
            return (Vec::new(), problem.into_iter().collect());
        };
        if pinned.server != identity {
            let changes = Changes::of_server(
                &ServerPin::of(&pinned.server, []),
                &ServerPin::of(identity, []),
            );
            return (
                Vec::new(),
                vec![format!(
                    "MCP server `{server}`: none of its tools is offered: {changes} since {lock} \
                     was written; {accept}"
                )],
            );
        }
        let mut admitted = Vec::new();
        let mut problems = Vec::new();
        for (remote, info) in tools {
            let changes = Changes::of_tool(&remote, pinned.tools.get(&remote), &ToolPin::of(&info));
            if self.lets_in(&changes) {
                admitted.push((remote, info));
            } else {
                problems.push(format!(
                    "MCP tool `{}` is not offered: {changes} since {lock} was written; {accept}",
                    info.name
                ));
            }
        }
        (admitted, problems)
    }

    /// Whether `changes` let a component or tool in.
    fn lets_in(&self, changes: &Changes) -> bool {
        changes.is_empty() || (self.accept_narrowing && changes.only_narrows())
    }
}

/// Writes `bytes` to `path` whole: to a new file beside it (created exclusively, so an
/// entry planted under its name is an error, never followed), synced, then renamed into
/// place, so a reader or a crash never sees half of it and a symlink at `path` is
/// replaced rather than written through.
pub fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{nanos}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
