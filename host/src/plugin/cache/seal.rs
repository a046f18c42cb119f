//! Sealing artifacts: a keyed BLAKE3 tag under a random key the cache directory keeps
//! owner-only, so the host deserializes only artifacts it wrote itself.
//!
//! A sealed file is the artifact followed by its 32-byte tag. The tag covers the
//! component's digest, the engine fingerprint, the file name and the artifact, so an
//! artifact moved to another component's name, or one written by anyone without the key,
//! fails the check.

use std::io::{Read, Write};

use sha2::{Digest, Sha256};
use wasmtime::Engine;

use super::private_dir::{CacheError, PrivateDir, check_owner_only};
use super::{private_new_file, sha256_of_hash};
use crate::plugin::trust::ComponentDigest;
use crate::plugin::trust::hash_large;

/// The key file in the cache directory.
pub(super) const KEY_FILE: &str = "artifact-seal.key";

const KEY_BYTES: usize = 32;
pub(super) const TAG_BYTES: usize = 32;

/// Changes whenever the sealed format or the key derivation does, so old files are never
/// read as new ones.
const DOMAIN: &[u8] = b"capstan artifact v3\0";

/// What an artifact is the compilation of: a component's bytes on an engine.
pub(super) struct ArtifactId {
    component: [u8; 32],
    engine: [u8; 32],
}

impl ArtifactId {
    pub(super) fn new(engine: &Engine, component: &ComponentDigest) -> Self {
        ArtifactId {
            component: *component.as_bytes(),
            engine: sha256_of_hash(engine.precompile_compatibility_hash()),
        }
    }

    /// What the record of the plugin file with `inode` (device and inode) is filed
    /// under: [`Kind::Source`] entries have no component digest before they are read.
    pub(super) fn of_source(engine: &Engine, inode: [u8; 16]) -> Self {
        let mut subject = Sha256::new();
        subject.update(b"source file\0");
        subject.update(inode);
        ArtifactId {
            component: subject.finalize().into(),
            engine: sha256_of_hash(engine.precompile_compatibility_hash()),
        }
    }

    /// `<hex SHA-256 of the domain, component digest and engine fingerprint>.<kind's
    /// extension>`.
    pub(super) fn file_name(&self, kind: Kind) -> String {
        let mut key = Sha256::new();
        key.update(DOMAIN);
        key.update(self.component);
        key.update(self.engine);
        format!("{}.{}", crate::text::hex(&key.finalize()), kind.extension())
    }
}

/// What a sealed file holds. The kind's file name is under the seal, so one kind's file
/// never opens as another's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The precompiled component.
    Artifact,
    /// What the component's `describe()` returned, as JSON.
    Tools,
    /// A signature of the component this host verified, as JSON.
    Signature,
    /// The stamp of the artifact file when its seal was last checked, as JSON: while
    /// the file keeps it, the seal need not be checked again.
    Checked,
    /// A plugin file's stamp when it was last read, with its digest and outline, as
    /// JSON: while the file keeps it, it need not be read again.
    Source,
}

impl Kind {
    fn extension(self) -> &'static str {
        match self {
            Kind::Artifact => "cwasm",
            Kind::Tools => "tools.json",
            Kind::Signature => "signature.json",
            Kind::Checked => "checked.json",
            Kind::Source => "source.json",
        }
    }
}

/// The key artifacts are sealed with.
pub(super) struct SealKey([u8; KEY_BYTES]);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    /// The directory's key, created at random (exclusively, mode 0600) the first time. A
    /// key file that is not owner-only is refused; one of the wrong length is replaced
    /// (the artifacts sealed with it are then discarded one by one as they fail).
    pub(super) fn load_or_create(dir: &PrivateDir) -> Result<Self, CacheError> {
        let key_error = |reason: String| CacheError::Key {
            path: dir.path().join(KEY_FILE),
            reason,
        };
        // Two processes may race to create the key: the loser reads the winner's.
        for _ in 0..8 {
            match read_key(dir)? {
                KeyFile::Found(key) => return Ok(SealKey(key)),
                KeyFile::Damaged(reason) => {
                    tracing::warn!(
                        key = %dir.path().join(KEY_FILE).display(),
                        "the artifact key is damaged ({reason}); replacing it"
                    );
                    dir.handle()
                        .remove_file(KEY_FILE)
                        .map_err(|err| key_error(format!("cannot remove it: {err}")))?;
                }
                KeyFile::Missing => {}
            }
            if let Some(key) = create_key(dir).map_err(|err| key_error(err.to_string()))? {
                return Ok(SealKey(key));
            }
        }
        Err(key_error(
            "it keeps changing while being read; is another process replacing it?".into(),
        ))
    }

    /// The contents (of a `kind` file) followed by its tag.
    pub(super) fn seal(&self, id: &ArtifactId, kind: Kind, mut artifact: Vec<u8>) -> Vec<u8> {
        let tag = self.tag(id, kind, &artifact);
        artifact.extend_from_slice(&tag);
        artifact
    }

    /// The contents of the `kind` file `sealed` if its tag checks out for `id` (compared
    /// in constant time).
    pub(super) fn open<'a>(
        &self,
        id: &ArtifactId,
        kind: Kind,
        sealed: &'a [u8],
    ) -> Result<&'a [u8], &'static str> {
        let Some(split) = sealed.len().checked_sub(TAG_BYTES) else {
            return Err("shorter than its seal");
        };
        let (artifact, tag) = sealed.split_at(split);
        let expected = self.tag(id, kind, artifact);
        let difference = expected
            .iter()
            .zip(tag)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if difference != 0 {
            return Err(
                "its seal does not match: damaged, or not written by this host for this component",
            );
        }
        Ok(artifact)
    }

    /// BLAKE3 keyed with this key over the domain, the component digest, the engine
    /// fingerprint, the file name and the contents, each length-prefixed where its length
    /// varies.
    fn tag(&self, id: &ArtifactId, kind: Kind, artifact: &[u8]) -> [u8; TAG_BYTES] {
        let name = id.file_name(kind);
        let mut mac = blake3::Hasher::new_keyed(&self.0);
        mac.update(DOMAIN)
            .update(&id.component)
            .update(&id.engine)
            .update(&(name.len() as u64).to_le_bytes())
            .update(name.as_bytes())
            .update(&(artifact.len() as u64).to_le_bytes());
        hash_large(&mut mac, artifact);
        mac.finalize().into()
    }
}

