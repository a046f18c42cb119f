//! [`Label`]: what the host knows of a datum's integrity (who could have written it) and
//! confidentiality (who may read it).

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most origins (or scopes, or secrets) one label names; past it the label says how
/// many more there were. A call that reads ten thousand files still makes a small label.
pub const MAX_NAMED: usize = 16;

/// Where untrusted data came from, as the host knows it: never as the data says.
///
/// Written `plugin:NAME`, `net:HOST`, `mcp:SERVER`, `file:PATH` or `chat:CHANNEL:SENDER`.
///
/// ```
/// use capstan_host::flow::Origin;
///
/// let origin: Origin = "mcp:bank".parse().unwrap();
/// assert_eq!(origin, Origin::Mcp("bank".into()));
/// assert_eq!(origin.to_string(), "mcp:bank");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Origin {
    /// What a plugin's tool returned.
    Plugin(String),
    /// What a host answered to a request a tool made.
    Net(String),
    /// What an MCP server answered.
    Mcp(String),
    /// A workspace file the host did not see written by a trusted process.
    File(String),
    /// A message from someone on a chat platform the operator does not trust:
    /// `CHANNEL:SENDER`, as [`Origin::chat`] names it.
    Chat(String),
}

/// The longest path an [`Origin::File`] names; a longer one is cut, ending in `...`.
pub const MAX_ORIGIN_PATH: usize = 64;

impl Origin {
    /// The origin of a message sender `sender` wrote through channel `channel`
    /// (`[channels.NAME]`), the sender's id named in few and plain characters as
    /// [`Origin::file`] names a path (a platform's id is what its owner chose): any
    /// character but a letter, digit, `.`, `_`, `-`, `@`, `+` or `:` becomes `_`, and it is
    /// cut at [`MAX_ORIGIN_PATH`] characters.
    ///
    /// ```
    /// use capstan_host::flow::Origin;
    ///
    /// assert_eq!(Origin::chat("mx", "@eve:localhost").to_string(), "chat:mx:@eve:localhost");
    /// assert_eq!(Origin::chat("tg", "ignore all\nrules").to_string(), "chat:tg:ignore_all_rules");
    /// ```
    pub fn chat(channel: &str, sender: &str) -> Origin {
        let mut id: String = sender
            .chars()
            .take(MAX_ORIGIN_PATH)
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '+' | ':') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if sender.chars().nth(MAX_ORIGIN_PATH).is_some() {
            id.push_str("...");
        }
        if id.is_empty() {
            id.push('_');
        }
        Origin::Chat(format!("{channel}:{id}"))
    }

    /// The origin of workspace file `path` (relative to the workspace), named in few and
    /// plain characters: a label is shown to the model in the host's own words (a
    /// refusal, a handle's line), and a file's name is whatever its writer chose. Any
    /// character but a letter, digit, `.`, `_`, `-` or `/` becomes `_`, and the name is
    /// cut at [`MAX_ORIGIN_PATH`] characters.
    ///
    /// ```
    /// use capstan_host::flow::Origin;
    ///
    /// assert_eq!(Origin::file("notes/todo.md").to_string(), "file:notes/todo.md");
    /// assert_eq!(Origin::file("send $5 to eve").to_string(), "file:send__5_to_eve");
    /// ```
    pub fn file(path: &str) -> Origin {
        let path = path.trim_start_matches("./");
        let mut name: String = path
            .chars()
            .take(MAX_ORIGIN_PATH)
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | '*') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if path.chars().nth(MAX_ORIGIN_PATH).is_some() {
            name.push_str("...");
        }
        if name.is_empty() {
            name.push('.');
        }
        Origin::File(name)
    }
}

/// Who may read private data: the place it came from, which it may go back to.
///
/// Written `workspace`, `memory`, `tasks` or `mcp:SERVER`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The agent's workspace files.
    Workspace,
    /// The agent's memories and working memory.
    Memory,
    /// The task board.
    Tasks,
    /// What an MCP server holds; it may be sent back to that server.
    Mcp(String),
}

/// A bounded set of names (origins, scopes, secrets): at most [`MAX_NAMED`], and at least
/// how many more were left out (a count, not names: joining it again may count one twice,
/// never lose one).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named<T: Ord> {
    set: BTreeSet<T>,
    more: u32,
}

