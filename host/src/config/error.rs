//! [`ConfigError`]: what is wrong with a configuration, and where.

use std::fmt;

/// A configuration that cannot be used: the file, the key and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file (or `<defaults>`).
    pub file: String,
    /// The dotted key, when the problem is one key.
    pub key: Option<String>,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{}: `{key}`: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}
