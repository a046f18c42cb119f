//! The Capstan host: runs LLM agents' tools as sandboxed WebAssembly components.
//!
//! - [`plugin`] loads components and runs each tool call in a fresh instance whose sandbox
//!   holds only the capabilities the tool declares and the caller grants.
//! - [`policy`] decides which capabilities a call runs with.
//! - [`cli`] is the `capstan` binary's command line.

pub mod cli;
pub mod plugin;
pub mod policy;
