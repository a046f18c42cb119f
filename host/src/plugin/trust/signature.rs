//! Signed components: a detached Ed25519 signature beside each component
//! (`NAME.wasm.sig`), verified in process and offline against the keys the config trusts
//! for that plugin.
//!
//! A signature signs a domain-separated statement of the component's BLAKE3 digest, so it
//! covers every byte of the file and nothing else: the file may be renamed, a flipped
//! byte fails. The format is this host's own, a few lines of JSON, rather than a Sigstore
//! bundle: verifying a bundle offline in Rust today means a crate that is not yet stable
//! and pulls a second cryptography library, where `ring`'s Ed25519 is already here.

use std::path::{Path, PathBuf};

use ring::signature::{ED25519, UnparsedPublicKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::digest::ComponentDigest;
use crate::services::HostKey;
use crate::text::{hex, unhex};

/// What the `format` field of a signature file says.
pub const SIGNATURE_FORMAT: &str = "capstan-component-signature/v1";

/// What is signed before the digest, so a component signature is never valid as anything
/// else this key signs (an audit row, say).
const STATEMENT: &[u8] = b"capstan component signature v1\0";

/// The most a signature file may hold: it is under 300 bytes.
const MAX_SIGNATURE_BYTES: u64 = 4096;

/// Where the signature of the component at `component` is: the same path with `.sig`
/// added (`files.wasm.sig`).
pub fn signature_path(component: &Path) -> PathBuf {
    let mut path = component.as_os_str().to_owned();
    path.push(".sig");
    PathBuf::from(path)
}

/// A detached signature file, as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureFile {
    /// [`SIGNATURE_FORMAT`].
    pub format: String,
    /// The digest of the component it signs.
    pub digest: ComponentDigest,
    /// The signer's public key, 64 hex digits.
    pub key: String,
    /// The Ed25519 signature, 128 hex digits.
    pub signature: String,
}

impl SignatureFile {
    /// The signature by `key` of the component whose digest is `digest`.
    ///
    /// ```
    /// use capstan_host::plugin::trust::{ComponentDigest, SignatureFile, Signer, Signers};
    /// use capstan_host::services::HostKey;
    ///
    /// let (_, key) = HostKey::generate().unwrap();
    /// let digest = ComponentDigest::of(b"the component's bytes");
    /// let file = SignatureFile::sign(&key, digest);
    /// let signers = Signers::required(vec![Signer::new("release", &key.public_hex(), ["*"]).unwrap()]);
    /// let bytes = file.to_json();
    /// assert_eq!(signers.check("files", digest, &bytes).unwrap().signer, "release");
    /// assert!(signers.check("files", ComponentDigest::of(b"other bytes"), &bytes).is_err());
    /// ```
    pub fn sign(key: &HostKey, digest: ComponentDigest) -> Self {
        SignatureFile {
            format: SIGNATURE_FORMAT.to_owned(),
            digest,
            key: key.public_hex(),
            signature: hex(&key.sign(&statement(&digest))),
        }
    }

    /// The file's bytes: pretty JSON and a newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a signature serializes");
        bytes.push(b'\n');
        bytes
    }
}

/// The statement a signature signs.
fn statement(digest: &ComponentDigest) -> Vec<u8> {
    [STATEMENT, digest.as_bytes()].concat()
}

/// A key the config trusts, and which plugins it may sign (`[plugins.signers.NAME]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The config's name for it.
    pub name: String,
    /// The public key, lowercase hex.
    pub public: String,
    /// The plugins (file names without `.wasm`) it may sign; `*` for any.
    pub plugins: Vec<String>,
}

impl Signer {
    /// The key `public` (64 hex digits) named `name`, trusted for `plugins`.
    pub fn new<P: Into<String>>(
        name: &str,
        public: &str,
        plugins: impl IntoIterator<Item = P>,
    ) -> Result<Self, String> {
        if unhex(public).is_none_or(|bytes| bytes.len() != 32) {
            return Err(format!(
                "`{public}` is not an Ed25519 public key (64 hex digits, as `capstan plugins \
                 keygen` prints)"
            ));
        }
        Ok(Signer {
            name: name.to_owned(),
            public: public.to_ascii_lowercase(),
            plugins: plugins.into_iter().map(Into::into).collect(),
        })
    }

    fn signs(&self, plugin: &str) -> bool {
        self.plugins.iter().any(|p| p == "*" || p == plugin)
    }
}

/// The keys the config trusts, and whether every plugin must be signed by one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signers {
    required: bool,
    keys: Vec<Signer>,
}

/// A signature that checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The config's name for the key that signed.
    pub signer: String,
    /// The SHA-256 of the signature file: what a cached verification is matched by.
    pub file_digest: [u8; 32],
}

