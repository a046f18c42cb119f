//! Outbound HTTP under policy: every request a guest makes through `wasi:http` is checked
//! by the host before it leaves, and accounted for after.
//!
//! - [`target_of`] reads a request's target the way a browser would (IDNA, numeric IPv4
//!   forms, trailing dots), refusing user info.
//! - [`NetScope::check`] finds the rule that allows it: declared by the tool and granted to
//!   the caller ([`capstan_caps::NetRule`]), or says what would.
//! - The host resolves the name itself and checks every address ([`AddressClass`]) against
//!   both halves: a loopback, private, link-local or unique-local address needs the tool's
//!   declaration and the caller's grant each to name its host exactly or its range
//!   ([`AddressRange`]); a metadata address, each to name it exactly; wildcards reach
//!   public addresses only. It connects to the address it checked, so a second answer from
//!   DNS cannot change where the request goes.
//! - [`NetLimits`] bound each tool's requests: in flight, body sizes (counted while
//!   streaming), connect, first-byte and total timeouts, and a rate per process.
//! - Secrets granted to the call and bound to the host are injected as headers; the
//!   secrets injected into a request, and only those, are redacted from what the guest
//!   reads back of its response (so what is held back tells nothing of the others).
//! - Redirects are never followed: a guest that follows one makes a new request, checked
//!   on its own.
//! - Every request, allowed, refused or failed, is one row of the audit log.

mod address;
mod body;
mod check;
mod connect;
mod egress;
mod limits;
mod log;
pub mod mail;
mod target;

pub use address::{AddressClass, AddressRange};
pub(crate) use body::over_body_cap;
pub use check::{GrantSource, NetScope, Refusal, rule_for};
pub use egress::NetHost;
pub(crate) use egress::{CallNet, Egress, error_text};
pub use limits::{NetLimits, NetSettings, RateLimiter};
pub use target::{canonical_host, target_of};
