//! [`FlowRules`]: what a profile does with a call that data could drive where it should
//! not go (`[profiles.NAME.flow]`).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// What the host does with a call a flow rule catches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// It runs.
    Allow,
    /// It waits for a person's approval of these exact arguments.
    Approve,
    /// It is refused, with the reason, and the model goes on.
    Refuse,
}

impl Action {
    /// Every action, in the order the config lists them.
    pub const ALL: [Action; 3] = [Action::Refuse, Action::Approve, Action::Allow];

    /// Its name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Approve => "approve",
            Action::Refuse => "refuse",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Action {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Action::ALL
            .into_iter()
            .find(|action| action.as_str() == text)
            .ok_or_else(|| format!("`{text}` is not a flow action; use refuse, approve or allow"))
    }
}

/// One rule of a profile's flow: which combination of data and effect it catches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowRule {
    /// A call that writes what the host keeps (files, tasks, memory) from a process that
    /// has read untrusted data.
    UntrustedWrite,
    /// A call that sends (its effect is `send`), or writes with arguments that reach an
    /// outside program, from a process that has read untrusted data. A read that reaches
    /// outside (a GET, an MCP tool its server marks read-only) is not one: only
    /// [`FlowRule::Leak`] guards what its arguments carry.
    UntrustedSend,
    /// A call that would carry private or secret data to readers outside its own.
    Leak,
}

impl FlowRule {
    /// Every rule, in the config's order.
    pub const ALL: [FlowRule; 3] = [
        FlowRule::UntrustedWrite,
        FlowRule::UntrustedSend,
        FlowRule::Leak,
    ];

    /// Its key in `[profiles.NAME.flow]`.
    pub fn key(self) -> &'static str {
        match self {
            FlowRule::UntrustedWrite => "untrusted_write",
            FlowRule::UntrustedSend => "untrusted_send",
            FlowRule::Leak => "leak",
        }
    }

    /// What it catches, in a few words.
    pub fn catches(self) -> &'static str {
        match self {
            FlowRule::UntrustedWrite => "a local write after reading untrusted data",
            FlowRule::UntrustedSend => "a send after reading untrusted data",
            FlowRule::Leak => "private or secret data to readers outside its own",
        }
    }
}

impl fmt::Display for FlowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// A profile's flow rules: the action for each [`FlowRule`].
///
/// The default keeps the rule of two: a process that has read untrusted data never sends,
/// and private or secret data never reaches a reader outside its own, without a person's
/// approval. A local write after untrusted data is allowed: whoever reads what it wrote
/// back through a plugin reads it as untrusted, by that plugin's label.
///
/// ```
/// use capstan_host::flow::{Action, FlowRule, FlowRules};
///
/// let rules = FlowRules::default();
/// assert_eq!(rules.action(FlowRule::UntrustedWrite), Action::Allow);
/// assert_eq!(rules.action(FlowRule::UntrustedSend), Action::Approve);
/// assert_eq!(rules.action(FlowRule::Leak), Action::Approve);
/// assert!(FlowRules::off().is_off());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct FlowRules {
    /// See [`FlowRule::UntrustedWrite`].
    pub untrusted_write: Action,
    /// See [`FlowRule::UntrustedSend`].
    pub untrusted_send: Action,
    /// See [`FlowRule::Leak`].
    pub leak: Action,
}

impl Default for FlowRules {
    fn default() -> Self {
        FlowRules {
            untrusted_write: Action::Allow,
            untrusted_send: Action::Approve,
            leak: Action::Approve,
        }
    }
}

impl FlowRules {
    /// Every rule allowing: labels are kept, nothing is checked.
    pub fn off() -> Self {
        FlowRules {
            untrusted_write: Action::Allow,
            untrusted_send: Action::Allow,
            leak: Action::Allow,
        }
    }

    /// Whether every rule allows.
    pub fn is_off(&self) -> bool {
        FlowRule::ALL
            .into_iter()
            .all(|rule| self.action(rule) == Action::Allow)
    }

    /// The action for `rule`.
    pub fn action(&self, rule: FlowRule) -> Action {
        match rule {
            FlowRule::UntrustedWrite => self.untrusted_write,
            FlowRule::UntrustedSend => self.untrusted_send,
            FlowRule::Leak => self.leak,
        }
    }

    /// Sets the action for `rule`.
    pub fn set(&mut self, rule: FlowRule, action: Action) {
        match rule {
            FlowRule::UntrustedWrite => self.untrusted_write = action,
            FlowRule::UntrustedSend => self.untrusted_send = action,
            FlowRule::Leak => self.leak = action,
        }
    }
}
