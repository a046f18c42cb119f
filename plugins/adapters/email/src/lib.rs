//! Email for Capstan: the channel's mailbox, read and answered through the host.
//!
//! The host holds the account (`[channels.NAME.email]`): it reads the mailbox over IMAP
//! and sends over SMTP (`capstan:channel/mail`). This adapter does what should not run in
//! the host: it parses the untrusted MIME of each message, and it writes the answer's
//! subject and thread headers. It never sees the password, cannot pick a server, and the
//! host sends its letters only from the channel's address and only to the channel's
//! senders.
//!
//! - A message's room and sender are its `From` address, but only when the server that
//!   received it vouches for that address: anyone can write any `From`. The topmost
//!   `Authentication-Results` header of the server named `authenticated_by` must say
//!   `auth=pass` for the address (the sender logged in to submit it), or `dmarc=pass` or
//!   `dkim=pass` for its domain. Mail it does not vouch for is not taken.
//! - Its thread is the first Message-ID of its `References` (or the one it answers, or
//!   its own).
//! - Its text is the subject and the plain-text body (HTML turned into text), without
//!   the quoted tail of earlier messages. Attachments are handles (`UID/PART`), never
//!   text.
//! - Automatic mail (`Auto-Submitted`, bulk and list mail, bounces, delivery reports,
//!   the channel's own letters) is not taken: an out-of-office answer never starts a
//!   conversation, nor a loop. The host marks the letters it sends `Auto-Submitted`.
//! - A message larger than the host reads whole comes as its header, and says so.
//!
//! The cursor is the mailbox's `UIDVALIDITY:UID`.
//!
//! Settings (`[channels.NAME.settings]`):
//! - `authenticated_by`: the authserv-id of the server that receives the channel's mail
//!   and writes `Authentication-Results` (the first word of that header's value, often
//!   the server's host name). Required.

use capstan_channel::mail::{self, Letter, Mark, Stored};
use capstan_channel::{
    Adapter, AdapterError, Attachment, Batch, Feature, Inbound, Outbound, Platform, Sender,
};
use mail_parser::{Address, HeaderValue, Message, MessageParser, MimeHeaders};
use serde::{Deserialize, Serialize};

/// The longest answer sent as one letter, in characters: longer ones are split.
pub const MAX_TEXT: u32 = 100_000;

/// The most messages asked of one fetch.
const FETCH_MAX: u32 = 50;

/// The most bytes of an inbound message's context (as the contract says).
const MAX_CONTEXT_BYTES: usize = 4096;

/// The longest id the host takes; a longer Message-ID is replaced by the UID.
const MAX_ID_BYTES: usize = 256;

/// `[channels.NAME.settings]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The authserv-id whose `Authentication-Results` vouch for senders.
    #[serde(default)]
    pub authenticated_by: Option<String>,
}

impl Settings {
    /// The settings in `json`, with `authenticated_by` named.
    fn read(json: &str) -> Result<(Settings, String), AdapterError> {
        let settings: Settings = capstan_channel::settings(json)?;
        let by = settings
            .authenticated_by
            .clone()
            .filter(|id| !id.trim().is_empty())
            .ok_or_else(|| {
                AdapterError::Failed(
                    "set [channels.NAME.settings] authenticated_by to the authserv-id of the \
                     server that receives this mailbox's mail (the first word of the \
                     Authentication-Results headers it writes): anyone can write any From, \
                     so only senders that server vouches for are taken"
                        .into(),
                )
            })?;
        Ok((settings, by))
    }
}

/// What the adapter needs to answer a message: carried by the host from the message to
/// its replies.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Context {
    /// The subject of the message answered.
    #[serde(rename = "s")]
    pub subject: String,
    /// The thread's Message-IDs, oldest first, ending with the message answered.
    #[serde(rename = "r", default)]
    pub references: Vec<String>,
}

impl Context {
    /// As JSON, dropping the oldest references until it fits in the contract's 4 KiB.
    fn encode(mut self) -> String {
        self.subject = cut(&self.subject, 400).to_owned();
        loop {
            let json = serde_json::to_string(&self).unwrap_or_default();
            if json.len() <= MAX_CONTEXT_BYTES || self.references.is_empty() {
                return json;
            }
            self.references.remove(0);
        }
    }
}

/// The cursor `validity:uid` as a mark.
pub fn parse_cursor(cursor: &str) -> Option<Mark> {
    let (validity, uid) = cursor.split_once(':')?;
    Some(Mark {
        validity: validity.parse().ok()?,
        uid: uid.parse().ok()?,
    })
}

