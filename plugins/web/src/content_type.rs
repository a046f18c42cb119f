//! Which responses `web_fetch` returns: text only, since a model reads text.

/// Whether a `content-type` value names text: `text/*`, `application/json`,
/// `application/xml`, `application/xhtml+xml`, or any `+json` / `+xml` type
/// (`application/ld+json`, `application/rss+xml`...). Parameters (`; charset=...`) and case
/// do not matter.
pub fn is_text(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    if kind.is_empty() || subtype.is_empty() {
        return false;
    }
    kind == "text"
        || matches!(
            essence.as_str(),
            "application/json" | "application/xml" | "application/xhtml+xml"
        )
        || subtype.ends_with("+json")
        || subtype.ends_with("+xml")
}

/// The type part of a `content-type` value, for messages: `image/png` of
/// `image/png; q=1`.
pub fn essence(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or_default().trim()
}

/// Whether a body without a `content-type` may be returned as text: it must not look
/// binary (a NUL byte in its first KiB says it is).
pub fn looks_like_text(body: &[u8]) -> bool {
    !body.iter().take(1024).any(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_types_are_accepted_in_any_case_and_with_parameters() {
        for ok in [
            "text/html",
            "text/plain; charset=utf-8",
            "TEXT/CSV",
            "application/json",
            "Application/JSON; charset=UTF-8",
            "application/xml",
            "application/xhtml+xml",
            "application/ld+json",
            "application/rss+xml",
            "image/svg+xml",
            "application/problem+json",
        ] {
            assert!(is_text(ok), "{ok}");
        }
    }

    #[test]
    fn binary_and_malformed_types_are_refused() {
        for bad in [
            "image/png",
            "application/pdf",
            "application/octet-stream",
            "application/zip",
            "application/jsonx",
            "video/mp4",
            "",
            "text",
            "/html",
            "text/",
            "application/x-json+zip",
        ] {
            assert!(!is_text(bad), "{bad}");
        }
    }

    #[test]
    fn the_essence_drops_parameters() {
        assert_eq!(essence("image/png; q=1"), "image/png");
        assert_eq!(essence(" text/html "), "text/html");
    }

    #[test]
    fn a_body_with_nul_bytes_looks_binary() {
        assert!(looks_like_text(b"hello"));
        assert!(!looks_like_text(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"));
    }
}
