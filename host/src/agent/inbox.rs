//! The way into a running conversation: what it reacts to ([`ChannelInput`]) and its handle
//! ([`ChannelHandle`]), with the count of work still pending for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, Semaphore, mpsc};

use super::audience::Audience;
use super::exchange::{Listener, UserMessage};
use super::notifications::{Notification, NotificationKind};
use crate::flow::Label;
use crate::ids::{MessageKey, ProcessId};
use crate::llm::Message;
use crate::services::{Epoch, ForwardId, Forwarded};
use crate::telemetry::TraceParent;

/// A message routed to a running worker, labelled with what its sender had read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoutedMessage {
    /// The message.
    pub(crate) text: String,
    /// What the process that routed it had read (trusted: a person routed it).
    pub(crate) label: Label,
}

impl RoutedMessage {
    /// `text`, routed by a person or a client.
    pub(crate) fn trusted(text: impl Into<String>) -> Self {
        RoutedMessage {
            text: text.into(),
            label: Label::trusted(),
        }
    }

    /// The history message the worker reads it as.
    pub(crate) fn message(&self) -> Message {
        Message::user(self.text.clone()).labelled(self.label.clone())
    }
}

/// What a channel reacts to.
#[derive(Debug)]
pub(crate) enum ChannelInput {
    /// A message from the user: sent here, or forwarded by another host (which waits
    /// for the answer).
    User {
        /// The message.
        text: String,
        /// The client's idempotency key, if it gave one.
        key: Option<MessageKey>,
        /// Its number, if another host forwarded it.
        forwarded: Option<ForwardId>,
        /// The exchange waiting for its answer, if a door sent it through one.
        exchange: Option<Box<Listener>>,
        /// The span that sent it, if any: the parent of the turn that takes it in.
        trace: TraceParent,
        /// Who could have written it.
        label: Label,
    },
    /// A worker's or branch's report.
    Result {
        /// e.g. `worker:3`.
        source: ProcessId,
        /// What kind of report it is (kept as such if the channel closes first).
        kind: NotificationKind,
        /// What it reports.
        text: String,
        /// What its source had read.
        label: Label,
        /// The span its source works under (the call that spawned it): the parent of the
        /// turn that takes the report in.
        trace: TraceParent,
    },
    /// A report that arrived after its requester ended, saved in working memory; told in
    /// a turn of its own.
    Notification(Box<Notification>),
    /// Stop after the inputs before this one.
    Close,
}

impl ChannelInput {
    /// A message from the user, sent to this host.
    pub(crate) fn user(text: impl Into<String>) -> Self {
        ChannelInput::User {
            text: text.into(),
            key: None,
            forwarded: None,
            exchange: None,
            trace: TraceParent::none(),
            label: Label::trusted(),
        }
    }

    /// `message` from the user, sent to this host through an exchange that waits for its
    /// answer.
    pub(crate) fn exchange(message: UserMessage, exchange: Listener) -> Self {
        ChannelInput::User {
            text: message.text,
            key: message.key,
            forwarded: None,
            exchange: Some(Box::new(exchange)),
            trace: message.trace,
            label: message.label,
        }
    }

    /// The idempotency key of a user's message, if it has one.
    pub(crate) fn key(&self) -> Option<&MessageKey> {
        match self {
            ChannelInput::User { key, .. } => key.as_ref(),
            _ => None,
        }
    }

    /// What the conversation takes in for `message`, forwarded by another host as
    /// `number`.
    pub(crate) fn forwarded(number: ForwardId, message: Forwarded) -> Self {
        match message {
            Forwarded::User {
                text,
                key,
                traceparent,
                label,
            } => ChannelInput::User {
                text,
                key,
                forwarded: Some(number),
                exchange: None,
                trace: traceparent
                    .map(|header| TraceParent::from_header(&header))
                    .unwrap_or_default(),
                label,
            },
            Forwarded::WorkerLost { worker, outcome } => {
                // The host's own words only: the task is not quoted, since its text is
                // the channel's, as labelled in the channel's history where it was given.
                let text = format!(
                    "failed: the host running it was lost before it ended ({outcome}); \
                     the task you gave it is not run again"
                );
                ChannelInput::Result {
                    source: worker,
                    kind: NotificationKind::Error,
                    text,
                    label: Label::trusted(),
                    trace: TraceParent::none(),
                }
            }
        }
    }

    /// The history message for this input.
    pub(crate) fn message(&self) -> Message {
        match self {
            ChannelInput::User {
                text, key, label, ..
            } => Message {
                key: key.clone(),
                ..Message::user(text.clone()).labelled(label.clone())
            },
            ChannelInput::Result {
                source,
                text,
                label,
                ..
            } => Message::user(format!("[{source}] {text}")).labelled(label.clone()),
            ChannelInput::Notification(note) => {
                Message::user(note.message()).labelled(note.label.clone())
            }
            ChannelInput::Close => unreachable!("Close ends the loop before it is batched"),
        }
    }
}

