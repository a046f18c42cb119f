//! Reading the mailbox: an IMAP session, logged in once and kept between fetches; each
//! fetch reads the folder's end again, waits (IMAP IDLE where the server has it) when
//! nothing is new, and brings what came after the mark, bounded.

use std::collections::HashMap;
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::TryStreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;

use super::{
    Fetched, MAIL_TIMEOUT, MAX_FETCH_BYTES, MAX_MESSAGE_BYTES, MailAccount, MailError, MailServer,
    Mark, Security, StoredMessage,
};

/// What a connection is read through: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + Debug {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + Debug> Io for T {}

/// The most bytes one fetch reads from the server, whatever the server says of its
/// messages' sizes: the fetch fails past it rather than the host's memory growing.
const MAX_FETCH_READ: i64 = 2 * MAX_FETCH_BYTES as i64 + (1 << 20);

/// A connection that counts what it reads against a budget, set anew for each fetch.
#[derive(Debug)]
struct Metered {
    inner: Box<dyn Io>,
    left: Arc<AtomicI64>,
}

impl AsyncRead for Metered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.left.load(Ordering::Relaxed) < 0 {
            return Poll::Ready(Err(std::io::Error::other(format!(
                "the server sent more than the {MAX_FETCH_READ} bytes a fetch reads"
            ))));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        let got = (buf.filled().len() - before) as i64;
        self.left.fetch_sub(got, Ordering::Relaxed);
        read
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Bytes a message's header is counted as against [`MAX_FETCH_BYTES`] before it is read.
const HEADER_ESTIMATE: u64 = 64 << 10;

/// A logged-in IMAP session on the channel's folder.
pub(super) struct Session {
    inner: async_imap::Session<Metered>,
    /// What the connection may still read in this fetch.
    left: Arc<AtomicI64>,
    server: MailServer,
    folder: String,
    idle: bool,
}

impl Session {
    /// Connects to `account`'s IMAP server and logs in with `password`.
    pub(super) async fn open(account: &MailAccount, password: &str) -> Result<Self, MailError> {
        let server = account.imap.clone();
        let left = Arc::new(AtomicI64::new(MAX_FETCH_READ));
        let io = Metered {
            inner: connect(&server).await?,
            left: left.clone(),
        };
        let mut client = async_imap::Client::new(io);
        let greeting = within(&server, "the greeting", async {
            client.read_response().await.map_err(|e| e.to_string())
        })
        .await?;
        if greeting.is_none() {
            return Err(MailError::Failed(format!(
                "{server} closed the connection before greeting"
            )));
        }
        let login = tokio::time::timeout(MAIL_TIMEOUT, client.login(&account.user, password))
            .await
            .map_err(|_| MailError::Failed(format!("{server} did not answer the login")))?;
        let mut inner = login.map_err(|(err, _)| {
            MailError::Denied(format!(
                "{server} refused the login of `{}`: {err}; check [channels] email.user and \
                 its password secret",
                account.user
            ))
        })?;
        let idle = within(&server, "CAPABILITY", async {
            inner.capabilities().await.map_err(|e| e.to_string())
        })
        .await?
        .has_str("IDLE");
        Ok(Session {
            inner,
            left,
            server,
            folder: account.folder.clone(),
            idle,
        })
    }

    /// Messages after `since`, at most `max`, waiting up to `wait` for one; the session
    /// back for the next fetch.
    pub(super) async fn fetch(
        mut self,
        channel: &str,
        since: Option<Mark>,
        max: u32,
        wait: Duration,
    ) -> Result<(Self, Fetched), MailError> {
        self.left.store(MAX_FETCH_READ, Ordering::Relaxed);
        let (validity, mut end) = self.position().await?;
        // Nothing to read: only where the next fetch starts.
        let nothing = |validity, uid| Fetched {
            messages: Vec::new(),
            mark: Mark { validity, uid },
        };
        let after = match since {
            None => return Ok((self, nothing(validity, end))),
            Some(mark) if mark.validity != validity => {
                tracing::warn!(
                    channel,
                    "the mailbox {} on {} was made anew (UIDVALIDITY {} is now {validity}): \
                     reading from its end; what arrived in between is not read",
                    self.folder,
                    self.server,
                    mark.validity
                );
                return Ok((self, nothing(validity, end)));
            }
            Some(mark) => mark.uid,
        };
        if end <= after && !wait.is_zero() {
            self = self.wait(wait).await?;
            let (now, now_end) = self.position().await?;
            if now != validity {
                return Ok((self, nothing(now, now_end)));
            }
            end = now_end;
        }
        if end <= after {
            return Ok((self, nothing(validity, after)));
        }
        let (chosen, whole) = self.choose(after, max).await?;
        let messages = self.read(&chosen).await?;
        // All there was to read is read: the mark goes to the end, past the UIDs of
        // messages deleted before they were read (or the next fetch would look again).
        let last = match chosen.last() {
            Some((uid, _)) if !whole => *uid,
            Some((uid, _)) => end.max(*uid),
            None => end.max(after),
        };
        Ok((
            self,
            Fetched {
                messages,
                mark: Mark {
                    validity,
                    uid: last,
                },
            },
        ))
    }

