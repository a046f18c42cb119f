//! What a tool may return.

use serde::Serialize;

/// A value a tool handler can return: text as is, or [`Json`] serialized.
pub trait IntoOutput {
    /// The text the host hands to the model.
    fn into_output(self) -> Result<String, crate::ToolError>;
}

impl IntoOutput for String {
    fn into_output(self) -> Result<String, crate::ToolError> {
        Ok(self)
    }
}

impl IntoOutput for &str {
    fn into_output(self) -> Result<String, crate::ToolError> {
        Ok(self.to_owned())
    }
}

/// Returns a serializable value as JSON text.
///
/// ```
/// use capstan_sdk::{IntoOutput, Json};
///
/// let out = Json(serde_json::json!({"count": 3})).into_output().unwrap();
/// assert_eq!(out, r#"{"count":3}"#);
/// ```
#[derive(Debug, Clone)]
pub struct Json<T>(pub T);

impl<T: Serialize> IntoOutput for Json<T> {
    fn into_output(self) -> Result<String, crate::ToolError> {
        Ok(serde_json::to_string(&self.0)?)
    }
}
