//! The gate's semantics, raced with real tasks against a provider with controllable delays.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;
use crate::llm::{BoxFuture, Delta, Message, ToolChoice};

/// Answers "ok" after `delay`, or fails, and counts the prompts that reached it.
struct Counting {
    calls: AtomicUsize,
    delay: Duration,
    fail: bool,
}

impl Provider for Counting {
    fn complete<'a>(
        &'a self,
        _request: &'a CompletionRequest,
        _sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            if self.fail {
                return Err(ProviderError::Config(
                    "the provider failed on purpose".into(),
                ));
            }
            Ok(Completion {
                message: Message::assistant("ok"),
                tokens: None,
                usage: Default::default(),
            })
        })
    }

    fn name(&self) -> String {
        "counting".into()
    }
}

fn gate_with(
    delay_ms: u64,
    fail: bool,
    settings: GateSettings,
) -> (Arc<Dispatcher>, Arc<Counting>) {
    let provider = Arc::new(Counting {
        calls: AtomicUsize::new(0),
        delay: Duration::from_millis(delay_ms),
        fail,
    });
    (
        Arc::new(Dispatcher::new(provider.clone(), settings)),
        provider,
    )
}

fn settings(settle_ms: u64, timeout_ms: u64, hold_ms: u64) -> GateSettings {
    GateSettings {
        settle: Duration::from_millis(settle_ms),
        timeout: Duration::from_millis(timeout_ms),
        total: Duration::from_secs(600),
        hold: Duration::from_millis(hold_ms),
    }
}

