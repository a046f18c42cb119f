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
use crate::flow::Label;
use crate::ids::ProcessId;
use crate::llm::BoxFuture;
use crate::plugin::ToolError;
use crate::tools::{Decided, HostCall, Routed, ToolRouter};

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
            router: gate.router(),
            reporter,
            caller,
            calls,
            scope,
            host,
        }
    }

    async fn answer(&self, name: &str, arguments: &str, context: &Label) -> (ToolOutcome, Label) {
        let route = || {
            self.router.route(
                self.caller,
                Some(&self.calls.instances),
                name,
                arguments,
                context,
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
                undecided => {
                    let refusal = ToolError::Denied(undecided.refusal(name));
                    let text = self.failed(name, refusal);
                    return (ToolOutcome::Continue(text), Label::trusted());
                }
            }
        }
        // A failure's text is the host's or the tool's; it is labelled as its result would be.
        let mut label = Label::trusted();
        let result = match routed {
            Routed::Host(call) => match self.host.run(call, context).await {
                Ok(outcome) => return (outcome, label),
                Err(err) => Err(err),
            },
            Routed::Parked(_) => unreachable!("a parked call is waited for above"),
            Routed::Ran {
                recorded,
                label: labelled,
            } => {
                label = labelled;
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
        let text = result.unwrap_or_else(|err| self.failed(name, err));
        (ToolOutcome::Continue(text), label)
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
            match self.answer(name, arguments, &Label::trusted()).await.0 {
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
    ) -> BoxFuture<'b, (ToolOutcome, Label)> {
        Box::pin(self.answer(name, arguments, context))
    }
}
