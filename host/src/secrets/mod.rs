//! Secrets: values the host holds for plugins that never see them.
//!
//! A secret is declared in the config (`[secrets.NAME]`) with where its value comes from
//! (an environment variable or a file, never the config text), the hosts it may be sent
//! to, and the header it is sent in. A call granted `secret:NAME` can have it injected
//! into its requests to those hosts ([`net`](crate::net) does that at the egress) and sign
//! with it through the `secrets` import; the guest only learns that it exists.
//!
//! Every value is redacted ([`Redactor`]) from what leaves a call: its output and errors,
//! its log lines, response bodies and headers the guest reads, and so from history, logs
//! and the audit log.

mod redact;
mod spec;
mod store;

pub use redact::{REDACTED, Redactor, StreamRedactor};
pub use spec::{HeaderTemplate, SecretName, SecretSource, SecretSpec};
pub(crate) use store::read_source;
pub use store::{LoadSecretError, Secret, Secrets};
