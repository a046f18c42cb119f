//! [`EventHub`]: the runtime's events, numbered, kept in a bounded buffer and handed to
//! every client at its own pace.
//!
//! One task drains the runtime's event stream into a ring buffer; each client holds only a
//! cursor (the id of the last event it saw) and reads the buffer from there. A client that
//! falls behind further than the buffer holds is told how many events it lost instead of
//! holding memory for them. Ids start at 1 and never repeat within one run of the hub; a
//! client sees them with the run's [`RunTag`] ([`EventId`]), so an id from an earlier run
//! of the server is never taken for one of this run.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot, watch};

use crate::agent::Event;
use crate::ids::ProcessId;
use crate::secrets::Redactor;

/// One event as clients get it.
#[derive(Debug)]
pub(crate) struct Published {
    /// Its number: 1 for the host's first event, one more for each after.
    pub(crate) id: u64,
    /// The conversation it belongs to, if it could be told.
    pub(crate) conversation: Option<ProcessId>,
    /// The event.
    pub(crate) event: Event,
    /// Its JSON form, with every secret value redacted.
    pub(crate) json: String,
}

/// Why a client's `Last-Event-ID` cannot be resumed from: it is told so by a `reset`
/// event, then gets live events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResetReason {
    /// The id is of another run of the server (it restarted), or of no run (a bare number).
    AnotherRun,
    /// The id is past the newest event of this run.
    Future,
    /// Events after the id have left the buffer.
    Evicted,
}

impl ResetReason {
    /// Its name in the `reset` event: `another_run`, `future`, `evicted`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ResetReason::AnotherRun => "another_run",
            ResetReason::Future => "future",
            ResetReason::Evicted => "evicted",
        }
    }
}

/// What a [`Subscription`] reads next.
#[derive(Debug)]
pub(crate) enum Next {
    /// The next event.
    Event(Arc<Published>),
    /// Events the client was too slow for: they left the buffer before it read them.
    Lost {
        /// How many.
        count: u64,
    },
}

/// Which run of the hub an event id belongs to: random, drawn when the hub starts, so a
/// server that restarts never hands out an id a client could take for an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunTag(u64);

impl RunTag {
    fn new() -> RunTag {
        let mut bytes = [0u8; 8];
        // Without the system's randomness, the clock still differs from run to run.
        if getrandom::fill(&mut bytes).is_err() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            bytes = nanos.to_le_bytes();
        }
        RunTag(u64::from_le_bytes(bytes))
    }
}

impl std::fmt::Display for RunTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// An event's id as a client sees it: `RUN-N`, the hub's run and the event's number.
///
/// ```text
/// id: 3f9a0c5e11d2b7a4-42
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EventId {
    /// The run of the hub that numbered it.
    pub(crate) run: RunTag,
    /// Its number in that run.
    pub(crate) number: u64,
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.run, self.number)
    }
}

impl std::str::FromStr for EventId {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let (run, number) = text.trim().split_once('-').ok_or(())?;
        if run.len() != 16 {
            return Err(());
        }
        Ok(EventId {
            run: RunTag(u64::from_str_radix(run, 16).map_err(|_| ())?),
            number: number.parse().map_err(|_| ())?,
        })
    }
}

/// The runtime's events for every client. See the [module docs](self).
pub(crate) struct EventHub {
    /// This run, in every id a client sees.
    run: RunTag,
    ring: Mutex<Ring>,
    /// The id of the newest event, and whether the stream has ended.
    latest: watch::Sender<(u64, bool)>,
    control: mpsc::UnboundedSender<Control>,
}

/// What the hub's task is asked besides publishing.
enum Control {
    /// Answer once everything queued is published (the tests' way to wait for it).
    #[cfg_attr(not(test), expect(dead_code, reason = "asked only by the tests"))]
    Fence(oneshot::Sender<u64>),
    /// Publish what is queued, then end every stream.
    Close,
}

struct Ring {
    events: VecDeque<Arc<Published>>,
    capacity: usize,
    /// Which conversation each live worker, branch and compaction belongs to.
    owners: HashMap<ProcessId, ProcessId>,
}

/// Owners remembered at most: past it (processes that never reported their end), the map
/// starts over.
const MAX_OWNERS: usize = 1 << 16;

