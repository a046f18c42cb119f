//! The prompt gate: the only code that sends a prompt to a model.
//!
//! Every route that asks a model for its next message goes through [`Dispatcher`]: a user
//! message, the retrigger after a worker or branch result, a late notification, a worker's
//! task, its follow-ups and the re-prompt after injected context, a branch's thinking and
//! compaction ([`Route`] names them all). Nothing under `plugin/` can reach it, no other
//! module holds the provider, and a test scans the host's source to keep it so.
//!
//! A route first reserves its session ([`Dispatcher::reserve`]), then waits for inputs to
//! settle, then dispatches with its ticket ([`Dispatcher::send`]). The answer is one
//! [`DispatchOutcome`]; callers treat [`DispatchOutcome::Active`] and
//! [`DispatchOutcome::Reserved`] as "someone else answers", never as a reason to retry.
//!
//! A model may answer slowly as long as it keeps answering: `timing` bounds the wait for
//! the first piece of an answer and each gap between pieces (`dispatch_timeout_secs`),
//! and the whole answer (`dispatch_total_secs`). [`Dispatcher::send_streaming`] passes
//! the pieces on to the caller as they arrive.

mod gate;
mod timing;

use std::fmt;
use std::sync::Arc;

pub use gate::{Gate, GateSettings, Lease, ReleaseError, Reserved, Ticket, ToolRunning};
pub use timing::TooSlow;

use crate::llm::{AnswerSink, Completion, CompletionRequest, Provider, ProviderError};
use crate::telemetry::spans;
use gate::Busy;
use timing::Progress;

/// Why a prompt is sent: every route into a model, named. Its JSON form is
/// [`Route::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    /// A message from the user.
    User,
    /// A channel's turn after worker or branch results.
    Retrigger,
    /// A channel's turn telling a result that arrived after its requester ended.
    Notification,
    /// A worker's task.
    Task,
    /// A worker's follow-up turn after routed input.
    FollowUp,
    /// A worker re-prompted after context was injected at a turn boundary.
    Injection,
    /// The next round of a turn, after tool results.
    Continuation,
    /// A branch's question.
    Branch,
    /// A summary of old history.
    Compaction,
    /// A typed question about a held result, asked in quarantine (`ask_about`).
    Question,
}

impl Route {
    /// The route's name in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Route::User => "user",
            Route::Retrigger => "retrigger",
            Route::Notification => "notification",
            Route::Task => "task",
            Route::FollowUp => "follow-up",
            Route::Injection => "injection",
            Route::Continuation => "continuation",
            Route::Branch => "branch",
            Route::Compaction => "compaction",
            Route::Question => "question",
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one dispatch did. Closed: every caller handles every case.
#[derive(Debug)]
pub enum DispatchOutcome {
    /// The model answered.
    Dispatched(Completion),
    /// The session is busy: a dispatch is in flight or a tool is still running. Nothing
    /// was sent; whoever is busy answers.
    Active,
    /// Someone else holds the session. Nothing was sent.
    Reserved {
        /// The owner holding it.
        by: String,
    },
    /// The model's answer did not start, went on, or end in time ([`TooSlow`] says which
    /// bound and the key that raises it); the reservation is released (the hold still
    /// runs).
    TimedOut(TooSlow),
    /// The dispatch failed.
    Failed {
        /// Whether the prompt reached the provider (false: the ticket no longer held the
        /// session, so nothing was sent).
        attempted: bool,
        /// What went wrong.
        error: DispatchError,
    },
}

/// Why a dispatch failed.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The provider failed.
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// The ticket was released, timed out or replaced before the dispatch.
    #[error("the reservation of session {session} by {owner} is no longer held; reserve it again")]
    StaleTicket {
        /// The session.
        session: String,
        /// The ticket's owner.
        owner: String,
    },
}

