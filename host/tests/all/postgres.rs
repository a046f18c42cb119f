//! The `capstan` binary on a PostgreSQL store: separate processes are separate hosts.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use capstan_host::postgres::test_cluster::{TestCluster, admin};

use crate::support::accounting::{Accounts, Heard};
use crate::support::serve_host::{ServeHost, events, post_waiting, until_event};
use crate::support::{capstan_command, send_signal, stderr, stdout, until};

/// A directory whose config names the database in `CAPSTAN_TEST_DATABASE_URL` and plays a
/// script answering each message in turn.
fn host_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("script.toml"),
        "[[step]]\nprocess = \"channel\"\nwhen = \"first\"\nreply = \"one\"\n\n\
         [[step]]\nprocess = \"channel\"\nwhen = \"second\"\nreply = \"two\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[provider]\nkind = \"scripted\"\nscript = \"script.toml\"\n\n\
         [store]\nkind = \"postgres\"\nurl_env = \"CAPSTAN_TEST_DATABASE_URL\"\n",
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_capstan_processes_share_a_conversation_through_postgres() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    // Two hosts: each its own directory (nothing shared on disk), one database.
    let (a, b) = (host_dir(), host_dir());
    let run = |dir: &tempfile::TempDir, message: &str| {
        capstan_command(dir.path(), &["run", message])
            .env("CAPSTAN_TEST_DATABASE_URL", &url)
            .output()
            .unwrap()
    };
    let first = run(&a, "first");
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(stdout(&first), "agent> one\n");
    let second = run(&b, "second");
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(stdout(&second), "agent> two\n");

    let db = admin(&url).await;
    let history: Vec<String> = db
        .query(
            "SELECT message FROM history WHERE channel = 'channel:main' ORDER BY seq",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let text = history.join("\n");
    for said in ["first", "one", "second", "two"] {
        assert!(text.contains(said), "{said} missing from {history:?}");
    }
    assert!(
        text.find("one").unwrap() < text.find("second").unwrap(),
        "one conversation, in order: {history:?}"
    );
    // The second host took the conversation over from the first, whose run had ended.
    let epoch = scalar(
        &db,
        "SELECT epoch FROM sessions WHERE channel = 'channel:main'",
    )
    .await;
    assert_eq!(epoch, 2);
    let open_runs = scalar(&db, "SELECT count(*) FROM runs WHERE ended_at IS NULL").await;
    assert_eq!(open_runs, 0, "each process ended its run on the way out");

    // `capstan status` shows both runs ended and the session with its owner and epoch.
    let status = capstan_command(a.path(), &["status"])
        .env("CAPSTAN_TEST_DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", stderr(&status));
    let shown = stdout(&status);
    assert!(
        shown.starts_with("store: PostgreSQL, postgresql://capstan@"),
        "{shown}"
    );
    assert_eq!(shown.matches(" ended").count(), 2, "{shown}");
    let session = shown
        .lines()
        .find(|line| line.starts_with("channel:main"))
        .unwrap_or_else(|| panic!("{shown}"));
    let columns: Vec<&str> = session.split_whitespace().collect();
    assert_eq!(columns, ["channel:main", "run:2", "2"], "{shown}");
    assert!(
        !shown.contains(&url),
        "the URL itself is not printed: {shown}"
    );

    // A URL variable that is not set is named, with the fix.
    let unset = capstan_command(a.path(), &["run", "first"])
        .env_remove("CAPSTAN_TEST_DATABASE_URL")
        .output()
        .unwrap();
    assert!(!unset.status.success());
    assert!(
        stderr(&unset).contains("CAPSTAN_TEST_DATABASE_URL"),
        "{}",
        stderr(&unset)
    );
}

/// What every host's scripted model says, naming the host.
fn host_script(name: &str) -> String {
    format!(
        r#"
[[step]]
process = "channel"
when = "slow"
delay_ms = 3000
tool_calls = [{{ name = "reply", arguments = {{ text = "slow reply from {name}" }} }}]

[[step]]
process = "channel"
when = "please spawn"
tool_calls = [{{ name = "spawn_worker", arguments = {{ task = "a long task" }} }}]
repeat = true

[[step]]
process = "worker"
delay_ms = 600000
reply = "the long task is done"
repeat = true

[[step]]
process = "channel"
tool_calls = [{{ name = "reply", arguments = {{ text = "reply from {name}" }} }}]
repeat = true
"#
    )
}

