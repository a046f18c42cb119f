//! Data flow: what data may drive which call. Grants say which tools a process may call;
//! labels say what the data it has read may make it do.
//!
//! - [`Label`]: a datum's integrity (trusted, or untrusted from some [`Origin`]s the host
//!   knows: a plugin, a host a request reached, an MCP server, a file) and its
//!   confidentiality (public, private to some [`Scope`]s, or derived from secrets).
//!   The host sets labels from facts it holds, never from what a tool says; they are
//!   kept with every history message, and a process's context label is the join of the
//!   labels of what it reads.
//! - [`Effect`] and [`Sink`]: what a call does (read, write locally, send) and who outside
//!   the host reads its arguments.
//! - [`FlowRules`] (`[profiles.NAME.flow]`) and [`check()`]: at the sink, a call is allowed,
//!   parked for a person's approval, or refused, with the reason and the key that
//!   changes it.
//! - [`ArgsDigest`]: what a person's approval of a parked call is bound to.
//! - [`WorkspaceLabel`]: what a workspace file the host did not see written is taken to be.
//! - [`Handles`] and [`Question`]: a result held back from the model, passed on by name
//!   or asked a typed question about, so untrusted text can be used without being read.

mod check;
mod digest;
mod effect;
mod handle;
mod label;
mod question;
mod rules;
mod workspace;

pub use capstan_caps::{Effect, ParseEffectError};
pub use check::{Caught, Explained, FlowCall, FlowDecision, check};
pub use digest::{ArgsDigest, ParseDigestError, canonical, shown};
pub use effect::{Outside, Sink};
pub use handle::{
    Carried, CarriedList, HandleId, Handles, Held, Holding, MAX_PUT_IN, ParseHandleError,
    Substituted,
};
pub use label::{Label, MAX_NAMED, MAX_ORIGIN_PATH, Origin, ParseLabelError, Scope};
pub use question::{AnswerType, MAX_CHOICES, MAX_TEXT_ANSWER, Question};
pub use rules::{Action, FlowRule, FlowRules};
pub use workspace::{ParseWorkspaceLabelError, WorkspaceLabel};
