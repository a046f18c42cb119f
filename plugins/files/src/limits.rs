//! Output caps: a tool's answer goes into a model's context window, so none may be unbounded.

/// The most text one `file_read` returns; more is cut with a marker saying how to continue.
pub const MAX_READ_BYTES: usize = 64 * 1024;

/// Lines `file_read` returns when the caller gives no `limit`.
pub const DEFAULT_READ_LINES: u64 = 2000;

/// The most entries one `file_list` returns.
pub const MAX_LIST_ENTRIES: usize = 1000;

/// How far back from the output cap a page of a long line looks for a space or delimiter to
/// end after, so a page rarely ends inside a key or token.
pub const PAGE_BREAK_WINDOW: usize = 4 * 1024;
