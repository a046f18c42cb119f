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

std::thread_local! {
    /// The capabilities of the call running now: one call at a time runs in an instance.
    static CURRENT: std::cell::RefCell<Option<Vec<Capability>>> = const { std::cell::RefCell::new(None) };
}

/// Marks `ctx` as the call running until the guard is dropped.
pub(crate) fn enter(ctx: &Context) -> impl Drop {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            CURRENT.with(|current| current.borrow_mut().take());
        }
    }
    CURRENT.with(|current| *current.borrow_mut() = Some(ctx.capabilities.clone()));
    Leave
}

/// Whether the call running now holds a `net:` rule; `None` outside a call (a native unit
/// test calling a handler directly).
pub(crate) fn current_holds_net() -> Option<(bool, String)> {
    CURRENT.with(|current| {
        current.borrow().as_ref().map(|caps| {
            let net = caps.iter().any(|cap| matches!(cap, Capability::Net(_)));
            let held: Vec<String> = caps.iter().map(ToString::to_string).collect();
            let held = if held.is_empty() {
                "none".to_owned()
            } else {
                held.join(", ")
            };
            (net, held)
        })
    })
}
