//! The on-disk cache of precompiled components.
//!
//! Compiling a component takes tens of milliseconds; loading a precompiled artifact takes a
//! fraction of one. Artifacts are keyed by the SHA-256 of the component's bytes and of the
//! engine's compilation settings, so a changed plugin, a changed engine configuration or a
//! new wasmtime never loads a stale artifact.
//!
//! Loading an artifact runs native code produced from it, so the cache directory must be
//! writable only by the user running the host: it is created with mode 0700.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// How a component was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from a precompiled artifact.
    Hit,
    /// Compiled, and the artifact written for next time.
    Compiled,
    /// Compiled; no cache is configured or writing it failed (logged).
    Uncached,
}

impl CacheOutcome {
    /// A word for listings: `hit`, `compiled` or `uncached`.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "hit",
            CacheOutcome::Compiled => "compiled",
            CacheOutcome::Uncached => "uncached",
        }
    }
}

/// A directory of precompiled artifacts, or none.
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: Option<PathBuf>,
}

impl ArtifactCache {
    /// A cache in `dir`, created on first write.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ArtifactCache {
            dir: Some(dir.into()),
        }
    }

    /// No cache: every load compiles.
    pub fn disabled() -> Self {
        ArtifactCache { dir: None }
    }

    /// The directory, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The component for `bytes`: from the cache when a matching artifact exists, else
    /// compiled (and stored). A corrupt or foreign artifact is recompiled and replaced.
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, CacheOutcome)> {
        let Some(dir) = &self.dir else {
            return Ok((Component::new(engine, bytes)?, CacheOutcome::Uncached));
        };
        let path = dir.join(format!("{}.cwasm", cache_key(engine, bytes)));
        if path.is_file() {
            // SAFETY: the artifact was written by `Component::serialize` of an engine with
            // the same compilation settings (they are part of the key), into a directory
            // only this user can write; wasmtime checks its header and version again.
            match unsafe { Component::deserialize_file(engine, &path) } {
                Ok(component) => return Ok((component, CacheOutcome::Hit)),
                Err(err) => tracing::warn!(
                    artifact = %path.display(),
                    "cached artifact unusable, recompiling: {err}"
                ),
            }
        }
        let component = Component::new(engine, bytes)?;
        let outcome = match store_artifact(dir, &path, &component) {
            Ok(()) => CacheOutcome::Compiled,
            Err(err) => {
                tracing::warn!(cache = %dir.display(), "cannot write the component cache: {err}");
                CacheOutcome::Uncached
            }
        };
        Ok((component, outcome))
    }
}

/// Hex SHA-256 over the component bytes and the engine's compatibility hash.
fn cache_key(engine: &Engine, bytes: &[u8]) -> String {
    let mut hasher = ShaHasher(Sha256::new());
    hasher.0.update(bytes);
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let digest = hasher.0.finalize();
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Feeds [`Hash`] input into SHA-256, so the key is stable across processes and builds
/// (unlike `DefaultHasher`).
struct ShaHasher(Sha256);

impl Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        unreachable!("only the SHA-256 state is read")
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// Writes the artifact next to its final name and renames it, so a reader never sees a
/// half-written file.
fn store_artifact(dir: &Path, path: &Path, component: &Component) -> std::io::Result<()> {
    create_private_dir(dir)?;
    let bytes = component.serialize().map_err(std::io::Error::other)?;
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(&bytes)?;
    tmp.1.sync_all()?;
    std::fs::rename(&tmp.0, path)
}

fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let name = format!(
        ".tmp-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    );
    let path = dir.join(name.replace(['(', ')'], ""));
    let file = std::fs::File::create(&path)?;
    Ok((path, file))
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}
