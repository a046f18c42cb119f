//! `file_read`: a page of a text file.

use std::fs::File;
use std::io::{BufRead, BufReader};

use capstan_sdk::{Context, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::limits::{DEFAULT_READ_LINES, MAX_READ_BYTES, PAGE_BREAK_WINDOW};
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
    /// For a line `offset` longer than the output cap: which page of it to return,
    /// 1-based, as the marker that cut it names. Default 1.
    #[serde(default)]
    line_page: Option<u64>,
}

pub fn file_read(args: ReadArgs, _: &Context) -> Result<String, ToolError> {
    let path = workspace_path(&args.path)?;
    let first = args.offset.unwrap_or(1).max(1);
    let limit = args.limit.unwrap_or(DEFAULT_READ_LINES);
    let line_page = args.line_page.unwrap_or(1);
    if limit == 0 {
        return Err(ToolError::invalid_args("`limit` must be at least 1"));
    }
    if line_page == 0 {
        return Err(ToolError::invalid_args("`line_page` is 1-based"));
    }
    let file = File::open(&path).map_err(|e| io_error(&args.path, e))?;
    let mut reader = BufReader::new(file);

    let mut out = String::new();
    let mut number: u64 = 0;
    let mut last_shown: u64 = 0;
    let mut cut_by_bytes = false;
    // The first line, paged because it alone is over the cap: its pages, the one shown.
    let mut paged: Option<Paged> = None;
    loop {
        let next = number + 1;
        let wanted = next >= first && next < first.saturating_add(limit) && !cut_by_bytes;
        let page = if next == first { line_page } else { 1 };
        let Some(line) = read_line(&mut reader, wanted.then_some(page))
            .map_err(|e| io_error(&args.path, e))?
        else {
            break;
        };
        number = next;
        if !wanted {
            continue;
        }
        if number == first && line.pages > 1 {
            if page > line.pages {
                return Err(ToolError::invalid_args(format!(
                    "`line_page` {page} is past the end: line {number} has {} pages",
                    line.pages
                )));
            }
            out.push_str(within_cap(&String::from_utf8_lossy(&line.kept)));
            paged = Some(Paged {
                number,
                length: line.length,
                pages: line.pages,
                shown: page,
            });
            last_shown = number;
            // The rest of the line's pages are asked for one at a time.
            cut_by_bytes = page < line.pages;
            continue;
        }
        if number == first && page > 1 {
            return Err(ToolError::invalid_args(format!(
                "`line_page` is for a line longer than the {} KiB output cap; line {number} \
                 is {} bytes",
                MAX_READ_BYTES / 1024,
                line.length
            )));
        }
        // Measured as shown: each byte that is not UTF-8 shows as three.
        let text = String::from_utf8_lossy(&line.kept);
        if out.is_empty() && line.pages == 1 && text.len() > MAX_READ_BYTES {
            // Within the cap as bytes, over it as shown: not text, shown in part.
            out.push_str(within_cap(&text));
            out.push_str(&format!(
                "\n[line {number} is not UTF-8 text: shown up to the {} KiB output cap]\n",
                MAX_READ_BYTES / 1024
            ));
            last_shown = number;
            cut_by_bytes = true;
            continue;
        }
        if out.len() + text.len() > MAX_READ_BYTES || line.pages > 1 {
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
    let cap = format!("the {} KiB output cap", MAX_READ_BYTES / 1024);
    match paged {
        Some(line) if line.shown < line.pages => {
            out.push_str(&format!(
                "\n[truncated by {cap}: line {} of {total} is {} bytes, in {} pages; showing \
                 page {}; call file_read with offset={} and line_page={} to continue]",
                line.number,
                line.length,
                line.pages,
                line.shown,
                line.number,
                line.shown + 1
            ));
            return Ok(out);
        }
        _ => {}
    }
    if last_shown < total {
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

/// `text` cut to the output cap on a character: a page of a line that is not UTF-8 text
/// grows as it is shown (each byte that is not becomes a three-byte replacement).
fn within_cap(text: &str) -> &str {
    let mut end = text.len().min(MAX_READ_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A line shown in pages.
struct Paged {
    number: u64,
    length: u64,
    pages: u64,
    shown: u64,
}

/// One line as read: its length in bytes, how many pages it takes, and the bytes kept.
struct Line {
    length: u64,
    pages: u64,
    kept: Vec<u8>,
}

/// Whether a page may end after `byte`: a space or a delimiter, which a key or token
/// rarely holds, so a value is rarely cut in two by a page's end (a value cut in two is
/// redacted on neither page).
fn breaks_after(byte: u8) -> bool {
    byte.is_ascii_whitespace() || b",;\"'<>()[]{}".contains(&byte)
}

/// Reads one line (through its `\n`) in bounded memory, keeping page `keep` of it (all of
/// it when it fits the cap); `None` at the end of the file, and nothing kept when `keep`
/// is `None`.
///
/// A line longer than the cap is split into pages of at most [`MAX_READ_BYTES`]: each ends
/// after the last space or delimiter of its last [`PAGE_BREAK_WINDOW`] bytes, or else at
/// the cap, on a character's start. The pages follow from the line alone, so a caller
/// names one by its number and cannot start one anywhere else.
fn read_line(reader: &mut impl BufRead, keep: Option<u64>) -> std::io::Result<Option<Line>> {
    let mut length: u64 = 0;
    let mut page: u64 = 1;
    // The current page's bytes (only while it may be the one kept), and where in the line
    // it starts.
    let mut current: Vec<u8> = Vec::new();
    let mut page_start: u64 = 0;
    // Just after the last break byte of the current page, and the last character's start.
    let mut last_break: u64 = 0;
    let mut last_char: u64 = 0;
    let mut kept: Option<Vec<u8>> = None;
    let cap = MAX_READ_BYTES as u64;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            break;
        }
        let (chunk, done) = match buffer.iter().position(|b| *b == b'\n') {
            Some(at) => (&buffer[..=at], true),
            None => (buffer, false),
        };
        for &byte in chunk {
            let at = length;
            if at == page_start + cap {
                // The page is full: it ends after a break in its last bytes, or on the
                // start of the character this byte is part of.
                let end = if last_break > page_start + cap - PAGE_BREAK_WINDOW as u64 {
                    last_break
                } else if byte & 0xC0 == 0x80 && last_char > page_start {
                    last_char
                } else {
                    at
                };
                let split = (end - page_start) as usize;
                if keep == Some(page) {
                    current.truncate(split);
                    kept = Some(std::mem::take(&mut current));
                } else if keep > Some(page) {
                    current.drain(..split.min(current.len()));
                } else {
                    current.clear();
                }
                page += 1;
                page_start = end;
            }
            if keep >= Some(page) {
                current.push(byte);
            }
            if breaks_after(byte) {
                last_break = at + 1;
            }
            if byte & 0xC0 != 0x80 {
                last_char = at;
            }
            length += 1;
        }
        let used = chunk.len();
        reader.consume(used);
        if done {
            break;
        }
    }
    if length == 0 {
        return Ok(None);
    }
    if keep == Some(page) {
        kept = Some(current);
    }
    Ok(Some(Line {
        length,
        pages: page,
        kept: kept.unwrap_or_default(),
    }))
}
