//! Messaging channels: a door where people already talk (`[channels.NAME]`).
//!
//! Each channel runs a messaging adapter (`crate::plugin::adapter`), a sandboxed component
//! that reaches its platform only through the host's egress, with the bot token the egress
//! injects. The door polls it, maps each message to a conversation (per room, thread or
//! sender), refuses senders the channel does not allow, labels every other sender's
//! message `untrusted(chat:CHANNEL:SENDER)` unless they are trusted, sends it through the
//! exchange as any door does, and sends the answer back once it is stored, cut to the
//! platform's size and paced by its rate limits. Every message is an event
//! ([`Event::ChatMessage`](crate::agent::Event::ChatMessage)), an audit row and a metric.
//!
//! A platform that pushes its events (Slack, Discord) reaches `POST /hooks/NAME` instead
//! ([`Hooks`]): each event, its signature checked by the host, is kept in the channel's
//! inbox before the platform is answered, and the door takes the inbox as it takes a poll.
//!
//! An adapter's poll moves the channel's cursor (kept in the data dir) only once every
//! message before it is stored: a crash or an outage delivers a message again, and its
//! idempotency key has it answered again rather than taken twice.

mod conversation;
mod cursor;
mod door;
mod files;
mod hooks;
mod inbox;
mod split;

pub use conversation::{MAX_INBOUND_CHARS, conversation_for, label_of, message_key, text_for};
pub use door::{
    ChannelError, ChannelFault, Channels, FIRST_BACKOFF, MAX_BACKOFF, MAX_BATCH, MAX_ID_BYTES,
    SENDER_MESSAGES_PER_MINUTE, grants_of, mailbox_of,
};
pub use hooks::{EVENTS_PER_SENDER_PER_MINUTE, HookAnswer, Hooks, MAX_CLOCK_SKEW};
pub use inbox::{InboxError, MAX_EVENT_BYTES, MAX_INBOX_BYTES, MAX_INBOX_EVENTS};
pub use split::split;
