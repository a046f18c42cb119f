//! Honest exits and stops: a failed model request makes `capstan run` exit non-zero;
//! SIGTERM stops a run gracefully (the running worker recorded as interrupted, the history
//! stored); a run killed with SIGKILL leaves a worker marked interrupted at the next start.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Stdio;

use capstan_host::store::WorkerState;

use crate::support::{
    agent_dir, agent_store, capstan_command, send_signal, stderr, stdout, stored_history,
    wait_for_line,
};

/// A channel that starts a worker whose model takes ten minutes, and answers `hello`.
const LONG_JOB: &str = r#"
[[step]]
process = "channel"
when = "start the long job"
tool_calls = [{ name = "spawn_worker", arguments = { task = "the long job" } }]

[[step]]
process = "channel"
when = "hello"
tool_calls = [{ name = "reply", arguments = { text = "hi there" } }]

[[step]]
process = "worker"
when = "the long job"
delay_ms = 600000
reply = "finally done"

[[step]]
process = "channel"
repeat = true
tool_calls = [{ name = "skip" }]
"#;

/// No timeout of the host's may end the long job before the signal does.
const PATIENT: &str = "[limits]\ndispatch_timeout_secs = 3600\ndispatch_total_secs = 3600\nworker_timeout_secs = 86400\n";

/// Starts `capstan run "start the long job"` in `dir` and returns it once its worker runs.
fn start_long_job(dir: &std::path::Path) -> std::process::Child {
    let mut child = capstan_command(dir, &["run", "start the long job"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting capstan run");
    let stderr = child.stderr.take().expect("piped");
    let (_, rest) = wait_for_line(stderr, "[worker:1] started: the long job");
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || rest.for_each(drop));
    child
}

fn worker_state(dir: &std::path::Path, id: &str) -> WorkerState {
    agent_store(dir)
        .get_worker(&crate::support::ids::pid(id))
        .expect("reading the worker")
        .unwrap_or_else(|| panic!("{id} is recorded"))
        .state
}

#[test]
fn sigterm_interrupts_the_running_worker_stores_the_history_and_the_next_run_starts_clean() {
    let dir = agent_dir(LONG_JOB, PATIENT);
    let mut child = start_long_job(dir.path());
    send_signal(child.id(), "-TERM");
    let status = child.wait().expect("waiting for capstan");
    assert_eq!(status.code(), Some(143), "SIGTERM's exit code");
    assert_eq!(
        worker_state(dir.path(), "worker:1"),
        WorkerState::Interrupted
    );
    let history = stored_history(dir.path(), "channel:main");
    assert!(
        history.iter().any(|m| m == "start the long job"),
        "the turn was stored: {history:?}"
    );

    let out = capstan_command(dir.path(), &["run", "hello"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("hi there"), "{}", stdout(&out));
    assert_eq!(
        worker_state(dir.path(), "worker:1"),
        WorkerState::Interrupted,
        "the record of the stopped run is kept"
    );
}

#[test]
fn a_worker_left_running_by_a_killed_host_is_marked_interrupted_at_the_next_start() {
    let dir = agent_dir(LONG_JOB, PATIENT);
    let mut child = start_long_job(dir.path());
    send_signal(child.id(), "-KILL");
    let _ = child.wait();
    assert_eq!(
        worker_state(dir.path(), "worker:1"),
        WorkerState::Running,
        "a killed host records nothing"
    );

    let out = capstan_command(dir.path(), &["run", "hello"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("[worker:1] interrupted"),
        "reported at start: {}",
        stderr(&out)
    );
    assert_eq!(
        worker_state(dir.path(), "worker:1"),
        WorkerState::Interrupted
    );
}

#[test]
fn run_exits_non_zero_when_the_model_request_fails() {
    // The script has no step for the channel: its request fails.
    let script = "[[step]]\nprocess = \"worker\"\nreply = \"unused\"\n";
    let dir = agent_dir(script, "");
    let out = capstan_command(dir.path(), &["run", "anyone there?"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("error: [channel:main] the model failed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_exits_non_zero_when_an_openai_endpoint_refuses_the_request() {
    // A real endpoint on loopback that answers every request with 400.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            let body = r#"{"error":{"message":"bad model"}}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        format!(
            "[provider]\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\
             api_key_env = \"CAPSTAN_TEST_KEY\"\nmodel = \"m\"\n"
        ),
    )
    .unwrap();
    let out = capstan_command(dir.path(), &["run", "anyone there?"])
        .env("CAPSTAN_TEST_KEY", "k")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("400"), "{}", stderr(&out));
}
