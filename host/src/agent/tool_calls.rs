//! How a process's tool calls are answered, the same way for every kind: the router sends a
//! host tool to the process's own [`HostTools`] as a typed [`HostCall`], a plugin tool to
//! the registry with the kind's grants, and refuses the rest. Each outcome is reported as
//! an event to the exchanges the process works for.

use super::audience::Scope;
use super::events::Event;
use super::inbox::RoutedMessage;
use super::model_gate::ModelGate;
use super::process_calls::ProcessCalls;
use super::reporter::Reporter;
use super::turn::{ToolHandler, ToolOutcome};
use crate::flow::{Carried, HandleId, Handles, Label};
use crate::ids::ProcessId;
use crate::llm::BoxFuture;
use crate::plugin::ToolError;
use crate::telemetry::spans::{self, ToolSite};
use crate::tools::{AskArgs, Decided, HostCall, HostTool, Read, Routed, ToolRouter};

/// What a process does with the host tools its kind runs
/// ([`HostTool::run_by`](crate::tools::HostTool::run_by)): the router hands it only those.
pub(crate) trait HostTools: Send + Sync {
    /// Runs host tool `call`, made by a model that had read what is labelled `context`
    /// (what it hands another process, a task or a routed message, carries it).
    fn run<'a>(
        &'a self,
        call: HostCall,
        context: &'a Label,
    ) -> BoxFuture<'a, Result<ToolOutcome, ToolError>>;

    /// Messages that arrived for the process while it worked, taken at a turn boundary.
    fn injected(&self) -> Vec<RoutedMessage> {
        Vec::new()
    }
}

/// A process of a kind that runs no host tool (the compactor).
pub(crate) struct NoHostTools;

impl HostTools for NoHostTools {
    fn run<'a>(
        &'a self,
        call: HostCall,
        _: &'a Label,
    ) -> BoxFuture<'a, Result<ToolOutcome, ToolError>> {
        let tool = call.tool();
        Box::pin(async move {
            Err(ToolError::Denied(format!(
                "`{tool}` is not a tool of this process"
            )))
        })
    }
}

/// The tool calls of one process: routed by the agent's [`ToolRouter`] (the gate's),
/// host tools run by `host`, each outcome told to the exchanges that follow `scope`.
pub(crate) struct ProcessTools<'a> {
    gate: &'a ModelGate,
    router: &'a ToolRouter,
    reporter: &'a Reporter,
    caller: &'a ProcessId,
    calls: &'a ProcessCalls,
    scope: &'a Scope,
    host: &'a dyn HostTools,
}

impl<'a> ProcessTools<'a> {
    /// The calls of process `caller`, routed by `gate`'s router and told through
    /// `reporter`, sharing `calls`, as part of the work `scope`, its host tools run by
    /// `host`.
    pub(crate) fn new(
        gate: &'a ModelGate,
        reporter: &'a Reporter,
        caller: &'a ProcessId,
        calls: &'a ProcessCalls,
        scope: &'a Scope,
        host: &'a dyn HostTools,
    ) -> Self {
        ProcessTools {
            gate,
            router: gate.router(),
            reporter,
            caller,
            calls,
            scope,
            host,
        }
    }

    async fn answer(
        &self,
        name: &str,
        arguments: &str,
        context: &Label,
        handles: &Handles,
    ) -> (ToolOutcome, Label) {
        let asking = name == HostTool::AskAbout.name();
        let raised;
        let handles = if handles.is_empty() || !arguments.contains("$h") {
            handles
        } else {
            raised = self.vouch(name, arguments, asking, handles).await;
            &raised
        };
        // A handle's value goes in where the model named it, and the call carries its
        // label; `ask_about` names the handle it asks about, which stays a name.
        let substituted = if asking || handles.is_empty() {
            Ok(None)
        } else {
            handles.substitute(arguments)
        };
        let substituted = match substituted {
            Ok(substituted) => substituted,
            Err(unknown) => {
                let refusal = ToolError::InvalidArgs(format!("{name}: {unknown}"));
                let recorded = self
                    .router
                    .refuse(
                        self.caller,
                        Some(&self.calls.conversation),
                        name,
                        arguments,
                        (refusal, None),
                    )
                    .await;
                let (result, audit) = recorded.into_parts();
                self.calls.note_audits(audit);
                self.calls.committed().await;
                let text = result.unwrap_or_else(|err| self.failed(name, err));
                return (ToolOutcome::Continue(text), Label::trusted());
            }
        };
        let read = match &substituted {
            Some(substituted) => Read {
                context,
                carried: &substituted.label,
                handles: &substituted.used,
                conversation: None,
            },
            None => Read::context(context),
        }
        .in_conversation(&self.calls.conversation);
        let arguments = substituted.as_ref().map_or(arguments, |s| &s.arguments);
        self.run_routed(name, arguments, read, handles).await
    }

