//! The tools room: every tool an agent knows and where a call of one goes. It sits between
//! [`crate::agent`] (the processes, which run the host tools) and [`crate::plugin`] (the
//! sandboxes, which run the rest).
//!
//! - [`host`]: the host tools, each defined once (name, description, argument type, the
//!   process kinds that run it).
//! - [`catalog`]: [`ToolCatalog`], host, plugin and MCP tools with what each needs, and
//!   which kinds the policy offers each.
//! - `tool`: [`CatalogTool`], one tool of the catalog, and its [`ToolOrigin`].
//! - `flow`: what the flow check knows of each catalog tool (its effect, where a call's
//!   arguments go, the label of its result).
//! - [`lint`]: what `capstan policy --lint` finds in a policy, from the catalog.
//! - [`router`]: [`ToolRouter`], a model's call to its host tool as a typed [`HostCall`],
//!   or to the registry, or refused with the policy's reason, or parked for a person.
//! - [`approval`]: how a parked call waits for a person's decision.

pub mod approval;
pub mod catalog;
mod flow;
pub mod host;
pub mod lint;
mod provenance;
pub mod router;
mod tool;

pub use approval::Decided;
pub use catalog::{CatalogTool, MatrixRow, ToolCatalog, ToolOrigin};
pub use flow::FlowFacts;
pub use host::{
    AnswerKind, AskArgs, BranchArgs, CancelArgs, HostCall, HostTool, ReplyArgs, ReportedState,
    RouteArgs, SkipArgs, SpawnArgs, StatusArgs,
};
pub use router::{Read, Routed, ToolRouter};
