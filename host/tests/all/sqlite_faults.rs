//! `capstan serve` on its SQLite store when the store misbehaves: a database another
//! process keeps locked, and a full disk (a small loopback filesystem). Every request is
//! accounted for: answered and stored, or answered as not yet stored and stored later,
//! each message exactly once.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::accounting::{Accounts, Heard};
use crate::support::serve_host::ServeHost;
use crate::support::until;

/// A `capstan serve` on SQLite that answers every message with a reply and is told not
/// yet stored after a second; `agent` is added to its `[agent]` table.
fn sqlite_host(dir: tempfile::TempDir, agent: &str) -> ServeHost {
    sqlite_host_with(dir, agent, "")
}

/// [`sqlite_host`] with `store` as its `[store]` table's keys.
fn sqlite_host_with(dir: tempfile::TempDir, agent: &str, store: &str) -> ServeHost {
    std::fs::write(
        dir.path().join("script.toml"),
        r#"
[[step]]
process = "channel"
tool_calls = [{ name = "reply", arguments = { text = "answered" } }]
repeat = true
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        format!(
            "[agent]\n{agent}\n[provider]\nkind = \"scripted\"\nscript = \"script.toml\"\n\
             [limits]\nsettle_ms = 0\nstore_retry_ms = 100\nunstored_reply_secs = 1\n\
             [store]\n{store}\n"
        ),
    )
    .unwrap();
    ServeHost::start(dir, &[])
}