/// The directory of a `capstan serve` host named `name` on the database in
/// `CAPSTAN_TEST_DATABASE_URL`, with `limits` (a `[limits]` table) in its config and
/// `store` added to its `[store]` table.
fn pg_dir(name: &str, limits: &str, store: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.toml"), host_script(name)).unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        format!(
            "[provider]\nkind = \"scripted\"\nscript = \"script.toml\"\n\n{limits}\n\
             [store]\nkind = \"postgres\"\nurl_env = \"CAPSTAN_TEST_DATABASE_URL\"\n{store}\n"
        ),
    )
    .unwrap();
    dir
}

/// A `capstan serve` host named `name` on database `db`, with `limits` (a `[limits]` table)
/// in its config.
fn pg_host_with(db: &str, name: &str, limits: &str) -> ServeHost {
    ServeHost::start(
        pg_dir(name, limits, ""),
        &[("CAPSTAN_TEST_DATABASE_URL", db)],
    )
}

/// [`pg_host_with`] with no limit changed but `settle_ms = 0`.
fn pg_host(db: &str, name: &str) -> ServeHost {
    pg_host_with(db, name, "[limits]\nsettle_ms = 0\n")
}

/// Two `capstan serve` hosts on a fresh database of their own server.
struct Served {
    cluster: TestCluster,
    url: String,
    /// An operator's connection to the database.
    db: tokio_postgres::Client,
    hosts: (ServeHost, ServeHost),
    client: reqwest::Client,
}

impl Served {
    async fn two() -> Served {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let db = admin(&url).await;
        let hosts = (pg_host(&url, "host-a"), pg_host(&url, "host-b"));
        Served {
            cluster,
            url,
            db,
            hosts,
            client: reqwest::Client::new(),
        }
    }
}

/// Waits until `sql` selects `want`.
async fn until_scalar(db: &tokio_postgres::Client, what: &str, sql: &str, want: i64) {
    until(what, async || match scalar(db, sql).await {
        got if got == want => Ok(()),
        got => Err(got.to_string()),
    })
    .await
}

/// The one number `sql` selects.
async fn scalar(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.unwrap().get(0)
}

/// `channel:main`'s stored messages, each as its role and text.
async fn conversation(db: &tokio_postgres::Client) -> Vec<(String, String)> {
    db.query(
        "SELECT message FROM history WHERE channel = 'channel:main' ORDER BY seq",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|row| {
        let message: capstan_host::llm::Message =
            serde_json::from_str(row.get::<_, &str>(0)).expect("a well-formed stored message");
        let role = serde_json::to_value(message.role).unwrap();
        (role.as_str().unwrap().to_owned(), message.content)
    })
    .collect()
}