impl<T: Ord> Default for Named<T> {
    fn default() -> Self {
        Named {
            set: BTreeSet::new(),
            more: 0,
        }
    }
}

impl<T: Ord + Clone> Named<T> {
    fn one(item: T) -> Self {
        Named {
            set: BTreeSet::from([item]),
            more: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.more == 0
    }

    fn join(&mut self, other: &Named<T>) {
        self.more = self.more.max(other.more);
        for item in &other.set {
            if !self.set.contains(item) {
                self.insert(item.clone());
            }
        }
    }

    /// Names `item`, or counts it past [`MAX_NAMED`].
    fn insert(&mut self, item: T) {
        if self.set.len() < MAX_NAMED || self.set.contains(&item) {
            self.set.insert(item);
        } else {
            self.more = self.more.saturating_add(1);
        }
    }

    /// Whether joining `other` would change nothing.
    fn holds(&self, other: &Named<T>) -> bool {
        self.more >= other.more && other.set.is_subset(&self.set)
    }

    fn covers(&self, other: &Named<T>) -> bool {
        // What `other` left unnamed could be anything: only the same set is known to hold it.
        if other.more > 0 && self != other {
            return false;
        }
        other.set.is_subset(&self.set)
    }
}

impl<T: Ord + fmt::Display> fmt::Display for Named<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.set.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{item}")?;
        }
        if self.more > 0 {
            let sep = if self.set.is_empty() { "" } else { ", " };
            write!(f, "{sep}at least {} more", self.more)?;
        }
        Ok(())
    }
}

/// A datum's label: its integrity and its confidentiality.
///
/// - Integrity: *trusted* (the user's messages, the operator's config and prompts) or
///   *untrusted* from some [`Origin`]s (a tool's result, labelled by the host from what it
///   knows of the call).
/// - Confidentiality: *public*, *private* to some [`Scope`]s (what may read it), or
///   *secret* (derived from the named secrets).
///
/// Labels only grow: the [`join`](Label::join) of two is as untrusted and as confidential
/// as both. The default label is trusted and public.
///
/// ```
/// use capstan_host::flow::{Label, Origin, Scope};
///
/// let page = Label::untrusted(Origin::Net("example.com".into()));
/// let notes = Label::private(Scope::Workspace);
/// let both = page.joined(&notes);
/// assert!(!both.is_trusted());
/// assert!(both.is_private());
/// assert_eq!(both.to_string(), "untrusted(net:example.com), private(workspace)");
/// assert_eq!(Label::default().to_string(), "trusted, public");
/// ```
///
/// A trusted, public label (every user message, every model answer) is one null pointer,
/// and any other is shared: cloning a label never copies it, and joining a label into
/// one that already holds it changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Label(Option<Arc<Parts>>);

/// What a label that is not clear says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Parts {
    untrusted: Named<Origin>,
    private: Named<Scope>,
    secret: Named<String>,
}

impl Parts {
    /// Whether joining `other` into these parts would change nothing.
    fn holds(&self, other: &Parts) -> bool {
        self.untrusted.holds(&other.untrusted)
            && self.private.holds(&other.private)
            && self.secret.holds(&other.secret)
    }
}

/// The parts of the clear label.
static CLEAR: Parts = Parts {
    untrusted: Named {
        set: BTreeSet::new(),
        more: 0,
    },
    private: Named {
        set: BTreeSet::new(),
        more: 0,
    },
    secret: Named {
        set: BTreeSet::new(),
        more: 0,
    },
};

impl Label {
    fn from_parts(parts: Parts) -> Label {
        let clear =
            parts.untrusted.is_empty() && parts.private.is_empty() && parts.secret.is_empty();
        Label((!clear).then(|| Arc::new(parts)))
    }

    fn parts(&self) -> &Parts {
        self.0.as_deref().unwrap_or(&CLEAR)
    }
}

impl Label {
    /// Trusted and public: the user's words, the operator's.
    pub const fn trusted() -> Self {
        Label(None)
    }

    /// Untrusted data from `origin`, public.
    pub fn untrusted(origin: Origin) -> Self {
        Label::from_parts(Parts {
            untrusted: Named::one(origin),
            ..Parts::default()
        })
    }

