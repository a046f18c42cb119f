//! The bodies of checked requests: the request body capped while it is sent, the
//! response body capped, redacted and timed while the guest reads it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;
use wasmtime_wasi_http::Error;

use super::log::RequestLog;
use crate::secrets::StreamRedactor;

/// How the error of a response stopped at its body cap begins.
const OVER_BODY_CAP: &str = "capstan stopped this response: its body is over";

/// The message of `err` when it is a response stopped at its body cap (it names the limit
/// and its key), and `None` for any other failure.
pub(crate) fn over_body_cap(err: &Error) -> Option<String> {
    match err {
        Error::InternalError(Some(message)) if message.starts_with(OVER_BODY_CAP) => {
            Some(message.clone())
        }
        _ => None,
    }
}

/// The guest's request body, failing once it passes `cap` bytes.
pub(super) struct CappedRequest<B> {
    pub(super) inner: B,
    pub(super) cap: u64,
    pub(super) sent: Arc<AtomicU64>,
    /// Set when the cap stopped the body, for the error the guest gets.
    pub(super) refused: Arc<std::sync::Mutex<Option<String>>>,
    pub(super) limit_key: String,
}

impl<B> Body for CappedRequest<B>
where
    B: Body<Data = Bytes, Error = Error> + Unpin,
{
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
        {
            let total =
                self.sent.fetch_add(data.len() as u64, Ordering::Relaxed) + data.len() as u64;
            if total > self.cap {
                let message = format!(
                    "capstan refused this request: its body is over the {} KiB limit ({})",
                    self.cap >> 10,
                    self.limit_key
                );
                *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(message.clone());
                return Poll::Ready(Some(Err(Error::InternalError(Some(message)))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body as the guest reads it: at most `cap` bytes, secrets redacted, done
/// before the request's deadline. The request's audit row is written when it ends or is
/// dropped.
pub(super) struct GuardedResponse {
    pub(super) inner: hyper::body::Incoming,
    pub(super) cap: u64,
    pub(super) limit_key: String,
    pub(super) redactor: StreamRedactor,
    pub(super) deadline: Pin<Box<Sleep>>,
    pub(super) timeout_key: String,
    pub(super) received: u64,
    pub(super) done: bool,
    pub(super) log: Option<RequestLog>,
    /// What must live as long as the body: the connection's task and the in-flight slot.
    pub(super) _held: Box<dyn std::any::Any + Send>,
}

impl GuardedResponse {
    fn fail(&mut self, message: String) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.done = true;
        if let Some(log) = self.log.take() {
            log.failed(self.received, &message);
        }
        Poll::Ready(Some(Err(Error::InternalError(Some(message)))))
    }
}

impl Body for GuardedResponse {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => {
                    if this.deadline.as_mut().poll(cx).is_ready() {
                        let message = format!(
                            "capstan stopped this request: the response did not end within \
                             the request timeout ({})",
                            this.timeout_key
                        );
                        return this.fail(message);
                    }
                    return Poll::Pending;
                }
                Poll::Ready(None) => {
                    this.done = true;
                    if let Some(log) = this.log.take() {
                        log.finished(this.received);
                    }
                    let rest = this.redactor.finish();
                    return Poll::Ready(
                        (!rest.is_empty()).then(|| Ok(Frame::data(Bytes::from(rest)))),
                    );
                }
                Poll::Ready(Some(Err(err))) => {
                    return this.fail(format!("the response failed: {err}"));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers are not passed on: they could carry what the body may not.
                        continue;
                    };
                    this.received += data.len() as u64;
                    if this.received > this.cap {
                        let message = format!(
                            "{OVER_BODY_CAP} the {} KiB limit ({})",
                            this.cap >> 10,
                            this.limit_key
                        );
                        return this.fail(message);
                    }
                    let safe = this.redactor.push(&data);
                    if safe.is_empty() {
                        continue;
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(safe)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

impl Drop for GuardedResponse {
    fn drop(&mut self) {
        if let Some(log) = self.log.take() {
            log.finished(self.received);
        }
    }
}
