//! `file_edit`: exact-string replacement.

use std::fs;

use capstan_sdk::{Context, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::path::{io_error, workspace_path};

/// Arguments of `file_edit`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// The file, relative to the workspace root.
    path: String,
    /// The exact text to replace, including whitespace.
    old: String,
    /// The replacement.
    new: String,
    /// Replace every occurrence instead of requiring exactly one. Default false.
    #[serde(default)]
    replace_all: bool,
}

pub fn file_edit(args: EditArgs, _: &Context) -> Result<String, ToolError> {
    if args.old.is_empty() {
        return Err(ToolError::invalid_args("`old` must not be empty"));
    }
    let path = workspace_path(&args.path)?;
    let text = fs::read_to_string(&path).map_err(|e| io_error(&args.path, e))?;
    let count = text.matches(args.old.as_str()).count();
    match count {
        0 => {
            return Err(ToolError::NotFound(format!(
                "`old` does not occur in `{}`; read the file and copy the text exactly",
                args.path
            )));
        }
        1 => {}
        n if !args.replace_all => {
            return Err(ToolError::invalid_args(format!(
                "`old` occurs {n} times in `{}`; include more surrounding text to make it \
                 unique, or set replace_all",
                args.path
            )));
        }
        _ => {}
    }
    let edited = text.replace(args.old.as_str(), &args.new);
    fs::write(&path, edited.as_bytes()).map_err(|e| io_error(&args.path, e))?;
    Ok(format!(
        "replaced {count} occurrence{} in `{}`",
        if count == 1 { "" } else { "s" },
        args.path
    ))
}
