//! Reading a wasmtime error for what a person can act on: a pooling-allocator limit (and
//! the setting that raises it), a component built for the async ABI, a guest stack
//! overflow, or the host's own input or output failing.

use super::engine::{
    MAX_CORE_INSTANCES_PER_COMPONENT, MAX_MEMORIES_PER_COMPONENT, MAX_TABLES_PER_COMPONENT,
};
use super::limits::Limits;

/// When `err` comes from the host's own input or output (not the guest's, which WASI gives
/// back to it as an error code), what failed, on one line.
pub(crate) fn host_io(err: &wasmtime::Error) -> Option<String> {
    err.downcast_ref::<wasmtime::Trap>()
        .is_none()
        .then_some(())?;
    let io = err
        .chain()
        .find_map(|c| c.downcast_ref::<std::io::Error>())?;
    let context = err.to_string();
    let io = io.to_string();
    Some(if context == io {
        io
    } else {
        format!("{context}: {io}")
    })
}

/// When `err` is a pooling-allocator limit, what was exceeded and how to raise it (or that
/// the cap is fixed).
pub(crate) fn pool_limit(err: &wasmtime::Error, limits: &Limits) -> Option<String> {
    let text = chain_text(err);
    if let Some(min) = number_after(&text, "minimum byte size of ") {
        return Some(format!(
            "its linear memory starts at {} MiB, over the {} MiB limit; raise \
             `limits.tool_memory_mib` in capstan.toml (or pass --memory MIB)",
            min.div_ceil(1 << 20),
            limits.memory_bytes >> 20
        ));
    }
    // Wasmtime says the count one of two ways: for the whole component ("transitively
    // contains N") or for one core module ("defined ... count of N").
    let count = || {
        number_after(&text, "transitively contains ")
            .or_else(|| number_after(&text, "defined memories count of "))
            .or_else(|| number_after(&text, "defined tables count of "))
    };
    let fixed = |what: &str, count: Option<u64>, cap: u32| match count {
        Some(count) => format!(
            "it has {count} {what}, over this host's fixed cap of {cap} per component (no \
             setting raises it); build the plugin with fewer"
        ),
        None => format!(
            "it has more {what} than this host's fixed cap of {cap} per component (no \
             setting raises it); build the plugin with fewer"
        ),
    };
    if text.contains("core module instances, which exceeds") {
        return Some(fixed(
            "core instances",
            count(),
            MAX_CORE_INSTANCES_PER_COMPONENT,
        ));
    }
    if text.contains("linear memories, which exceeds") || text.contains("defined memories count") {
        return Some(fixed(
            "linear memories",
            count(),
            MAX_MEMORIES_PER_COMPONENT,
        ));
    }
    if text.contains("tables, which exceeds") || text.contains("defined tables count") {
        return Some(fixed("tables", count(), MAX_TABLES_PER_COMPONENT));
    }
    if text.contains("maximum concurrent limit") {
        return Some(format!(
            "every one of the host's {} call slots is taken; this is a host bug (calls wait \
             for a slot), please report it",
            limits.max_concurrent_calls
        ));
    }
    None
}

/// When `err` says the component uses the component model's async ABI, what it uses and
/// what to build instead: the engine leaves that ABI off (a tool is a synchronous export,
/// and a call into a kept instance is cheaper without the ABI's task machinery).
pub(crate) fn async_abi(err: &wasmtime::Error) -> Option<String> {
    let used = err
        .chain()
        .map(|cause| cause.to_string())
        .find(|cause| cause.contains("requires the component model async"))?;
    Some(format!(
        "it uses the component model's async ABI ({used}), which this host does not run: \
         a tool is a synchronous export; build it with synchronous bindings, as the SDK's \
         templates do (wit-bindgen without `async`, componentize-py, ComponentizeJS)"
    ))
}

