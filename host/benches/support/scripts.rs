//! The scripted model answers the agent benchmarks share.

/// A channel whose model calls `file_read` once when asked to "read", then answers "ok"
/// once it sees the file's text (`bench data`).
pub const ONE_TOOL: &str = r#"
[[step]]
process = "channel"
when = "read"
tool_calls = [{ name = "file_read", arguments = { path = "data.txt" } }]
repeat = true

[[step]]
process = "channel"
when = "bench data"
reply = "ok"
repeat = true
"#;
