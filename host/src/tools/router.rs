//! [`ToolRouter`]: where a tool call goes. A host tool reaches the process that runs it as a
//! typed [`HostCall`]; a plugin or MCP tool goes to the registry with the caller kind's
//! grants; anything the caller was not offered is refused with the policy's reason. A
//! call the flow rules send to a person is parked (see [`super::approval`]) and runs
//! only on an approval that covers it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::catalog::ToolCatalog;
use super::host::{HostCall, HostTool};
use super::provenance::WorkspaceFiles;
use crate::flow::{Action, ArgsDigest, Carried, Label, Sink, WorkspaceLabel};
use crate::ids::{Caller, ProcessId, SessionKey};
use crate::net::GrantSource;
use crate::plugin::{
    CallRequest, CallTrace, ProcessInstances, Recorded, Registry, ToolError, Touched,
    check_args_object,
};
use crate::policy::{Decision, ProcessKind};
use crate::services::{
    Approval, Approvals, AuditChain, ChainEvent, ChainRecord, Endorsement, FileLabels, NewApproval,
};
use crate::telemetry::DenialReason;
use crate::text::{MAX_ECHOED_NAME, echo_name, one_line};

/// Where a call went.
#[derive(Debug)]
#[must_use = "a host call must be run, and a plugin call's audit row waited for"]
pub enum Routed {
    /// A host tool the caller's kind runs, its arguments parsed: the process runs it.
    Host(HostCall),
    /// A plugin or MCP tool, run (or refused) by the registry; or a host tool refused
    /// (not offered, arguments that do not fit, the flow rules). Audited either way.
    Ran {
        /// The call's result and its audit row.
        recorded: Recorded,
        /// The label of what it returns, from what the host knows of the call.
        label: Label,
        /// Whether the tool ran: a refusal before it is the host's own words, while
        /// anything a tool says (a denial of its own included) may quote its arguments.
        ran: bool,
    },
    /// Parked: the flow rules want a person's approval, and none covers this call yet.
    /// Nothing ran; the caller waits for the decision
    /// ([`ToolRouter::decision`]) and routes the call again.
    Parked(Box<Approval>),
}

/// Routes the tool calls of one agent (or one door to its tools) by its catalog.
///
/// ```no_run
/// # async fn demo(router: capstan_host::tools::ToolRouter) {
/// use capstan_host::ids::Caller;
/// use capstan_host::policy::ProcessKind;
///
/// let caller = Caller::client("example", None);
/// let recorded = router
///     .run(ProcessKind::Worker, &caller, None, "file_read", r#"{"path":"README.md"}"#, std::future::pending())
///     .await;
/// println!("{:?}", recorded.committed().await);
/// # }
/// ```
pub struct ToolRouter {
    catalog: Arc<ToolCatalog>,
    registry: Arc<Registry>,
    workspace: PathBuf,
    approvals: Option<ApprovalDesk>,
    files: Arc<WorkspaceFiles>,
}

/// A plugin call under way: if it is dropped before it ends (its process cancelled, or
/// out of time), the files it wrote are recorded all the same, with `writer` joined with
/// what it had read, on a task of their own.
struct Unfinished<'a> {
    files: Arc<WorkspaceFiles>,
    writer: Label,
    trace: Option<&'a CallTrace>,
}

impl Unfinished<'_> {
    /// The call ended: its caller labels what it touched.
    fn finished(mut self) {
        self.trace = None;
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        let Some(trace) = self.trace else {
            return;
        };
        let touched = trace.touched();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if touched.written.is_empty() {
            return;
        }
        let files = self.files.clone();
        let writer = self.writer.clone();
        runtime.spawn(async move {
            let read = files.read_label(&touched).await;
            files.record_written(&touched, &writer.joined(&read)).await;
        });
    }
}

/// Where parked calls go, and how long a call waits for a person.
struct ApprovalDesk {
    approvals: Arc<dyn Approvals>,
    chain: AuditChain,
    patience: Duration,
}

