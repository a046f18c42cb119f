//! Messages sent again with an idempotency key their conversation took before: answered
//! again, never taken again.
//!
//! The key rests with the message in the conversation's history, so this holds across a
//! restart of the host and across hosts sharing a store: whoever answers the conversation
//! reads the same history.

use std::collections::HashSet;
use std::sync::Arc;

use super::audience::Audience;
use super::exchange::{End, Exchange, ReplyPart, answer_of};
use super::inbox::ChannelInput;
use super::reporter::Reporter;
use crate::ids::MessageKey;
use crate::llm::{Message, Role};
use crate::tools::HostCall;

/// Takes out of `inputs` the messages whose key `history` holds already, or `audience`
/// knows (its exchange is under way, or ended lately: its message may have been compacted
/// since), or an earlier input of the batch has; in order.
pub(crate) fn take_repeated(
    inputs: &mut Vec<ChannelInput>,
    history: &[Message],
    audience: &Audience,
) -> Vec<ChannelInput> {
    let mut seen: HashSet<MessageKey> = HashSet::new();
    let (repeated, taken) = std::mem::take(inputs).into_iter().partition(|input| {
        let Some(key) = input.key() else { return false };
        let before = seen.contains(key)
            || audience.knows(key)
            || history.iter().any(|m| m.key.as_ref() == Some(key));
        seen.insert(key.clone());
        before
    });
    *inputs = taken;
    repeated
}

/// Answers `input`, a message sent again with a key its conversation took: its exchange,
/// or the host that forwarded it, gets the answer that key got.
pub(crate) fn answer_repeated(
    reporter: &Arc<Reporter>,
    audience: &Audience,
    history: &[Message],
    input: ChannelInput,
) {
    let ChannelInput::User {
        key: Some(key),
        forwarded,
        exchange,
        ..
    } = input
    else {
        return;
    };
    // The history in memory is as the model saw it: what is told again is redacted.
    let stored = || {
        stored_answer(history, &key)
            .into_iter()
            .map(|reply| reporter.redactor().redact_owned(reply))
            .collect()
    };
    if let Some(listener) = exchange {
        audience.repeat(*listener, stored);
    }
    if let Some(number) = forwarded {
        // The host that forwarded it waits for an answer, as for the first.
        let (listener, mut relay) = Exchange::new(Some(key.clone()));
        audience.repeat(listener, stored);
        let reporter = reporter.clone();
        tokio::spawn(async move {
            let mut replies = Vec::new();
            let mut end = End::Lost;
            while let Some(part) = relay.next().await {
                match part {
                    ReplyPart::Reply { text, .. } => replies.push(text),
                    ReplyPart::End(ended) => end = ended,
                    _ => {}
                }
            }
            let answer = answer_of(&replies, &end, reporter.redactor());
            reporter.answer_forwarded(vec![(number, answer)]).await;
        });
    }
}

/// The replies `history` holds for the message with `key`: the texts the assistant
/// answered with, and those it sent with `reply`, up to the next keyed message.
pub(crate) fn stored_answer(history: &[Message], key: &MessageKey) -> Vec<String> {
    let Some(at) = history.iter().position(|m| m.key.as_ref() == Some(key)) else {
        return Vec::new();
    };
    let mut replies = Vec::new();
    for message in &history[at + 1..] {
        match message.role {
            Role::User if message.key.is_some() => break,
            Role::Assistant if message.tool_calls.is_empty() => {
                replies.extend(
                    Some(&message.content)
                        .filter(|text| !text.trim().is_empty())
                        .cloned(),
                );
            }
            Role::Assistant => {
                for call in &message.tool_calls {
                    if let Some(Ok(HostCall::Reply(args))) =
                        HostCall::parse(&call.name, &call.arguments)
                    {
                        replies.push(args.text);
                    }
                }
            }
            _ => {}
        }
    }
    replies
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::ToolCall;

    fn keyed(text: &str, key: &str) -> Message {
        Message {
            key: Some(key.parse().unwrap()),
            ..Message::user(text)
        }
    }

    #[test]
    fn the_stored_answer_is_the_replies_up_to_the_next_keyed_message() {
        let history = vec![
            keyed("first", "k1"),
            Message {
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "reply".into(),
                    arguments: r#"{"text":"on it"}"#.into(),
                }],
                ..Message::assistant("thinking")
            },
            Message::tool_result("c1", "delivered"),
            Message::user("[worker:1] finished (done): found it"),
            Message::assistant("It is found."),
            keyed("second", "k2"),
            Message::assistant("Second answer."),
        ];
        assert_eq!(
            stored_answer(&history, &"k1".parse().unwrap()),
            ["on it", "It is found."]
        );
        assert_eq!(
            stored_answer(&history, &"k2".parse().unwrap()),
            ["Second answer."]
        );
        assert!(stored_answer(&history, &"k3".parse().unwrap()).is_empty());
    }

    #[test]
    fn a_key_seen_in_the_history_or_earlier_in_the_batch_is_taken_out() {
        let history = vec![keyed("first", "k1")];
        let input = |text: &str, key: Option<&str>| ChannelInput::User {
            text: text.into(),
            key: key.map(|k| k.parse().unwrap()),
            forwarded: None,
            exchange: None,
            trace: crate::telemetry::TraceParent::none(),
            label: crate::flow::Label::trusted(),
        };
        let mut inputs = vec![
            input("first again", Some("k1")),
            input("new", Some("k2")),
            input("plain", None),
            input("new again", Some("k2")),
        ];
        let repeated = take_repeated(&mut inputs, &history, &Audience::default());
        let texts = |inputs: &[ChannelInput]| -> Vec<String> {
            inputs
                .iter()
                .map(|i| match i {
                    ChannelInput::User { text, .. } => text.clone(),
                    _ => String::new(),
                })
                .collect()
        };
        assert_eq!(texts(&repeated), ["first again", "new again"]);
        assert_eq!(texts(&inputs), ["new", "plain"]);
    }
}
