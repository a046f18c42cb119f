//! What the runtime reports as it works: replies for the user and status lines.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::ProcessId;

/// One thing that happened, in order.
///
/// Its JSON form is stable, for services that stream events: an object whose `type` is the
/// variant's name in snake case, with the fields beside it and process ids as text.
///
/// ```
/// use capstan_host::agent::Event;
/// use capstan_host::ids::ProcessId;
///
/// let event = Event::Reply { channel: ProcessId::channel("main"), text: "hi".into() };
/// let json = serde_json::to_string(&event)?;
/// assert_eq!(json, r#"{"type":"reply","channel":"channel:main","text":"hi"}"#);
/// assert_eq!(serde_json::from_str::<Event>(&json)?, event);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    /// The channel replied to the user.
    Reply {
        /// The conversation.
        channel: ProcessId,
        /// The reply.
        text: String,
    },
    /// A piece of a channel's answer, as the model streams it. The whole answer follows
    /// as a [`Event::Reply`] once it is complete; a model that does not stream sends none.
    Text {
        /// The conversation.
        channel: ProcessId,
        /// The text that just arrived.
        text: String,
    },
    /// A process reports progress: started, a tool call, done, failed.
    Status {
        /// e.g. `worker:1`.
        source: ProcessId,
        /// What happened.
        text: String,
    },
    /// A model request of a process got no answer: it failed or timed out. The process
    /// goes on as its kind does (a channel waits for the next input, a worker fails);
    /// `capstan run` exits non-zero when any request failed.
    ModelFailed {
        /// The process whose request failed.
        process: ProcessId,
        /// Why, as the process reports it.
        error: String,
    },
    /// A conversation's history could not be stored after a turn. The messages stay in
    /// memory and the next save rewrites the whole history.
    HistoryNotSaved {
        /// The conversation.
        channel: ProcessId,
        /// What the store said.
        error: String,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Reply { text, .. } | Event::Text { text, .. } => write!(f, "{text}"),
            Event::Status { source, text } => write!(f, "[{source}] {text}"),
            Event::ModelFailed { process, error } => {
                write!(f, "[{process}] the model failed: {error}")
            }
            Event::HistoryNotSaved { channel, error } => {
                write!(f, "[{channel}] the history was not saved: {error}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ProcessKind;

    /// Every variant, with the JSON a client reads; changing one breaks clients.
    fn every_variant() -> Vec<(Event, serde_json::Value)> {
        use serde_json::json;
        let main = ProcessId::channel("main");
        let worker = ProcessId::numbered(ProcessKind::Worker, 3);
        vec![
            (
                Event::Reply {
                    channel: main.clone(),
                    text: "done".into(),
                },
                json!({"type": "reply", "channel": "channel:main", "text": "done"}),
            ),
            (
                Event::Text {
                    channel: main.clone(),
                    text: "do".into(),
                },
                json!({"type": "text", "channel": "channel:main", "text": "do"}),
            ),
            (
                Event::Status {
                    source: worker.clone(),
                    text: "started".into(),
                },
                json!({"type": "status", "source": "worker:3", "text": "started"}),
            ),
            (
                Event::ModelFailed {
                    process: worker,
                    error: "timed out".into(),
                },
                json!({"type": "model_failed", "process": "worker:3", "error": "timed out"}),
            ),
            (
                Event::HistoryNotSaved {
                    channel: main,
                    error: "disk full".into(),
                },
                json!({"type": "history_not_saved", "channel": "channel:main", "error": "disk full"}),
            ),
        ]
    }

    #[test]
    fn every_event_has_a_stable_tagged_json_form_that_round_trips() {
        for (event, expected) in every_variant() {
            let json = serde_json::to_value(&event).unwrap();
            assert_eq!(json, expected);
            assert_eq!(serde_json::from_value::<Event>(json).unwrap(), event);
        }
    }

    #[test]
    fn unknown_types_fields_and_bad_ids_are_refused() {
        for bad in [
            r#"{"type":"shout","channel":"channel:main","text":"x"}"#,
            r#"{"type":"reply","channel":"channel:main","text":"x","extra":1}"#,
            r#"{"type":"reply","channel":"main","text":"x"}"#,
            r#"{"channel":"channel:main","text":"x"}"#,
        ] {
            assert!(serde_json::from_str::<Event>(bad).is_err(), "{bad}");
        }
    }
}
