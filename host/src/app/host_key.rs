//! The host's signing key: `host.key` in the data dir, made on first use, owner-only. It
//! signs the audit chain; `capstan audit key` prints its public half, to pin on the
//! machine that verifies.

use std::io::{ErrorKind, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::services::{HostKey, ServiceError};

/// The key file's name in the data dir.
pub const HOST_KEY_FILE: &str = "host.key";

/// The most a key file may hold: PKCS#8 Ed25519 is 83 bytes.
const MAX_KEY_BYTES: u64 = 4096;

/// The key in `data_dir`'s [`HOST_KEY_FILE`], made (owner-only) if there is none. Two
/// hosts starting at once make one key between them: the file is created whole or not at
/// all, and the loser reads the winner's.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let first = capstan_host::app::host_key(dir.path()).unwrap();
/// let again = capstan_host::app::host_key(dir.path()).unwrap();
/// assert_eq!(first.public_hex(), again.public_hex());
/// ```
pub fn host_key(data_dir: &Path) -> Result<HostKey, ServiceError> {
    let path = data_dir.join(HOST_KEY_FILE);
    match read(&path)? {
        Some(key) => Ok(key),
        None => create(data_dir, &path),
    }
}

fn read(path: &Path) -> Result<Option<HostKey>, ServiceError> {
    let bad = |why: String| {
        ServiceError::Invalid(format!(
            "{}: {why}; move it away to have a new key made (the audit chain's older rows \
             then verify only with `capstan audit verify --trust OLD_PUBLIC_KEY`)",
            path.display()
        ))
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(bad(format!("cannot be read ({err})"))),
    };
    if !meta.is_file() {
        return Err(bad("is not a regular file".into()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "is readable by others (mode {:o}): `chmod 600` it if it is yours",
            meta.mode() & 0o777
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_KEY_BYTES).read_to_end(&mut bytes))
        .map_err(|err| bad(format!("cannot be read ({err})")))?;
    HostKey::from_pkcs8(&bytes)
        .map(Some)
        .map_err(|err| bad(err.to_string()))
}

fn create(data_dir: &Path, path: &PathBuf) -> Result<HostKey, ServiceError> {
    let failed = |err: std::io::Error| {
        ServiceError::Invalid(format!(
            "{}: the host key cannot be made ({err})",
            path.display()
        ))
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .map_err(failed)?;
    let (pkcs8, key) = HostKey::generate()?;
    // Written to a file of its own, then linked into place: the key file, once there, is
    // whole. A host that lost the race reads the one that is there.
    let staged = data_dir.join(format!(".{HOST_KEY_FILE}.{}", std::process::id()));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&staged)
        .map_err(failed)?;
    let written = file.write_all(&pkcs8).and_then(|()| file.sync_all());
    let linked = written.and_then(|()| std::fs::hard_link(&staged, path));
    let _ = std::fs::remove_file(&staged);
    match linked {
        Ok(()) => Ok(key),
        Err(err) if err.kind() == ErrorKind::AlreadyExists => {
            read(path)?.ok_or_else(|| failed(err))
        }
        Err(err) => Err(failed(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_readable_by_others_or_damaged_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let key = host_key(dir.path()).unwrap();
        let path = dir.path().join(HOST_KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(host_key(dir.path()).unwrap().public_hex(), key.public_hex());

        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let err = host_key(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("host.key") && err.contains("chmod 600"),
            "{err}"
        );

        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        std::fs::write(&path, b"not a key").unwrap();
        let err = host_key(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not an Ed25519 PKCS#8 key"), "{err}");
    }
}