impl ToolRouter {
    /// A router over `registry`'s tools as `catalog` offers them, whose file capabilities
    /// apply to `workspace`.
    pub fn new(registry: Arc<Registry>, catalog: Arc<ToolCatalog>, workspace: PathBuf) -> Self {
        ToolRouter {
            catalog,
            registry,
            files: Arc::new(WorkspaceFiles::unrecorded(workspace.clone())),
            workspace,
            approvals: None,
        }
    }

    /// This router, labelling each workspace file a plugin call reads by the label
    /// recorded in `files` when a process wrote it (and recording the files calls write),
    /// or by `default` when no write of it was seen. Without it every file read takes
    /// the untrusted default, and nothing is recorded.
    pub fn with_file_labels(mut self, files: Arc<dyn FileLabels>, default: WorkspaceLabel) -> Self {
        self.files = Arc::new(WorkspaceFiles::new(self.workspace.clone(), files, default));
        self
    }

    /// This router, parking the calls the flow rules send to a person in `approvals`,
    /// each waiting up to `patience` for a decision, and adding each flow refusal to
    /// `chain`. Without it such a call is refused, saying it needs an approval.
    pub fn with_approvals(
        mut self,
        approvals: Arc<dyn Approvals>,
        chain: AuditChain,
        patience: Duration,
    ) -> Self {
        self.approvals = Some(ApprovalDesk {
            approvals,
            chain,
            patience,
        });
        self
    }

    /// Waits for a person to decide parked call `approval`, at most the router's
    /// patience, stopping early if `cancelled` completes; see
    /// [`approval::decision`](super::approval::decision).
    pub async fn decision(
        &self,
        approval: &Approval,
        cancelled: impl Future<Output = ()>,
    ) -> super::approval::Decided {
        match &self.approvals {
            Some(desk) => {
                super::approval::decision(&desk.approvals, approval, desk.patience, cancelled).await
            }
            None => super::approval::Decided::Lost("no approvals are kept".into()),
        }
    }

    /// The values a person endorsed for `process` ([`Approvals::endorsed`]); none when
    /// the router keeps no approvals, or the store cannot say (logged: the values stay
    /// as untrusted as they were).
    pub async fn endorsed(&self, process: &ProcessId) -> Vec<Endorsement> {
        let Some(desk) = &self.approvals else {
            return Vec::new();
        };
        desk.approvals
            .endorsed(process)
            .await
            .unwrap_or_else(|err| {
                tracing::warn!(%process, "the endorsed handles cannot be read: {err}");
                Vec::new()
            })
    }

