//! One exchange with a conversation over HTTP: the runtime's [`Exchange`] for a message,
//! run one at a time per conversation, with the wait for the store bounded.
//!
//! Exchanges with one conversation run one at a time, so the replies an exchange returns
//! are the ones its own message caused. Messages posted without waiting
//! (`POST /v1/channels/{name}/messages`) are not queued behind them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::agent::{Exchange, ReplyPart, Runtime, UserMessage};
use crate::ids::ProcessId;

/// What an exchange reports, in order; the last is an [`ReplyPart::End`], a
/// [`TurnItem::Refused`] or a [`TurnItem::NotYetStored`].
#[derive(Debug)]
pub(crate) enum TurnItem {
    /// A part of the answer.
    Part(ReplyPart),
    /// The message could not be sent (the host is shutting down, its conversation cannot
    /// be opened): nothing of it is stored.
    Refused(String),
    /// The store refused the conversation's history and did not take it within
    /// `limits.unstored_reply_secs`: the answer so far is kept in the host, written once
    /// the store is back, and the door answers with it marked as not yet stored.
    NotYetStored(String),
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

/// Starts an exchange: `message` to `conversation`, its items on the returned channel. The
/// exchange holds its conversation's lock to its end even if the receiver goes away (the
/// message was sent; its turn finishes and is stored either way).
pub(crate) fn start(
    runtime: Arc<Runtime>,
    locks: &TurnLocks,
    conversation: ProcessId,
    message: UserMessage,
) -> mpsc::UnboundedReceiver<TurnItem> {
    let (tx, rx) = mpsc::unbounded_channel();
    let lock = locks.lock_for(&conversation);
    let store_wait = runtime.config().limits.unstored_reply;
    tokio::spawn(async move {
        let turn = lock.lock_owned().await;
        match runtime.exchange(&conversation, message).await {
            Ok(exchange) => relay(exchange, store_wait, &tx, turn).await,
            Err(err) => {
                let _ = tx.send(TurnItem::Refused(err.to_string()));
            }
        }
    });
    rx
}

/// Passes `exchange`'s parts on until it ends; once the store refused its history (or did
/// not answer), for at most `store_wait` in all before [`TurnItem::NotYetStored`]. `turn` (the conversation's
/// lock) is held until the exchange ends, or until it is told not yet stored: its answer
/// is whole by then, and the conversation goes on answering while the store is out.
async fn relay(
    mut exchange: Exchange,
    store_wait: Duration,
    tx: &mpsc::UnboundedSender<TurnItem>,
    turn: tokio::sync::OwnedMutexGuard<()>,
) {
    let mut turn = Some(turn);
    let mut deadline = None;
    let mut told = false;
    loop {
        let next = match deadline {
            Some(deadline) if !told => {
                match tokio::time::timeout_at(deadline, exchange.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        told = true;
                        turn.take();
                        let error = "the store has not taken the conversation's history yet";
                        let _ = tx.send(TurnItem::NotYetStored(error.to_owned()));
                        continue;
                    }
                }
            }
            _ => exchange.next().await,
        };
        let Some(part) = next else { return };
        if let ReplyPart::NotYetStored { error, waited } = &part
            && deadline.is_none()
        {
            deadline = Some(tokio::time::Instant::now() + store_wait.saturating_sub(*waited));
            tracing::warn!("an exchange waits for the store: {error}");
        }
        if !told {
            let _ = tx.send(TurnItem::Part(part));
        }
    }
}
