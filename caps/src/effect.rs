//! [`Effect`]: what a call of a tool does to the world. Not a capability: it is never
//! granted, only declared (as `effect:send` in a tool's list) and derived.

use std::fmt;
use std::str::FromStr;

use crate::Capability;

/// The prefix of an effect in a tool's declared list: `effect:send`.
pub const EFFECT_PREFIX: &str = "effect:";

/// What a call of a tool does, from least to most consequential.
///
/// A tool declares its effect (a plugin in `describe()`, as `effect:send` among its
/// capabilities, which [`Effect::declared`] reads; an MCP server by its `readOnlyHint`);
/// the host derives a floor from the capabilities ([`Effect::derived`]), and the effect is
/// the higher of the two, so no tool can declare itself below what it is able to do.
///
/// ```
/// use capstan_caps::Effect;
///
/// let caps = ["fs.read".parse().unwrap(), "fs.write".parse().unwrap()];
/// assert_eq!(Effect::derived(&caps), Effect::WriteLocal);
/// let post = ["net:POST api.example.com".parse().unwrap()];
/// assert_eq!(Effect::derived(&post), Effect::Send);
/// let get = ["net:GET api.example.com".parse().unwrap()];
/// assert_eq!(Effect::derived(&get), Effect::Read);
/// assert_eq!(Effect::Read.max(Effect::Send), Effect::Send);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Effect {
    /// Reads, changes nothing.
    #[default]
    Read,
    /// Changes what the host keeps: workspace files, tasks, memory.
    WriteLocal,
    /// Reaches a person or a program outside the host: a request that changes something
    /// there, a message, a payment.
    Send,
}

impl Effect {
    /// Every effect, least first.
    pub const ALL: [Effect; 3] = [Effect::Read, Effect::WriteLocal, Effect::Send];

    /// The least effect a tool declaring `capabilities` can have: `fs.write`,
    /// `tasks.write`, `tasks.write-own` and `memory.write` write locally; a `net:` rule for
    /// any method but GET and HEAD sends.
    pub fn derived(capabilities: &[Capability]) -> Effect {
        capabilities
            .iter()
            .map(|cap| match cap {
                Capability::FsWrite
                | Capability::TasksWrite
                | Capability::TasksWriteOwn
                | Capability::MemoryWrite => Effect::WriteLocal,
                Capability::Net(rule) => match rule.method.as_deref() {
                    Some("GET" | "HEAD") => Effect::Read,
                    _ => Effect::Send,
                },
                _ => Effect::Read,
            })
            .max()
            .unwrap_or(Effect::Read)
    }

    /// Its name, as a tool declares it: `read`, `write-local`, `send`.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Read => "read",
            Effect::WriteLocal => "write-local",
            Effect::Send => "send",
        }
    }

    /// The effect a tool's declared list names (`effect:read`, `effect:write-local`,
    /// `effect:send`), if `entry` is one: `None` for any other entry (a capability),
    /// `Some(Err)` for an `effect:` entry that names no effect.
    ///
    /// ```
    /// use capstan_caps::Effect;
    ///
    /// assert_eq!(Effect::declared("effect:send"), Some(Ok(Effect::Send)));
    /// assert_eq!(Effect::declared("fs.read"), None);
    /// assert!(Effect::declared("effect:launch").unwrap().is_err());
    /// ```
    pub fn declared(entry: &str) -> Option<Result<Effect, ParseEffectError>> {
        entry.strip_prefix(EFFECT_PREFIX).map(str::parse)
    }

    /// Its entry in a tool's declared list: `effect:send`.
    pub fn declaration(self) -> String {
        format!("{EFFECT_PREFIX}{}", self.as_str())
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that is not an effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseEffectError(String);

impl fmt::Display for ParseEffectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` is not an effect; use read, write-local or send",
            self.0
        )
    }
}

impl std::error::Error for ParseEffectError {}

impl FromStr for Effect {
    type Err = ParseEffectError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Effect::ALL
            .into_iter()
            .find(|effect| effect.as_str() == text)
            .ok_or_else(|| ParseEffectError(text.to_owned()))
    }
}
