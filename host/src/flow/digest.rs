//! [`ArgsDigest`]: what an approval is bound to. Two calls have the same digest exactly
//! when their arguments are the same JSON value, however the model spaced or ordered them.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The SHA-256 of a call's [`canonical`] arguments: an approval covers the calls whose
/// arguments have this digest, and no other.
///
/// ```
/// use capstan_host::flow::ArgsDigest;
///
/// let a = ArgsDigest::of(r#"{"to":"me@example.com","amount":10}"#);
/// let b = ArgsDigest::of(r#"{ "amount": 10, "to": "me@example.com" }"#);
/// let c = ArgsDigest::of(r#"{"to":"attacker@example.com","amount":10}"#);
/// assert_eq!(a, b);
/// assert_ne!(a, c);
/// assert_eq!(a.to_string().parse::<ArgsDigest>().unwrap(), a);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ArgsDigest([u8; 32]);

impl ArgsDigest {
    /// The digest of `arguments` as a model wrote them.
    pub fn of(arguments: &str) -> Self {
        ArgsDigest(Sha256::digest(canonical(arguments).as_bytes()).into())
    }

    /// The SHA-256 of `text` as it is (a handle's value, which an endorsement is bound to).
    pub fn of_text(text: &str) -> Self {
        ArgsDigest(Sha256::digest(text.as_bytes()).into())
    }
}

/// `arguments` in one canonical form: JSON with object keys sorted and no spaces, so the
/// same value is always the same text; text that is not JSON is kept as it is.
///
/// ```
/// use capstan_host::flow::canonical;
///
/// assert_eq!(canonical(r#"{ "b": [1, {"d":1,"c":2}], "a": "x" }"#), r#"{"a":"x","b":[1,{"c":2,"d":1}]}"#);
/// assert_eq!(canonical("not json"), "not json");
/// ```
pub fn canonical(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value) => {
            let mut text = String::with_capacity(arguments.len());
            crate::text::write_canonical_json(&value, &mut text);
            text
        }
        Err(_) => arguments.to_owned(),
    }
}

/// `arguments` as a person is shown them to approve: the [`canonical`] text, with every
/// character that could make it read as something else (controls, C1 controls, bidi
/// overrides and isolates, zero-width and other invisible format characters) written as a
/// `\uXXXX` escape. The JSON value is the same, so the digest a person approves is of the
/// value they read.
///
/// ```
/// use capstan_host::flow::shown;
///
/// assert_eq!(shown("{\"to\":\"\u{202e}moc.evil\"}"), r#"{"to":"\u202emoc.evil"}"#);
/// assert_eq!(shown(r#"{"b":1,"a":"é"}"#), r#"{"a":"é","b":1}"#);
/// ```
pub fn shown(arguments: &str) -> String {
    let text = canonical(arguments);
    if !text.chars().any(deceptive) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if deceptive(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Whether `c` could make shown text read other than it is. JSON's structure is ASCII, so
/// such a character can only stand inside a string, where its escape means the same.
fn deceptive(c: char) -> bool {
    matches!(c,
        '\u{7f}'..='\u{9f}'
        | '\u{ad}'
        | '\u{61c}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
    )
}

impl fmt::Display for ArgsDigest {
    /// Lowercase hex, 64 digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::text::hex(&self.0))
    }
}

impl fmt::Debug for ArgsDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ArgsDigest({self})")
    }
}

/// A digest that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an argument digest: expected 64 hex digits (SHA-256)")]
pub struct ParseDigestError(String);

impl FromStr for ArgsDigest {
    type Err = ParseDigestError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bytes = crate::text::unhex(text)
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .ok_or_else(|| ParseDigestError(crate::text::truncate(text, 80).to_owned()))?;
        Ok(ArgsDigest(bytes))
    }
}

crate::text::serde_as_text!(ArgsDigest);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_strings_and_nesting_keep_their_meaning() {
        // The same value however written; a different value, a different digest.
        assert_eq!(
            ArgsDigest::of(r#"{"a":{"y":[true,null],"x":"\u0041"}}"#),
            ArgsDigest::of(r#"{"a":{"x":"A","y":[true,null]}}"#)
        );
        assert_ne!(
            ArgsDigest::of(r#"{"amount":10}"#),
            ArgsDigest::of(r#"{"amount":"10"}"#)
        );
        assert_ne!(ArgsDigest::of(r#"[1,2]"#), ArgsDigest::of(r#"[2,1]"#));
        // A key that needs escaping stays one key.
        assert_eq!(canonical(r#"{"a\"b":1}"#), r#"{"a\"b":1}"#);
    }

    #[test]
    fn a_bad_digest_is_refused_saying_what_a_digest_is() {
        let err = "abc".parse::<ArgsDigest>().unwrap_err();
        assert!(err.to_string().contains("64 hex digits"), "{err}");
        assert!("é".repeat(32).parse::<ArgsDigest>().is_err());
    }
}
