//! Ended spans on their way out: a bounded queue of encoded spans that a span joins in
//! one short lock (a copy of its bytes), and a thread of its own that takes the queue
//! whole when a batch is full or a delay has passed, frames it and sends it. A full queue
//! drops spans (counted and logged) rather than hold up the work they describe.
//!
//! A span comes here encoded, by the threads that gave it its fields: its record is then
//! freed where it was made, which the allocator does far more cheaply than a free from
//! another thread (measured on the turn benchmark).

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::export::OtlpHttp;
use super::otlp;

/// Spans enough for one request: the thread is woken when this many wait.
const BATCH: usize = 2048;

/// Bytes of spans enough for one request, whatever their number: spans with content can
/// be large, and receivers bound a request's size (4 MiB is common).
const BATCH_BYTES: usize = 2 << 20;

/// The most spans, and the most bytes of them, that wait; more are dropped until a batch
/// is sent.
const MAX_QUEUED: usize = 4 * BATCH;
const MAX_QUEUED_BYTES: usize = 4 * BATCH_BYTES;

/// The longest a span waits to be sent while fewer than [`BATCH`] do.
const DELAY: Duration = Duration::from_secs(2);

/// Marks the sending thread stopped as it ends, by returning or by a panic, so that no
/// flush waits for it and no span is queued for it.
struct Stopped(&'static Batches);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.lock().stopped = true;
        self.0.sent.notify_all();
    }
}

#[derive(Default)]
struct Queue {
    /// Encoded spans, one after another (`ScopeSpans.spans` entries).
    spans: Vec<u8>,
    /// How many spans `spans` holds.
    count: usize,
    /// Dropped from a full queue since the last batch was taken.
    dropped: u64,
    /// Set once: the thread sends what is left and stops.
    closing: bool,
    /// Set once the thread has stopped, however it stopped (a panic included): no flush
    /// waits for it any longer.
    stopped: bool,
    /// Flushes asked for, and answered: every span queued before the n-th ask is sent
    /// (or given up on) once `flushed` reaches n.
    flushes: u64,
    flushed: u64,
}

/// The queue, shared by every span and the sending thread.
pub(super) struct Batches {
    queue: Mutex<Queue>,
    /// Tells the thread a batch is full, a flush is asked for, or the pipeline closes.
    ready: Condvar,
    /// Tells those who asked for a flush that it is done.
    sent: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Batches {
    /// The queue, with its thread sending every batch through `exporter`.
    pub(super) fn start(exporter: OtlpHttp) -> std::io::Result<&'static Batches> {
        let batches: &'static Batches = Box::leak(Box::new(Batches {
            // Room for a batch from the start: a span joining the queue never waits on
            // the buffer growing.
            queue: Mutex::new(Queue {
                spans: Vec::with_capacity(BATCH_BYTES),
                ..Queue::default()
            }),
            ready: Condvar::new(),
            sent: Condvar::new(),
            thread: Mutex::new(None),
        }));
        let thread = std::thread::Builder::new()
            .name("capstan-traces".into())
            .spawn(move || {
                let _stopped = Stopped(batches);
                // A runtime of the thread's own: the host's may be single-threaded, busy,
                // or gone by the time the last batch is sent.
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => {
                        batches.run(&exporter, &runtime);
                        // A lookup stuck in the runtime's blocking pool must not hold
                        // the process's end.
                        runtime.shutdown_background();
                    }
                    Err(err) => tracing::warn!("spans cannot be sent: no runtime for them: {err}"),
                }
            })?;
        *batches
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(thread);
        Ok(batches)
    }

    /// Queues an ended span, its `Span` message's fields, as one entry of
    /// `ScopeSpans.spans`.
    pub(super) fn push(&self, span: &[u8]) {
        let mut room = [0; 11];
        let head = otlp::entry_head(span.len(), &mut room);
        let mut queue = self.lock();
        if queue.count >= MAX_QUEUED
            || queue.spans.len() + head.len() + span.len() > MAX_QUEUED_BYTES
            || queue.closing
            || queue.stopped
        {
            queue.dropped += 1;
            return;
        }
        let was_full = full(&queue);
        queue.spans.extend_from_slice(head);
        queue.spans.extend_from_slice(span);
        queue.count += 1;
        if !was_full && full(&queue) {
            self.ready.notify_one();
        }
    }

    /// Returns once every span queued before the call has been sent, or its request has
    /// failed (each is bounded by the exporter's timeout).
    pub(super) fn flush(&self) {
        let mut queue = self.lock();
        if queue.stopped {
            return;
        }
        queue.flushes += 1;
        let ticket = queue.flushes;
        self.ready.notify_one();
        let _sent = self
            .sent
            .wait_while(queue, |q| q.flushed < ticket && !q.stopped)
            .unwrap_or_else(PoisonError::into_inner);
    }

    /// Sends what is queued and stops the thread; returns once it has (each request is
    /// bounded by the exporter's timeout), whichever caller closes first.
    pub(super) fn close(&self) {
        self.lock().closing = true;
        self.ready.notify_one();
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::warn!("the thread that sends spans stopped on a panic: spans were lost");
        }
        // A second caller found no thread to join: it waits for the first one's last batch.
        let _stopped = self
            .sent
            .wait_while(self.lock(), |q| !q.stopped)
            .unwrap_or_else(PoisonError::into_inner);
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A span pushed is whole or not there: a panic elsewhere leaves nothing half done.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run(&self, exporter: &OtlpHttp, runtime: &tokio::runtime::Runtime) {
        // Two buffers in turn, each keeping room for a batch, made here: the queue's is
        // never grown from nothing under the lock spans need.
        let mut spare: Vec<u8> = Vec::with_capacity(BATCH_BYTES);
        loop {
            let waiting = |q: &mut Queue| !full(q) && !q.closing && q.flushed == q.flushes;
            let (dropped, closing, flushes) = {
                let mut queue = self.lock();
                if waiting(&mut queue) {
                    queue = self
                        .ready
                        .wait_timeout_while(queue, DELAY, waiting)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                std::mem::swap(&mut queue.spans, &mut spare);
                queue.count = 0;
                let dropped = std::mem::take(&mut queue.dropped);
                (dropped, queue.closing, queue.flushes)
            };
            if dropped > 0 {
                tracing::warn!(
                    "{dropped} spans were dropped: more than {MAX_QUEUED} spans, or {} MiB \
                     of them, waited to be sent (is the OTLP receiver slow?)",
                    MAX_QUEUED_BYTES >> 20
                );
            }
            // A backlog goes as several requests, each no larger than a batch.
            for request in otlp::runs_of_entries(&spare, BATCH_BYTES) {
                exporter.export(request, runtime);
            }
            spare.clear();
            if spare.capacity() > 2 * BATCH_BYTES {
                // A backlog's room is given back.
                spare = Vec::with_capacity(BATCH_BYTES);
            }
            let mut queue = self.lock();
            queue.flushed = flushes;
            self.sent.notify_all();
            if closing {
                return;
            }
        }
    }
}

