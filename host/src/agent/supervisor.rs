//! The lifetimes of the processes a runtime started, and the one way a branch or worker
//! runs.
//!
//! [`Supervisor`] knows the open conversations, the running workers and the thinking
//! branches. [`supervise`] runs a branch or a worker in a task of its own: counted in its
//! channel's pending work until its end has been reported, with a panic caught and
//! reported like any other end, so a channel never waits for a report that never comes.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, mpsc};

use super::inbox::{ChannelHandle, ChannelInput, RoutedMessage};
use crate::ids::{ProcessId, ProcessKind};

/// The processes alive now, by id.
#[derive(Default)]
pub(crate) struct Supervisor {
    /// Conversations (user channels and admin sessions).
    channels: Mutex<HashMap<ProcessId, ChannelHandle>>,
    workers: Mutex<HashMap<ProcessId, WorkerHandle>>,
    /// Branches still thinking; a worker a branch spawned reports late once it is gone.
    branches: Mutex<HashSet<ProcessId>>,
    /// Set by [`Supervisor::close_channels`]: no conversation opens after it, so the event
    /// stream ends once the last process has.
    closed: AtomicBool,
    /// Set by [`Supervisor::stop_workers`], under the workers' lock: a worker that
    /// registers later (it waited for a free slot, or was starting as the host stopped)
    /// is stopped as it registers.
    workers_stopped: AtomicBool,
    /// Whether that stop interrupts (the host stops) rather than cancels.
    workers_interrupted: AtomicBool,
}

/// A conversation could not be opened: the host is shutting down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the host is shutting down; no conversation opens now")]
pub struct ShuttingDown;

/// A conversation could not be opened: as many as `limits.max_open_conversations` allows
/// are open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{limit} conversations are open, the most limits.max_open_conversations allows; \
     continue one of them, or raise the limit"
)]
pub struct TooManyConversations {
    /// The limit.
    pub limit: usize,
}

/// The way into a running worker.
pub(crate) struct WorkerHandle {
    /// The conversation it works for.
    pub(crate) channel: ProcessId,
    pub(crate) inbox: mpsc::UnboundedSender<RoutedMessage>,
    pub(crate) cancel: Arc<Notify>,
    /// Set before `cancel` is notified when the host is stopping rather than the
    /// channel cancelling: the worker ends interrupted, not cancelled.
    pub(crate) interrupted: Arc<AtomicBool>,
    /// Its share of its channel's pending work, resumed by a route to it.
    pub(crate) pending: Arc<Pending>,
}

impl Supervisor {
    /// The handle of conversation `id` if it is open (not shut down).
    pub(crate) fn channel(&self, id: &ProcessId) -> Option<ChannelHandle> {
        self.channels.lock().unwrap().get(id).cloned()
    }

    /// The handle of conversation `id`, or the one `open` makes (then registered), under
    /// one lock so that two callers never open the same conversation twice, nor one more
    /// than `limit`. After [`Supervisor::close_channels`], nothing opens.
    pub(crate) fn channel_or_open<E: From<ShuttingDown> + From<TooManyConversations>>(
        &self,
        id: &ProcessId,
        limit: usize,
        open: impl FnOnce() -> Result<ChannelHandle, E>,
    ) -> Result<ChannelHandle, E> {
        let mut channels = self.channels.lock().unwrap();
        if self.closed.load(Ordering::SeqCst) {
            return Err(ShuttingDown.into());
        }
        if let Some(handle) = channels.get(id) {
            return Ok(handle.clone());
        }
        if channels.len() >= limit {
            return Err(TooManyConversations { limit }.into());
        }
        let handle = open()?;
        channels.insert(id.clone(), handle.clone());
        Ok(handle)
    }

    /// Whether [`Supervisor::close_channels`] was called: nothing opens any more.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Tells every open conversation to close (their loops end once their inboxes are
    /// drained), and forgets them.
    pub(crate) fn close_channels(&self) {
        let mut channels = self.channels.lock().unwrap();
        self.closed.store(true, Ordering::SeqCst);
        for (_, channel) in channels.drain() {
            // The loop holds a sender of its own inbox, so it must be told to stop.
            let _ = channel.inbox.send(ChannelInput::Close);
        }
    }

