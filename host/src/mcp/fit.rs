//! Fitting a tool's result into one MCP message.
//!
//! An MCP client reads a result as one message (a line on stdio, an event or a body over
//! HTTP), and the official SDKs refuse one past a size of their own (1 MiB for one
//! streamed event by default). The host's cap on a tool's output counts text; the message
//! counts that text JSON-encoded, with the envelope around it. A result is cut here, where
//! both are known, so that the client gets the result and a note of the cut rather than an
//! error of its transport.

/// Room in a message for all that is not the result's text: the JSON-RPC envelope, the
/// content block, the id the client chose, and the transport's framing.
const ENVELOPE_BYTES: usize = 1024;

/// The key that sets the message size, named by the note of a cut.
pub const MESSAGE_KEY: &str = "limits.mcp_message_kib";

/// The default of [`MESSAGE_KEY`]: the official SDKs' default for one event.
pub const DEFAULT_MESSAGE_BYTES: usize = 1 << 20;

/// `text`, cut at a character so that a message carrying it, JSON-encoded, with a request
/// id of `id_bytes` (as JSON), is at most `max_message` bytes; a cut text ends with a note
/// naming its size, the limit and [`MESSAGE_KEY`].
///
/// ```
/// use capstan_host::mcp::fit_message;
///
/// let short = fit_message("a note".to_owned(), 64 << 10, 1);
/// assert_eq!(short, "a note");
/// let quotes = fit_message("\"".repeat(64 << 10), 64 << 10, 1);
/// assert!(serde_json::to_string(&quotes).unwrap().len() < 64 << 10);
/// assert!(quotes.ends_with("ask for less, or a page of it at a time]"));
/// ```
pub fn fit_message(text: String, max_message: usize, id_bytes: usize) -> String {
    let budget = max_message.saturating_sub(ENVELOPE_BYTES + id_bytes);
    let encoded = encoded_len(&text);
    if encoded <= budget {
        return text;
    }
    let note = format!(
        "\n[result cut by the host: {encoded} bytes as JSON, over the {} KiB of one MCP \
         message ({MESSAGE_KEY}); ask for less, or a page of it at a time]",
        max_message >> 10
    );
    let mut room = budget.saturating_sub(encoded_len(&note));
    let mut end = 0;
    for (at, c) in text.char_indices() {
        let Some(left) = room.checked_sub(char_len(c)) else {
            break;
        };
        room = left;
        end = at + c.len_utf8();
    }
    let mut kept = text;
    kept.truncate(end);
    kept.push_str(&note);
    kept
}

/// The bytes of `text` as a JSON string's contents (serde_json's escapes).
fn encoded_len(text: &str) -> usize {
    text.chars().map(char_len).sum()
}

fn char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoded_length_is_serde_jsons() {
        let text = "a\"b\\c\nd\u{1}é€😀\u{7f}\t";
        let serde = serde_json::to_string(text).unwrap().len() - 2;
        assert_eq!(encoded_len(text), serde);
    }

    #[test]
    fn a_cut_result_fits_the_message_whatever_it_holds() {
        let max = 64 << 10;
        for filler in ["x", "\"", "\u{1}", "é", "😀", "a\n"] {
            let text = filler.repeat(max);
            let fitted = fit_message(text.clone(), max, 1);
            let message = serde_json::json!({
                "jsonrpc": "2.0",
                "id": 7,
                "result": {"content": [{"type": "text", "text": fitted}], "isError": false},
            });
            let size = serde_json::to_string(&message).unwrap().len();
            assert!(size <= max, "{filler:?}: {size}");
            assert!(size > max - 2 * ENVELOPE_BYTES, "{filler:?}: only {size}");
            assert!(fitted.contains(MESSAGE_KEY), "{filler:?}");
            assert!(text.starts_with(fitted.split("\n[result cut").next().unwrap()));
        }
    }
}