/// Owns the provider and the [`Gate`], and sends every prompt.
///
/// ```
/// use std::sync::Arc;
/// use capstan_host::dispatch::{DispatchOutcome, Dispatcher, GateSettings, Route};
/// use capstan_host::llm::{CompletionRequest, Message, Script, ScriptedProvider, ToolChoice};
///
/// let script = Script::parse("[[step]]\nprocess = \"channel\"\nreply = \"Hi.\"", "inline").unwrap();
/// let provider = ScriptedProvider::new(script, "inline");
/// let dispatcher = Dispatcher::new(Arc::new(provider), GateSettings::default());
/// let request = CompletionRequest {
///     process: "channel".into(),
///     messages: vec![Message::user("hello")],
///     tools: vec![].into(),
///     tool_choice: ToolChoice::Auto,
/// };
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
/// match dispatcher.send(&ticket, Route::User, &request).await {
///     DispatchOutcome::Dispatched(answer) => assert_eq!(answer.message.content, "Hi."),
///     other => panic!("{other:?}"),
/// }
/// // Within the hold, anyone else is told who has the session.
/// assert!(matches!(
///     dispatcher.prompt("main", "hook:idle:", Route::User, &request).await,
///     DispatchOutcome::Reserved { by } if by == "channel:main:loop"
/// ));
/// # });
/// ```
pub struct Dispatcher {
    provider: Arc<dyn Provider>,
    gate: Gate,
    settings: GateSettings,
    chat_spans: spans::ChatSpans,
}

impl Dispatcher {
    /// A gate in front of `provider`, with `settings`' timings.
    pub fn new(provider: Arc<dyn Provider>, settings: GateSettings) -> Self {
        Dispatcher {
            provider,
            gate: Gate::default(),
            settings,
            chat_spans: spans::ChatSpans::default(),
        }
    }

    /// The provider's name, for logs.
    pub fn provider_name(&self) -> String {
        self.provider.name()
    }

    /// The timings in force.
    pub fn settings(&self) -> &GateSettings {
        &self.settings
    }

    /// The reservations.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Reserves `session` for `owner`; see [`Gate::reserve`].
    pub fn reserve(&self, session: &str, owner: &str) -> Result<Ticket, Reserved> {
        self.gate.reserve(session, owner)
    }