    /// The folder's UIDVALIDITY and the UID its last message has (or would have).
    async fn position(&mut self) -> Result<(u32, u32), MailError> {
        // Unsolicited answers pile up between fetches; the folder is read anew below.
        while self.inner.unsolicited_responses.try_recv().is_ok() {}
        let folder = self.folder.clone();
        let mailbox = within(&self.server, "SELECT", async {
            self.inner.select(&folder).await.map_err(|e| e.to_string())
        })
        .await?;
        let validity = mailbox.uid_validity.ok_or_else(|| {
            MailError::Failed(format!(
                "{} gave no UIDVALIDITY for {folder}: its messages cannot be told apart \
                 across sessions",
                self.server
            ))
        })?;
        let end = match mailbox.uid_next {
            Some(next) => next.saturating_sub(1),
            None => within(&self.server, "UID SEARCH", async {
                self.inner
                    .uid_search("ALL")
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?
            .into_iter()
            .max()
            .unwrap_or(0),
        };
        Ok((validity, end))
    }

    /// Waits up to `wait` for the folder to change: IMAP IDLE, or a plain wait on a
    /// server without it.
    async fn wait(self, wait: Duration) -> Result<Self, MailError> {
        if !self.idle {
            tokio::time::sleep(wait).await;
            return Ok(self);
        }
        let Session {
            inner,
            left,
            server,
            folder,
            idle,
        } = self;
        let mut handle = inner.idle();
        within(&server, "IDLE", async {
            handle.init().await.map_err(|e| e.to_string())
        })
        .await?;
        {
            let (done, _stop) = handle.wait_with_timeout(wait);
            // The server's keepalives restart async-imap's own timer: bounded here too.
            match tokio::time::timeout(wait, done).await {
                Err(_) | Ok(Ok(_)) => {}
                Ok(Err(err)) => return Err(MailError::Failed(format!("{server}: IDLE: {err}"))),
            }
        }
        let inner = within(&server, "DONE", async {
            handle.done().await.map_err(|e| e.to_string())
        })
        .await?;
        Ok(Session {
            inner,
            left,
            server,
            folder,
            idle,
        })
    }

    /// The UIDs after `after` to read now, with their sizes: at most `max`, and no more
    /// than [`MAX_FETCH_BYTES`] (one always, however large: it comes as its header); and
    /// whether they are all there was after `after`.
    async fn choose(&mut self, after: u32, max: u32) -> Result<(Vec<(u32, u64)>, bool), MailError> {
        let range = format!("UID {}:*", after.saturating_add(1));
        let mut uids: Vec<u32> = within(&self.server, "UID SEARCH", async {
            self.inner
                .uid_search(&range)
                .await
                .map_err(|e| e.to_string())
        })
        .await?
        .into_iter()
        // `N:*` names the last message even when its UID is below N.
        .filter(|uid| *uid > after)
        .collect();
        uids.sort_unstable();
        let more = uids.len() > max as usize;
        uids.truncate(max as usize);
        if uids.is_empty() {
            return Ok((Vec::new(), true));
        }
        let set = uids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let fetches = self.uid_fetch(&set, "(UID RFC822.SIZE)").await?;
        let sizes: HashMap<u32, u64> = fetches
            .iter()
            .filter_map(|f| Some((f.uid?, u64::from(f.size.unwrap_or(0)))))
            .collect();
        let mut chosen = Vec::new();
        let mut bytes = 0;
        for uid in uids.iter().copied() {
            // Gone since the search: left out.
            let Some(&size) = sizes.get(&uid) else {
                continue;
            };
            let cost = if size <= MAX_MESSAGE_BYTES {
                size
            } else {
                HEADER_ESTIMATE
            };
            if !chosen.is_empty() && bytes + cost > MAX_FETCH_BYTES {
                return Ok((chosen, false));
            }
            bytes += cost;
            chosen.push((uid, size));
        }
        Ok((chosen, !more))
    }

    /// Reads the messages `chosen` names: whole, or their header when too large. One that
    /// is gone (deleted in between) is left out.
    async fn read(&mut self, chosen: &[(u32, u64)]) -> Result<Vec<StoredMessage>, MailError> {
        let (whole, heads): (Vec<_>, Vec<_>) = chosen
            .iter()
            .partition(|(_, size)| *size <= MAX_MESSAGE_BYTES);
        // Partial fetches: a server that misstated a size still sends no more than these.
        let mut bodies = self
            .read_part(&whole, &format!("BODY.PEEK[]<0.{MAX_MESSAGE_BYTES}>"))
            .await?;
        let mut headers = self
            .read_part(&heads, &format!("BODY.PEEK[HEADER]<0.{HEADER_ESTIMATE}>"))
            .await?;
        Ok(chosen
            .iter()
            .filter_map(|&(uid, size)| {
                let complete = size <= MAX_MESSAGE_BYTES;
                let raw = if complete {
                    bodies.remove(&uid)
                } else {
                    headers.remove(&uid)
                }?;
                Some(StoredMessage {
                    uid,
                    size,
                    raw,
                    complete,
                })
            })
            .collect())
    }

    /// `item` of each message of `uids`, by UID.
    async fn read_part(
        &mut self,
        uids: &[&(u32, u64)],
        item: &str,
    ) -> Result<HashMap<u32, Vec<u8>>, MailError> {
        if uids.is_empty() {
            return Ok(HashMap::new());
        }
        let set = uids
            .iter()
            .map(|(uid, _)| uid.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let query = format!("(UID {item})");
        let header = item.contains("[HEADER]");
        let fetches = self.uid_fetch(&set, &query).await?;
        Ok(fetches
            .iter()
            .filter_map(|f| {
                let data = if header { f.header() } else { f.body() }?;
                let max = if header {
                    HEADER_ESTIMATE
                } else {
                    MAX_MESSAGE_BYTES
                };
                // The server said how large it is; it may have sent more.
                let data = &data[..data.len().min(max as usize)];
                Some((f.uid?, data.to_vec()))
            })
            .collect())
    }
}

impl Session {
    /// `UID FETCH set query`, every answer read.
    async fn uid_fetch(
        &mut self,
        set: &str,
        query: &str,
    ) -> Result<Vec<async_imap::types::Fetch>, MailError> {
        within(&self.server, "UID FETCH", async {
            self.inner
                .uid_fetch(set, query)
                .await
                .map_err(|e| e.to_string())?
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| e.to_string())
        })
        .await
    }
}

/// Runs `step` of the exchange with `server` within [`MAIL_TIMEOUT`].
async fn within<T>(
    server: &MailServer,
    step: &str,
    work: impl Future<Output = Result<T, String>>,
) -> Result<T, MailError> {
    match tokio::time::timeout(MAIL_TIMEOUT, work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(MailError::Failed(format!("{server}: {step}: {err}"))),
        Err(_) => Err(MailError::Failed(format!(
            "{server}: {step} took longer than {} s",
            MAIL_TIMEOUT.as_secs()
        ))),
    }
}

/// A connection to `server`, TLS unless it is plain (which it is only on loopback).
async fn connect(server: &MailServer) -> Result<Box<dyn Io>, MailError> {
    let tcp = within(server, "connecting", async {
        TcpStream::connect((server.host.as_str(), server.port))
            .await
            .map_err(|e| e.to_string())
    })
    .await?;
    let _ = tcp.set_nodelay(true);
    match server.security {
        Security::Plain => Ok(Box::new(tcp)),
        Security::Tls | Security::StartTls => {
            let name = ServerName::try_from(server.host.clone())
                .map_err(|e| MailError::Failed(format!("{server}: {e}")))?;
            let tls = within(server, "TLS", async {
                crate::net::connect::tls_connector()
                    .connect(name, tcp)
                    .await
                    .map_err(|e| e.to_string())
            })
            .await?;
            Ok(Box::new(tls))
        }
    }
}
