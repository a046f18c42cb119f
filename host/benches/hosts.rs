//! One-tool agent turns with one, two and three hosts on one PostgreSQL database, next to
//! one host on SQLite; and what renewing a run's lease costs.
//!
//! Needs the built plugins (`bash scripts/setup`) and Debian's PostgreSQL server
//! (`scripts/test` installs it). Run with
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench hosts`.
//!
//! - `one_tool_turn/sqlite` and `one_tool_turn/postgres`: criterion's figure for one turn
//!   (a user message; the model calls `file_read` once, then answers) on one host.
//! - The same turn on one host, SQLite and PostgreSQL interleaved one for one, p50 and p99
//!   and the ratio; with a third, PostgreSQL committing without waiting for its disk, to
//!   show what the flushes cost.
//! - Then hosts in this process, each with its own pool, lease and channels, on one
//!   database: each host runs its turns one after another while the others do the same;
//!   printed are the turns per second of them all and the p50 and p99 of one turn.
//! - Last, one lease renewal (the statement each host sends every 5 s), timed alone.
//!
//! The hosts share this process and the machine with the database server, so the figures
//! for two and three hosts say what the database makes of the load, not what more
//! machines would add.

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::agent::{Event, Runtime};
use capstan_host::app::AgentBuilder;
use capstan_host::config::{Config, DatabaseUrl, StoreSettings};
use capstan_host::llm::{Script, ScriptedProvider};
use capstan_host::plugin::ArtifactCache;
use capstan_host::postgres::test_cluster::{TestCluster, admin};
use criterion::Criterion;
use tokio::runtime::Runtime as Tokio;
use tokio::sync::mpsc;

#[path = "support/percentiles.rs"]
mod percentiles;
#[path = "support/scripts.rs"]
mod scripts;

use percentiles::p50_p99;
use scripts::ONE_TOOL;

/// One host: a runtime on `store` in a directory of its own, whose channel may call
/// `file_read`.
struct Host {
    rt: Arc<Runtime>,
    events: mpsc::UnboundedReceiver<Event>,
    /// Which host it is, in its channels' names.
    name: usize,
    turns: u64,
    _dir: tempfile::TempDir,
}

impl Host {
    async fn start(store: &StoreSettings, name: usize) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let toml = "[limits]\nmax_turns = 4\nsettle_ms = 0\ncontext_window_tokens = 100000000\nmax_open_conversations = 1000000\n\
                    [profiles.channel]\ntools = [\"reply\", \"file_read\"]\ncapabilities = [\"fs.read\"]\n";
        let mut config = Config::parse(toml, &dir.path().join("capstan.toml")).unwrap();
        config.store = store.clone();
        std::fs::create_dir_all(&config.agent.workspace).unwrap();
        std::fs::write(config.agent.workspace.join("data.txt"), "bench data\n").unwrap();
        let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins");
        assert!(
            plugins.join("files.wasm").is_file(),
            "run `bash scripts/setup` first"
        );
        let provider = ScriptedProvider::new(Script::parse(ONE_TOOL, "bench").unwrap(), "bench");
        let agent = AgentBuilder::new(config)
            .plugins_dir(plugins)
            .cache(ArtifactCache::new(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-component-cache"),
            ))
            .provider(Arc::new(provider))
            .build()
            .await
            .expect("the agent starts");
        Host {
            rt: agent.runtime,
            events: agent.events,
            name,
            turns: 0,
            _dir: dir,
        }
    }

    /// One turn, until its channel is idle: ten per channel, then a new one.
    async fn turn(&mut self) -> Duration {
        self.turns += 1;
        let channel = format!("h{}c{}", self.name, self.turns / 10);
        let started = Instant::now();
        self.rt
            .send_user_message(&channel, "read it")
            .await
            .unwrap();
        self.rt.wait_idle(&channel).await;
        let took = started.elapsed();
        while let Ok(event) = self.events.try_recv() {
            if let Event::ModelFailed { error, .. } | Event::HistoryNotSaved { error, .. } = event {
                panic!("{error}");
            }
        }
        took
    }
}

fn postgres(url: &str) -> StoreSettings {
    StoreSettings::Postgres {
        url: DatabaseUrl::Literal(url.to_owned()),
        lease: capstan_host::postgres::Lease::default().ttl(),
    }
}

/// `hosts` hosts on `store`, each taking `turns` turns at once with the others.
fn concurrent_turns(tokio: &Tokio, label: &str, stores: Vec<StoreSettings>, turns: usize) {
    let hosts: Vec<Host> = tokio.block_on(async {
        let mut hosts = Vec::new();
        for (name, store) in stores.iter().enumerate() {
            let mut host = Host::start(store, name).await;
            // Warm: the channel's instance, the pool's connections.
            for _ in 0..20 {
                host.turn().await;
            }
            hosts.push(host);
        }
        hosts
    });
    let count = hosts.len();
    let started = Instant::now();
    let mut times: Vec<Duration> = tokio.block_on(async {
        let runs: Vec<_> = hosts
            .into_iter()
            .map(|mut host| {
                tokio::spawn(async move {
                    let mut times = Vec::with_capacity(turns);
                    for _ in 0..turns {
                        times.push(host.turn().await);
                    }
                    host.rt.shutdown();
                    times
                })
            })
            .collect();
        let mut all = Vec::new();
        for run in runs {
            all.extend(run.await.unwrap());
        }
        all
    });
    let elapsed = started.elapsed();
    let total = times.len();
    let (p50, p99) = p50_p99(&mut times);
    println!(
        "{label:<22} {count} host(s): {:>7.0} turns/s   p50 {p50:>8.1} us   p99 {p99:>8.1} us",
        total as f64 / elapsed.as_secs_f64()
    );
}

fn bench_one_host(c: &mut Criterion, tokio: &Tokio, url: &str) {
    let mut group = c.benchmark_group("one_tool_turn");
    let sqlite = StoreSettings::default();
    for (name, store) in [("sqlite", sqlite), ("postgres", postgres(url))] {
        let mut host = tokio.block_on(Host::start(&store, 0));
        group.bench_function(name, |b| b.iter(|| tokio.block_on(host.turn())));
        host.rt.shutdown();
    }
    group.finish();
}

/// One host's turns on SQLite and on PostgreSQL, interleaved one for one so both see the
/// same machine: p50 and p99 of each and their ratio. A third host's database commits
/// without waiting for its WAL to reach the disk (`synchronous_commit = off`, set for its
/// connections only): not how a host runs, but it shows what the disk's flush costs
/// apart from the statements.
fn one_host_interleaved(tokio: &Tokio, url: &str, no_flush_url: &str) {
    const TURNS: usize = 1000;
    let no_flush = format!("{no_flush_url}?options=-c%20synchronous_commit%3Doff");
    let stores = [
        ("SQLite", StoreSettings::default()),
        ("PostgreSQL", postgres(url)),
        ("PostgreSQL, no flush", postgres(&no_flush)),
    ];
    let mut hosts: Vec<Host> = tokio.block_on(async {
        let mut hosts = Vec::new();
        for (name, (_, store)) in stores.iter().enumerate() {
            let mut host = Host::start(store, 10 + name).await;
            for _ in 0..20 {
                host.turn().await;
            }
            hosts.push(host);
        }
        hosts
    });
    let mut times = vec![Vec::with_capacity(TURNS); hosts.len()];
    tokio.block_on(async {
        for _ in 0..TURNS {
            for (host, times) in hosts.iter_mut().zip(&mut times) {
                times.push(host.turn().await);
            }
        }
    });
    println!(
        "
one-tool turns on one host, {TURNS} interleaved rounds (us)"
    );
    let mut first = (0.0, 0.0);
    for (i, ((label, _), times)) in stores.iter().zip(&mut times).enumerate() {
        let (p50, p99) = p50_p99(times);
        if i == 0 {
            first = (p50, p99);
        }
        println!(
            "  {label:<22} p50 {p50:>8.1}  p99 {p99:>8.1}   {:.2}x / {:.2}x SQLite",
            p50 / first.0,
            p99 / first.1
        );
    }
    for host in hosts {
        host.rt.shutdown();
    }
}

/// One renewal: the statement each host's lease connection sends every 5 s.
fn lease_renewal(tokio: &Tokio, url: &str) {
    const RENEWALS: u32 = 2000;
    tokio.block_on(async {
        // The schema, as a host makes it.
        drop(capstan_host::postgres::Postgres::connect(url).await.unwrap());
        let db = admin(url).await;
        let id: i64 = db
            .query_one(
                "INSERT INTO runs (host, pid, expires_at) VALUES ('bench', 0, now() + interval '15 seconds') RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let renew = db
            .prepare(
                "UPDATE runs SET expires_at = now() + make_interval(secs => $2)
                 WHERE id = $1 AND ended_at IS NULL AND expires_at > now()",
            )
            .await
            .unwrap();
        let started = Instant::now();
        for _ in 0..RENEWALS {
            assert_eq!(db.execute(&renew, &[&id, &15.0f64]).await.unwrap(), 1);
        }
        let each = started.elapsed() / RENEWALS;
        println!(
            "lease renewal: {:.1} us each (round trip and commit); one every 5 s is {:.1} us of \
             work per host per second",
            each.as_secs_f64() * 1e6,
            each.as_secs_f64() * 1e6 / 5.0
        );
    });
}

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let cluster = TestCluster::start();
    let fresh = || tokio.block_on(cluster.fresh_database());
    let url = fresh();
    let mut c = Criterion::default().configure_from_args();
    bench_one_host(&mut c, &tokio, &url);
    c.final_summary();
    one_host_interleaved(&tokio, &fresh(), &fresh());

    const TURNS: usize = 1000;
    println!("\none-tool turns, {TURNS} per host, the hosts at once");
    concurrent_turns(&tokio, "SQLite", vec![StoreSettings::default()], TURNS);
    for hosts in 1..=3 {
        let url = fresh();
        concurrent_turns(&tokio, "PostgreSQL", vec![postgres(&url); hosts], TURNS);
    }
    lease_renewal(&tokio, &fresh());
}
