//! How much of a response the tools return: a tool's answer goes into a model's context
//! window, so none may be unbounded.

use capstan_sdk::ToolError;

/// The body bytes a tool returns when the caller gives no `max_bytes`: 256 KiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 * 1024;

/// The most body bytes one call returns: 1 MiB, what the host passes on from a tool.
pub const MAX_BYTES: u64 = 1024 * 1024;

/// The body limit for `max_bytes` as given, or why it is out of range.
pub fn body_limit(max_bytes: Option<u64>) -> Result<usize, ToolError> {
    let limit = max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    if !(1..=MAX_BYTES).contains(&limit) {
        return Err(ToolError::invalid_args(format!(
            "`max_bytes` is {limit}; it must be from 1 to {MAX_BYTES} (default {DEFAULT_MAX_BYTES})"
        )));
    }
    // At most 1 MiB: fits any usize.
    Ok(limit as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_defaults_and_is_bounded() {
        assert_eq!(body_limit(None).unwrap(), 256 * 1024);
        assert_eq!(body_limit(Some(1)).unwrap(), 1);
        assert_eq!(body_limit(Some(MAX_BYTES)).unwrap(), 1024 * 1024);
        for bad in [0, MAX_BYTES + 1, u64::MAX] {
            let err = body_limit(Some(bad)).unwrap_err();
            assert!(
                matches!(&err, ToolError::InvalidArgs(m) if m.contains("from 1 to 1048576")),
                "{err:?}"
            );
        }
    }
}
