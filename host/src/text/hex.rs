//! Bytes as lowercase hex and back: digests, keys and signatures as they are stored and
//! shown.

use std::fmt::Write as _;

/// `bytes` in lowercase hex.
///
/// ```
/// assert_eq!(capstan_host::text::hex(&[0, 171, 255]), "00abff");
/// ```
pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// The bytes of hex `text` (either case), or `None` if it is not hex.
///
/// ```
/// assert_eq!(capstan_host::text::unhex("00abFF"), Some(vec![0, 171, 255]));
/// assert_eq!(capstan_host::text::unhex("0g"), None);
/// assert_eq!(capstan_host::text::unhex("é"), None);
/// ```
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
}
