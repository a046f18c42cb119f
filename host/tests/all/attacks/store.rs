//! The store under concurrency and damage: real processes opening and writing one SQLite
//! file at once, a run killed with SIGKILL, and database files damaged on disk.
//!
//! Child processes are this test binary run again on [`store_child`] alone, told what to do
//! through environment variables. Processes that must act at once each drop a `ready-N`
//! file and wait for a `go` file the parent creates when all are ready: a start gate, not
//! a sleep. Every wait is on a real condition, capped only to fail instead of hanging.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::ids::pid;
use capstan_host::store::{
    DATABASE_FILE, DataDirProblem, SCHEMA_VERSION, Store, StoreError, WorkerState,
};

/// What a child does; without it [`store_child`] does nothing.
const ROLE: &str = "CAPSTAN_ATTACK_STORE_ROLE";
/// The data dir a child opens.
const DATA_DIR: &str = "CAPSTAN_ATTACK_STORE_DIR";
/// The directory of the start gate's files.
const GATE: &str = "CAPSTAN_ATTACK_STORE_GATE";
/// The child's number among its siblings.
const INDEX: &str = "CAPSTAN_ATTACK_STORE_INDEX";
/// How many items a child writes.
const COUNT: &str = "CAPSTAN_ATTACK_STORE_COUNT";

/// Guards every wait against a hang; never expected to run out.
const HANG_CAP: Duration = Duration::from_secs(180);

/// Not a test of its own: the body of the child processes the tests below start.
#[test]
fn store_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let dir = PathBuf::from(var(DATA_DIR));
    let gate = PathBuf::from(var(GATE));
    let index: usize = var(INDEX).parse().unwrap();
    let count: usize = std::env::var(COUNT).map_or(0, |n| n.parse().unwrap());
    match role.as_str() {
        "open" => {
            pass_gate(&gate, index);
            let store = Store::open(&dir).unwrap_or_else(|err| panic!("open: {err}"));
            println!("SCHEMA {}", store.schema_version().unwrap());
        }
        "numbers" => {
            let store = Store::open(&dir).unwrap();
            pass_gate(&gate, index);
            for _ in 0..count {
                println!(
                    "NUMBER {}",
                    store
                        .next_process_number(capstan_host::ids::ProcessKind::Worker)
                        .unwrap()
                );
            }
        }
        "append" => {
            let store = Store::open(&dir).unwrap();
            pass_gate(&gate, index);
            for n in 0..count {
                let message = serde_json::json!({ "writer": index, "n": n }).to_string();
                store.append_history("main", &[message]).unwrap();
            }
        }
        "run" => {
            let store = Store::open(&dir).unwrap();
            let run = store.begin_run().unwrap();
            store
                .insert_worker_in_run(
                    run.id(),
                    &crate::support::ids::pid(&format!("worker:{index}")),
                    &crate::support::ids::pid("channel:main"),
                    "work",
                )
                .unwrap();
            // Ready only once the worker is recorded and the run's lock is held.
            touch(&gate.join(format!("ready-{index}")));
            wait_for(&gate.join("release"));
            drop(run);
        }
        "open-report" => match Store::open(&dir) {
            Ok(_) => println!("OPENED"),
            Err(err) => println!("ERROR {err}"),
        },
        other => panic!("unknown child role {other}"),
    }
}

/// Says this child is ready, then waits for the parent to let all go at once.
fn pass_gate(gate: &Path, index: usize) {
    touch(&gate.join(format!("ready-{index}")));
    wait_for(&gate.join("go"));
}

fn touch(path: &Path) {
    std::fs::write(path, b"").unwrap();
}

/// Waits until `path` exists.
fn wait_for(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < HANG_CAP,
            "{} did not appear within {HANG_CAP:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// This test binary, run on [`store_child`] alone as child `index` playing `role`.
fn child(role: &str, dir: &Path, gate: &Path, index: usize, count: usize) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "attacks::store::store_child",
            "--nocapture",
            "--quiet",
        ])
        .env(ROLE, role)
        .env(DATA_DIR, dir)
        .env(GATE, gate)
        .env(INDEX, index.to_string())
        .env(COUNT, count.to_string())
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Starts `n` children playing `role`, lets them all go at once, and returns their
/// outputs, each checked to have succeeded.
fn run_together(role: &str, dir: &Path, n: usize, count: usize) -> Vec<String> {
    let gate = tempfile::tempdir().unwrap();
    let children: Vec<Child> = (0..n)
        .map(|i| child(role, dir, gate.path(), i, count).spawn().unwrap())
        .collect();
    for i in 0..n {
        wait_for(&gate.path().join(format!("ready-{i}")));
    }
    touch(&gate.path().join("go"));
    children.into_iter().map(finished).collect()
}

