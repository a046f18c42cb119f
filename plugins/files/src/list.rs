//! `file_list`: the entries of one directory.

use std::fs;

use capstan_sdk::{Context, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::limits::MAX_LIST_ENTRIES;
use crate::path::{io_error, workspace_path};

/// Arguments of `file_list`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// The directory, relative to the workspace root. Default: the root.
    #[serde(default)]
    path: Option<String>,
}

pub fn file_list(args: ListArgs, _: &Context) -> Result<String, ToolError> {
    let raw = args.path.as_deref().unwrap_or(".");
    let dir = workspace_path(raw)?;
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| io_error(raw, e))? {
        let entry = entry.map_err(|e| io_error(raw, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let kind = entry.file_type().map_err(|e| io_error(raw, e))?;
        if kind.is_dir() {
            dirs.push(format!("{name}/"));
        } else if kind.is_symlink() {
            files.push(format!("{name} (symlink)"));
        } else {
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            files.push(format!("{name} ({size} bytes)"));
        }
    }
    dirs.sort();
    files.sort();
    let total = dirs.len() + files.len();
    let mut lines: Vec<String> = dirs
        .into_iter()
        .chain(files)
        .take(MAX_LIST_ENTRIES)
        .collect();
    if total == 0 {
        return Ok(format!("`{raw}` is empty"));
    }
    if total > MAX_LIST_ENTRIES {
        lines.push(format!(
            "[truncated: showing {MAX_LIST_ENTRIES} of {total} entries]"
        ));
    }
    Ok(lines.join("\n"))
}
