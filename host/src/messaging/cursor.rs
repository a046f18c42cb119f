//! Where each channel's polls start: the adapter's cursor, kept in the data dir once every
//! message before it is stored.

use std::path::{Path, PathBuf};

use cap_std::fs::Dir;

use super::files::{channels_dir, write_durably};

/// The most a cursor may hold: an adapter's cursor is an offset or a token.
pub(crate) const MAX_CURSOR_BYTES: usize = 4096;

/// One channel's cursor file, `<data_dir>/channels/<NAME>.cursor`, owner-only.
pub(crate) struct Cursor {
    dir: Dir,
    path: PathBuf,
    name: String,
}

impl Cursor {
    /// The cursor of channel `channel` under `data_dir`, its directory made if missing.
    pub(crate) fn open(data_dir: &Path, channel: &str) -> std::io::Result<Self> {
        let (dir, path) = channels_dir(data_dir, None)?;
        let name = format!("{channel}.cursor");
        Ok(Cursor {
            path: path.join(&name),
            dir,
            name,
        })
    }

    /// The file, for errors.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The cursor kept, if any. A file that is not a cursor (too long, not UTF-8) is an
    /// error naming it: polls never start from a guess.
    pub(crate) fn load(&self) -> std::io::Result<Option<String>> {
        let bytes = match self.dir.read(&self.name) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        if bytes.len() > MAX_CURSOR_BYTES {
            return Err(std::io::Error::other(format!(
                "holds {} bytes, more than the {MAX_CURSOR_BYTES} a cursor may; remove it to \
                 start from what the platform keeps",
                bytes.len()
            )));
        }
        String::from_utf8(bytes).map(Some).map_err(|_| {
            std::io::Error::other("is not UTF-8; remove it to start from what the platform keeps")
        })
    }

    /// Keeps `cursor`, written whole.
    pub(crate) fn store(&self, cursor: &str) -> std::io::Result<()> {
        if cursor.len() > MAX_CURSOR_BYTES {
            return Err(std::io::Error::other(format!(
                "the adapter's cursor has {} bytes, more than the {MAX_CURSOR_BYTES} kept",
                cursor.len()
            )));
        }
        write_durably(&self.dir, &self.name, cursor.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_kept_and_read_back_and_a_damaged_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let cursor = Cursor::open(dir.path(), "tg").unwrap();
        assert_eq!(cursor.load().unwrap(), None);
        cursor.store("42").unwrap();
        assert_eq!(cursor.load().unwrap().as_deref(), Some("42"));
        cursor.store("43").unwrap();
        assert_eq!(cursor.load().unwrap().as_deref(), Some("43"));
        std::fs::write(cursor.path(), vec![b'x'; MAX_CURSOR_BYTES + 1]).unwrap();
        assert!(cursor.load().unwrap_err().to_string().contains("remove it"));
        assert!(cursor.store(&"y".repeat(MAX_CURSOR_BYTES + 1)).is_err());
    }
}
