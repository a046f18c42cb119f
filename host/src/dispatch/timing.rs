//! The dispatch timers. A model may answer slowly as long as it keeps answering: one
//! bound covers the wait for the first piece of an answer, the same one each gap between
//! pieces, and a separate, generous one the whole answer. The provider reports pieces
//! through an [`AnswerSink`]; [`Progress`] is that sink, and [`bounded`] owns the timers.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::GateSettings;
use crate::llm::{AnswerSink, Delta};

/// The bound a dispatch outlived, with the `[limits]` key that raises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TooSlow {
    /// Nothing of the answer arrived in time.
    #[error(
        "the model sent nothing within {limit:?} of the request; `limits.dispatch_timeout_secs` \
         bounds the wait for the first piece of an answer (raise it in capstan.toml for a slow \
         model)"
    )]
    FirstChunk {
        /// The bound.
        limit: Duration,
    },
    /// The answer started, then stalled.
    #[error(
        "the model's answer stalled: nothing more arrived for {limit:?}; \
         `limits.dispatch_timeout_secs` bounds the gap between pieces of an answer (raise it \
         in capstan.toml for a slow model)"
    )]
    Gap {
        /// The bound.
        limit: Duration,
    },
    /// The answer kept coming for longer than a whole answer may take.
    #[error(
        "the model's answer took longer than {limit:?} in all; `limits.dispatch_total_secs` \
         bounds a whole answer (raise it in capstan.toml for longer answers)"
    )]
    Total {
        /// The bound.
        limit: Duration,
    },
}

impl TooSlow {
    /// The `capstan.toml` key that sets the bound.
    ///
    /// ```
    /// use std::time::Duration;
    /// use capstan_host::dispatch::TooSlow;
    ///
    /// let late = TooSlow::Gap { limit: Duration::from_secs(30) };
    /// assert_eq!(late.key(), "limits.dispatch_timeout_secs");
    /// assert!(late.to_string().contains("limits.dispatch_timeout_secs"));
    /// ```
    pub fn key(&self) -> &'static str {
        match self {
            TooSlow::FirstChunk { .. } | TooSlow::Gap { .. } => "limits.dispatch_timeout_secs",
            TooSlow::Total { .. } => "limits.dispatch_total_secs",
        }
    }
}

/// The sink a dispatch gives its provider: notes that the answer moved on, and passes
/// each delta to the caller's sink.
pub(crate) struct Progress<'a> {
    caller: &'a dyn AnswerSink,
    started: AtomicBool,
    moved: Notify,
}

impl<'a> Progress<'a> {
    pub(crate) fn new(caller: &'a dyn AnswerSink) -> Self {
        Progress {
            caller,
            started: AtomicBool::new(false),
            moved: Notify::new(),
        }
    }
}

impl AnswerSink for Progress<'_> {
    fn delta(&self, delta: Delta) {
        self.started.store(true, Ordering::Release);
        // A permit is stored if the timers are not waiting right now, so no delta is missed.
        self.moved.notify_one();
        self.caller.delta(delta);
    }
}

/// Runs `answer`, whose provider reports to `progress`, within `settings`' bounds.
pub(crate) async fn bounded<T>(
    settings: &GateSettings,
    progress: &Progress<'_>,
    answer: impl Future<Output = T>,
) -> Result<T, TooSlow> {
    let total = tokio::time::sleep(settings.total);
    tokio::pin!(answer, total);
    loop {
        let late = if progress.started.load(Ordering::Acquire) {
            TooSlow::Gap {
                limit: settings.timeout,
            }
        } else {
            TooSlow::FirstChunk {
                limit: settings.timeout,
            }
        };
        tokio::select! {
            // The answer first: one that is ready is taken even when a bound ran out with it.
            biased;
            out = &mut answer => return Ok(out),
            // A piece arrived: the gap timer starts again.
            () = progress.moved.notified() => {}
            () = tokio::time::sleep(settings.timeout) => return Err(late),
            () = &mut total => return Err(TooSlow::Total { limit: settings.total }),
        }
    }
}
