//! Small text helpers shared across the host, and reading the text files a person writes
//! ([`read_text`]).

mod canonical_json;
mod hex;
mod serde_text;
mod source;

pub use canonical_json::write_canonical_json;
pub use hex::{hex, unhex};
pub(crate) use serde_text::serde_as_text;
pub use source::{SourceError, read_text, toml_error_message, toml_key_line};

/// The longest prefix of `text` within `max` bytes, ending on a character boundary.
///
/// ```
/// assert_eq!(capstan_host::text::truncate("héllo", 2), "h");
/// assert_eq!(capstan_host::text::truncate("hi", 10), "hi");
/// ```
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` on one line with every control character visible: `\n`, `\r` and `\t` as those
/// escapes, any other control character (ANSI escape sequences start with one), line and
/// paragraph separators and bidirectional overrides as `\u{..}`.
///
/// Guest text (log lines, captured stdout and stderr, error messages) goes through this
/// before it reaches a log or a terminal, so a plugin cannot forge a log line, move the
/// cursor or recolour the screen.
///
/// ```
/// use capstan_host::text::one_line;
///
/// assert_eq!(one_line("ok\nERROR forged"), r"ok\nERROR forged");
/// assert_eq!(one_line("\u{1b}[31mred"), r"\u{1b}[31mred");
/// assert_eq!(one_line("plain"), "plain");
/// ```
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` fit for a terminal as several lines: like [`one_line`], but line breaks and tabs
/// stay, so a reply keeps its shape while escape sequences and carriage returns cannot
/// move the cursor, recolour the screen or overwrite what was printed.
///
/// ```
/// use capstan_host::text::printable;
///
/// assert_eq!(printable("two\nlines"), "two\nlines");
/// assert_eq!(printable("\u{1b}]0;PWNED\u{7}"), r"\u{1b}]0;PWNED\u{7}");
/// ```
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let keep = |c: char| c == '\n' || c == '\t';
    if !text.chars().any(|c| needs_escape(c) && !keep(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            c if keep(c) => out.push(c),
            '\r' => out.push_str("\\r"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether `c` must not reach a log line or a terminal as it is.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The longest tool name an error echoes back (with [`echo_name`]): longer ones are cut
/// with a marker, so a caller cannot make the host repeat a megabyte of its own text.
pub const MAX_ECHOED_NAME: usize = 64;

/// A name from a guest or a user, fit to echo in a message: on one line (see [`one_line`])
/// and cut to `max` bytes with a marker saying how long it was.
///
/// ```
/// use capstan_host::text::echo_name;
///
/// assert_eq!(echo_name("file_read", 64), "file_read");
/// assert_eq!(echo_name(&"x".repeat(100), 8), "xxxxxxxx…(100 bytes)");
/// assert_eq!(echo_name("a\nb", 64), r"a\nb");
/// ```
pub fn echo_name(name: &str, max: usize) -> String {
    let shown = one_line(truncate(name, max));
    if name.len() <= max {
        shown.into_owned()
    } else {
        format!("{shown}…({} bytes)", name.len())
    }
}

/// Whether `name` is a plain identifier of at most `max` bytes: a lowercase ASCII letter,
/// then lowercase letters, digits and `_`. Tool names, MCP server names and plugin names
/// follow this rule, so they read the same in a config, a schema and a shell.
///
/// ```
/// use capstan_host::text::is_plain_name;
///
/// assert!(is_plain_name("file_read", 64));
/// assert!(!is_plain_name("File-Read", 64));
/// assert!(!is_plain_name("9lives", 64));
/// assert!(!is_plain_name("", 64));
/// assert!(!is_plain_name("abc", 2));
/// ```
pub fn is_plain_name(name: &str, max: usize) -> bool {
    (1..=max).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}
