//! Email's egress: a channel's mailbox read over IMAP and its letters sent over SMTP, by
//! the host, for the adapter that parses and writes them (`capstan:channel/mail`).
//!
//! The operator names the servers, the user, the password's secret and the address in
//! `[channels.NAME.email]`; the adapter names none of them. So the password never enters
//! a sandbox, a letter always goes from the channel's address, and only to someone the
//! channel lets talk to it. What the servers send back is bounded: a message larger than
//! [`MAX_MESSAGE_BYTES`] comes as its header alone, one fetch brings at most
//! [`MAX_FETCH_MESSAGES`] messages and [`MAX_FETCH_BYTES`] bytes.

mod imap;
mod server;
mod smtp;

use std::sync::Arc;
use std::time::Duration;

pub use server::{MailServer, Protocol, Security};

use crate::secrets::Secret;

/// The largest message handed to the adapter whole; a larger one comes as its header.
pub const MAX_MESSAGE_BYTES: u64 = 1 << 20;

/// The most bytes one fetch brings; the rest waits for the next.
pub const MAX_FETCH_BYTES: u64 = 4 << 20;

/// The most messages one fetch brings.
pub const MAX_FETCH_MESSAGES: u32 = 50;

/// The longest a fetch waits for a message to arrive.
pub const MAX_FETCH_WAIT: Duration = Duration::from_secs(30);

/// The longest letter sent, in bytes of text.
pub const MAX_LETTER_BYTES: usize = 1 << 20;

/// How long connecting, and then each exchange with a server, may take.
pub const MAIL_TIMEOUT: Duration = Duration::from_secs(30);

/// A channel's mail account as its config names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailAccount {
    /// The IMAP server the mailbox is read from.
    pub imap: MailServer,
    /// The SMTP server letters are sent through.
    pub smtp: MailServer,
    /// The user both servers know the account by.
    pub user: String,
    /// The `[secrets.NAME]` holding the password.
    pub password: String,
    /// The address letters are sent from.
    pub address: String,
    /// The IMAP folder read, `INBOX` unless set.
    pub folder: String,
}

/// Who a channel's letters may go to: its senders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recipients {
    /// Anyone (the channel allows `*`).
    Anyone,
    /// Only these addresses, compared without regard to case.
    Only(Vec<String>),
}

impl Recipients {
    /// Whether a letter may go to `address`.
    pub fn allow(&self, address: &str) -> bool {
        match self {
            Recipients::Anyone => true,
            Recipients::Only(list) => list.iter().any(|a| a.eq_ignore_ascii_case(address)),
        }
    }
}

/// A place in the mailbox: its UIDVALIDITY and the UID of the last message read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The mailbox's UIDVALIDITY: UIDs of another value mean nothing here.
    pub validity: u32,
    /// The last UID read.
    pub uid: u32,
}

/// A message as the server keeps it.
#[derive(Debug, Clone)]
pub struct StoredMessage {
    /// Its UID.
    pub uid: u32,
    /// Its size on the server.
    pub size: u64,
    /// The whole message, or only its header when it is over [`MAX_MESSAGE_BYTES`].
    pub raw: Vec<u8>,
    /// Whether `raw` is the whole message.
    pub complete: bool,
}

/// What one fetch found.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The messages after the mark asked for, oldest first.
    pub messages: Vec<StoredMessage>,
    /// Where the next fetch starts.
    pub mark: Mark,
}

/// A letter to send.
#[derive(Debug, Clone)]
pub struct Letter {
    /// The one recipient.
    pub to: String,
    /// Its subject.
    pub subject: String,
    /// The Message-ID it answers.
    pub in_reply_to: Option<String>,
    /// The thread's Message-IDs, oldest first.
    pub references: Vec<String>,
    /// The body, plain text.
    pub text: String,
}

/// Why a mail operation did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MailError {
    /// The server or the host refused: a bad password, a recipient the channel does not
    /// allow, a call from something that is not this channel's adapter.
    #[error("denied: {0}")]
    Denied(String),
    /// The letter cannot be written as given.
    #[error("malformed: {0}")]
    Malformed(String),
    /// The server said to try again later.
    #[error("the server asks to try again later: {0}")]
    TryLater(String),
    /// Anything else: the server unreachable, an answer cut short.
    #[error("{0}")]
    Failed(String),
}

/// A channel's mailbox, as the host reaches it: the account, its password, and the IMAP
/// session kept open between fetches.
pub struct Mailbox {
    channel: String,
    account: MailAccount,
    password: Secret,
    recipients: Recipients,
    session: tokio::sync::Mutex<Option<imap::Session>>,
    smtp: smtp::Transport,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox")
            .field("channel", &self.channel)
            .field("account", &self.account)
            .finish_non_exhaustive()
    }
}

impl Mailbox {
    /// The mailbox of channel `channel`, its password `password`, its letters going only
    /// to `recipients`. Nothing is connected until it is used.
    pub fn new(
        channel: &str,
        account: MailAccount,
        password: Secret,
        recipients: Recipients,
    ) -> Result<Arc<Self>, MailError> {
        let smtp = smtp::Transport::new(&account, &password)?;
        Ok(Arc::new(Mailbox {
            channel: channel.to_owned(),
            account,
            password,
            recipients,
            session: tokio::sync::Mutex::new(None),
            smtp,
        }))
    }

    /// The account.
    pub fn account(&self) -> &MailAccount {
        &self.account
    }

    /// Messages after `since`, at most `max` (capped at [`MAX_FETCH_MESSAGES`]), waiting
    /// up to `wait` (capped at [`MAX_FETCH_WAIT`]) for one to arrive. With no `since`, or
    /// one of another UIDVALIDITY, none: the mark of where the mailbox ends.
    pub async fn fetch(
        &self,
        since: Option<Mark>,
        max: u32,
        wait: Duration,
    ) -> Result<Fetched, MailError> {
        // One fetch at a time: the session is the mailbox's, and a second reader would
        // only read the same messages.
        let mut kept = self.session.lock().await;
        let session = match kept.take() {
            Some(session) => session,
            None => imap::Session::open(&self.account, self.password.value()).await?,
        };
        let max = max.clamp(1, MAX_FETCH_MESSAGES);
        let (session, fetched) = session
            .fetch(&self.channel, since, max, wait.min(MAX_FETCH_WAIT))
            .await?;
        // Kept only after a fetch that worked: a failed one may have left it anywhere.
        *kept = Some(session);
        Ok(fetched)
    }

    /// Sends `letter` from the channel's address; its Message-ID.
    pub async fn send(&self, letter: Letter) -> Result<String, MailError> {
        if !self.recipients.allow(&letter.to) {
            return Err(MailError::Denied(format!(
                "`{}` is not on [channels.{}] `allow`: the channel writes only to its senders",
                crate::text::echo_name(&letter.to, 80),
                self.channel
            )));
        }
        self.smtp.send(&self.account, letter).await
    }
}