    /// `handles`, with the values a person endorsed that the call of `name` with
    /// `arguments` names raised to trusted (their confidentiality stays): each such use
    /// is a row of the audit chain first, and a value whose use cannot be recorded stays
    /// as it was.
    async fn vouch(&self, name: &str, arguments: &str, asking: bool, handles: &Handles) -> Handles {
        let endorsements = self.router.endorsed(self.caller).await;
        if endorsements.is_empty() {
            return handles.clone();
        }
        let named: Vec<Carried> = if asking {
            serde_json::from_str::<serde_json::Value>(arguments)
                .ok()
                .and_then(|args| args["handle"].as_str()?.trim().parse().ok())
                .and_then(|id| handles.carried(id))
                .into_iter()
                .collect()
        } else {
            match handles.substitute(arguments) {
                Ok(Some(substituted)) => substituted.used,
                _ => Vec::new(),
            }
        };
        let mut vouched = Vec::new();
        for endorsement in endorsements.iter().filter(|e| named.contains(&e.value)) {
            if !vouched.contains(&endorsement.value)
                && self.router.vouched(self.caller, name, endorsement).await
            {
                vouched.push(endorsement.value);
            }
        }
        handles.clone().endorsed(&vouched)
    }

    /// [`ProcessTools::answer`] of a call whose arguments hold the values of the handles
    /// named in them.
    async fn run_routed(
        &self,
        name: &str,
        arguments: &str,
        read: Read<'_>,
        handles: &Handles,
    ) -> (ToolOutcome, Label) {
        let (context, carried) = (read.context, read.carried);
        let route = || {
            self.router.route(
                self.caller,
                Some(&self.calls.instances),
                name,
                arguments,
                read,
            )
        };
        let mut routed = route().await;
        // A parked call waits for a person; once approved, it is routed again and runs on
        // the approval's lease.
        while let Routed::Parked(approval) = routed {
            let requested = Event::ApprovalRequested {
                process: self.caller.clone(),
                tool: name.to_owned(),
                approval: approval.id,
                reason: approval.reason.clone(),
            };
            self.reporter.emit_to(self.scope, requested);
            match self
                .router
                .decision(&approval, std::future::pending())
                .await
            {
                Decided::Approved(_) => routed = route().await,
                // The host's own words, quoting no argument.
                undecided => {
                    let refusal = ToolError::Denied(undecided.refusal(name));
                    let text = self.failed(name, refusal);
                    return (ToolOutcome::Continue(text), Label::trusted());
                }
            }
        }
        // A failure's text is the host's or the tool's; it is labelled as its result would be.
        let mut label = Label::trusted();
        let mut tool_ran = false;
        let result = match routed {
            Routed::Host(HostCall::AskAbout(args)) => {
                let mut span = spans::tool(name, None, ToolSite::Host);
                match span.parent().scope(self.ask_about(&args, handles)).await {
                    Ok((text, answered)) => {
                        label = answered;
                        self.reporter.emit_to(
                            self.scope,
                            Event::ToolCalled {
                                process: self.caller.clone(),
                                tool: name.to_owned(),
                            },
                        );
                        Ok(text)
                    }
                    Err(err) => {
                        span.fail(err.kind());
                        Err(err)
                    }
                }
            }
            Routed::Host(call) => {
                // What the process hands on carries what it read and the handles it passed.
                let handed = context.clone().joined(carried);
                let mut span = spans::tool(name, None, ToolSite::Host);
                // A worker or branch it starts is a child of this call.
                let ran = span.parent().scope(self.host.run(call, &handed)).await;
                if let Err(err) = &ran {
                    span.fail(err.kind());
                }
                match ran {
                    Ok(outcome) => return (outcome, label.joined(carried)),
                    Err(err) => Err(err),
                }
            }
            Routed::Parked(_) => unreachable!("a parked call is waited for above"),
            Routed::Ran {
                recorded,
                label: labelled,
                ran,
            } => {
                label = labelled;
                tool_ran = ran;
                let (result, audit) = recorded.into_parts();
                self.calls.note_audits(audit);
                if result.is_err() {
                    // A failure's event may quote the guest's output: it leaves the host
                    // only once the row is in. Failures are rare; the round's other rows
                    // share this commit.
                    self.calls.committed().await;
                }
                result.inspect(|_| {
                    let called = Event::ToolCalled {
                        process: self.caller.clone(),
                        tool: name.to_owned(),
                    };
                    self.reporter.emit_to(self.scope, called);
                })
            }
        };
        // Whatever else comes back (a result, an error quoting the arguments, a reply or a
        // report made of them) may hold the values put in: it carries their label, and a
        // result the profile holds is held again. A denial before the tool ran is the
        // host's words (the flow rules, the grants), which quote no argument, so the model
        // reads why; a tool's own denial is the tool's words.
        if tool_ran || !matches!(result, Err(ToolError::Denied(_))) {
            label.join(carried);
        }
        let text = result.unwrap_or_else(|err| self.failed(name, err));
        (ToolOutcome::Continue(text), label)
    }

