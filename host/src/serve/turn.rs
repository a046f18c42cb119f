//! One exchange with a conversation over HTTP: the runtime's [`Exchange`] for a message,
//! with the wait for the store bounded.

use std::sync::Arc;
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

/// Starts an exchange: `message` to `conversation`, its items on the returned channel.
/// Its answer is its own message's work: exchanges with one conversation run side by
/// side, and one whose message the conversation takes in with others (they arrived while
/// it was busy) shares that turn's answer with them.
pub(crate) fn start(
    runtime: Arc<Runtime>,
    conversation: ProcessId,
    message: UserMessage,
) -> mpsc::UnboundedReceiver<TurnItem> {
    let (tx, rx) = mpsc::unbounded_channel();
    let store_wait = runtime.config().limits.unstored_reply;
    tokio::spawn(async move {
        match runtime.exchange(&conversation, message).await {
            Ok(exchange) => relay(exchange, store_wait, &tx).await,
            Err(err) => {
                let _ = tx.send(TurnItem::Refused(err.to_string()));
            }
        }
    });
    rx
}

/// Passes `exchange`'s parts on until it ends; once the store refused its history (or did
/// not answer), for at most `store_wait` in all before [`TurnItem::NotYetStored`]: its
/// answer is whole by then, and the conversation goes on answering while the store is
/// out.
async fn relay(mut exchange: Exchange, store_wait: Duration, tx: &mpsc::UnboundedSender<TurnItem>) {
    let mut deadline = None;
    loop {
        let next = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, exchange.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let error = "the store has not taken the conversation's history yet";
                    let _ = tx.send(TurnItem::NotYetStored(error.to_owned()));
                    return;
                }
            },
            None => exchange.next().await,
        };
        let Some(part) = next else { return };
        if let ReplyPart::NotYetStored { error, waited } = &part
            && deadline.is_none()
        {
            deadline = Some(tokio::time::Instant::now() + store_wait.saturating_sub(*waited));
            tracing::warn!("an exchange waits for the store: {error}");
        }
        let _ = tx.send(TurnItem::Part(part));
    }
}
