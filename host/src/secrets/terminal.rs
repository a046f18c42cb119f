//! The process's standard output and standard error, as the CLI writes them: only through
//! [`stdout`] and [`stderr`], which redact every line of every value the process hides
//! in its log ([`Redactor::hide_in_logs`](super::Redactor::hide_in_logs)).
//!
//! The crate's `clippy.toml` disallows `std::io::stdout`, `std::io::stderr` and the
//! `print!` macros everywhere else, so a command that writes to the terminal another way
//! fails the lint.

#![allow(clippy::disallowed_methods)]

use std::io::{IsTerminal, Write};

use super::outbound::for_logs_bytes;

/// Writes one line to standard error, redacted: `eprintln!` through [`stderr`]. A line
/// that cannot be written is dropped, as `eprintln!` would panic instead.
///
/// ```
/// capstan_host::say!("warning: {} was skipped", "notes.txt");
/// ```
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!($crate::secrets::stderr(), $($arg)*);
    }};
}

/// Standard output, written a line at a time, each line redacted.
///
/// ```
/// use std::io::Write;
///
/// let mut out = capstan_host::secrets::stdout();
/// writeln!(out, "a line")?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn stdout() -> Terminal<std::io::Stdout> {
    let out = std::io::stdout();
    Terminal::new(out.is_terminal(), out)
}

/// Standard error, written a line at a time, each line redacted: the CLI's, and the log's
/// writer (`tracing_subscriber::fmt().with_writer(capstan_host::secrets::stderr)`).
pub fn stderr() -> Terminal<std::io::Stderr> {
    let err = std::io::stderr();
    Terminal::new(err.is_terminal(), err)
}

/// A standard stream written only through the log's redactor (see [`stdout`]). It holds
/// a line until its end: no value holds a line break, so a line is redacted whole however
/// it was written. A flush, or dropping it, passes on the rest.
#[derive(Debug)]
pub struct Terminal<W: Write> {
    inner: W,
    is_terminal: bool,
    /// Bytes of the line not yet ended.
    line: Vec<u8>,
}

impl<W: Write> Terminal<W> {
    fn new(is_terminal: bool, inner: W) -> Self {
        Terminal {
            inner,
            is_terminal,
            line: Vec::new(),
        }
    }

    /// Whether the stream is a terminal (a person reads it) rather than a pipe or a file.
    pub fn is_terminal(&self) -> bool {
        self.is_terminal
    }

    fn pass_on(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.inner.write_all(for_logs_bytes(bytes).as_bytes())
    }
}

impl<W: Write> Write for Terminal<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        if let Some(end) = self.line.iter().rposition(|&b| b == b'\n') {
            let lines: Vec<u8> = self.line.drain(..=end).collect();
            self.pass_on(&lines)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let rest = std::mem::take(&mut self.line);
        if !rest.is_empty() {
            self.pass_on(&rest)?;
        }
        self.inner.flush()
    }
}

impl<W: Write> Drop for Terminal<W> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::secrets::Redactor;

    #[test]
    fn a_value_written_in_pieces_is_redacted_whole_on_its_line() {
        Redactor::new([(
            "TERM_KEY".parse().unwrap(),
            Arc::from("sk-term-0123456789ab"),
        )])
        .hide_in_logs();
        let mut seen = Vec::new();
        {
            let mut out = Terminal::new(false, &mut seen);
            write!(out, "the key: sk-term-01").unwrap();
            write!(out, "23456789ab, and more\nnext: sk-term-0123").unwrap();
            write!(out, "456789ab").unwrap();
            // Dropped: the unended line passes on too.
        }
        assert_eq!(
            String::from_utf8(seen).unwrap(),
            "the key: [redacted secret TERM_KEY], and more\nnext: [redacted secret TERM_KEY]"
        );
    }
}
