//! [`Sink`]: where a call's arguments can end up, and what the call does ([`Effect`]).

use capstan_caps::{Capability, Effect};

use super::label::{Label, Scope};

/// Where a call's arguments can end up: its effect, and who outside the host reads them.
///
/// ```
/// use capstan_host::flow::{Effect, Label, Scope, Sink};
///
/// let bank = Sink::mcp("bank", Effect::Send);
/// assert!(bank.leaked(&Label::private(Scope::Mcp("bank".into()))).is_none());
/// let notes = Label::private(Scope::Workspace);
/// assert_eq!(bank.leaked(&notes).unwrap().confidentiality_text(), "private(workspace)");
/// assert!(Sink::local(Effect::WriteLocal).leaked(&notes).is_none());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sink {
    /// What the call does.
    pub effect: Effect,
    /// Who outside the host reads its arguments; `None`: nobody, they stay in the host.
    pub outside: Option<Outside>,
}

/// Who outside the host reads a call's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outside {
    /// The MCP server the call goes to, which may read back what it sent.
    pub server: Option<String>,
    /// What the arguments reach, as a person reads it (`mcp:bank`, `the network`).
    pub reaches: String,
}

impl Sink {
    /// A call whose arguments stay in the host.
    pub fn local(effect: Effect) -> Sink {
        Sink {
            effect,
            outside: None,
        }
    }

    /// A call of a tool of MCP server `server`, which reads its arguments.
    pub fn mcp(server: &str, effect: Effect) -> Sink {
        Sink {
            effect,
            outside: Some(Outside {
                server: Some(server.to_owned()),
                reaches: format!("the MCP server `{server}`"),
            }),
        }
    }

    /// The sink of a plugin tool running with `capabilities` (declared and granted): its
    /// arguments leave the host if it holds a `net:` rule.
    pub fn plugin(capabilities: &[Capability], declared: Option<Effect>) -> Sink {
        let effect = Effect::derived(capabilities).max(declared.unwrap_or_default());
        let mut net = capabilities
            .iter()
            .filter_map(|cap| match cap {
                Capability::Net(rule) => Some(rule.to_string()),
                _ => None,
            })
            .peekable();
        if net.peek().is_none() {
            return Sink::local(effect);
        }
        let rules: Vec<String> = net.collect();
        Sink {
            effect,
            outside: Some(Outside {
                server: None,
                reaches: format!("the network ({})", rules.join(", ")),
            }),
        }
    }

    /// The part of `label` this sink may not carry: the private scopes and secrets of data
    /// that would reach readers it is not meant for. `None`: nothing leaks.
    ///
    /// Data derived from a secret has no reader outside the host: holding the secret is
    /// no sign of where its data may go (a tool granted a secret for one API may reach
    /// other hosts too).
    pub fn leaked(&self, label: &Label) -> Option<Label> {
        let outside = self.outside.as_ref()?;
        let mut leaked = Label::default();
        for scope in label.scopes() {
            let own =
                matches!((scope, &outside.server), (Scope::Mcp(s), Some(server)) if s == server);
            if !own {
                leaked.join(&Label::private(scope.clone()));
            }
        }
        for secret in label.secrets() {
            leaked.join(&Label::secret(secret));
        }
        if label.names_fewer_than_it_holds() && leaked.is_clear() {
            // Unnamed scopes may be anything: the sink is not known to be among them.
            leaked = label.confidentiality();
        }
        (!leaked.is_clear()).then_some(leaked)
    }
}
