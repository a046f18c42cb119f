//! The on-disk cache of precompiled components.
//!
//! Compiling a component takes tens of milliseconds; loading a precompiled artifact takes a
//! fraction of one. Artifacts are keyed by the BLAKE3 hash of the component's bytes and the
//! SHA-256 of the engine's compilation settings, so a changed plugin, a changed engine
//! configuration or a new wasmtime never loads a stale artifact.
//!
//! Loading an artifact runs native code produced from it, so the host loads only artifacts
//! it wrote itself:
//!
//! - every artifact is sealed with a keyed BLAKE3 tag under a random key that the cache
//!   directory keeps owner-only ([`seal`]); the tag covers the artifact, the component's
//!   digest, the engine fingerprint and the file name. A bit-flipped, truncated, planted or
//!   swapped artifact fails the check and is discarded, never deserialized: the component
//!   is compiled again and the artifact replaced, with one warning naming the file;
//! - the directory must belong to the user and be writable by no one else
//!   ([`private_dir`]); it is created with mode 0700;
//! - the host touches the directory only through a [`cap_std::fs::Dir`] handle, so a
//!   symlink planted in it cannot lead a read or a write outside it, and writes go to a
//!   temporary file with a random name, created exclusively, renamed into place;
//! - a seal is checked once per file: once an artifact has passed, its file's stamp
//!   (device, inode, size, change time) is kept beside it, sealed ([`identity`] says when
//!   that is sound), and while the file keeps that stamp it is loaded without being hashed
//!   again, through a sealed copy in memory that nothing can write ([`checked`]). A plugin
//!   file is read once per stamp the same way: its digest and outline are kept sealed
//!   ([`source`]).

mod checked;
mod identity;
mod private_dir;
mod seal;
mod source;

use std::hash::{Hash, Hasher};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use cap_std::fs::{Dir, OpenOptions};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

pub(crate) use identity::{FileStamp, stamp_of};
pub use private_dir::CacheError;
use private_dir::PrivateDir;
pub(crate) use seal::Kind;
use seal::{ArtifactId, SealKey};

use super::trust::ComponentDigest;

/// The largest artifact file read back; anything bigger is discarded unread. Artifacts of
/// real plugins are a few MiB.
const MAX_ARTIFACT_BYTES: u64 = 512 << 20;

/// The largest entry beside an artifact read back: a tool list is 64 tools of at most
/// 36 KiB of text each; a verified signature is a few hundred bytes.
const MAX_ENTRY_BYTES: u64 = 4 << 20;

/// Which component and engine a load was for: what its cached tool list is found by.
/// Empty when no cache is in use.
pub(crate) struct CacheKey(Option<ArtifactId>);

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from a precompiled artifact that passed its check.
    Hit,
    /// Compiled, and the artifact written for next time.
    Compiled,
    /// A stored artifact failed its check (damaged, planted or swapped): it was discarded
    /// without being loaded, the component compiled and a fresh artifact written.
    Discarded,
    /// Compiled; no cache is configured, or it is unusable or writing it failed (logged).
    Uncached,
}

impl CacheOutcome {
    /// A word for listings: `hit`, `compiled`, `discarded` or `uncached`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Compiled => "compiled",
            CacheOutcome::Discarded => "discarded",
            CacheOutcome::Uncached => "uncached",
        }
    }
}

/// A directory of precompiled artifacts, or none.
///
/// ```no_run
/// use capstan_host::plugin::{ArtifactCache, Limits, PluginHost};
///
/// // Checked now: a directory someone else owns or may write is refused.
/// let cache = ArtifactCache::open("/home/me/.cache/capstan")?;
/// let host = PluginHost::new(Limits::default(), cache)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    path: Option<PathBuf>,
    /// The opened directory and its key; `None` inside once opening failed (warned).
    opened: Arc<OnceLock<Option<Opened>>>,
}

/// An opened, checked cache directory and the key its artifacts are sealed with.
#[derive(Debug)]
struct Opened {
    dir: PrivateDir,
    key: SealKey,
}

impl Opened {
    fn open(path: &Path) -> Result<Self, CacheError> {
        let dir = PrivateDir::open(path)?;
        let key = SealKey::load_or_create(&dir)?;
        Ok(Opened { dir, key })
    }
}