enum KeyFile {
    Found([u8; KEY_BYTES]),
    Missing,
    Damaged(String),
}

fn read_key(dir: &PrivateDir) -> Result<KeyFile, CacheError> {
    let path = dir.path().join(KEY_FILE);
    let metadata = match dir.handle().symlink_metadata(KEY_FILE) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(KeyFile::Missing),
        Err(err) => {
            return Err(CacheError::Key {
                path,
                reason: format!("cannot read its metadata: {err}"),
            });
        }
    };
    if !metadata.is_file() {
        return Ok(KeyFile::Damaged("not a regular file".into()));
    }
    check_owner_only(&path, &metadata, 0o077, "600")?;
    let file = dir.handle().open(KEY_FILE).map_err(|err| CacheError::Key {
        path: path.clone(),
        reason: format!("cannot open it: {err}"),
    })?;
    let mut key = Vec::with_capacity(KEY_BYTES);
    file.take(KEY_BYTES as u64 + 1)
        .read_to_end(&mut key)
        .map_err(|err| CacheError::Key {
            path,
            reason: format!("cannot read it: {err}"),
        })?;
    Ok(match <[u8; KEY_BYTES]>::try_from(key.as_slice()) {
        Ok(key) => KeyFile::Found(key),
        Err(_) => KeyFile::Damaged(format!("{} bytes instead of {KEY_BYTES}", key.len())),
    })
}

/// Writes a fresh random key to a temporary file and links it into place; `None` when
/// another process linked its key first.
fn create_key(dir: &PrivateDir) -> std::io::Result<Option<[u8; KEY_BYTES]>> {
    let mut key = [0u8; KEY_BYTES];
    getrandom::fill(&mut key).map_err(std::io::Error::other)?;
    let handle = dir.handle();
    let tmp = format!(".tmp-key-{}", random_hex(16)?);
    let mut file = handle.open_with(&tmp, &private_new_file())?;
    let linked = file
        .write_all(&key)
        .and_then(|()| file.sync_all())
        .and_then(|()| handle.hard_link(&tmp, handle, KEY_FILE));
    let _ = handle.remove_file(&tmp);
    match linked {
        Ok(()) => Ok(Some(key)),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
        Err(err) => Err(err),
    }
}

/// `bytes` random bytes in hex, for names no one can guess.
pub(super) fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).map_err(std::io::Error::other)?;
    Ok(crate::text::hex(&buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(component: u8) -> ArtifactId {
        ArtifactId {
            component: [component; 32],
            engine: [7; 32],
        }
    }

    #[test]
    fn a_sealed_artifact_opens_only_for_its_own_id_and_key() {
        let key = SealKey([1; KEY_BYTES]);
        let sealed = key.seal(&id(1), Kind::Artifact, b"artifact".to_vec());
        assert_eq!(
            key.open(&id(1), Kind::Artifact, &sealed),
            Ok(&b"artifact"[..])
        );
        assert!(
            key.open(&id(1), Kind::Tools, &sealed).is_err(),
            "an artifact never opens as a tool list"
        );
        assert!(
            key.open(&id(2), Kind::Artifact, &sealed).is_err(),
            "another component's name"
        );
        assert!(
            SealKey([2; KEY_BYTES])
                .open(&id(1), Kind::Artifact, &sealed)
                .is_err()
        );
        let mut flipped = sealed.clone();
        flipped[3] ^= 1;
        assert!(key.open(&id(1), Kind::Artifact, &flipped).is_err());
        assert!(
            key.open(&id(1), Kind::Artifact, &sealed[..sealed.len() - 1])
                .is_err()
        );
        assert!(key.open(&id(1), Kind::Artifact, b"short").is_err());
    }
}