    /// What stored data no label came with is taken to be: untrusted from any plugin
    /// (`plugin:*`), and private to readers it does not name, so no sink is among them.
    /// Rows written before labels were kept, working memory, and a label that no longer
    /// reads back get it.
    ///
    /// ```
    /// use capstan_host::flow::Label;
    ///
    /// let unknown = Label::unknown();
    /// assert_eq!(unknown.to_string(), "untrusted(plugin:*), private(at least 1 more)");
    /// assert!(unknown.names_fewer_than_it_holds());
    /// ```
    pub fn unknown() -> Self {
        Label::from_parts(Parts {
            untrusted: Named::one(Origin::Plugin("*".into())),
            private: Named {
                set: BTreeSet::new(),
                more: 1,
            },
            ..Parts::default()
        })
    }

    /// Trusted data private to `scope`.
    pub fn private(scope: Scope) -> Self {
        Label::from_parts(Parts {
            private: Named::one(scope),
            ..Parts::default()
        })
    }

    /// Trusted data derived from secret `name`.
    pub fn secret(name: impl Into<String>) -> Self {
        Label::from_parts(Parts {
            secret: Named::one(name.into()),
            ..Parts::default()
        })
    }

    /// Whether nothing untrusted went into it.
    pub fn is_trusted(&self) -> bool {
        self.parts().untrusted.is_empty()
    }

    /// Whether it is trusted and public: the label nothing needs to carry.
    pub fn is_clear(&self) -> bool {
        self.0.is_none()
    }

    /// Whether it is private to some scope (or derived from a secret).
    pub fn is_private(&self) -> bool {
        let parts = self.parts();
        !parts.private.is_empty() || !parts.secret.is_empty()
    }

    /// Where its untrusted parts came from (as many as it names).
    pub fn origins(&self) -> impl Iterator<Item = &Origin> {
        self.parts().untrusted.set.iter()
    }

    /// The scopes it is private to (as many as it names).
    pub fn scopes(&self) -> impl Iterator<Item = &Scope> {
        self.parts().private.set.iter()
    }

    /// The secrets it derives from (as many as it names).
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        self.parts().secret.set.iter().map(String::as_str)
    }

    /// Whether more scopes or secrets went into it than it names: then no sink is known
    /// to be among its readers.
    pub fn names_fewer_than_it_holds(&self) -> bool {
        let parts = self.parts();
        parts.private.more > 0 || parts.secret.more > 0
    }

    /// Joins `other` into this label: it becomes as untrusted and as confidential as both.
    pub fn join(&mut self, other: &Label) {
        let Some(theirs) = &other.0 else {
            return;
        };
        match &mut self.0 {
            None => self.0 = Some(theirs.clone()),
            // The usual case in a history: the same label again, shared or equal.
            Some(ours) if Arc::ptr_eq(ours, theirs) || ours.holds(theirs) => {}
            Some(ours) => {
                let ours = Arc::make_mut(ours);
                ours.untrusted.join(&theirs.untrusted);
                ours.private.join(&theirs.private);
                ours.secret.join(&theirs.secret);
            }
        }
    }

    /// The join of this label and `other`.
    pub fn joined(mut self, other: &Label) -> Label {
        self.join(other);
        self
    }

    /// The join of every label of `labels`.
    pub fn join_all<'a>(labels: impl IntoIterator<Item = &'a Label>) -> Label {
        let mut joined = Label::default();
        for label in labels {
            joined.join(label);
        }
        joined
    }

    /// Whether this label is at least as untrusted and as confidential as `other`.
    pub fn covers(&self, other: &Label) -> bool {
        let (ours, theirs) = (self.parts(), other.parts());
        ours.untrusted.covers(&theirs.untrusted)
            && ours.private.covers(&theirs.private)
            && ours.secret.covers(&theirs.secret)
    }

    /// Its integrity part alone (the confidentiality left public).
    pub fn integrity(&self) -> Label {
        Label::from_parts(Parts {
            untrusted: self.parts().untrusted.clone(),
            ..Parts::default()
        })
    }

    /// Its confidentiality part alone (trusted).
    pub fn confidentiality(&self) -> Label {
        Label::from_parts(Parts {
            untrusted: Named::default(),
            ..self.parts().clone()
        })
    }
}

impl Label {
    /// Its confidentiality, as a person reads it: `public`, `private(workspace)`,
    /// `secret(API_KEY), private(mcp:bank)`.
    pub fn confidentiality_text(&self) -> String {
        let (ours, mut text) = (self.parts(), Vec::new());
        if !ours.secret.is_empty() {
            text.push(format!("secret({})", ours.secret));
        }
        if !ours.private.is_empty() {
            text.push(format!("private({})", ours.private));
        }
        if text.is_empty() {
            text.push("public".to_owned());
        }
        text.join(", ")
    }
}

