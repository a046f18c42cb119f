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
pub(crate) use digest::hash_large;
pub use digest::{ComponentDigest, TextDigest};
pub use lock::{LOCK_FILE, Lock, LockError, PluginPin, ServerPin, ToolPin};
pub use signature::{
    SIGNATURE_FORMAT, SignatureError, SignatureFile, Signer, Signers, Verified, signature_path,
};

use std::path::{Path, PathBuf};

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
    /// tool or capability; no other effect, description or schema) is let in.
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

    /// Whether plugin `name`, pinned as `pin` now, is let in: `Err` holds what differs.
    ///
    /// ```
    /// use capstan_host::plugin::trust::{ComponentDigest, Lock, Pins, PluginPin};
    ///
    /// let pin = PluginPin { digest: ComponentDigest::of(b"v1"), contract: "0.2.1".into(), tools: Default::default() };
    /// let mut lock = Lock::default();
    /// lock.plugins.insert("files".into(), pin.clone());
    /// let pins = Pins::new(lock, "capstan.lock", false);
    /// assert!(pins.check_plugin("files", &pin).is_ok());
    /// let update = PluginPin { digest: ComponentDigest::of(b"v2"), ..pin };
    /// assert_eq!(pins.check_plugin("files", &update).unwrap_err().to_string(), "component changed (...)".replace("...", &format!("{} -> {}", ComponentDigest::of(b"v1").short(), ComponentDigest::of(b"v2").short())));
    /// assert!(pins.check_plugin("other", &update).is_err(), "not in the lock");
    /// ```
    pub fn check_plugin(&self, name: &str, pin: &PluginPin) -> Result<(), Changes> {
        let changes = match self.lock.plugins.get(name) {
            _ if self.file_missing => Changes::no_lock_file(),
            Some(pinned) => Changes::of_plugin(pinned, pin),
            None => Changes::not_locked(),
        };
        self.lets_in(changes)
    }

    /// Whether MCP server `server`, reached at `identity`, may offer any tool: `Err` if
    /// there is no lock file, the lock does not name it, or it moved.
    pub fn check_server(&self, server: &str, identity: &str) -> Result<(), Changes> {
        match self.lock.mcp.get(server) {
            _ if self.file_missing => Err(Changes::no_lock_file()),
            None => Err(Changes::not_locked()),
            Some(pinned) if pinned.server != identity => {
                Err(Changes::moved(&pinned.server, identity))
            }
            Some(_) => Ok(()),
        }
    }

    /// Whether `server`'s tool `remote` (by the server's own name), pinned as `pin` now,
    /// is let in; call once [`Pins::check_server`] let the server in.
    pub fn check_tool(&self, server: &str, remote: &str, pin: &ToolPin) -> Result<(), Changes> {
        let pinned = self
            .lock
            .mcp
            .get(server)
            .and_then(|server| server.tools.get(remote));
        self.lets_in(Changes::of_tool(remote, pinned, pin))
    }

    /// `Ok` if `changes` let a component or tool in (none, or only narrowing where the
    /// config accepts that).
    fn lets_in(&self, changes: Changes) -> Result<(), Changes> {
        if changes.is_empty() {
            return Ok(());
        }
        if self.accept_narrowing && changes.only_narrows() {
            tracing::info!(
                "an update that only narrows is accepted (plugins.accept_narrowing): {changes}"
            );
            return Ok(());
        }
        Err(changes)
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