impl ArtifactCache {
    /// A cache in `dir`, created (mode 0700) and checked now: a directory that is not a
    /// directory, not owned by the current user, or writable by group or others is refused.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, CacheError> {
        let path = dir.into();
        let opened = Opened::open(&path)?;
        Ok(ArtifactCache {
            path: Some(path),
            opened: Arc::new(OnceLock::from(Some(opened))),
        })
    }

    /// A cache in `dir`, created and checked on first use. If the check fails, a warning
    /// says why and every load compiles without the cache; use [`ArtifactCache::open`] to
    /// get the error instead.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ArtifactCache {
            path: Some(dir.into()),
            opened: Arc::new(OnceLock::new()),
        }
    }

    /// No cache: every load compiles.
    pub fn disabled() -> Self {
        ArtifactCache {
            path: None,
            opened: Arc::new(OnceLock::new()),
        }
    }

    /// The directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The component for `bytes`: from the cache when a sealed artifact for it passes its
    /// check, else compiled (and stored). An artifact that fails the check is discarded,
    /// never deserialized, and replaced.
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let key = self.key(engine, &ComponentDigest::of(bytes));
        self.load_keyed(engine, &key, &|| Component::new(engine, bytes))
    }

    /// The key of the component whose bytes have `digest`, on `engine`: what its cached
    /// entries are found by.
    pub(crate) fn key(&self, engine: &Engine, digest: &ComponentDigest) -> CacheKey {
        match self.opened() {
            Some(_) => CacheKey(Some(ArtifactId::new(engine, digest))),
            None => CacheKey(None),
        }
    }

    /// [`ArtifactCache::load`] of the component whose key is `key`: `compile` is called
    /// only when no sealed artifact of it passes (it reads the component's bytes if it
    /// must, and compiles them).
    pub(crate) fn load_keyed(
        &self,
        engine: &Engine,
        key: &CacheKey,
        compile: &dyn Fn() -> wasmtime::Result<Component>,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        match (self.opened(), &key.0) {
            (Some(opened), Some(id)) => opened.load(engine, id, compile),
            _ => Ok((compile()?, CacheOutcome::Uncached)),
        }
    }

    /// The `kind` entry kept for the component of `key` by [`ArtifactCache::store_entry`]
    /// (what `describe()` gave, a verified signature), if a sealed one passes its check.
    /// One that fails is discarded (with a warning) and `None` returned, so it is made
    /// again.
    pub(crate) fn entry<T: serde::de::DeserializeOwned>(
        &self,
        key: &CacheKey,
        kind: Kind,
    ) -> Option<T> {
        self.opened()?.entry(key.0.as_ref()?, kind)
    }

    /// Keeps `entry` as the `kind` entry of the component of `key`, sealed like its
    /// artifact. A failure to write is logged: the entry is made again next time.
    pub(crate) fn store_entry<T: serde::Serialize>(&self, key: &CacheKey, kind: Kind, entry: &T) {
        if let (Some(opened), Some(id)) = (self.opened(), key.0.as_ref()) {
            opened.store_entry(id, kind, entry);
        }
    }

    /// The opened directory, opening it on first use.
    fn opened(&self) -> Option<&Opened> {
        let path = self.path.as_ref()?;
        self.opened
            .get_or_init(|| match Opened::open(path) {
                Ok(opened) => Some(opened),
                Err(err) => {
                    tracing::warn!("{err}; compiling every component without the cache");
                    None
                }
            })
            .as_ref()
    }
}

impl Opened {
    /// The component of `id`: its sealed artifact if one passes the check, else what
    /// `compile` makes, stored.
    fn load(
        &self,
        engine: &Engine,
        id: &ArtifactId,
        compile: &dyn Fn() -> wasmtime::Result<Component>,
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let name = id.file_name(Kind::Artifact);
        let mut outcome = CacheOutcome::Compiled;
        match open_sealed(self.dir.handle(), &name, MAX_ARTIFACT_BYTES) {
            Ok(None) => {}
            Ok(Some(file)) => match self.load_sealed(engine, id, &name, file) {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(Refused::Limit(err)) => return Err(err),
                Err(Refused::Check(reason)) => outcome = self.discard(&name, &reason),
            },
            Err(reason) => outcome = self.discard(&name, &reason),
        }
        let component = compile()?;
        if let Err(err) = self.store(id, &name, &component) {
            tracing::warn!(
                cache = %self.dir.path().display(),
                "cannot write the component cache: {err}"
            );
            outcome = CacheOutcome::Uncached;
        }
        Ok((component, outcome))
    }

