//! Hiding secret values in text and in byte streams.

use std::borrow::Cow;
use std::sync::Arc;

use super::SecretName;

/// What a redacted value reads as, with the secret's name in place of `{}`.
pub const REDACTED: &str = "[redacted secret {}]";

/// Replaces every secret value with `[redacted secret NAME]`.
///
/// ```
/// use capstan_host::secrets::Redactor;
///
/// let redactor = Redactor::new([("KEY".parse().unwrap(), "abcdefgh12345".into())]);
/// assert_eq!(redactor.redact("token=abcdefgh12345;"), "token=[redacted secret KEY];");
/// assert_eq!(redactor.redact("nothing here"), "nothing here");
/// ```
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Longest first, so a value that contains another is replaced whole.
    values: Arc<[(Arc<str>, String)]>,
}

impl Redactor {
    /// A redactor for `(name, value)` pairs.
    pub fn new(secrets: impl IntoIterator<Item = (SecretName, Arc<str>)>) -> Self {
        let mut values: Vec<(Arc<str>, String)> = secrets
            .into_iter()
            .filter(|(_, value)| !value.is_empty())
            .map(|(name, value)| (value, REDACTED.replace("{}", name.as_str())))
            .collect();
        values.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        Redactor {
            values: values.into(),
        }
    }

    /// Whether there is nothing to hide.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every secret value replaced.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for (value, label) in self.values.iter() {
            if out.contains(&**value) {
                out = Cow::Owned(out.replace(&**value, label));
            }
        }
        out
    }

    /// `text` with every secret value replaced, reusing it when it holds none (the
    /// common case, on every tool call's output).
    pub fn redact_owned(&self, text: String) -> String {
        match self.redact(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(clean) => clean,
        }
    }

    /// A redactor for one stream of bytes, such as a response body.
    pub fn stream(&self) -> StreamRedactor {
        StreamRedactor {
            redactor: self.clone(),
            pending: Vec::new(),
        }
    }
}

/// Redacts a stream given in chunks: a value split across chunks is still found, at the
/// cost of holding back the last few bytes of each chunk (fewer than the longest value)
/// until the next one or [`StreamRedactor::finish`].
///
/// ```
/// use capstan_host::secrets::Redactor;
///
/// let redactor = Redactor::new([("KEY".parse().unwrap(), "abcdefgh12345".into())]);
/// let mut stream = redactor.stream();
/// let mut out = stream.push(b"x=abcdef");
/// out.extend(stream.push(b"gh12345 end"));
/// out.extend(stream.finish());
/// assert_eq!(out, b"x=[redacted secret KEY] end");
/// ```
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Redactor,
    pending: Vec<u8>,
}

impl StreamRedactor {
    /// Takes the next chunk; returns the bytes that are now safe to pass on.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.redactor.is_empty() {
            return chunk.to_vec();
        }
        self.pending.extend_from_slice(chunk);
        let (out, used) = self.scan(false);
        self.pending.drain(..used);
        out
    }

    /// The bytes held back, redacted: the end of the stream.
    pub fn finish(&mut self) -> Vec<u8> {
        let (out, _) = self.scan(true);
        self.pending.clear();
        out
    }

    /// Redacts `pending` from the start; unless at the end, stops where the rest could
    /// still grow into a value (even one longer than a value that already matches).
    /// Returns the output and how many pending bytes it used.
    fn scan(&self, at_end: bool) -> (Vec<u8>, usize) {
        let data = &self.pending;
        let values = &self.redactor.values;
        let mut out = Vec::with_capacity(data.len());
        let mut i = 0;
        while i < data.len() {
            let rest = &data[i..];
            let may_grow = !at_end
                && values
                    .iter()
                    .any(|(v, _)| v.len() > rest.len() && v.as_bytes().starts_with(rest));
            if may_grow {
                break;
            }
            match values.iter().find(|(v, _)| rest.starts_with(v.as_bytes())) {
                Some((value, label)) => {
                    out.extend_from_slice(label.as_bytes());
                    i += value.len();
                }
                None => {
                    out.push(data[i]);
                    i += 1;
                }
            }
        }
        (out, i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor() -> Redactor {
        Redactor::new([
            ("A".parse().unwrap(), "secret-value-1".into()),
            ("B".parse().unwrap(), "secret-value-12345".into()),
        ])
    }

    #[test]
    fn the_longest_value_is_replaced_whole() {
        let text = redactor()
            .redact("x secret-value-12345 y secret-value-1 z")
            .into_owned();
        assert_eq!(text, "x [redacted secret B] y [redacted secret A] z");
    }

    #[test]
    fn a_value_split_at_every_point_is_found() {
        let body = b"<<secret-value-12345>> and secret-value-1.";
        for split in 0..body.len() {
            for second in split..body.len() {
                let mut stream = redactor().stream();
                let mut out = stream.push(&body[..split]);
                out.extend(stream.push(&body[split..second]));
                out.extend(stream.push(&body[second..]));
                out.extend(stream.finish());
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    "<<[redacted secret B]>> and [redacted secret A].",
                    "split at {split}/{second}"
                );
            }
        }
    }

    #[test]
    fn one_byte_at_a_time_holds_back_no_more_than_needed() {
        let mut stream = redactor().stream();
        let mut out = Vec::new();
        for byte in b"plain text, secret-value-1!" {
            out.extend(stream.push(&[*byte]));
        }
        assert!(out.starts_with(b"plain text, "));
        out.extend(stream.finish());
        assert_eq!(out, b"plain text, [redacted secret A]!");
    }
}
