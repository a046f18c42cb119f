//! [`OutputCapture`]: a guest's stdout and stderr, kept up to a bound to explain a trap,
//! and emptied before each call of a reused instance.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// What one write may offer at most; the guest is told it may write this much at once.
const WRITE_BUDGET: usize = 64 * 1024;

/// The first `capacity` bytes a guest writes; the rest are accepted and dropped, so a
/// guest that writes a lot is never failed for it. Clones share the buffer.
#[derive(Debug, Clone)]
pub(crate) struct OutputCapture {
    capacity: usize,
    buffer: Arc<Mutex<BytesMut>>,
}

impl OutputCapture {
    /// An empty capture keeping at most `capacity` bytes.
    pub(crate) fn new(capacity: usize) -> Self {
        OutputCapture {
            capacity,
            buffer: Arc::default(),
        }
    }

    /// What was kept so far.
    pub(crate) fn contents(&self) -> Bytes {
        self.lock().clone().freeze()
    }

    /// Forgets what was kept: the next call starts with an empty capture.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    fn keep(&self, bytes: &[u8]) {
        let mut buffer = self.lock();
        let room = self.capacity.saturating_sub(buffer.len());
        buffer.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BytesMut> {
        // Only `keep` and `clear` hold it, and neither panics while holding it.
        self.buffer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl IsTerminal for OutputCapture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for OutputCapture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl OutputStream for OutputCapture {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.keep(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(WRITE_BUDGET)
    }
}

#[async_trait::async_trait]
impl Pollable for OutputCapture {
    async fn ready(&mut self) {}
}

impl AsyncWrite for OutputCapture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.keep(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_accepts_the_rest_and_clears() {
        let mut capture = OutputCapture::new(4);
        capture.write(Bytes::from_static(b"abc")).unwrap();
        capture.write(Bytes::from_static(b"defg")).unwrap();
        assert_eq!(&capture.contents()[..], b"abcd");
        assert_eq!(capture.check_write().unwrap(), WRITE_BUDGET);
        capture.clear();
        capture.write(Bytes::from_static(b"xy")).unwrap();
        assert_eq!(&capture.contents()[..], b"xy");
    }
}
