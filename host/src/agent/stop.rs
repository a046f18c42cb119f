//! [`StopReport`]: what a stopping host could not store, known once every process of it
//! has ended.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::ids::ProcessId;

/// A conversation that stopped with its history not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSaved {
    /// The conversation.
    pub conversation: ProcessId,
    /// The store's last error.
    pub error: String,
    /// The spill file holding its history, written to the store at the next start; `None`:
    /// what it did since its last stored exchange is lost.
    pub spilled: Option<std::path::PathBuf>,
}

/// Held by the spawner until the runtime shuts down, and by every process it runs (each
/// kit carries one): once the last is dropped, every process has ended, and the
/// [`StopReport`] says what was not saved.
#[derive(Clone)]
pub(crate) struct Running {
    _ended_on_drop: Arc<watch::Sender<()>>,
}

/// What the runtime keeps for the stop: the conversations not saved, and the end of the
/// last process that was [`Running`].
pub(crate) struct StopLedger {
    not_saved: Arc<Mutex<Vec<NotSaved>>>,
    ended: watch::Receiver<()>,
}

impl StopLedger {
    /// A ledger, and the token whose last clone's drop ends its reports' wait.
    pub(crate) fn new() -> (Self, Running) {
        let (sender, ended) = watch::channel(());
        let ledger = StopLedger {
            not_saved: Arc::default(),
            ended,
        };
        let running = Running {
            _ended_on_drop: Arc::new(sender),
        };
        (ledger, running)
    }

    /// Notes a conversation as stopped with its history not stored.
    pub(crate) fn not_saved(&self, lost: NotSaved) {
        let mut list = self.not_saved.lock().unwrap_or_else(|p| p.into_inner());
        list.push(lost);
    }

    /// The conversations noted so far.
    pub(crate) fn so_far(&self) -> Vec<NotSaved> {
        self.not_saved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A report on this ledger.
    pub(crate) fn report(&self) -> StopReport {
        StopReport {
            not_saved: self.not_saved.clone(),
            ended: self.ended.clone(),
        }
    }
}

/// What a stop could not store: taken before the runtime is dropped
/// ([`Runtime::stop_report`](super::Runtime::stop_report)), read once every process has
/// ended.
///
/// ```no_run
/// # async fn example(runtime: std::sync::Arc<capstan_host::agent::Runtime>) {
/// let report = runtime.stop_report();
/// runtime.interrupt();
/// drop(runtime);
/// for lost in report.ended().await {
///     eprintln!("{} was not saved: {}", lost.conversation, lost.error);
/// }
/// # }
/// ```
pub struct StopReport {
    not_saved: Arc<Mutex<Vec<NotSaved>>>,
    ended: watch::Receiver<()>,
}

impl StopReport {
    /// Waits until every process of the runtime has ended (the runtime and everything it
    /// ran are dropped), then returns the conversations whose history was not stored.
    pub async fn ended(mut self) -> Vec<NotSaved> {
        while self.ended.changed().await.is_ok() {}
        self.so_far()
    }

    /// [`StopReport::ended`], waiting at most `limit`: `Err` with the conversations noted
    /// so far if some process had not ended by then.
    pub async fn ended_within(
        self,
        limit: std::time::Duration,
    ) -> Result<Vec<NotSaved>, Vec<NotSaved>> {
        let not_saved = self.not_saved.clone();
        tokio::time::timeout(limit, self.ended())
            .await
            .map_err(|_| not_saved.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    fn so_far(&self) -> Vec<NotSaved> {
        self.not_saved
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
