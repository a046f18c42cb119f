//! What `run`, `chat` and `demo` show of a conversation: the parts of each message's
//! exchange as the conversation sends them, each part once.
//!
//! A chat's lines go in as they are typed, so several exchanges of one conversation may be
//! under way at once: a line that only asks something is answered while an earlier line's
//! worker still works. Each exchange hears its own message's work, and messages the
//! conversation took in together share a turn, whose parts reach each of them. Such parts
//! are numbered ([`PartNumber`]); every exchange under way is followed at once, and a part
//! whose number was shown already is not shown again.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::agent::{End, Event, Exchange, PartNumber, ReplyPart, Runtime};
use crate::ids::ProcessId;
use crate::text::{one_line, printable};

/// How a session's exchanges went.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tally {
    /// Workers started.
    pub(crate) workers: usize,
    /// Branches started.
    pub(crate) branches: usize,
    /// Model requests that got no answer, histories not saved, exchanges that failed.
    pub(crate) failures: usize,
}

/// What the opener takes next.
enum Outgoing {
    /// A message to send, and who hears once its exchange has been shown to its end.
    Message(String, Option<oneshot::Sender<()>>),
    /// Who hears once every exchange of a message sent before is shown to its end.
    Mark(oneshot::Sender<()>),
}

/// What the follower takes next.
enum Queued {
    /// An exchange (or why it could not be opened), and who hears once it is shown.
    Exchange(anyhow::Result<Exchange>, Option<oneshot::Sender<()>>),
    /// Who hears once every exchange queued before is shown to its end.
    Mark(oneshot::Sender<()>),
}

/// The exchanges of one session with one conversation, opened in the order their messages
/// were sent and followed all at once.
pub(crate) struct Session {
    outgoing: mpsc::UnboundedSender<Outgoing>,
    opener: JoinHandle<()>,
    follower: JoinHandle<Tally>,
}

impl Session {
    /// A session with `conversation` of `runtime`, showing what its exchanges say as they
    /// say it.
    pub(crate) fn start(runtime: &Arc<Runtime>, conversation: &ProcessId) -> Session {
        let (outgoing, mut messages) = mpsc::unbounded_channel::<Outgoing>();
        let (queue, queued) = mpsc::unbounded_channel::<Queued>();
        let (runtime, conversation) = (runtime.clone(), conversation.clone());
        // Exchanges opened but not yet followed: they may hear parts already shown.
        let opening = Arc::new(AtomicUsize::new(0));
        let follower = tokio::spawn(follow(queued, opening.clone()));
        // One message at a time, in the order sent: the conversation takes them in that
        // order.
        let opener = tokio::spawn(async move {
            while let Some(outgoing) = messages.recv().await {
                let queued = match outgoing {
                    Outgoing::Message(message, done) => {
                        opening.fetch_add(1, Ordering::SeqCst);
                        let opened = runtime.exchange(&conversation, message).await;
                        Queued::Exchange(opened.map_err(Into::into), done)
                    }
                    Outgoing::Mark(done) => Queued::Mark(done),
                };
                let _ = queue.send(queued);
            }
        });
        Session {
            outgoing,
            opener,
            follower,
        }
    }

    /// Sends `message` at once (it goes in even while earlier messages' work runs); what
    /// it causes is shown as it comes, beside what the earlier messages still cause.
    pub(crate) fn send(&self, message: String) {
        let _ = self.outgoing.send(Outgoing::Message(message, None));
    }

    /// Returns once every exchange sent so far has ended and been shown.
    pub(crate) async fn settled(&self) {
        let (done, settled) = oneshot::channel();
        if self.outgoing.send(Outgoing::Mark(done)).is_ok() {
            let _ = settled.await;
        }
    }

    /// Sends `message` and returns once its exchange has ended and been shown.
    pub(crate) async fn converse(&self, message: String) {
        let (done, shown) = oneshot::channel();
        if self
            .outgoing
            .send(Outgoing::Message(message, Some(done)))
            .is_ok()
        {
            let _ = shown.await;
        }
    }

