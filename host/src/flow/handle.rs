//! Opaque handles: a tool result the host holds back from the model. The model is shown a
//! line naming it (`$h3: 2.1 KiB, untrusted(net:example.com), public`) and may pass the
//! handle as an argument, where the host puts the value in and the call carries its label,
//! or ask a typed question about it ([`super::Question`]). The value never enters a
//! request to the model, so whatever it says cannot steer the process that holds it.
//!
//! A held result is a history message whose text is that line and whose [`Held`] keeps
//! the value: every path that shows a history to a model (a turn, the compactor's
//! excerpt, a provider's wire format) reads the text, so none can show the value. The
//! message keeps the value's label, but a process's context label leaves it out: the
//! process has not read it.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::digest::ArgsDigest;
use super::label::Label;

/// A handle's name within its process: `$h1`, `$h2`, ...
///
/// ```
/// use capstan_host::flow::HandleId;
///
/// let id: HandleId = "$h3".parse().unwrap();
/// assert_eq!(id.to_string(), "$h3");
/// assert_eq!(id.next().to_string(), "$h4");
/// assert!("h3".parse::<HandleId>().is_err());
/// assert!("$h03".parse::<HandleId>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HandleId(u32);

impl HandleId {
    /// The first handle of a process.
    pub const FIRST: HandleId = HandleId(1);

    /// The handle after this one.
    pub fn next(self) -> HandleId {
        HandleId(self.0.saturating_add(1))
    }
}

impl fmt::Display for HandleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "$h{}", self.0)
    }
}

/// A text that is not a handle's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseHandleError(String);

impl FromStr for HandleId {
    type Err = ParseHandleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || {
            ParseHandleError(format!(
                "`{}` is not a handle: a handle is written $h and its number, e.g. $h3",
                crate::text::one_line(text)
            ))
        };
        let digits = text.strip_prefix("$h").ok_or_else(error)?;
        // One spelling per handle: `$h3`, never `$h03` or `$h+3`.
        if digits.is_empty()
            || digits.starts_with('0')
            || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(error());
        }
        digits.parse().map(HandleId).map_err(|_| error())
    }
}

/// A handle a call's arguments carried, and the SHA-256 of its value: what a person's
/// endorsement of it is bound to. Written `$h1:HEX`.
///
/// ```
/// use capstan_host::flow::{ArgsDigest, Carried, HandleId};
///
/// let carried = Carried { handle: HandleId::FIRST, digest: ArgsDigest::of_text("a page") };
/// let text = carried.to_string();
/// assert!(text.starts_with("$h1:"));
/// assert_eq!(text.parse::<Carried>().unwrap(), carried);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Carried {
    /// The handle.
    pub handle: HandleId,
    /// The SHA-256 of its value.
    pub digest: ArgsDigest,
}

impl fmt::Display for Carried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.handle, self.digest)
    }
}

impl FromStr for Carried {
    type Err = ParseHandleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |what: &str| {
            ParseHandleError(format!(
                "`{}` is not a handle and its value's digest ($h1:SHA256HEX): {what}",
                crate::text::one_line(text)
            ))
        };
        let (handle, digest) = text.split_once(':').ok_or_else(|| error("no `:`"))?;
        Ok(Carried {
            handle: handle.parse()?,
            digest: digest
                .parse()
                .map_err(|err: super::ParseDigestError| error(&err.to_string()))?,
        })
    }
}

crate::text::serde_as_text!(Carried);

/// The handles a call carried, as one text (`$h1:HEX $h2:HEX`, empty for none): how a
/// store keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CarriedList(pub Vec<Carried>);

impl fmt::Display for CarriedList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, carried) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{carried}")?;
        }
        Ok(())
    }
}

impl FromStr for CarriedList {
    type Err = ParseHandleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        text.split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map(CarriedList)
    }
}

/// The value of a held result, kept with its history message (whose text is the line the
/// model is shown instead, [`Held::shown`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Its name.
    pub handle: HandleId,
    /// The result's text.
    pub value: Arc<str>,
}