    /// Registers running worker `id`; once the workers were stopped, it is stopped as it
    /// registers, so none runs on after a stop.
    pub(crate) fn worker_started(&self, id: &ProcessId, handle: WorkerHandle) {
        let mut workers = self.workers.lock().unwrap();
        if self.workers_stopped.load(Ordering::SeqCst) {
            let interrupted = self.workers_interrupted.load(Ordering::SeqCst);
            handle.interrupted.store(interrupted, Ordering::SeqCst);
            handle.cancel.notify_one();
        }
        workers.insert(id.clone(), handle);
    }

    /// Unregisters worker `id`: from here on a route to it is refused, not queued.
    pub(crate) fn worker_ended(&self, id: &ProcessId) {
        self.workers.lock().unwrap().remove(id);
    }

    /// Workers running now.
    pub(crate) fn live_workers(&self) -> usize {
        self.workers.lock().unwrap().len()
    }

    /// Sends `message` (a person's) to worker `id`; false if no such worker is running.
    pub(crate) fn route_to_worker(&self, id: &ProcessId, message: &str) -> bool {
        self.route(id, RoutedMessage::trusted(message), |_| true)
    }

    /// Sends `message` to worker `id` of conversation `from` (any conversation's if `from`
    /// is the admin chat), first calling `routing`, so that who follows the routing turn
    /// hears all the worker does with it; false if no such worker is running.
    pub(crate) fn route_from(
        &self,
        from: &ProcessId,
        id: &ProcessId,
        message: RoutedMessage,
        routing: impl FnOnce(),
    ) -> bool {
        self.route(id, message, |worker| {
            let reached = reaches(from, worker);
            if reached {
                routing();
            }
            reached
        })
    }

    /// Sends `message` to worker `id` if `admit` admits it.
    fn route(
        &self,
        id: &ProcessId,
        message: RoutedMessage,
        admit: impl FnOnce(&WorkerHandle) -> bool,
    ) -> bool {
        // Under the registry lock: a worker leaves the registry before it drains its
        // inbox, so every accepted message is either taken or drained.
        // A waiting worker counts again from the moment its answer is queued.
        let workers = self.workers.lock().unwrap();
        workers
            .get(id)
            .filter(|worker| admit(worker))
            .is_some_and(|worker| {
                let sent = worker.inbox.send(message).is_ok();
                if sent {
                    worker.pending.resume();
                }
                sent
            })
    }

    /// Calls `follow` if worker `id` of conversation `of` is running (under the registry
    /// lock, so it reports after the call); where it runs.
    pub(crate) fn follow_worker(
        &self,
        of: &ProcessId,
        id: &ProcessId,
        follow: impl FnOnce(),
    ) -> Holder {
        match self.workers.lock().unwrap().get(id) {
            Some(worker) if &worker.channel == of => {
                follow();
                Holder::Own
            }
            Some(worker) if !reaches(of, worker) => Holder::OtherConversation,
            // The admin chat reaches it, but hears its work only through its conversation.
            _ => Holder::NotHere,
        }
    }

    /// Pauses a waiting worker's `pending` count unless a message is already queued in its
    /// `inbox`; under the registry lock, so a route cannot slip between the check and the
    /// pause.
    pub(crate) fn pause_while_waiting(
        &self,
        inbox: &mpsc::UnboundedReceiver<RoutedMessage>,
        pending: &Pending,
    ) {
        let _workers = self.workers.lock().unwrap();
        if inbox.is_empty() {
            pending.pause();
        }
    }

    /// Cancels worker `id`; false if no such worker is running.
    pub(crate) fn cancel_worker(&self, id: &ProcessId) -> bool {
        self.cancel(id, |_| true)
    }

    /// Cancels worker `id` of conversation `from` (any conversation's if `from` is the
    /// admin chat); false if no such worker is running.
    pub(crate) fn cancel_from(&self, from: &ProcessId, id: &ProcessId) -> bool {
        self.cancel(id, |worker| reaches(from, worker))
    }

    fn cancel(&self, id: &ProcessId, admit: impl FnOnce(&WorkerHandle) -> bool) -> bool {
        match self.workers.lock().unwrap().get(id).filter(|w| admit(w)) {
            Some(worker) => {
                worker.cancel.notify_one();
                true
            }
            None => false,
        }
    }

