//! `file_write`: create or replace a file.

use std::fs;

use capstan_sdk::{Context, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::path::{io_error, workspace_path};

/// Arguments of `file_write`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The file, relative to the workspace root.
    path: String,
    /// The whole new content.
    content: String,
}

pub fn file_write(args: WriteArgs, _: &Context) -> Result<String, ToolError> {
    let path = workspace_path(&args.path)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| io_error(&args.path, e))?;
    }
    fs::write(&path, args.content.as_bytes()).map_err(|e| io_error(&args.path, e))?;
    Ok(format!(
        "wrote {} bytes to `{}`",
        args.content.len(),
        args.path
    ))
}
