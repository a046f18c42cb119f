//! Capstan's tools over the Model Context Protocol.
//!
//! [`ToolServer`] serves the plugin tools one profile is offered to any MCP client
//! (`capstan mcp --profile worker` over stdio). A call from the client takes the path an
//! agent's call takes: the policy's decision for the profile, the profile's grants, a
//! fresh sandbox under the deadline and memory limits, and an audit row whose process is
//! the client (`mcp:NAME`). A denial, a trap or a deadline is a tool error carrying the
//! reason, never a dropped connection.

mod server;

pub use server::{Principal, ToolServer};
