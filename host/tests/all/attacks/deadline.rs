//! The wall-clock deadline holds everywhere: a guest that waits inside a host call (a
//! sleep, a read of a FIFO that never returns, a store import held up by a lock) or in
//! `describe()` is stopped at the deadline like one that loops, its pool slot is freed and
//! the next call runs; a plugin path that is not a regular file is refused at once.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use capstan_host::plugin::{ArtifactCache, CallRequest, Limits, PluginHost, Registry, ToolError};
use capstan_host::policy::Grants;
use capstan_host::store::Store;

use crate::support::{
    capstan_command, component, plugins_dir, plugins_with, stderr, stdout, test_cache_dir,
};

/// Guards against hangs only: no test expects anything to take this long.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// A registry of the first-party plugins and the probe, on a host with `deadline`.
async fn registry(deadline: Duration, store: Option<Arc<Store>>) -> Arc<Registry> {
    let limits = Limits {
        deadline,
        ..Limits::default()
    };
    let mut host = PluginHost::new(limits, ArtifactCache::new(test_cache_dir())).unwrap();
    if let Some(store) = store {
        host = host.with_services(store.services());
    }
    let log = crate::support::call_log_of(&host);
    let mut registry = Registry::load_dir(Arc::new(host), log, &plugins_dir())
        .await
        .unwrap();
    registry
        .add_file(&component("fixtures", "probe"))
        .await
        .expect("the probe loads");
    Arc::new(registry)
}

async fn call(
    registry: &Registry,
    tool: &str,
    args: &str,
    grants: &str,
    ws: &Path,
) -> Result<String, ToolError> {
    let grants: Grants = grants.parse().unwrap();
    let request = CallRequest {
        tool,
        args_json: args,
        grants: &grants,
        workspace: Some(ws),
        caller: &crate::support::ids::by("test"),
        instances: None,
    };
    tokio::time::timeout(HANG_GUARD, registry.call(request))
        .await
        .unwrap_or_else(|_| panic!("`{tool}` was not stopped: the deadline did not hold"))
}

fn expect_deadline(result: Result<String, ToolError>, tool: &str, secs: &str) {
    match result {
        Err(ToolError::Failed(msg)) => assert!(
            msg.contains(&format!("tool `{tool}`"))
                && msg.contains(&format!("ran past its {secs} s deadline")),
            "{msg}"
        ),
        other => panic!("expected the deadline error, got {other:?}"),
    }
}

