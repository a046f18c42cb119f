//! `file_read`: a page of a text file.

use std::fs::File;
use std::io::{BufRead, BufReader};

use capstan_sdk::{Context, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::limits::{DEFAULT_READ_LINES, MAX_READ_BYTES};
use crate::path::{io_error, workspace_path};

/// Arguments of `file_read`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The file, relative to the workspace root.
    path: String,
    /// The first line to return, 1-based. Default 1.
    #[serde(default)]
    offset: Option<u64>,
    /// How many lines to return at most. Default 2000.
    #[serde(default)]
    limit: Option<u64>,
}

pub fn file_read(args: ReadArgs, _: &Context) -> Result<String, ToolError> {
    let path = workspace_path(&args.path)?;
    let first = args.offset.unwrap_or(1).max(1);
    let limit = args.limit.unwrap_or(DEFAULT_READ_LINES);
    if limit == 0 {
        return Err(ToolError::invalid_args("`limit` must be at least 1"));
    }
    let file = File::open(&path).map_err(|e| io_error(&args.path, e))?;
    let mut reader = BufReader::new(file);

    let mut out = String::new();
    let mut line = Vec::new();
    let mut number: u64 = 0;
    let mut last_shown: u64 = 0;
    let mut cut_by_bytes = false;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| io_error(&args.path, e))?;
        if n == 0 {
            break;
        }
        number += 1;
        let wanted = number >= first && number < first.saturating_add(limit);
        if !wanted || cut_by_bytes {
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        if out.len() + text.len() > MAX_READ_BYTES {
            cut_by_bytes = true;
            continue;
        }
        out.push_str(&text);
        last_shown = number;
    }

    let total = number;
    if first > total && total > 0 {
        return Err(ToolError::invalid_args(format!(
            "`offset` {first} is past the end: `{}` has {total} lines",
            args.path
        )));
    }
    if last_shown < total {
        if !out.ends_with('\n') && !out.is_empty() {
            out.push('\n');
        }
        let why = if cut_by_bytes {
            format!("the {} KiB output cap", MAX_READ_BYTES / 1024)
        } else {
            "the line limit".to_owned()
        };
        out.push_str(&format!(
            "[truncated by {why}: showing lines {first}-{last_shown} of {total}; call file_read \
             with offset={} to continue]",
            last_shown + 1
        ));
    }
    Ok(out)
}
