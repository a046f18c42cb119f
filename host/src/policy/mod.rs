//! Policy: which tools each process is offered, and which capabilities a call runs with.
//! This module decides; `plugin/` enforces.
//!
//! - A [`Profile`] per [`ProcessKind`] names tools (exact names or globs) and grants
//!   capabilities. The [`Policy`] built from the config's profiles is the only source of a
//!   process's tool list, and `capstan policy` prints it as a matrix with a reason for every
//!   cell that is off ([`Decision`]).
//! - A call carries the caller's [`Grants`]. The capabilities a call runs with are
//!   [`Grants::effective`]: those the tool declares, each allowed by a grant. A tool that
//!   declares a capability the caller does not grant is refused before it is instantiated,
//!   with a [`Denial`] naming the capability and the grant that would allow it.
//! - [`ReuseRules`] say which plugins' instances a process keeps between its calls
//!   ([`InstanceReuse`]).

mod decision;
mod grants;
mod profile;
mod reuse;

/// The kinds of process, each with its own profile; they live with the ids.
pub use crate::ids::ProcessKind;
pub use decision::{Decision, Policy, ToolNeeds};
pub use grants::{Denial, Grants, ToolGrants};
pub use profile::Profile;
pub use reuse::{InstanceReuse, ReuseRules};