    /// Records that a call of `tool` by `process` uses `endorsement`'s value as trusted:
    /// whether the record was made (if not, logged, the value stays untrusted).
    pub async fn vouched(
        &self,
        process: &ProcessId,
        tool: &str,
        endorsement: &Endorsement,
    ) -> bool {
        let Some(desk) = &self.approvals else {
            return false;
        };
        match desk.approvals.vouched(process, tool, endorsement).await {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(%process, "the use of an endorsed value is not recorded, so it stays untrusted: {err}");
                false
            }
        }
    }

    /// The catalog it routes by.
    pub fn catalog(&self) -> &Arc<ToolCatalog> {
        &self.catalog
    }

    /// The registry plugin calls go to.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The directory file capabilities apply to.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// Routes a model's call of tool `name` made by `caller`, with `arguments` as the
    /// model wrote them (with handles' values put in): a host tool its
    /// kind is offered comes back parsed, to be run by the caller; any other host tool is
    /// refused with the policy's reason; everything else goes as [`ToolRouter::run`]
    /// sends it, in the caller's `instances` where its profile keeps the plugin's. Every
    /// call passes the profile's flow rules first ([`crate::flow::check`]), with what the
    /// model had `read` and what the host put into its arguments.
    pub async fn route(
        &self,
        caller: &ProcessId,
        instances: Option<&ProcessInstances>,
        name: &str,
        arguments: &str,
        read: Read<'_>,
    ) -> Routed {
        let Read {
            context,
            carried,
            handles,
            conversation,
        } = read;
        let kind = caller.kind();
        if let Some(tool) = HostTool::named(name) {
            let (refusal, reason) = match self.catalog.decide(kind, name) {
                Decision::Offered => match HostCall::parse(name, arguments) {
                    Some(Ok(call)) => {
                        let sink = Sink::local(tool.effect());
                        let at = FlowAt {
                            kind,
                            process: Some(caller),
                            name,
                            arguments,
                            context,
                            carried,
                            handles,
                        };
                        match self.flow(at, &sink).await {
                            // A host tool's typed arguments refuse duplicate fields: the
                            // parsed call is the one approved.
                            Gate::Pass(_) => return Routed::Host(call),
                            Gate::Refused(refusal) => (refusal, Some(DenialReason::Flow)),
                            Gate::Parked(approval) => return Routed::Parked(approval),
                        }
                    }
                    Some(Err(err)) => (err, None),
                    None => unreachable!("`{name}` is a host tool"),
                },
                decision => (
                    not_offered(name, kind, &decision),
                    Some(DenialReason::Policy),
                ),
            };
            // Audited as a plugin tool's refusal is.
            let recorded = self
                .refuse(caller, conversation, name, arguments, (refusal, reason))
                .await;
            return Routed::Ran {
                recorded,
                label: Label::trusted(),
                ran: false,
            };
        }
        let process = caller;
        let caller = Caller::from(caller.clone());
        let pending = std::future::pending();
        let call = Call {
            kind,
            process: Some(process),
            caller: &caller,
            instances,
            name,
            arguments,
            context,
            carried,
            handles,
        };
        // A refusal is the host's own words; what a tool that ran returns is labelled by
        // what the call could read.
        let writer = context.clone().joined(carried);
        let trace = CallTrace::new(writer.clone(), self.files.clone())
            .in_conversation(conversation.cloned());
        // Were this call dropped mid-way (its worker cancelled or out of time), what it
        // wrote is still recorded, with what it had read.
        let unfinished = Unfinished {
            files: self.files.clone(),
            writer: writer.clone().joined(&self.result_label(kind, name)),
            trace: Some(&trace),
        };
        let outcome = self.run_in(call, &trace, pending).await;
        unfinished.finished();
        match outcome {
            Outcome::Ran(recorded, Started::Yes) => {
                let label = self
                    .touched_label(kind, name, recorded.touched(), writer)
                    .await;
                Routed::Ran {
                    recorded,
                    label,
                    ran: true,
                }
            }
            Outcome::Ran(recorded, Started::No) => Routed::Ran {
                recorded,
                label: Label::trusted(),
                ran: false,
            },
            Outcome::Parked(approval) => Routed::Parked(approval),
        }
    }

    /// Refuses process `caller`'s call of tool `name` with `arguments` before it is
    /// routed, saying `refusal` (a denial, for its reason): audited as any refused call
    /// is, as part of `conversation`'s work.
    pub async fn refuse(
        &self,
        caller: &ProcessId,
        conversation: Option<&SessionKey>,
        name: &str,
        arguments: &str,
        (refusal, reason): (ToolError, Option<DenialReason>),
    ) -> Recorded {
        let grants = self
            .catalog
            .policy()
            .profile(caller.kind())
            .grants_for(name);
        let request = CallRequest {
            tool: name,
            args_json: arguments,
            grants: &grants,
            workspace: Some(&self.workspace),
            caller: &Caller::from(caller.clone()),
            instances: None,
        };
        self.registry
            .refuse_call(request, conversation, reason, refusal)
            .await
    }

    /// The label of what a call of tool `name` by a `kind` process returned, having
    /// touched `touched`: what the tool returns by its capabilities
    /// ([`ToolRouter::result_label`]) joined with what it read (files, hosts). The files
    /// it wrote are recorded with that label joined with `writer`'s, what the process
    /// put into the call.
    async fn touched_label(
        &self,
        kind: ProcessKind,
        name: &str,
        touched: &Touched,
        writer: Label,
    ) -> Label {
        let label = self.result_label(kind, name);
        if touched.is_empty() {
            return label;
        }
        if touched.written.is_empty() {
            return label.joined(&self.files.read_label(touched).await);
        }
        // A call that wrote is labelled and recorded on a task of its own: were this call
        // dropped meanwhile (its worker cancelled, or out of time), its files would go
        // unrecorded and stay open to write.
        let (files, touched) = (self.files.clone(), touched.clone());
        let labelled = tokio::spawn(async move {
            let label = label.joined(&files.read_label(&touched).await);
            files.record_written(&touched, &writer.joined(&label)).await;
            label
        });
        labelled.await.unwrap_or_else(|err| {
            tracing::error!("labelling a call's result failed ({err}): taken as unknown");
            Label::unknown()
        })
    }

    /// The label of what tool `name` returns to a `kind` process: see
    /// [`CatalogTool::result_label`](super::CatalogTool::result_label).
    pub fn result_label(&self, kind: ProcessKind, name: &str) -> Label {
        self.catalog
            .flow_facts(kind, name)
            .map_or_else(Label::trusted, |facts| facts.result.clone())
    }

    /// The flow check of call `at` to `sink`: it passes (allowed, or approved by a lease
    /// it now takes a use of), is refused, or is parked for a person.
    async fn flow(&self, at: FlowAt<'_>, sink: &Sink) -> Gate {
        let FlowAt {
            kind,
            process,
            name,
            arguments,
            context,
            carried,
            handles,
        } = at;
        let decision = self.catalog.decide_flow(kind, name, context, carried, sink);
        let explained = || decision.explained(name, sink).to_string();
        let gate = match (decision.action, process, &self.approvals) {
            (Action::Allow, ..) => return Gate::Pass(None),
            (Action::Refuse, ..) => Gate::Refused(ToolError::Denied(explained())),
            // A door's call, or a host keeping no approvals: no one could approve it.
            (Action::Approve, None, _) | (Action::Approve, _, None) => {
                Gate::Refused(ToolError::Denied(explained()))
            }
            // Arguments no tool takes are refused as the registry would: a person is not
            // asked about them, and no approval's use is spent on them.
            (Action::Approve, Some(_), Some(_))
                if HostTool::named(name).is_none()
                    && let Err(err) = check_args_object(name, arguments) =>
            {
                return Gate::Refused(err);
            }
            (Action::Approve, Some(process), Some(desk)) => {
                let because = decision.because().to_string();
                let asking = Asking {
                    process,
                    name,
                    arguments,
                    handles,
                };
                self.ask(desk, asking, explained(), because).await
            }
        };
        if let (Gate::Refused(ToolError::Denied(reason)), Some(desk)) = (&gate, &self.approvals) {
            let refused = ChainRecord {
                event: ChainEvent::Refused,
                process: process.map_or_else(|| format!("{kind} door"), ToString::to_string),
                tool: name.to_owned(),
                digest: ArgsDigest::of(arguments).to_string(),
                approval: None,
                by: "host".into(),
                detail: reason.clone(),
            };
            // The refusal stands whether or not the chain takes its row: a call is never
            // let through because the record of refusing it failed.
            if let Err(err) = desk.chain.record(refused).await {
                tracing::warn!("the refusal of `{name}` is not in the audit chain: {err}");
            }
        }
        gate
    }

    /// A call that needs a person: it passes on a lease that covers it (taking a use),
    /// else it is parked, as `explained`, because of the data labelled `because`.
    async fn ask(
        &self,
        desk: &ApprovalDesk,
        asking: Asking<'_>,
        explained: String,
        because: String,
    ) -> Gate {
        let Asking {
            process,
            name,
            arguments,
            handles,
        } = asking;
        match desk
            .approvals
            .take(process, name, ArgsDigest::of(arguments))
            .await
        {
            // The tool gets the text that was digested and shown: a value with duplicate
            // keys, or a number JSON readers round differently, runs as the person read it.
            Ok(Some(_lease)) => Gate::Pass(Some(crate::flow::canonical(arguments))),
            Ok(None) => {
                let mut call = NewApproval::of(process, name, arguments, &explained, &because);
                call.handles = handles.to_vec();
                // Kept at rest and shown to people: no configured secret's value, removed
                // from the parsed value (the text escapes what it holds).
                let secrets = self.registry.host().network().secrets().redactor();
                call.arguments = match serde_json::from_str(&call.arguments) {
                    Ok(mut value) => {
                        secrets.redact_json(&mut value);
                        crate::flow::shown(&serde_json::Value::to_string(&value))
                    }
                    Err(_) => secrets.redact(&call.arguments).into_owned(),
                };
                match desk.approvals.park(call).await {
                    Ok(approval) => Gate::Parked(Box::new(approval)),
                    Err(err) => Gate::Refused(unparked(explained, &err)),
                }
            }
            Err(err) => Gate::Refused(unparked(explained, &err)),
        }
    }

    /// Runs plugin or MCP tool `name` for a caller of `kind` named `caller` (`worker:3`,
    /// `mcp:ci`), with the kind's grants, stopped when `cancelled` completes first. The
    /// call is decided here, once, by the catalog: the registry runs an offered call and
    /// records a refused one (audited, with the policy's reason). A host tool is refused:
    /// it acts on a running agent's processes, which no door outside the agent has.
    ///
    /// This is a door's call: the client is the principal, so what it sends is trusted
    /// and only the flow rules about private data apply.
    ///
    /// A refusal, like any failure, may come back before its audit row is committed:
    /// wait for [`Recorded::committed`] before its text leaves the host.
    pub async fn run(
        &self,
        kind: ProcessKind,
        caller: &Caller,
        instances: Option<&ProcessInstances>,
        name: &str,
        arguments: &str,
        cancelled: impl Future<Output = ()>,
    ) -> Recorded {
        let call = Call {
            kind,
            process: None,
            caller,
            instances,
            name,
            arguments,
            context: &Label::trusted(),
            carried: &Label::trusted(),
            handles: &[],
        };
        // A client's call: what it writes is not recorded (nor is it labelled).
        let trace = CallTrace::default();
        match self.run_in(call, &trace, cancelled).await {
            Outcome::Ran(recorded, _) => recorded,
            Outcome::Parked(_) => unreachable!("a door's call is never parked: it has no process"),
        }
    }

    /// [`ToolRouter::run`] of `call`: its result and whether the tool was started (else
    /// the host refused the call), or its parking.
    async fn run_in(
        &self,
        call: Call<'_>,
        trace: &CallTrace,
        cancelled: impl Future<Output = ()>,
    ) -> Outcome {
        let Call {
            kind,
            process,
            caller,
            instances,
            name,
            arguments,
            context,
            carried,
            handles,
        } = call;
        let policy = self.catalog.policy();
        let profile = policy.profile(kind);
        let grants = profile.grants_for(name);
        let request = CallRequest {
            tool: name,
            args_json: arguments,
            grants: &grants,
            workspace: Some(&self.workspace),
            caller,
            instances,
        };
        if let Some(tool) = HostTool::named(name) {
            let refusal = ToolError::Denied(format!(
                "`{name}` is a host tool: it runs only inside an agent's {} process",
                tool.kinds_running().join(" or ")
            ));
            let refused = self
                .registry
                .refuse_call(request, trace.conversation.as_ref(), POLICY, refusal)
                .await;
            return Outcome::Ran(refused, Started::No);
        }
        // The one decision of the call: the registry runs what it is handed.
        let mut approved_arguments: Option<String> = None;
        match self.catalog.decide(kind, name) {
            Decision::Offered => {
                if let Some(facts) = self.catalog.flow_facts(kind, name) {
                    let at = FlowAt {
                        kind,
                        process,
                        name,
                        arguments,
                        context,
                        carried,
                        handles,
                    };
                    match self.flow(at, &facts.sink).await {
                        Gate::Pass(None) => {}
                        Gate::Pass(Some(approved)) => approved_arguments = Some(approved),
                        Gate::Refused(refusal) => {
                            let refused = self
                                .registry
                                .refuse_call(request, trace.conversation.as_ref(), FLOW, refusal)
                                .await;
                            return Outcome::Ran(refused, Started::No);
                        }
                        Gate::Parked(approval) => return Outcome::Parked(approval),
                    }
                }
                let request = match &approved_arguments {
                    Some(approved) => CallRequest {
                        args_json: approved,
                        ..request
                    },
                    None => request,
                };
                let source = GrantSource::profile(kind, profile, name);
                let reuse = |plugin: &str| policy.reuse().decide(kind, plugin);
                let recorded = self
                    .registry
                    .call_offered(request, source, reuse, trace, cancelled)
                    .await;
                Outcome::Ran(recorded, Started::Yes)
            }
            Decision::NotLoaded => {
                let unknown = self.registry.unknown_tool(name);
                Outcome::Ran(
                    self.registry
                        .refuse_call(request, trace.conversation.as_ref(), None, unknown)
                        .await,
                    Started::No,
                )
            }
            refused => {
                let refusal = not_offered(name, kind, &refused);
                Outcome::Ran(
                    self.registry
                        .refuse_call(request, trace.conversation.as_ref(), POLICY, refusal)
                        .await,
                    Started::No,
                )
            }
        }
    }
}

