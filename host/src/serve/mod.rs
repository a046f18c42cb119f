//! `capstan serve`: the agent over HTTP, on the same runtime, grants and audit as the CLI.
//!
//! - [`Server`] binds, authenticates ([`auth`](self) tokens with scopes, loopback-only
//!   without them) and serves:
//!   - the JSON API (`api.rs`): conversations, history, messages, workers, branches,
//!     tasks, policy, audit, plugins, tools;
//!   - `GET /v1/events` (`stream.rs`): the runtime's typed events as Server-Sent Events,
//!     resumable from a bounded buffer (`hub.rs`);
//!   - the OpenAI-compatible `/v1/chat/completions` and `/v1/models` (`openai.rs`), each
//!     completion one exchange with a conversation (`turn.rs`);
//!   - `GET /metrics` (`metrics.rs`): the host's Prometheus metrics, behind the tokens;
//!   - each profile's tools over MCP's streamable HTTP transport at `/mcp/{profile}`
//!     (`mcp.rs`; `/mcp` is the worker's);
//!   - `POST /hooks/{name}` (`hooks.rs`): events a chat platform pushes to a messaging
//!     channel, outside the tokens, proved by the platform's signature;
//!   - the web page (`page.rs`), embedded in the binary;
//!   - its OpenAPI document (`openapi.rs`), derived from the handlers.
//!
//! Every refusal is an OpenAI-shaped error (`error.rs`); every body served passes through
//! the redactor of the secrets' and tokens' values.

mod api;
mod app;
mod approvals;
mod auth;
mod branches;
mod error;
mod hooks;
mod hub;
mod mcp;
mod metrics;
mod openai;
mod openapi;
mod page;
mod server;
mod stream;
mod turn;

pub use auth::TokenError;
pub use openapi::openapi_json;
pub use server::{ServeError, Server};
