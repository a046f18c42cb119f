//! What a tool learns about the call it runs in.

use capstan_caps::Capability;

use crate::bindings::capstan::plugin::types::CallContext;

/// The call a tool is running in: who called, the call's id, and its effective capabilities.
#[derive(Debug, Clone)]
pub struct Context {
    caller: String,
    call_id: String,
    capabilities: Vec<Capability>,
}

impl Context {
    /// A context for calling handlers directly, e.g. in a plugin's native unit tests.
    ///
    /// ```
    /// use capstan_sdk::{Capability, Context};
    ///
    /// let ctx = Context::new("test", "call-1", vec![Capability::FsRead]);
    /// assert!(ctx.has(&Capability::FsRead));
    /// ```
    pub fn new(caller: &str, call_id: &str, capabilities: Vec<Capability>) -> Self {
        Context {
            caller: caller.to_owned(),
            call_id: call_id.to_owned(),
            capabilities,
        }
    }

    pub(crate) fn from_wit(ctx: CallContext) -> Self {
        Context {
            caller: ctx.caller,
            call_id: ctx.call_id,
            // The host only passes capabilities it parsed itself; skip anything newer.
            capabilities: ctx
                .capabilities
                .iter()
                .filter_map(|c| c.parse().ok())
                .collect(),
        }
    }

    /// The process that made the call, e.g. `worker:7` or `cli`.
    pub fn caller(&self) -> &str {
        &self.caller
    }

    /// The host's id for this call, as written to its audit log.
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// The capabilities this call runs with.
    pub fn capabilities(&self) -> &[Capability] {
        &self.capabilities
    }

    /// Whether this call runs with `cap`.
    pub fn has(&self, cap: &Capability) -> bool {
        self.capabilities.contains(cap)
    }
}