    /// Answers `ask_about`: the question put to a quarantined model about the handle's
    /// value, and the answer, labelled as the value is.
    async fn ask_about(
        &self,
        args: &AskArgs,
        handles: &Handles,
    ) -> Result<(String, Label), ToolError> {
        let invalid = |msg: String| ToolError::InvalidArgs(format!("ask_about: {msg}"));
        let question = args.question()?;
        let id: HandleId = args
            .handle
            .trim()
            .parse()
            .map_err(|err| invalid(format!("{err}")))?;
        let (value, label) = handles
            .get(id)
            .ok_or_else(|| invalid(handles.unknown(id)))?;
        let answer = self
            .gate
            .ask_quarantined(self.caller, &question, value)
            .await?;
        let text = serde_json::json!({ "handle": id.to_string(), "answer": answer }).to_string();
        Ok((text, label.clone()))
    }

    /// Reports `err` from tool `name`, and returns the text the model is shown.
    fn failed(&self, name: &str, err: ToolError) -> String {
        let shown = err.for_model();
        let process = self.caller.clone();
        let tool = name.to_owned();
        let event = match err {
            ToolError::Denied(reason) => Event::ToolDenied {
                process,
                tool,
                reason,
            },
            error => Event::ToolFailed {
                process,
                tool,
                error,
            },
        };
        self.reporter.emit_to(self.scope, event);
        shown
    }
}

impl ToolHandler for ProcessTools<'_> {
    fn calls(&self) -> Option<&ProcessCalls> {
        Some(self.calls)
    }

    fn refuse<'b>(&'b self, name: &'b str, arguments: &'b str) -> BoxFuture<'b, String> {
        Box::pin(async move {
            // Not offered, so the router refuses it before anything reads the context.
            let none = Handles::default();
            match self
                .answer(name, arguments, &Label::trusted(), &none)
                .await
                .0
            {
                ToolOutcome::Continue(text) => text,
                // Not offered, so the router refused it; nothing else can come back.
                ToolOutcome::EndTurn(text) | ToolOutcome::Delivered(text) => text,
            }
        })
    }

    fn injected(&self) -> Vec<RoutedMessage> {
        self.host.injected()
    }

    fn handle<'b>(
        &'b self,
        name: &'b str,
        arguments: &'b str,
        context: &'b Label,
        handles: &'b Handles,
    ) -> BoxFuture<'b, (ToolOutcome, Label)> {
        Box::pin(self.answer(name, arguments, context, handles))
    }

    fn holds(&self, name: &str, text: &str, label: &Label) -> bool {
        // A host tool's result is the host's own words (an answer to `ask_about` is typed).
        HostTool::named(name).is_none()
            && self
                .router
                .catalog()
                .policy()
                .profile(self.caller.kind())
                .holding()
                .holds(text, label)
    }
}
