//! [`ExternalTools`]: tools that are not components, such as an MCP server's, routed by the
//! registry through the same policy, grants, deadline and audit as a plugin's.

use async_trait::async_trait;

use super::error::ToolError;

/// A source of tools outside the sandbox: an MCP server the host reaches. The registry
/// names its tools `SOURCE.tool`, decides and audits each call as it does a plugin's,
/// bounds it with the tool deadline, and redacts what it returns.
///
/// ```
/// use capstan_host::plugin::{ExternalTools, ToolError};
///
/// struct Clock;
///
/// #[async_trait::async_trait]
/// impl ExternalTools for Clock {
///     fn name(&self) -> &str {
///         "clock"
///     }
///     async fn call(&self, tool: &str, _args_json: &str) -> Result<String, ToolError> {
///         match tool {
///             "now" => Ok("12:00".into()),
///             other => Err(ToolError::NotFound(format!("no tool `{other}`"))),
///         }
///     }
/// }
/// ```
#[async_trait]
pub trait ExternalTools: Send + Sync {
    /// The source's name: its tools are `NAME.tool`.
    fn name(&self) -> &str;

    /// Where the source is reached, as `capstan.lock` pins it: a tool of a source that
    /// moved is not offered until the move is accepted.
    fn identity(&self) -> String {
        self.name().to_owned()
    }

    /// Runs `tool` (the source's own name for it, without the namespace) with the
    /// arguments, a JSON object, starting the source first if it is down. The registry
    /// stops waiting at the tool deadline.
    async fn call(&self, tool: &str, args_json: &str) -> Result<String, ToolError>;

    /// Called when a call ran past the tool deadline and was abandoned; says what became
    /// of it, for the error the caller gets. A source whose calls are served one at a
    /// time may restart here so later calls are not stuck.
    fn abandoned(&self, _tool: &str) -> String {
        "it was abandoned".to_owned()
    }
}