/// Where a mailbox's messages come from: the channel's own address, and the server that
/// vouches for senders.
pub struct Mailbox<'a> {
    /// The channel's own address.
    pub own: &'a str,
    /// The authserv-id whose `Authentication-Results` are believed.
    pub authenticated_by: &'a str,
}

/// The message `stored` as the host takes it, or `None` when it is not for a
/// conversation (automatic mail, its own, a sender nobody vouches for, unreadable).
pub fn inbound(stored: &Stored, validity: u32, mailbox: &Mailbox<'_>) -> Option<Inbound> {
    let message = MessageParser::default().parse(&stored.raw)?;
    if is_automatic(&message) {
        return None;
    }
    let from = first(message.from())?;
    let address = from.address()?.trim().to_ascii_lowercase();
    if address.is_empty() || address.len() > MAX_ID_BYTES || !address.contains('@') {
        return None;
    }
    if address.eq_ignore_ascii_case(mailbox.own)
        || !vouched(&message, mailbox.authenticated_by, &address)
    {
        return None;
    }
    let own_id = message
        .message_id()
        .map(|id| format!("<{id}>"))
        .filter(|id| id.len() <= MAX_ID_BYTES);
    let id = own_id
        .clone()
        .unwrap_or_else(|| format!("uid:{validity}:{}", stored.uid));
    let mut references = ids(message.references());
    let answered = ids(message.in_reply_to());
    for id in answered.iter() {
        if !references.contains(id) {
            references.push(id.clone());
        }
    }
    let thread = references
        .first()
        .cloned()
        .or_else(|| own_id.clone())
        .filter(|t| t.len() <= MAX_ID_BYTES);
    if let Some(own) = &own_id {
        references.push(own.clone());
    }
    let subject = message.subject().unwrap_or_default().trim().to_owned();
    let mut text = String::new();
    if !subject.is_empty() {
        text.push_str(&format!("Subject: {subject}\n\n"));
    }
    let body = message
        .body_text(0)
        .map(|b| without_quoted_tail(&b).to_owned())
        .unwrap_or_default();
    text.push_str(body.trim());
    if !stored.complete {
        text.push_str(&format!(
            "\n\n[the message is {} bytes, more than the host reads: only its header was read]",
            stored.size
        ));
    }
    let recipients =
        message.to().map_or(0, |a| a.iter().count()) + message.cc().map_or(0, |a| a.iter().count());
    let attachments = message
        .attachments()
        .enumerate()
        .map(|(index, part)| Attachment {
            id: format!("{}/{index}", stored.uid),
            name: part.attachment_name().unwrap_or("attachment").to_owned(),
            media_type: part
                .content_type()
                .map(|ct| match ct.subtype() {
                    Some(sub) => format!("{}/{sub}", ct.ctype()),
                    None => ct.ctype().to_owned(),
                })
                .unwrap_or_else(|| "application/octet-stream".into()),
            size: Some(part.len() as u64),
        })
        .collect();
    Some(Inbound {
        id,
        room: address.clone(),
        thread,
        sender: Sender {
            id: address,
            display_name: from.name().map(|n| cut(n, 200).to_owned()),
        },
        text,
        // Mail sent to the bot's address speaks to it.
        addressed: true,
        direct: recipients <= 1,
        attachments,
        edits: None,
        forwarded_from: None,
        context: Some(
            Context {
                subject,
                references,
            }
            .encode(),
        ),
    })
}

/// Whether `message` was sent by a program, not a person: an automatic answer, a bounce,
/// bulk or list mail (RFC 3834, RFC 2369).
fn is_automatic(message: &Message<'_>) -> bool {
    let header = |name: &str| {
        message
            .header_raw(name)
            .map(|v| v.trim().to_ascii_lowercase())
    };
    if header("Auto-Submitted").is_some_and(|v| v != "no") {
        return true;
    }
    if header("Precedence").is_some_and(|v| matches!(v.as_str(), "bulk" | "junk" | "list")) {
        return true;
    }
    if header("List-Id").is_some() || header("X-Autoreply").is_some() {
        return true;
    }
    // A bounce's envelope sender is empty; a delivery report is a `multipart/report`.
    if header("Return-Path").is_some_and(|v| v.trim() == "<>") {
        return true;
    }
    if message.content_type().is_some_and(|ct| {
        ct.ctype().eq_ignore_ascii_case("multipart")
            && ct
                .subtype()
                .is_some_and(|s| s.eq_ignore_ascii_case("report"))
    }) {
        return true;
    }
    let from = first(message.from())
        .and_then(|a| a.address())
        .unwrap_or_default()
        .to_ascii_lowercase();
    from.starts_with("mailer-daemon@") || from.starts_with("postmaster@")
}

