//! Replies cut to the size a platform takes.

/// `text` in pieces of at most `max` characters, cut at a paragraph, then a line, then a
/// word where one falls in the second half of a piece, else mid-word. No piece is empty;
/// the whitespace at a cut is dropped.
///
/// ```
/// use capstan_host::messaging::split;
///
/// assert_eq!(split("short", 10), vec!["short"]);
/// assert_eq!(split("one two three four", 9), vec!["one two", "three", "four"]);
/// assert_eq!(split("para one\n\npara two", 12), vec!["para one", "para two"]);
/// assert_eq!(split("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
/// ```
pub fn split(text: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut pieces = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        // The byte index after `max` characters, or the whole rest.
        let end = match rest.char_indices().nth(max) {
            None => {
                pieces.push(rest.to_owned());
                break;
            }
            Some((at, _)) => at,
        };
        let window = &rest[..end];
        let half = window.len() / 2;
        let cut = ["\n\n", "\n", " "]
            .iter()
            .find_map(|sep| window.rfind(sep).filter(|&at| at >= half && at > 0))
            .unwrap_or(end);
        let piece = rest[..cut].trim_end();
        if !piece.is_empty() {
            pieces.push(piece.to_owned());
        }
        rest = rest[cut..].trim_start();
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_piece_fits_and_nothing_but_whitespace_is_lost() {
        let text = "Grüße aus Köln! ".repeat(500) + &"x".repeat(9000);
        for max in [64, 100, 4096] {
            let pieces = split(&text, max);
            assert!(
                pieces
                    .iter()
                    .all(|p| p.chars().count() <= max && !p.is_empty())
            );
            let joined: String = pieces.concat().split_whitespace().collect();
            let whole: String = text.split_whitespace().collect();
            assert_eq!(joined, whole);
        }
        assert!(split("   ", 10).is_empty());
    }
}
