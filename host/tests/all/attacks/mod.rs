//! Attacks on the host's edges, one module per class, each through the real path: the
//! built `capstan` binary or the host library with real built plugins, a real SQLite
//! file, real processes and signals.
//!
//! Run with `cargo test -p capstan-host --test all attacks::` after `bash scripts/setup`.

mod cache;
mod cli_input;
mod conversations;
mod deadline;
mod describe;
mod fuzz;
mod identity;
mod lifecycle;
mod model;
mod self_grant;
mod store;
