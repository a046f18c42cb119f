//! The Capstan host: runs LLM agents' tools as sandboxed WebAssembly components.
//!
//! - [`agent`] runs the processes (channels, branches, workers, the compactor) over the
//!   plugins, each with the tools its profile grants; [`dispatch`] is the one gate every
//!   prompt passes through.
//! - [`plugin`] loads components and runs each tool call in a fresh instance whose sandbox
//!   holds only the capabilities the tool declares and the caller grants.
//! - [`policy`] decides which tools each process kind is offered and which capabilities a
//!   call runs with; [`flow`] labels what the host passes on and decides, at the sink,
//!   what data may drive a call.
//! - [`services`] are the taskboard, memory, history, audit log and ledger, behind traits;
//!   [`store`] implements them in SQLite.
//! - [`llm`] talks to models: the provider trait, an OpenAI-compatible client, and a
//!   scripted provider for runs without a network.
//! - [`net`] checks, connects and audits every outbound request a plugin makes;
//!   [`secrets`] holds the values plugins use without reading them.
//! - [`config`] reads `capstan.toml`: directories, limits, the provider and the profiles.
//! - [`telemetry`] counts what the host does, for `GET /metrics`.
//! - [`cli`] is the `capstan` binary's command line.

pub mod agent;
pub mod app;
pub mod cli;
pub mod config;
pub mod dispatch;
pub mod flow;
pub mod ids;
pub mod llm;
pub mod mcp;
pub mod messaging;
pub mod net;
pub mod plugin;
pub mod policy;
pub mod postgres;
pub mod secrets;
pub mod serve;
pub mod services;
pub mod store;
pub mod telemetry;
pub mod text;
pub mod tools;
