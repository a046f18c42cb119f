//! The host side of the `capstan:channel` contract (`wit/channel/channel.wit`): its
//! bindings, and the imports a messaging adapter may call (`mail`). Linked into every
//! plugin's linker by the engine; answered only for an adapter whose channel grants them.
//! Loading and calling adapters is [`adapter`](super::adapter)'s.

pub(crate) mod bindings;
mod mail;

pub(crate) use mail::add_to_linker;