/// The child's standard output, once it has exited successfully.
fn finished(child: Child) -> String {
    let out: Output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "child failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The values of the `PREFIX value` lines of `output`.
fn tagged<'a>(output: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> {
    output
        .lines()
        .filter_map(move |line| line.strip_prefix(prefix)?.strip_prefix(' '))
}

/// Every schema object of the database in `dir`, as SQLite lists them.
fn schema_objects(dir: &Path) -> Vec<(String, String)> {
    let conn = rusqlite::Connection::open(dir.join(DATABASE_FILE)).unwrap();
    let mut stmt = conn
        .prepare("SELECT type, name FROM sqlite_master ORDER BY type, name")
        .unwrap();
    stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn processes_creating_one_database_at_once_all_succeed() {
    let alone = tempfile::tempdir().unwrap();
    drop(Store::open(alone.path()).unwrap());
    let expected = schema_objects(alone.path());
    for _round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let outputs = run_together("open", dir.path(), 8, 0);
        for out in &outputs {
            assert_eq!(
                tagged(out, "SCHEMA").collect::<Vec<_>>(),
                [SCHEMA_VERSION.to_string()],
                "{out}"
            );
        }
        // Applied once: exactly the objects one lone open creates, and a second
        // application would have failed a child with "already exists".
        assert_eq!(schema_objects(dir.path()), expected);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.journal_mode().unwrap(), "wal");
    }
}

#[test]
fn process_numbers_are_unique_across_threads_and_processes() {
    const DRAWS: usize = 100;
    let dir = tempfile::tempdir().unwrap();
    let gate = tempfile::tempdir().unwrap();
    let children: Vec<Child> = (0..2)
        .map(|i| {
            child("numbers", dir.path(), gate.path(), i, DRAWS)
                .spawn()
                .unwrap()
        })
        .collect();
    let threads: Vec<_> = (2..4)
        .map(|i| {
            let (dir, gate) = (dir.path().to_owned(), gate.path().to_owned());
            std::thread::spawn(move || {
                let store = Store::open(&dir).unwrap();
                pass_gate(&gate, i);
                (0..DRAWS)
                    .map(|_| {
                        store
                            .next_process_number(capstan_host::ids::ProcessKind::Worker)
                            .unwrap()
                    })
                    .collect::<Vec<u64>>()
            })
        })
        .collect();
    for i in 0..4 {
        wait_for(&gate.path().join(format!("ready-{i}")));
    }
    touch(&gate.path().join("go"));
    let mut draws: Vec<Vec<u64>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    for out in children.into_iter().map(finished) {
        draws.push(tagged(&out, "NUMBER").map(|n| n.parse().unwrap()).collect());
    }
    for drawn in &draws {
        assert_eq!(drawn.len(), DRAWS);
        assert!(
            drawn.windows(2).all(|w| w[0] < w[1]),
            "not increasing: {drawn:?}"
        );
    }
    let all: BTreeSet<u64> = draws.iter().flatten().copied().collect();
    assert_eq!(all.len(), 4 * DRAWS, "some numbers were drawn twice");
    assert_eq!(all, (1..=4 * DRAWS as u64).collect());
    // A later run goes on from there.
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(
        store
            .next_process_number(capstan_host::ids::ProcessKind::Worker)
            .unwrap(),
        4 * DRAWS as u64 + 1
    );
    assert_eq!(
        store
            .next_process_number(capstan_host::ids::ProcessKind::Branch)
            .unwrap(),
        1
    );
}

#[test]
fn concurrent_runs_appending_to_one_history_lose_no_message() {
    const WRITERS: usize = 20;
    const EACH: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    run_together("append", dir.path(), WRITERS, EACH);
    let history = Store::open(dir.path())
        .unwrap()
        .load_history("main")
        .unwrap();
    let seqs: Vec<u64> = history.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..(WRITERS * EACH) as u64).collect::<Vec<_>>());
    let mut seen = BTreeSet::new();
    let mut last_n = vec![None; WRITERS];
    for entry in &history {
        let message: serde_json::Value = serde_json::from_str(&entry.message).unwrap();
        let writer = message["writer"].as_u64().unwrap() as usize;
        let n = message["n"].as_u64().unwrap() as usize;
        assert!(seen.insert((writer, n)), "stored twice: {}", entry.message);
        // Each writer's messages keep the order it appended them in.
        assert!(last_n[writer] < Some(n), "out of order: {}", entry.message);
        last_n[writer] = Some(n);
    }
    assert_eq!(seen.len(), WRITERS * EACH);
}

