//! Streamed Chat Completions chunks assembled into one completion.
//!
//! Each `data:` event of the stream is a `chat.completion.chunk`: `choices[0].delta`
//! carries a piece of `content` and pieces of `tool_calls`, each naming the call it
//! belongs to by `index`, with its `id` and `function.name` first and `function.arguments`
//! in fragments to concatenate. The stream ends with `data: [DONE]`; a stream that stops
//! before it is an error, never a shorter answer.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::llm::{AnswerSink, Completion, Delta, Message, Role, ToolCall, Usage};

/// What each tool call costs against the answer cap besides its text, so that a stream of
/// empty calls cannot grow without bound.
const CALL_OVERHEAD: usize = 64;

/// The answer so far.
#[derive(Debug, Default)]
pub(super) struct Assembler {
    content: String,
    /// By the `index` the stream gives each call.
    calls: BTreeMap<u64, PartialCall>,
    tokens: Option<u32>,
    usage: Usage,
    finish_reason: Option<String>,
    size: usize,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// After one event: more to come, or the end.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    More,
    Done,
}

impl Assembler {
    /// Takes the data of one event, reporting what it added to `sink`.
    pub(super) fn push(&mut self, data: &str, sink: &dyn AnswerSink) -> Result<Step, String> {
        if data.trim() == "[DONE]" {
            return Ok(Step::Done);
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|err| format!("an event is not JSON ({err}): {}", quote(data)))?;
        if let Some(error) = chunk.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| error.to_string());
            return Err(format!(
                "the server reported an error mid-answer: {}",
                quote(&message)
            ));
        }
        let (tokens, usage) = super::wire::usage_of(&chunk);
        self.tokens = tokens.or(self.tokens);
        self.usage.input = usage.input.or(self.usage.input);
        self.usage.output = usage.output.or(self.usage.output);
        let mut reported = false;
        if let Some(choice) = chunk.pointer("/choices/0") {
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            if let Some(text) = delta.get("content").and_then(Value::as_str)
                && !text.is_empty()
            {
                self.content.push_str(text);
                self.size += text.len();
                sink.delta(Delta::Text(text.to_owned()));
                reported = true;
            }
            for (position, fragment) in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .enumerate()
            {
                let index = self.call_index(fragment, position)?;
                let ordinal = self.calls.range(..index).count();
                self.call_fragment(index, fragment);
                sink.delta(Delta::ToolCall { index: ordinal });
                reported = true;
            }
        }
        if !reported {
            sink.delta(Delta::Progress);
        }
        Ok(Step::More)
    }

    /// Which call a fragment belongs to: its `index`, else (for servers that leave it out)
    /// a new call when it brings an id not seen yet, else the last call.
    fn call_index(&self, fragment: &Value, position: usize) -> Result<u64, String> {
        if let Some(index) = fragment.get("index") {
            return index
                .as_u64()
                .ok_or_else(|| format!("a tool call's index is not a number: {index}"));
        }
        let last = self.calls.keys().next_back().copied();
        match fragment.get("id").and_then(Value::as_str) {
            Some(id) if !self.calls.values().any(|call| call.id == id) => {
                Ok(last.map_or(position as u64, |last| last + 1))
            }
            _ => Ok(last.unwrap_or(position as u64)),
        }
    }

    fn call_fragment(&mut self, index: u64, fragment: &Value) {
        let call = self.calls.entry(index).or_insert_with(|| {
            self.size += CALL_OVERHEAD;
            PartialCall::default()
        });
        if let Some(id) = fragment.get("id").and_then(Value::as_str)
            && call.id.is_empty()
        {
            call.id = id.to_owned();
            self.size += id.len();
        }
        let function = fragment.get("function").unwrap_or(&Value::Null);
        if let Some(name) = function.get("name").and_then(Value::as_str) {
            call.name.push_str(name);
            self.size += name.len();
        }
        let arguments = match function.get("arguments") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Null) | None => String::new(),
            // Some servers send the object itself rather than its JSON text.
            Some(other) => other.to_string(),
        };
        call.arguments.push_str(&arguments);
        self.size += arguments.len();
    }

    /// The bytes of text, names, ids and arguments taken so far (what the answer cap
    /// bounds).
    pub(super) fn size(&self) -> usize {
        self.size
    }

    /// The whole answer, after `[DONE]`.
    pub(super) fn finish(self) -> Result<Completion, String> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (i, call) in self.calls.into_values().enumerate() {
            if call.name.is_empty() {
                return Err(format!("streamed tool call {i} has no function.name"));
            }
            tool_calls.push(ToolCall {
                id: if call.id.is_empty() {
                    format!("call_{i}").into()
                } else {
                    call.id.into()
                },
                name: super::wire::tool_name(&call.name),
                // A call without arguments streams none; the host expects an object.
                arguments: if call.arguments.is_empty() {
                    "{}".to_owned()
                } else {
                    call.arguments
                },
            });
        }
        Ok(Completion {
            message: Message {
                role: Role::Assistant,
                content: self.content,
                tool_calls,
                tool_call_id: None,
                key: None,
                label: Default::default(),
                held: None,
            },
            tokens: self.tokens,
            usage: self.usage,
        })
    }

    /// Why the stream ended, if the server said: `stop`, `length`, `tool_calls`.
    pub(super) fn finish_reason(&self) -> Option<&str> {
        self.finish_reason.as_deref()
    }
}

