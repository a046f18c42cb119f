//! Hiding secret values in text and in byte streams.

use std::borrow::Cow;
use std::sync::Arc;

use super::SecretName;

/// A steady stream's lag is a multiple of this many bytes: what a reader may learn of the
/// longest value's length from what is held back is this coarse.
pub const STEADY_LAG_STEP: usize = 64;

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
    /// A redactor for `(name, value)` pairs: each value as it is, and as it reads inside a
    /// JSON string however common encoders escape it (a quote, a backslash or a control
    /// character escaped; `/` as `\/`; `<`, `>`, `&` as Go escapes them; every character
    /// past ASCII as `\uXXXX`), so a value quoted in JSON is found too.
    pub fn new(secrets: impl IntoIterator<Item = (SecretName, Arc<str>)>) -> Self {
        let mut values: Vec<(Arc<str>, String)> = Vec::new();
        for (name, value) in secrets {
            if value.is_empty() {
                continue;
            }
            let label = REDACTED.replace("{}", name.as_str());
            for form in json_forms(&value) {
                if form != *value {
                    values.push((Arc::from(form), label.clone()));
                }
            }
            values.push((value, label));
        }
        values.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        Redactor {
            values: values.into(),
        }
    }

    /// This redactor, also hiding `more`.
    pub fn with(&self, more: impl IntoIterator<Item = (SecretName, Arc<str>)>) -> Redactor {
        self.with_redactor(&Redactor::new(more))
    }

    /// This redactor, also hiding what `extra` hides.
    pub(super) fn with_redactor(&self, extra: &Redactor) -> Redactor {
        if extra.is_empty() {
            return self.clone();
        }
        let mut values: Vec<(Arc<str>, String)> = self
            .values
            .iter()
            .chain(extra.values.iter())
            .cloned()
            .collect();
        values.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
        values.dedup_by(|a, b| a.0 == b.0);
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

    /// Every string of `value` (keys included) with every secret value replaced: a JSON
    /// document stays one, whatever the values are, which replacing in its text need not
    /// keep (a value may begin in the middle of an escape).
    ///
    /// ```
    /// use capstan_host::secrets::Redactor;
    ///
    /// let redactor = Redactor::new([("K".parse().unwrap(), "nsecret-value-1".into())]);
    /// let mut message = serde_json::json!({"content": "a\nsecret-value-1 and nsecret-value-1"});
    /// redactor.redact_json(&mut message);
    /// assert_eq!(message["content"], "a\nsecret-value-1 and [redacted secret K]");
    /// ```
    pub fn redact_json(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        if self.is_empty() {
            return;
        }
        match value {
            Value::String(text) => {
                if let Cow::Owned(clean) = self.redact(text) {
                    *text = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_json(item)),
            Value::Object(map) => {
                let renamed: Vec<(String, String)> = map
                    .keys()
                    .filter_map(|key| match self.redact(key) {
                        Cow::Owned(clean) => Some((key.clone(), clean)),
                        Cow::Borrowed(_) => None,
                    })
                    .collect();
                for (old, new) in renamed {
                    if let Some(item) = map.remove(&old) {
                        map.insert(new, item);
                    }
                }
                map.values_mut().for_each(|item| self.redact_json(item));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// The JSON text `text` (a tool call's arguments, as a model wrote them) with every
    /// secret value replaced, spelled plainly or in JSON's escapes (`\u0041`); text that is
    /// not JSON is redacted as text.
    ///
    /// ```
    /// use capstan_host::secrets::Redactor;
    ///
    /// let redactor = Redactor::new([("K".parse().unwrap(), "nsecret-value-1".into())]);
    /// let escaped = r#"{"path":"n\u0073ecret-value-1"}"#;
    /// assert_eq!(redactor.redact_json_text(escaped), r#"{"path":"[redacted secret K]"}"#);
    /// assert_eq!(redactor.redact_json_text("{\"path\": \"a b\"}"), "{\"path\": \"a b\"}");
    /// ```
    pub fn redact_json_text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        // Without an escape, what a JSON string decodes to is spelled in the text as is.
        if self.is_empty() || !text.contains('\\') {
            return self.redact(text);
        }
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(parsed) => {
                let mut clean = parsed.clone();
                self.redact_json(&mut clean);
                if clean == parsed {
                    self.redact(text)
                } else {
                    Cow::Owned(clean.to_string())
                }
            }
            Err(_) => self.redact(text),
        }
    }

    /// `text` with every secret value replaced, reusing it when it holds none (the
    /// common case, on every tool call's output).
    pub fn redact_owned(&self, text: String) -> String {
        match self.redact(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(clean) => clean,
        }
    }

    /// `bytes` with every secret value replaced, or `None` when they hold none.
    pub fn redact_bytes(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        let found = self
            .values
            .iter()
            .any(|(value, _)| contains(bytes, value.as_bytes()));
        found.then(|| {
            let mut stream = self.stream();
            let mut clean = stream.push(bytes);
            clean.extend(stream.finish());
            clean
        })
    }

    /// `text` with every secret value replaced where it appears in any case (ASCII), or
    /// `None` when it holds none: for what a peer may have changed the case of, such as
    /// an HTTP header's name.
    pub fn redact_ignoring_case(&self, text: &str) -> Option<String> {
        let lower = text.to_ascii_lowercase();
        let mut out = lower.clone();
        let mut found = false;
        for (value, label) in self.values.iter() {
            let value = value.to_ascii_lowercase();
            if out.contains(&value) {
                out = out.replace(&value, label);
                found = true;
            }
        }
        found.then_some(out)
    }

    /// A redactor for one stream of bytes, such as a response body, that holds back only
    /// what could still grow into a value. What it holds back thus tells whether the end
    /// of a chunk begins a value: use it where chunks end in a line break (which begins
    /// no value) or where no one who reads the stream chooses where its chunks end;
    /// elsewhere use [`Redactor::steady_stream`].
    pub fn stream(&self) -> StreamRedactor {
        StreamRedactor {
            redactor: self.clone(),
            pending: Vec::new(),
            lag: None,
        }
    }

    /// A redactor for a stream whose content and chunking someone outside may steer (a
    /// model repeating what a user asks, a server a plugin controls): it always holds back
    /// the last bytes of what it was given, as many as the longest value less one rounded
    /// up to [`STEADY_LAG_STEP`] (cut on a character), whatever they are, so what it
    /// releases and when depends on lengths alone and tells nothing of any value.
    ///
    /// ```
    /// use capstan_host::secrets::Redactor;
    ///
    /// let redactor = Redactor::new([("KEY".parse().unwrap(), "abcdefgh12345".into())]);
    /// let (mut a, mut b) = (redactor.steady_stream(), redactor.steady_stream());
    /// // A prefix of the value and other text of its length are held back alike.
    /// assert_eq!(a.push(b"line: abcdefgh").len(), b.push(b"line: zzzzzzzz").len());
    /// ```
    pub fn steady_stream(&self) -> StreamRedactor {
        let longest = self.values.first().map_or(0, |(value, _)| value.len());
        // Rounded up, so the lag tells little of how long the longest value is.
        let lag = longest.saturating_sub(1).next_multiple_of(STEADY_LAG_STEP);
        StreamRedactor {
            redactor: self.clone(),
            pending: Vec::new(),
            lag: Some(lag),
        }
    }
}

/// How `value` may read inside a JSON string, as the encoders in common use write it.
fn json_forms(value: &str) -> Vec<String> {
    let quoted = serde_json::to_string(value).expect("a string serializes");
    let serde = quoted[1..quoted.len() - 1].to_owned();
    let slash = serde.replace('/', "\\/");
    let go = serde
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026");
    let ascii: String = serde
        .chars()
        .map(|c| {
            if c.is_ascii() {
                c.to_string()
            } else {
                let mut units = [0u16; 2];
                c.encode_utf16(&mut units)
                    .iter()
                    .map(|unit| format!("\\u{unit:04x}"))
                    .collect()
            }
        })
        .collect();
    let mut forms = vec![serde, slash, go, ascii];
    forms.sort();
    forms.dedup();
    forms
}

/// Whether `haystack` holds `needle`.
fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
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
    /// For a steady stream: how many bytes it always holds back.
    lag: Option<usize>,
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
        // A steady stream looks only at what lies before its lag: a value that begins
        // there ends within what it holds, so it is found whole.
        let end = match self.lag {
            Some(lag) if !at_end => {
                let mut end = data.len().saturating_sub(lag);
                // A character is at most four bytes: never more than three back, whatever
                // run of continuation bytes a sender makes.
                let least = end.saturating_sub(3);
                while end > least && end < data.len() && data[end] & 0xC0 == 0x80 {
                    end -= 1;
                }
                end
            }
            _ => data.len(),
        };
        let mut i = 0;
        while i < end {
            // Most bytes begin no value: pass them on without comparing.
            if !values.iter().any(|(v, _)| v.as_bytes()[0] == data[i]) {
                out.push(data[i]);
                i += 1;
                continue;
            }
            let rest = &data[i..];
            let may_grow = !at_end
                && self.lag.is_none()
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

    /// What a steady stream releases after each chunk depends on the chunks' lengths
    /// alone: the prefixes of a value are held back as any other text of their length.
    #[test]
    fn a_steady_stream_releases_by_length_alone() {
        let released = |text: &str| -> Vec<usize> {
            let mut stream = redactor().steady_stream();
            let mut lengths: Vec<usize> = text
                .as_bytes()
                .chunks(3)
                .map(|chunk| stream.push(chunk).len())
                .collect();
            lengths.push(stream.finish().len());
            lengths
        };
        let probe = "is it secret-valu? or secret-value-";
        // The same text, every value's letter turned to `z`.
        let other: String = probe
            .chars()
            .map(|c| {
                if c == '-' || c.is_alphabetic() {
                    'z'
                } else {
                    c
                }
            })
            .collect();
        assert_eq!(released(probe), released(&other));
        // And whatever the chunks, the stream is redacted whole.
        for size in 1..10 {
            let mut stream = redactor().steady_stream();
            let mut out = Vec::new();
            for chunk in b"<<secret-value-12345>> and secret-value-1.".chunks(size) {
                out.extend(stream.push(chunk));
            }
            out.extend(stream.finish());
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "<<[redacted secret B]>> and [redacted secret A]."
            );
        }
        // A run of continuation bytes moves the cut back three bytes at most.
        let mut stream = redactor().steady_stream();
        let held = STEADY_LAG_STEP;
        assert_eq!(stream.push(&[0x80; 1000]).len(), 1000 - held - 3);
        // Characters are never cut.
        let mut stream = redactor().steady_stream();
        let mut out = Vec::new();
        for chunk in "é".repeat(40).as_bytes().chunks(5) {
            let part = stream.push(chunk);
            assert!(std::str::from_utf8(&part).is_ok());
            out.extend(part);
        }
        out.extend(stream.finish());
        assert_eq!(String::from_utf8(out).unwrap(), "é".repeat(40));
    }

    #[test]
    fn a_value_quoted_in_json_is_found_escaped() {
        let redactor = Redactor::new([("Q".parse().unwrap(), "ab\"cd\\ef-123".into())]);
        let json = serde_json::json!({ "echo": "ab\"cd\\ef-123" }).to_string();
        assert_eq!(redactor.redact(&json), r#"{"echo":"[redacted secret Q]"}"#);
    }

    #[test]
    fn a_value_escaped_by_other_json_encoders_is_found() {
        let redactor = Redactor::new([("K".parse().unwrap(), "AKIA/x<y>&z-é-0123".into())]);
        for escaped in [
            r"AKIA\/x<y>&z-é-0123",
            r"AKIA/x\u003cy\u003e\u0026z-é-0123",
            r"AKIA/x<y>&z-\u00e9-0123",
        ] {
            assert_eq!(
                redactor.redact(&format!("{{\"k\":\"{escaped}\"}}")),
                r#"{"k":"[redacted secret K]"}"#,
                "{escaped}"
            );
        }
    }

    #[test]
    fn a_value_is_found_in_a_header_name_whatever_its_case() {
        let redactor = Redactor::new([("K".parse().unwrap(), "SeCrEt-Value-9".into())]);
        assert_eq!(
            redactor
                .redact_ignoring_case("x-secret-value-9-echo")
                .as_deref(),
            Some("x-[redacted secret K]-echo")
        );
        assert_eq!(redactor.redact_ignoring_case("x-plain"), None);
        assert_eq!(redactor.redact_bytes(b"plain"), None);
        assert_eq!(
            redactor.redact_bytes(b"v=SeCrEt-Value-9").unwrap(),
            b"v=[redacted secret K]"
        );
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
