//! The check at the sink: whether a call may run given what its process has read and
//! where its arguments go.

use std::borrow::Cow;
use std::fmt;

use super::Effect;
use super::effect::Sink;
use super::label::Label;
use super::rules::{Action, FlowRule, FlowRules};
use crate::ids::ProcessKind;
use crate::text::{MAX_ECHOED_NAME, echo_name};

/// A call about to run, as the flow check sees it.
#[derive(Debug, Clone, Copy)]
pub struct FlowCall<'a> {
    /// The kind of process calling.
    pub kind: ProcessKind,
    /// The tool called.
    pub tool: &'a str,
    /// What the process has read: the join of the labels of every message of the request
    /// the model answered with this call.
    pub context: &'a Label,
    /// The labels of data the host puts into the arguments beyond what the model wrote
    /// (handles); clear when there is none.
    pub arguments: &'a Label,
    /// Where the arguments go.
    pub sink: &'a Sink,
}

impl FlowCall<'_> {
    /// What the arguments may carry: anything the process read, and any handle's value.
    pub fn carried(&self) -> Cow<'_, Label> {
        if self.arguments.is_clear() {
            Cow::Borrowed(self.context)
        } else {
            Cow::Owned(self.context.clone().joined(self.arguments))
        }
    }
}

/// One rule a call met, and the part of a label that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caught {
    /// The rule.
    pub rule: FlowRule,
    /// What the profile does about it.
    pub action: Action,
    /// The data that made the rule apply: the untrusted origins read, or the private
    /// scopes and secrets that would leave.
    pub because: Label,
}

/// The flow check's decision about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowDecision {
    /// What happens to the call: the strictest action of the rules it met (allow if none).
    pub action: Action,
    /// The rules it met, allowed ones included (each is an audit fact).
    pub caught: Vec<Caught>,
    kind: ProcessKind,
}

impl FlowDecision {
    /// Whether the call runs as it is.
    pub fn allows(&self) -> bool {
        self.action == Action::Allow
    }

    /// The data that made the decision: the join of what made each rule of its action
    /// apply (clear for a call allowed by no rule).
    pub fn because(&self) -> Label {
        self.caught
            .iter()
            .filter(|c| c.action == self.action)
            .fold(Label::default(), |label, c| label.joined(&c.because))
    }

    /// Why, as the model and a person read it, for the call of `tool` to `sink` it
    /// decided: the tool, its effect, what it met, and the key that changes it.
    pub fn explained<'a>(&'a self, tool: &'a str, sink: &'a Sink) -> Explained<'a> {
        Explained {
            decision: self,
            tool,
            sink,
        }
    }
}

/// A [`FlowDecision`] with the call it decided, to display.
#[derive(Debug, Clone, Copy)]
pub struct Explained<'a> {
    decision: &'a FlowDecision,
    tool: &'a str,
    sink: &'a Sink,
}

/// Decides call `call` by `rules`.
///
/// ```
/// use capstan_host::flow::{check, Action, Effect, FlowCall, FlowRules, Label, Origin, Sink};
/// use capstan_host::policy::ProcessKind;
///
/// let page = Label::untrusted(Origin::Net("example.com".into()));
/// let send = Sink::mcp("mail", Effect::Send);
/// let call = FlowCall {
///     kind: ProcessKind::Worker,
///     tool: "mail.send",
///     context: &page,
///     arguments: &Label::default(),
///     sink: &send,
/// };
/// let decision = check(&FlowRules::default(), &call);
/// assert_eq!(decision.action, Action::Approve);
/// let why = decision.explained("mail.send", &send).to_string();
/// assert!(why.contains("untrusted_send"), "{why}");
/// assert!(check(&FlowRules::off(), &call).allows());
/// ```
pub fn check(rules: &FlowRules, call: &FlowCall<'_>) -> FlowDecision {
    let mut caught = Vec::new();
    let mut catch = |rule: FlowRule, because: Label| {
        caught.push(Caught {
            rule,
            action: rules.action(rule),
            because,
        });
    };
    let untrusted = !call.context.is_trusted() || !call.arguments.is_trusted();
    if call.context.is_clear() && call.arguments.is_clear() {
        // The usual call: nothing read but the user's words; nothing to catch.
        return FlowDecision {
            action: Action::Allow,
            caught: Vec::new(),
            kind: call.kind,
        };
    }
    let carried = call.carried();
    if untrusted {
        let read = carried.integrity();
        if call.sink.effect == Effect::Send || call.sink.outside.is_some() {
            // A read from outside is no send (only the leak rule guards its arguments),
            // unless its arguments carry an untrusted handle's value.
            if call.sink.effect != Effect::Read || !call.arguments.is_trusted() {
                catch(FlowRule::UntrustedSend, read);
            }
        } else if call.sink.effect == Effect::WriteLocal {
            catch(FlowRule::UntrustedWrite, read);
        }
    }
    if let Some(leaked) = call.sink.leaked(&carried) {
        catch(FlowRule::Leak, leaked);
    }
    let action = caught
        .iter()
        .map(|c| c.action)
        .max_by_key(|action| match action {
            Action::Allow => 0,
            Action::Approve => 1,
            Action::Refuse => 2,
        })
        .unwrap_or(Action::Allow);
    FlowDecision {
        action,
        caught,
        kind: call.kind,
    }
}