impl Held {
    /// The line the model is shown for `value`, held as `handle`, labelled `label`.
    ///
    /// ```
    /// use capstan_host::flow::{Held, HandleId, Label, Origin};
    ///
    /// let page = Label::untrusted(Origin::Net("example.com".into()));
    /// let line = Held::shown(HandleId::FIRST, &"x".repeat(2150), &page);
    /// assert!(line.starts_with("$h1: 2.1 KiB held by the host, untrusted(net:example.com), public."), "{line}");
    /// ```
    pub fn shown(handle: HandleId, value: &str, label: &Label) -> String {
        format!(
            "{handle}: {} held by the host, {label}. Pass \"{handle}\" as an argument to \
             use its value; ask_about asks a typed question about it.",
            Size(value.len())
        )
    }
}

/// A byte count as a person reads it: `812 B`, `2.1 KiB`, `3.4 MiB`.
struct Size(usize);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KIB: f64 = 1024.0;
        let bytes = self.0 as f64;
        if self.0 < 1024 {
            write!(f, "{} B", self.0)
        } else if bytes < KIB * KIB {
            write!(f, "{:.1} KiB", bytes / KIB)
        } else {
            write!(f, "{:.1} MiB", bytes / (KIB * KIB))
        }
    }
}

/// Which tool results a profile holds back as handles
/// (`[profiles.KIND.handles]`): untrusted ones, ones above a size, or none (the default).
///
/// ```
/// use capstan_host::flow::{Holding, Label, Origin};
///
/// let holding = Holding { untrusted: true, above_bytes: Some(64 * 1024) };
/// let page = Label::untrusted(Origin::Net("example.com".into()));
/// assert!(holding.holds("short", &page));
/// assert!(!holding.holds("short", &Label::trusted()));
/// assert!(holding.holds(&"x".repeat(65 * 1024), &Label::trusted()));
/// assert!(!Holding::default().holds("short", &page));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Holding {
    /// Every result labelled untrusted.
    pub untrusted: bool,
    /// Every result longer than this many bytes.
    pub above_bytes: Option<u64>,
}

impl Holding {
    /// Whether it holds any result.
    pub fn is_on(&self) -> bool {
        self.untrusted || self.above_bytes.is_some()
    }

    /// Whether a result `text` labelled `label` is held.
    pub fn holds(&self, text: &str, label: &Label) -> bool {
        (self.untrusted && !label.is_trusted())
            || self
                .above_bytes
                .is_some_and(|above| text.len() as u64 > above)
    }
}

/// The most bytes of handles' values one call's arguments may be given.
pub const MAX_PUT_IN: usize = 8 << 20;

/// What [`Handles::substitute`] has put in so far.
struct PutIn {
    label: Label,
    bytes: usize,
    used: Vec<Carried>,
}

/// The highest handle number that counts when history text names it.
const MAX_HANDLE_NAMED: u32 = 1_000_000_000;

/// The handles `text` names (`$h` and digits, not followed by a letter or digit).
fn named_in(text: &str) -> impl Iterator<Item = HandleId> + '_ {
    text.match_indices("$h").filter_map(move |(at, _)| {
        let rest = &text[at + 2..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let after = rest[digits..].chars().next();
        if after.is_some_and(char::is_alphanumeric) {
            return None;
        }
        // A name past any a process could have held (a model may write `$h4294967295`)
        // would leave no fresh one after it.
        rest[..digits]
            .parse::<u32>()
            .ok()
            .filter(|n| (1..MAX_HANDLE_NAMED).contains(n))
            .map(HandleId)
    })
}

/// What the model's arguments became once the host put in the handles' values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Substituted {
    /// The arguments the tool gets.
    pub arguments: String,
    /// The join of the labels of the handles used.
    pub label: Label,
    /// The handles used, each once, in the order first named.
    pub used: Vec<Carried>,
}

