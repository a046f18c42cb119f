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
    /// Where to start in line `offset`, in bytes from its start, to read on in a line
    /// longer than the output cap (the marker that cut it names the value). Default 0.
    #[serde(default)]
    byte_offset: Option<u64>,
}

pub fn file_read(args: ReadArgs, _: &Context) -> Result<String, ToolError> {
    let path = workspace_path(&args.path)?;
    let first = args.offset.unwrap_or(1).max(1);
    let limit = args.limit.unwrap_or(DEFAULT_READ_LINES);
    let byte_offset = args.byte_offset.unwrap_or(0);
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
    // A line longer than the cap, shown in part: its number, the bytes shown, its length.
    let mut part: Option<(u64, u64, u64, u64)> = None;
    loop {
        let wanted = number + 1 >= first && number + 1 < first.saturating_add(limit);
        let from = if number + 1 == first { byte_offset } else { 0 };
        if wanted && out.len() >= MAX_READ_BYTES {
            cut_by_bytes = true;
        }
        let room = if wanted && !cut_by_bytes {
            MAX_READ_BYTES - out.len()
        } else {
            0
        };
        let Some(length) = read_line(&mut reader, from, room + 1, &mut line)
            .map_err(|e| io_error(&args.path, e))?
        else {
            break;
        };
        number += 1;
        if room == 0 {
            continue;
        }
        if from > 0 && from >= length {
            return Err(ToolError::invalid_args(format!(
                "`byte_offset` {from} is past the end of line {number}, which is {length} bytes"
            )));
        }
        if line.len() <= room {
            out.push_str(&String::from_utf8_lossy(&line));
            last_shown = number;
            continue;
        }
        cut_by_bytes = true;
        if out.is_empty() {
            // The line alone is over the cap: a page of it, by bytes, ending on a character.
            let mut end = room;
            while end > 0 && line[end] & 0xC0 == 0x80 {
                end -= 1;
            }
            out.push_str(&String::from_utf8_lossy(&line[..end]));
            part = Some((number, from, from + end as u64, length));
        }
    }

    let total = number;
    if first > total && total > 0 {
        return Err(ToolError::invalid_args(format!(
            "`offset` {first} is past the end: `{}` has {total} lines",
            args.path
        )));
    }
    let cap = format!("the {} KiB output cap", MAX_READ_BYTES / 1024);
    if let Some((number, from, to, length)) = part {
        out.push_str(&format!(
            "\n[truncated by {cap}: line {number} of {total} is {length} bytes; showing its \
             bytes {from}-{to}; call file_read with offset={number} and byte_offset={to} to \
             continue]"
        ));
    } else if last_shown < total {
        if !out.ends_with('\n') && !out.is_empty() {
            out.push('\n');
        }
        let why = if cut_by_bytes {
            cap
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

/// Reads one line (through its `\n`), keeping in `kept` at most `keep` of its bytes from
/// byte `from` on, so a line of any length costs no more memory than that. The line's
/// length, or `None` at the end of the file.
fn read_line(
    reader: &mut impl BufRead,
    from: u64,
    keep: usize,
    kept: &mut Vec<u8>,
) -> std::io::Result<Option<u64>> {
    kept.clear();
    let mut length: u64 = 0;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok((length > 0).then_some(length));
        }
        let (chunk, done) = match buffer.iter().position(|b| *b == b'\n') {
            Some(at) => (&buffer[..=at], true),
            None => (buffer, false),
        };
        let start = from.saturating_sub(length).min(chunk.len() as u64) as usize;
        let room = keep - kept.len();
        let wanted = &chunk[start..];
        kept.extend_from_slice(&wanted[..wanted.len().min(room)]);
        length += chunk.len() as u64;
        let used = chunk.len();
        reader.consume(used);
        if done {
            return Ok(Some(length));
        }
    }
}