/// A closed database with a few hundred pages of history in `dir`.
fn database_with_content(dir: &Path) -> Vec<u8> {
    let store = Store::open(dir).unwrap();
    let messages: Vec<String> = (0..3000)
        .map(|i| serde_json::json!({ "role": "user", "content": format!("message {i} {}", "x".repeat(120)) }).to_string())
        .collect();
    store.append_history("main", &messages).unwrap();
    drop(store);
    // The last connection closed checkpointed the WAL into the file and removed it.
    assert!(!dir.join(format!("{DATABASE_FILE}-wal")).exists());
    std::fs::read(dir.join(DATABASE_FILE)).unwrap()
}

/// Opens a copy of a database damaged by `damage`, checks the refusal names the file and
/// the fix, and that the file's bytes are what they were.
fn refused(good: &[u8], damage: impl FnOnce(&mut Vec<u8>)) -> StoreError {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(DATABASE_FILE);
    let mut bytes = good.to_vec();
    damage(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    let err = Store::open(dir.path()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains("backup") && message.contains("aside"),
        "no fix given: {message}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the damaged file was written to"
    );
    err
}

#[test]
fn a_damaged_database_is_refused_with_its_path_and_left_untouched() {
    let source = tempfile::tempdir().unwrap();
    let good = database_with_content(source.path());
    let page_size = u16::from_be_bytes([good[16], good[17]]) as usize;
    let pages = good.len() / page_size;
    assert!(pages > 50, "only {pages} pages");

    // The copy opens fine undamaged, so what follows is refused for its damage alone.
    let control = tempfile::tempdir().unwrap();
    std::fs::write(control.path().join(DATABASE_FILE), &good).unwrap();
    assert_eq!(
        Store::open(control.path())
            .unwrap()
            .load_history("main")
            .unwrap()
            .len(),
        3000
    );

    // A b-tree page in the middle overwritten.
    let err = refused(&good, |bytes| {
        let page = pages / 2;
        bytes[page * page_size..(page + 1) * page_size].fill(0xA5);
    });
    assert!(matches!(err, StoreError::Damaged { .. }), "{err}");

    // Cut in half.
    let err = refused(&good, |bytes| bytes.truncate(pages / 2 * page_size));
    assert!(matches!(err, StoreError::Damaged { .. }), "{err}");

    // Not a database at all.
    let err = refused(&good, |bytes| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for byte in bytes.iter_mut().take(64 * 1024) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *byte = x as u8;
        }
        bytes.truncate(64 * 1024);
    });
    assert!(matches!(err, StoreError::NotADatabase { .. }), "{err}");
}

#[test]
fn a_database_from_a_newer_capstan_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let conn = rusqlite::Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    let message = Store::open(dir.path()).unwrap_err().to_string();
    assert!(
        message.contains(DATABASE_FILE)
            && message.contains("newer capstan")
            && message.contains("data_dir"),
        "{message}"
    );
}

#[test]
fn symlinked_database_files_are_refused_and_not_followed() {
    let real = tempfile::tempdir().unwrap();
    let good = database_with_content(real.path());
    let target = real.path().join(DATABASE_FILE);

    // The database itself a link to another database.
    let linked = tempfile::tempdir().unwrap();
    let link = linked.path().join(DATABASE_FILE);
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = Store::open(linked.path()).unwrap_err();
    assert!(matches!(err, StoreError::Symlink { .. }), "{err}");
    assert!(
        err.to_string().contains(&link.display().to_string()),
        "{err}"
    );

    // Its -wal and -shm files links to where the host must not write.
    for suffix in ["-wal", "-shm"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DATABASE_FILE), &good).unwrap();
        let victim = dir.path().join("victim");
        let link = dir.path().join(format!("{DATABASE_FILE}{suffix}"));
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let err = Store::open(dir.path()).unwrap_err();
        assert!(matches!(err, StoreError::Symlink { .. }), "{err}");
        assert!(
            err.to_string().contains(&link.display().to_string()),
            "{err}"
        );
        assert!(!victim.exists(), "the {suffix} link was followed");
    }
    assert_eq!(std::fs::read(&target).unwrap(), good);
}

#[test]
fn data_dir_problems_are_refused_with_the_path_and_the_fix() {
    let root = tempfile::tempdir().unwrap();
    // Created owner-only, parents too.
    let fresh = root.path().join("new/data");
    drop(Store::open(&fresh).unwrap());
    for dir in [root.path().join("new"), fresh] {
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }

    // A file in its place, or on its way.
    let file = root.path().join("file");
    std::fs::write(&file, b"not a directory").unwrap();
    for dir in [file.clone(), file.join("data")] {
        let err = Store::open(&dir).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::DataDirUnusable {
                    problem: DataDirProblem::NotADirectory,
                    ..
                }
            ),
            "{err}"
        );
        let message = err.to_string();
        assert!(
            message.contains(&dir.display().to_string()) && message.contains("data_dir"),
            "{message}"
        );
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"not a directory");

    // Not writable and not readable, for a user that is not root (root bypasses both).
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cases = [
        ("read-only", 0o555, "is not writable"),
        ("unreadable", 0o311, "cannot be read"),
    ];
    for (name, mode, problem) in cases {
        let dir = root.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let gate = root.path();
        let out = finished(
            child("open-report", &dir, gate, 0, 0)
                .uid(65534)
                .gid(65534)
                .spawn()
                .unwrap(),
        );
        let errors: Vec<&str> = tagged(&out, "ERROR").collect();
        assert_eq!(errors.len(), 1, "{out}");
        let message = errors[0];
        assert!(
            message.contains(&dir.display().to_string())
                && message.contains(problem)
                && message.contains("data_dir"),
            "{message}"
        );
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{name}");
    }
}