/// The reasons of the router's own denials, for the metrics.
const POLICY: Option<DenialReason> = Some(DenialReason::Policy);
const FLOW: Option<DenialReason> = Some(DenialReason::Flow);

/// What became of a plugin or MCP call: run or refused (audited), or parked.
enum Outcome {
    Ran(Recorded, Started),
    Parked(Box<Approval>),
}

/// A call as the flow check sees it: who calls (a process, or a door's client) and what
/// it had read.
#[derive(Clone, Copy)]
struct FlowAt<'a> {
    kind: ProcessKind,
    process: Option<&'a ProcessId>,
    name: &'a str,
    arguments: &'a str,
    context: &'a Label,
    carried: &'a Label,
    handles: &'a [Carried],
}

/// What the model that made a call had read, and what its arguments carry beyond it.
#[derive(Debug, Clone, Copy)]
pub struct Read<'a> {
    /// The join of the labels of what the model was shown when it wrote the call.
    pub context: &'a Label,
    /// The join of the labels of the handles whose values the host put into the
    /// arguments (clear for none).
    pub carried: &'a Label,
    /// Those handles, each bound to its value's digest: what a person asked about the
    /// call may endorse.
    pub handles: &'a [Carried],
    /// The conversation whose work the call is part of (a worker's is the one that
    /// started it), recorded with the call's audit row; `None` outside a conversation.
    pub conversation: Option<&'a SessionKey>,
}

