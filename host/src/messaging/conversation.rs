//! Which conversation a message goes to, and what the conversation reads of it.

use sha2::{Digest, Sha256};

use crate::config::{ChannelSpec, ConversationPer};
use crate::flow::{Label, Origin};
use crate::ids::{MessageKey, ProcessId};
use crate::plugin::adapter::Inbound;
use crate::policy::ProcessKind;
use crate::text::truncate;

/// The most characters of a message a conversation reads; the rest is cut, saying so.
pub const MAX_INBOUND_CHARS: usize = 16 * 1024;

/// The conversation of `kind` that `message`, through `channel`, goes to: named after the
/// channel and the room, thread or sender (as `[channels.NAME] conversation` says), in
/// plain characters with a digest of the platform's own id, so two ids never share one.
///
/// ```
/// use capstan_host::config::Config;
/// use capstan_host::messaging::conversation_for;
/// use capstan_host::policy::ProcessKind;
/// # use capstan_host::plugin::adapter::{Inbound, Sender};
///
/// let config = Config::parse("[channels.mx]\nadapter = \"m.wasm\"\n", "c.toml".as_ref()).unwrap();
/// let message = Inbound {
///     id: "$1".into(), room: "!abc:localhost".into(), thread: None,
///     sender: Sender { id: "@eve:localhost".into(), display_name: None },
///     text: "hi".into(), addressed: true, direct: false, attachments: vec![], edits: None,
///     forwarded_from: None, context: None,
/// };
/// let id = conversation_for(&config.channels[0], &message, ProcessKind::Channel);
/// assert!(id.to_string().starts_with("channel:mx.r._abc_localhost."), "{id}");
/// ```
pub fn conversation_for(channel: &ChannelSpec, message: &Inbound, kind: ProcessKind) -> ProcessId {
    let (tag, key) = match (channel.per, &message.thread) {
        (ConversationPer::Sender, _) => ("s", message.sender.id.clone()),
        (ConversationPer::Thread, Some(thread)) => ("t", fields(&[&message.room, thread])),
        _ => ("r", message.room.clone()),
    };
    let digest = Sha256::digest(key.as_bytes());
    let short: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    let plain: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(24)
        .collect();
    ProcessId::named(kind, &format!("{}.{tag}.{plain}.{short}", channel.name))
}

/// The idempotency key of `message` through `channel`: the same message delivered again
/// (after a crash, before its cursor was kept) is answered again, never taken twice.
pub fn message_key(channel: &ChannelSpec, message: &Inbound) -> MessageKey {
    let digest = Sha256::digest(
        format!(
            "{}\n{}\n{}\n{}",
            channel.name,
            message.room,
            message.id,
            message.edits.is_some()
        )
        .as_bytes(),
    );
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("chat-{}-{hex}", channel.name)
        .parse()
        .expect("a channel's name and hex digits make a key")
}

/// Who could have written `message`: trusted if its sender is on the channel's `trusted`
/// list, else untrusted from `chat:CHANNEL:SENDER`.
///
/// A forwarded message is its first writer's words: labelled by them, trusted only if the
/// one who forwarded it and they both are.
pub fn label_of(channel: &ChannelSpec, message: &Inbound) -> Label {
    let mut label = Label::trusted();
    for who in std::iter::once(&message.sender).chain(&message.forwarded_from) {
        if !channel.trusted.contains(&who.id) {
            label.join(&Label::untrusted(Origin::chat(&channel.name, &who.id)));
        }
    }
    label
}

/// Whether `message` is trusted as a whole: its sender and, if forwarded, its first writer.
fn trusted(channel: &ChannelSpec, message: &Inbound) -> bool {
    label_of(channel, message).is_trusted()
}

/// What the conversation reads: a line in the host's words naming the channel and the
/// sender (by the platform's id; the name they chose, quoted, as theirs), the message
/// (cut at [`MAX_INBOUND_CHARS`]), and each attachment as a handle, never its content.
pub fn text_for(channel: &ChannelSpec, message: &Inbound) -> String {
    let quoted = |text: &str, max: usize| format!("{:?}", truncate(text, max));
    let mut head = format!(
        "[{} message from {}",
        channel.name,
        quoted(&message.sender.id, 128)
    );
    if let Some(name) = &message.sender.display_name {
        head.push_str(&format!(" (who calls themselves {})", quoted(name, 64)));
    }
    if let Some(first) = &message.forwarded_from {
        head.push_str(&format!(", forwarding words of {}", quoted(&first.id, 128)));
    }
    head.push_str(if trusted(channel, message) {
        ", trusted"
    } else {
        ", not trusted"
    });
    if let Some(thread) = &message.thread {
        head.push_str(&format!(", thread {}", quoted(thread, 64)));
    }
    if let Some(edited) = &message.edits {
        head.push_str(&format!(", an edit of message {}", quoted(edited, 64)));
    }
    head.push_str("; each line of it follows after `> `]");
    let chars = message.text.chars().count();
    let body = truncate_chars(&message.text, MAX_INBOUND_CHARS);
    // Every line of theirs quoted: none reads as the host's own.
    let mut text = head;
    for line in body.lines() {
        text.push_str("\n> ");
        text.push_str(line);
    }
    if body.is_empty() {
        text.push_str("\n> ");
    }
    if chars > MAX_INBOUND_CHARS {
        text.push_str(&format!(
            "\n[cut by the host: the message has {chars} characters, past the \
             {MAX_INBOUND_CHARS} a conversation reads]"
        ));
    }
    for (n, file) in message.attachments.iter().take(MAX_ATTACHMENTS).enumerate() {
        let size = file
            .size
            .map(|s| format!(", {s} bytes"))
            .unwrap_or_default();
        text.push_str(&format!(
            "\n[attachment {}: {} ({}{size}); its content is not read]",
            n + 1,
            quoted(&file.name, 128),
            quoted(&file.media_type, 64),
        ));
    }
    if message.attachments.len() > MAX_ATTACHMENTS {
        text.push_str(&format!(
            "\n[and {} more attachments]",
            message.attachments.len() - MAX_ATTACHMENTS
        ));
    }
    text
}

/// `parts` joined unambiguously: each after its length.
fn fields(parts: &[&str]) -> String {
    parts.iter().map(|p| format!("{}:{p}", p.len())).collect()
}

/// The most attachments of one message named to the conversation.
const MAX_ATTACHMENTS: usize = 10;

/// The first `max` characters of `text`.
fn truncate_chars(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}
