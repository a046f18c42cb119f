//! The host's integration tests, in one binary so the suite links once (as wasmtime's
//! `tests/all/` does). Each module drives the real path: built plugins from
//! `bash scripts/setup`, a real SQLite file, real sockets on loopback, the built `capstan`
//! binary.
//!
//! Run one module with `cargo test -p capstan-host --test all MODULE::`, e.g.
//! `cargo test -p capstan-host --test all attacks::self_grant::`.

// The tests report to their runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

mod support;

mod agent;
mod approvals;
mod arguments;
mod attacks;
mod catalog;
mod channels;
mod cli;
mod dispatch;
mod dispatch_owner;
mod escapes;
mod example_plugin;
mod exchange;
mod flow;
mod handles;
mod host_imports;
mod hosts;
mod imports;
mod limits;
mod loading;
mod net;
mod pinning;
mod policy_lint;
mod postgres;
mod providers;
mod push_channels;
mod receipts;
mod reuse;
mod sandbox;
mod serve;
mod sqlite_faults;
mod stop;
mod stored_labels;
mod taskboard;
