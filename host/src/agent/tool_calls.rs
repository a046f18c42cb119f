//! The tools a process is offered and how its calls reach them: host tools are answered by
//! the process itself; plugin tools go through the registry with the process kind's
//! grants; a tool that was not offered is refused. Each outcome is reported as an event.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;

use super::context::{Context, SpawnOutcome};
use super::events::Event;
use super::host_tools::{HOST_TOOLS, HostCall, SpawnArgs, host_tool};
use super::process_calls::ProcessCalls;
use super::turn::ToolOutcome;
use crate::config::Config;
use crate::ids::ProcessId;
use crate::llm::ToolDef;
use crate::plugin::{CallRequest, Registry, ToolError};
use crate::policy::{Decision, ProcessKind, ToolNeeds};

impl Context {
    /// The tools a `kind` process is offered, host tools and plugin tools alike: exactly
    /// those its profile names and grants the capabilities of. Worked out once per kind
    /// ([`Context::new`]); every request of that kind shares the list.
    pub(crate) fn tool_defs(&self, kind: ProcessKind) -> Arc<[ToolDef]> {
        let at = ProcessKind::ALL.iter().position(|k| *k == kind);
        self.tool_defs[at.expect("every kind is in ALL")].clone()
    }

    /// The tools a `kind` process is offered, worked out from the policy and the registry.
    pub(crate) fn offered_tools(
        config: &Config,
        registry: &Registry,
        kind: ProcessKind,
    ) -> Arc<[ToolDef]> {
        let policy = &config.policy;
        let offered = |name: &str, caps| {
            policy.decide(
                kind,
                name,
                Some(ToolNeeds {
                    name,
                    capabilities: caps,
                }),
            ) == Decision::Offered
        };
        let host = HOST_TOOLS
            .iter()
            .filter(|tool| offered(tool.name, &[]))
            .map(|tool| tool.def());
        let plugins = registry
            .tools()
            .filter(|tool| offered(&tool.name, &tool.capabilities))
            .map(|tool| ToolDef {
                name: tool.name.clone(),
                description: tool.description.clone(),
                parameters: tool.args_schema.clone(),
            });
        host.chain(plugins).collect()
    }

    /// Answers a call of tool `name` that `caller` was offered: a host tool among
    /// `handled` (the process's own) is parsed and run by `run` (`None`: not handled after
    /// all); any other name goes to the plugins, unparsed.
    pub(crate) async fn answer<R>(
        &self,
        caller: &ProcessId,
        calls: &ProcessCalls,
        name: &str,
        arguments: &str,
        handled: &[&str],
        run: impl FnOnce(HostCall) -> R,
    ) -> ToolOutcome
    where
        R: Future<Output = Option<Result<ToolOutcome, ToolError>>>,
    {
        let ran = match HostCall::parse(name, arguments) {
            Some(Ok(call)) if handled.contains(&name) => run(call).await,
            Some(Err(err)) if handled.contains(&name) => Some(Err(err)),
            _ => None,
        };
        match ran {
            Some(Ok(outcome)) => outcome,
            Some(Err(err)) => ToolOutcome::Continue(self.tool_error(caller, calls, name, err)),
            // A plugin tool its profile offers, or a host tool that is not this process's
            // (the registry answers not-found, audited).
            None => ToolOutcome::Continue(self.call_plugin(caller, calls, name, arguments).await),
        }
    }

    /// Runs plugin tool `name` for process `caller`, with its kind's grants, in the
    /// caller's own kept instance where its profile reuses the plugin's. Errors come back as
    /// text for the model ([`ToolError::for_model`]).
    pub(crate) async fn call_plugin(
        &self,
        caller: &ProcessId,
        calls: &ProcessCalls,
        name: &str,
        arguments: &str,
    ) -> String {
        let kind = caller.kind();
        let caller_name = caller.to_string();
        let workspace: PathBuf = self.config.agent.workspace.clone();
        let grants = self
            .config
            .policy
            .profile(kind)
            .grants_for(name)
            .into_owned();
        let request = CallRequest {
            tool: name,
            args_json: arguments,
            grants: &grants,
            workspace: Some(&workspace),
            caller: &caller_name,
            instances: Some(&calls.instances),
        };
        let recorded = self
            .registry
            .call_as_recorded(&self.config.policy, kind, request, std::future::pending())
            .await;
        let (result, audit) = recorded.into_parts();
        calls.note_audits(audit);
        if result.is_err() {
            // A failure's event may quote the guest's output: it leaves the host only once
            // the row is in. Failures are rare; the round's other rows share this commit.
            calls.committed().await;
        }
        match result {
            Ok(text) => {
                let called = Event::ToolCalled {
                    process: caller.clone(),
                    tool: name.to_owned(),
                };
                self.emit_to(&calls.audience, called);
                text
            }
            Err(err) => self.tool_error(caller, calls, name, err),
        }
    }

    /// The answer to a call of a tool `caller` was not offered: for a host tool, a denial
    /// with the policy's reason; for anything else, the registry's own (audited) refusal.
    pub(crate) async fn refuse(
        &self,
        caller: &ProcessId,
        calls: &ProcessCalls,
        name: &str,
        arguments: &str,
    ) -> String {
        if host_tool(name).is_none() {
            return self.call_plugin(caller, calls, name, arguments).await;
        }
        let kind = caller.kind();
        let decision = self.config.policy.decide(
            kind,
            name,
            Some(ToolNeeds {
                name,
                capabilities: &[],
            }),
        );
        self.tool_error(
            caller,
            calls,
            name,
            ToolError::Denied(format!(
                "tool `{name}` is not offered to a {kind} process: {decision}"
            )),
        )
    }

    /// Reports `err` from tool `name` called by `caller` (with `calls`), and returns the
    /// text the model is shown.
    pub(crate) fn tool_error(
        &self,
        caller: &ProcessId,
        calls: &ProcessCalls,
        name: &str,
        err: ToolError,
    ) -> String {
        let shown = err.for_model();
        let process = caller.clone();
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
        self.emit_to(&calls.audience, event);
        shown
    }

    /// Runs the `spawn_worker` host tool for `channel`, on behalf of `requester` (a branch;
    /// `None`: the channel): the outcome as JSON for the model.
    pub(crate) async fn spawn_worker_tool(
        self: &Arc<Self>,
        channel: &ProcessId,
        requester: Option<&ProcessId>,
        args: SpawnArgs,
    ) -> Result<String, ToolError> {
        let outcome = self
            .spawn_worker(
                channel,
                requester,
                &args.task,
                args.interactive,
                args.task_number,
            )
            .await
            .map_err(|err| ToolError::InvalidArgs(format!("spawn_worker: {err}")))?;
        Ok(match outcome {
            SpawnOutcome::Spawned { worker } => {
                json!({ "spawned": true, "worker": worker, "task_number": args.task_number })
            }
            SpawnOutcome::Duplicate { existing } => json!({
                "spawned": false,
                "existing_worker": existing,
                "hint": format!("{existing} is already on this task; use route to send it more input"),
            }),
        }
        .to_string())
    }
}