/// The next call on the same host is served.
async fn next_call_works(registry: &Registry, ws: &Path) {
    let out = call(registry, "echo", r#"{"text": "next"}"#, "", ws).await;
    assert_eq!(out.unwrap(), "next");
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let c_path = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
    let rc = unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) };
    assert_eq!(
        rc,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// A FIFO in `dir` that no one opens: a guest opening it (to read or write) waits in
/// `open()` for the other end, which never comes. Dropping the guard opens it for reading and writing
/// (which never blocks on Linux) and closes it, which wakes such a waiter, so the thread
/// it left behind can finish.
struct Fifo(PathBuf);

impl Fifo {
    fn new(dir: &Path, name: &str) -> Self {
        let path = dir.join(name);
        mkfifo(&path);
        Fifo(path)
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = OpenOptions::new().read(true).write(true).open(&self.0);
    }
}

/// `raw_put`'s arguments to write the FIFO `pipe`.
const PUT_PIPE: &str = r#"{"path": "pipe", "content": "x"}"#;

/// Waits for `child` to exit (the guard only catches a hang), killing it if it hangs.
fn wait_for_exit(mut child: Child, what: &str) -> Output {
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if started.elapsed() > HANG_GUARD {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} hung; stderr: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_capstan(dir: &Path, args: &[&str], what: &str) -> Output {
    let child = capstan_command(dir, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_exit(child, what)
}

#[tokio::test]
async fn a_guest_sleeping_in_the_clock_is_stopped_at_the_deadline() {
    let registry = registry(Duration::from_millis(500), None).await;
    let ws = tempfile::tempdir().unwrap();
    let slept = call(&registry, "sleep", r#"{"secs": 3600}"#, "", ws.path()).await;
    expect_deadline(slept, "sleep", "0.5");
    next_call_works(&registry, ws.path()).await;
}

#[tokio::test]
async fn a_guest_blocked_opening_a_fifo_is_stopped_at_the_deadline() {
    // With fs.write, file operations run on blocking threads and a FIFO may be opened:
    // opening it for writing waits for a reader that never comes.
    let registry = registry(Duration::from_millis(500), None).await;
    let ws = tempfile::tempdir().unwrap();
    let fifo = Fifo::new(ws.path(), "pipe");
    let put = call(&registry, "raw_put", PUT_PIPE, "fs.write", ws.path()).await;
    expect_deadline(put, "raw_put", "0.5");
    next_call_works(&registry, ws.path()).await;
    // The abandoned open ends here, so the runtime's blocking thread can finish.
    drop(fifo);
}

#[tokio::test]
async fn a_call_that_may_only_read_is_refused_a_fifo_at_once() {
    // Its file operations run on the thread that runs the call: a FIFO could hold that
    // thread with no end, so opening one is refused before the open is tried, by its name
    // or through a link.
    let registry = registry(Duration::from_secs(60), None).await;
    let ws = tempfile::tempdir().unwrap();
    let _fifo = Fifo::new(ws.path(), "pipe");
    std::os::unix::fs::symlink("pipe", ws.path().join("link")).unwrap();
    std::fs::write(ws.path().join("notes.txt"), "plain\n").unwrap();
    // Were the open tried, it would wait for a writer and hold this test's only thread:
    // this one comes after 30 s, so such a regression fails below rather than hangs.
    let (read_all, watchdog_rx) = std::sync::mpsc::channel::<()>();
    let pipe = ws.path().join("pipe");
    let watchdog = std::thread::spawn(move || {
        if watchdog_rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = OpenOptions::new().read(true).write(true).open(&pipe);
        }
    });
    for path in ["pipe", "link"] {
        let args = format!(r#"{{"path": "{path}"}}"#);
        let read = call(&registry, "raw_read", &args, "fs.read", ws.path()).await;
        match read {
            Err(ToolError::Failed(msg)) => assert!(
                msg.to_lowercase().contains("not supported") && !msg.contains("deadline"),
                "{path}: {msg}"
            ),
            other => panic!("{path}: {other:?}"),
        }
    }
    read_all.send(()).unwrap();
    watchdog.join().unwrap();
    // Regular files are read as before.
    let notes = call(
        &registry,
        "raw_read",
        r#"{"path": "notes.txt"}"#,
        "fs.read",
        ws.path(),
    )
    .await;
    assert_eq!(notes.unwrap(), "plain\n");
}

#[tokio::test]
async fn every_pool_slot_freed_by_a_deadline_serves_the_next_calls() {
    // Two slots, each taken by a guest blocked on a FIFO until its deadline: had a stopped
    // call kept its slot, the echoes after them could never start.
    let limits = Limits {
        deadline: Duration::from_millis(500),
        max_concurrent_calls: 2,
        ..Limits::default()
    };
    let host = PluginHost::new(limits, ArtifactCache::new(test_cache_dir())).unwrap();
    let mut registry = Registry::new(Arc::new(host), capstan_host::plugin::CallLog::disabled());
    registry
        .add_file(&component("fixtures", "probe"))
        .await
        .unwrap();
    let ws = tempfile::tempdir().unwrap();
    let fifo = Fifo::new(ws.path(), "pipe");
    let blocked = (0..4).map(|_| call(&registry, "raw_put", PUT_PIPE, "fs.write", ws.path()));
    for result in futures_join(blocked).await {
        expect_deadline(result, "raw_put", "0.5");
    }
    for _ in 0..3 {
        next_call_works(&registry, ws.path()).await;
    }
    drop(fifo);
}

/// Runs the futures concurrently on this task and returns their outputs in order.
async fn futures_join<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

/// Holds SQLite's write lock on `db` from another connection until dropped.
struct WriteLock {
    release: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WriteLock {
    fn hold(db: &Path) -> Self {
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let db = db.to_owned();
        let thread = std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(db).unwrap();
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked_tx.send(()).unwrap();
            // Until released, or the guard: never longer than a hang.
            let _ = release_rx.recv_timeout(HANG_GUARD);
            conn.execute_batch("ROLLBACK").unwrap();
        });
        locked_rx.recv().unwrap();
        WriteLock {
            release,
            thread: Some(thread),
        }
    }
}

impl Drop for WriteLock {
    fn drop(&mut self) {
        let _ = self.release.send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Wakes a [`tokio::sync::Notify`] when a plugin logs `line`.
struct LogGate {
    line: &'static str,
    seen: Arc<tokio::sync::Notify>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for LogGate {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(bool, &'static str);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && format!("{value:?}").contains(self.1) {
                    self.0 = true;
                }
            }
        }
        let mut message = Message(false, self.line);
        event.record(&mut message);
        if message.0 {
            self.seen.notify_one();
        }
    }
}

/// Set in the child process that runs [`slow_store_import`] alone.
const SLOW_STORE_CHILD: &str = "CAPSTAN_ATTACK_SLOW_STORE_CHILD";

/// Runs in a process of its own: its gates are log events seen by a thread-local
/// subscriber, and tracing's per-callsite interest is shared by every thread of a
/// process, so tests logging on other threads must not be able to hide them.
#[test]
fn a_guest_waiting_in_a_slow_store_import_frees_the_executor_and_stops_at_the_deadline() {
    if std::env::var_os(SLOW_STORE_CHILD).is_some() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(slow_store_import());
        return;
    }
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "attacks::deadline::a_guest_waiting_in_a_slow_store_import_frees_the_executor_and_stops_at_the_deadline",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(SLOW_STORE_CHILD, "1")
        .env_remove("RUST_BACKTRACE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_for_exit(child, "the slow store import test");
    assert!(
        out.status.success() && stdout(&out).contains("1 passed"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
}

/// The body of the test above, on one thread.
async fn slow_store_import() {
    use tracing_subscriber::layer::SubscriberExt;

    let data = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(data.path()).unwrap());
    let registry = registry(Duration::from_secs(1), Some(store.clone())).await;
    let ws = tempfile::tempdir().unwrap();

    // The probe logs this line, then calls `tasks.create` with nothing in between that
    // could yield: the executor runs anything else only if the import yields.
    let entered = Arc::new(tokio::sync::Notify::new());
    let gate = LogGate {
        line: "probe: writing a task",
        seen: entered.clone(),
    };
    // The host logs the call's outcome before it writes the audit row (which the lock
    // holds up): the call itself has ended by then.
    let ended = Arc::new(tokio::sync::Notify::new());
    let ended_gate = LogGate {
        line: "tool call",
        seen: ended.clone(),
    };
    let _subscriber = tracing::subscriber::set_default(
        tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::INFO)
            .with(gate)
            .with(ended_gate),
    );

    let lock = WriteLock::hold(store.path());
    let slow = tokio::spawn({
        let registry = registry.clone();
        let ws = ws.path().to_owned();
        async move {
            call(
                &registry,
                "task_write",
                r#"{"text": "held up"}"#,
                "tasks.write",
                &ws,
            )
            .await
        }
    });
    tokio::time::timeout(HANG_GUARD, entered.notified())
        .await
        .expect("the probe reached the tasks import");
    // One thread runs this runtime: had the import held it (a synchronous SQLite wait),
    // this line would run only after the call had ended.
    assert!(
        !slow.is_finished(),
        "the store import held the executor until the call ended"
    );
    // The call ends while the lock is still held: only the deadline can have ended it.
    // (It then waits for its audit row, which the lock holds up.)
    tokio::time::timeout(HANG_GUARD, ended.notified())
        .await
        .expect("the call ended");
    drop(lock);
    let result = slow.await.unwrap();
    expect_deadline(result, "task_write", "1.0");
    next_call_works(&registry, ws.path()).await;
    let listed = call(&registry, "task_list", "{}", "tasks.read", ws.path()).await;
    assert!(listed.is_ok(), "the store serves calls again: {listed:?}");
}

#[test]
fn tool_call_blocked_on_a_fifo_reports_the_deadline_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(
        component("fixtures", "probe"),
        plugins.path().join("probe.wasm"),
    )
    .unwrap();
    // A workspace of its own: fs.write is refused where the config could lie in it.
    let ws = tempfile::tempdir().unwrap();
    let fifo = Fifo::new(ws.path(), "pipe");
    let out = run_capstan(
        dir.path(),
        &[
            "tool",
            "call",
            "raw_put",
            PUT_PIPE,
            "--grant",
            "fs.write",
            "--workspace",
            ws.path().to_str().unwrap(),
            "--deadline",
            "1",
            "--plugins-dir",
            plugins.path().to_str().unwrap(),
        ],
        "`capstan tool call` with a guest blocked on a FIFO",
    );
    drop(fifo);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(
        err.contains("error[failed]") && err.contains("ran past its 1.0 s deadline"),
        "{err}"
    );
}

#[test]
fn a_describe_that_sleeps_is_refused_and_the_other_plugins_serve() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&[(
        "describe_sleep.wasm",
        component("fixtures", "describe_sleep"),
    )]);
    let plugins_arg = plugins.path().to_str().unwrap();

    let out = run_capstan(
        dir.path(),
        &[
            "plugins",
            "list",
            "--deadline",
            "1",
            "--plugins-dir",
            plugins_arg,
        ],
        "`capstan plugins list` with a plugin whose describe() sleeps",
    );
    let (listed, err) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{err}");
    assert!(listed.contains("file_read"), "the others load: {listed}");
    assert!(!listed.contains("slept"), "{listed}");
    assert!(
        err.contains("describe_sleep.wasm") && err.contains("ran past its 1.0 s deadline"),
        "names the file and the deadline: {err}"
    );

    std::fs::write(dir.path().join("notes.md"), "kept\n").unwrap();
    let out = run_capstan(
        dir.path(),
        &[
            "tool",
            "call",
            "file_read",
            r#"{"path": "notes.md"}"#,
            "--grant",
            "fs.read",
            "--deadline",
            "1",
            "--plugins-dir",
            plugins_arg,
        ],
        "`capstan tool call` with a plugin whose describe() sleeps",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "kept\n");
}

