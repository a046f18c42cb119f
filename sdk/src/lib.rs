//! Write tools for Capstan as WebAssembly components.
//!
//! A plugin is one small `cdylib` crate built for `wasm32-wasip2`. It lists its tools in a
//! [`Toolbox`] and exports them with [`export_plugin!`]. Each tool has typed arguments: one
//! Rust type gives the JSON Schema the model sees and the parser for each call, so the two
//! never drift apart.
//!
//! The host runs every call in a sandbox holding only the capabilities the tool declares
//! (with [`Tool::needs`]) and the caller grants: a fresh one, or, where the host keeps
//! instances per process, the one the same process's calls with the same capabilities
//! used before. Files are plain [`std::fs`] on paths relative
//! to the workspace; a tool that does not declare `fs.read` or `fs.write` sees no files at all.
//!
//! # A complete plugin
//!
//! `Cargo.toml`:
//!
//! ```toml
//! [package]
//! name = "word-count"
//! version = "0.1.0"
//! edition = "2024"
//!
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! capstan-sdk = "0.1"
//! schemars = "1"
//! serde = { version = "1", features = ["derive"] }
//! ```
//!
//! `src/lib.rs`:
//!
//! ```
//! use capstan_sdk::{Capability, Context, Tool, ToolError, Toolbox};
//! use schemars::JsonSchema;
//! use serde::Deserialize;
//!
//! /// Arguments of `word_count`. Doc comments become the schema's descriptions.
//! #[derive(Deserialize, JsonSchema)]
//! #[serde(deny_unknown_fields)]
//! struct Args {
//!     /// A file in the workspace.
//!     path: String,
//! }
//!
//! fn word_count(args: Args, _ctx: &Context) -> Result<String, ToolError> {
//!     let text = std::fs::read_to_string(&args.path)?;
//!     Ok(text.split_whitespace().count().to_string())
//! }
//!
//! fn tools() -> Toolbox {
//!     Toolbox::new().tool(
//!         Tool::new("word_count", "Counts the words in a workspace file.", word_count)
//!             .needs(Capability::FsRead),
//!     )
//! }
//!
//! capstan_sdk::export_plugin!(tools);
//! # fn main() {}
//! ```
//!
//! Build it with `cargo build --release --target wasm32-wasip2` and put
//! `target/wasm32-wasip2/release/word_count.wasm` in the host's plugins directory.
//!
//! # Outbound HTTP and secrets
//!
//! [`http`] is a small blocking client over `wasi:http` for tools that declare `net:`
//! capabilities; the host checks every request against the caller's grants and injects
//! credentials itself. [`host::secrets`] tells whether a secret is granted and signs with it;
//! a tool never sees a secret's value.
//!
//! # Errors
//!
//! A handler returns [`ToolError`]. `?` converts I/O errors (a sandbox refusal becomes
//! [`ToolError::Denied`]), the host's [`HostError`](host::HostError), [`http::HttpError`]
//! and JSON errors. The message goes to the model: say what failed and what would work.

pub mod bindings;
mod context;
mod error;
pub mod host;
pub mod http;
mod output;
#[doc(hidden)]
pub mod runtime;
mod task_enums;
mod tool;

pub use capstan_caps::{Capability, Effect};
pub use context::Context;
pub use error::ToolError;
pub use output::{IntoOutput, Json};
pub use tool::{Tool, Toolbox};

/// Exports the tools that `$tools()` returns as this component's `capstan:plugin/tool`.
///
/// `$tools` is a function `fn() -> Toolbox`. Use the macro once per plugin crate, at the crate
/// root. See the [crate documentation](crate) for a complete plugin.
///
/// `$tools` runs once per instance, on its first call, and the toolbox serves every later
/// call of that instance: a host that keeps instances between calls
/// (`instance_reuse = "process"`) calls it again. Build the toolbox from constants; read
/// the clock, a file or the call's context in a handler, never in `$tools`.
#[macro_export]
macro_rules! export_plugin {
    ($tools:path) => {
        #[doc(hidden)]
        struct __CapstanPlugin;

        impl __CapstanPlugin {
            fn with_tools<R>(f: impl ::std::ops::FnOnce(&$crate::Toolbox) -> R) -> R {
                ::std::thread_local! {
                    // Built on an instance's first call and kept for its next ones: a host
                    // that keeps the instance calls it again, and building the toolbox
                    // (names, descriptions, boxed handlers) costs more than a trivial
                    // tool's whole call.
                    static TOOLS: $crate::Toolbox = $tools();
                }
                TOOLS.with(f)
            }
        }

        impl $crate::bindings::exports::capstan::plugin::tool::Guest for __CapstanPlugin {
            fn describe() -> ::std::vec::Vec<$crate::bindings::exports::capstan::plugin::tool::ToolSpec> {
                Self::with_tools($crate::runtime::describe)
            }

            fn call(
                name: ::std::string::String,
                args_json: ::std::string::String,
                context: $crate::bindings::capstan::plugin::types::CallContext,
            ) -> ::std::result::Result<
                ::std::string::String,
                $crate::bindings::exports::capstan::plugin::tool::ToolError,
            > {
                Self::with_tools(|tools| $crate::runtime::call(tools, name, args_json, context))
            }
        }

        $crate::bindings::__export_plugin_world!(__CapstanPlugin with_types_in $crate::bindings);
    };
}