impl fmt::Display for Explained<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Explained {
            decision,
            tool,
            sink,
        } = *self;
        let tool = echo_name(tool, MAX_ECHOED_NAME);
        let kind = decision.kind;
        let what = match decision.action {
            Action::Allow => "is allowed",
            Action::Approve => "needs a person's approval",
            Action::Refuse => "is refused",
        };
        write!(f, "`{tool}` ({}", sink.effect)?;
        if let Some(outside) = &sink.outside {
            write!(f, ", to {}", outside.reaches)?;
        }
        write!(f, ") {what} for a {kind} process")?;
        let mut first = true;
        for caught in decision
            .caught
            .iter()
            .filter(|c| c.action == decision.action)
        {
            let sep = if first { ": " } else { "; " };
            first = false;
            match caught.rule {
                FlowRule::UntrustedWrite | FlowRule::UntrustedSend => write!(
                    f,
                    "{sep}it has read untrusted data (from {}), which could have told it to \
                     make this call",
                    origins(&caught.because)
                )?,
                FlowRule::Leak => write!(
                    f,
                    "{sep}its arguments could carry {} data to readers outside its own",
                    caught.because.confidentiality_text()
                )?,
            }
            write!(
                f,
                " ([profiles.{kind}.flow] {} = \"{}\")",
                caught.rule.key(),
                caught.action
            )?;
        }
        Ok(())
    }
}

/// The origins a label names, as a person reads them: `mcp:bank, net:example.com`.
fn origins(label: &Label) -> String {
    let named: Vec<String> = label.origins().map(ToString::to_string).collect();
    if named.is_empty() {
        "somewhere".to_owned()
    } else {
        named.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{Origin, Scope};

    fn decide(rules: &FlowRules, context: &Label, arguments: &Label, sink: &Sink) -> Action {
        let call = FlowCall {
            kind: ProcessKind::Worker,
            tool: "t",
            context,
            arguments,
            sink,
        };
        check(rules, &call).action
    }

    #[test]
    fn a_trusted_context_sends_and_writes_freely() {
        let rules = FlowRules::default();
        let clear = Label::default();
        for sink in [
            Sink::local(Effect::WriteLocal),
            Sink::mcp("mail", Effect::Send),
            Sink::mcp("mail", Effect::Read),
        ] {
            assert_eq!(decide(&rules, &clear, &clear, &sink), Action::Allow);
        }
    }

    #[test]
    fn an_untrusted_context_writes_locally_but_sends_only_with_approval() {
        let rules = FlowRules::default();
        let page = Label::untrusted(Origin::Net("example.com".into()));
        let clear = Label::default();
        assert_eq!(
            decide(&rules, &page, &clear, &Sink::local(Effect::WriteLocal)),
            Action::Allow
        );
        assert_eq!(
            decide(&rules, &page, &clear, &Sink::mcp("mail", Effect::Send)),
            Action::Approve
        );
        // Reading from an outside server after untrusted data is no send of it.
        assert_eq!(
            decide(&rules, &page, &clear, &Sink::mcp("mail", Effect::Read)),
            Action::Allow
        );
        let strict = FlowRules {
            untrusted_write: Action::Refuse,
            ..rules
        };
        assert_eq!(
            decide(&strict, &page, &clear, &Sink::local(Effect::WriteLocal)),
            Action::Refuse
        );
    }

    #[test]
    fn private_data_goes_back_only_to_its_own_readers() {
        let rules = FlowRules::default();
        let bank = Label::private(Scope::Mcp("bank".into()));
        let clear = Label::default();
        assert_eq!(
            decide(&rules, &bank, &clear, &Sink::mcp("bank", Effect::Send)),
            Action::Allow
        );
        assert_eq!(
            decide(&rules, &bank, &clear, &Sink::mcp("mail", Effect::Read)),
            Action::Approve
        );
        assert_eq!(
            decide(&rules, &bank, &clear, &Sink::local(Effect::WriteLocal)),
            Action::Allow
        );
    }

    #[test]
    fn secret_data_has_no_reader_outside_even_for_a_tool_holding_the_secret() {
        let caps: Vec<capstan_caps::Capability> = ["net:GET *", "secret:API_KEY"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        let fetch = Sink::plugin(&caps, None);
        assert_eq!(fetch.effect, Effect::Read);
        let derived = Label::secret("API_KEY");
        let clear = Label::default();
        assert_eq!(
            decide(&FlowRules::default(), &derived, &clear, &fetch),
            Action::Approve
        );
        assert_eq!(
            fetch.leaked(&derived).unwrap().confidentiality_text(),
            "secret(API_KEY)"
        );
    }

    #[test]
    fn the_strictest_rule_met_decides_and_its_key_is_named() {
        let rules = FlowRules {
            leak: Action::Refuse,
            ..FlowRules::default()
        };
        let both =
            Label::untrusted(Origin::Mcp("bank".into())).joined(&Label::private(Scope::Workspace));
        let call = FlowCall {
            kind: ProcessKind::Worker,
            tool: "bank.send_money",
            context: &both,
            arguments: &Label::default(),
            sink: &Sink::mcp("bank", Effect::Send),
        };
        let decision = check(&rules, &call);
        assert_eq!(decision.action, Action::Refuse);
        assert_eq!(decision.caught.len(), 2);
        assert_eq!(
            decision.explained(call.tool, call.sink).to_string(),
            "`bank.send_money` (send, to the MCP server `bank`) is refused for a worker \
             process: its arguments could carry private(workspace) data to readers \
             outside its own ([profiles.worker.flow] leak = \"refuse\")"
        );
    }
}
