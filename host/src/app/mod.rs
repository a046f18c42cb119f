//! Assembling an agent from its config: the one way the CLI, the tests, the benches and
//! an embedding program start a [`Runtime`](crate::agent::Runtime). See [`AgentBuilder`].

mod builder;
mod error;
mod host_key;
mod secrets;
mod services;
mod store;
mod trust;

pub use builder::{Agent, AgentBuilder};
pub use error::BuildError;
pub use host_key::{HOST_KEY_FILE, host_key};
pub use secrets::{hide_readable_values, load_secrets};
pub use services::open_services;
pub use store::{StoreStatus, sqlite_file, store_location, store_status};
pub use trust::trust;