/// Whether the topmost `Authentication-Results` header that `authserv` wrote vouches for
/// `from`: `auth=pass` for the address, or `dmarc=pass` or `dkim=pass` for its domain.
/// Headers further down are the sender's own, or other servers': not believed.
pub fn vouched(message: &Message<'_>, authserv: &str, from: &str) -> bool {
    let domain = from.rsplit_once('@').map_or("", |(_, d)| d);
    let Some(results) = message
        .headers_raw()
        .filter(|(name, _)| name.eq_ignore_ascii_case("Authentication-Results"))
        .map(|(_, value)| without_comments(value))
        .find(|value| {
            value
                .split(';')
                .next()
                .and_then(|id| id.split_whitespace().next())
                .is_some_and(|id| id.eq_ignore_ascii_case(authserv))
        })
    else {
        return false;
    };
    results.split(';').skip(1).any(|result| {
        let mut words = result.split_whitespace();
        let Some(verdict) = words.next() else {
            return false;
        };
        let property = |key: &str| {
            result
                .split_whitespace()
                .find_map(|w| {
                    w.split_once('=')
                        .filter(|(k, _)| k.eq_ignore_ascii_case(key))
                })
                .map(|(_, v)| v.trim_matches('"').to_ascii_lowercase())
        };
        match verdict.to_ascii_lowercase().as_str() {
            "auth=pass" => property("smtp.auth").is_some_and(|a| a == from),
            "dmarc=pass" => property("header.from").is_some_and(|d| d == domain),
            "dkim=pass" => {
                property("header.d").is_some_and(|d| d == domain)
                    || property("header.i").is_some_and(|i| i.ends_with(&format!("@{domain}")))
            }
            _ => false,
        }
    })
}

/// `value` without its `(comments)`, unfolded.
fn without_comments(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut depth = 0usize;
    for c in value.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            '\r' | '\n' => out.push(' '),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The first address of `address`, if any.
fn first<'a>(address: Option<&'a Address<'a>>) -> Option<&'a mail_parser::Addr<'a>> {
    address?.first()
}

/// The Message-IDs of a header, with their angle brackets.
fn ids(value: &HeaderValue<'_>) -> Vec<String> {
    let list: Vec<&str> = match value {
        HeaderValue::Text(id) => vec![id.as_ref()],
        HeaderValue::TextList(ids) => ids.iter().map(|id| id.as_ref()).collect(),
        _ => Vec::new(),
    };
    list.into_iter()
        .filter(|id| !id.is_empty() && id.len() < MAX_ID_BYTES - 2)
        .map(|id| format!("<{id}>"))
        .collect()
}

/// `body` without the quote of the earlier message that mail programs put at its end
/// (`On ... wrote:` and the `>` lines after it).
pub fn without_quoted_tail(body: &str) -> &str {
    let lines: Vec<(usize, &str)> = body
        .split_inclusive('\n')
        .scan(0, |at, line| {
            let start = *at;
            *at += line.len();
            Some((start, line))
        })
        .collect();
    // The quote is the run of `>` (and blank) lines that ends the body.
    let mut cut_at = body.len();
    for &(start, line) in lines.iter().rev() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('>') {
            cut_at = start;
        } else {
            if trimmed.ends_with("wrote:") && cut_at < body.len() {
                cut_at = start;
            }
            break;
        }
    }
    if body[..cut_at].trim().is_empty() {
        // Nothing but a quote: keep it, it is what was said.
        return body;
    }
    &body[..cut_at]
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The letter answering with `message`.
pub fn letter(message: Outbound) -> Letter {
    let context: Context = message
        .context
        .as_deref()
        .and_then(|c| serde_json::from_str(c).ok())
        .unwrap_or_default();
    let subject = if context.subject.is_empty() {
        "Re: your message".to_owned()
    } else if context.subject.to_ascii_lowercase().starts_with("re:") {
        context.subject
    } else {
        format!("Re: {}", context.subject)
    };
    let in_reply_to = message
        .reply_to
        .filter(|id| id.starts_with('<'))
        .or_else(|| context.references.last().cloned());
    Letter {
        to: message.room,
        subject,
        in_reply_to,
        references: context.references,
        text: message.text,
    }
}