    /// Waits for every exchange sent to end and be shown: how they went.
    pub(crate) async fn end(self) -> Tally {
        drop(self.outgoing);
        let _ = self.opener.await;
        self.follower.await.unwrap_or_default()
    }
}

/// The numbers kept at least before any is forgotten.
const FORGET_AT: usize = 4096;

/// An exchange being followed.
struct Following {
    /// Who hears once it is shown to its end.
    done: Option<oneshot::Sender<()>>,
    /// Whether its message went to another host.
    forwarded: bool,
    /// The last numbered part it brought.
    last: Option<PartNumber>,
}

/// Shows the exchanges `queued` as their parts come, until the queue closes and each
/// has ended: how they went.
async fn follow(mut queued: mpsc::UnboundedReceiver<Queued>, opening: Arc<AtomicUsize>) -> Tally {
    let mut shown = Shown {
        opening,
        ..Shown::default()
    };
    let (parts_tx, mut parts) = mpsc::unbounded_channel();
    // Under way, by the order their messages were sent.
    let mut open: BTreeMap<usize, Following> = BTreeMap::new();
    // Who waits for every exchange before a place in that order.
    let mut marks: Vec<(usize, oneshot::Sender<()>)> = Vec::new();
    let mut sent = 0;
    let mut queue_open = true;
    while queue_open || !open.is_empty() {
        tokio::select! {
            item = queued.recv(), if queue_open => match item {
                None => queue_open = false,
                Some(Queued::Exchange(Ok(mut exchange), done)) => {
                    shown.opening.fetch_sub(1, Ordering::SeqCst);
                    let (number, parts_tx) = (sent, parts_tx.clone());
                    sent += 1;
                    open.insert(number, Following { done, forwarded: false, last: None });
                    tokio::spawn(async move {
                        while let Some(part) = exchange.next_numbered().await {
                            let _ = parts_tx.send((number, part));
                        }
                    });
                }
                Some(Queued::Exchange(Err(err), done)) => {
                    shown.opening.fetch_sub(1, Ordering::SeqCst);
                    // Not sent: nothing of it is stored; said now, counted as failed.
                    shown.end_line();
                    shown.tally.failures += 1;
                    crate::say!("error: {}", one_line(&format!("{err:#}")));
                    done.map(|done| done.send(()));
                }
                Some(Queued::Mark(done)) => marks.push((sent, done)),
            },
            Some((number, (part_number, part))) = parts.recv() => {
                shown.take(&mut open, number, part_number, part);
            }
        }
        let oldest = open.keys().next().copied().unwrap_or(sent);
        for (_, done) in marks.extract_if(.., |(before, _)| *before <= oldest) {
            let _ = done.send(());
        }
    }
    shown.end_line();
    shown.tally
}

/// What has been shown on the terminal.
#[derive(Default)]
struct Shown {
    /// The numbered parts shown, while any exchange is under way.
    numbers: HashSet<PartNumber>,
    /// How many numbers are kept before those no exchange can bring again are forgotten.
    forget_at: usize,
    /// Exchanges opened but not yet followed: they may bring any number.
    opening: Arc<AtomicUsize>,
    /// The store's refusal last said: each exchange under way hears it, and it is said
    /// once.
    unstored: Option<String>,
    /// Whether a reply is being written on the current line, as it streams.
    streaming: bool,
    /// Whether text streamed since the last reply: a reply that says it was streamed was
    /// shown already, even if something else took its line meanwhile.
    streamed: bool,
    tally: Tally,
}

