//! This host among others sharing the store: it takes the messages other hosts forward to
//! the conversations it answers, and it stops once its run's lease is lost.
//!
//! A message for a conversation another host answers is forwarded by
//! [`Runtime::send_to`](super::Runtime::send_to) into the store's inbox. The owner looks
//! at the inbox when the store hints that something arrived (and every few seconds
//! anyway), opens the conversation if it is not open, and sends each message in, as if
//! it had been sent here. A conversation whose owner's run is over is taken over by the
//! first host that looks, with its forwarded messages.
//!
//! Each look also marks the workers of hosts that died as interrupted: the store queues a
//! report for each worker's conversation, which its owner tells as a failure. Nothing is
//! run again.

use std::sync::Weak;

use super::context::Context;
use super::conversations::ConversationError;
use super::events::Event;
use crate::ids::ProcessId;

/// Takes forwarded messages for as long as `ctx` lives and is open.
pub(crate) async fn take_forwarded(ctx: Weak<Context>) {
    let Some(sessions) = ctx.upgrade().map(|ctx| ctx.services.sessions.clone()) else {
        return;
    };
    loop {
        sessions.forwarded_wakeup().await;
        let Some(ctx) = ctx.upgrade() else { return };
        if ctx.supervisor.is_closed() {
            return;
        }
        if !ctx.run().is_live() {
            continue;
        }
        mark_lost_workers(&ctx).await;
        let waiting = match sessions.forwarded_sessions(ctx.run_id()).await {
            Ok(waiting) => waiting,
            Err(err) => {
                tracing::warn!("cannot look for forwarded messages (looking again soon): {err}");
                continue;
            }
        };
        for session in waiting {
            let id = session.process();
            if !id.kind().is_conversation() {
                tracing::warn!(
                    session = %session,
                    "messages were forwarded to a session that is no conversation; they stay in the inbox"
                );
                continue;
            }
            // A host that adopts nothing delivers only to its open conversations.
            let adopts = ctx.adopts.load(std::sync::atomic::Ordering::Relaxed);
            if adopts || ctx.supervisor.channel(&id).is_some() {
                deliver(&ctx, &id).await;
            }
        }
    }
}

/// Opens conversation `id` here (taking it over if its owner's run is over) and sends in
/// what was forwarded to it.
async fn deliver(ctx: &std::sync::Arc<Context>, id: &ProcessId) {
    let handle = match ctx.spawner.conversation(id).await {
        Ok(handle) => handle,
        // Another host took it first: it takes the messages too.
        Err(ConversationError::OwnedElsewhere(_) | ConversationError::ShuttingDown(_)) => return,
        Err(err) => {
            tracing::warn!(conversation = %id, "cannot open a conversation to deliver what was forwarded to it (trying again soon): {err}");
            return;
        }
    };
    ctx.conversations.take_forwarded(id, &handle).await;
}

/// Marks the workers of runs that are over (their hosts died) as interrupted, and
/// reports each: the store queues the report for its conversation.
async fn mark_lost_workers(ctx: &Context) {
    match ctx.services.ledger.mark_interrupted_workers().await {
        Ok(lost) => {
            for worker in lost {
                // No exchange waits on it here: its host is gone. Its conversation hears
                // of it through the store.
                tracing::warn!(worker = %worker.id, "a worker of a host that stopped is marked {}", worker.state);
                ctx.reporter.emit(Event::WorkerEnded {
                    worker: worker.id,
                    state: worker.state,
                    outcome: worker.outcome.unwrap_or_default(),
                });
            }
        }
        Err(err) => {
            tracing::warn!("cannot look for workers of hosts that died (looking again soon): {err}")
        }
    }
}

/// Once the run's lease is lost, stops every process of `ctx`: workers end interrupted
/// (their records were, or will be, marked so by another host), conversations close, and
/// nothing more is prompted or written under the run. The host's owner learns of it from
/// [`Runtime::lease_lost`](super::Runtime::lease_lost).
pub(crate) async fn stop_when_lease_lost(ctx: Weak<Context>) {
    // The lease's clock, not the context: waiting must not keep the context alive.
    let Some(lease) = ctx.upgrade().and_then(|ctx| ctx.run().lease().cloned()) else {
        return;
    };
    lease.lost().await;
    if let Some(ctx) = ctx.upgrade() {
        tracing::error!(
            run = %ctx.run_id(),
            "this host's run lease was lost: its conversations close and its workers stop; \
             restart the host to serve again"
        );
        ctx.supervisor.stop_workers(true);
        ctx.supervisor.close_channels();
    }
}