/// Every cause in `err`'s chain, outermost first, on one line.
fn chain_text(err: &wasmtime::Error) -> String {
    err.chain()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// Whether `err` says a component does not fit the engine's pooling allocator: a fact
/// about the host's limits, not a fault of the component or of its compiled form.
pub(crate) fn is_pool_limit(err: &wasmtime::Error) -> bool {
    pool_limit(err, &Limits::default()).is_some()
}

/// Calls of one function deep enough on the stack at an out-of-bounds access to call it a
/// stack overflow: a recursion ran the guest's own stack (kept in linear memory, growing
/// down from its start) past zero.
const RECURSION_DEPTH: usize = 16;

/// When `err` is a guest stack overflow, how it shows: the engine's call-stack limit, or an
/// out-of-bounds access at least [`RECURSION_DEPTH`] calls deep in one function.
pub(crate) fn stack_overflow(err: &wasmtime::Error) -> Option<String> {
    match err.downcast_ref::<wasmtime::Trap>()? {
        wasmtime::Trap::StackOverflow => Some("its call stack ran out".into()),
        wasmtime::Trap::MemoryOutOfBounds => {
            let depth = recursion_depth(err.downcast_ref::<wasmtime::WasmBacktrace>()?);
            (depth >= RECURSION_DEPTH).then(|| {
                format!(
                    "an out-of-bounds memory access at least {depth} calls deep in a recursion, where \
                     its stack in linear memory ran past its start"
                )
            })
        }
        _ => None,
    }
}

/// The longest run of consecutive frames of one function in `backtrace`: a recursion.
fn recursion_depth(backtrace: &wasmtime::WasmBacktrace) -> usize {
    let frames = backtrace.frames();
    let mut longest = 0;
    let mut run = 0;
    for (i, frame) in frames.iter().enumerate() {
        let same = i > 0 && frames[i - 1].func_index() == frame.func_index();
        run = if same { run + 1 } else { 1 };
        longest = longest.max(run);
    }
    longest
}

/// The decimal number right after `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> Option<u64> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hosts_own_io_failure_is_told_apart_from_the_guests() {
        // What wasmtime gives when the kernel refuses to seal a memory image.
        let busy = wasmtime::Error::from(std::io::Error::from_raw_os_error(16))
            .context("cannot add seals to the memfd");
        let text = host_io(&busy).unwrap();
        assert!(
            text.starts_with("cannot add seals to the memfd: ") && text.contains("os error 16"),
            "{text}"
        );
        // A value the host could not lift, and a trap, are the guest's doing.
        assert_eq!(
            host_io(&wasmtime::Error::msg("unexpected discriminant: 7")),
            None
        );
        assert_eq!(
            host_io(&wasmtime::Error::from(
                wasmtime::Trap::UnreachableCodeReached
            )),
            None
        );
    }

    #[test]
    fn pool_limits_name_the_setting_or_the_fixed_cap() {
        let limits = Limits::default();
        let memory = wasmtime::Error::msg(
            "memory has a minimum byte size of 104857600 which exceeds the limit of 67108864 bytes",
        )
        .context("memory index 0 is unsupported in this pooling allocator configuration");
        let text = pool_limit(&memory, &limits).unwrap();
        assert!(
            text.contains("100 MiB") && text.contains("limits.tool_memory_mib"),
            "{text}"
        );

        let instances = wasmtime::Error::msg(
            "The component transitively contains 40 core module instances, which exceeds the \
             configured maximum of 32 in the pooling allocator",
        );
        let text = pool_limit(&instances, &limits).unwrap();
        assert!(
            text.contains("40 core instances") && text.contains("cap of 32"),
            "{text}"
        );

        // One core module over the cap says its count its own way: the refusal still gives it.
        let memories = wasmtime::Error::msg(format!(
            "defined memories count of 3 exceeds the per-instance limit of {MAX_MEMORIES_PER_COMPONENT}"
        ));
        let text = pool_limit(&memories, &limits).unwrap();
        assert!(
            text.contains("it has 3 linear memories")
                && text.contains(&format!("cap of {MAX_MEMORIES_PER_COMPONENT}")),
            "{text}"
        );

        assert!(pool_limit(&wasmtime::Error::msg("something else"), &limits).is_none());
    }
}
