//! Secrets: values the host holds for plugins that never see them.
//!
//! A secret is declared in the config (`[secrets.NAME]`) with where its value comes from
//! (an environment variable or a file, never the config text), the hosts it may be sent
//! to, and the header it is sent in. A call granted `secret:NAME` can have it injected
//! into its requests to those hosts ([`net`](crate::net) does that at the egress) and sign
//! with it through the `secrets` import; the guest only learns that it exists.
//!
//! Every value is redacted ([`Redactor`]) from what leaves a call: its output and errors,
//! its log lines, and so from history, logs and the audit log. The redactor also knows the
//! other values the host holds (serve tokens, the provider's key: [`Secrets::hiding`]).
//!
//! What leaves the host through a door is [`Outbound`]: bytes, a body or a writer that
//! only a redactor makes, so no door sends a byte that did not pass it. The terminal is
//! written only through [`stdout`] and [`stderr`] (the lint refuses any other way).
//!
//! A guest reading the response to a request carrying secrets has those secrets, and only
//! those, redacted from it: what is held back never depends on another secret.

mod outbound;
mod redact;
mod spec;
mod store;
mod terminal;

pub use outbound::{Outbound, OutboundBody, OutboundWriter, for_logs, log_redactor};
pub use redact::{REDACTED, Redactor, STEADY_LAG_STEP, StreamRedactor};
pub use spec::{HeaderTemplate, PathTemplate, SecretName, SecretSource, SecretSpec};
pub(crate) use store::read_source;
pub use store::{LoadSecretError, MIN_SECRET_BYTES, Secret, Secrets};
pub use terminal::{Terminal, stderr, stdout};