#[test]
fn unreadable_history_is_an_error_naming_the_channel_and_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let good = r#"{"role":"user","content":"hi"}"#.to_owned();
    store.append_history("main", &[good.clone(), good]).unwrap();
    store.append_history("shape", &["1".into()]).unwrap();
    let conn = rusqlite::Connection::open(store.path()).unwrap();
    conn.execute(
        "INSERT INTO history (channel, seq, message) VALUES ('main', 2, '{\"role\": trunc')",
        [],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO history (channel, seq, message) VALUES ('bytes', 0, X'FF00FF')",
        [],
    )
    .unwrap();
    drop(conn);

    let path = store.path().display().to_string();
    for (channel, seq, why) in [("main", 2, "not valid JSON"), ("bytes", 0, "not text")] {
        let err = store.load_history(channel).unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(&err, StoreError::UnreadableHistory { channel: c, seq: s, .. } if c == channel && *s == seq),
            "{message}"
        );
        assert!(
            message.contains(&path)
                && message.contains(&format!("`{channel}`"))
                && message.contains(why),
            "{message}"
        );
    }

    // Valid JSON, but not what the caller stores there.
    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Message {
        role: String,
        content: String,
    }
    assert_eq!(
        store
            .load_history_as::<Message>("main")
            .unwrap_err()
            .to_string(),
        store.load_history("main").unwrap_err().to_string()
    );
    let err = store.load_history_as::<Message>("shape").unwrap_err();
    assert!(
        matches!(&err, StoreError::UnreadableHistory { seq: 0, reason, .. } if reason.contains("not a valid message")),
        "{err}"
    );
}

#[test]
fn a_killed_runs_workers_are_interrupted_and_a_live_runs_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let gate = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut killed = child("run", dir.path(), gate.path(), 0, 0).spawn().unwrap();
    let live = child("run", dir.path(), gate.path(), 1, 0).spawn().unwrap();
    wait_for(&gate.path().join("ready-0"));
    wait_for(&gate.path().join("ready-1"));
    // A live run in this process, through another handle on the database.
    let here = Store::open(dir.path()).unwrap();
    let run = here.begin_run().unwrap();
    here.insert_worker_in_run(
        run.id(),
        &crate::support::ids::pid("worker:here"),
        &crate::support::ids::pid("channel:main"),
        "work",
    )
    .unwrap();
    // And a worker recorded without a run, which nothing can prove dead.
    store
        .insert_worker(
            &crate::support::ids::pid("worker:unowned"),
            &crate::support::ids::pid("channel:main"),
            "work",
        )
        .unwrap();

    killed.kill().unwrap(); // SIGKILL: no destructor runs, the lock file stays.
    killed.wait().unwrap();

    let marked = store.mark_interrupted_workers().unwrap();
    let ids: Vec<String> = marked.iter().map(|w| w.id.to_string()).collect();
    assert_eq!(ids, ["worker:0"]);
    assert_eq!(marked[0].state, WorkerState::Interrupted);
    assert!(
        marked[0]
            .outcome
            .as_deref()
            .unwrap()
            .contains("interrupted")
    );
    for id in ["worker:1", "worker:here", "worker:unowned"] {
        let worker = store.get_worker(&pid(id)).unwrap().unwrap();
        assert_eq!(worker.state, WorkerState::Running, "{id}");
    }
    // Nothing more to mark while the others live.
    assert!(store.mark_interrupted_workers().unwrap().is_empty());

    // The live child ends its run normally, leaving its worker behind as running.
    touch(&gate.path().join("release"));
    finished(live);
    drop(run);
    let ids: Vec<String> = store
        .mark_interrupted_workers()
        .unwrap()
        .into_iter()
        .map(|w| w.id.to_string())
        .collect();
    assert_eq!(ids, ["worker:1", "worker:here"]);
    let reopened = Store::open(dir.path()).unwrap();
    let state = |id| reopened.get_worker(&pid(id)).unwrap().unwrap().state;
    assert_eq!(state("worker:0"), WorkerState::Interrupted);
    assert!(WorkerState::Interrupted.is_terminal());
    assert_eq!(state("worker:unowned"), WorkerState::Running);
}
