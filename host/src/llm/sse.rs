//! A Server-Sent Events parser (the WHATWG `text/event-stream` format), fed bytes as
//! they arrive.
//!
//! SSE is small enough that a parser of our own costs less than a dependency and lets us
//! bound what it buffers: lines end in LF, CRLF or CR (possibly split across reads); a
//! blank line ends an event; `data:` lines join with `\n`; a line starting with `:` is a
//! comment (servers send them as keep-alives); one space after the colon is dropped; a
//! leading byte-order mark is skipped; `id` and `retry` are ignored (no reconnection).

/// One thing the stream said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SseItem {
    /// An event with data.
    Event {
        /// Its `event:` type, `message` when unset.
        kind: String,
        /// Its `data:` lines, joined with `\n`.
        data: String,
    },
    /// A comment line (`: keep-alive`).
    Comment,
}

/// An event larger than the parser may buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("one event of the stream is over {limit} bytes")]
pub(crate) struct EventTooLarge {
    /// The most an event may hold.
    pub(crate) limit: usize,
}

/// Parses an event stream incrementally; buffers at most one event of `limit` bytes.
#[derive(Debug)]
pub(crate) struct SseParser {
    limit: usize,
    /// The current line so far (bytes: a read may end inside a UTF-8 character).
    line: Vec<u8>,
    data: String,
    /// Whether any `data:` line was seen in the current event (data may be empty).
    has_data: bool,
    kind: String,
    /// The last byte was a CR, so an LF first in the next read ends no new line.
    after_cr: bool,
    /// Still at the very start of the stream, where a byte-order mark is skipped.
    at_start: bool,
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseParser {
    /// A parser that refuses an event (its lines and data together) over `limit` bytes.
    pub(crate) fn new(limit: usize) -> Self {
        SseParser {
            limit,
            line: Vec::new(),
            data: String::new(),
            has_data: false,
            kind: String::new(),
            after_cr: false,
            at_start: true,
        }
    }

    /// Takes the next bytes of the stream; returns what they completed, in order.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) -> Result<Vec<SseItem>, EventTooLarge> {
        let items = Vec::new();
        if self.at_start {
            // The mark may itself be split across reads: hold back a prefix of it.
            self.line.extend_from_slice(bytes);
            if self.line.len() < BOM.len() && BOM.starts_with(&self.line) {
                return Ok(items);
            }
            self.at_start = false;
            let held = std::mem::take(&mut self.line);
            let rest = held.strip_prefix(BOM).unwrap_or(&held);
            return self.feed_lines(rest, items);
        }
        if bytes.is_empty() {
            return Ok(items);
        }
        if self.after_cr && bytes.first() == Some(&b'\n') {
            bytes = &bytes[1..];
        }
        self.after_cr = false;
        self.feed_lines(bytes, items)
    }

    fn feed_lines(
        &mut self,
        mut bytes: &[u8],
        mut items: Vec<SseItem>,
    ) -> Result<Vec<SseItem>, EventTooLarge> {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n' || *b == b'\r') {
            self.take(&bytes[..end])?;
            let cr = bytes[end] == b'\r';
            bytes = &bytes[end + 1..];
            if cr {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            let line = std::mem::take(&mut self.line);
            if let Some(item) = self.line_done(&String::from_utf8_lossy(&line)) {
                items.push(item);
            }
        }
        self.take(bytes)?;
        Ok(items)
    }

