//! Reading the mailbox: an IMAP session, logged in once and kept between fetches; each
//! fetch reads the folder's end again, waits (IMAP IDLE where the server has it) when
//! nothing is new, and brings what came after the mark, bounded.

use std::collections::HashMap;
use std::fmt::Debug;
use std::time::Duration;

use futures_util::TryStreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;

use super::{
    Fetched, MAIL_TIMEOUT, MAX_FETCH_BYTES, MAX_MESSAGE_BYTES, MailAccount, MailError, MailServer,
    Mark, Security, StoredMessage,
};

/// What a connection is read through: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + Debug {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + Debug> Io for T {}

/// Bytes a message's header is counted as against [`MAX_FETCH_BYTES`] before it is read.
const HEADER_ESTIMATE: u64 = 64 << 10;

/// A logged-in IMAP session on the channel's folder.
pub(super) struct Session {
    inner: async_imap::Session<Box<dyn Io>>,
    server: MailServer,
    folder: String,
    idle: bool,
}

impl Session {
    /// Connects to `account`'s IMAP server and logs in with `password`.
    pub(super) async fn open(account: &MailAccount, password: &str) -> Result<Self, MailError> {
        let server = account.imap.clone();
        let io = connect(&server).await?;
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
        let (validity, mut end) = self.position().await?;
        let from_end = |uid| Fetched {
            messages: Vec::new(),
            mark: Mark { validity, uid },
        };
        let after = match since {
            None => return Ok((self, from_end(end))),
            Some(mark) if mark.validity != validity => {
                tracing::warn!(
                    channel,
                    "the mailbox {} on {} was made anew (UIDVALIDITY {} is now {validity}): \
                     reading from its end; what arrived in between is not read",
                    self.folder,
                    self.server,
                    mark.validity
                );
                return Ok((self, from_end(end)));
            }
            Some(mark) => mark.uid,
        };
        if end <= after && !wait.is_zero() {
            self = self.wait(wait).await?;
            let (now, now_end) = self.position().await?;
            if now != validity {
                return Ok((self, from_end(now_end)));
            }
            end = now_end;
        }
        if end <= after {
            return Ok((self, from_end(after)));
        }
        let chosen = self.choose(after, max).await?;
        let messages = self.read(&chosen).await?;
        let last = chosen.last().map_or(after, |(uid, _)| *uid);
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
            within(&server, "IDLE", async {
                done.await.map_err(|e| e.to_string())
            })
            .await?;
        }
        let inner = within(&server, "DONE", async {
            handle.done().await.map_err(|e| e.to_string())
        })
        .await?;
        Ok(Session {
            inner,
            server,
            folder,
            idle,
        })
    }

    /// The UIDs after `after` to read now, with their sizes: at most `max`, and no more
    /// than [`MAX_FETCH_BYTES`] (one always, however large: it comes as its header).
    async fn choose(&mut self, after: u32, max: u32) -> Result<Vec<(u32, u64)>, MailError> {
        let range = format!("{}:*", after.saturating_add(1));
        let fetches = within(&self.server, "UID FETCH", async {
            self.inner
                .uid_fetch(&range, "(UID RFC822.SIZE)")
                .await
                .map_err(|e| e.to_string())?
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| e.to_string())
        })
        .await?;
        // `N:*` names the last message even when its UID is below N.
        let mut sizes: Vec<(u32, u64)> = fetches
            .iter()
            .filter_map(|f| Some((f.uid?, u64::from(f.size.unwrap_or(0)))))
            .filter(|(uid, _)| *uid > after)
            .collect();
        sizes.sort_unstable();
        sizes.dedup_by_key(|(uid, _)| *uid);
        let mut chosen = Vec::new();
        let mut bytes = 0;
        for (uid, size) in sizes.into_iter().take(max as usize) {
            let cost = if size <= MAX_MESSAGE_BYTES {
                size
            } else {
                HEADER_ESTIMATE
            };
            if !chosen.is_empty() && bytes + cost > MAX_FETCH_BYTES {
                break;
            }
            bytes += cost;
            chosen.push((uid, size));
        }
        Ok(chosen)
    }

    /// Reads the messages `chosen` names: whole, or their header when too large. One that
    /// is gone (deleted in between) is left out.
    async fn read(&mut self, chosen: &[(u32, u64)]) -> Result<Vec<StoredMessage>, MailError> {
        let (whole, heads): (Vec<_>, Vec<_>) = chosen
            .iter()
            .partition(|(_, size)| *size <= MAX_MESSAGE_BYTES);
        let mut bodies = self.read_part(&whole, "BODY.PEEK[]").await?;
        let mut headers = self.read_part(&heads, "BODY.PEEK[HEADER]").await?;
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
        let header = item.ends_with("[HEADER]");
        let fetches = within(&self.server, "UID FETCH", async {
            self.inner
                .uid_fetch(&set, &query)
                .await
                .map_err(|e| e.to_string())?
                .try_collect::<Vec<_>>()
                .await
                .map_err(|e| e.to_string())
        })
        .await?;
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
