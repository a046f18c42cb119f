//! What a stop waits for: a stop report ends only once every process the runtime ran has
//! ended, the workers among them, whose last write (their end recorded in the ledger)
//! comes after their conversation has closed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use capstan_host::agent::ReplyPart;
use capstan_host::app::AgentBuilder;
use capstan_host::config::{Config, ProviderSettings};
use capstan_host::ids::{ProcessId, ProcessKind};
use capstan_host::services::{
    Ledger, Run, RunId, ServiceError, Services, WorkerRecord, WorkerState,
};
use capstan_host::store::Store;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};

use crate::support::{Gated, Held, agent_runtime, plugins_dir, test_cache};

/// A ledger whose record of a worker's end waits until the test lets it through, and
/// says when one is waiting.
struct SlowEnd {
    inner: Arc<dyn Ledger>,
    waiting: mpsc::UnboundedSender<ProcessId>,
    release: Semaphore,
}

#[async_trait]
impl Ledger for SlowEnd {
    async fn begin_run(&self) -> Result<Run, ServiceError> {
        self.inner.begin_run().await
    }

    async fn next_process_number(&self, kind: ProcessKind) -> Result<u64, ServiceError> {
        self.inner.next_process_number(kind).await
    }

    async fn worker_started(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
    ) -> Result<(), ServiceError> {
        self.inner.worker_started(run, id, channel, task).await
    }

    async fn admit_worker(
        &self,
        run: RunId,
        id: &ProcessId,
        channel: &ProcessId,
        task: &str,
        limit: u32,
    ) -> Result<(), ServiceError> {
        self.inner.admit_worker(run, id, channel, task, limit).await
    }

    async fn set_worker_state(
        &self,
        id: &ProcessId,
        state: WorkerState,
        outcome: Option<&str>,
    ) -> Result<(), ServiceError> {
        if state.is_terminal() {
            let _ = self.waiting.send(id.clone());
            let _permit = self.release.acquire().await.expect("never closed");
        }
        self.inner.set_worker_state(id, state, outcome).await
    }

    async fn worker(&self, id: &ProcessId) -> Result<Option<WorkerRecord>, ServiceError> {
        self.inner.worker(id).await
    }

    async fn workers(&self, limit: u32) -> Result<Vec<WorkerRecord>, ServiceError> {
        self.inner.workers(limit).await
    }

    async fn mark_interrupted_workers(&self) -> Result<Vec<WorkerRecord>, ServiceError> {
        self.inner.mark_interrupted_workers().await
    }

    async fn reserve_task(
        &self,
        run: RunId,
        key: &str,
        worker: &ProcessId,
    ) -> Result<Option<ProcessId>, ServiceError> {
        self.inner.reserve_task(run, key, worker).await
    }

    async fn release_task(&self, key: &str, worker: &ProcessId) -> Result<(), ServiceError> {
        self.inner.release_task(key, worker).await
    }

    async fn settle(&self) {
        self.inner.settle().await
    }
}

#[tokio::test]
async fn a_stop_report_ends_only_after_an_interrupted_worker_has_recorded_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults(dir.path());
    config.provider = ProviderSettings::Scripted { script: None };
    std::fs::create_dir_all(&config.agent.workspace).unwrap();
    let store = Arc::new(Store::open(&config.agent.data_dir).unwrap());
    let mut services: Services = store.services();
    let (waiting, mut waiting_rx) = mpsc::unbounded_channel();
    let ledger = Arc::new(SlowEnd {
        inner: services.ledger.clone(),
        waiting,
        release: Semaphore::new(0),
    });
    services.ledger = ledger.clone();
    let (provider, held) = Gated::new();
    let mut held = Held::new(held);
    let agent = AgentBuilder::new(config)
        .plugins_dir(plugins_dir())
        .cache(test_cache())
        .provider(provider)
        .services(services)
        .build()
        .await
        .expect("the agent starts");
    let rt = agent.runtime;
    let channel = ProcessId::channel("main");

    // A worker starts, and the model keeps it waiting.
    let mut exchange = rt.exchange(&channel, "start the long job").await.unwrap();
    held.next_where(|p| p.holds("start the long job") && !p.mentions("spawned"))
        .await
        .call("spawn_worker", json!({"task": "the long job"}));
    let worker = held.next_where(|p| p.holds("the long job")).await;
    held.next_where(|p| p.mentions("spawned"))
        .await
        .reply("Started the long job.");

    // The host stops: the conversation closes, the worker is interrupted and goes to
    // record its end, which the ledger holds.
    let report = rt.stop_report();
    rt.interrupt();
    drop(rt);
    drop(agent.registry);
    drop(agent.events);
    let id = waiting_rx.recv().await.expect("the worker records its end");
    assert_eq!(id.kind(), ProcessKind::Worker);
    // The conversation has closed: its exchange ended.
    let mut end = None;
    while let Some(part) = exchange.next().await {
        if let ReplyPart::End(ended) = part {
            end = Some(ended);
        }
    }
    assert!(end.is_some(), "the exchange ended without an end");
    let ended = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let ended = ended.clone();
        async move {
            let not_saved = report.ended().await;
            ended.store(true, Ordering::SeqCst);
            not_saved
        }
    });
    // Whatever else finishes meanwhile, the worker is still writing: the report waits.
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
    assert!(
        !ended.load(Ordering::SeqCst),
        "the stop report ended while a worker was still recording its end"
    );
    ledger.release.add_permits(1);
    assert!(watcher.await.unwrap().is_empty());
    let record = ledger.inner.worker(&id).await.unwrap().expect("recorded");
    assert_eq!(record.state, WorkerState::Interrupted, "{record:?}");
    drop(worker);
}

