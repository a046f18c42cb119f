//! Small text helpers shared across the host.

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