/// Whether a batch is ready to go, by its number of spans or its size.
fn full(queue: &Queue) -> bool {
    queue.count >= BATCH || queue.spans.len() >= BATCH_BYTES
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::mpsc;
    use std::time::SystemTime;

    use opentelemetry::trace::SpanKind;

    use super::*;
    use crate::telemetry::export::{Target, exporter};
    use crate::telemetry::otlp::EncodedResource;
    use crate::telemetry::record::{SpanIds, SpanRecord};
    use crate::telemetry::sampler::Sampler;

    /// A receiver on loopback that answers 200 to each request and hands its body on.
    fn receiver() -> (String, mpsc::Receiver<Vec<u8>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (bodies, taken) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = BufReader::new(stream.unwrap());
                loop {
                    let mut length = 0;
                    let mut line = String::new();
                    while stream.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                        if let Some(value) = line.to_lowercase().strip_prefix("content-length:") {
                            length = value.trim().parse().unwrap();
                        }
                        line.clear();
                    }
                    if line != "\r\n" {
                        break;
                    }
                    let mut body = vec![0; length];
                    stream.read_exact(&mut body).unwrap();
                    // Handed on before the answer, so the sender's return means it is here.
                    let _ = bodies.send(body);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                    stream.get_mut().write_all(answer).unwrap();
                }
            }
        });
        (url, taken)
    }

    fn span(name: &'static str) -> Vec<u8> {
        let now = SystemTime::now();
        let redactor = Default::default();
        let ids = SpanIds::child_of(None, &Sampler::default());
        let mut record = SpanRecord::open(ids, None, SpanKind::Internal, &[name], now, &redactor);
        record.end(now, &redactor).to_vec()
    }

    fn holds(body: &[u8], name: &str) -> bool {
        body.windows(name.len()).any(|w| w == name.as_bytes())
    }

    #[test]
    fn a_flush_returns_once_the_spans_before_it_are_sent_and_close_sends_the_rest() {
        let (url, bodies) = receiver();
        let target = Target::resolve(Some(&url), |_| None).unwrap();
        let exporter = exporter(target, EncodedResource::new("test")).unwrap();
        let batches = Batches::start(exporter).unwrap();
        batches.push(&span("first span"));
        batches.push(&span("second span"));
        // Far fewer than a batch, and long before the delay: only the flush sends them.
        batches.flush();
        let body = bodies.try_recv().expect("sent before the flush returned");
        assert!(holds(&body, "first span") && holds(&body, "second span"));
        batches.push(&span("last span"));
        batches.close();
        let body = bodies.try_recv().expect("sent before close returned");
        assert!(holds(&body, "last span") && !holds(&body, "first span"));
        // Closed: a span ended now is dropped, and a flush returns at once.
        batches.push(&span("too late"));
        batches.flush();
        assert!(bodies.try_recv().is_err());
    }
}
