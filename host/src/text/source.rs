//! Reading the text files a person writes (the config, scripts), with errors that point at
//! the line and column.

use std::path::{Path, PathBuf};

/// A text file that cannot be read as UTF-8 text.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not UTF-8.
    #[error(
        "{}: not valid UTF-8 at line {line}, column {column}; save it as UTF-8",
        path.display()
    )]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// The line of the first invalid byte, from 1.
        line: usize,
        /// Its column in bytes, from 1.
        column: usize,
    },
}

/// The contents of `path`, which must be UTF-8 text.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("capstan.toml");
/// std::fs::write(&path, b"name = \"ok\"\nbad = \"\xff\"\n")?;
/// let err = capstan_host::text::read_text(&path).unwrap_err();
/// assert!(err.to_string().ends_with("not valid UTF-8 at line 2, column 8; save it as UTF-8"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_text(path: &Path) -> Result<String, SourceError> {
    use std::io::Read;
    let read_error = |source| SourceError::Read {
        path: path.to_owned(),
        source,
    };
    // A config or script is small text; a device or endless file is cut off, not read
    // into memory without end.
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_TEXT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(read_error(std::io::Error::other(format!(
            "larger than {} MiB, the most a config or script may be",
            MAX_TEXT_BYTES >> 20
        ))));
    }
    String::from_utf8(bytes).map_err(|err| {
        let valid = err.utf8_error().valid_up_to();
        let (line, column) = line_and_column(err.as_bytes(), valid);
        SourceError::NotUtf8 {
            path: path.to_owned(),
            line,
            column,
        }
    })
}

/// The largest config or script file read.
const MAX_TEXT_BYTES: u64 = 16 << 20;

/// "not valid TOML at line L, column C: what is wrong", for an error parsing `text`.
///
/// ```
/// let text = "[agent]\nname = \n";
/// let err = toml::from_str::<toml::Table>(text).unwrap_err();
/// let message = capstan_host::text::toml_error_message(text, &err);
/// assert!(message.starts_with("not valid TOML at line 2, column "), "{message}");
/// ```
pub fn toml_error_message(text: &str, err: &toml::de::Error) -> String {
    let message = err.message().trim_end();
    match err.span() {
        Some(span) => {
            let (line, column) = line_and_column(text.as_bytes(), span.start);
            format!("not valid TOML at line {line}, column {column}: {message}")
        }
        None => format!("not valid TOML: {message}"),
    }
}

/// The 1-based line where dotted `key` (`profiles.worker.net`) is written in TOML `text`:
/// the line of its last part, in a table header or as a key. `None` if the text does not
/// parse or does not write it.
///
/// ```
/// let text = "[agent]\nname = \"x\"\n\n[profiles.worker]\ntools = []\nnet = []\n";
/// assert_eq!(capstan_host::text::toml_key_line(text, "profiles.worker.net"), Some(6));
/// assert_eq!(capstan_host::text::toml_key_line(text, "profiles.worker"), Some(4));
/// assert_eq!(capstan_host::text::toml_key_line(text, "profiles.channel.net"), None);
/// ```
pub fn toml_key_line(text: &str, key: &str) -> Option<usize> {
    let parsed = toml::de::DeTable::parse(text).ok()?;
    let mut table = parsed.get_ref();
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        let (name, value) = table.iter().find(|(name, _)| *name.get_ref() == part)?;
        if parts.peek().is_none() {
            return Some(line_and_column(text.as_bytes(), name.span().start).0);
        }
        match value.get_ref() {
            toml::de::DeValue::Table(inner) => table = inner,
            _ => return None,
        }
    }
    None
}

/// The 1-based line and column (in characters, or bytes past invalid UTF-8) of `offset`.
fn line_and_column(bytes: &[u8], offset: usize) -> (usize, usize) {
    let before = &bytes[..offset.min(bytes.len())];
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_lines_and_characters_from_one() {
        assert_eq!(line_and_column(b"abc", 0), (1, 1));
        assert_eq!(line_and_column(b"abc\nde", 5), (2, 2));
        assert_eq!(line_and_column("é\nxé!".as_bytes(), 6), (2, 3));
    }
}