impl fmt::Display for Label {
    /// `trusted, public`; `untrusted(mcp:bank), private(mcp:bank)`; `secret(API_KEY)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let untrusted = &self.parts().untrusted;
        if untrusted.is_empty() {
            f.write_str("trusted")?;
        } else {
            write!(f, "untrusted({untrusted})")?;
        }
        write!(f, ", {}", self.confidentiality_text())
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Plugin(name) => write!(f, "plugin:{name}"),
            Origin::Net(host) => write!(f, "net:{host}"),
            Origin::Mcp(server) => write!(f, "mcp:{server}"),
            Origin::File(path) => write!(f, "file:{path}"),
            Origin::Chat(who) => write!(f, "chat:{who}"),
        }
    }
}

/// A label part that is not `plugin:`, `net:`, `mcp:` or `file:` (or `workspace`,
/// `memory`, `tasks`, `mcp:` for a scope).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseLabelError {
    text: String,
    expected: &'static str,
}

impl fmt::Display for ParseLabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is not {}", self.text, self.expected)
    }
}

impl std::error::Error for ParseLabelError {}

impl FromStr for Origin {
    type Err = ParseLabelError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || ParseLabelError {
            text: text.to_owned(),
            expected: "an origin: plugin:NAME, net:HOST, mcp:SERVER, file:PATH or chat:CHANNEL:SENDER",
        };
        let (kind, name) = text.split_once(':').ok_or_else(invalid)?;
        if name.is_empty() {
            return Err(invalid());
        }
        let name = name.to_owned();
        match kind {
            "plugin" => Ok(Origin::Plugin(name)),
            "net" => Ok(Origin::Net(name)),
            "mcp" => Ok(Origin::Mcp(name)),
            "file" => Ok(Origin::File(name)),
            "chat" => Ok(Origin::Chat(name)),
            _ => Err(invalid()),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Workspace => f.write_str("workspace"),
            Scope::Memory => f.write_str("memory"),
            Scope::Tasks => f.write_str("tasks"),
            Scope::Mcp(server) => write!(f, "mcp:{server}"),
        }
    }
}

impl FromStr for Scope {
    type Err = ParseLabelError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "workspace" => Ok(Scope::Workspace),
            "memory" => Ok(Scope::Memory),
            "tasks" => Ok(Scope::Tasks),
            _ => match text.strip_prefix("mcp:") {
                Some(server) if !server.is_empty() => Ok(Scope::Mcp(server.to_owned())),
                _ => Err(ParseLabelError {
                    text: text.to_owned(),
                    expected: "a scope: workspace, memory, tasks or mcp:SERVER",
                }),
            },
        }
    }
}

impl FromStr for Label {
    type Err = ParseLabelError;

    /// One part of a label, as a person writes it: `untrusted:ORIGIN` (e.g.
    /// `untrusted:mcp:bank`), `private:SCOPE`, `secret:NAME`, or `trusted`.
    ///
    /// ```
    /// use capstan_host::flow::Label;
    ///
    /// let bank: Label = "untrusted:mcp:bank".parse().unwrap();
    /// assert_eq!(bank.to_string(), "untrusted(mcp:bank), public");
    /// assert!("private:workspace".parse::<Label>().unwrap().is_private());
    /// assert!("somewhere".parse::<Label>().is_err());
    /// ```
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "trusted" {
            return Ok(Label::trusted());
        }
        match text.split_once(':') {
            Some(("untrusted", origin)) => origin.parse().map(Label::untrusted),
            Some(("private", scope)) => scope.parse().map(Label::private),
            Some(("secret", name)) if !name.is_empty() => Ok(Label::secret(name)),
            _ => Err(ParseLabelError {
                text: text.to_owned(),
                expected: "a label: untrusted:ORIGIN (plugin:NAME, net:HOST, mcp:SERVER, \
                           file:PATH), private:SCOPE (workspace, memory, tasks, mcp:SERVER), \
                           secret:NAME or trusted",
            }),
        }
    }
}

