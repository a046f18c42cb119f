//! A `capstan serve` process on a free loopback port, started from an agent directory,
//! with its standard error kept for the test to read.

use std::io::{BufRead, Read};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use super::capstan_command;

/// A running `capstan serve`; killed when dropped.
pub struct ServeHost {
    child: std::process::Child,
    /// Its address, e.g. `http://127.0.0.1:41234` (no trailing slash).
    pub url: String,
    log: Arc<Mutex<String>>,
    dir: tempfile::TempDir,
}

impl ServeHost {
    /// Starts `capstan serve` in `dir` (which holds its `capstan.toml`) with `env` set, and
    /// waits for the banner that says where it listens.
    pub fn start(dir: tempfile::TempDir, env: &[(&str, &str)]) -> ServeHost {
        let mut command = capstan_command(dir.path(), &["serve", "--addr", "127.0.0.1:0"]);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().unwrap();
        std::thread::spawn({
            let log = log.clone();
            move || {
                let mut chunk = [0u8; 4096];
                while let Ok(n @ 1..) = stderr.read(&mut chunk) {
                    log.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&chunk[..n]));
                }
            }
        });
        let mut banner = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut banner)
            .unwrap();
        let url = banner
            .trim()
            .strip_prefix("capstan serve: listening on ")
            .unwrap_or_else(|| panic!("{banner}\n{}", log.lock().unwrap()))
            .trim_end_matches('/')
            .to_owned();
        ServeHost {
            child,
            url,
            log,
            dir,
        }
    }

    /// Posts `text` to conversation `main`, without waiting for the reply.
    pub async fn post(&self, client: &reqwest::Client, text: &str) {
        let response = client
            .post(format!("{}/v1/channels/main/messages", self.url))
            .json(&serde_json::json!({ "text": text }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 202, "{text}");
    }

    /// Its agent directory.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it has written to standard error so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits for it to exit (after a signal the test sent, or of itself): its exit
    /// status.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        tokio::task::block_in_place(|| self.child.wait().unwrap())
    }

    /// Kills it (SIGKILL, as `kill -9`) if it still runs, and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        self.wait();
    }

    /// Kills it if it still runs, then starts `capstan serve` again in the same directory
    /// with `env` set.
    pub fn restart(mut self, env: &[(&str, &str)]) -> ServeHost {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        ServeHost::start(dir, env)
    }
}

impl Drop for ServeHost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Posts `text` with idempotency key `key` to conversation `main` at `url` and waits for
/// the answer: its status and body.
pub async fn post_waiting(
    client: reqwest::Client,
    url: String,
    key: &'static str,
    text: &'static str,
) -> (u16, serde_json::Value) {
    let response = client
        .post(format!("{url}/v1/channels/main/messages"))
        .header("Idempotency-Key", key)
        .json(&serde_json::json!({ "text": text, "wait": true }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// `host`'s event stream, from now on.
pub async fn events(client: &reqwest::Client, host: &ServeHost) -> reqwest::Response {
    client
        .get(format!("{}/v1/events", host.url))
        .send()
        .await
        .unwrap()
}

/// Reads `stream` until an event of type `kind` comes (failing, not hanging, if the stream
/// ends first or nothing comes for two minutes).
pub async fn until_event(stream: &mut reqwest::Response, kind: &str) {
    let mut seen = String::new();
    let wanted = [format!("event: {kind}\n"), format!("event:{kind}\n")];
    while !wanted.iter().any(|w| seen.contains(w)) {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(120), stream.chunk())
            .await
            .unwrap_or_else(|_| panic!("no {kind} event: {seen}"))
            .unwrap()
            .unwrap_or_else(|| panic!("the stream ended before {kind}: {seen}"));
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}
