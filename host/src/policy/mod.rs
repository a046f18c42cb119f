//! Policy: who may use which capability. This module decides; `plugin/` enforces.
//!
//! A call carries the caller's [`Grants`]. The capabilities a call runs with are
//! [`Grants::effective`]: the ones the tool declares, each allowed by a grant. A tool that
//! declares a capability the caller does not grant is refused before it is instantiated,
//! with a [`Denial`] naming the capability and the grant that would allow it.

mod grants;

pub use grants::{Denial, Grants};
