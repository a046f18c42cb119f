//! The `capstan` binary on a PostgreSQL store: separate processes are separate hosts.

use capstan_host::postgres::test_cluster::{TestCluster, admin};

use crate::support::{capstan_command, stderr, stdout};

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
    let epoch: i64 = db
        .query_one(
            "SELECT epoch FROM sessions WHERE channel = 'channel:main'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(epoch, 2);
    let open_runs: i64 = db
        .query_one("SELECT count(*) FROM runs WHERE ended_at IS NULL", &[])
        .await
        .unwrap()
        .get(0);
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
