//! What leaves the host: the one type a door writes, made only by the [`Redactor`].
//!
//! A door (the HTTP server, `capstan mcp` on stdio, the CLI, the log) writes
//! [`Outbound`] bytes, an [`OutboundBody`] or through an [`OutboundWriter`]; none of them
//! can be built but by a redactor, so no door can send a byte that did not pass it.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::AsyncWrite;

use super::{Redactor, StreamRedactor};

/// Bytes that passed the redactor: the only thing a door sends.
///
/// ```
/// use capstan_host::secrets::Redactor;
///
/// let redactor = Redactor::new([("KEY".parse().unwrap(), "abcdefgh12345".into())]);
/// let out = redactor.outbound("key=abcdefgh12345");
/// assert_eq!(out.as_bytes(), b"key=[redacted secret KEY]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound(Bytes);

impl Outbound {
    /// Made by [`Redactor::outbound`] and the outbound writers, nowhere else.
    pub(super) fn new(bytes: impl Into<Bytes>) -> Self {
        Outbound(bytes.into())
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, to hand to a transport.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

impl Redactor {
    /// `bytes`, redacted, as the one type a door sends.
    pub fn outbound(&self, bytes: impl AsRef<[u8]>) -> Outbound {
        let bytes = bytes.as_ref();
        match self.redact_bytes(bytes) {
            Some(clean) => Outbound::new(clean),
            None => Outbound::new(Bytes::copy_from_slice(bytes)),
        }
    }

    /// `body` redacted as it streams: what an HTTP door serves.
    pub fn outbound_body<B>(&self, body: B) -> OutboundBody<B> {
        OutboundBody {
            inner: body,
            redactor: self.stream(),
            done: false,
        }
    }

    /// `writer`, written to only through this redactor: what a door writing a byte stream
    /// (stdio, a terminal) writes through.
    pub fn outbound_writer<W>(&self, writer: W) -> OutboundWriter<W> {
        OutboundWriter {
            inner: writer,
            redactor: self.stream(),
            pending: Vec::new(),
        }
    }
}

/// A response body redacted as it streams (see [`Redactor::outbound_body`]). A value split
/// across frames is found: the few bytes that could begin one wait for the next frame.
/// Trailers are not passed on.
#[derive(Debug)]
pub struct OutboundBody<B> {
    inner: B,
    redactor: StreamRedactor,
    done: bool,
}

impl<B> Body for OutboundBody<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => {
                    this.done = true;
                    let rest = this.redactor.finish();
                    return Poll::Ready((!rest.is_empty()).then(|| Ok(Frame::data(rest.into()))));
                }
                Some(Err(err)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(err)));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    let safe = this.redactor.push(&data);
                    if !safe.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(safe.into()))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        // Redaction changes lengths: no exact size.
        SizeHint::default()
    }
}

/// A byte stream written only through a redactor (see [`Redactor::outbound_writer`]).
/// A flush passes on everything but the few bytes that could begin a value; a line
/// protocol (JSON-RPC on stdio, a terminal) loses nothing by it, as no value holds a line
/// break. Shutting down passes on the rest.
#[derive(Debug)]
pub struct OutboundWriter<W> {
    inner: W,
    redactor: StreamRedactor,
    /// Redacted bytes not yet taken by `inner`.
    pending: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> OutboundWriter<W> {
    /// Writes what is pending to `inner`.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.pending.drain(..n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for OutboundWriter<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_pending(cx))?;
        let safe = this.redactor.push(buf);
        this.pending = safe;
        // What could not be written now is written before the next write or at a flush.
        let _ = this.poll_pending(cx)?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let rest = this.redactor.finish();
        this.pending.extend(rest);
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// What the process's log and its last words hide: every value any redactor of this
/// process was asked to hide there ([`Redactor::hide_in_logs`]).
static IN_LOGS: std::sync::RwLock<Option<Redactor>> = std::sync::RwLock::new(None);

impl Redactor {
    /// Hides this redactor's values, too, in every log line the process writes through
    /// [`stderr`](super::stderr) (the log's writer too) and in [`for_logs`]'s text. The log is the process's, so this is
    /// too: a value once hidden stays hidden.
    pub fn hide_in_logs(&self) {
        if self.is_empty() {
            return;
        }
        let mut shared = IN_LOGS.write().unwrap_or_else(|e| e.into_inner());
        let both = match shared.take() {
            Some(known) => known.with_redactor(self),
            None => self.clone(),
        };
        *shared = Some(both);
    }
}

/// `text` as the log may show it: every value hidden there redacted.
pub fn for_logs(text: &str) -> Outbound {
    for_logs_bytes(text.as_bytes())
}

/// The redactor of every value hidden in the log, as it is now (none yet: one that
/// changes nothing), for many texts at once.
pub fn log_redactor() -> Redactor {
    // Made once: every span asks for it, and an empty one is a copy of a pointer too.
    static NONE: std::sync::LazyLock<Redactor> = std::sync::LazyLock::new(Redactor::default);
    IN_LOGS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| NONE.clone())
}

/// [`for_logs`] of bytes that need not be UTF-8 (a tool's result piped on): they pass on
/// as they are but for the values redacted.
pub(super) fn for_logs_bytes(bytes: &[u8]) -> Outbound {
    match &*IN_LOGS.read().unwrap_or_else(|e| e.into_inner()) {
        Some(redactor) => redactor.outbound(bytes),
        None => Outbound::new(Bytes::copy_from_slice(bytes)),
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;

    use super::*;

    fn redactor() -> Redactor {
        Redactor::new([("T".parse().unwrap(), "tok-0123456789abcdef".into())])
    }

    #[tokio::test]
    async fn a_body_split_anywhere_is_redacted_whole() {
        let text = b"data: {\"t\":\"tok-0123456789abcdef\"}\n\n";
        for split in 0..text.len() {
            let frames = vec![
                Ok::<_, std::convert::Infallible>(Frame::data(Bytes::copy_from_slice(
                    &text[..split],
                ))),
                Ok(Frame::data(Bytes::copy_from_slice(&text[split..]))),
            ];
            let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
            let out = redactor()
                .outbound_body(body)
                .collect()
                .await
                .unwrap()
                .to_bytes();
            assert_eq!(
                &out[..],
                b"data: {\"t\":\"[redacted secret T]\"}\n\n",
                "split at {split}"
            );
        }
    }

    #[test]
    fn a_value_hidden_in_logs_stays_hidden() {
        let value = "log-only-value-31415926";
        assert_eq!(for_logs(value).as_bytes(), value.as_bytes());
        Redactor::new([("L".parse().unwrap(), value.into())]).hide_in_logs();
        redactor().hide_in_logs();
        assert_eq!(
            for_logs(&format!("got {value}")).as_bytes(),
            b"got [redacted secret L]"
        );
    }

    #[tokio::test]
    async fn a_writer_hides_a_value_written_across_writes() {
        let mut out = Vec::new();
        {
            let mut writer = redactor().outbound_writer(&mut out);
            writer.write_all(b"{\"x\":\"tok-0123").await.unwrap();
            writer.flush().await.unwrap();
            writer.write_all(b"456789abcdef\"}\n").await.unwrap();
            writer.flush().await.unwrap();
            writer.shutdown().await.unwrap();
        }
        assert_eq!(out, b"{\"x\":\"[redacted secret T]\"}\n");
    }
}
