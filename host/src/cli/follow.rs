//! What `run`, `chat` and `demo` show of a conversation: the parts of each message's
//! exchange, in the order the messages were sent, each part once.
//!
//! A chat's lines go in as they are typed, so two exchanges of one conversation may be
//! under way at once, and a part the conversation sends while both are attached reaches
//! both. Such parts are numbered ([`PartNumber`]); the exchanges are followed one after
//! another, and a part whose number was shown already is not shown again.

use std::io::Write;
use std::sync::Arc;

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

/// What the follower takes next.
enum Queued {
    /// An exchange being opened, and who hears once it is followed to its end.
    Exchange(
        JoinHandle<anyhow::Result<Exchange>>,
        Option<oneshot::Sender<()>>,
    ),
    /// Who hears once every exchange queued before is followed to its end.
    Mark(oneshot::Sender<()>),
}

/// The exchanges of one session, followed in the order their messages were sent.
pub(crate) struct Session {
    queue: mpsc::UnboundedSender<Queued>,
    follower: JoinHandle<(Tally, Option<anyhow::Error>)>,
}

impl Session {
    /// A session showing what its exchanges say as they say it.
    pub(crate) fn start() -> Session {
        let (queue, mut queued) = mpsc::unbounded_channel::<Queued>();
        let follower = tokio::spawn(async move {
            let mut shown = Shown::default();
            let mut error = None;
            while let Some(item) = queued.recv().await {
                let (opening, done) = match item {
                    Queued::Exchange(opening, done) => (opening, done),
                    Queued::Mark(done) => {
                        let _ = done.send(());
                        continue;
                    }
                };
                match opening.await {
                    Ok(Ok(exchange)) => shown.follow(exchange).await,
                    Ok(Err(err)) => error = Some(err),
                    Err(err) => error = Some(anyhow::anyhow!("an exchange's task ended: {err}")),
                }
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
            shown.end_line();
            (shown.tally, error)
        });
        Session { queue, follower }
    }

    /// Sends `message` to `conversation` at once (it goes in even while earlier messages'
    /// work runs); what it causes is shown after the earlier messages' exchanges end.
    pub(crate) fn send(&self, runtime: &Arc<Runtime>, conversation: &ProcessId, message: String) {
        let opening = open(runtime, conversation, message);
        let _ = self.queue.send(Queued::Exchange(opening, None));
    }

    /// Returns once every exchange sent so far has ended and been shown.
    pub(crate) async fn settled(&self) {
        let (done, settled) = oneshot::channel();
        if self.queue.send(Queued::Mark(done)).is_ok() {
            let _ = settled.await;
        }
    }

    /// Sends `message` to `conversation` and returns once its exchange has ended and been
    /// shown.
    pub(crate) async fn converse(
        &self,
        runtime: &Arc<Runtime>,
        conversation: &ProcessId,
        message: String,
    ) {
        let (done, shown) = oneshot::channel();
        let opening = open(runtime, conversation, message);
        if self
            .queue
            .send(Queued::Exchange(opening, Some(done)))
            .is_ok()
        {
            let _ = shown.await;
        }
    }

    /// Waits for every exchange sent to end and be shown: how they went, and the first
    /// error that kept a message from being sent.
    pub(crate) async fn end(self) -> (Tally, Option<anyhow::Error>) {
        drop(self.queue);
        self.follower.await.unwrap_or_else(|err| {
            let error = anyhow::anyhow!("following the exchanges failed: {err}");
            (Tally::default(), Some(error))
        })
    }
}

/// Opens the exchange of `message` to `conversation` on a task of its own, so that
/// opening the conversation (reading its history) holds up no other line.
fn open(
    runtime: &Arc<Runtime>,
    conversation: &ProcessId,
    message: String,
) -> JoinHandle<anyhow::Result<Exchange>> {
    let (runtime, conversation) = (runtime.clone(), conversation.clone());
    tokio::spawn(async move { Ok(runtime.exchange(&conversation, message).await?) })
}

/// What has been shown on the terminal.
#[derive(Default)]
struct Shown {
    /// The last numbered part shown.
    last: Option<PartNumber>,
    /// Whether a reply is being written on the current line, as it streams.
    streaming: bool,
    tally: Tally,
}

impl Shown {
    /// Shows what `exchange` says that was not shown, to its end, and counts a failure of
    /// the exchange itself.
    async fn follow(&mut self, mut exchange: Exchange) {
        let mut forwarded = false;
        let mut end = End::Lost;
        while let Some((number, part)) = exchange.next_numbered().await {
            if let Some(number) = number {
                if self.last.is_some_and(|last| number <= last) {
                    continue;
                }
                self.last = Some(number);
            }
            match part {
                ReplyPart::End(ended) => end = ended,
                ReplyPart::Activity(Event::Forwarded { .. }) => {
                    forwarded = true;
                    self.show(part);
                }
                part => self.show(part),
            }
        }
        self.end_line();
        let failed = match &end {
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
            }
            // Shown as it streamed: its line ends.
            ReplyPart::Reply { streamed: true, .. } if self.streaming => self.end_line(),
            ReplyPart::Reply { text, .. } => {
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
