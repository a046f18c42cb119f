//! An OpenAI-compatible Chat Completions provider.

use std::time::Duration;

use serde_json::{Value, json};

use super::{
    BoxFuture, Completion, CompletionRequest, Message, Provider, ProviderError, Role, ToolCall,
    ToolChoice,
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

/// The longest piece of an error body quoted in an error.
const MAX_QUOTED_BODY: usize = 500;

/// Talks to `{base_url}/chat/completions`.
///
/// ```no_run
/// use capstan_host::llm::{OpenAiProvider, RetryPolicy};
///
/// // Reads the key from $OPENAI_API_KEY.
/// let provider = OpenAiProvider::from_env("https://api.openai.com/v1", "OPENAI_API_KEY", "gpt-4o-mini")?;
/// # Ok::<(), capstan_host::llm::ProviderError>(())
/// ```
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    client: reqwest::Client,
    url: String,
    api_key: String,
    model: String,
    retry: RetryPolicy,
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
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(300))
            .build()
            .map_err(|err| ProviderError::Config(format!("cannot build the HTTP client: {err}")))?;
        Ok(OpenAiProvider {
            client,
            url: format!("{base}/chat/completions"),
            api_key: api_key.to_owned(),
            model: model.to_owned(),
            retry: RetryPolicy::default(),
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

    /// The request body for `request`.
    pub fn body(&self, request: &CompletionRequest) -> Value {
        let messages: Vec<Value> = request.messages.iter().map(message_json).collect();
        let mut body = json!({ "model": self.model, "messages": messages });
        if !request.tools.is_empty() {
            body["tools"] = request
                .tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "function": {
                            "name": tool.name,
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

    async fn send(&self, body: &Value) -> Result<Completion, ProviderError> {
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
                let text = response
                    .text()
                    .await
                    .map_err(|err| ProviderError::BadResponse {
                        url: self.url.clone(),
                        reason: err.to_string(),
                    })?;
                return parse_completion(&text).map_err(|reason| ProviderError::BadResponse {
                    url: self.url.clone(),
                    reason,
                });
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
            let body = response.text().await.unwrap_or_default();
            let body = crate::text::truncate(body.trim(), MAX_QUOTED_BODY).to_owned();
            return Err(ProviderError::Status {
                url: self.url.clone(),
                status: status.as_u16(),
                attempts: attempt,
                body,
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
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move { self.send(&self.body(request)).await })
    }

    fn name(&self) -> String {
        format!("openai:{}", self.model)
    }
}

fn message_json(message: &Message) -> Value {
    let role = match message.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut value = json!({ "role": role, "content": message.content });
    if !message.tool_calls.is_empty() {
        if message.content.is_empty() {
            value["content"] = Value::Null;
        }
        value["tool_calls"] = message
            .tool_calls
            .iter()
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": { "name": call.name, "arguments": call.arguments },
                })
            })
            .collect();
    }
    if let Some(id) = &message.tool_call_id {
        value["tool_call_id"] = json!(id);
    }
    value
}

/// Reads `choices[0].message` and `usage.total_tokens`. Tool-call arguments are kept as
/// the model wrote them, valid JSON or not.
fn parse_completion(text: &str) -> Result<Completion, String> {
    let value: Value = serde_json::from_str(text).map_err(|err| format!("not JSON: {err}"))?;
    let message = value
        .pointer("/choices/0/message")
        .ok_or("no choices[0].message")?;
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut tool_calls = Vec::new();
    for (i, call) in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let name = call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .ok_or(format!("tool_calls[{i}] has no function.name"))?;
        let arguments = match call.pointer("/function/arguments") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Null) | None => "{}".to_owned(),
            // Some servers send the object itself rather than its JSON text.
            Some(other) => other.to_string(),
        };
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("call_{i}"));
        tool_calls.push(ToolCall {
            id,
            name: name.to_owned(),
            arguments,
        });
    }
    let tokens = value
        .pointer("/usage/total_tokens")
        .and_then(Value::as_u64)
        .map(|n| n as u32);
    Ok(Completion {
        message: Message {
            role: Role::Assistant,
            content,
            tool_calls,
            tool_call_id: None,
        },
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_tool_calls_parse_and_malformed_arguments_are_kept_verbatim() {
        let text = r#"{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[
            {"id":"a","type":"function","function":{"name":"file_read","arguments":"{\"path\":\"x\"}"}},
            {"id":"b","type":"function","function":{"name":"file_list","arguments":"{not json"}}]}}],
            "usage":{"total_tokens":42}}"#;
        let completion = parse_completion(text).unwrap();
        let calls = &completion.message.tool_calls;
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, r#"{"path":"x"}"#);
        assert_eq!(calls[1].arguments, "{not json");
        assert_eq!(completion.tokens, Some(42));
        assert!(
            parse_completion(r#"{"error":"x"}"#)
                .unwrap_err()
                .contains("choices")
        );
    }

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