/// An agent on a SQLite store in `dir` asking a [`Gated`] model, with at most `workers`
/// workers per channel: its runtime, and the model's requests.
async fn gated_agent(
    dir: &std::path::Path,
    workers: u32,
) -> (std::sync::Arc<capstan_host::agent::Runtime>, Held) {
    let mut config = Config::defaults(dir);
    config.provider = ProviderSettings::Scripted { script: None };
    config.limits.max_workers_per_channel = workers;
    std::fs::create_dir_all(&config.agent.workspace).unwrap();
    let (provider, held) = Gated::new();
    let (rt, _events) = agent_runtime(config, provider, false).await;
    (rt, Held::new(held))
}

/// Bounds a wait that must end, so that one that does not fails rather than hangs.
async fn bounded<T>(what: &str, wait: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(120), wait)
        .await
        .unwrap_or_else(|_| panic!("{what} never came"))
}

#[tokio::test]
async fn a_stop_report_ends_once_the_processes_have_though_a_client_still_holds_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, mut held) = gated_agent(dir.path(), 4).await;
    let mut exchange = rt
        .exchange(&ProcessId::channel("main"), "hello")
        .await
        .unwrap();
    held.next_where(|p| p.holds("hello")).await.reply("Hi.");
    while exchange.next().await.is_some() {}

    // A connection the server left open (a client trickling a body) holds the runtime.
    let client = rt.clone();
    let report = rt.stop_report();
    rt.shutdown();
    drop(rt);
    let not_saved = bounded("the end of the stop report", report.ended()).await;
    assert!(not_saved.is_empty(), "{not_saved:?}");
    // Nothing starts any more through what the client holds.
    let refused = client.spawn_worker("main", "a late job", false, None).await;
    assert!(refused.is_err(), "{refused:?}");
}

#[tokio::test]
async fn a_worker_waiting_for_a_slot_when_the_host_stops_is_interrupted_not_run() {
    let dir = tempfile::tempdir().unwrap();
    let (rt, mut held) = gated_agent(dir.path(), 1).await;
    let spawned = |p: &crate::support::Pending| {
        p.request
            .messages
            .iter()
            .filter(|m| m.content.contains("\"spawned\":true"))
            .count()
    };
    let _exchange = rt
        .exchange(&ProcessId::channel("main"), "start two jobs")
        .await
        .unwrap();
    held.next_where(|p| p.holds("start two jobs") && spawned(p) == 0)
        .await
        .call("spawn_worker", json!({"task": "job one"}));
    // The first worker takes the one slot, and the model keeps it waiting.
    let first = held.next_where(|p| p.holds("job one")).await;
    held.next_where(|p| p.holds("start two jobs") && spawned(p) == 1)
        .await
        .call("spawn_worker", json!({"task": "job two"}));
    // The second is started, and waits for the slot.
    held.next_where(|p| p.holds("start two jobs") && spawned(p) == 2)
        .await
        .reply("Both jobs are on their way.");

    let report = rt.stop_report();
    rt.interrupt();
    let services = rt.services().clone();
    drop(rt);
    let not_saved = bounded("the end of the stop report", report.ended()).await;
    assert!(not_saved.is_empty(), "{not_saved:?}");
    let workers = services.ledger.workers(10).await.unwrap();
    assert_eq!(workers.len(), 2, "{workers:?}");
    for worker in &workers {
        assert_eq!(worker.state, WorkerState::Interrupted, "{workers:?}");
    }
    // The second never asked the model: it was stopped as it took the slot.
    let asked: Vec<_> = held
        .rest()
        .into_iter()
        .filter(|p| p.holds("job two"))
        .collect();
    assert!(asked.is_empty(), "a worker ran after the host stopped");
    drop(first);
}
