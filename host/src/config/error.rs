//! [`ConfigError`]: what is wrong with a configuration, and where.

use std::fmt;

/// A configuration that cannot be used: the file, the key and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<defaults>`).
    pub file: String,
    /// The dotted key, when the problem is one key.
    pub key: Option<String>,
    /// Where the key is written in the file, as (line, column) from 1, when it is.
    pub position: Option<(usize, usize)>,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some((line, column)) = self.position {
            write!(f, ":{line}:{column}")?;
        }
        match &self.key {
            Some(key) => write!(f, ": `{key}`: {}", self.message),
            None => write!(f, ": {}", self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Where dotted `key` is written in `text`: as `leaf = ...` under its table's header
/// (`[limits]` then `max_turns = 0`), or as a dotted key (`limits.max_turns = 0`) before
/// any header. An index (`tools[2]`) points at the array's key. `None` when the file does
/// not spell it (the value came from the defaults).
pub(super) fn locate(text: &str, key: &str) -> Option<(usize, usize)> {
    let key = key.split('[').next().unwrap_or(key);
    let parts: Vec<&str> = key.split('.').collect();
    let lines: Vec<&str> = text.lines().collect();
    let assigns = |line: &str, leaf: &str| {
        let trimmed = line.trim_start();
        let rest = trimmed.strip_prefix(leaf)?;
        rest.trim_start()
            .starts_with('=')
            .then(|| line.len() - trimmed.len() + 1)
    };
    let is_header = |line: &str| line.trim_start().starts_with('[');
    for split in (0..parts.len()).rev() {
        let header = parts[..split].join(".");
        let leaf = parts[split..].join(".");
        let start = if split == 0 {
            Some(0)
        } else {
            lines
                .iter()
                .position(|line| line.trim() == format!("[{header}]"))
                .map(|at| at + 1)
        };
        let Some(start) = start else { continue };
        for (offset, line) in lines[start..].iter().enumerate() {
            if is_header(line) {
                break;
            }
            if let Some(column) = assigns(line, &leaf) {
                return Some((start + offset + 1, column));
            }
        }
    }
    None
}

/// A bad key of the config: its dotted name and what is wrong, before the file and the
/// position are known.
pub(super) type KeyError = (String, String);

/// A [`KeyError`] for `key`.
pub(super) fn key_error(key: &str, message: impl Into<String>) -> KeyError {
    (key.to_owned(), message.into())
}
