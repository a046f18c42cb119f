//! The prompt gate's own cost: what a dispatch through [`Dispatcher`] adds to calling the
//! provider directly, and the throughput of many sessions dispatching at once.
//!
//! Run with `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench dispatch`.
//!
//! The provider answers at once (no model, no I/O), so everything measured is the gate:
//! - `gate/bare_provider`: `Provider::complete` called directly (the baseline);
//! - `gate/dispatch`: reserve the session (re-entrant for its owner), the activity check,
//!   the timers (first piece and whole answer), the answer, the hold recorded (settle
//!   time 0);
//! - `gate/dispatch_10k_over_1k_sessions`: 1,000 sessions on a two-thread runtime, each
//!   reserving its session and sending 10 prompts, all at once: 10,000 dispatches.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::dispatch::{DispatchOutcome, Dispatcher, GateSettings, Route};
use capstan_host::llm::{
    AnswerSink, BoxFuture, Completion, CompletionRequest, Message, Provider, ProviderError,
    ToolChoice,
};
use criterion::Criterion;

/// Answers at once.
struct Instant0;

impl Provider for Instant0 {
    fn complete<'a>(
        &'a self,
        _request: &'a CompletionRequest,
        _sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async {
            Ok(Completion {
                message: Message::assistant("ok"),
                tokens: None,
                usage: Default::default(),
            })
        })
    }

    fn name(&self) -> String {
        "instant".into()
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

fn dispatcher() -> Arc<Dispatcher> {
    let settings = GateSettings {
        settle: Duration::ZERO,
        ..GateSettings::default()
    };
    Arc::new(Dispatcher::new(Arc::new(Instant0), settings))
}

fn bench(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let one = request();
    let mut group = c.benchmark_group("gate");

    let provider = Instant0;
    group.bench_function("bare_provider", |b| {
        b.iter_custom(|iters| {
            tokio.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    std::hint::black_box(provider.complete(&one, &()).await.unwrap());
                }
                start.elapsed()
            })
        })
    });

    let gate = dispatcher();
    group.bench_function("dispatch", |b| {
        b.iter_custom(|iters| {
            tokio.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let ticket = gate.reserve("main", "channel:main:loop").unwrap();
                    match gate.send(&ticket, Route::User, &one).await {
                        DispatchOutcome::Dispatched(answer) => {
                            std::hint::black_box(answer);
                        }
                        other => panic!("{other:?}"),
                    }
                }
                start.elapsed()
            })
        })
    });

    group.sample_size(20);
    group.bench_function("dispatch_10k_over_1k_sessions", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let gate = dispatcher();
                total += tokio.block_on(async {
                    let start = Instant::now();
                    let sessions: Vec<_> = (0..1_000)
                        .map(|s| {
                            let gate = gate.clone();
                            tokio::spawn(async move {
                                let request = request();
                                let session = format!("worker:{s}");
                                let owner = format!("worker:{s}:loop");
                                let ticket = gate.reserve(&session, &owner).unwrap();
                                for _ in 0..10 {
                                    let outcome = gate.send(&ticket, Route::Task, &request).await;
                                    assert!(matches!(outcome, DispatchOutcome::Dispatched(_)));
                                }
                                gate.gate().release(&ticket);
                            })
                        })
                        .collect();
                    for session in sessions {
                        session.await.unwrap();
                    }
                    start.elapsed()
                });
            }
            total
        })
    });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    bench(&mut criterion);
    criterion.final_summary();
}
