//! One exchange with a conversation over HTTP: send a message, then follow the
//! conversation's events until it is idle (answered, its workers and branches reported
//! back), as a stream of [`TurnItem`]s.
//!
//! Exchanges with one conversation run one at a time, so the replies an exchange returns
//! are the ones its own message caused. Messages posted without waiting
//! (`POST /v1/channels/{name}/messages`) are not queued behind them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

use super::hub::{EventHub, Next, Published};
use crate::agent::{Event, Runtime, Sent};
use crate::ids::ProcessId;

/// How long an exchange waits for the answer of the host that owns the conversation.
const FORWARDED_ANSWER_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// What an exchange reports, in order; the stream ends when the conversation is idle.
#[derive(Debug)]
pub(crate) enum TurnItem {
    /// More of the reply's text. The whole reply is every piece in order: replies after
    /// the first are set off by a blank line.
    Text(String),
    /// Something the conversation's processes did: a tool call, a worker or branch
    /// starting or ending, a denial.
    Activity(Arc<Published>),
    /// A model request of the conversation failed.
    ModelFailed(String),
    /// Events were lost to the stream (the buffer moved on): the reply may be short.
    Lost(u64),
    /// The message could not be sent (the host is shutting down).
    Refused(String),
}

/// One lock per conversation, for exchanges.
#[derive(Default)]
pub(crate) struct TurnLocks {
    locks: Mutex<HashMap<ProcessId, Arc<tokio::sync::Mutex<()>>>>,
}

impl TurnLocks {
    fn lock_for(&self, conversation: &ProcessId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Locks nobody holds or waits for are dropped, so the map stays as small as the
        // exchanges in progress.
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.entry(conversation.clone()).or_default().clone()
    }
}

/// Starts an exchange: `text` to `conversation`, its items on the returned channel. The
/// exchange runs to the end even if the receiver goes away (the message was sent; its
/// turn finishes and is stored either way).
pub(crate) fn start(
    runtime: Arc<Runtime>,
    hub: Arc<EventHub>,
    locks: &TurnLocks,
    conversation: ProcessId,
    text: String,
) -> mpsc::UnboundedReceiver<TurnItem> {
    let (tx, rx) = mpsc::unbounded_channel();
    let lock = locks.lock_for(&conversation);
    tokio::spawn(async move {
        let _turn = lock.lock().await;
        run(runtime, hub, conversation, text, tx).await;
    });
    rx
}

async fn run(
    runtime: Arc<Runtime>,
    hub: Arc<EventHub>,
    conversation: ProcessId,
    text: String,
    tx: mpsc::UnboundedSender<TurnItem>,
) {
    // Everything before the message is out of the way: the exchange reads from here.
    let after = hub.fence().await;
    let mut events = hub.subscribe(Some(after));
    match runtime.send_or_forward(&conversation, &text).await {
        Err(err) => {
            let _ = tx.send(TurnItem::Refused(err.to_string()));
            return;
        }
        Ok(Sent::Forwarded { number, .. }) => {
            // Answered on the host that owns the conversation; its events stay there.
            match runtime
                .forwarded_answer(number, FORWARDED_ANSWER_LIMIT)
                .await
            {
                Ok(answer) => {
                    if !answer.reply.is_empty() {
                        let _ = tx.send(TurnItem::Text(answer.reply));
                    }
                    if let Some(error) = answer.error {
                        let _ = tx.send(TurnItem::ModelFailed(error));
                    }
                }
                Err(err) => {
                    let _ = tx.send(TurnItem::Refused(err.to_string()));
                }
            }
            return;
        }
        Ok(Sent::Here) => {}
    }
    let (idle_tx, mut idle) = oneshot::channel();
    {
        let (runtime, hub, conversation) = (runtime.clone(), hub.clone(), conversation.clone());
        tokio::spawn(async move {
            runtime.wait_conversation_idle(&conversation).await;
            // Idle now: every event of the exchange was emitted, and is out after this.
            let _ = idle_tx.send(hub.fence().await);
        });
    }
    let mut reply = ReplyText::default();
    let mut end: Option<u64> = None;
    loop {
        if end.is_some_and(|end| events.cursor() >= end) {
            break;
        }
        tokio::select! {
            biased;
            next = events.next() => match next {
                None => break,
                Some(Next::Lost { count }) => {
                    let _ = tx.send(TurnItem::Lost(count));
                }
                Some(Next::Event(published)) => {
                    if published.conversation.as_ref() != Some(&conversation) {
                        continue;
                    }
                    for item in reply.take(&published) {
                        let _ = tx.send(item);
                    }
                }
            },
            fenced = &mut idle, if end.is_none() => {
                end = Some(fenced.unwrap_or_else(|_| hub.latest()));
            }
        }
    }
}

/// Turns a conversation's events into reply text and activity.
#[derive(Default)]
struct ReplyText {
    /// Whether any reply text was given yet.
    started: bool,
    /// Text streamed for the reply in progress.
    streamed: String,
}

impl ReplyText {
    fn take(&mut self, published: &Arc<Published>) -> Vec<TurnItem> {
        let mut items = Vec::new();
        match &published.event {
            Event::Text { text, .. } => {
                if self.streamed.is_empty() && self.started {
                    items.push(TurnItem::Text("\n\n".into()));
                }
                self.started = true;
                self.streamed.push_str(text);
                items.push(TurnItem::Text(text.clone()));
            }
            Event::Reply { text, .. } => {
                let streamed = std::mem::take(&mut self.streamed);
                if streamed == *text {
                    // Already given as it streamed.
                } else if let Some(rest) = text.strip_prefix(streamed.as_str())
                    && !streamed.is_empty()
                {
                    items.push(TurnItem::Text(rest.to_owned()));
                } else {
                    if self.started {
                        items.push(TurnItem::Text("\n\n".into()));
                    }
                    self.started = true;
                    items.push(TurnItem::Text(text.clone()));
                }
            }
            Event::ModelFailed { error, .. } => {
                items.push(TurnItem::ModelFailed(error.clone()));
                items.push(TurnItem::Activity(published.clone()));
            }
            Event::TurnStarted { .. } | Event::TurnFinished { .. } => {}
            _ => items.push(TurnItem::Activity(published.clone())),
        }
        items
    }
}