/// The start of `text`, for an error.
fn quote(text: &str) -> String {
    let short = crate::text::truncate(text, 200);
    if short.len() < text.len() {
        format!("{short}...")
    } else {
        short.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;

    #[derive(Default)]
    struct Deltas(Mutex<Vec<Delta>>);

    impl AnswerSink for Deltas {
        fn delta(&self, delta: Delta) {
            self.0.lock().unwrap().push(delta);
        }
    }

    fn chunk(delta: Value) -> String {
        json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
            .to_string()
    }

    #[test]
    fn text_and_interleaved_tool_call_fragments_assemble_in_order() {
        let deltas = Deltas::default();
        let mut answer = Assembler::default();
        let events = [
            chunk(json!({"role": "assistant", "content": ""})),
            chunk(json!({"content": "Reading "})),
            chunk(json!({"content": "both."})),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "file_", "arguments": ""}}]}),
            ),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"name": "read"}}]})),
            chunk(
                json!({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "file_list", "arguments": "{\"pa"}}]}),
            ),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\""}}]})),
            chunk(json!({"tool_calls": [{"index": 1, "function": {"arguments": "th\":\".\"}"}}]})),
            chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": ":\"a\"}"}}]})),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
                .to_string(),
            json!({"choices": [], "usage": {"total_tokens": 99}}).to_string(),
        ];
        for event in &events {
            assert_eq!(answer.push(event, &deltas).unwrap(), Step::More);
        }
        assert_eq!(answer.push("[DONE]", &deltas).unwrap(), Step::Done);
        assert_eq!(answer.finish_reason(), Some("tool_calls"));
        let completion = answer.finish().unwrap();
        assert_eq!(completion.message.content, "Reading both.");
        assert_eq!(completion.tokens, Some(99));
        assert_eq!(
            completion.message.tool_calls,
            [
                ToolCall {
                    id: "a".into(),
                    name: "file_read".into(),
                    arguments: r#"{"path":"a"}"#.into()
                },
                ToolCall {
                    id: "b".into(),
                    name: "file_list".into(),
                    arguments: r#"{"path":"."}"#.into()
                },
            ]
        );
        let deltas = deltas.0.into_inner().unwrap();
        assert_eq!(
            deltas[..3],
            [
                Delta::Progress,
                Delta::Text("Reading ".into()),
                Delta::Text("both.".into())
            ]
        );
        assert_eq!(deltas[5], Delta::ToolCall { index: 1 });
        assert_eq!(deltas.len(), events.len(), "one delta per event");
    }

    #[test]
    fn calls_without_an_index_are_told_apart_by_id() {
        let mut answer = Assembler::default();
        for delta in [
            json!({"tool_calls": [{"id": "x", "function": {"name": "a", "arguments": "{"}}]}),
            json!({"tool_calls": [{"function": {"arguments": "}"}}]}),
            json!({"tool_calls": [{"id": "y", "function": {"name": "b"}}]}),
        ] {
            answer.push(&chunk(delta), &()).unwrap();
        }
        let calls = answer.finish().unwrap().message.tool_calls;
        assert_eq!(
            calls
                .iter()
                .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
                .collect::<Vec<_>>(),
            [("x", "a", "{}"), ("y", "b", "{}")]
        );
    }

    #[test]
    fn errors_bad_events_and_nameless_calls_are_refused_with_the_reason() {
        let mut answer = Assembler::default();
        let err = answer
            .push(r#"{"error": {"message": "model overloaded"}}"#, &())
            .unwrap_err();
        assert!(err.contains("model overloaded"), "{err}");
        let err = answer.push("{not json", &()).unwrap_err();
        assert!(
            err.contains("not JSON") && err.contains("{not json"),
            "{err}"
        );
        answer
            .push(
                &chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})),
                &(),
            )
            .unwrap();
        let err = answer.finish().unwrap_err();
        assert!(err.contains("no function.name"), "{err}");
    }

    #[test]
    fn the_size_counts_text_names_arguments_and_each_call() {
        let mut answer = Assembler::default();
        answer
            .push(&chunk(json!({"content": "abcd"})), &())
            .unwrap();
        assert_eq!(answer.size(), 4);
        for index in 0..10 {
            answer
                .push(&chunk(json!({"tool_calls": [{"index": index}]})), &())
                .unwrap();
        }
        assert_eq!(answer.size(), 4 + 10 * CALL_OVERHEAD);
    }
}
