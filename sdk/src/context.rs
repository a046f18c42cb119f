//! What a tool learns about the call it runs in.

use capstan_caps::Capability;

use crate::bindings::capstan::plugin::types::CallContext;

/// The call a tool is running in: who called, the call's id, and its effective capabilities.
#[derive(Debug, Clone)]
pub struct Context {
    caller: String,
    call_id: String,
    capabilities: Vec<Capability>,
    /// The capabilities as the host wrote them, those this SDK cannot parse included.
    raw: Vec<String>,
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
            raw: capabilities.iter().map(ToString::to_string).collect(),
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
            raw: ctx.capabilities,
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
    /// The capabilities of the call running now, as the host wrote them: one call at a time
    /// runs in an instance.
    static CURRENT: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// Restores the call that was running before [`enter`] when dropped.
pub(crate) struct Running(Option<Vec<String>>);

impl Drop for Running {
    fn drop(&mut self) {
        let before = self.0.take();
        CURRENT.with(|current| *current.borrow_mut() = before);
    }
}

/// Marks `ctx` as the call running until the guard is dropped (a handler calling another
/// tool through [`Toolbox::call`](crate::Toolbox::call) gets its own back after).
pub(crate) fn enter(ctx: &Context) -> Running {
    let raw = ctx.raw.clone();
    Running(CURRENT.with(|current| current.borrow_mut().replace(raw)))
}

/// Whether the call running now holds a `net:` rule (by the host's own words, so a rule
/// this SDK cannot parse still counts), and what it runs with; `None` outside a call (a
/// native unit test calling a handler directly).
pub(crate) fn current_holds_net() -> Option<(bool, String)> {
    CURRENT.with(|current| {
        current.borrow().as_ref().map(|caps| {
            let net = caps.iter().any(|cap| cap.starts_with("net:"));
            let held = if caps.is_empty() {
                "none".to_owned()
            } else {
                caps.join(", ")
            };
            (net, held)
        })
    })
}