/// The handles a process holds, as a round of its tool calls sees them: every held
/// result in its history.
///
/// ```
/// use std::sync::Arc;
/// use capstan_host::flow::{Handles, HandleId, Label, Origin};
///
/// let page = Label::untrusted(Origin::Net("example.com".into()));
/// let handles = Handles::new([(HandleId::FIRST, Arc::from("Dear Bob, ..."), page.clone())]);
/// let sent = handles.substitute(r#"{"to":"ann@example.com","body":"$h1"}"#).unwrap().unwrap();
/// assert_eq!(sent.arguments, r#"{"body":"Dear Bob, ...","to":"ann@example.com"}"#);
/// assert_eq!(sent.label, page);
/// // Only a whole string is a handle; text that mentions one is left as written.
/// assert_eq!(handles.substitute(r#"{"body":"see $h1"}"#).unwrap(), None);
/// assert!(handles.substitute(r#"{"body":"$h2"}"#).unwrap_err().contains("$h1"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Handles {
    held: Vec<(HandleId, Arc<str>, Label)>,
}

impl Handles {
    /// The handles `held`: each one's name, value and label.
    pub fn new(held: impl IntoIterator<Item = (HandleId, Arc<str>, Label)>) -> Self {
        Handles {
            held: held.into_iter().collect(),
        }
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The name the next held result gets: one past the highest held and the highest
    /// named in `texts` (what the history says: a summary, a reply or a call may still name
    /// a handle whose value is gone), so a name never stands for two values.
    ///
    /// ```
    /// use capstan_host::flow::{Handles, HandleId};
    ///
    /// let none = Handles::default();
    /// assert_eq!(none.next_id([]), HandleId::FIRST);
    /// let summary = "[summary] The page ($h7) asked for a refund; $h12x is not one.";
    /// assert_eq!(none.next_id([summary]).to_string(), "$h8");
    /// ```
    pub fn next_id<'a>(&self, texts: impl IntoIterator<Item = &'a str>) -> HandleId {
        let held = self.held.iter().map(|(id, ..)| id.next());
        let named = texts.into_iter().flat_map(named_in).map(HandleId::next);
        held.chain(named).max().unwrap_or(HandleId::FIRST)
    }

    /// These handles, those a person endorsed (`endorsed`: each bound to its value's
    /// digest) raised to trusted: their values' confidentiality stays.
    pub fn endorsed(mut self, endorsed: &[Carried]) -> Self {
        for (id, value, label) in &mut self.held {
            let vouched = endorsed.iter().any(|e| e.handle == *id)
                && endorsed.contains(&Carried {
                    handle: *id,
                    digest: ArgsDigest::of_text(value),
                });
            if vouched {
                *label = label.confidentiality();
            }
        }
        self
    }

    /// Handle `id` bound to its value's digest, if held.
    pub fn carried(&self, id: HandleId) -> Option<Carried> {
        self.get(id).map(|(value, _)| Carried {
            handle: id,
            digest: ArgsDigest::of_text(value),
        })
    }

    /// Handle `id`'s value and label.
    pub fn get(&self, id: HandleId) -> Option<(&Arc<str>, &Label)> {
        self.held
            .iter()
            .find(|(held, ..)| *held == id)
            .map(|(_, value, label)| (value, label))
    }

    /// `arguments` with each string that is exactly a held handle's name (`"$h3"`)
    /// replaced by its value, or `None` if there is none (the usual call, answered
    /// without parsing when the text names no handle). Arguments that are not JSON are
    /// left to the tool's own check. A string that names a handle this process does not
    /// hold is an error saying which it holds.
    pub fn substitute(&self, arguments: &str) -> Result<Option<Substituted>, String> {
        if !arguments.contains("$h") {
            return Ok(None);
        }
        let Ok(mut value) = serde_json::from_str::<Value>(arguments) else {
            return Ok(None);
        };
        let mut put = PutIn {
            label: Label::trusted(),
            bytes: 0,
            used: Vec::new(),
        };
        self.put_in(&mut value, &mut put)?;
        Ok((!put.used.is_empty()).then(|| Substituted {
            arguments: value.to_string(),
            label: put.label,
            used: put.used,
        }))
    }

