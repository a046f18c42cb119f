//! The cache directory: created owner-only, refused when anyone else owns or may write it,
//! and reached only through a directory handle.

use std::path::{Path, PathBuf};

use cap_std::fs::{Dir, Metadata};

/// Why the artifact cache cannot be used. Each names the path and what would fix it.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The directory could not be created or opened.
    #[error(
        "{}: cannot use it as the component cache: {source}; pass --cache-dir DIR (or set \
         CAPSTAN_CACHE_DIR) to use another directory, or --no-cache",
        path.display()
    )]
    Open {
        /// The cache directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Someone else owns the directory or the key file, and could make the host run
    /// their code.
    #[error(
        "{}: the component cache is owned by uid {owner}, not by this user (uid {user}), who \
         could make the host run code it did not compile; use a directory of your own \
         (--cache-dir DIR or CAPSTAN_CACHE_DIR), take it over with `chown {user} {}` and \
         `chmod {fix_mode} {}`, or pass --no-cache",
        path.display(),
        path.display(),
        path.display()
    )]
    NotOwned {
        /// The directory or file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The user running the host.
        user: u32,
        /// The mode that would fix it, e.g. `700`.
        fix_mode: &'static str,
    },
    /// The directory or the key file is writable (or, for the key, readable) by group or
    /// others, who could make the host run code it did not compile.
    #[error(
        "{}: the component cache has mode {mode:03o}, open to group or others, who could make \
         the host run code it did not compile; fix it with `chmod {fix_mode} {}`, use another \
         directory (--cache-dir DIR or CAPSTAN_CACHE_DIR), or pass --no-cache",
        path.display(),
        path.display()
    )]
    Shared {
        /// The directory or file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// The mode that would fix it, e.g. `700`.
        fix_mode: &'static str,
    },
    /// The key that seals artifacts cannot be read or created.
    #[error(
        "{}: the component cache's key: {reason}; remove the file, pass --cache-dir DIR, or \
         --no-cache",
        path.display()
    )]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// An opened cache directory that only the current user owns and may write.
#[derive(Debug)]
pub(super) struct PrivateDir {
    path: PathBuf,
    dir: Dir,
}

impl PrivateDir {
    /// Creates `path` (mode 0700) if needed, opens it and checks its owner and mode on the
    /// opened handle, so what is checked is what is used.
    pub(super) fn open(path: &Path) -> Result<Self, CacheError> {
        let open_error = |source| CacheError::Open {
            path: path.to_owned(),
            source,
        };
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(path).map_err(open_error)?;
        let dir = Dir::open_ambient_dir(path, cap_std::ambient_authority()).map_err(open_error)?;
        let metadata = dir.dir_metadata().map_err(open_error)?;
        check_owner_only(path, &metadata, 0o022, "700")?;
        Ok(PrivateDir {
            path: path.to_owned(),
            dir,
        })
    }

    /// The directory as given.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The handle every access goes through.
    pub(super) fn handle(&self) -> &Dir {
        &self.dir
    }
}

/// Refuses `metadata` unless the current user owns it and none of `forbidden` mode bits is
/// set.
#[cfg(unix)]
pub(super) fn check_owner_only(
    path: &Path,
    metadata: &Metadata,
    forbidden: u32,
    fix_mode: &'static str,
) -> Result<(), CacheError> {
    use cap_std::fs::MetadataExt;

    let user = rustix::process::geteuid().as_raw();
    if metadata.uid() != user {
        return Err(CacheError::NotOwned {
            path: path.to_owned(),
            owner: metadata.uid(),
            user,
            fix_mode,
        });
    }
    let mode = metadata.mode() & 0o7777;
    if mode & forbidden != 0 {
        return Err(CacheError::Shared {
            path: path.to_owned(),
            mode,
            fix_mode,
        });
    }
    Ok(())
}

/// Elsewhere the platform's own permissions apply.
#[cfg(not(unix))]
pub(super) fn check_owner_only(
    _path: &Path,
    _metadata: &Metadata,
    _forbidden: u32,
    _fix_mode: &'static str,
) -> Result<(), CacheError> {
    Ok(())
}