#[test]
fn plugins_inspect_refuses_a_fifo_a_directory_and_a_device_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.wasm");
    mkfifo(&fifo);
    let subdir = dir.path().join("dir.wasm");
    std::fs::create_dir(&subdir).unwrap();
    for (path, kind) in [
        (fifo.as_path(), "a FIFO"),
        (subdir.as_path(), "a directory"),
        (Path::new("/dev/zero"), "a character device"),
    ] {
        let out = run_capstan(
            dir.path(),
            &["plugins", "inspect", path.to_str().unwrap()],
            &format!("`capstan plugins inspect {}`", path.display()),
        );
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&path.display().to_string())
                && err.contains(kind)
                && err.contains("not a regular file"),
            "{err}"
        );
    }
}

#[test]
fn a_fifo_in_the_plugins_directory_is_refused_by_name_and_the_rest_load() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&[]);
    mkfifo(&plugins.path().join("pipe.wasm"));
    let out = run_capstan(
        dir.path(),
        &[
            "plugins",
            "list",
            "--plugins-dir",
            plugins.path().to_str().unwrap(),
        ],
        "`capstan plugins list` with a FIFO in the plugins directory",
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(stdout(&out).contains("file_read"), "{}", stdout(&out));
    assert!(err.contains("pipe.wasm") && err.contains("a FIFO"), "{err}");
}

/// A plugin file over the size cap is refused before it is read whole (a sparse file
/// costs no disk here, but would cost its size in memory).
#[test]
fn plugins_inspect_refuses_a_file_over_the_size_cap() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.wasm");
    let file = std::fs::File::create(&huge).unwrap();
    file.set_len(1 << 30).unwrap();
    let out = run_capstan(
        dir.path(),
        &["plugins", "inspect", huge.to_str().unwrap()],
        "inspect",
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("huge.wasm") && err.contains("64 MiB"), "{err}");
}
