//! Starting an MCP server that speaks on its standard input and output: only the
//! environment its config lists (and the secrets it names), in a process group of its own
//! so that a restart stops everything it started, its standard error kept to explain a
//! failed start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::transport::TokioChildProcess;
use tokio::io::AsyncReadExt as _;

/// The most of a server's standard error kept for a message: its last lines.
const STDERR_TAIL_BYTES: usize = 2048;

/// What a stdio server is started with.
pub(super) struct Launch<'a> {
    /// The server's name, for messages.
    pub name: &'a str,
    /// The program: a path, or a name looked up in the host's `PATH`.
    pub command: &'a str,
    pub args: &'a [String],
    /// The config's `env`.
    pub env: &'a BTreeMap<String, String>,
    /// Secrets passed as variables of their own name.
    pub secrets: &'a [(String, String)],
    /// Where it runs.
    pub cwd: &'a Path,
}

/// The last [`STDERR_TAIL_BYTES`] a server wrote to its standard error.
#[derive(Clone, Default)]
pub(super) struct StderrTail(Arc<Mutex<String>>);

impl StderrTail {
    /// What it wrote last, on one line, or `None` if nothing.
    pub(super) fn text(&self) -> Option<String> {
        let tail = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let text = tail.trim();
        (!text.is_empty()).then(|| crate::text::one_line(text).into_owned())
    }

    fn push(&self, text: &str) {
        let mut tail = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tail.push_str(text);
        if tail.len() > STDERR_TAIL_BYTES {
            let mut cut = tail.len() - STDERR_TAIL_BYTES;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail.drain(..cut);
        }
    }
}

/// Starts the program: a process group of its own (dropping the transport kills the whole
/// group, so a wrapper's children go with it), its environment only what `launch` lists.
pub(super) fn spawn(launch: &Launch<'_>) -> Result<(TokioChildProcess, StderrTail), String> {
    let name = launch.name;
    let program = find_program(launch.command, launch.cwd).ok_or_else(|| {
        format!(
            "MCP server [mcp.{name}]: no program `{}` (as a path, or in PATH); fix \
             mcp.{name}.command",
            launch.command
        )
    })?;
    let mut command = tokio::process::Command::new(&program);
    command
        .args(launch.args)
        .env_clear()
        .envs(launch.env)
        .envs(launch.secrets.iter().map(|(k, v)| (k, v)))
        .current_dir(launch.cwd);
    let mut wrapped = CommandWrap::from(command);
    wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    let (transport, stderr) = TokioChildProcess::builder(wrapped)
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| {
            format!(
                "MCP server [mcp.{name}]: cannot start {}: {err}; check mcp.{name}.command",
                program.display()
            )
        })?;
    let tail = StderrTail::default();
    if let Some(stderr) = stderr {
        // The secrets it was given, should it print one, across reads too.
        let redactor = crate::secrets::Redactor::new(
            launch
                .secrets
                .iter()
                .filter_map(|(name, value)| Some((name.parse().ok()?, Arc::from(value.as_str())))),
        );
        tokio::spawn(forward_stderr(
            name.to_owned(),
            stderr,
            tail.clone(),
            redactor,
        ));
    }
    Ok((transport, tail))
}

/// `command` as a path (relative to `cwd`), or found in the host's `PATH` (the server's
/// own environment has no `PATH` unless the config lists one).
fn find_program(command: &str, cwd: &Path) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(cwd.join(command));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|candidate| candidate.is_file())
}

/// Logs what the server writes on standard error, a bounded chunk at a time, and keeps
/// its tail: both redacted as one stream of the secrets it was given, so a value split
/// across two reads is hidden whole.
async fn forward_stderr(
    server: String,
    mut stderr: tokio::process::ChildStderr,
    tail: StderrTail,
    redactor: crate::secrets::Redactor,
) {
    let mut buf = vec![0u8; 4096];
    let mut stream = redactor.stream();
    let say = |bytes: Vec<u8>| {
        if bytes.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&bytes);
        tail.push(&text);
        tracing::info!(target: "capstan::mcp", server = %server, "{}", text.trim_end());
    };
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        say(stream.push(&buf[..n]));
    }
    say(stream.finish());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server prints a secret it was given in two writes (which may come in two reads):
    /// its log and its tail hide it whole.
    #[tokio::test]
    async fn a_secret_the_server_prints_in_pieces_is_hidden_in_its_tail() {
        let mut child = tokio::process::Command::new("sh")
            .args([
                "-c",
                "printf 'key=sk-split-01' >&2; sleep 0.01; printf '23456789 end\\n' >&2",
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let tail = StderrTail::default();
        let redactor = crate::secrets::Redactor::new([(
            "NOTES_KEY".parse().unwrap(),
            Arc::from("sk-split-0123456789"),
        )]);
        forward_stderr("notes".into(), stderr, tail.clone(), redactor).await;
        assert_eq!(
            tail.text().as_deref(),
            Some("key=[redacted secret NOTES_KEY] end")
        );
        let _ = child.wait().await;
    }

    #[test]
    fn the_tail_keeps_the_last_bytes_on_char_boundaries() {
        let tail = StderrTail::default();
        assert_eq!(tail.text(), None);
        tail.push(&"é".repeat(STDERR_TAIL_BYTES));
        tail.push("\nFATAL: NOTES_TOKEN is not set\n");
        let text = tail.text().unwrap();
        assert!(text.ends_with("FATAL: NOTES_TOKEN is not set"), "{text}");
        assert!(text.len() <= STDERR_TAIL_BYTES + 8, "{}", text.len());
    }
}