    /// Reserves `session` for `owner` until the returned lease drops.
    pub fn lease(&self, session: &str, owner: &str) -> Result<Lease<'_>, Reserved> {
        Ok(Lease::new(&self.gate, self.gate.reserve(session, owner)?))
    }

    /// Reserves `session` for the loop of `process` (owner `<process>:loop`, e.g.
    /// `worker:3:loop`) until the returned lease drops. The loop re-enters it for each
    /// round of its turns.
    pub fn lease_loop(&self, session: &str, process: &str) -> Result<Lease<'_>, Reserved> {
        self.lease(session, &format!("{process}:loop"))
    }

    /// Releases everything `process` reserved (every owner under `<process>:`), when the
    /// process ends; returns how many.
    pub fn release_process(&self, process: &str) -> usize {
        self.gate
            .release_prefix(&format!("{process}:"))
            .expect("the prefix ends in ':'")
    }

    /// One whole route: reserve `session` for `owner`, wait the settle time, dispatch.
    pub async fn prompt(
        &self,
        session: &str,
        owner: &str,
        route: Route,
        request: &CompletionRequest,
    ) -> DispatchOutcome {
        let ticket = match self.gate.reserve(session, owner) {
            Ok(ticket) => ticket,
            Err(Reserved { by }) => return DispatchOutcome::Reserved { by },
        };
        if !self.settings.settle.is_zero() {
            tokio::time::sleep(self.settings.settle).await;
        }
        self.send(&ticket, route, request).await
    }

    /// Sends `request` under `ticket`, if the session is not busy, within the dispatch
    /// timers. The hold starts when this returns (or is dropped), however it ended.
    pub async fn send(
        &self,
        ticket: &Ticket,
        route: Route,
        request: &CompletionRequest,
    ) -> DispatchOutcome {
        self.send_streaming(ticket, route, request, &()).await
    }

    /// [`Dispatcher::send`], passing each piece of the answer to `deltas` as it arrives,
    /// before the whole [`Completion`] is returned: text as [`Delta::Text`] (concatenated,
    /// the completion's content), tool-call fragments as [`Delta::ToolCall`] (the
    /// completion carries the calls whole), anything else as [`Delta::Progress`]. A
    /// provider that does not stream sends no deltas. When the dispatch fails or times out
    /// after some text was passed on, that text is not an answer: the outcome says so.
    ///
    /// [`Delta::Text`]: crate::llm::Delta::Text
    /// [`Delta::ToolCall`]: crate::llm::Delta::ToolCall
    /// [`Delta::Progress`]: crate::llm::Delta::Progress
    ///
    /// ```
    /// use std::sync::Arc;
    /// use capstan_host::dispatch::{DispatchOutcome, Dispatcher, GateSettings, Route};
    /// use capstan_host::llm::{CompletionRequest, Delta, Message, Script, ScriptedProvider, ToolChoice};
    ///
    /// let script = Script::parse("[[step]]\nprocess = \"channel\"\nreply = \"Hi.\"", "inline").unwrap();
    /// let dispatcher = Dispatcher::new(Arc::new(ScriptedProvider::new(script, "inline")), GateSettings::default());
    /// let request = CompletionRequest {
    ///     process: "channel".into(),
    ///     messages: vec![Message::user("hello")],
    ///     tools: vec![].into(),
    ///     tool_choice: ToolChoice::Auto,
    /// };
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let (deltas, mut received) = tokio::sync::mpsc::unbounded_channel::<Delta>();
    /// let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
    /// // Print text as it arrives, e.g. from another task reading `received`.
    /// let outcome = dispatcher.send_streaming(&ticket, Route::User, &request, &deltas).await;
    /// assert!(matches!(outcome, DispatchOutcome::Dispatched(answer) if answer.message.content == "Hi."));
    /// // The scripted provider does not stream: its answer comes whole, with no deltas.
    /// assert!(received.try_recv().is_err());
    /// # });
    /// ```
    pub async fn send_streaming(
        &self,
        ticket: &Ticket,
        route: Route,
        request: &CompletionRequest,
        deltas: &dyn AnswerSink,
    ) -> DispatchOutcome {
        let mut flight = match self.gate.begin(ticket) {
            Ok(flight) => flight,
            Err(Busy::Active) => return DispatchOutcome::Active,
            Err(Busy::Stale) => {
                return match self.gate.holder(ticket.session()) {
                    Some(by) if by != ticket.owner() => DispatchOutcome::Reserved { by },
                    _ => DispatchOutcome::Failed {
                        attempted: false,
                        error: DispatchError::StaleTicket {
                            session: ticket.session().to_owned(),
                            owner: ticket.owner().to_owned(),
                        },
                    },
                };
            }
        };
        flight.hold = self.settings.hold;
        tracing::debug!(
            session = ticket.session(),
            owner = ticket.owner(),
            %route,
            process = %request.process,
            messages = request.messages.len(),
            "dispatch"
        );
        let progress = Progress::new(deltas);
        let mut span = self.chat_spans.start(|| self.provider.name());
        let answer = self.provider.complete(request, &progress);
        let sent = std::time::Instant::now();
        let metrics = crate::telemetry::metrics();
        match timing::bounded(&self.settings, &progress, answer).await {
            Ok(Ok(completion)) => {
                metrics.model_answered(sent.elapsed(), completion.tokens);
                spans::chat_usage(&mut span, completion.usage.input, completion.usage.output);
                DispatchOutcome::Dispatched(completion)
            }
            Ok(Err(error)) => {
                metrics.model_failed("failed");
                span.fail("failed");
                DispatchOutcome::Failed {
                    attempted: true,
                    error: error.into(),
                }
            }
            Err(late) => {
                metrics.model_failed("timed_out");
                span.fail("timeout");
                // The caller reports it (with the bound and its key); this is for tracing.
                tracing::debug!(
                    session = ticket.session(),
                    owner = ticket.owner(),
                    %route,
                    "dispatch timed out: {late}"
                );
                flight.release = true;
                DispatchOutcome::TimedOut(late)
            }
        }
    }
}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("provider", &self.provider.name())
            .field("settings", &self.settings)
            .finish()
    }
}

#[cfg(test)]
mod tests;
