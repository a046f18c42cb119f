//! How spans leave the host: OTLP/HTTP protobuf, sent by the host's own HTTP client on its
//! runtime, each string the spans carry passed through the log's redactor first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::{KeyValue, Value};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// The largest answer read from a receiver: it says only whether it took the batch.
const MAX_ANSWER: usize = 64 * 1024;

/// How long one batch may take to send.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The exporter to `endpoint` (a base URL, `/v1/traces` added) or, unset, to where the
/// `OTEL_EXPORTER_OTLP_*` variables say.
pub(super) fn exporter(
    endpoint: Option<&str>,
    runtime: tokio::runtime::Handle,
) -> Result<Redacting<opentelemetry_otlp::SpanExporter>, String> {
    let client = reqwest::Client::builder()
        // A receiver answers where it is; a redirect elsewhere is not followed.
        .redirect(reqwest::redirect::Policy::none())
        .timeout(TIMEOUT)
        .build()
        .map_err(|err| format!("cannot make the HTTP client: {err}"))?;
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Sending { client, runtime })
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_timeout(TIMEOUT);
    if let Some(base) = endpoint {
        builder = builder.with_endpoint(format!("{}/v1/traces", base.trim_end_matches('/')));
    }
    let inner = builder.build().map_err(|err| err.to_string())?;
    Ok(Redacting {
        inner,
        failing: AtomicBool::new(false),
    })
}

/// Sends each batch on the host's runtime: the SDK's export thread only waits for it.
#[derive(Debug)]
struct Sending {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Sending {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let request = reqwest::Request::try_from(request)?;
        let sent = self.runtime.spawn(async move {
            let mut response = client.execute(request).await?;
            let mut answer = http::Response::builder().status(response.status());
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                if body.len() + chunk.len() > MAX_ANSWER {
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, HttpError>(answer.body(Bytes::from(body))?)
        });
        sent.await?
    }
}

/// An exporter whose spans' names, attributes, events and status pass the redactor of
/// every value the process hides in its log, before the inner exporter encodes them; the
/// first batch of a run of failed ones is logged, and the batch that ends the run.
#[derive(Debug)]
pub(super) struct Redacting<E> {
    inner: E,
    failing: AtomicBool,
}

impl<E: SpanExporter> SpanExporter for Redacting<E> {
    async fn export(&self, mut batch: Vec<SpanData>) -> OTelSdkResult {
        for span in &mut batch {
            redact_span(span);
        }
        let sent = self.inner.export(batch).await;
        match &sent {
            Err(err) if !self.failing.swap(true, Ordering::Relaxed) => tracing::warn!(
                "spans could not be sent to the OTLP receiver ({err}); they are dropped, and \
                 the next failures are not logged until a batch is sent: check [telemetry] \
                 otlp_endpoint or OTEL_EXPORTER_OTLP_ENDPOINT"
            ),
            Ok(()) if self.failing.swap(false, Ordering::Relaxed) => {
                tracing::warn!("spans are sent to the OTLP receiver again")
            }
            _ => {}
        }
        sent
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

fn redact_span(span: &mut SpanData) {
    if let Some(name) = redacted(&span.name) {
        span.name = name.into();
    }
    redact_all(&mut span.attributes);
    for event in span.events.events.iter_mut() {
        redact_all(&mut event.attributes);
    }
    if let opentelemetry::trace::Status::Error { description } = &mut span.status
        && let Some(text) = redacted(description)
    {
        *description = text.into();
    }
}

fn redact_all(attributes: &mut [KeyValue]) {
    for attribute in attributes {
        if let Value::String(text) = &attribute.value
            && let Some(text) = redacted(text.as_str())
        {
            attribute.value = Value::String(text.into());
        }
    }
}

/// `text` redacted, if anything in it was.
fn redacted(text: &str) -> Option<String> {
    crate::secrets::redacted_for_logs(text)
}
