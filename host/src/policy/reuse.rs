//! [`InstanceReuse`]: whether a process's calls of a plugin share one warm instance, and
//! the [`ReuseRules`] that choose it per plugin and per process kind.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::ProcessKind;

/// How long a plugin's instance lives.
///
/// ```
/// use capstan_host::policy::InstanceReuse;
///
/// let reuse: InstanceReuse = "process".parse().unwrap();
/// assert_eq!(reuse, InstanceReuse::Process);
/// assert_eq!(InstanceReuse::default().to_string(), "call");
/// assert!("forever".parse::<InstanceReuse>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum InstanceReuse {
    /// A fresh instance for every call: nothing a call leaves in memory reaches another.
    #[default]
    Call,
    /// One process's calls with the same capabilities reuse its own instance, which is
    /// never shared with another process and is dropped after any failure. A plugin's
    /// memory (statics, caches) lives from one such call to the next.
    Process,
}

impl InstanceReuse {
    /// `call` or `process`, as the config spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceReuse::Call => "call",
            InstanceReuse::Process => "process",
        }
    }
}

impl fmt::Display for InstanceReuse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InstanceReuse {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "call" => Ok(InstanceReuse::Call),
            "process" => Ok(InstanceReuse::Process),
            other => Err(format!(
                "must be \"call\" (a fresh instance per call) or \"process\" (one instance per \
                 process, reused by its calls), got {other:?}"
            )),
        }
    }
}

/// Which plugins' instances a process keeps, from `[plugins] instance_reuse.NAME` (one
/// plugin) and `[profiles.KIND] instance_reuse` (every plugin a kind calls): a `call` at
/// either level wins, since it is the stricter; else a `process` at either; else
/// [`InstanceReuse::Call`].
///
/// ```
/// use capstan_host::policy::{InstanceReuse, ProcessKind, ReuseRules};
///
/// let rules = ReuseRules::default()
///     .with_plugin("files", InstanceReuse::Process)
///     .with_plugin("shell", InstanceReuse::Call)
///     .with_kind(ProcessKind::Cortex, InstanceReuse::Call)
///     .with_kind(ProcessKind::Worker, InstanceReuse::Process);
/// assert_eq!(rules.decide(ProcessKind::Branch, "files"), InstanceReuse::Process);
/// assert_eq!(rules.decide(ProcessKind::Branch, "web"), InstanceReuse::Call);
/// assert_eq!(rules.decide(ProcessKind::Cortex, "files"), InstanceReuse::Call);
/// assert_eq!(rules.decide(ProcessKind::Worker, "web"), InstanceReuse::Process);
/// assert_eq!(rules.decide(ProcessKind::Worker, "shell"), InstanceReuse::Call);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReuseRules {
    by_kind: BTreeMap<ProcessKind, InstanceReuse>,
    by_plugin: BTreeMap<String, InstanceReuse>,
}

impl ReuseRules {
    /// The rules with `kind`'s processes choosing `reuse` for every plugin.
    pub fn with_kind(mut self, kind: ProcessKind, reuse: InstanceReuse) -> Self {
        self.by_kind.insert(kind, reuse);
        self
    }

    /// The rules with `plugin` (its file name without `.wasm`) choosing `reuse`.
    pub fn with_plugin(mut self, plugin: impl Into<String>, reuse: InstanceReuse) -> Self {
        self.by_plugin.insert(plugin.into(), reuse);
        self
    }

    /// How a `kind` process's calls of `plugin` get their instance.
    pub fn decide(&self, kind: ProcessKind, plugin: &str) -> InstanceReuse {
        let choices = [self.by_kind.get(&kind), self.by_plugin.get(plugin)];
        if choices.contains(&Some(&InstanceReuse::Call)) {
            InstanceReuse::Call
        } else if choices.contains(&Some(&InstanceReuse::Process)) {
            InstanceReuse::Process
        } else {
            InstanceReuse::Call
        }
    }

    /// The kind's own choice, if it makes one.
    pub fn for_kind(&self, kind: ProcessKind) -> Option<InstanceReuse> {
        self.by_kind.get(&kind).copied()
    }

    /// The plugins with a choice of their own, by name.
    pub fn plugins(&self) -> impl Iterator<Item = (&str, InstanceReuse)> {
        self.by_plugin
            .iter()
            .map(|(name, reuse)| (name.as_str(), *reuse))
    }
}
