//! Outbound HTTP for tools: a small blocking client over `wasi:http`.
//!
//! A tool call is synchronous, so the client is too: build a [`Request`], [`send`] it, and
//! get a [`Response`] whose body was read up to a limit the caller sets. Redirects are not
//! followed: a 3xx comes back as is, with its `location` header ([`Url::join`] resolves a
//! relative one).
//!
//! The host decides which requests leave the sandbox. A tool declares `net:` capabilities
//! (and `secret:` ones for credentials), the caller's grants narrow them, and each request
//! is checked against the grants before it is sent. Credentials are the host's business: it
//! adds the `authorization` header (or whatever the deployment binds a secret to) itself, so
//! a tool never needs an API key. A refused request fails with [`HttpError::Refused`], whose
//! message says which grant or limit refused it and what configuration would allow it.
//!
//! ```no_run
//! use capstan_sdk::http::Request;
//! use capstan_sdk::ToolError;
//!
//! # fn run() -> Result<String, ToolError> {
//! let response = Request::get("https://api.example.com/items?limit=5")
//!     .header("accept", "application/json")
//!     .max_response_bytes(256 * 1024)
//!     .send()?; // `?` turns a refusal into `ToolError::Denied`
//! if !response.is_success() {
//!     return Err(ToolError::failed(format!("the API answered {}", response.status)));
//! }
//! Ok(response.text())
//! # }
//! ```
//!
//! [`send`]: Request::send

mod error;
mod method;
mod request;
mod response;
mod transport;
mod url;

pub use error::{HttpError, REFUSAL_PREFIX};
pub use method::Method;
pub use request::{DEFAULT_MAX_RESPONSE_BYTES, Request};
pub use response::Response;
pub use url::{Scheme, Url};
