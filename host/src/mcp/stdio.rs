//! Starting an MCP server that speaks on its standard input and output: only the
//! environment its config lists (and the secrets it names), in a process group of its own
//! so that a restart stops everything it started, its standard error kept to explain a
//! failed start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use process_wrap::tokio::{ChildWrapper, CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncRead, AsyncReadExt as _, ReadBuf};
use tokio::process::{ChildStdin, ChildStdout};

use super::ended::EndedBy;

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
    /// The longest line (one message) read from it, and the key that sets it.
    pub max_message: usize,
    pub limit_key: String,
    /// Where a line over `max_message` is reported.
    pub ended: EndedBy,
}

/// A stdio server's transport: its messages, one per line of its standard output, none
/// longer than [`Launch::max_message`]; the program and its whole process group killed
/// when the transport is dropped.
pub(super) struct StdioTransport {
    child: Option<Box<dyn ChildWrapper>>,
    messages: AsyncRwTransport<RoleClient, CappedLines<ChildStdout>, ChildStdin>,
}

impl Transport<RoleClient> for StdioTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.messages.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.messages.receive()
    }

    /// MCP's stdio shutdown: its standard input closed, then a wait for it to exit, then
    /// SIGTERM to its process group and another wait, then SIGKILL. Dropped unclosed (a
    /// restart), it is killed at once.
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.messages.close().await?;
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        let exited = tokio::time::timeout(CLOSE_WAIT, child.wait()).await;
        if !matches!(exited, Ok(Ok(_))) && child.signal(libc::SIGTERM).is_ok() {
            let _ = tokio::time::timeout(CLOSE_WAIT, child.wait()).await;
        }
        self.kill();
        Ok(())
    }
}

/// How long a closed server is given to exit, after its input ends and again after SIGTERM.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl StdioTransport {
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The group, not just the program: a wrapper's children go with it. Sent
            // without waiting; the runtime reaps the exited child.
            let _ = child.start_kill();
        }
    }
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A reader that fails, and records why in an [`EndedBy`], once a line runs past `cap`
/// bytes: the answer is refused as it arrives, never buffered whole, and the call waiting
/// on it hears why at once rather than at its deadline. (rmcp's own cap drops such a line
/// silently, leaving its call to wait.)
pub(super) struct CappedLines<R> {
    inner: R,
    cap: usize,
    limit_key: String,
    /// Bytes since the last newline.
    run: usize,
    ended: EndedBy,
    /// Why the next read fails: set by the read that passed on the bytes before the cap.
    failed: Option<String>,
}

impl<R: AsyncRead + Unpin> AsyncRead for CappedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let refuse = |why: &String| {
            Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                why.clone(),
            )))
        };
        if let Some(why) = &this.failed {
            return refuse(why);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let over = buf.filled()[before..].iter().position(|&byte| {
            this.run = if byte == b'\n' { 0 } else { this.run + 1 };
            this.run > this.cap
        });
        if let Some(at) = over {
            let why = format!(
                "its answer is over the {} KiB limit of one message ({}); raise it, or ask \
                 the server for less",
                this.cap >> 10,
                this.limit_key
            );
            this.ended.set(why.clone());
            // The bytes before the cap are passed on (whole messages among them); the
            // read after them fails. A read that fails returns no bytes.
            buf.set_filled(before + at);
            if at == 0 {
                return refuse(&why);
            }
            this.failed = Some(why);
        }
        Poll::Ready(Ok(()))
    }
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
pub(super) fn spawn(launch: &Launch<'_>) -> Result<(StdioTransport, StderrTail), String> {
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
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut wrapped = CommandWrap::from(command);
    wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    let mut child = wrapped.spawn().map_err(|err| {
        format!(
            "MCP server [mcp.{name}]: cannot start {}: {err}; check mcp.{name}.command",
            program.display()
        )
    })?;
    let (Some(stdin), Some(stdout)) = (child.stdin().take(), child.stdout().take()) else {
        unreachable!("both were piped above");
    };
    let stderr = child.stderr().take();
    let stdout = CappedLines {
        inner: stdout,
        cap: launch.max_message,
        limit_key: launch.limit_key.clone(),
        run: 0,
        ended: launch.ended.clone(),
        failed: None,
    };
    let transport = StdioTransport {
        child: Some(child),
        // Our reader caps the line; rmcp's cap (which drops a line silently) never applies.
        messages: AsyncRwTransport::new(stdout, stdin).with_max_line_length(usize::MAX),
    };
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

    #[tokio::test]
    async fn a_line_over_the_cap_fails_the_read_and_says_why_lines_within_it_pass() {
        let ended = EndedBy::default();
        let mut lines = CappedLines {
            inner: &b"0123456789\nabcdefghijklmnop\n"[..],
            cap: 10,
            limit_key: "[net] max_response_body_kib".into(),
            run: 0,
            ended: ended.clone(),
            failed: None,
        };
        let mut read = Vec::new();
        let err = lines.read_to_end(&mut read).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(read.starts_with(b"0123456789\n"), "{read:?}");
        let why = ended.reason().unwrap();
        assert!(
            why.contains("over the 0 KiB limit of one message ([net] max_response_body_kib)"),
            "{why}"
        );
        assert_eq!(err.to_string(), why);
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