    /// Stops every running worker, and every one that registers from now on: `interrupted`
    /// (the host is stopping) or cancelled.
    pub(crate) fn stop_workers(&self, interrupted: bool) {
        let workers = self.workers.lock().unwrap();
        self.workers_stopped.store(true, Ordering::SeqCst);
        if interrupted {
            self.workers_interrupted.store(true, Ordering::SeqCst);
        }
        for worker in workers.values() {
            if interrupted {
                worker.interrupted.store(true, Ordering::SeqCst);
            }
            worker.cancel.notify_one();
        }
    }

    /// Marks branch `id` as thinking until the guard drops.
    pub(crate) fn branch_started(self: &Arc<Self>, id: &ProcessId) -> BranchAlive {
        self.branches.lock().unwrap().insert(id.clone());
        BranchAlive {
            supervisor: self.clone(),
            id: id.clone(),
        }
    }

    /// Whether branch `id` is still thinking.
    pub(crate) fn branch_alive(&self, id: &ProcessId) -> bool {
        self.branches.lock().unwrap().contains(id)
    }
}

/// A branch still thinking; see [`Supervisor::branch_started`].
pub(crate) struct BranchAlive {
    supervisor: Arc<Supervisor>,
    id: ProcessId,
}

impl Drop for BranchAlive {
    fn drop(&mut self) {
        self.supervisor.branches.lock().unwrap().remove(&self.id);
    }
}

/// A supervised process's share of its channel's pending work: counted from the start
/// until the supervisor has seen the process end.
pub(crate) struct Pending {
    channel: ChannelHandle,
    counted: AtomicBool,
}

impl Pending {
    /// Stops counting: a worker waiting for input does not keep its channel busy.
    pub(crate) fn pause(&self) {
        if self.counted.swap(false, Ordering::SeqCst) {
            self.channel.done_pending();
        }
    }

    /// Counts again.
    pub(crate) fn resume(&self) {
        if !self.counted.swap(true, Ordering::SeqCst) {
            self.channel.add_pending();
        }
    }
}

/// Where a worker already on a task runs, for a conversation that asks for it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Here, for the conversation that asks.
    Own,
    /// Here, for another conversation: the one that asks cannot reach it.
    OtherConversation,
    /// Not on this host (another host's, or it just ended), or another conversation's
    /// that the asking one (the admin chat) may still reach.
    NotHere,
}

/// Whether conversation `from` may route to or cancel `worker`: its own workers, or any
/// worker for the admin chat. A channel never reaches another conversation's work.
fn reaches(from: &ProcessId, worker: &WorkerHandle) -> bool {
    &worker.channel == from || from.kind() == ProcessKind::Cortex
}

/// Runs the process `start` makes, for `channel`, in a task of its own. It counts in the
/// channel's pending work (the process may [`Pending::pause`] that) until it ends; if it
/// does not end normally (it panicked, or the runtime shut down under it), `failed` is
/// told why, before the count is released, so that its report is queued before the
/// channel can look idle.
pub(crate) fn supervise<P, F>(
    channel: &ChannelHandle,
    start: impl FnOnce(Arc<Pending>) -> P,
    failed: impl FnOnce(String) -> F + Send + 'static,
) where
    P: Future<Output = ()> + Send + 'static,
    F: Future<Output = ()> + Send,
{
    channel.add_pending();
    let pending = Arc::new(Pending {
        channel: channel.clone(),
        counted: AtomicBool::new(true),
    });
    let process = start(pending.clone());
    tokio::spawn(async move {
        // Released last, and even if reporting the failure panics.
        let _release = Release(pending);
        if let Err(why) = run_caught(process).await {
            failed(why).await;
        }
    });
}

/// Stops counting a process's [`Pending`] share when dropped.
struct Release(Arc<Pending>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.pause();
    }
}

/// Runs `process` in its own task and waits for it. `Err` says why it did not end
/// normally: it panicked (with the panic's message) or the runtime shut down under it.
async fn run_caught(process: impl Future<Output = ()> + Send + 'static) -> Result<(), String> {
    match tokio::spawn(process).await {
        Ok(()) => Ok(()),
        Err(err) if err.is_panic() => Err(format!(
            "panicked: {}",
            panic_message(err.into_panic().as_ref())
        )),
        Err(_) => Err("stopped: the runtime shut down".to_owned()),
    }
}

/// The message of a panic payload, if it carries one.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}