impl<'a> Read<'a> {
    /// A call written after reading `context`, with no handle in its arguments, outside
    /// any conversation.
    pub fn context(context: &'a Label) -> Self {
        static CLEAR: Label = Label::trusted();
        Read {
            context,
            carried: &CLEAR,
            handles: &[],
            conversation: None,
        }
    }

    /// This read, for a call that is part of `conversation`'s work.
    pub fn in_conversation(self, conversation: &'a SessionKey) -> Self {
        Read {
            conversation: Some(conversation),
            ..self
        }
    }
}

/// A call a person is asked about.
struct Asking<'a> {
    process: &'a ProcessId,
    name: &'a str,
    arguments: &'a str,
    handles: &'a [Carried],
}

/// The flow check's outcome for one call.
enum Gate {
    /// Runs: allowed, or covered by an approval, with the arguments to run it with then
    /// (the canonical text the approval's digest is of).
    Pass(Option<String>),
    /// Refused, saying why.
    Refused(ToolError),
    /// Waits for a person.
    Parked(Box<Approval>),
}

/// The refusal of a call that needs approval when the approvals store failed.
fn unparked(explained: String, err: &crate::services::ServiceError) -> ToolError {
    ToolError::Denied(format!(
        "{explained}; it could not be parked for approval ({err}), so it is refused"
    ))
}

/// A call as the router runs it: who calls, what, and what the caller had read.
struct Call<'a> {
    kind: ProcessKind,
    /// The process calling; none for a door's client, whose calls are never parked.
    process: Option<&'a ProcessId>,
    caller: &'a Caller,
    instances: Option<&'a ProcessInstances>,
    name: &'a str,
    arguments: &'a str,
    context: &'a Label,
    carried: &'a Label,
    handles: &'a [Carried],
}

/// Whether a call's tool was started, or the host refused the call before it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Started {
    Yes,
    No,
}

/// The refusal of tool `name` to a `kind` process, with the policy's reason.
fn not_offered(name: &str, kind: ProcessKind, decision: &Decision) -> ToolError {
    ToolError::Denied(format!(
        "tool `{}` is not offered to a {kind} process: {}",
        echo_name(name, MAX_ECHOED_NAME),
        one_line(&decision.to_string())
    ))
}
