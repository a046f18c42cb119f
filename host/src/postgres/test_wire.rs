//! A counting proxy in front of a [`TestCluster`](super::test_cluster::TestCluster): it
//! passes every byte on and counts the exchanges its clients make, so a test can say how
//! many an operation costs.
//!
//! A client of the extended protocol sends a statement's messages (Parse, Bind, Execute,
//! ...) and ends them with Sync; a simple query is one Query message. The server answers
//! each Sync or Query with ReadyForQuery: that is one exchange. An exchange sent alone
//! costs a round trip; exchanges a client pipelines (sends before the first is answered)
//! share one.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// The proxy: listening on loopback until dropped.
pub struct WireCount {
    url: String,
    exchanges: Arc<AtomicUsize>,
    accepting: tokio::task::JoinHandle<()>,
}

impl WireCount {
    /// A proxy to the server at `socket`, for database `database` (its URL's last part).
    pub async fn start(socket: PathBuf, url: &str) -> WireCount {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let database = url.rsplit('/').next().unwrap();
        let exchanges = Arc::new(AtomicUsize::new(0));
        let counted = exchanges.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = UnixStream::connect(&socket).await.unwrap();
                tokio::spawn(relay(client, server, counted.clone()));
            }
        });
        WireCount {
            url: format!("postgres://capstan@127.0.0.1:{port}/{database}"),
            exchanges,
            accepting,
        }
    }

    /// The database's URL through the proxy.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The exchanges its clients have made so far.
    pub fn exchanges(&self) -> usize {
        self.exchanges.load(Ordering::SeqCst)
    }
}

impl Drop for WireCount {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Passes bytes both ways between `client` and `server`, counting the client's
/// exchanges, until either side closes.
async fn relay(client: TcpStream, server: UnixStream, exchanges: Arc<AtomicUsize>) {
    let (mut client_in, mut client_out) = client.into_split();
    let (mut server_in, mut server_out) = server.into_split();
    let answers = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_in, &mut client_out).await;
    });
    let mut reader = Messages::default();
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = match client_in.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Counted before the bytes go on, so the count is up to date once an answer is in.
        let ends = reader.feed(&buf[..n]);
        exchanges.fetch_add(ends, Ordering::SeqCst);
        if server_out.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    answers.abort();
}

/// The client's side of the protocol, read as it arrives in pieces.
#[derive(Default)]
struct Messages {
    /// Bytes not yet read as a whole message.
    pending: Vec<u8>,
    /// Whether the startup message (which has no type byte) was read.
    started: bool,
}

/// The code of a request for TLS, sent before the startup message.
const SSL_REQUEST: u32 = 80877103;

impl Messages {
    /// Takes `bytes`; returns how many Sync or Query messages they completed.
    fn feed(&mut self, bytes: &[u8]) -> usize {
        self.pending.extend_from_slice(bytes);
        let mut ends = 0;
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            if !self.started {
                let Some(len) = rest.get(..4).map(|b| be(b) as usize) else {
                    break;
                };
                if rest.len() < len {
                    break;
                }
                // A TLS request is answered with one byte and followed by the startup.
                let code = rest.get(4..8).map(be);
                self.started = code != Some(SSL_REQUEST);
                at += len;
                continue;
            }
            let Some(len) = rest.get(1..5).map(|b| be(b) as usize) else {
                break;
            };
            if rest.len() < 1 + len {
                break;
            }
            if matches!(rest[0], b'S' | b'Q') {
                ends += 1;
            }
            at += 1 + len;
        }
        self.pending.drain(..at);
        ends
    }
}

fn be(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes.try_into().unwrap())
}
