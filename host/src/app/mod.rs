//! Assembling an agent from its config: the one way the CLI, the tests, the benches and
//! an embedding program start a [`Runtime`](crate::agent::Runtime). See [`AgentBuilder`].

mod builder;
mod error;

pub use builder::{Agent, AgentBuilder};
pub use error::BuildError;
