//! The built `capstan` binary as a user runs it: commands with the tests' cache, state and
//! plugins, agent directories, and reading what a run left behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::{plugins_dir, repo_root};

/// A plugins directory with the first-party plugins and copies of `extra` components
/// (file name, source).
pub fn plugins_with(extra: &[(&str, PathBuf)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(plugins_dir()).expect("the plugins directory") {
        let path = entry.expect("an entry").path();
        std::fs::copy(
            &path,
            dir.path().join(path.file_name().expect("a file name")),
        )
        .expect("copying a plugin");
    }
    for (name, source) in extra {
        std::fs::copy(source, dir.path().join(name)).expect("copying a component");
    }
    dir
}

/// The artifact cache the tests share, so each component compiles once per run.
pub fn test_cache_dir() -> PathBuf {
    repo_root().join("target/test-component-cache")
}

/// Where the tests' runs record the workspaces they let plugins write.
pub fn test_state_dir() -> PathBuf {
    repo_root().join("target/test-state")
}

/// `capstan ARGS` in `dir`, with the tests' artifact cache and state dir, the first-party
/// plugins and no backtraces.
pub fn capstan_command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
    command
        .args(args)
        .current_dir(dir)
        .env("CAPSTAN_CACHE_DIR", test_cache_dir())
        .env("CAPSTAN_PLUGINS_DIR", plugins_dir())
        .env("CAPSTAN_STATE_DIR", test_state_dir())
        .env_remove("RUST_BACKTRACE")
        .env_remove("CAPSTAN_LOG")
        .stdin(Stdio::null());
    command
}

/// Runs `capstan ARGS` in `dir` to its end.
pub fn capstan(dir: &Path, args: &[&str]) -> Output {
    capstan_command(dir, args)
        .output()
        .expect("running capstan")
}

/// Its standard output, lossily decoded.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Its standard error, lossily decoded.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A directory holding a `capstan.toml` (the scripted provider playing `script.toml`,
/// plus `toml`) and `script.toml`; the workspace and data dir go beside them.
pub fn agent_dir(script: &str, toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("capstan.toml"),
        format!("[provider]\nkind = \"scripted\"\nscript = \"script.toml\"\n{toml}"),
    )
    .expect("writing capstan.toml");
    std::fs::write(dir.path().join("script.toml"), script).expect("writing script.toml");
    dir
}

/// The store of an agent directory made by [`agent_dir`].
pub fn agent_store(dir: &Path) -> capstan_host::store::Store {
    capstan_host::store::Store::open(&dir.join(".capstan")).expect("opening the agent's store")
}

/// The messages stored for `session` (e.g. `channel:main`), as text.
pub fn stored_history(dir: &Path, session: &str) -> Vec<String> {
    agent_store(dir)
        .load_history(session)
        .expect("reading the history")
        .into_iter()
        .map(|entry| {
            let message: capstan_host::llm::Message =
                serde_json::from_str(&entry.message).expect("a stored message");
            message.content
        })
        .collect()
}

/// Reads `child`'s stderr line by line until a line contains `wanted`; returns the lines
/// read so far and the rest of the stream. Fails if the stream ends first.
pub fn wait_for_line(
    stderr: std::process::ChildStderr,
    wanted: &str,
) -> (
    Vec<String>,
    std::io::Lines<std::io::BufReader<std::process::ChildStderr>>,
) {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("reading stderr");
        let found = line.contains(wanted);
        seen.push(line);
        if found {
            return (seen, lines);
        }
    }
    panic!(
        "stderr ended before a line with `{wanted}`:\n{}",
        seen.join("\n")
    );
}

/// Sends `signal` (e.g. `-TERM`, `-KILL`) to process `pid` with kill(1).
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {signal} {pid}");
}