/// Waits until `done` holds of the stored conversation.
async fn until_stored(
    db: &tokio_postgres::Client,
    what: &str,
    mut done: impl FnMut(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    until(what, async || {
        let stored = conversation(db).await;
        if done(&stored) {
            Ok(stored)
        } else {
            Err(format!("{stored:?}"))
        }
    })
    .await
}

fn holds(stored: &[(String, String)], text: &str) -> bool {
    stored.iter().any(|(_, said)| said == text)
}

/// Each answer follows something to answer: one dispatch per idle edge, never two.
fn one_answer_per_batch(stored: &[(String, String)]) {
    for pair in stored.windows(2) {
        assert!(
            !(pair[0].0 == "assistant" && pair[1].0 == "assistant"),
            "two answers in a row: {pair:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_messages_to_one_conversation_across_two_serve_hosts_are_each_answered_by_its_owner()
 {
    let Served {
        cluster: _cluster,
        url: _url,
        db,
        hosts: (a, b),
        client,
    } = Served::two().await;
    a.post(&client, "hello").await;
    until_stored(&db, "A's first answer", |s| holds(s, "reply from host-a")).await;

    let sent: Vec<String> = (0..1000).map(|n| format!("message {n}")).collect();
    let posts = futures_util::stream::iter(sent.iter().enumerate().map(|(n, text)| {
        let (host, client) = (if n % 2 == 0 { &a } else { &b }, &client);
        async move { host.post(client, text).await }
    }));
    futures_util::StreamExt::for_each_concurrent(posts, 16, |post| post).await;

    let stored = until_stored(&db, "every message, answered", |s| {
        sent.iter().all(|text| holds(s, text))
            && s.last().is_some_and(|(role, _)| role == "assistant")
    })
    .await;
    for text in &sent {
        let times = stored.iter().filter(|(_, said)| said == text).count();
        assert_eq!(times, 1, "{text} stored {times} times");
    }
    one_answer_per_batch(&stored);
    assert!(
        !stored.iter().any(|(_, said)| said.contains("host-b")),
        "B forwarded everything and answered nothing"
    );
    let epoch = scalar(
        &db,
        "SELECT epoch FROM sessions WHERE channel = 'channel:main'",
    )
    .await;
    assert_eq!(epoch, 1);
    // Each row goes with its answer, left just after its turn is stored.
    until_scalar(&db, "an empty inbox", "SELECT count(*) FROM inbox", 0).await;

    // A client that waits for the reply gets the owner's, through either host.
    for host in [&a, &b] {
        let answered: serde_json::Value = client
            .post(format!("{}/v1/channels/main/messages", host.url))
            .json(&serde_json::json!({ "text": "one more", "wait": true }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answered["reply"], "reply from host-a", "{answered}");
    }
}

/// Waits until run `run`'s lease is over by the database's clock.
async fn until_expired(db: &tokio_postgres::Client, run: i64) {
    let sql = format!("SELECT (expires_at <= now())::INT::BIGINT FROM runs WHERE id = {run}");
    until_scalar(db, &format!("run {run} to expire"), &sql, 1).await;
}

/// The run that owns `channel:main`.
async fn owner(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT owner_run FROM sessions WHERE channel = 'channel:main'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_paused_past_its_lease_lands_nothing_after_another_took_over_and_exits() {
    let Served {
        cluster: _cluster,
        url: _url,
        db,
        hosts: (mut a, b),
        client,
    } = Served::two().await;
    a.post(&client, "hello").await;
    until_stored(&db, "A's first answer", |s| holds(s, "reply from host-a")).await;
    let a_run = owner(&db).await;

    // A's model is slow on the next message; A is paused while it thinks, and stays
    // paused until its lease is over by the database's clock (and so by A's own).
    a.post(&client, "slow one").await;
    send_signal(a.pid(), "-STOP");
    until_expired(&db, a_run).await;
    b.post(&client, "after the pause").await;
    let taken = until_stored(&db, "B's answer", |s| holds(s, "reply from host-b")).await;

    // A resumes: its slow answer is neither delivered nor stored, and A stops.
    send_signal(a.pid(), "-CONT");
    let status = a.wait();
    assert_eq!(status.code(), Some(3), "{}", a.log());
    assert!(a.log().contains("lease expired"), "{}", a.log());
    let stored = conversation(&db).await;
    assert_eq!(stored, taken, "nothing of A's landed after the takeover");
    assert!(!holds(&stored, "slow reply from host-a"));
    one_answer_per_batch(&stored);
    let epoch = scalar(
        &db,
        "SELECT epoch FROM sessions WHERE channel = 'channel:main'",
    )
    .await;
    assert_eq!(epoch, 2);
    assert_ne!(owner(&db).await, a_run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_hosts_worker_is_reported_lost_by_another_host_and_never_rerun() {
    let Served {
        cluster: _cluster,
        url: _url,
        db,
        hosts: (mut a, b),
        client,
    } = Served::two().await;
    a.post(&client, "please spawn a worker").await;
    until_scalar(
        &db,
        "a running worker",
        "SELECT count(*) FROM workers WHERE state = 'running'",
        1,
    )
    .await;
    let a_run = owner(&db).await;
    send_signal(a.pid(), "-KILL");
    a.wait();
    until_expired(&db, a_run).await;

    // B, looking, marks the worker lost and tells the conversation, which it takes over.
    let stored = until_stored(&db, "the report of the lost worker", |s| {
        s.iter().any(|(_, said)| said.contains("not run again"))
            && s.last().is_some_and(|(role, _)| role == "assistant")
    })
    .await;
    assert!(holds(&stored, "reply from host-b"), "{stored:?}");
    let workers: Vec<(String, String)> = db
        .query("SELECT id, state FROM workers", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(workers.len(), 1, "nothing re-ran: {workers:?}");
    assert_eq!(workers[0].1, "interrupted");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_restarted_mid_turn_loses_no_row_and_moves_no_epoch() {
    let Served {
        cluster,
        url,
        db,
        hosts: (a, b),
        client,
    } = Served::two().await;
    a.post(&client, "hello").await;
    until_stored(&db, "A's first answer", |s| holds(s, "reply from host-a")).await;
    // Mid-turn: A's model is thinking when the database restarts.
    a.post(&client, "slow one").await;
    drop(db);
    cluster.restart();
    let db = admin(&url).await;
    // The next message, sent through the other host: by the time it is answered, the slow
    // turn's messages are stored too (saved after the restart, or rewritten with the next
    // save if that one failed while the server was down).
    b.post(&client, "after the restart").await;
    let stored_after = until_stored(&db, "every answer", |s| {
        holds(s, "slow reply from host-a")
            && holds(s, "after the restart")
            && s.last().is_some_and(|(role, _)| role == "assistant")
    })
    .await;
    for said in [
        "hello",
        "reply from host-a",
        "slow one",
        "after the restart",
    ] {
        assert!(
            stored_after.iter().filter(|(_, s)| s == said).count() >= 1,
            "{said}: {stored_after:?}"
        );
    }
    for said in [
        "hello",
        "slow one",
        "slow reply from host-a",
        "after the restart",
    ] {
        assert_eq!(
            stored_after.iter().filter(|(_, s)| s == said).count(),
            1,
            "{said}: {stored_after:?}"
        );
    }
    one_answer_per_batch(&stored_after);
    assert!(!stored_after.iter().any(|(_, s)| s.contains("host-b")));
    let epoch = scalar(
        &db,
        "SELECT epoch FROM sessions WHERE channel = 'channel:main'",
    )
    .await;
    assert_eq!(epoch, 1, "the restart moved no session");
    assert!(
        a.log().is_empty() || !a.log().contains("panicked"),
        "{}",
        a.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_identical_spawns_across_two_serve_hosts_start_one_worker() {
    let Served {
        cluster: _cluster,
        url: _url,
        db,
        hosts: (a, b),
        client,
    } = Served::two().await;
    // Fifty conversations, half opened on each host, each asking its model once to spawn
    // the same task: fifty spawn calls, all at once.
    let posts = futures_util::stream::iter((0..50).map(|n| {
        let host = if n % 2 == 0 { &a } else { &b };
        let client = &client;
        async move {
            let response = client
                .post(format!("{}/v1/channels/c{n}/messages", host.url))
                .json(&serde_json::json!({ "text": format!("please spawn {n}") }))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 202);
        }
    }));
    futures_util::StreamExt::for_each_concurrent(posts, 50, |post| post).await;
    // Every conversation's turn ended with its reply, its spawn call answered before it
    // (a delivered reply folds the turn's calls into it).
    until_scalar(
        &db,
        "every conversation's reply",
        "SELECT count(DISTINCT channel) FROM history WHERE message LIKE '%reply from host-%'",
        50,
    )
    .await;
    let workers = scalar(&db, "SELECT count(*) FROM workers").await;
    assert_eq!(workers, 1, "one worker for the fifty spawns");
    let held = scalar(&db, "SELECT count(*) FROM task_reservations").await;
    assert_eq!(held, 1);
    let owners = scalar(&db, "SELECT count(DISTINCT owner_run) FROM sessions").await;
    assert_eq!(owners, 2, "the spawns came from both hosts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capstan_run_on_a_conversation_another_host_answers_prints_that_hosts_answer() {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let owner = pg_host(&url, "host-a");
    let client = reqwest::Client::new();
    let answered = client
        .post(format!("{}/v1/channels/main/messages", owner.url))
        .json(&serde_json::json!({ "text": "hello", "wait": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200, "{}", owner.log());
    // Another host, at the terminal: the message is forwarded to the owner, whose answer
    // is printed here, and the exit says how it went.
    let other = host_dir();
    let run = capstan_command(other.path(), &["run", "again"])
        .env("CAPSTAN_TEST_DATABASE_URL", &url)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}\n{}", stderr(&run), owner.log());
    assert_eq!(
        stdout(&run),
        "agent> reply from host-a\n",
        "{}",
        stderr(&run)
    );
    assert!(stderr(&run).contains("forwarded"), "{}", stderr(&run));
    let db = admin(&url).await;
    let stored = scalar(
        &db,
        "SELECT count(*) FROM history WHERE channel = 'channel:main' AND message LIKE '%again%'",
    )
    .await;
    assert_eq!(stored, 1, "stored once, by the owner");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_database_outage_shorter_than_the_lease_every_acknowledged_message_is_stored_once()
 {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let host = pg_host_with(
        &url,
        "host-a",
        "[limits]\nsettle_ms = 0\nstore_retry_ms = 100\nunstored_reply_secs = 1\n",
    );
    let client = reqwest::Client::new();
    let mut accounts = Accounts::default();
    // Before: every message answered and stored.
    for _ in 0..5 {
        accounts.next(&client, &host.url).await;
    }
    // The database goes away; messages go on until two were answered without it.
    cluster.stop();
    while accounts.not_stored() < 2 {
        accounts.next(&client, &host.url).await;
    }
    cluster.start_server();
    for _ in 0..5 {
        accounts.next(&client, &host.url).await;
    }
    accounts.resend_refused(&client, &host.url).await;
    let db = admin(&url).await;
    let table = accounts
        .settled(&client, &host.url, async || user_messages(&db).await)
        .await;
    assert!(
        table.get(&Heard::Pending).copied().unwrap_or(0)
            + table.get(&Heard::Refused).copied().unwrap_or(0)
            >= 2
    );
    eprintln!("accounting (outage shorter than the lease): {table:?}, each stored once");
    assert!(!host.log().contains("panicked"), "{}", host.log());
}

/// The user messages stored in conversation `main`.
async fn user_messages(db: &tokio_postgres::Client) -> Vec<String> {
    conversation(db)
        .await
        .into_iter()
        .filter(|(role, _)| role == "user")
        .map(|(_, said)| said)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_database_outage_longer_than_the_lease_the_host_stops_with_3_and_the_next_start_stores_its_spill()
 {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let env = [("CAPSTAN_TEST_DATABASE_URL", url.as_str())];
    let dir = pg_dir(
        "host-a",
        "[limits]\nsettle_ms = 0\nstore_retry_ms = 100\nunstored_reply_secs = 1\n",
        "lease_secs = 10\nspill_file = \"spill.json\"",
    );
    let spill = dir.path().join("spill.json");
    let mut host = ServeHost::start(dir, &env);
    let client = reqwest::Client::new();
    let mut accounts = Accounts::default();
    for _ in 0..3 {
        let heard = accounts.next(&client, &host.url).await;
        assert_eq!(heard, Heard::Stored, "{}", host.log());
    }
    // The database goes away for longer than the lease: two messages are answered as not
    // yet stored, kept in memory and in the spill file.
    cluster.stop();
    while accounts.not_stored() < 2 {
        accounts.next(&client, &host.url).await;
    }
    assert!(spill.exists(), "spilled before the client was told");
    // Its lease over by its own clock, the host stops of itself, saying so and naming
    // what it could not store and where that is kept.
    let status = host.wait();
    let log = host.log();
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(log.contains("lease is over"), "{log}");
    assert!(
        log.contains("channel:main was not stored") && log.contains("spill.json"),
        "{log}"
    );
    // The database is back; the next start on the same directory stores what the spill
    // file held once the stopped run's lease has ended by the database's clock too, before
    // the messages sent meanwhile (they wait for that run's lease, then are answered here).
    cluster.start_server();
    let host = host.restart(&env);
    for _ in 0..3 {
        let heard = accounts.next(&client, &host.url).await;
        assert_eq!(heard, Heard::Stored, "{}", host.log());
    }
    // One sent as the host was stopping may have had no answer: sent again, it is taken.
    accounts.resend_refused(&client, &host.url).await;
    let db = admin(&url).await;
    let table = accounts
        .settled(&client, &host.url, async || user_messages(&db).await)
        .await;
    assert!(
        !spill.exists(),
        "the spill is stored and emptied: {}",
        host.log()
    );
    eprintln!("accounting (outage longer than the lease): {table:?}, each stored once");
    assert!(table.get(&Heard::Pending) >= Some(&1), "{table:?}");
    // In the order sent, but for any refused and sent again later.
    let refused = accounts.refused();
    let order: Vec<usize> = user_messages(&db)
        .await
        .iter()
        .filter_map(|said| said.strip_prefix("message ")?.parse().ok())
        .filter(|n| !refused.contains(n))
        .collect();
    assert!(order.is_sorted(), "stored in the order sent: {order:?}");
    one_answer_per_batch(&conversation(&db).await);
}

/// What the test's own connections call themselves, so the host's can be told apart.
const SLOT_HOLDER: &str = "capstan-test-slot-holder";

/// Connections to `url` opened until the server refuses one for want of a slot: every slot
/// taken (the test's user is a superuser, so its connections take the reserved ones too).
async fn take_every_slot(url: &str) -> Vec<tokio_postgres::Client> {
    let url = format!("{url}?application_name={SLOT_HOLDER}");
    let mut held = Vec::new();
    loop {
        match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                held.push(client);
            }
            Err(err) => {
                let code = err.as_db_error().map(|db| db.code().code().to_owned());
                assert_eq!(code.as_deref(), Some("53300"), "{err}");
                return held;
            }
        }
        assert!(held.len() < 1000, "the server never ran out of slots");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_connection_slot_taken_every_acknowledged_message_is_stored_once_and_a_new_host_is_told_the_fix()
 {
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let env = [("CAPSTAN_TEST_DATABASE_URL", url.as_str())];
    let limits = "[limits]\nsettle_ms = 0\nstore_retry_ms = 100\nunstored_reply_secs = 1\n";
    let host = ServeHost::start(pg_dir("host-a", limits, "lease_secs = 60"), &env);
    let client = reqwest::Client::new();
    let mut accounts = Accounts::default();
    for _ in 0..3 {
        let heard = accounts.next(&client, &host.url).await;
        assert_eq!(heard, Heard::Stored, "{}", host.log());
    }
    // Every slot is taken, then the host's own connections are cut: it needs new ones,
    // and the server has none left.
    // The host reconnects as its connections are cut and may win a freed slot back, so
    // this goes on until the server is full with none of the host's connections left.
    let mut held: Vec<tokio_postgres::Client> = Vec::new();
    let theirs = format!(
        "FROM pg_stat_activity WHERE backend_type = 'client backend' \
         AND application_name <> '{SLOT_HOLDER}'"
    );
    until("every slot held, none by the host", async || {
        held.extend(take_every_slot(&url).await);
        let count = format!("SELECT count(*) {theirs}");
        let left: i64 = held[0].query_one(&count, &[]).await.unwrap().get(0);
        if left == 0 {
            return Ok(());
        }
        let cut = format!("SELECT count(pg_terminate_backend(pid)) {theirs}");
        held[0].query_one(&cut, &[]).await.unwrap();
        Err(format!("{left} of the host's connections left"))
    })
    .await;
    while accounts.not_stored() < 2 {
        accounts.next(&client, &host.url).await;
        assert!(accounts.len() < 50, "{}", host.log());
    }
    // A host starting now is told why it cannot, and what to do.
    let started = capstan_command(
        pg_dir("host-b", limits, "").path(),
        &["serve", "--addr", "127.0.0.1:0"],
    )
    .envs(env)
    .output()
    .unwrap();
    assert!(!started.status.success());
    assert!(
        stderr(&started).contains("raise max_connections"),
        "{}",
        stderr(&started)
    );
    drop(held);
    for _ in 0..3 {
        accounts.next(&client, &host.url).await;
    }
    accounts.resend_refused(&client, &host.url).await;
    let db = admin(&url).await;
    let table = accounts
        .settled(&client, &host.url, async || user_messages(&db).await)
        .await;
    eprintln!("accounting (every connection slot taken): {table:?}, each stored once");
    assert!(!host.log().contains("panicked"), "{}", host.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_database_restarts_under_traffic_through_three_hosts_store_every_acknowledged_message_once()
 {
    const PER_HOST: usize = 12;
    let cluster = TestCluster::start();
    let url = cluster.fresh_database().await;
    let limits = "[limits]\nsettle_ms = 0\nstore_retry_ms = 100\nunstored_reply_secs = 1\n";
    let hosts = ["host-a", "host-b", "host-c"].map(|name| pg_host_with(&url, name, limits));
    let client = reqwest::Client::new();
    // The first message makes host-a the conversation's owner; the others forward to it.
    let mut accounts = Accounts::default();
    let first = accounts.next(&client, &hosts[0].url).await;
    assert_eq!(first, Heard::Stored, "{}", hosts[0].log());
    let sent = Arc::new(AtomicUsize::new(0));
    let traffic: Vec<_> = hosts
        .iter()
        .enumerate()
        .map(|(h, host)| {
            let (client, url, sent) = (client.clone(), host.url.clone(), sent.clone());
            tokio::spawn(async move {
                let mut heard = Vec::new();
                for i in 0..PER_HOST {
                    let n = 1 + h * PER_HOST + i;
                    heard.push((n, Accounts::send(&client, &url, n).await));
                    sent.fetch_add(1, Ordering::SeqCst);
                }
                heard
            })
        })
        .collect();
    // Three restarts of the server, a quarter, half and three quarters of the way in.
    for quarter in 1..=3 {
        let due = quarter * hosts.len() * PER_HOST / 4;
        until("the traffic to go on", async || {
            match sent.load(Ordering::SeqCst) {
                done if done >= due => Ok(()),
                done => Err(format!(
                    "{done} of {due} sent\n{}",
                    hosts
                        .iter()
                        .map(|h| h.log())
                        .collect::<Vec<_>>()
                        .join("\n----\n")
                )),
            }
        })
        .await;
        cluster.restart();
    }
    for heard in futures_util::future::join_all(traffic).await {
        for (n, heard) in heard.unwrap() {
            accounts.record(n, heard);
        }
    }
    accounts.resend_refused(&client, &hosts[0].url).await;
    let db = admin(&url).await;
    // Every message sent again through a host that forwards to the owner.
    let table = accounts
        .settled(&client, &hosts[1].url, async || user_messages(&db).await)
        .await;
    eprintln!("accounting (three restarts through three hosts): {table:?}, each stored once");
    one_answer_per_batch(&conversation(&db).await);
    for host in &hosts {
        assert!(!host.log().contains("panicked"), "{}", host.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_mid_turn_answers_the_waiting_client_and_a_forwarded_message_once() {
    let Served {
        cluster: _cluster,
        url: _,
        db,
        hosts: (a, b),
        client,
    } = Served::two().await;
    a.post(&client, "hello").await;
    until_stored(&db, "A's first answer", |s| holds(s, "reply from host-a")).await;
    // A client waits on a slow turn of A; another waits on a message B forwards to A.
    let mut a_events = events(&client, &a).await;
    let waiting = tokio::spawn(post_waiting(
        client.clone(),
        a.url.clone(),
        "slow-1",
        "slow one",
    ));
    until_event(&mut a_events, "turn_started").await;
    let forwarded = tokio::spawn(post_waiting(
        client.clone(),
        b.url.clone(),
        "forwarded-1",
        "meanwhile",
    ));
    until_scalar(
        &db,
        "the forwarded message in A's inbox",
        "SELECT count(*) FROM inbox",
        1,
    )
    .await;
    send_signal(a.pid(), "-TERM");
    let (status, body) = waiting.await.unwrap();
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("stored")),
        "{body}\n{}",
        a.log()
    );
    // Its reply first; the forwarded message, taken before the stop closed the
    // conversation, may join its exchange while it waits for the conversation to be idle.
    assert!(
        body["reply"]
            .as_str()
            .unwrap()
            .starts_with("slow reply from host-a"),
        "{body}"
    );
    let (status, body) = forwarded.await.unwrap();
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("stored")),
        "{body}\n{}",
        b.log()
    );
    let stored = conversation(&db).await;
    for said in ["slow one", "meanwhile"] {
        let times = stored
            .iter()
            .filter(|(role, s)| role == "user" && s == said)
            .count();
        assert_eq!(times, 1, "{said}: {stored:?}");
    }
    until("A's stop report", async || {
        let log = a.log();
        if log.contains("every conversation's history is stored") {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
}