/// The way into a running channel.
#[derive(Clone)]
pub(crate) struct ChannelHandle {
    pub(crate) inbox: mpsc::UnboundedSender<ChannelInput>,
    /// The epoch this host owns the conversation's session under.
    pub(crate) epoch: Epoch,
    /// Inputs not yet handled plus workers and branches still running for this channel.
    pending: Arc<AtomicUsize>,
    settled: Arc<Notify>,
    /// Admission of workers: a permit is held for a worker's whole life.
    pub(crate) worker_slots: Arc<Semaphore>,
    /// Admission of branches, likewise.
    pub(crate) branch_slots: Arc<Semaphore>,
    /// The exchanges waiting for the conversation's answers.
    pub(crate) audience: Audience,
}

impl ChannelHandle {
    /// A handle on `inbox`, of a session owned under `epoch`, admitting at most `workers`
    /// workers and `branches` branches at once.
    pub(crate) fn new(
        inbox: mpsc::UnboundedSender<ChannelInput>,
        epoch: Epoch,
        workers: usize,
        branches: usize,
    ) -> Self {
        ChannelHandle {
            inbox,
            epoch,
            pending: Arc::new(AtomicUsize::new(0)),
            settled: Arc::new(Notify::new()),
            worker_slots: Arc::new(Semaphore::new(workers)),
            branch_slots: Arc::new(Semaphore::new(branches)),
            audience: Audience::default(),
        }
    }

    pub(crate) fn add_pending(&self) {
        self.pending.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn done_pending(&self) {
        if self.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.settled.notify_waiters();
            self.audience.end_if_settled(|| self.is_idle());
        }
    }

    /// Whether nothing is pending now.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.load(Ordering::SeqCst) == 0
    }

    /// Waits until nothing is pending: every input handled, every worker and branch
    /// reported back.
    pub(crate) async fn settled(&self) {
        loop {
            let settled = self.settled.notified();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
            settled.await;
        }
    }

    /// Queues `input`, counted until the turn that handles it ends.
    pub(crate) fn send(&self, input: ChannelInput) -> bool {
        self.try_send(input).is_ok()
    }

    /// [`ChannelHandle::send`], giving `input` back if the channel is gone.
    pub(crate) fn try_send(&self, input: ChannelInput) -> Result<(), ChannelInput> {
        self.add_pending();
        self.inbox.send(input).map_err(|returned| {
            self.done_pending();
            returned.0
        })
    }
}

/// Everything queued in `inbox` now, without waiting.
pub(crate) fn drain<T>(inbox: &mut mpsc::UnboundedReceiver<T>) -> Vec<T> {
    std::iter::from_fn(|| inbox.try_recv().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::testing::pid;

    #[test]
    fn a_worker_lost_with_its_host_is_told_in_the_host_s_words_alone() {
        let lost = Forwarded::WorkerLost {
            worker: pid("worker:3"),
            outcome: "interrupted".into(),
        };
        let message = ChannelInput::forwarded(ForwardId::new(1), lost).message();
        assert_eq!(
            message.content,
            "[worker:3] failed: the host running it was lost before it ended (interrupted); \
             the task you gave it is not run again"
        );
        assert!(message.label.is_clear());
    }

    #[test]
    fn a_forwarded_message_keeps_its_sender_s_trace_and_an_older_row_has_none() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let stored = format!(r#"{{"type":"user","text":"hi","traceparent":"{header}"}}"#);
        let traced: Forwarded = serde_json::from_str(&stored).unwrap();
        match ChannelInput::forwarded(ForwardId::new(1), traced) {
            ChannelInput::User { trace, .. } => assert_eq!(trace.header().as_deref(), Some(header)),
            other => panic!("{other:?}"),
        }
        // A row written before traces crossed hosts, or by a host with them off.
        let older: Forwarded = serde_json::from_str(r#"{"type":"user","text":"hi"}"#).unwrap();
        match ChannelInput::forwarded(ForwardId::new(2), older) {
            ChannelInput::User { trace, .. } => assert!(trace.is_none()),
            other => panic!("{other:?}"),
        }
        // A host with traces off writes no field.
        let untraced = Forwarded::User {
            text: "hi".into(),
            key: None,
            traceparent: None,
            label: Label::trusted(),
        };
        assert!(
            !serde_json::to_string(&untraced)
                .unwrap()
                .contains("traceparent")
        );
    }
}
