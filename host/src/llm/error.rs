//! Provider errors.

/// Why a completion failed. Each names the provider and says what would fix it.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The provider is misconfigured (missing key, bad URL).
    #[error("{0}")]
    Config(String),
    /// The endpoint could not be reached after every retry.
    #[error("cannot reach {url} after {attempts} attempts: {reason}")]
    Unreachable {
        /// The URL called.
        url: String,
        /// How many tries.
        attempts: u32,
        /// The last transport error.
        reason: String,
    },
    /// The endpoint answered with an error status (after retries for 429 and 5xx).
    #[error("{url} answered {status} after {attempts} attempt(s): {body}")]
    Status {
        /// The URL called.
        url: String,
        /// The HTTP status.
        status: u16,
        /// How many tries.
        attempts: u32,
        /// The start of the response body.
        body: String,
    },
    /// The response was not a chat completion.
    #[error("{url} sent a response that is not a chat completion: {reason}")]
    BadResponse {
        /// The URL called.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// The answer passed the answer cap; reading stopped there and nothing of it is used.
    #[error(
        "{url} sent an answer over the cap of {limit} bytes ({kib} KiB); reading stopped there. \
         Raise `limits.max_answer_kib` in capstan.toml if answers this long are expected",
        kib = .limit.div_ceil(1024)
    )]
    TooLarge {
        /// The URL called.
        url: String,
        /// The cap, in bytes.
        limit: usize,
    },
    /// The answer stopped before it was complete (the stream closed before its end, or the
    /// connection broke); nothing of it is used.
    #[error("{url} ended its answer before it was complete: {reason}; nothing of it is used")]
    Incomplete {
        /// The URL called.
        url: String,
        /// How it ended.
        reason: String,
    },
    /// The script has no step for this request.
    #[error("{0}")]
    ScriptExhausted(String),
    /// A script file is unusable.
    #[error("{0}")]
    Script(String),
}