/// The email adapter.
pub struct Email;

impl Adapter for Email {
    fn describe(settings: String) -> Result<Platform, AdapterError> {
        Settings::read(&settings)?;
        Ok(Platform {
            name: "email".into(),
            max_text: MAX_TEXT,
            features: vec![Feature::Threads, Feature::Attachments, Feature::RateLimits],
            // No network of its own: the host reads and sends the mail.
            capabilities: Vec::new(),
        })
    }

    fn poll(settings: String, cursor: Option<String>, wait_ms: u32) -> Result<Batch, AdapterError> {
        let (_, authenticated_by) = Settings::read(&settings)?;
        let since = cursor.as_deref().and_then(parse_cursor);
        let fetched = mail::fetch(since, FETCH_MAX, wait_ms)?;
        let validity = fetched.mark.validity;
        let mailbox = Mailbox {
            own: &fetched.address,
            authenticated_by: &authenticated_by,
        };
        let messages = fetched
            .messages
            .iter()
            .filter_map(|stored| inbound(stored, validity, &mailbox))
            .collect();
        Ok(Batch {
            messages,
            cursor: Some(format!("{validity}:{}", fetched.mark.uid)),
        })
    }

    fn send(_settings: String, message: Outbound) -> Result<String, AdapterError> {
        mail::send(&letter(message))
    }
}

capstan_channel::export_adapter!(Email);

#[cfg(test)]
mod tests {
    use super::*;

