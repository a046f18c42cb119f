//! Takes a short JSON string and returns its length: the work of Capstan's `length-bare`
//! fixture (the SDK's `length` also parses the JSON), so the two hosts' call paths are
//! compared on the same guest work.

use extism_pdk::{FnResult, plugin_fn};

/// The length in bytes of the input, as decimal text.
#[plugin_fn]
pub fn length(input: String) -> FnResult<String> {
    Ok(input.len().to_string())
}
