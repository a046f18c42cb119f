//! The services on PostgreSQL, for several hosts sharing one database.
//!
//! [`Postgres`] implements the five service traits the SQLite store implements, and
//! passes the same conformance checks. It is chosen with `[store] kind = "postgres"`;
//! SQLite stays the embedded default. What differs from SQLite:
//!
//! - the schema is migrated under a transaction-scoped advisory lock, so hosts starting
//!   at once apply each migration exactly once between them (`schema`);
//! - a run is a lease row renewed on a connection of its own, outside the pool, and it is
//!   over when its host ends it or when it expired by the database's clock (`ledger.rs`);
//!   a lease that expired is never renewed, and no worker starts under it;
//! - history appends take the channel's next sequence number from a head row, so appends
//!   from several hosts to one channel interleave without a lost or doubled message;
//! - a turn's writes are few round trips: an append (the fence, the head row and the
//!   rows) is one statement, and a tool call's audit row another.
//!
//! Statements are prepared once on each pooled connection (`prepared.rs`), so a statement
//! used again costs one round trip, not two: behind PgBouncer, use session pooling (or
//! transaction pooling from PgBouncer 1.21 with `max_prepared_statements` set).
//!
//! ```no_run
//! use capstan_host::postgres::{Lease, Postgres};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let url = "postgres://capstan@127.0.0.1:5432/capstan";
//! let services = Postgres::open_services(url, Lease::default()).await.unwrap();
//! let run = services.ledger.begin_run().await.unwrap();
//! # drop(run);
//! # });
//! ```

mod approvals;
mod audit;
mod error;
mod file_labels;
mod history;
mod inbox;
mod lease;
mod ledger;
mod memory;
mod prepared;
mod reservations;
mod rows;
mod schema;
mod sessions;
mod status;
mod tasks;

#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod test_cluster;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod test_wire;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

pub use error::PgError;
pub use lease::Lease;
pub use status::{RunStatus, SessionStatus};

use crate::services::Operation;
use crate::services::{ServiceError, Services};

/// The most connections a host's pool opens; each run lease has one of its own besides.
const POOL_SIZE: usize = 16;

/// How long making a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a call waits for a pooled connection when all are in use.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// The services on one PostgreSQL database.
pub struct Postgres {
    pool: Pool,
    /// How to reach the database, for the run leases' own connections.
    config: tokio_postgres::Config,
    /// The database as errors name it (no password).
    location: String,
    /// How long this host's run leases last.
    lease: Lease,
    /// Runs this host ended whose end may not be written yet: over already.
    ending: Arc<Ending>,
    /// The run this host writes sessions under, and the sessions it owns.
    owner: Arc<Mutex<sessions::Owner>>,
    /// Wakes this host's look at the inbox and its waits for answers; made with the
    /// listener, on first use.
    hints: std::sync::OnceLock<Arc<inbox::Hints>>,
}

impl Postgres {
    /// Connects to the database at `url` and brings its schema up to date; its runs take
    /// the default [`Lease`].
    pub async fn connect(url: &str) -> Result<Arc<Postgres>, PgError> {
        Postgres::connect_with(url, Lease::default()).await
    }

    /// [`Postgres::connect`], its runs taking leases of `lease`.
    pub async fn connect_with(url: &str, lease: Lease) -> Result<Arc<Postgres>, PgError> {
        let postgres = Postgres::open(url, lease).await?;
        let mut client = postgres.client().await?;
        schema::migrate(&mut client, &postgres.location).await?;
        drop(client);
        Ok(postgres)
    }

    /// Connects to the database at `url` and changes nothing: for reading what the hosts
    /// wrote (`capstan status`), whatever schema version a newer host left.
    pub async fn connect_as_is(url: &str) -> Result<Arc<Postgres>, PgError> {
        Postgres::open(url, Lease::default()).await
    }