    /// The component in the open artifact `file` of `id`. While the file keeps the stamp
    /// it had when its seal last passed, it is mapped from a sealed copy without hashing it
    /// again; otherwise its seal is checked over every byte, and the stamp kept if the
    /// file had settled before the check began.
    fn load_sealed(
        &self,
        engine: &Engine,
        id: &ArtifactId,
        name: &str,
        file: std::fs::File,
    ) -> Result<Component, Refused> {
        let unreadable = |err: std::io::Error| Refused::Check(format!("cannot read it: {err}"));
        let began = std::time::SystemTime::now();
        let stamp = stamp_of(&file).map_err(unreadable)?;
        let recorded = self.entry::<FileStamp>(id, Kind::Checked);
        if recorded == Some(stamp) {
            match checked::load(engine, &file, stamp) {
                Ok(component) => {
                    tracing::debug!(
                        artifact = %self.dir.path().join(name).display(),
                        "unchanged since its seal was checked: loaded without hashing it again"
                    );
                    return Ok(component);
                }
                Err(checked::Failed::Limit(err)) => return Err(Refused::Limit(err)),
                // Changed since, or no memory file here: the full check decides.
                Err(checked::Failed::Unmapped(reason)) => tracing::debug!(
                    artifact = %self.dir.path().join(name).display(),
                    "a checked artifact was not mapped from a copy ({reason}); checking it in full"
                ),
            }
        }
        // Bounded again: the file may have grown since it was opened.
        let sealed = read_open(&file, stamp.len.min(MAX_ARTIFACT_BYTES)).map_err(unreadable)?;
        let artifact = self
            .key
            .open(id, Kind::Artifact, &sealed)
            .map_err(|reason| Refused::Check(reason.to_owned()))?;
        // SAFETY: the artifact passed a keyed-hash check under a key only this user can
        // read, over the component's digest, the engine fingerprint and this file name:
        // this host wrote it with `Component::serialize` for these very bytes and engine
        // settings. It is deserialized from the buffer that was checked, never re-read
        // from disk; wasmtime checks its header and version again.
        let component = match unsafe { Component::deserialize(engine, artifact) } {
            Ok(component) => component,
            // A sound artifact this host's limits refuse: compiling again would be
            // refused alike, and a host with other limits can still use it.
            Err(err) if super::failure::is_pool_limit(&err) => return Err(Refused::Limit(err)),
            Err(err) => return Err(Refused::Check(format!("wasmtime refused it: {err}"))),
        };
        // The bytes checked are the file's if its stamp did not move while they were read,
        // and no later write keeps the stamp if it had settled before the read began.
        let unchanged = stamp_of(&file).is_ok_and(|now| now == stamp);
        if unchanged && identity::settled(&stamp, began) && recorded != Some(stamp) {
            self.store_entry(id, Kind::Checked, &stamp);
        }
        Ok(component)
    }

    /// The `kind` entry of `id`, if a sealed one passes its check; one that fails is
    /// discarded (with a warning), so it is made again.
    fn entry<T: serde::de::DeserializeOwned>(&self, id: &ArtifactId, kind: Kind) -> Option<T> {
        let name = id.file_name(kind);
        let sealed = match read_sealed(self.dir.handle(), &name, MAX_ENTRY_BYTES) {
            Ok(found) => found?,
            Err(reason) => {
                self.discard(&name, &reason);
                return None;
            }
        };
        let parsed = self
            .key
            .open(id, kind, &sealed)
            .map_err(str::to_owned)
            .and_then(|json| {
                serde_json::from_slice(json).map_err(|err| format!("not a cached entry: {err}"))
            });
        match parsed {
            Ok(entry) => Some(entry),
            Err(reason) => {
                self.discard(&name, &reason);
                None
            }
        }
    }

    /// Keeps `entry` as the `kind` entry of `id`, sealed. A failure to write is logged.
    fn store_entry<T: serde::Serialize>(&self, id: &ArtifactId, kind: Kind, entry: &T) {
        let json = serde_json::to_vec(entry).expect("a cached entry serializes");
        let sealed = self.key.seal(id, kind, json);
        if let Err(err) = self.write_sealed(&id.file_name(kind), &sealed) {
            tracing::warn!(
                cache = %self.dir.path().display(),
                "cannot write the component cache: {err}"
            );
        }
    }

    /// Removes the file `name` (the entry itself, never what a symlink points to) and says
    /// why once.
    fn discard(&self, name: &str, reason: &str) -> CacheOutcome {
        let path = self.dir.path().join(name);
        tracing::warn!(
            artifact = %path.display(),
            "discarded a cached file that failed its check ({reason}); it was not loaded, \
             and is being made again and replaced"
        );
        self.remove(name);
        CacheOutcome::Discarded
    }