/// Why a component's signature does not let it in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// There is no signature file.
    #[error("it is not signed (no {}); the config requires a signature (plugins.require_signatures): sign it with `capstan plugins sign FILE --key KEY`", file.display())]
    Missing {
        /// Where it was looked for.
        file: PathBuf,
    },
    /// The signature file cannot be read or is not one.
    #[error("its signature {} is unusable: {reason}", file.display())]
    Malformed {
        /// The signature file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// The signature is of other bytes: the component changed after it was signed, or the
    /// signature is another component's.
    #[error("its signature {} signs another component ({signed}) than this file ({actual}): the file changed after it was signed, or the signature is another file's", file.display())]
    OtherComponent {
        /// The signature file.
        file: PathBuf,
        /// The digest the signature names.
        signed: ComponentDigest,
        /// The file's digest.
        actual: ComponentDigest,
    },
    /// The key is not trusted for this plugin.
    #[error("its signature {} is by key {key}, which no [plugins.signers.NAME] entry trusts for plugin `{plugin}`{}", file.display(), trusted_for(others))]
    Untrusted {
        /// The signature file.
        file: PathBuf,
        /// The key that signed.
        key: String,
        /// The plugin.
        plugin: String,
        /// The signers that name this key but not this plugin.
        others: Vec<String>,
    },
    /// The signature does not verify.
    #[error("its signature {} does not verify for key {key} ({signer}): the signature or the component was tampered with", file.display())]
    Invalid {
        /// The signature file.
        file: PathBuf,
        /// The key it names.
        key: String,
        /// The config's name for it.
        signer: String,
    },
}

fn trusted_for(others: &[String]) -> String {
    if others.is_empty() {
        String::new()
    } else {
        format!(
            " (it is [plugins.signers.{}], which may sign only the plugins its `plugins` \
             lists)",
            others.join("], [plugins.signers.")
        )
    }
}

impl Signers {
    /// Every plugin must be signed by one of `keys`.
    pub fn required(keys: Vec<Signer>) -> Self {
        Signers {
            required: true,
            keys,
        }
    }

    /// `keys` are trusted, but an unsigned plugin loads.
    pub fn optional(keys: Vec<Signer>) -> Self {
        Signers {
            required: false,
            keys,
        }
    }

    /// Whether every plugin must be signed.
    pub fn are_required(&self) -> bool {
        self.required
    }

    /// The trusted keys.
    pub fn keys(&self) -> &[Signer] {
        &self.keys
    }

    /// A fingerprint of the trusted keys: a verification cached under other keys is not
    /// taken for one under these.
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut hash = Sha256::new();
        for key in &self.keys {
            hash.update(key.public.as_bytes());
            hash.update([0]);
        }
        hash.finalize().into()
    }

    /// Checks the signature file `bytes` of plugin `plugin` (whose digest is `digest`):
    /// its format, that it signs these bytes, that its key is trusted for the plugin, and
    /// that it verifies. The file is not named in the errors: see [`Signers::check_file`].
    pub fn check(
        &self,
        plugin: &str,
        digest: ComponentDigest,
        bytes: &[u8],
    ) -> Result<Verified, SignatureError> {
        self.check_at(Path::new("(signature)"), plugin, digest, bytes, |_| false)
    }

    /// Reads and checks the signature of the component at `component` (plugin `plugin`,
    /// digest `digest`). `cached` says whether a verification of a signature file with
    /// this SHA-256 is already known good: then no Ed25519 check runs.
    pub fn check_file(
        &self,
        component: &Path,
        plugin: &str,
        digest: ComponentDigest,
        cached: impl FnOnce(&[u8; 32]) -> bool,
    ) -> Result<Verified, SignatureError> {
        let file = signature_path(component);
        let bytes = read_signature(&file)?;
        self.check_at(&file, plugin, digest, &bytes, cached)
    }

    fn check_at(
        &self,
        file: &Path,
        plugin: &str,
        digest: ComponentDigest,
        bytes: &[u8],
        cached: impl FnOnce(&[u8; 32]) -> bool,
    ) -> Result<Verified, SignatureError> {
        let malformed = |reason: String| SignatureError::Malformed {
            file: file.to_owned(),
            reason,
        };
        let parsed: SignatureFile =
            serde_json::from_slice(bytes).map_err(|err| malformed(err.to_string()))?;
        if parsed.format != SIGNATURE_FORMAT {
            return Err(malformed(format!(
                "its format is `{}`, not `{SIGNATURE_FORMAT}`",
                parsed.format
            )));
        }
        if parsed.digest != digest {
            return Err(SignatureError::OtherComponent {
                file: file.to_owned(),
                signed: parsed.digest,
                actual: digest,
            });
        }
        let key = parsed.key.to_ascii_lowercase();
        let named: Vec<&Signer> = self.keys.iter().filter(|s| s.public == key).collect();
        let Some(signer) = named.iter().find(|s| s.signs(plugin)) else {
            return Err(SignatureError::Untrusted {
                file: file.to_owned(),
                key,
                plugin: plugin.to_owned(),
                others: named.iter().map(|s| s.name.clone()).collect(),
            });
        };
        let file_digest: [u8; 32] = Sha256::digest(bytes).into();
        let verified = Verified {
            signer: signer.name.clone(),
            file_digest,
        };
        if cached(&file_digest) {
            return Ok(verified);
        }
        let invalid = || SignatureError::Invalid {
            file: file.to_owned(),
            key: key.clone(),
            signer: signer.name.clone(),
        };
        let (Some(public), Some(signature)) = (unhex(&key), unhex(&parsed.signature)) else {
            return Err(invalid());
        };
        UnparsedPublicKey::new(&ED25519, public)
            .verify(&statement(&digest), &signature)
            .map_err(|_| invalid())?;
        Ok(verified)
    }
}

