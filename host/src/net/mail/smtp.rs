//! Sending: each letter written by the host (lettre's builder, so no header can be
//! smuggled in through a subject or an id) from the channel's address, marked
//! `Auto-Submitted: auto-replied` (RFC 3834) so that other programs do not answer it, and
//! submitted over SMTP with the account's password.

use lettre::message::header::{Header, HeaderName, HeaderValue};
use lettre::message::{Mailbox as Address, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use super::{Letter, MAIL_TIMEOUT, MAX_LETTER_BYTES, MailAccount, MailError, MailServer, Security};
use crate::secrets::Secret;

/// The longest subject, in bytes.
const MAX_SUBJECT_BYTES: usize = 250;

/// The most Message-IDs a letter's `References` carries (the newest).
const MAX_REFERENCES: usize = 20;

/// `Auto-Submitted: auto-replied`: a program's answer, which an auto-responder must not
/// answer (RFC 3834), so two bots never write to each other without end.
#[derive(Clone)]
struct AutoReplied;

impl Header for AutoReplied {
    fn name() -> HeaderName {
        HeaderName::new_from_ascii_str("Auto-Submitted")
    }

    fn parse(_: &str) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        Ok(AutoReplied)
    }

    fn display(&self) -> HeaderValue {
        HeaderValue::new(Self::name(), "auto-replied".into())
    }
}

/// The SMTP client of one account, its connections pooled by lettre.
pub(super) struct Transport {
    inner: AsyncSmtpTransport<Tokio1Executor>,
    from: Address,
    domain: String,
}

impl Transport {
    /// The client for `account`'s SMTP server, logging in with `password`.
    pub(super) fn new(account: &MailAccount, password: &Secret) -> Result<Self, MailError> {
        let server = &account.smtp;
        let from: Address = account.address.parse().map_err(|e| {
            MailError::Malformed(format!(
                "[channels] email.address `{}` is not an address: {e}",
                account.address
            ))
        })?;
        let domain = from.email.domain().to_owned();
        let tls = |server: &MailServer| {
            TlsParameters::new(server.host.clone())
                .map_err(|e| MailError::Failed(format!("{server}: {e}")))
        };
        let tls = match server.security {
            Security::Tls => Tls::Wrapper(tls(server)?),
            Security::StartTls => Tls::Required(tls(server)?),
            Security::Plain => Tls::None,
        };
        let inner = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(server.host.clone())
            .port(server.port)
            .tls(tls)
            .credentials(Credentials::new(
                account.user.clone(),
                password.value().to_owned(),
            ))
            .timeout(Some(MAIL_TIMEOUT))
            .build();
        Ok(Transport {
            inner,
            from,
            domain,
        })
    }

    /// Writes `letter` and submits it; its Message-ID.
    pub(super) async fn send(
        &self,
        account: &MailAccount,
        letter: Letter,
    ) -> Result<String, MailError> {
        let to: Address = letter.to.parse().map_err(|e| {
            MailError::Malformed(format!(
                "`{}` is not an address: {e}",
                crate::text::echo_name(&letter.to, 80)
            ))
        })?;
        if letter.text.len() > MAX_LETTER_BYTES {
            return Err(MailError::Malformed(format!(
                "a letter of {} bytes is over the {MAX_LETTER_BYTES} the host sends",
                letter.text.len()
            )));
        }
        let id = format!("<{}@{}>", random_id(), self.domain);
        let subject: String = letter.subject.chars().filter(|c| !c.is_control()).collect();
        let mut message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(crate::text::truncate(&subject, MAX_SUBJECT_BYTES))
            .message_id(Some(id.clone()))
            .header(AutoReplied);
        if let Some(answered) = letter.in_reply_to.as_deref().filter(|i| is_message_id(i)) {
            message = message.in_reply_to(answered.to_owned());
        }
        let references: Vec<&String> = letter
            .references
            .iter()
            .filter(|i| is_message_id(i))
            .collect();
        let newest = &references[references.len().saturating_sub(MAX_REFERENCES)..];
        if !newest.is_empty() {
            let joined = newest
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(" ");
            message = message.references(joined);
        }
        let message = message
            .singlepart(SinglePart::plain(letter.text))
            .map_err(|e| MailError::Malformed(e.to_string()))?;
        match self.inner.send(message).await {
            Ok(_) => Ok(id),
            Err(err) if err.is_transient() => {
                Err(MailError::TryLater(format!("{}: {err}", account.smtp)))
            }
            Err(err) if err.is_permanent() => {
                Err(MailError::Denied(format!("{}: {err}", account.smtp)))
            }
            Err(err) => Err(MailError::Failed(format!("{}: {err}", account.smtp))),
        }
    }
}

/// Whether `id` is one Message-ID, `<left@right>`, with nothing that could end a header.
fn is_message_id(id: &str) -> bool {
    id.len() <= 250
        && id.starts_with('<')
        && id.ends_with('>')
        && id[1..id.len() - 1].contains('@')
        && id[1..id.len() - 1]
            .chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '<' | '>'))
}

/// 128 random bits, in hex: the left half of a Message-ID.
fn random_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the system's random source");
    crate::text::hex(&bytes)
}

#[cfg(test)]
mod tests {
    use super::is_message_id;

    #[test]
    fn only_single_well_formed_message_ids_pass() {
        assert!(is_message_id("<abc.1@example.org>"));
        for bad in [
            "abc@example.org",
            "<abc@example.org>\r\nBcc: x@y",
            "<a@b> <c@d>",
            "<nodomain>",
            "<>",
        ] {
            assert!(!is_message_id(bad), "{bad:?}");
        }
    }
}
