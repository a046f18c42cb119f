//! `GET /metrics`: the host's Prometheus metrics, behind the same tokens as the API (open
//! only on a loopback server without tokens), through the one way out like every answer.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::app::App;
use crate::telemetry::{CONTENT_TYPE, metrics};

/// The metrics as OpenMetrics text, the figures read at the moment (kept instances, live
/// workers) brought up to date first.
pub(crate) async fn scrape(State(app): State<Arc<App>>) -> impl IntoResponse {
    let metrics = metrics();
    let runtime = &app.runtime;
    metrics.set_warm_instances(runtime.router().registry().host().kept_instances());
    metrics.set_live_workers(runtime.live_workers());
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.render())
}