    /// Connects to the database at `url`, its runs taking leases of `lease`.
    async fn open(url: &str, lease: Lease) -> Result<Arc<Postgres>, PgError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|err| PgError::Url {
            reason: error::chain(&err),
        })?;
        check_hosts(&config)?;
        // A server that stops answering (a half-open connection) fails calls instead of
        // hanging them, unless the URL says otherwise.
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.keepalives_idle(Duration::from_secs(30));
        // A host paused inside a transaction (holding a session's row) is cut off, and a
        // lock is not waited for, well within a lease: a takeover never waits on a host
        // that lost its lease.
        let options = format!(
            "{} -c idle_in_transaction_session_timeout={ms} -c lock_timeout={ms}",
            config.get_options().unwrap_or(""),
            ms = lease.transaction_limit().as_millis()
        );
        config.options(options.trim());
        let location = location_of(&config);
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|err| PgError::Pool {
                location: location.clone(),
                reason: error::chain(&err),
            })?;
        let postgres = Postgres {
            pool,
            config,
            location,
            lease,
            ending: Arc::default(),
            owner: Arc::default(),
            hints: std::sync::OnceLock::new(),
        };
        // A connection now, so a wrong URL or a server down is said here.
        drop(postgres.client().await?);
        Ok(Arc::new(postgres))
    }

    /// The services on the database at `url`, this host's runs taking leases of `lease`.
    pub async fn open_services(url: &str, lease: Lease) -> Result<Services, ServiceError> {
        Ok(Services::all_from(
            Postgres::connect_with(url, lease).await?,
        ))
    }

    /// The database `url` names, as errors name it (user, host, port and database, never a
    /// password), without connecting.
    ///
    /// ```
    /// use capstan_host::postgres::Postgres;
    ///
    /// let at = Postgres::location_of_url("postgres://capstan:pw@db:5433/tasks").unwrap();
    /// assert_eq!(at, "postgresql://capstan@db:5433/tasks");
    /// ```
    pub fn location_of_url(url: &str) -> Result<String, PgError> {
        let config: tokio_postgres::Config = url.parse().map_err(|err| PgError::Url {
            reason: error::chain(&err),
        })?;
        Ok(location_of(&config))
    }

    /// The database as errors name it: user, host, port and database, never a password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// A connection from the pool.
    async fn client(&self) -> Result<Object, PgError> {
        self.pool.get().await.map_err(|err| PgError::Pool {
            location: self.location.clone(),
            reason: error::chain(&err),
        })
    }

    /// The error of a connection that could not be made.
    fn unreachable(&self, err: tokio_postgres::Error) -> PgError {
        PgError::Pool {
            location: self.location.clone(),
            reason: error::chain(&err),
        }
    }

    /// The error of `what` failing with `source`.
    fn failed(&self, what: Operation, source: tokio_postgres::Error) -> PgError {
        PgError::Query {
            location: self.location.clone(),
            what,
            source,
        }
    }
}

/// Refuses a host with an `@` in it: what an unencoded `@` in the password leaves, with
/// the rest of the password in the host name (and so in every error).
fn check_hosts(config: &tokio_postgres::Config) -> Result<(), PgError> {
    let garbled = config
        .get_hosts()
        .iter()
        .any(|host| matches!(host, tokio_postgres::config::Host::Tcp(name) if name.contains('@')));
    if garbled {
        return Err(PgError::Url {
            reason: "its host name holds an @: a password with an @ in it must be percent-encoded"
                .into(),
        });
    }
    Ok(())
}

/// The runs this host ended whose end is not written yet, and a wake-up for each written.
#[derive(Default)]
struct Ending {
    runs: Mutex<HashSet<i64>>,
    written: tokio::sync::Notify,
}

/// `postgresql://USER@HOST:PORT/DB`, from what `config` names.
fn location_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("");
    let db = config.get_dbname().unwrap_or(user);
    format!("postgresql://{user}@{host}:{port}/{db}")
}

/// Seconds since the Unix epoch, as the services stamp rows.
fn now() -> i64 {
    crate::services::now()
}

#[cfg(test)]
mod tests {
    use super::test_cluster::TestCluster;
    use super::*;
    use crate::services::conformance;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_services_pass_the_conformance_checks() {
        let cluster = TestCluster::start();
        conformance::check_all(async || {
            let url = cluster.fresh_database().await;
            Postgres::open_services(&url, Lease::default())
                .await
                .unwrap()
        })
        .await;
    }
}

#[cfg(test)]
mod hosts {
    //! Several hosts on one database: each `Postgres` here is one host's handle.

    use std::collections::HashSet;
    use std::time::Duration;

