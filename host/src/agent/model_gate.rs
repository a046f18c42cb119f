//! [`ModelGate`]: how a process asks the model: its loop's session reserved at the prompt
//! gate, its turns through the gate, everything it holds there released when it ends, and
//! the tools its kind is offered.

use std::sync::Arc;

use super::reporter::Reporter;
use super::turn::Turn;
use serde_json::Value;

use crate::dispatch::{DispatchOutcome, Dispatcher, Lease, Reserved, Route, Ticket};
use crate::flow::Question;
use crate::ids::{ProcessId, ProcessKind};
use crate::llm::{CompletionRequest, Message, ToolChoice, ToolDef};
use crate::plugin::ToolError;
use crate::services::Run;
use crate::telemetry::TraceParent;
use crate::tools::ToolRouter;

/// What a quarantined question's request names as its process (scripts answer it by
/// this name).
pub(crate) const QUESTION_PROCESS: &str = "question";

/// How processes ask the model; see the [module](self).
pub(crate) struct ModelGate {
    dispatcher: Dispatcher,
    /// Which tools each kind is offered.
    router: Arc<ToolRouter>,
    /// Where a turn's start and end are told.
    reporter: Arc<Reporter>,
    /// No request goes out while this host's lease is not live.
    run: Arc<Run>,
    /// `limits.max_turns`: the model requests one turn may make.
    max_turns: u32,
}

impl ModelGate {
    /// Asks through `dispatcher`, offering the tools `router` offers each kind, telling
    /// through `reporter`, while `run` is live, at most `max_turns` requests a turn.
    pub(crate) fn new(
        dispatcher: Dispatcher,
        router: Arc<ToolRouter>,
        reporter: Arc<Reporter>,
        run: Arc<Run>,
        max_turns: u32,
    ) -> Self {
        ModelGate {
            dispatcher,
            router,
            reporter,
            run,
            max_turns,
        }
    }

    /// The dispatcher, for what the runtime reports of it (the provider, the gate's
    /// reservations, its timings).
    pub(crate) fn dispatcher(&self) -> &Dispatcher {
        &self.dispatcher
    }

    /// Where each tool call goes.
    pub(crate) fn router(&self) -> &ToolRouter {
        &self.router
    }

    /// The tools a `kind` process is offered ([`ToolCatalog::offered`](crate::tools::ToolCatalog::offered)).
    pub(crate) fn tool_defs(&self, kind: ProcessKind) -> Arc<[ToolDef]> {
        self.router.catalog().offered(kind)
    }

    /// Reserves the session of process `id` for its loop (owner `<id>:loop`) at the gate;
    /// see [`Dispatcher::lease_loop`].
    pub(crate) fn lease_loop(&self, id: &ProcessId) -> Result<Lease<'_>, Reserved> {
        self.dispatcher
            .lease_loop(id.session().as_str(), &id.to_string())
    }

    /// A turn of process `id`, through the gate with `ticket`, sent for `route`, with the
    /// config's turn budget; its answer is not streamed anywhere until `deltas` is set.
    pub(crate) fn turn<'a>(
        &'a self,
        id: &'a ProcessId,
        ticket: &'a Ticket,
        route: Route,
        system: &'a str,
        tools: &'a Arc<[ToolDef]>,
    ) -> Turn<'a> {
        Turn {
            dispatcher: &self.dispatcher,
            ticket,
            route,
            process: id,
            events: self.reporter.events(),
            system,
            tools,
            max_turns: self.max_turns,
            deltas: &(),
            run: &self.run,
            // A worker's, branch's or compaction's work runs under the span that started
            // it; a channel sets its turn's own.
            trace: TraceParent::current(),
        }
    }

    /// Asks `question` about `value` for process `id`, in quarantine: a request of its
    /// own, with no tools and no history, under a session of its own at the gate (the
    /// process's is busy with the turn that asked). The answer, if it is of the type
    /// asked; never the model's text otherwise.
    pub(crate) async fn ask_quarantined(
        &self,
        id: &ProcessId,
        question: &Question,
        value: &str,
    ) -> Result<Value, ToolError> {
        if !self.run.is_live() {
            return Err(ToolError::Failed(format!(
                "this host's {} lease is not live, so the question was not asked",
                self.run.id()
            )));
        }
        let (system, user) = question.prompt(value);
        let request = CompletionRequest {
            process: QUESTION_PROCESS.to_owned(),
            messages: vec![Message::system(system), Message::user(user)],
            tools: Arc::from([]),
            tool_choice: ToolChoice::None,
        };
        let session = format!("{id}:question");
        let owner = format!("{session}:ask");
        let outcome = match self.dispatcher.reserve(&session, &owner) {
            Ok(ticket) => {
                self.dispatcher
                    .send(&ticket, Route::Question, &request)
                    .await
            }
            Err(Reserved { by }) => DispatchOutcome::Reserved { by },
        };
        self.dispatcher.release_process(&session);
        let failed = |why: String| Err(ToolError::Failed(format!("ask_about: {why}")));
        match outcome {
            DispatchOutcome::Dispatched(answer) => question
                .read(&answer.message.content)
                .map_err(|why| ToolError::Failed(format!("ask_about: {why}"))),
            DispatchOutcome::TimedOut(late) => failed(format!("the model did not answer: {late}")),
            DispatchOutcome::Failed { error, .. } => {
                // A provider's error may quote the request (the value) or the answer: the
                // asking model is told only that it failed.
                tracing::warn!(process = %id, "ask_about: the model failed: {error}");
                failed("the model failed to answer; the host's log says why".into())
            }
            DispatchOutcome::Active | DispatchOutcome::Reserved { .. } => {
                failed("another question of this process is being asked; ask again".into())
            }
        }
    }

    /// Releases everything process `id` holds at the gate, when it ends.
    pub(crate) fn release_process(&self, id: &ProcessId) {
        self.dispatcher.release_process(&id.to_string());
    }
}