    /// Removes the file `name` (the entry itself, never what a symlink points to), if it
    /// is there; a failure is logged.
    fn remove(&self, name: &str) {
        match self.dir.handle().remove_file(name) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => tracing::warn!(
                file = %self.dir.path().join(name).display(),
                "cannot remove it from the component cache: {err}"
            ),
        }
    }

    /// Seals the serialized component and moves it into place under `name`, through a
    /// temporary file with a random name created exclusively, so a reader never sees a
    /// half-written file and a planted name is never followed.
    fn store(&self, id: &ArtifactId, name: &str, component: &Component) -> std::io::Result<()> {
        let artifact = component.serialize().map_err(std::io::Error::other)?;
        self.write_sealed(name, &self.key.seal(id, Kind::Artifact, artifact))
    }

    /// Moves `sealed` into place under `name`, as [`Opened::store`] says.
    fn write_sealed(&self, name: &str, sealed: &[u8]) -> std::io::Result<()> {
        let dir = self.dir.handle();
        let tmp = format!(".tmp-{}", seal::random_hex(16)?);
        let written = (|| {
            let mut file = dir.open_with(&tmp, &private_new_file())?;
            file.write_all(sealed)?;
            file.sync_all()?;
            dir.rename(&tmp, dir, name)
        })();
        if written.is_err() {
            let _ = dir.remove_file(&tmp);
        }
        written
    }
}

/// Options for a new file only the owner may read: created exclusively (an existing entry,
/// a symlink included, is an error rather than followed), mode 0600.
pub(crate) fn private_new_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    cap_std::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
}

/// Why a sealed artifact was not loaded.
enum Refused {
    /// It failed its check: discarded and made again.
    Check(String),
    /// It is sound, but over this host's limits: kept, and the load refused.
    Limit(wasmtime::Error),
}

/// The sealed file `name` opened, if there is one. Anything but a regular file (a
/// symlink, a FIFO, a directory) or a file over `max` bytes is an error, so it is
/// discarded unread.
fn open_sealed(dir: &Dir, name: &str, max: u64) -> Result<Option<std::fs::File>, String> {
    let metadata = match dir.symlink_metadata(name) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("cannot read its metadata: {err}")),
    };
    if !metadata.is_file() {
        return Err(format!(
            "not a regular file but a {}",
            describe_type(&metadata.file_type())
        ));
    }
    // Non-blocking, and checked again once open: what was opened, not what the name
    // held a moment before, must be a regular file of at most `max` bytes.
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    cap_std::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = dir
        .open_with(name, &options)
        .map_err(|err| format!("cannot open it: {err}"))?
        .into_std();
    let opened = file
        .metadata()
        .map_err(|err| format!("cannot read its metadata: {err}"))?;
    if !opened.is_file() {
        return Err("not a regular file once opened".into());
    }
    if opened.len() > max {
        return Err(format!("{} bytes, over the {max}-byte limit", opened.len()));
    }
    Ok(Some(file))
}

/// All of the open `file` from its start, which was `len` bytes long: a file that grew
/// since is read to one byte more, so its seal fails.
fn read_open(mut file: &std::fs::File, len: u64) -> std::io::Result<Vec<u8>> {
    file.rewind()?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(len + 1).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The sealed file `name`, read, if there is one: [`open_sealed`], then all of it.
fn read_sealed(dir: &Dir, name: &str, max: u64) -> Result<Option<Vec<u8>>, String> {
    let Some(file) = open_sealed(dir, name, max)? else {
        return Ok(None);
    };
    let len = stamp_of(&file)
        .map_err(|err| format!("cannot read it: {err}"))?
        .len;
    read_open(&file, len.min(max))
        .map(Some)
        .map_err(|err| format!("cannot read it: {err}"))
}

fn describe_type(file_type: &cap_std::fs::FileType) -> &'static str {
    if file_type.is_symlink() {
        "symlink"
    } else if file_type.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// SHA-256 of a [`Hash`] value, stable across processes and builds (unlike
/// `DefaultHasher`).
fn sha256_of_hash(value: impl Hash) -> [u8; 32] {
    let mut hasher = ShaHasher(Sha256::new());
    value.hash(&mut hasher);
    hasher.0.finalize().into()
}

/// Feeds [`Hash`] input into SHA-256.
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        unreachable!("only the SHA-256 state is read")
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}
