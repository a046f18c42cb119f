//! Reading an answer's body within the answer cap: an event stream, or one JSON body
//! from a server that does not stream. Nothing here buffers more than the cap (plus one
//! event's or body's envelope): past it, reading stops and the connection is dropped.

use super::chunks::{Assembler, Step};
use super::wire::parse_completion;
use crate::llm::sse::{SseItem, SseParser};
use crate::llm::{AnswerSink, Completion, Delta, ProviderError};

/// What one event, or a whole JSON body, may carry besides the answer itself (ids, the
/// model's name, usage, JSON quoting).
const ENVELOPE: usize = 64 << 10;

/// The most of an error body read, to quote the start of it.
const MAX_ERROR_BODY: usize = 4 << 10;

/// The longest piece of an error body quoted in an error.
const MAX_QUOTED_BODY: usize = 500;

/// Reads answers from `url` capped at `max_answer` bytes.
pub(super) struct Reader<'a> {
    pub(super) url: &'a str,
    pub(super) max_answer: usize,
}

impl Reader<'_> {
    /// A `text/event-stream` answer: each event's delta is reported to `sink` as it
    /// arrives; the answer is complete only at `data: [DONE]`.
    pub(super) async fn stream(
        &self,
        mut response: reqwest::Response,
        sink: &dyn AnswerSink,
    ) -> Result<Completion, ProviderError> {
        let mut events = SseParser::new(self.max_answer.saturating_add(ENVELOPE));
        let mut answer = Assembler::default();
        while let Some(bytes) = self.next_chunk(&mut response).await? {
            let items = events.feed(&bytes).map_err(|_| self.too_large())?;
            for item in items {
                if self.take(item, &mut answer, sink)? == Step::Done {
                    return answer.finish().map_err(|reason| self.bad(reason));
                }
            }
        }
        if let Some(item) = events.finish()
            && self.take(item, &mut answer, sink)? == Step::Done
        {
            return answer.finish().map_err(|reason| self.bad(reason));
        }
        Err(ProviderError::Incomplete {
            url: self.url.to_owned(),
            reason: match answer.finish_reason() {
                Some(reason) => format!(
                    "the stream closed after finish_reason `{reason}` but before `data: [DONE]`"
                ),
                None => "the stream closed before `data: [DONE]`".to_owned(),
            },
        })
    }

    fn take(
        &self,
        item: SseItem,
        answer: &mut Assembler,
        sink: &dyn AnswerSink,
    ) -> Result<Step, ProviderError> {
        match item {
            // A keep-alive: the server is still working on the answer.
            SseItem::Comment => {
                sink.delta(Delta::Progress);
                Ok(Step::More)
            }
            SseItem::Event { kind, data } if kind == "error" => Err(self.bad(format!(
                "the server reported an error mid-answer: {}",
                crate::text::truncate(&data, MAX_QUOTED_BODY)
            ))),
            SseItem::Event { data, .. } => {
                let step = answer
                    .push(&data, sink)
                    .map_err(|reason| self.bad(reason))?;
                if answer.size() > self.max_answer {
                    return Err(self.too_large());
                }
                Ok(step)
            }
        }
    }

    /// A whole JSON body, refused at its `content-length` or as soon as it passes the cap.
    /// Each piece read counts as progress.
    pub(super) async fn json(
        &self,
        mut response: reqwest::Response,
        sink: &dyn AnswerSink,
    ) -> Result<Completion, ProviderError> {
        let limit = self.max_answer.saturating_add(ENVELOPE);
        if response
            .content_length()
            .is_some_and(|length| length > limit as u64)
        {
            return Err(self.too_large());
        }
        let mut body = Vec::new();
        while let Some(bytes) = self.next_chunk(&mut response).await? {
            if body.len() + bytes.len() > limit {
                return Err(self.too_large());
            }
            body.extend_from_slice(&bytes);
            sink.delta(Delta::Progress);
        }
        let text = std::str::from_utf8(&body)
            .map_err(|err| self.bad(format!("the body is not UTF-8: {err}")))?;
        let completion = parse_completion(text).map_err(|reason| self.bad(reason))?;
        let message = &completion.message;
        let size = message.content.len()
            + message
                .tool_calls
                .iter()
                .map(|call| call.id.as_str().len() + call.name.len() + call.arguments.len())
                .sum::<usize>();
        if size > self.max_answer {
            return Err(self.too_large());
        }
        Ok(completion)
    }

    /// The next piece of the body; a connection that breaks mid-answer is an incomplete
    /// answer.
    async fn next_chunk(
        &self,
        response: &mut reqwest::Response,
    ) -> Result<Option<impl std::ops::Deref<Target = [u8]> + use<>>, ProviderError> {
        response
            .chunk()
            .await
            .map_err(|err| ProviderError::Incomplete {
                url: self.url.to_owned(),
                reason: format!("the connection broke mid-answer: {err}"),
            })
    }

    fn too_large(&self) -> ProviderError {
        ProviderError::TooLarge {
            url: self.url.to_owned(),
            limit: self.max_answer,
        }
    }

    fn bad(&self, reason: String) -> ProviderError {
        ProviderError::BadResponse {
            url: self.url.to_owned(),
            reason,
        }
    }
}

/// The start of an error answer's body, read no further than needed to quote it.
pub(super) async fn quoted_error(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match response.chunk().await {
            Ok(Some(bytes)) => body.extend_from_slice(&bytes),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&body);
    crate::text::truncate(text.trim(), MAX_QUOTED_BODY).to_owned()
}
