//! An OpenAI-compatible Chat Completions provider, streaming its answers.
//!
//! - `wire`: messages as the API's JSON, and a whole completion read back;
//! - `chunks`: a streamed answer's chunks assembled into one completion;
//! - `read`: the response body read within the answer cap, as an event stream or JSON.

mod chunks;
mod read;
mod wire;

use std::time::Duration;

use serde_json::{Value, json};

use super::{
    AnswerSink, BoxFuture, Completion, CompletionRequest, Provider, ProviderError, ToolChoice,
};
/// How a failed request is retried: 429 and 5xx answers and transport errors, with
/// exponential backoff (doubling from `base_delay`, capped at `max_delay`); a `Retry-After`
/// header, when shorter than `max_delay`, wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub attempts: u32,
    /// The wait before the second try.
    pub base_delay: Duration,
    /// The longest wait between tries.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
        }
    }
}

/// The default cap on one answer: its text, tool names, ids and arguments.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 4 << 20;

/// Talks to `{base_url}/chat/completions`, asking for a streamed answer.
///
/// The answer arrives as Server-Sent Events; each text piece and tool-call fragment is
/// reported to the request's [`AnswerSink`] as it arrives, and the tool calls are assembled
/// whole before the completion is returned. A server that ignores `stream` and answers
/// with one JSON body works too. 429 and 5xx answers (and transport failures) before the
/// answer starts are retried per the [`RetryPolicy`]. The provider sets no time limit on
/// an answer (the prompt gate's timers bound the waits) but it does cap the answer's size:
/// reading stops, with [`ProviderError::TooLarge`], once the answer passes
/// [`OpenAiProvider::with_max_answer_bytes`] (default [`DEFAULT_MAX_ANSWER_BYTES`]).
///
/// ```no_run
/// use capstan_host::llm::{OpenAiProvider, RetryPolicy};
///
/// // Reads the key from $OPENAI_API_KEY.
/// let provider = OpenAiProvider::from_env("https://api.openai.com/v1", "OPENAI_API_KEY", "gpt-4o-mini")?
///     .with_max_answer_bytes(1 << 20);
/// # Ok::<(), capstan_host::llm::ProviderError>(())
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    client: reqwest::Client,
    url: String,
    api_key: String,
    model: String,
    retry: RetryPolicy,
    max_answer: usize,
}

impl OpenAiProvider {
    /// A provider for `model` at `base_url`, with `api_key`.
    pub fn new(base_url: &str, api_key: &str, model: &str) -> Result<Self, ProviderError> {
        let base = base_url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ProviderError::Config(format!(
                "provider base_url `{base_url}` must start with http:// or https://"
            )));
        }
        // No overall timeout: a long answer from a slow model is fine as long as it keeps
        // coming, and the prompt gate bounds the first chunk, the gaps and the total.
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|err| ProviderError::Config(format!("cannot build the HTTP client: {err}")))?;
        Ok(OpenAiProvider {
            client,
            url: format!("{base}/chat/completions"),
            api_key: api_key.to_owned(),
            model: model.to_owned(),
            retry: RetryPolicy::default(),
            max_answer: DEFAULT_MAX_ANSWER_BYTES,
        })
    }

    /// [`OpenAiProvider::new`] with the key read from environment variable `key_env`.
    pub fn from_env(base_url: &str, key_env: &str, model: &str) -> Result<Self, ProviderError> {
        let key = std::env::var(key_env).map_err(|_| {
            ProviderError::Config(format!(
                "provider.api_key_env names `{key_env}`, which is not set; export it (any \
                 value works for a local server that needs no key)"
            ))
        })?;
        OpenAiProvider::new(base_url, &key, model)
    }

    /// Uses `retry` instead of the default policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Caps one answer (`limits.max_answer_kib`): its text, tool names, ids and arguments
    /// together. Reading stops as soon as an answer passes it.
    pub fn with_max_answer_bytes(mut self, bytes: usize) -> Self {
        self.max_answer = bytes;
        self
    }

    /// The request body for `request`.
    pub fn body(&self, request: &CompletionRequest) -> Value {
        let messages: Vec<Value> = request.messages.iter().map(wire::message_json).collect();
        let mut body = json!({ "model": self.model, "messages": messages, "stream": true });
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": wire::wire_name(&tool.name),
                            "description": tool.description,
                            "parameters": tool.parameters,
                        }
                    })
                })
                .collect();
            body["tool_choice"] = json!(match request.tool_choice {
                ToolChoice::Auto => "auto",
                ToolChoice::None => "none",
                ToolChoice::Required => "required",
            });
        }
        body
    }

    async fn send(&self, body: &Value, sink: &dyn AnswerSink) -> Result<Completion, ProviderError> {
        let response = self.start(body).await?;
        let reader = read::Reader {
            url: &self.url,
            max_answer: self.max_answer,
        };
        let streamed = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if streamed {
            reader.stream(response, sink).await
        } else {
            reader.json(response, sink).await
        }
    }

    /// Sends the request until it is answered with a success status, retrying as the
    /// policy says; the body is left to read.
    async fn start(&self, body: &Value) -> Result<reqwest::Response, ProviderError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let last = attempt >= self.retry.attempts;
            let response = self
                .client
                .post(&self.url)
                .bearer_auth(&self.api_key)
                .json(body)
                .send()
                .await;
            let response = match response {
                Ok(response) => response,
                Err(err) if !last => {
                    tracing::warn!(url = %self.url, attempt, "provider unreachable, retrying: {err}");
                    tokio::time::sleep(self.backoff(attempt, None)).await;
                    continue;
                }
                Err(err) => {
                    return Err(ProviderError::Unreachable {
                        url: self.url.clone(),
                        attempts: attempt,
                        reason: err.to_string(),
                    });
                }
            };
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            let retryable = status.as_u16() == 429 || status.is_server_error();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            if retryable && !last {
                tracing::warn!(url = %self.url, attempt, status = status.as_u16(), "provider busy, retrying");
                tokio::time::sleep(self.backoff(attempt, retry_after)).await;
                continue;
            }
            return Err(ProviderError::Status {
                url: self.url.clone(),
                status: status.as_u16(),
                attempts: attempt,
                body: read::quoted_error(response).await,
            });
        }
    }

    /// The wait after failed try number `attempt` (1-based).
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let exponential = self
            .retry
            .base_delay
            .saturating_mul(1 << (attempt - 1).min(16))
            .min(self.retry.max_delay);
        match retry_after {
            Some(wait) if wait <= self.retry.max_delay => wait,
            _ => exponential,
        }
    }
}

impl Provider for OpenAiProvider {
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
        sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move { self.send(&self.body(request), sink).await })
    }

    fn name(&self) -> String {
        format!("openai:{}", self.model)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_honors_a_short_retry_after() {
        let provider = OpenAiProvider::new("http://127.0.0.1:9/v1", "k", "m").unwrap();
        assert_eq!(provider.backoff(1, None), Duration::from_millis(500));
        assert_eq!(provider.backoff(3, None), Duration::from_secs(2));
        assert_eq!(provider.backoff(10, None), Duration::from_secs(8));
        assert_eq!(
            provider.backoff(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            provider.backoff(1, Some(Duration::from_secs(600))),
            Duration::from_millis(500)
        );
        assert!(OpenAiProvider::new("ftp://x", "k", "m").is_err());
    }
}