/// The signature file's bytes, read without blocking on a FIFO and capped.
fn read_signature(file: &Path) -> Result<Vec<u8>, SignatureError> {
    use std::io::Read as _;
    let malformed = |reason: String| SignatureError::Malformed {
        file: file.to_owned(),
        reason,
    };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let opened = match options.open(file) {
        Ok(opened) => opened,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(file).is_ok() {
                return Err(malformed("is a symbolic link to nothing".into()));
            }
            return Err(SignatureError::Missing {
                file: file.to_owned(),
            });
        }
        Err(err) => return Err(malformed(format!("cannot be read ({err})"))),
    };
    let is_file = opened.metadata().map(|m| m.is_file()).unwrap_or(false);
    if !is_file {
        return Err(malformed("is not a regular file".into()));
    }
    let mut bytes = Vec::new();
    opened
        .take(MAX_SIGNATURE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| malformed(format!("cannot be read ({err})")))?;
    if bytes.len() as u64 > MAX_SIGNATURE_BYTES {
        return Err(malformed(format!(
            "it is over {MAX_SIGNATURE_BYTES} bytes; a signature is under 300"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(name: &str, key: &HostKey, plugins: &[&str]) -> Signer {
        Signer::new(name, &key.public_hex(), plugins.iter().copied()).unwrap()
    }

    #[test]
    fn only_a_trusted_key_for_the_plugin_over_these_bytes_verifies() {
        let (_, release) = HostKey::generate().unwrap();
        let (_, stranger) = HostKey::generate().unwrap();
        let digest = ComponentDigest::of(b"files");
        let signers = Signers::required(vec![
            signer("release", &release, &["*"]),
            signer("stranger", &stranger, &["weather"]),
        ]);
        let good = SignatureFile::sign(&release, digest).to_json();
        assert_eq!(
            signers.check("files", digest, &good).unwrap().signer,
            "release"
        );

        let by_stranger = SignatureFile::sign(&stranger, digest).to_json();
        let err = signers.check("files", digest, &by_stranger).unwrap_err();
        assert!(matches!(err, SignatureError::Untrusted { .. }), "{err}");
        assert!(
            err.to_string().contains("[plugins.signers.stranger]"),
            "{err}"
        );
        assert!(err.to_string().contains(&stranger.public_hex()), "{err}");

        let other = signers.check("files", ComponentDigest::of(b"filez"), &good);
        assert!(matches!(other, Err(SignatureError::OtherComponent { .. })));

        // The digest field rewritten to match: the signature no longer verifies.
        let mut forged = SignatureFile::sign(&release, ComponentDigest::of(b"old"));
        forged.digest = digest;
        let err = signers
            .check("files", digest, &forged.to_json())
            .unwrap_err();
        assert!(matches!(err, SignatureError::Invalid { .. }), "{err}");

        let err = signers.check("files", digest, b"{}").unwrap_err();
        assert!(matches!(err, SignatureError::Malformed { .. }), "{err}");
    }

    #[test]
    fn a_cached_verification_skips_only_the_ed25519_check() {
        let (_, release) = HostKey::generate().unwrap();
        let digest = ComponentDigest::of(b"files");
        let signers = Signers::required(vec![signer("release", &release, &["*"])]);
        let mut forged = SignatureFile::sign(&release, digest);
        forged.signature = "00".repeat(64);
        let bytes = forged.to_json();
        assert!(
            signers
                .check_at(Path::new("f"), "files", digest, &bytes, |_| false)
                .is_err()
        );
        // A cache that vouches for these very bytes is believed (it is sealed by this
        // host); the trust check still runs.
        assert!(
            signers
                .check_at(Path::new("f"), "files", digest, &bytes, |_| true)
                .is_ok()
        );
        let none = Signers::required(vec![]);
        assert!(
            none.check_at(Path::new("f"), "files", digest, &bytes, |_| true)
                .is_err()
        );
    }
}