    use super::test_cluster::{TestCluster, admin};
    use super::*;
    use crate::services::{History, Ledger, WorkerState};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hosts_starting_at_once_migrate_once_and_a_newer_schema_is_refused() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let starts: Vec<_> = (0..6)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { Postgres::connect(&url).await.map(drop) })
            })
            .collect();
        for start in starts {
            start.await.unwrap().unwrap();
        }
        let db = admin(&url).await;
        let rows = db
            .query("SELECT version FROM capstan_schema", &[])
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].get::<_, i64>(0), schema::VERSION);

        db.execute("UPDATE capstan_schema SET version = 99", &[])
            .await
            .unwrap();
        let Err(err) = Postgres::connect(&url).await else {
            panic!("a newer schema was accepted");
        };
        let message = err.to_string();
        assert!(
            message.contains("version 99") && message.contains(&location_of(&url.parse().unwrap())),
            "{message}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_transaction_or_a_lock_wait_is_cut_within_a_lease() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let host = Postgres::connect(&url).await.unwrap();
        let client = host.client().await.unwrap();
        for setting in ["idle_in_transaction_session_timeout", "lock_timeout"] {
            let value: String = client
                .query_one(&format!("SHOW {setting}"), &[])
                .await
                .unwrap()
                .get(0);
            assert_eq!(value, "10s", "{setting}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_as_is_changes_nothing() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        Postgres::connect_as_is(&url).await.unwrap();
        let tables: i64 = admin(&url)
            .await
            .query_one(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(tables, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_from_two_hosts_to_one_channel_interleave_whole() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let (a, b) = (
            Postgres::connect(&url).await.unwrap(),
            Postgres::connect(&url).await.unwrap(),
        );
        let appends: Vec<_> = (0..100)
            .map(|n| {
                let host = if n % 2 == 0 { a.clone() } else { b.clone() };
                tokio::spawn(async move {
                    let pair = vec![format!("[{n},0]"), format!("[{n},1]")];
                    History::append(&*host, &crate::ids::testing::key("channel:main"), pair)
                        .await
                        .unwrap();
                })
            })
            .collect();
        for append in appends {
            append.await.unwrap();
        }
        let entries = History::load(&*a, &crate::ids::testing::key("channel:main"))
            .await
            .unwrap();
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (0..200).collect::<Vec<u64>>(), "no gap, no double");
        let pairs: Vec<(u32, u32)> = entries
            .iter()
            .map(|e| serde_json::from_str(&e.message).unwrap())
            .collect();
        for two in pairs.chunks(2) {
            assert_eq!(
                (two[0].0, two[0].1, two[1].1),
                (two[1].0, 0, 1),
                "{pairs:?}"
            );
        }
        let all: HashSet<u32> = pairs.iter().map(|p| p.0).collect();
        assert_eq!(all.len(), 100);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_approved_once_runs_once_whichever_hosts_take_it() {
        use crate::flow::ArgsDigest;
        use crate::services::{Approvals, NewApproval, Verdict};

        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let (a, b, person) = (
            Postgres::connect(&url).await.unwrap(),
            Postgres::connect(&url).await.unwrap(),
            Postgres::connect(&url).await.unwrap(),
        );
        let (run_a, run_b) = (a.begin_run().await.unwrap(), b.begin_run().await.unwrap());
        let worker = crate::ids::testing::pid("worker:1");
        let args = r#"{"to":"me"}"#;
        let digest = ArgsDigest::of(args);
        for round in 0..20 {
            let call = NewApproval::of(&worker, "send", args, "untrusted_send", "untrusted(mcp:x)");
            let parked = a.park(call).await.unwrap();
            // Decided by a person with no run (the CLI), read by both hosts at once.
            let lease = crate::services::Lease::once();
            person
                .decide(parked.id, Verdict::Approve(lease), "person")
                .await
                .unwrap();
            let (by_a, by_b) = tokio::join!(
                a.take(&worker, "send", digest),
                b.take(&worker, "send", digest)
            );
            let taken = [by_a.unwrap(), by_b.unwrap()];
            assert_eq!(
                taken.iter().flatten().count(),
                1,
                "round {round}: one use, one call: {taken:?}"
            );
        }
        // A host whose run is over takes no use: the lease stays for a live one.
        let call = NewApproval::of(&worker, "send", args, "untrusted_send", "untrusted(mcp:x)");
        let parked = a.park(call).await.unwrap();
        let lease = crate::services::Lease::once();
        person
            .decide(parked.id, Verdict::Approve(lease), "person")
            .await
            .unwrap();
        admin(&url)
            .await
            .execute(
                "UPDATE runs SET expires_at = now() - interval '1 second' WHERE id = $1",
                &[&(run_b.id().get() as i64)],
            )
            .await
            .unwrap();
        assert!(b.take(&worker, "send", digest).await.unwrap().is_none());
        assert!(a.take(&worker, "send", digest).await.unwrap().is_some());
        drop((run_a, run_b));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_hosts_workers_are_marked_interrupted_once_by_the_hosts_alive() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        // Host A runs on a runtime of its own, then dies: its lease is no longer renewed
        // and its end is never written.
        let dead_run = {
            let url = url.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Runtime::new().unwrap();
                runtime.block_on(async move {
                    let a = Postgres::connect(&url).await.unwrap();
                    let run = a.begin_run().await.unwrap();
                    for id in ["worker:1", "worker:2"] {
                        let (id, main) = (
                            crate::ids::testing::pid(id),
                            crate::ids::testing::pid("channel:main"),
                        );
                        a.worker_started(run.id(), &id, &main, "t").await.unwrap();
                    }
                    let id = run.id();
                    std::mem::forget(run);
                    id
                })
            })
            .join()
            .unwrap()
        };
        let (b, c) = (
            Postgres::connect(&url).await.unwrap(),
            Postgres::connect(&url).await.unwrap(),
        );
        let alive = b.begin_run().await.unwrap();
        b.worker_started(
            alive.id(),
            &crate::ids::testing::pid("worker:3"),
            &crate::ids::testing::pid("channel:other"),
            "t",
        )
        .await
        .unwrap();
        assert!(
            b.mark_interrupted_workers().await.unwrap().is_empty(),
            "a lease not yet expired is a live run"
        );
        // The lease runs out, by the database's clock.
        admin(&url)
            .await
            .execute(
                "UPDATE runs SET expires_at = now() - interval '1 second' WHERE id = $1",
                &[&(dead_run.get() as i64)],
            )
            .await
            .unwrap();
        let (by_b, by_c) = tokio::join!(b.mark_interrupted_workers(), c.mark_interrupted_workers());
        let mut marked: Vec<String> = by_b
            .unwrap()
            .into_iter()
            .chain(by_c.unwrap())
            .map(|w| w.id.to_string())
            .collect();
        marked.sort();
        assert_eq!(marked, ["worker:1", "worker:2"], "each once, by one host");
        let live = b
            .worker(&crate::ids::testing::pid("worker:3"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(live.state, WorkerState::Running);
        let dead = c
            .worker(&crate::ids::testing::pid("worker:1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(dead.state, WorkerState::Interrupted);
        drop(alive);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_is_renewed_while_every_pooled_connection_is_taken() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let host = Postgres::connect(&url).await.unwrap();
        let run = host.begin_run().await.unwrap();
        let held: Vec<_> = {
            let mut held = Vec::new();
            for _ in 0..POOL_SIZE {
                held.push(host.client().await.unwrap());
            }
            held
        };
        let db = admin(&url).await;
        let expires = async || -> std::time::SystemTime {
            db.query_one(
                "SELECT expires_at FROM runs WHERE id = $1",
                &[&(run.id().get() as i64)],
            )
            .await
            .unwrap()
            .get(0)
        };
        let first = expires().await;
        // One renewal period passes; nothing here assumes how long a renewal takes.
        // The cap only guards against a hang (a renewal waiting for a pooled connection).
        let cap = std::time::Instant::now() + Duration::from_secs(120);
        while expires().await == first {
            assert!(
                std::time::Instant::now() < cap,
                "the lease was never renewed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(expires().await > first);
        drop(held);
        drop(run);
    }
}

#[cfg(test)]
mod agent {
    //! An agent whose config names a PostgreSQL store, through the builder.

    use super::test_cluster::TestCluster;
    use crate::agent::Event;
    use crate::app::AgentBuilder;
    use crate::config::{Config, DatabaseUrl, ProviderSettings, StoreSettings};
    use crate::ids::ProcessId;
    use crate::llm::{Script, ScriptedProvider};
    use crate::services::History;

    const HELLO: &str = r#"
[[step]]
process = "channel"
tool_calls = [{ name = "reply", arguments = { text = "hello from postgres" } }]
"#;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_agent_configured_for_postgres_keeps_its_history_there() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::defaults(dir.path());
        config.provider = ProviderSettings::Scripted { script: None };
        config.store = StoreSettings::Postgres {
            url: DatabaseUrl::Literal(url.clone()),
            lease: super::Lease::default().ttl(),
        };
        let provider = ScriptedProvider::new(Script::parse(HELLO, "test").unwrap(), "test");
        let mut agent = AgentBuilder::new(config)
            .provider(std::sync::Arc::new(provider))
            .build()
            .await
            .unwrap();
        agent.runtime.send_user_message("main", "hi").await.unwrap();
        agent.runtime.wait_idle("main").await;
        let mut replies = Vec::new();
        while let Ok(event) = agent.events.try_recv() {
            if let Event::Reply { channel, text } = event {
                replies.push((channel, text));
            }
        }
        assert_eq!(
            replies,
            [(ProcessId::channel("main"), "hello from postgres".to_owned())]
        );
        // Another host on the database reads the conversation back.
        let other = super::Postgres::connect(&url).await.unwrap();
        let history = other
            .load(&crate::ids::testing::key("channel:main"))
            .await
            .unwrap();
        assert!(
            history
                .iter()
                .any(|e| e.message.contains("hello from postgres")),
            "{history:?}"
        );
        assert!(
            !config_data_dir_has_db(dir.path()),
            "no SQLite file was made"
        );
    }

    fn config_data_dir_has_db(dir: &std::path::Path) -> bool {
        walk(dir).iter().any(|p| p.ends_with("capstan.db"))
    }

    fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                all.extend(walk(&path));
            }
            all.push(path);
        }
        all
    }
}