impl EventHub {
    /// Starts draining `events` into a hub keeping the last `capacity` of them, each
    /// serialized once with `redactor` applied. The hub's stream ends when `events` does.
    pub(crate) fn start(
        events: mpsc::UnboundedReceiver<Event>,
        capacity: usize,
        redactor: Redactor,
    ) -> Arc<EventHub> {
        let (latest, _) = watch::channel((0, false));
        let (control, control_rx) = mpsc::unbounded_channel();
        let hub = Arc::new(EventHub {
            run: RunTag::new(),
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(capacity.min(4096)),
                capacity: capacity.max(1),
                owners: HashMap::new(),
            }),
            latest,
            control,
        });
        tokio::spawn(drain(hub.clone(), events, control_rx, redactor));
        hub
    }

    /// The id of the newest event published (0 before the first).
    pub(crate) fn latest(&self) -> u64 {
        self.latest.borrow().0
    }

    /// Event `number` of this run, as a client sees its id.
    pub(crate) fn id(&self, number: u64) -> EventId {
        EventId {
            run: self.run,
            number,
        }
    }

    /// Where a client that last saw `seen` resumes: after that event, if it is of this run
    /// and the events after it are all still kept; otherwise why it cannot.
    pub(crate) fn resume(&self, seen: EventId) -> Result<u64, ResetReason> {
        if seen.run != self.run {
            return Err(ResetReason::AnotherRun);
        }
        if seen.number > self.latest() {
            return Err(ResetReason::Future);
        }
        let (_, oldest) = self.lookup(seen.number + 1);
        match oldest {
            Some(oldest) if oldest > seen.number + 1 => Err(ResetReason::Evicted),
            _ => Ok(seen.number),
        }
    }

    /// Waits until every event the runtime emitted before this call is published, and
    /// returns the newest id. What happened before (a conversation gone idle) is then
    /// visible to every subscription.
    #[cfg(test)]
    pub(crate) async fn fence(&self) -> u64 {
        let (tx, rx) = oneshot::channel();
        if self.control.send(Control::Fence(tx)).is_err() {
            return self.latest();
        }
        rx.await.unwrap_or_else(|_| self.latest())
    }

    /// Publishes what the runtime emitted so far, then ends every stream: clients get
    /// what is buffered, then the end. For a server stopping while clients still listen.
    pub(crate) fn close(&self) {
        let _ = self.control.send(Control::Close);
    }

    /// Reads events after id `after`: from the next event published with `None`.
    pub(crate) fn subscribe(self: &Arc<Self>, after: Option<u64>) -> Subscription {
        let changes = self.latest.subscribe();
        let cursor = after.unwrap_or_else(|| changes.borrow().0);
        Subscription {
            hub: self.clone(),
            cursor,
            changes,
        }
    }

    /// The event numbered `id` and the id of the oldest one kept, if any is.
    fn lookup(&self, id: u64) -> (Option<Arc<Published>>, Option<u64>) {
        let ring = self.ring();
        let Some(oldest) = ring.events.front().map(|p| p.id) else {
            return (None, None);
        };
        let found = id
            .checked_sub(oldest)
            .and_then(|index| ring.events.get(index as usize))
            .cloned();
        (found, Some(oldest))
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        // Every change is made whole under the lock; a poisoned lock guards whole data.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, event: Event, redactor: &Redactor) {
        let json = serde_json::to_string(&event).unwrap_or_else(|err| {
            format!(
                r#"{{"type":"unserializable","error":{:?}}}"#,
                err.to_string()
            )
        });
        let json = redactor.redact_owned(json);
        let id = {
            let mut ring = self.ring();
            let process = event.process().clone();
            let conversation = match event.conversation() {
                Some(conversation) => {
                    if &process != conversation {
                        if ring.owners.len() >= MAX_OWNERS {
                            ring.owners.clear();
                        }
                        ring.owners.insert(process.clone(), conversation.clone());
                    }
                    Some(conversation.clone())
                }
                None => ring.owners.get(&process).cloned(),
            };
            if event.ends_process() {
                ring.owners.remove(&process);
            }
            let id = self.latest() + 1;
            if ring.events.len() >= ring.capacity {
                ring.events.pop_front();
            }
            ring.events.push_back(Arc::new(Published {
                id,
                conversation,
                event,
                json,
            }));
            id
        };
        // After the buffer holds it: a client woken by this finds it there.
        self.latest.send_replace((id, false));
    }
}

/// The hub's one task: publishes events in order, answers each fence once everything
/// queued before it is out, and ends the streams when the runtime's stream ends or the
/// hub is closed.
async fn drain(
    hub: Arc<EventHub>,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut control: mpsc::UnboundedReceiver<Control>,
    redactor: Redactor,
) {
    loop {
        tokio::select! {
            biased;
            asked = control.recv() => {
                while let Ok(event) = events.try_recv() {
                    hub.publish(event, &redactor);
                }
                match asked {
                    Some(Control::Fence(fence)) => {
                        let _ = fence.send(hub.latest());
                    }
                    Some(Control::Close) | None => break,
                }
            }
            event = events.recv() => match event {
                Some(event) => hub.publish(event, &redactor),
                None => break,
            },
        }
    }
    let latest = hub.latest();
    hub.latest.send_replace((latest, true));
    // Fences asked from now on find the stream ended.
    control.close();
    while let Ok(asked) = control.try_recv() {
        if let Control::Fence(fence) = asked {
            let _ = fence.send(latest);
        }
    }
}

/// One client's place in the hub's events.
pub(crate) struct Subscription {
    hub: Arc<EventHub>,
    cursor: u64,
    changes: watch::Receiver<(u64, bool)>,
}

