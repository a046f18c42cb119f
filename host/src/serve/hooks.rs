//! `POST /hooks/{name}`: events a chat platform pushes to a channel (Slack's Events API,
//! Discord's interactions). Outside `/v1` and its tokens: the platform cannot hold one,
//! and proves itself by the signature the channel's hook checks
//! ([`crate::messaging::Hooks`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::app::App;

/// Hands the event to the channel's hook and answers as it says.
pub(super) async fn receive(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = app.hooks.receive(&name, &headers, &body).await;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if answer.body.is_empty() {
        return status.into_response();
    }
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        answer.body,
    )
        .into_response()
}