    fn put_in(&self, value: &mut Value, put: &mut PutIn) -> Result<(), String> {
        match value {
            Value::String(text) => {
                let Ok(id) = text.parse::<HandleId>() else {
                    return Ok(());
                };
                let (held, held_label) = self.get(id).ok_or_else(|| self.unknown(id))?;
                // Named many times, one large value would make arguments of any size.
                put.bytes = put.bytes.saturating_add(held.len().max(1));
                if put.bytes > MAX_PUT_IN {
                    return Err(format!(
                        "the handles named put more than {} MiB into the arguments, the most \
                         one call carries; name each handle once",
                        MAX_PUT_IN >> 20
                    ));
                }
                if !put.used.iter().any(|used| used.handle == id) {
                    put.used.push(Carried {
                        handle: id,
                        digest: ArgsDigest::of_text(held),
                    });
                }
                *text = held.to_string();
                put.label.join(held_label);
            }
            Value::Array(items) => {
                for item in items {
                    self.put_in(item, put)?;
                }
            }
            Value::Object(fields) => {
                for item in fields.values_mut() {
                    self.put_in(item, put)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The error for a handle this process does not hold.
    pub fn unknown(&self, id: HandleId) -> String {
        let held: Vec<String> = self.held.iter().map(|(id, ..)| id.to_string()).collect();
        if held.is_empty() {
            format!("{id} is not a handle this process holds: it holds none")
        } else {
            format!(
                "{id} is not a handle this process holds (a handle summarized away by \
                 compaction is gone): it holds {}",
                held.join(", ")
            )
        }
    }
}

crate::text::serde_as_text!(HandleId);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{Origin, Scope};

    #[test]
    fn nested_handles_join_their_labels() {
        let page = Label::untrusted(Origin::Net("example.com".into()));
        let mail = Label::private(Scope::Mcp("mail".into()));
        let handles = Handles::new([
            (HandleId(1), Arc::from("one"), page.clone()),
            (HandleId(2), Arc::from("two \"quoted\""), mail.clone()),
        ]);
        let sent = handles
            .substitute(r#"{"a":["$h1",{"b":"$h2"}],"n":3}"#)
            .unwrap()
            .unwrap();
        let value: Value = serde_json::from_str(&sent.arguments).unwrap();
        assert_eq!(value["a"][0], "one");
        assert_eq!(value["a"][1]["b"], "two \"quoted\"");
        assert_eq!(sent.label, page.joined(&mail));
        assert_eq!(handles.next_id([]), HandleId(3));
        assert_eq!(handles.next_id(["a reply naming $h5."]), HandleId(6));
        assert_eq!(
            handles.next_id(["$h4294967295 and $h3000000000"]),
            HandleId(3)
        );
    }

    #[test]
    fn not_json_and_lookalikes_are_left_alone() {
        let handles = Handles::new([(HandleId(1), Arc::from("v"), Label::trusted())]);
        assert_eq!(handles.substitute("{not json $h1").unwrap(), None);
        assert_eq!(handles.substitute(r#"{"a":"$h01"}"#).unwrap(), None);
        assert_eq!(handles.substitute(r#"{"$h1":"key"}"#).unwrap(), None);
        let none = Handles::default();
        assert!(
            none.substitute(r#"{"a":"$h1"}"#)
                .unwrap_err()
                .contains("holds none")
        );
    }

    #[test]
    fn one_value_named_many_times_cannot_make_arguments_of_any_size() {
        let big: Arc<str> = Arc::from("x".repeat(1 << 20));
        let handles = Handles::new([(HandleId(1), big, Label::trusted())]);
        let once = handles.substitute(r#"{"a":"$h1"}"#).unwrap().unwrap();
        assert_eq!(once.arguments.len(), (1 << 20) + 8);
        let many = format!("[{}]", ["\"$h1\""; 9].join(","));
        let err = handles.substitute(&many).unwrap_err();
        assert!(err.contains("more than 8 MiB"), "{err}");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(Size(812).to_string(), "812 B");
        assert_eq!(Size(2150).to_string(), "2.1 KiB");
        assert_eq!(Size(3 * 1024 * 1024 + 400_000).to_string(), "3.4 MiB");
    }
}