    fn take(&mut self, bytes: &[u8]) -> Result<(), EventTooLarge> {
        if self.line.len() + self.data.len() + bytes.len() > self.limit {
            return Err(EventTooLarge { limit: self.limit });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// Interprets one whole line.
    fn line_done(&mut self, line: &str) -> Option<SseItem> {
        if line.is_empty() {
            let kind = std::mem::take(&mut self.kind);
            let data = std::mem::take(&mut self.data);
            if !std::mem::take(&mut self.has_data) {
                return None;
            }
            let kind = if kind.is_empty() {
                "message".to_owned()
            } else {
                kind
            };
            return Some(SseItem::Event { kind, data });
        }
        if line.starts_with(':') {
            return Some(SseItem::Comment);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => value.clone_into(&mut self.kind),
            // `id` and `retry` serve reconnection, which a completion never does; unknown
            // fields are ignored, as the format says.
            _ => {}
        }
        None
    }

    /// The end of the stream: an event whose lines were complete but whose blank line
    /// never came. The format says to drop it; a `data: [DONE]` line a server sends last
    /// without the blank line is still worth reading, and anything partial fails to parse
    /// later anyway.
    pub(crate) fn finish(mut self) -> Option<SseItem> {
        if !self.line.is_empty() {
            return None;
        }
        self.line_done("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: &str) -> SseItem {
        SseItem::Event {
            kind: "message".into(),
            data: data.into(),
        }
    }

    /// Feeds `stream` in pieces of `size` bytes.
    fn parse_in_pieces(stream: &[u8], size: usize) -> Vec<SseItem> {
        let mut parser = SseParser::new(1 << 20);
        let mut items = Vec::new();
        for piece in stream.chunks(size) {
            items.extend(parser.feed(piece).unwrap());
        }
        items.extend(parser.finish());
        items
    }

    #[test]
    fn events_comments_and_multiline_data_parse_whatever_the_read_boundaries() {
        let stream = "\u{FEFF}: keep-alive\n\ndata: {\"a\":1}\n\nevent: error\ndata:one\ndata:  two\nid: 7\nretry: 10\n\ndata: é€😀\n\ndata: [DONE]\n\n";
        let expected = vec![
            SseItem::Comment,
            event("{\"a\":1}"),
            SseItem::Event {
                kind: "error".into(),
                data: "one\n two".into(),
            },
            event("é€😀"),
            event("[DONE]"),
        ];
        for size in 1..=stream.len() {
            assert_eq!(
                parse_in_pieces(stream.as_bytes(), size),
                expected,
                "pieces of {size} bytes"
            );
        }
    }

    #[test]
    fn crlf_cr_and_lf_all_end_lines_even_split_between_reads() {
        for ending in ["\n", "\r\n", "\r"] {
            let stream = format!("data: a{ending}data: b{ending}{ending}data: c{ending}{ending}");
            for size in 1..=stream.len() {
                assert_eq!(
                    parse_in_pieces(stream.as_bytes(), size),
                    [event("a\nb"), event("c")],
                    "ending {ending:?}, pieces of {size}"
                );
            }
        }
    }

    #[test]
    fn an_event_without_data_is_no_event_and_empty_data_is_one() {
        assert_eq!(parse_in_pieces(b"event: x\nid: 1\n\n", 3), []);
        assert_eq!(parse_in_pieces(b"data\n\n", 3), [event("")]);
        assert_eq!(parse_in_pieces(b"data:\n\n", 3), [event("")]);
    }

    #[test]
    fn a_last_complete_line_without_its_blank_line_is_read_and_a_partial_one_is_not() {
        assert_eq!(parse_in_pieces(b"data: [DONE]\n", 4), [event("[DONE]")]);
        assert_eq!(parse_in_pieces(b"data: [DO", 4), []);
    }

    #[test]
    fn an_event_over_the_limit_is_refused_before_it_is_buffered() {
        let mut parser = SseParser::new(16);
        assert_eq!(parser.feed(b"data: short\n\n").unwrap(), [event("short")]);
        let err = parser.feed(b"data: 0123456789a").unwrap_err();
        assert_eq!(err, EventTooLarge { limit: 16 });
        // The event's data lines add up.
        let mut parser = SseParser::new(16);
        assert!(parser.feed(b"data:0123\ndata:4567\n").is_ok());
        assert!(parser.feed(b"data:89abcdef\n").is_err());
    }
}
