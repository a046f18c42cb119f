//! [`Reporter`]: the one way a process tells what it does: to the observers of the event
//! stream, to the exchanges that follow its work ([`Scope`]), to its conversation (a
//! worker's or branch's report, or a late one folded back into working memory), and to the
//! hosts waiting for the answer to a message they forwarded.
//!
//! What it tells a person or another host (events, parts, replies, answers) passes the
//! redactor first; a report told to a conversation, or kept for it in working memory, is
//! the conversation's own and stays as it is (the history is redacted when it is stored).

use std::sync::Arc;
use std::time::Duration;

use super::audience::Scope;
use super::events::{Event, EventSink};
use super::exchange::{FORWARDED_ANSWER_LIMIT, ReplyPart};
use super::inbox::{ChannelHandle, ChannelInput};
use super::notifications::{Notification, NotificationIndex, NotificationKind};
use super::supervisor::Supervisor;
use super::turn::{TurnError, Unanswered};
use crate::flow::Label;
use crate::ids::ProcessId;
use crate::secrets::Redactor;
use crate::services::{Answer, ForwardId, Memory, Run, Sessions};
use crate::text::truncate;

/// How processes tell what they do; see the [module](self).
pub(crate) struct Reporter {
    events: EventSink,
    redactor: Redactor,
    /// This host's run: while its lease is not live, no reply or answer leaves.
    run: Arc<Run>,
    /// Which conversations and branches are alive, for where a report goes.
    supervisor: Arc<Supervisor>,
    /// Where late reports are kept.
    memory: Arc<dyn Memory>,
    /// Where the answers of forwarded messages are left.
    sessions: Arc<dyn Sessions>,
    /// How often an answer the store refused is left again.
    store_retry: Duration,
    /// Held while a late report is added to the notifications index.
    notification_index: NotificationIndex,
}

/// Where a [`Reporter`] tells what it tells.
pub(crate) struct Audiences {
    /// The event stream's sink.
    pub(crate) events: EventSink,
    /// Which conversations and branches are alive.
    pub(crate) supervisor: Arc<Supervisor>,
    /// Where late reports are kept.
    pub(crate) memory: Arc<dyn Memory>,
    /// Where the answers of forwarded messages are left.
    pub(crate) sessions: Arc<dyn Sessions>,
}

impl Reporter {
    /// A reporter telling `to`, through `redactor`, while `run` is live, leaving an answer
    /// the store refused for now again every `store_retry`.
    pub(crate) fn new(
        to: Audiences,
        redactor: Redactor,
        run: Arc<Run>,
        store_retry: Duration,
    ) -> Self {
        Reporter {
            events: to.events,
            redactor,
            run,
            supervisor: to.supervisor,
            memory: to.memory,
            sessions: to.sessions,
            store_retry,
            notification_index: NotificationIndex::default(),
        }
    }

    /// The event stream, for a turn's own start and end.
    pub(crate) fn events(&self) -> &EventSink {
        &self.events
    }

    /// What hides every value the host holds (secrets, tokens, the provider's key) in what
    /// it tells anyone: events, replies, answers left for other hosts.
    pub(crate) fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Whether this host may still act for its conversations (its lease is live).
    pub(crate) fn is_live(&self) -> bool {
        self.run.is_live()
    }

    /// Reports `event` to the observers of the event stream.
    pub(crate) fn emit(&self, event: Event) {
        self.events.emit(event.redacted(&self.redactor));
    }

    /// Reports `event` of a conversation's work: to the observers, and to the exchanges
    /// that follow that work (`to`).
    pub(crate) fn emit_to(&self, to: &Scope, event: Event) {
        let event = event.redacted(&self.redactor);
        to.send(&ReplyPart::Activity(event.clone()));
        self.events.emit(event);
    }

    /// Delivers `text` as `channel`'s reply (to the exchanges that follow the turn `to`,
    /// `streamed` saying whether they had its text as it was written), unless this host's
    /// lease is not live: then another host may answer the conversation, and a reply from
    /// here would contradict it. The text delivered (redacted), if it was.
    pub(crate) fn deliver_reply(
        &self,
        channel: &ProcessId,
        to: &Scope,
        text: String,
        streamed: bool,
    ) -> Option<String> {
        if !self.run.is_live() {
            self.emit_to(
                to,
                Event::TurnSuppressed {
                    process: channel.clone(),
                    reason: format!(
                        "a reply was not delivered: this host's {} lease is not live",
                        self.run.id()
                    ),
                },
            );
            return None;
        }
        let text = self.redactor.redact_owned(text);
        to.reply(&text, streamed);
        self.emit(Event::Reply {
            channel: channel.clone(),
            text: text.clone(),
        });
        Some(text)
    }

    /// Reports that a request of `process` (whose work `to` is) got no answer (a
    /// suppressed turn is not a failure: someone else answers).
    pub(crate) fn model_failed(&self, to: &Scope, process: &ProcessId, err: &TurnError) {
        if matches!(err.reason, Unanswered::Suppressed(_)) {
            return;
        }
        self.emit_to(
            to,
            Event::ModelFailed {
                process: process.clone(),
                error: err.to_string(),
            },
        );
    }