impl Shown {
    /// Shows `part` of exchange `number` among those `open`, unless it was shown (its
    /// `part_number` was); an end closes it.
    fn take(
        &mut self,
        open: &mut BTreeMap<usize, Following>,
        number: usize,
        part_number: Option<PartNumber>,
        part: ReplyPart,
    ) {
        let Some(following) = open.get_mut(&number) else {
            return;
        };
        if let ReplyPart::End(end) = part {
            if end == End::Complete {
                // The store took the history: a refusal from now on is news.
                self.unstored = None;
            }
            self.end_line();
            self.ended(&end, following.forwarded);
            if let Some(done) = open.remove(&number).and_then(|f| f.done) {
                let _ = done.send(());
            }
            if open.is_empty() && self.opening.load(Ordering::SeqCst) == 0 {
                // No part sent from now on reaches an exchange that ended.
                self.numbers.clear();
            }
            return;
        }
        if let Some(n) = part_number {
            following.last = Some(n);
            if !self.numbers.insert(n) {
                return;
            }
        }
        following.forwarded |= matches!(part, ReplyPart::Activity(Event::Forwarded { .. }));
        if part_number.is_some() {
            self.forget_past(open);
        }
        self.show(part);
    }

    /// Forgets the numbers no exchange under way can bring again (each brings its parts
    /// in order), once there are many.
    fn forget_past(&mut self, open: &BTreeMap<usize, Following>) {
        if self.numbers.len() < self.forget_at.max(FORGET_AT)
            || self.opening.load(Ordering::SeqCst) > 0
        {
            return;
        }
        let floor = open.values().map(|f| f.last).min().flatten();
        if let Some(floor) = floor {
            self.numbers.retain(|&n| n > floor);
        }
        // An exchange that brings nothing holds the floor: not tried again at every part.
        self.forget_at = 2 * self.numbers.len();
    }

    /// Counts and says how an exchange ended, if it failed (`forwarded`: its message went
    /// to another host).
    fn ended(&mut self, end: &End, forwarded: bool) {
        let failed = match end {
            End::Complete | End::Interrupted => false,
            // A model failure of this host's conversation was shown, and counted, as it
            // happened; another host's is known only from its answer.
            End::Failed { .. } => forwarded,
            End::NotStored { .. } | End::Lost | End::Pending { .. } => true,
        };
        if failed {
            self.tally.failures += 1;
            crate::say!("error: {}", one_line(&end.to_string()));
        }
    }

    /// Ends a reply being streamed on the current line.
    fn end_line(&mut self) {
        if std::mem::take(&mut self.streaming) {
            let _ = writeln!(crate::secrets::stdout());
        }
    }

    /// Shows one part: replies on standard output, the rest as status lines on standard
    /// error.
    fn show(&mut self, part: ReplyPart) {
        match part {
            ReplyPart::Text(text) => {
                let mut out = crate::secrets::stdout();
                if !self.streaming {
                    let _ = write!(out, "agent> ");
                }
                let _ = write!(out, "{}", printable(&text).replace('\n', "\n       "));
                let _ = out.flush();
                self.streaming = true;
                self.streamed = true;
            }
            // Shown as it streamed: its line ends.
            ReplyPart::Reply { streamed: true, .. } if self.streamed => {
                self.streamed = false;
                self.end_line();
            }
            ReplyPart::Reply { text, .. } => {
                self.streamed = false;
                self.end_line();
                let text = printable(&text).replace('\n', "\n       ");
                let _ = writeln!(crate::secrets::stdout(), "agent> {text}");
            }
            ReplyPart::Activity(event) => {
                self.end_line();
                match &event {
                    Event::ModelFailed { .. } | Event::HistoryNotSaved { .. } => {
                        self.tally.failures += 1;
                        crate::say!("error: {}", one_line(&event.to_string()));
                        return;
                    }
                    Event::WorkerStarted { .. } => self.tally.workers += 1,
                    Event::BranchStarted { .. } => self.tally.branches += 1,
                    _ => {}
                }
                crate::say!("  {}", one_line(&event.to_string()));
            }
            ReplyPart::Repeated { key } => {
                self.end_line();
                crate::say!("  sent before with key {key}: its answer follows");
            }
            ReplyPart::NotYetStored { error, .. } => {
                if self.unstored.as_ref() == Some(&error) {
                    return;
                }
                self.unstored = Some(error.clone());
                self.end_line();
                crate::say!(
                    "  not yet stored: {}; the host keeps it and writes it again",
                    one_line(&error)
                );
            }
            ReplyPart::End(_) => {}
        }
    }
}
