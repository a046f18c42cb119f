//! Digests: of a component's bytes, and of a tool's description and schema.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256};

use crate::text::{hex, serde_as_text, unhex, write_canonical_json};

/// The BLAKE3 digest of a component's bytes: what `capstan.lock` pins, what a signature
/// signs, and what the artifact cache keys a compiled component by. Written
/// `blake3:<64 hex digits>`.
///
/// ```
/// use capstan_host::plugin::trust::ComponentDigest;
///
/// let digest = ComponentDigest::of(b"\0asm");
/// let text = digest.to_string();
/// assert!(text.starts_with("blake3:"));
/// assert_eq!(text.parse::<ComponentDigest>().unwrap(), digest);
/// assert!("sha256:00".parse::<ComponentDigest>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ComponentDigest([u8; 32]);

/// The prefix of a [`ComponentDigest`]'s text.
const BLAKE3: &str = "blake3:";
/// The prefix of a [`TextDigest`]'s text.
const SHA256: &str = "sha256:";

impl ComponentDigest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let mut hasher = blake3::Hasher::new();
        hash_large(&mut hasher, bytes);
        ComponentDigest(hasher.finalize().into())
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Its first 12 hex digits, for a table.
    pub fn short(&self) -> String {
        hex(&self.0[..6])
    }
}

/// Feeds `bytes` to `hasher`, on every core when they are large enough to gain from it:
/// an interpreter's component (15-20 MB) and its compiled artifact (35-40 MB) are hashed
/// on each load, and on one core that was a quarter of a cached load.
pub(crate) fn hash_large(hasher: &mut blake3::Hasher, bytes: &[u8]) {
    // Below this, splitting the work costs more than it saves (BLAKE3's own guidance is
    // 128 KiB; the margin covers a busy pool).
    const PARALLEL_FROM: usize = 1 << 20;
    if bytes.len() >= PARALLEL_FROM {
        hasher.update_rayon(bytes);
    } else {
        hasher.update(bytes);
    }
}

impl fmt::Display for ComponentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{BLAKE3}{}", hex(&self.0))
    }
}

impl fmt::Debug for ComponentDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for ComponentDigest {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.strip_prefix(BLAKE3)
            .and_then(unhex)
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .map(ComponentDigest)
            .ok_or_else(|| {
                format!("`{text}` is not a component digest (`blake3:` and 64 hex digits)")
            })
    }
}

/// The SHA-256 of a tool's description, or of its schema written as canonical JSON (keys
/// sorted, no spaces, each number in one spelling), so a server that sends the same schema
/// with its keys in another order, or `10.0` for `10`, is not taken for one that changed
/// it. Written `sha256:<64 hex digits>`.
///
/// ```
/// use capstan_host::plugin::trust::TextDigest;
///
/// let a = serde_json::json!({"type": "object", "properties": {"q": {"type": "string"}}});
/// let b: serde_json::Value =
///     serde_json::from_str(r#"{"properties":{"q":{"type":"string"}},"type":"object"}"#).unwrap();
/// assert_eq!(TextDigest::of_json(&a), TextDigest::of_json(&b));
/// let ten = |text: &str| TextDigest::of_json(&serde_json::from_str(text).unwrap());
/// assert_eq!(ten(r#"{"maximum": 10}"#), ten(r#"{"maximum": 1e1}"#));
/// assert_eq!(ten(r#"{"maximum": 10}"#), ten(r#"{"maximum": 10.0}"#));
/// assert_ne!(ten(r#"{"maximum": 10}"#), ten(r#"{"maximum": 10.5}"#));
/// assert_ne!(TextDigest::of_text("Reads a file."), TextDigest::of_text("Reads a file!"));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TextDigest([u8; 32]);

impl TextDigest {
    /// The digest of `text`.
    pub fn of_text(text: &str) -> Self {
        TextDigest(Sha256::digest(text.as_bytes()).into())
    }

    /// The digest of `value` written as canonical JSON.
    pub fn of_json(value: &serde_json::Value) -> Self {
        let mut text = String::new();
        write_canonical_json(&normalized(value), &mut text);
        TextDigest::of_text(&text)
    }
}

impl fmt::Display for TextDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SHA256}{}", hex(&self.0))
    }
}

impl fmt::Debug for TextDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for TextDigest {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.strip_prefix(SHA256)
            .and_then(unhex)
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .map(TextDigest)
            .ok_or_else(|| format!("`{text}` is not a digest (`sha256:` and 64 hex digits)"))
    }
}

serde_as_text!(ComponentDigest, TextDigest);

/// `value` with every number in one spelling: an integral float (`10.0`, `1e1`) as the
/// integer it is.
fn normalized(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, item)| (key.clone(), normalized(item)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalized).collect()),
        Value::Number(number) => canonical_number(number),
        other => other.clone(),
    }
}

/// A number in one spelling: `10`, `10.0` and `1e1` are all the integer 10.
fn canonical_number(number: &serde_json::Number) -> serde_json::Value {
    // Integers up to 2^53 are exact as floats too; past it, the number as parsed.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    match number.as_f64() {
        Some(value) if number.is_f64() && value.fract() == 0.0 && value.abs() <= EXACT => {
            serde_json::Value::from(value as i64)
        }
        _ => serde_json::Value::Number(number.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_input_hashed_on_every_core_has_the_one_core_digest() {
        // Over the parallel threshold, and not a multiple of BLAKE3's chunk or of a core's
        // share, so each split point is crossed.
        let bytes: Vec<u8> = (0..(3 << 20) + 1027)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        assert_eq!(
            ComponentDigest::of(&bytes).0,
            *blake3::hash(&bytes).as_bytes()
        );
        let small = &bytes[..4096];
        assert_eq!(
            ComponentDigest::of(small).0,
            *blake3::hash(small).as_bytes()
        );
    }
}