/// The user messages stored in `data_dir`'s conversation `main`, read as `capstan` reads
/// them.
fn stored_messages(data_dir: &Path) -> Vec<String> {
    capstan_host::store::Store::open(data_dir)
        .expect("opening the store")
        .load_history_as::<capstan_host::llm::Message>("channel:main")
        .expect("reading the history")
        .into_iter()
        .map(|m| m.content)
        .filter(|said| said.starts_with("message "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_database_another_process_keeps_locked_answers_not_yet_stored_then_stores_each_message_once()
 {
    let host = sqlite_host(tempfile::tempdir().unwrap(), "");
    let data_dir = host.dir().join(".capstan");
    let client = reqwest::Client::new();
    let mut accounts = Accounts::default();
    for _ in 0..3 {
        let heard = accounts.next(&client, &host.url).await;
        assert_eq!(heard, Heard::Stored, "{}", host.log());
    }
    // Another process takes the database's write lock and keeps it: nothing can be
    // stored, so nothing may be acknowledged as stored.
    let lock = rusqlite::Connection::open(data_dir.join("capstan.db")).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    for _ in 0..3 {
        let heard = accounts.next(&client, &host.url).await;
        assert_eq!(heard, Heard::Pending, "{}", host.log());
    }
    lock.execute_batch("COMMIT").unwrap();
    drop(lock);
    for _ in 0..3 {
        accounts.next(&client, &host.url).await;
    }
    // A client that retries a message answered as not yet stored gets its answer, once.
    let (again, body) = Accounts::send(&client, &host.url, 4).await;
    assert_eq!(again, Heard::Stored, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["repeated"],
        true,
        "{body}"
    );
    let table = accounts
        .settled(&client, &host.url, async || stored_messages(&data_dir))
        .await;
    eprintln!("accounting (SQLite locked): {table:?}, each stored once");
    // The three sent while it was locked, and perhaps one after, still slow to store.
    assert!(table.get(&Heard::Pending) >= Some(&3), "{table:?}");
    assert!(!host.log().contains("panicked"), "{}", host.log());
}

/// A small ext4 filesystem in a file, mounted through a loop device; unmounted when
/// dropped. Mounting needs root, as the test suite runs in CI.
struct SmallDisk {
    at: PathBuf,
    _image: tempfile::TempDir,
}

impl SmallDisk {
    /// Makes a `mib` MiB filesystem and mounts it at `at` (created).
    fn mount(at: &Path, mib: u64) -> SmallDisk {
        let image = tempfile::tempdir().unwrap();
        let file = image.path().join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&file));
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&file)
            .arg(at));
        SmallDisk {
            at: at.to_owned(),
            _image: image,
        }
    }

    /// Fills the filesystem with a file of zeros until it is full: the file.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let filler = self.at.join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 4096];
        loop {
            match file.write_all(&chunk).and_then(|()| file.sync_all()) {
                Ok(()) => continue,
                Err(err) if err.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) => {
                    return filler;
                }
                Err(err) => panic!("filling {}: {err}", filler.display()),
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a process still holding a file there lets go when it exits.
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Runs `command`, failing the test with what it said if it fails.
fn run(command: &mut Command) {
    let out = command
        .output()
        .unwrap_or_else(|err| panic!("{command:?}: {err}"));
    assert!(
        out.status.success(),
        "{command:?} failed (this test mounts a small loopback filesystem and needs root, \
         as the test suite has in CI): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_under_sqlite_answers_not_yet_stored_then_stores_each_message_once() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let disk = SmallDisk::mount(&data_dir, 16);
    let host = sqlite_host(dir, "data_dir = \"data\"");
    let client = reqwest::Client::new();
    let mut accounts = Accounts::default();
    for _ in 0..3 {
        let heard = accounts.next(&client, &host.url).await;
        assert_eq!(heard, Heard::Stored, "{}", host.log());
    }
    // The disk fills up. SQLite may still find room in pages it holds, so messages go on
    // until two were answered without being stored.
    let filler = disk.fill();
    while accounts.not_stored() < 2 {
        accounts.next(&client, &host.url).await;
        assert!(
            accounts.len() < 500,
            "500 messages stored on a full disk: {}",
            host.log()
        );
    }
    std::fs::remove_file(&filler).unwrap();
    for _ in 0..3 {
        accounts.next(&client, &host.url).await;
    }
    accounts.resend_refused(&client, &host.url).await;
    let table = accounts
        .settled(&client, &host.url, async || stored_messages(&data_dir))
        .await;
    eprintln!("accounting (SQLite, full disk): {table:?}, each stored once");
    assert!(!host.log().contains("panicked"), "{}", host.log());
    drop(host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_while_its_sqlite_database_is_locked_stores_its_spill_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let spill = dir.path().join("spill.json");
    let host = sqlite_host_with(dir, "", "spill_file = \"spill.json\"");
    let data_dir = host.dir().join(".capstan");
    let client = reqwest::Client::new();
    let mut accounts = Accounts::default();
    for _ in 0..2 {
        let heard = accounts.next(&client, &host.url).await;
        assert_eq!(heard, Heard::Stored, "{}", host.log());
    }
    let lock = rusqlite::Connection::open(data_dir.join("capstan.db")).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    for _ in 0..2 {
        let heard = accounts.next(&client, &host.url).await;
        assert_eq!(heard, Heard::Pending, "{}", host.log());
    }
    // Told "not yet stored" only once it was on disk: a kill -9 now loses none of it.
    assert!(spill.exists(), "{}", host.log());
    // Killed while the database is still locked: only the spill file has the two.
    let mut host = host;
    host.kill();
    let killed = host.log();
    lock.execute_batch("COMMIT").unwrap();
    drop(lock);
    // The next start opens the conversation with the spilled history and writes it first.
    let host = host.restart(&[]);
    accounts.next(&client, &host.url).await;
    let table = accounts
        .settled(&client, &host.url, async || stored_messages(&data_dir))
        .await;
    until("the spill file emptied", async || match spill.exists() {
        false => Ok(()),
        true => Err(format!("{killed}\n{}", host.log())),
    })
    .await;
    assert!(
        host.log()
            .contains("the spill file held past what is stored"),
        "{}",
        host.log()
    );
    eprintln!("accounting (SQLite locked, host killed): {table:?}, each stored once");
    assert_eq!(table.get(&Heard::Pending), Some(&2));
    let users = stored_messages(&data_dir);
    let in_order: Vec<String> = (0..accounts.len())
        .map(|n| format!("message {n}"))
        .collect();
    assert_eq!(users, in_order, "stored in the order sent");
}