    const MAILBOX: Mailbox<'static> = Mailbox {
        own: "agent@example.org",
        authenticated_by: "mx.example.org",
    };

    /// `raw` as the server keeps it, with the header `mx.example.org` writes on top.
    fn stored(raw: &str) -> Stored {
        let from = raw
            .lines()
            .find_map(|l| l.strip_prefix("From: "))
            .map(|f| {
                f.rsplit('<')
                    .next()
                    .unwrap()
                    .trim_end_matches('>')
                    .to_lowercase()
            })
            .unwrap_or_default();
        let raw = format!(
            "Authentication-Results: mx.example.org;\r\n auth=pass (logged in) smtp.auth={from}\r\n{raw}"
        );
        Stored {
            uid: 7,
            size: raw.len() as u64,
            raw: raw.into_bytes(),
            complete: true,
        }
    }

    fn read(stored: &Stored, validity: u32) -> Option<Inbound> {
        inbound(stored, validity, &MAILBOX)
    }

    #[test]
    fn a_reply_in_a_thread_is_read_with_its_thread_and_without_its_quote() {
        let raw = "From: Alice Example <Alice@Example.org>\r\nTo: agent@example.org\r\n\
                   Subject: Re: the plan\r\nMessage-ID: <m2@example.org>\r\n\
                   In-Reply-To: <m1@example.org>\r\nReferences: <m0@example.org> <m1@example.org>\r\n\
                   \r\nYes, go ahead.\r\n\r\nOn Monday, agent wrote:\r\n> Shall I?\r\n> \r\n";
        let message = read(&stored(raw), 1).unwrap();
        assert_eq!(message.id, "<m2@example.org>");
        assert_eq!(message.room, "alice@example.org");
        assert_eq!(message.thread.as_deref(), Some("<m0@example.org>"));
        assert_eq!(message.text, "Subject: Re: the plan\n\nYes, go ahead.");
        assert!(message.direct && message.addressed);
        let context: Context = serde_json::from_str(message.context.as_deref().unwrap()).unwrap();
        assert_eq!(
            context.references,
            ["<m0@example.org>", "<m1@example.org>", "<m2@example.org>"]
        );
        let letter = letter(Outbound {
            room: message.room,
            thread: message.thread,
            reply_to: Some(message.id),
            text: "Done.".into(),
            context: message.context,
        });
        assert_eq!(letter.subject, "Re: the plan");
        assert_eq!(letter.in_reply_to.as_deref(), Some("<m2@example.org>"));
        assert_eq!(letter.to, "alice@example.org");
    }

    #[test]
    fn automatic_mail_is_not_taken() {
        for header in [
            "Auto-Submitted: auto-replied",
            "Precedence: bulk",
            "List-Id: <list.example.org>",
        ] {
            let raw =
                format!("From: bob@example.org\r\n{header}\r\nSubject: Away\r\n\r\nI am away.\r\n");
            assert!(read(&stored(&raw), 1).is_none(), "{header}");
        }
        let bounce = "From: MAILER-DAEMON@example.org\r\nSubject: failure\r\n\r\nx\r\n";
        assert!(read(&stored(bounce), 1).is_none());
    }

    #[test]
    fn attachments_are_handles_and_a_cut_message_says_so() {
        let raw = "From: a@example.org\r\nTo: agent@example.org, b@example.org\r\nSubject: s\r\n\
                   MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=XX\r\n\r\n\
                   --XX\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n\
                   --XX\r\nContent-Type: application/pdf\r\n\
                   Content-Disposition: attachment; filename=\"plan.pdf\"\r\n\
                   Content-Transfer-Encoding: base64\r\n\r\nSGVsbG8=\r\n--XX--\r\n";
        let message = read(&stored(raw), 3).unwrap();
        assert!(!message.direct);
        assert_eq!(message.attachments.len(), 1);
        assert_eq!(message.attachments[0].id, "7/0");
        assert_eq!(message.attachments[0].name, "plan.pdf");
        assert_eq!(message.attachments[0].media_type, "application/pdf");
        assert!(!message.text.contains("SGVsbG8"), "{}", message.text);
        // No Message-ID: the UID stands for it.
        assert_eq!(message.id, "uid:3:7");
        let mut head = stored("From: a@example.org\r\nSubject: big\r\n\r\n");
        head.complete = false;
        head.size = 9_000_000;
        assert!(read(&head, 3).unwrap().text.contains("9000000 bytes"));
    }

    #[test]
    fn only_a_sender_the_receiving_server_vouches_for_is_taken() {
        let letter = "From: alice@example.org\r\nSubject: hi\r\n\r\nhello\r\n";
        let with = |results: &str| Stored {
            uid: 1,
            size: 0,
            raw: format!("{results}{letter}").into_bytes(),
            complete: true,
        };
        for (results, taken) in [
            (
                "Authentication-Results: mx.example.org; auth=pass smtp.auth=alice@example.org\r\n",
                true,
            ),
            (
                "Authentication-Results: MX.example.org 1; dmarc=pass header.from=example.org\r\n",
                true,
            ),
            (
                "Authentication-Results: mx.example.org; dkim=pass header.d=example.org\r\n",
                true,
            ),
            // Logged in as someone else, who wrote alice's address.
            (
                "Authentication-Results: mx.example.org; auth=pass smtp.auth=mallory@example.org\r\n",
                false,
            ),
            (
                "Authentication-Results: mx.example.org; dmarc=fail header.from=example.org\r\n",
                false,
            ),
            // Another server's word, or none.
            (
                "Authentication-Results: evil.example; auth=pass smtp.auth=alice@example.org\r\n",
                false,
            ),
            ("", false),
            // The sender's own header under the server's: the server's, on top, decides.
            (
                "Authentication-Results: mx.example.org; auth=pass smtp.auth=mallory@example.org\r\n\
              Authentication-Results: mx.example.org; auth=pass smtp.auth=alice@example.org\r\n",
                false,
            ),
        ] {
            assert_eq!(
                inbound(&with(results), 1, &MAILBOX).is_some(),
                taken,
                "{results}"
            );
        }
        // The channel's own letters, and bounces, are never taken.
        let own = "From: agent@example.org\r\nSubject: x\r\n\r\nx\r\n";
        assert!(read(&stored(own), 1).is_none());
        let bounce = "From: alice@example.org\r\nReturn-Path: <>\r\nSubject: x\r\n\r\nx\r\n";
        assert!(read(&stored(bounce), 1).is_none());
    }

    #[test]
    fn a_long_thread_keeps_its_newest_references_within_the_context_limit() {
        let context = Context {
            subject: "s".repeat(1000),
            references: (0..200).map(|i| format!("<{i}@example.org>")).collect(),
        }
        .encode();
        assert!(context.len() <= MAX_CONTEXT_BYTES);
        let back: Context = serde_json::from_str(&context).unwrap();
        assert_eq!(back.references.last().unwrap(), "<199@example.org>");
        assert_eq!(back.subject.len(), 400);
    }

    #[test]
    fn cursors_are_read_back() {
        let mark = parse_cursor("5:42").unwrap();
        assert_eq!((mark.validity, mark.uid), (5, 42));
        assert!(parse_cursor("x").is_none());
    }

    #[test]
    fn a_quote_alone_is_kept() {
        assert_eq!(without_quoted_tail("> only this\n"), "> only this\n");
        assert_eq!(without_quoted_tail("hi\n> q\n"), "hi\n");
    }
}