impl Subscription {
    /// The id of the last event read (or skipped as lost).
    pub(crate) fn cursor(&self) -> u64 {
        self.cursor
    }

    /// The next event, or how many were lost before it; `None` once the runtime's stream
    /// has ended and every event was read.
    pub(crate) async fn next(&mut self) -> Option<Next> {
        loop {
            // Marked seen before the buffer is read, so a publish after the read wakes us.
            let (latest, ended) = *self.changes.borrow_and_update();
            if self.cursor < latest {
                let (found, oldest) = self.hub.lookup(self.cursor + 1);
                if let Some(published) = found {
                    self.cursor = published.id;
                    return Some(Next::Event(published));
                }
                let oldest = oldest.unwrap_or(latest + 1);
                if oldest > self.cursor + 1 {
                    let count = oldest - self.cursor - 1;
                    self.cursor = oldest - 1;
                    return Some(Next::Lost { count });
                }
            }
            if ended {
                return None;
            }
            if self.changes.changed().await.is_err() {
                // The hub is gone: read what is left, then end.
                let (latest, _) = *self.changes.borrow();
                if self.cursor >= latest {
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ProcessKind;

    fn reply(n: usize) -> Event {
        Event::Reply {
            channel: ProcessId::channel("main"),
            text: format!("reply {n}"),
        }
    }

    #[tokio::test]
    async fn clients_read_in_order_resume_and_are_told_what_they_lost() {
        let (tx, rx) = mpsc::unbounded_channel();
        let hub = EventHub::start(rx, 3, Redactor::default());
        let mut live = hub.subscribe(None);
        for n in 1..=5 {
            tx.send(reply(n)).unwrap();
        }
        assert_eq!(hub.fence().await, 5);
        // A live client from id 0 was slower than the buffer: two lost, then 3..=5.
        assert!(matches!(live.next().await, Some(Next::Lost { count: 2 })));
        for id in 3..=5 {
            match live.next().await {
                Some(Next::Event(p)) => assert_eq!(p.id, id),
                other => panic!("{other:?}"),
            }
        }
        // Resuming after 4 gives 5 alone.
        let mut resumed = hub.subscribe(Some(4));
        match resumed.next().await {
            Some(Next::Event(p)) => assert_eq!((p.id, p.json.contains("reply 5")), (5, true)),
            other => panic!("{other:?}"),
        }
        drop(tx);
        assert!(live.next().await.is_none(), "the stream ended");
        assert!(resumed.next().await.is_none());
    }

    #[tokio::test]
    async fn a_workers_events_belong_to_the_conversation_that_started_it() {
        let (tx, rx) = mpsc::unbounded_channel();
        let hub = EventHub::start(rx, 16, Redactor::default());
        let mut all = hub.subscribe(None);
        let worker = ProcessId::numbered(ProcessKind::Worker, 7);
        let channel = ProcessId::channel("ops");
        tx.send(Event::WorkerStarted {
            worker: worker.clone(),
            channel: channel.clone(),
            task: "t".into(),
        })
        .unwrap();
        tx.send(Event::ToolCalled {
            process: worker.clone(),
            tool: "file_read".into(),
        })
        .unwrap();
        tx.send(Event::WorkerEnded {
            worker: worker.clone(),
            state: crate::services::WorkerState::Done,
            outcome: "ok".into(),
        })
        .unwrap();
        tx.send(Event::ToolCalled {
            process: worker.clone(),
            tool: "late".into(),
        })
        .unwrap();
        hub.fence().await;
        let mut owners = Vec::new();
        for _ in 0..4 {
            match all.next().await {
                Some(Next::Event(p)) => owners.push(p.conversation.clone()),
                other => panic!("{other:?}"),
            }
        }
        let ops = Some(channel);
        assert_eq!(owners, [ops.clone(), ops.clone(), ops, None]);
    }

    #[tokio::test]
    async fn closing_ends_every_stream_after_what_was_queued() {
        let (tx, rx) = mpsc::unbounded_channel();
        let hub = EventHub::start(rx, 16, Redactor::default());
        let mut client = hub.subscribe(None);
        tx.send(reply(1)).unwrap();
        hub.close();
        assert!(matches!(client.next().await, Some(Next::Event(p)) if p.id == 1));
        assert!(client.next().await.is_none());
        // The runtime's sender is still alive; the hub ended anyway, and takes no more.
        assert!(tx.send(reply(2)).is_err());
        assert_eq!(hub.fence().await, 1);
    }

    #[tokio::test]
    async fn a_fence_waits_for_what_was_emitted_before_it() {
        let (tx, rx) = mpsc::unbounded_channel();
        let hub = EventHub::start(rx, 1024, Redactor::default());
        for n in 0..500 {
            tx.send(reply(n)).unwrap();
        }
        assert_eq!(hub.fence().await, 500);
        assert_eq!(hub.latest(), 500);
    }
}
