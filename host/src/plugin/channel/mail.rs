//! The host side of `capstan:channel/mail`: the channel's mailbox, for its adapter only.
//!
//! A call without a mailbox in its scope (a tool, an adapter of a channel with no
//! `[channels.NAME.email]`) is answered `denied`, never a trap. The mailbox itself
//! ([`crate::net::mail`]) holds the account and checks who a letter goes to.

use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};

use super::bindings::capstan::channel::mail::{self, Fetched, Letter, Mark, Stored};
use super::bindings::capstan::channel::types::AdapterError;
use crate::net::mail::{self as net_mail, MailError, Mailbox};
use crate::plugin::sandbox::Sandbox;

/// Adds `capstan:channel/mail` to `linker`, and the types-only `capstan:channel/types`.
pub(crate) fn add_to_linker(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    // Types only, with nothing to call: an adapter imports it for the types its export
    // speaks of.
    linker.instance(&format!(
        "capstan:channel/types@{}",
        crate::plugin::contract::CHANNEL_WIT_VERSION
    ))?;
    mail::add_to_linker::<Sandbox, HasSelf<Sandbox>>(linker, |s| s)
}

impl Sandbox {
    /// The call's mailbox, or why it has none.
    fn mailbox(&self) -> Result<std::sync::Arc<Mailbox>, AdapterError> {
        self.scope.mail.clone().ok_or_else(|| {
            AdapterError::Denied(format!(
                "`{}` has no mailbox: capstan:channel/mail answers only the adapter of a \
                 channel with a [channels.NAME.email] table",
                self.scope.plugin
            ))
        })
    }
}

impl mail::Host for Sandbox {
    async fn fetch(
        &mut self,
        since: Option<Mark>,
        max: u32,
        wait_ms: u32,
    ) -> Result<Fetched, AdapterError> {
        let mailbox = self.mailbox()?;
        let since = since.map(|m| net_mail::Mark {
            validity: m.validity,
            uid: m.uid,
        });
        let fetched = mailbox
            .fetch(since, max, Duration::from_millis(u64::from(wait_ms)))
            .await
            .map_err(|e| self.adapter_error(e))?;
        Ok(Fetched {
            messages: fetched
                .messages
                .into_iter()
                .map(|m| Stored {
                    uid: m.uid,
                    size: m.size,
                    raw: m.raw,
                    complete: m.complete,
                })
                .collect(),
            mark: Mark {
                validity: fetched.mark.validity,
                uid: fetched.mark.uid,
            },
            address: mailbox.account().address.clone(),
        })
    }

    async fn send(&mut self, letter: Letter) -> Result<String, AdapterError> {
        let mailbox = self.mailbox()?;
        mailbox
            .send(net_mail::Letter {
                to: letter.to,
                subject: letter.subject,
                in_reply_to: letter.in_reply_to,
                references: letter.references,
                text: letter.text,
            })
            .await
            .map_err(|e| self.adapter_error(e))
    }
}

impl Sandbox {
    /// `err` as the adapter's error type, redacted before the guest sees it (a hostile
    /// server's error text may echo the login); a server's "later" is a short rate limit.
    fn adapter_error(&self, err: MailError) -> AdapterError {
        let redact = |m: String| self.scope.network.secrets().redactor().redact_owned(m);
        match err {
            MailError::Denied(m) => AdapterError::Denied(redact(m)),
            MailError::Malformed(m) => AdapterError::Malformed(redact(m)),
            MailError::TryLater(_) => AdapterError::RateLimited(TRY_LATER.as_millis() as u64),
            MailError::Failed(m) => AdapterError::Failed(redact(m)),
        }
    }
}

/// How long a letter waits when the SMTP server says to try later (a 4xx): the door tries
/// a few times, then gives the letter up.
const TRY_LATER: Duration = Duration::from_secs(10);