/// How a label is read back from a message, a memory or a task: each part a list of its
/// names, left out when empty, so a trusted public label is `{}`. It is written in the
/// same shape by [`Label`]'s `Serialize`, without building this first.
#[derive(Deserialize, Default)]
struct Stored<'a> {
    #[serde(default, borrow)]
    untrusted: Vec<Cow<'a, str>>,
    #[serde(default, borrow)]
    private: Vec<Cow<'a, str>>,
    #[serde(default, borrow)]
    secret: Vec<Cow<'a, str>>,
    /// How many more origins, scopes and secrets went in than are named.
    #[serde(default)]
    more: [u32; 3],
}

/// A part's names, written as a list of strings.
struct Names<'a, T>(&'a BTreeSet<T>);

impl<T: fmt::Display> Serialize for Names<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(Shown))
    }
}

/// A name, written as its text.
struct Shown<'a, T>(&'a T);

impl<T: fmt::Display> Serialize for Shown<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self.0)
    }
}

impl Serialize for Label {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let parts = self.parts();
        let more = [parts.untrusted.more, parts.private.more, parts.secret.more];
        let mut map = serializer.serialize_map(None)?;
        if !parts.untrusted.set.is_empty() {
            map.serialize_entry("untrusted", &Names(&parts.untrusted.set))?;
        }
        if !parts.private.set.is_empty() {
            map.serialize_entry("private", &Names(&parts.private.set))?;
        }
        if !parts.secret.set.is_empty() {
            map.serialize_entry("secret", &Names(&parts.secret.set))?;
        }
        if more != [0; 3] {
            map.serialize_entry("more", &more)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let stored = Stored::deserialize(deserializer)?;
        fn named<T: Ord + Clone + FromStr<Err = ParseLabelError>, E: Error>(
            names: Vec<Cow<'_, str>>,
            more: u32,
        ) -> Result<Named<T>, E> {
            let mut set = Named {
                set: BTreeSet::new(),
                more,
            };
            for name in names {
                set.insert(name.parse().map_err(E::custom)?);
            }
            Ok(set)
        }
        let [untrusted_more, private_more, secret_more] = stored.more;
        let mut secret = Named {
            set: BTreeSet::new(),
            more: secret_more,
        };
        for name in stored.secret {
            secret.insert(name.into_owned());
        }
        Ok(Label::from_parts(Parts {
            untrusted: named(stored.untrusted, untrusted_more)?,
            private: named(stored.private, private_more)?,
            secret,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_is_as_untrusted_and_as_confidential_as_both() {
        let a = Label::untrusted(Origin::Mcp("bank".into()))
            .joined(&Label::private(Scope::Mcp("bank".into())));
        let b = Label::secret("API_KEY");
        let both = a.clone().joined(&b);
        assert!(both.covers(&a) && both.covers(&b));
        assert!(!a.covers(&both));
        assert_eq!(
            both.to_string(),
            "untrusted(mcp:bank), secret(API_KEY), private(mcp:bank)"
        );
        // Joining is idempotent and order does not matter.
        assert_eq!(both.clone().joined(&a), both);
        assert_eq!(b.joined(&a), both);
    }

    #[test]
    fn a_label_names_at_most_max_named_and_counts_the_rest() {
        let mut label = Label::default();
        for i in 0..MAX_NAMED + 5 {
            label.join(&Label::untrusted(Origin::File(format!("f{i}"))));
        }
        assert_eq!(label.origins().count(), MAX_NAMED);
        assert!(label.to_string().contains(", at least 5 more)"), "{label}");
        // Joining it again names nothing new and loses nothing.
        assert_eq!(label.clone().joined(&label), label);
        assert!(!label.is_trusted());
    }

    #[test]
    fn labels_round_trip_through_json_and_the_clear_one_is_empty() {
        let label = Label::untrusted(Origin::Net("example.com".into()))
            .joined(&Label::private(Scope::Workspace))
            .joined(&Label::secret("K"));
        let json = serde_json::to_string(&label).unwrap();
        assert_eq!(
            json,
            r#"{"untrusted":["net:example.com"],"private":["workspace"],"secret":["K"]}"#
        );
        assert_eq!(serde_json::from_str::<Label>(&json).unwrap(), label);
        assert_eq!(serde_json::to_string(&Label::default()).unwrap(), "{}");
        let bad = serde_json::from_str::<Label>(r#"{"untrusted":["somewhere"]}"#);
        assert!(bad.unwrap_err().to_string().contains("not an origin"));
    }
}