fn request() -> CompletionRequest {
    CompletionRequest {
        process: "channel".into(),
        messages: vec![Message::user("hello")],
        tools: vec![].into(),
        tool_choice: ToolChoice::Auto,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routes_on_the_same_idle_edge_dispatch_exactly_once() {
    for _ in 0..50 {
        let (dispatcher, provider) = gate_with(5, false, settings(10, 5_000, 2_000));
        let a = {
            let d = dispatcher.clone();
            tokio::spawn(async move {
                d.prompt("main", "hook:a:", Route::Retrigger, &request())
                    .await
            })
        };
        let b = {
            let d = dispatcher.clone();
            tokio::spawn(async move {
                d.prompt("main", "hook:b:", Route::Retrigger, &request())
                    .await
            })
        };
        let outcomes = [a.await.unwrap(), b.await.unwrap()];
        let dispatched = outcomes
            .iter()
            .filter(|o| matches!(o, DispatchOutcome::Dispatched(_)))
            .count();
        let reserved: Vec<&str> = outcomes
            .iter()
            .filter_map(|o| match o {
                DispatchOutcome::Reserved { by } => Some(by.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(dispatched, 1, "{outcomes:?}");
        assert_eq!(reserved.len(), 1, "{outcomes:?}");
        assert!(["hook:a:", "hook:b:"].contains(&reserved[0]));
        assert_eq!(provider.calls.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test]
async fn a_busy_session_dispatches_nothing() {
    let (dispatcher, provider) = gate_with(200, false, settings(0, 5_000, 0));
    let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
    let first = {
        let (d, t) = (dispatcher.clone(), ticket.clone());
        tokio::spawn(async move { d.send(&t, Route::User, &request()).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The same owner, while its own dispatch is in flight.
    assert!(matches!(
        dispatcher.send(&ticket, Route::User, &request()).await,
        DispatchOutcome::Active
    ));
    assert!(matches!(
        first.await.unwrap(),
        DispatchOutcome::Dispatched(_)
    ));
    // A tool still running.
    let running = dispatcher.gate().tool_running("main");
    assert!(matches!(
        dispatcher
            .send(&ticket, Route::Continuation, &request())
            .await,
        DispatchOutcome::Active
    ));
    drop(running);
    assert!(matches!(
        dispatcher
            .send(&ticket, Route::Continuation, &request())
            .await,
        DispatchOutcome::Dispatched(_)
    ));
    assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn after_the_hold_a_new_prompt_is_accepted() {
    let (dispatcher, provider) = gate_with(0, false, settings(0, 5_000, 150));
    let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
    assert!(matches!(
        dispatcher.send(&ticket, Route::User, &request()).await,
        DispatchOutcome::Dispatched(_)
    ));
    assert!(dispatcher.gate().release(&ticket));
    // Released, but the hold still keeps it for its owner...
    assert!(matches!(
        dispatcher.prompt("main", "hook:idle:", Route::Retrigger, &request()).await,
        DispatchOutcome::Reserved { by } if by == "channel:main:loop"
    ));
    // ...who may go on,
    assert!(dispatcher.reserve("main", "channel:main:loop").is_ok());
    dispatcher.gate().release_owner("channel:main:loop");
    // and after it anyone may.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(
        dispatcher
            .prompt("main", "hook:idle:", Route::Retrigger, &request())
            .await,
        DispatchOutcome::Dispatched(_)
    ));
    assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_hold_is_kept_after_a_failed_dispatch() {
    let (dispatcher, _provider) = gate_with(0, true, settings(0, 5_000, 2_000));
    let ticket = dispatcher.reserve("main", "worker:1:loop").unwrap();
    assert!(matches!(
        dispatcher.send(&ticket, Route::Task, &request()).await,
        DispatchOutcome::Failed {
            attempted: true,
            error: DispatchError::Provider(_)
        }
    ));
    dispatcher.gate().release(&ticket);
    assert!(matches!(
        dispatcher.prompt("main", "retry:", Route::Task, &request()).await,
        DispatchOutcome::Reserved { by } if by == "worker:1:loop"
    ));
}

#[tokio::test]
async fn a_timed_out_dispatch_releases_its_reservation() {
    let (dispatcher, _provider) = gate_with(5_000, false, settings(0, 50, 100));
    let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
    assert!(matches!(
        dispatcher.send(&ticket, Route::User, &request()).await,
        DispatchOutcome::TimedOut(TooSlow::FirstChunk { .. })
    ));
    assert_eq!(dispatcher.gate().reservations(), 0);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let newer = dispatcher.reserve("main", "hook:idle:").unwrap();
    // The timed-out owner's finisher holds a stale ticket: it neither releases nor sends.
    assert!(!dispatcher.gate().release(&ticket));
    assert!(matches!(
        dispatcher.send(&ticket, Route::User, &request()).await,
        DispatchOutcome::Reserved { by } if by == "hook:idle:"
    ));
    assert_eq!(
        dispatcher.gate().holder("main").as_deref(),
        Some("hook:idle:")
    );
    assert!(dispatcher.gate().release(&newer));
}

#[test]
fn release_by_prefix_needs_a_colon_and_matches_only_under_it() {
    let gate = Gate::default();
    gate.reserve("a", "worker:1:loop").unwrap();
    gate.reserve("b", "worker:12:loop").unwrap();
    gate.reserve("c", "worker:1").unwrap();
    assert_eq!(
        gate.release_prefix("worker:1"),
        Err(ReleaseError::PrefixWithoutColon("worker:1".into()))
    );
    assert_eq!(gate.reservations(), 3, "a refused release releases nothing");
    assert_eq!(gate.release_prefix("worker:1:"), Ok(1));
    assert_eq!(gate.holder("b").as_deref(), Some("worker:12:loop"));
    assert_eq!(gate.holder("c").as_deref(), Some("worker:1"));
    assert_eq!(gate.release_owner("worker:1"), 1, "exact owner");
    assert_eq!(gate.holder("b").as_deref(), Some("worker:12:loop"));
    assert_eq!(gate.release_owner("worker:12:loop"), 1);
    assert_eq!(gate.reservations(), 0);
}

#[test]
fn a_stale_token_cannot_release_a_newer_reservation() {
    let gate = Gate::default();
    let old = gate.reserve("main", "channel:main:loop").unwrap();
    assert!(gate.release(&old));
    let new = gate.reserve("main", "channel:main:loop").unwrap();
    assert_ne!(old.token(), new.token());
    assert!(!gate.release(&old), "a stale token");
    assert_eq!(gate.holder("main").as_deref(), Some("channel:main:loop"));
    assert!(gate.release(&new));
    assert_eq!(gate.holder("main"), None);
}

#[tokio::test]
async fn a_cancelled_dispatch_does_not_leave_the_session_busy() {
    let (dispatcher, _provider) = gate_with(1_000, false, settings(0, 5_000, 0));
    let ticket = dispatcher.reserve("main", "worker:1:loop").unwrap();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(20),
        dispatcher.send(&ticket, Route::Task, &request()),
    )
    .await;
    assert!(cancelled.is_err(), "the caller gave up");
    // Not Active: the dropped flight left the session idle, so this one reaches the
    // provider (and is given up on in turn).
    let again = tokio::time::timeout(
        Duration::from_millis(20),
        dispatcher.send(
            &dispatcher.reserve("main", "worker:1:loop").unwrap(),
            Route::Task,
            &request(),
        ),
    )
    .await;
    assert!(again.is_err(), "it got as far as the provider, not Active");
}

#[test]
fn idle_sessions_are_swept() {
    let gate = Gate::default();
    for i in 0..10_000 {
        let ticket = gate.reserve(&format!("s{i}"), "owner:").unwrap();
        assert!(gate.release(&ticket));
    }
    assert!(gate.tracked_sessions() <= 128);
}

/// Streams `pieces` text deltas `every` apart (the first at once), then answers with
/// their text; or stalls for ever after `stall_after` pieces.
struct Paced {
    pieces: usize,
    every: Duration,
    stall_after: Option<usize>,
}

impl Provider for Paced {
    fn complete<'a>(
        &'a self,
        _request: &'a CompletionRequest,
        sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            let mut text = String::new();
            for i in 0..self.pieces {
                if self.stall_after == Some(i) {
                    std::future::pending::<()>().await;
                }
                if i > 0 {
                    tokio::time::sleep(self.every).await;
                }
                let piece = format!("{i} ");
                text.push_str(&piece);
                sink.delta(Delta::Text(piece));
            }
            Ok(Completion {
                message: Message::assistant(text),
                tokens: None,
                usage: Default::default(),
            })
        })
    }

    fn name(&self) -> String {
        "paced".into()
    }
}

fn paced(provider: Paced, timeout_ms: u64, total_ms: u64) -> Dispatcher {
    let settings = GateSettings {
        settle: Duration::ZERO,
        timeout: Duration::from_millis(timeout_ms),
        total: Duration::from_millis(total_ms),
        hold: Duration::ZERO,
    };
    Dispatcher::new(Arc::new(provider), settings)
}

#[tokio::test]
async fn a_steady_answer_longer_than_the_timeout_is_received_whole_with_its_deltas() {
    // 31 pieces 50 ms apart: 1.5 s in all, past the 1 s timeout; each gap is a twentieth
    // of it.
    let provider = Paced {
        pieces: 31,
        every: Duration::from_millis(50),
        stall_after: None,
    };
    let dispatcher = paced(provider, 1_000, 600_000);
    let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
    let (deltas, mut received) = tokio::sync::mpsc::unbounded_channel();
    let started = std::time::Instant::now();
    let outcome = dispatcher
        .send_streaming(&ticket, Route::User, &request(), &deltas)
        .await;
    assert!(started.elapsed() >= Duration::from_millis(1_500));
    let DispatchOutcome::Dispatched(answer) = outcome else {
        panic!("{outcome:?}");
    };
    let mut text = String::new();
    while let Ok(delta) = received.try_recv() {
        let Delta::Text(piece) = delta else {
            panic!("{delta:?}")
        };
        text.push_str(&piece);
    }
    assert_eq!(text, answer.message.content, "every piece, in order");
    assert!(
        text.starts_with("0 1 2 ") && text.ends_with(" 30 "),
        "{text}"
    );
}

#[tokio::test]
async fn each_bound_is_told_apart_and_names_its_key() {
    // Nothing at all: the first-chunk bound.
    let stalled = Paced {
        pieces: 5,
        every: Duration::ZERO,
        stall_after: Some(0),
    };
    let dispatcher = paced(stalled, 100, 600_000);
    let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
    let outcome = dispatcher.send(&ticket, Route::User, &request()).await;
    let DispatchOutcome::TimedOut(late) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        late,
        TooSlow::FirstChunk {
            limit: Duration::from_millis(100)
        }
    );
    assert_eq!(late.key(), "limits.dispatch_timeout_secs");
    assert!(late.to_string().contains("first piece"), "{late}");
    assert_eq!(dispatcher.gate().reservations(), 0, "released");

    // Three pieces at once, then a stall: the gap bound.
    let stalls = Paced {
        pieces: 5,
        every: Duration::ZERO,
        stall_after: Some(3),
    };
    let dispatcher = paced(stalls, 100, 600_000);
    let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
    let outcome = dispatcher.send(&ticket, Route::User, &request()).await;
    let DispatchOutcome::TimedOut(late) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(matches!(late, TooSlow::Gap { .. }), "{late:?}");
    assert!(late.to_string().contains("limits.dispatch_timeout_secs"));

    // Steady but endless: the total bound.
    let endless = Paced {
        pieces: usize::MAX,
        every: Duration::from_millis(10),
        stall_after: None,
    };
    let dispatcher = paced(endless, 5_000, 300);
    let ticket = dispatcher.reserve("main", "channel:main:loop").unwrap();
    let outcome = dispatcher.send(&ticket, Route::User, &request()).await;
    let DispatchOutcome::TimedOut(late) = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        late,
        TooSlow::Total {
            limit: Duration::from_millis(300)
        }
    );
    assert_eq!(late.key(), "limits.dispatch_total_secs");
    assert!(late.to_string().contains("limits.dispatch_total_secs"));
}
