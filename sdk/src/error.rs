//! The error a tool returns, and conversions from the errors a tool meets.

use std::fmt;

use crate::bindings::capstan::plugin::types::HostError;
use crate::bindings::exports::capstan::plugin::tool::ToolError as WitToolError;

/// Why a tool call did not produce a result. The host passes it to the model as is, so the
/// message should say what went wrong and how to do better.
///
/// `?` converts the usual failures: [`std::io::Error`] (permission errors become
/// [`ToolError::Denied`], missing files [`ToolError::NotFound`]), [`HostError`] from the
/// host's imports, and [`serde_json::Error`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The arguments are not valid for this tool.
    InvalidArgs(String),
    /// The sandbox or a scope check refused the operation.
    Denied(String),
    /// The tool, or the thing it was asked about, does not exist.
    NotFound(String),
    /// The tool ran and failed.
    Failed(String),
}

impl ToolError {
    /// A [`ToolError::InvalidArgs`] with `message`.
    pub fn invalid_args(message: impl Into<String>) -> Self {
        ToolError::InvalidArgs(message.into())
    }

    /// A [`ToolError::Failed`] with `message`.
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError::Failed(message.into())
    }

    /// Prefixes the message with `context`, keeping the kind.
    pub fn context(self, context: impl fmt::Display) -> Self {
        let wrap = |m: String| format!("{context}: {m}");
        match self {
            ToolError::InvalidArgs(m) => ToolError::InvalidArgs(wrap(m)),
            ToolError::Denied(m) => ToolError::Denied(wrap(m)),
            ToolError::NotFound(m) => ToolError::NotFound(wrap(m)),
            ToolError::Failed(m) => ToolError::Failed(wrap(m)),
        }
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolError::InvalidArgs(m) => write!(f, "invalid arguments: {m}"),
            ToolError::Denied(m) => write!(f, "denied: {m}"),
            ToolError::NotFound(m) => write!(f, "not found: {m}"),
            ToolError::Failed(m) => write!(f, "failed: {m}"),
        }
    }
}

impl std::error::Error for ToolError {}

impl From<std::io::Error> for ToolError {
    fn from(err: std::io::Error) -> Self {
        use std::io::ErrorKind;
        match err.kind() {
            ErrorKind::NotFound => ToolError::NotFound(err.to_string()),
            ErrorKind::PermissionDenied => ToolError::Denied(format!(
                "{err}: the sandbox refused it (the path leads outside the workspace, or this \
                 call's capabilities do not allow the operation)"
            )),
            _ => ToolError::Failed(err.to_string()),
        }
    }
}

impl From<HostError> for ToolError {
    fn from(err: HostError) -> Self {
        match err {
            HostError::Denied(m) => ToolError::Denied(m),
            HostError::NotFound(m) => ToolError::NotFound(m),
            HostError::Invalid(m) => ToolError::InvalidArgs(m),
            HostError::Failed(m) => ToolError::Failed(m),
        }
    }
}

impl From<serde_json::Error> for ToolError {
    fn from(err: serde_json::Error) -> Self {
        ToolError::Failed(format!("JSON: {err}"))
    }
}

impl From<ToolError> for WitToolError {
    fn from(err: ToolError) -> Self {
        match err {
            ToolError::InvalidArgs(m) => WitToolError::InvalidArgs(m),
            ToolError::Denied(m) => WitToolError::Denied(m),
            ToolError::NotFound(m) => WitToolError::NotFound(m),
            ToolError::Failed(m) => WitToolError::Failed(m),
        }
    }
}
