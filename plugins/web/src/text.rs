//! Turning response bodies and statuses into text for the model.

/// The body as UTF-8, lossily (an invalid byte becomes U+FFFD). When the body was cut at a
/// limit, a character the cut split in two is dropped rather than shown as U+FFFD.
pub fn decode(body: &[u8], truncated: bool) -> String {
    let body = if truncated {
        without_split_char(body)
    } else {
        body
    };
    String::from_utf8_lossy(body).into_owned()
}

/// `body` without an incomplete UTF-8 sequence at its very end.
fn without_split_char(body: &[u8]) -> &[u8] {
    // A UTF-8 character is at most 4 bytes: only the last 3 can start a split one.
    let tail_start = body.len().saturating_sub(3);
    for start in (tail_start..body.len()).rev() {
        let byte = body[start];
        let is_lead = byte >= 0xC0;
        if is_lead {
            let width = if byte >= 0xF0 {
                4
            } else if byte >= 0xE0 {
                3
            } else {
                2
            };
            if body.len() - start < width {
                return &body[..start];
            }
            break;
        }
        if byte < 0x80 {
            break;
        }
    }
    body
}

/// The status with its standard reason phrase, e.g. `404 Not Found`.
pub fn status_line(status: u16) -> String {
    let reason = match status {
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => return status.to_string(),
    };
    format!("{status} {reason}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_by_the_cut_is_dropped() {
        let text = "añb€"; // ñ is 2 bytes, € is 3
        let bytes = text.as_bytes();
        assert_eq!(decode(&bytes[..2], true), "a"); // half of ñ
        assert_eq!(decode(&bytes[..3], true), "añ");
        assert_eq!(decode(&bytes[..5], true), "añb"); // one byte of €
        assert_eq!(decode(&bytes[..6], true), "añb"); // two bytes of €
        assert_eq!(decode(bytes, true), text);
        // Not cut: an incomplete end is shown as the replacement character.
        assert_eq!(decode(&bytes[..2], false), "a\u{fffd}");
        assert_eq!(decode(b"a\xffb", true), "a\u{fffd}b");
        assert_eq!(decode(b"", true), "");
    }

    #[test]
    fn statuses_get_their_reason_phrase() {
        assert_eq!(status_line(404), "404 Not Found");
        assert_eq!(status_line(301), "301 Moved Permanently");
        assert_eq!(status_line(599), "599");
    }
}