    /// Sends `source`'s report `text` to conversation `channel`, or folds it back (see
    /// [`Reporter::fold_back`]) when `requester` (the branch that asked; `None`: the
    /// channel did) has ended.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn tell(
        &self,
        channel: &ProcessId,
        handle: &ChannelHandle,
        source: &ProcessId,
        requester: Option<&ProcessId>,
        kind: NotificationKind,
        text: String,
        label: Label,
    ) {
        match requester.filter(|branch| !self.supervisor.branch_alive(branch)) {
            Some(requester) => {
                self.fold_back(channel, source, requester, kind, &text, &label)
                    .await;
            }
            None => {
                self.report(channel, handle, source, kind, text, label)
                    .await
            }
        }
    }

    /// Sends `source`'s report `text`, labelled `label` (what `source` had read), to
    /// conversation `channel` (through `handle`) as a result; if the channel is gone, keeps
    /// it as a notification instead (see [`Reporter::fold_back`]).
    pub(crate) async fn report(
        &self,
        channel: &ProcessId,
        handle: &ChannelHandle,
        source: &ProcessId,
        kind: NotificationKind,
        text: String,
        label: Label,
    ) {
        let input = ChannelInput::Result {
            source: source.clone(),
            kind,
            text,
            label,
            trace: crate::telemetry::TraceParent::current(),
        };
        if let Err(ChannelInput::Result { text, label, .. }) = handle.try_send(input) {
            self.fold_back(channel, source, channel, kind, &text, &label)
                .await;
        }
    }

    /// Keeps `text` from `source` (which `requester` asked for) in working memory and runs a
    /// notification turn on `channel`; if the channel is gone, logs a warning and drops the
    /// turn (the entry stays). Reports [`Event::NotificationFolded`] and returns the
    /// notification.
    pub(crate) async fn fold_back(
        &self,
        channel: &ProcessId,
        source: &ProcessId,
        requester: &ProcessId,
        kind: NotificationKind,
        text: &str,
        label: &Label,
    ) -> Notification {
        let key = format!("notifications/{kind}/{source}");
        let line = format!("{kind} {source} (for {requester}): {}", truncate(text, 120));
        {
            let _index = self.notification_index.0.lock().await;
            let memory = &self.memory;
            let saved = async {
                memory.working_set(&key, text, label, None).await?;
                // The index quotes each report: it carries what each carried.
                let index = memory.working_get("notifications/index").await?;
                let (mut index, mut read) = index.map_or_else(
                    || (String::new(), Label::trusted()),
                    |entry| (entry.value, entry.label),
                );
                index.push_str(&line);
                index.push('\n');
                read.join(label);
                memory
                    .working_set("notifications/index", &index, &read, None)
                    .await
            };
            if let Err(err) = saved.await {
                tracing::error!(%source, "cannot save a late report in working memory: {err}");
            }
        }
        let folded = Event::NotificationFolded {
            channel: channel.clone(),
            source: source.clone(),
            requester: requester.clone(),
            kind,
            key: key.clone(),
        };
        let handle = self.supervisor.channel(channel);
        // The exchanges that follow `source` hear of it, as of its other work.
        match &handle {
            Some(handle) => self.emit_to(&handle.audience.of(source), folded),
            None => self.emit(folded),
        }
        let note = Notification {
            source: source.clone(),
            requester: requester.clone(),
            kind,
            key,
            text: text.to_owned(),
            label: label.clone(),
        };
        let told = handle
            .is_some_and(|handle| handle.send(ChannelInput::Notification(Box::new(note.clone()))));
        if !told {
            tracing::warn!(
                %channel,
                %source,
                key = %note.key,
                "a late report arrived for a channel that is gone; kept in working memory, no turn runs"
            );
        }
        note
    }

    /// Leaves each answer for the host that forwarded its message, redacted, while this
    /// host may still act for the conversation (the caller waits until the history holding
    /// it is stored); otherwise that host hears nothing, and says so in time. An answer the
    /// store refuses for now is left again until it takes it.
    pub(crate) async fn answer_forwarded(&self, answers: Vec<(ForwardId, Answer)>) {
        if answers.is_empty() {
            return;
        }
        if !self.run.is_live() {
            tracing::warn!(
                answers = answers.len(),
                "answers for hosts that forwarded messages are not left: this host's lease is \
                 not live (they say so when their wait ends)"
            );
            return;
        }
        let redactor = &self.redactor;
        for (id, answer) in answers {
            let answer = Answer {
                reply: redactor.redact(&answer.reply).into_owned(),
                error: answer.error.map(|e| redactor.redact_owned(e)),
                outcome: answer.outcome,
            };
            match self.sessions.answer(id, &answer).await {
                Ok(()) => {}
                // The forwarding host waits for it: left again until the store takes it.
                Err(err) if err.is_transient() => {
                    tracing::warn!(forwarded = %id, "cannot leave the answer for the host that forwarded the message yet (trying again): {err}");
                    let sessions = self.sessions.clone();
                    tokio::spawn(leave_answer(sessions, self.store_retry, id, answer));
                }
                Err(err) => {
                    tracing::warn!(forwarded = %id, "cannot leave the answer for the host that forwarded the message: {err}");
                }
            }
        }
    }
}

/// Leaves `answer` for forwarded message `id` every `retry` until the store takes it,
/// refuses it for good, or the forwarding host has long stopped waiting for it.
async fn leave_answer(sessions: Arc<dyn Sessions>, retry: Duration, id: ForwardId, answer: Answer) {
    let give_up = tokio::time::Instant::now() + FORWARDED_ANSWER_LIMIT;
    while tokio::time::Instant::now() < give_up {
        tokio::time::sleep(retry).await;
        match sessions.answer(id, &answer).await {
            Ok(()) => return,
            Err(err) if err.is_transient() => continue,
            Err(err) => {
                tracing::warn!(forwarded = %id, "cannot leave the answer for the host that forwarded the message: {err}");
                return;
            }
        }
    }
    tracing::warn!(forwarded = %id, "gave up leaving the answer for the host that forwarded the message: the store refused it throughout");
}
