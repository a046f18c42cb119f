//! The channels' files in the data dir (`DATA_DIR/channels/`): made owner-only, and each
//! written whole or not at all.

use std::io::Write;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;

/// `DATA_DIR/channels/` (or a directory below it, `sub`), made owner-only if missing; the
/// directory and its path.
pub(crate) fn channels_dir(data_dir: &Path, sub: Option<&str>) -> std::io::Result<(Dir, PathBuf)> {
    let mut path = data_dir.join("channels");
    if let Some(sub) = sub {
        path.push(sub);
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(&path)?;
    let dir = Dir::open_ambient_dir(&path, ambient_authority())?;
    Ok((dir, path))
}

/// Writes `bytes` to `name` in `dir` whole: to a new owner-only file of a random name,
/// synced, renamed over `name`, the directory synced. A crash leaves the old file or the
/// new one, never a part.
pub(crate) fn write_durably(dir: &Dir, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut random = [0u8; 8];
    getrandom::fill(&mut random).map_err(std::io::Error::other)?;
    let tmp = format!(".{name}.tmp-{}", crate::text::hex(&random));
    let mut options = cap_std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    cap_std::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = (|| {
        let mut file = dir.open_with(&tmp, &options)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        dir.rename(&tmp, dir, name)?;
        dir.open(".")?.sync_all()
    })();
    if written.is_err() {
        let _ = dir.remove_file(&tmp);
    }
    written
}
