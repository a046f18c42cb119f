//! `GET /v1/events`: the runtime's events as Server-Sent Events, for one conversation or
//! all, resumable with `Last-Event-ID` while the events are still buffered; a client that
//! cannot resume (the server restarted, or the events after its id are gone) is told so
//! by a `reset` event, never left with a silent stream.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::Stream;
use serde::Deserialize;
use utoipa::IntoParams;

use super::app::App;
use super::auth::Caller;
use super::error::{ApiError, ApiQuery, ErrorBody};
use super::hub::{EventHub, EventId, Next, Published, ResetReason, Subscription};
use crate::config::TokenScope;
use crate::ids::{ProcessId, ProcessKind};

/// Which events.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Only this conversation's events (its own, and its workers', branches' and
    /// compactions'), e.g. `main`.
    channel: Option<String>,
    /// The kind of `channel`: `channel` (default) or `cortex`.
    kind: Option<String>,
    /// Start after this event id (`RUN-N`, as the stream's `id` fields give it), as
    /// `Last-Event-ID` does (the header wins).
    after: Option<String>,
}

/// `GET /v1/events`: a Server-Sent Events stream. Each message's `event` is the event's
/// `type` (`reply`, `text`, `tool_called`, `worker_started`, ...), its `id` the run of the
/// server and the event's number (`RUN-N`) and its `data` the event as JSON. A client that
/// reconnects with `Last-Event-ID` gets every event after it that is still buffered. One
/// that cannot resume (an id of another run of the server, as after a restart, or of no
/// run; an id past the newest event; events after it already gone) first gets a `reset`
/// message (`{"type":"reset","reason":"another_run"|"future"|"evicted"}`), then live
/// events: it should read the state again. A client that falls behind while connected is
/// told how many events it missed by a `lost` message. Without a cortex scope (`admin`),
/// events of the admin chat are left out.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event (`RUN-N`)")),
    responses((status = 200, content_type = "text/event-stream", description = "The stream"),
        (status = 400, body = ErrorBody, description = "Bad input; the message names the field and what it takes")))]
pub(crate) async fn events(
    State(app): State<Arc<App>>,
    caller: Caller,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let seen = match headers.get("last-event-id") {
        Some(value) => Some(value.to_str().unwrap_or("\u{fffd}").to_owned()),
        None => query.after.clone(),
    };
    let resume = match seen.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => match text.parse::<EventId>() {
            Ok(id) => app.hub.resume(id).map(Some),
            // A bare number is an id of the runs before ids carried their run.
            Err(()) if text.parse::<u64>().is_ok() => Err(ResetReason::AnotherRun),
            Err(()) => {
                return Err(ApiError::invalid(
                    "Last-Event-ID (or `after`) is not an event id: it is `RUN-N`, as the \
                     stream's `id` fields give it",
                ));
            }
        },
    };
    let only = match &query.channel {
        None => None,
        Some(name) => {
            let kind = match query.kind.as_deref() {
                None | Some("channel") => ProcessKind::Channel,
                Some("cortex") => ProcessKind::Cortex,
                Some(_) => {
                    return Err(ApiError::invalid("`kind` is `channel` or `cortex`").param("kind"));
                }
            };
            Some(
                ProcessId::conversation(kind, name)
                    .map_err(|msg| ApiError::invalid(msg).param("channel"))?,
            )
        }
    };
    if only
        .as_ref()
        .is_some_and(|c| c.kind() == ProcessKind::Cortex)
    {
        caller.require(TokenScope::Admin)?;
    }
    let filter = Filter {
        only,
        cortex: caller.scope >= TokenScope::Admin,
    };
    let (subscription, reset) = match resume {
        Ok(after) => (app.hub.subscribe(after), None),
        Err(reason) => (app.hub.subscribe(None), Some(reason)),
    };
    let first = reset.map(|reason| {
        SseEvent::default()
            .id(app.hub.id(subscription.cursor()).to_string())
            .event("reset")
            .data(format!(
                r#"{{"type":"reset","reason":"{}"}}"#,
                reason.as_str()
            ))
    });
    let stream = futures_util::stream::unfold(
        (subscription, filter, first, app.hub.clone()),
        |(mut subscription, filter, first, hub)| async move {
            if let Some(reset) = first {
                return Some((Ok(reset), (subscription, filter, None, hub)));
            }
            let message = next_message(&mut subscription, &filter, &hub).await?;
            Some((Ok(message), (subscription, filter, None, hub)))
        },
    );
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

struct Filter {
    only: Option<ProcessId>,
    /// Whether the admin chat's events may be sent.
    cortex: bool,
}

impl Filter {
    fn admits(&self, published: &Published) -> bool {
        let conversation = published.conversation.as_ref();
        if !self.cortex && conversation.is_some_and(|c| c.kind() == ProcessKind::Cortex) {
            return false;
        }
        match &self.only {
            None => true,
            Some(only) => conversation == Some(only),
        }
    }
}

async fn next_message(
    subscription: &mut Subscription,
    filter: &Filter,
    hub: &EventHub,
) -> Option<SseEvent> {
    loop {
        match subscription.next().await? {
            Next::Lost { count } => {
                return Some(
                    SseEvent::default()
                        .id(hub.id(subscription.cursor()).to_string())
                        .event("lost")
                        .data(format!(r#"{{"type":"lost","count":{count}}}"#)),
                );
            }
            Next::Event(published) if filter.admits(&published) => {
                return Some(
                    SseEvent::default()
                        .id(hub.id(published.id).to_string())
                        .event(event_type(&published.json))
                        .data(published.json.as_str()),
                );
            }
            Next::Event(_) => {}
        }
    }
}

/// The `type` of an event's JSON form.
fn event_type(json: &str) -> String {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Typed>(json)
        .map(|t| t.kind)
        .unwrap_or_else(|_| "event".to_owned())
}
