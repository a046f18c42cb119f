//! Reading a wasmtime error for what a person can act on: a pooling-allocator limit (and
//! the setting that raises it) or a guest stack overflow.

use super::engine::{
    MAX_CORE_INSTANCES_PER_COMPONENT, MAX_MEMORIES_PER_COMPONENT, MAX_TABLES_PER_COMPONENT,
};
use super::limits::Limits;

/// Guest addresses this close below 4 GiB are a stack pointer that wrapped below zero:
/// Rust and C guests keep their stack at the start of linear memory, growing down.
const WRAPPED_STACK_WINDOW: u64 = 64 << 20;

/// When `err` is a pooling-allocator limit, what was exceeded and how to raise it (or that
/// the cap is fixed).
pub(crate) fn pool_limit(err: &wasmtime::Error, limits: &Limits) -> Option<String> {
    let text = err.chain().map(ToString::to_string).collect::<Vec<_>>().join(": ");
    if let Some(min) = number_after(&text, "minimum byte size of ") {
        return Some(format!(
            "its linear memory starts at {} MiB, over the {} MiB limit; raise \
             `limits.tool_memory_mib` in capstan.toml (or pass --memory MIB)",
            min.div_ceil(1 << 20),
            limits.memory_bytes >> 20
        ));
    }
    let fixed = |what: &str, count: Option<u64>, cap: u32| {
        let count = count.map_or_else(|| "more".to_owned(), |n| n.to_string());
        format!(
            "it has {count} {what}, over this host's fixed cap of {cap} per component (no \
             setting raises it); build the plugin with fewer"
        )
    };
    if text.contains("core module instances, which exceeds") {
        let count = number_after(&text, "transitively contains ");
        return Some(fixed("core instances", count, MAX_CORE_INSTANCES_PER_COMPONENT));
    }
    if text.contains("linear memories, which exceeds") || text.contains("defined memories count")
    {
        let count = number_after(&text, "transitively contains ");
        return Some(fixed("linear memories", count, MAX_MEMORIES_PER_COMPONENT));
    }
    if text.contains("tables, which exceeds") || text.contains("defined tables count") {
        let count = number_after(&text, "transitively contains ");
        return Some(fixed("tables", count, MAX_TABLES_PER_COMPONENT));
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

/// Whether `err` is a guest stack overflow: the engine's call-stack limit, or an access
/// just below 4 GiB, where a guest's downward-growing stack lands when it runs past zero.
pub(crate) fn is_stack_overflow(err: &wasmtime::Error) -> bool {
    match err.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::StackOverflow) => true,
        Some(wasmtime::Trap::MemoryOutOfBounds) => err.chain().any(|cause| {
            let text = cause.to_string();
            let Some(hex) = text.strip_prefix("memory fault at wasm address 0x") else {
                return false;
            };
            let digits: String = hex.chars().take_while(char::is_ascii_hexdigit).collect();
            u64::from_str_radix(&digits, 16).is_ok_and(|address| {
                address >= (1 << 32) - WRAPPED_STACK_WINDOW && address < (1 << 32) + (1 << 16)
            })
        }),
        _ => false,
    }
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
    fn pool_limits_name_the_setting_or_the_fixed_cap() {
        let limits = Limits::default();
        let memory = wasmtime::Error::msg(
            "memory has a minimum byte size of 104857600 which exceeds the limit of 67108864 bytes",
        )
        .context("memory index 0 is unsupported in this pooling allocator configuration");
        let text = pool_limit(&memory, &limits).unwrap();
        assert!(text.contains("100 MiB") && text.contains("limits.tool_memory_mib"), "{text}");

        let instances = wasmtime::Error::msg(
            "The component transitively contains 40 core module instances, which exceeds the \
             configured maximum of 32 in the pooling allocator",
        );
        let text = pool_limit(&instances, &limits).unwrap();
        assert!(text.contains("40 core instances") && text.contains("cap of 32"), "{text}");

        assert!(pool_limit(&wasmtime::Error::msg("something else"), &limits).is_none());
    }
}
