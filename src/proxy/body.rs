//! The response body adapter: polls the upstream body, feeds the translator, yields frames, records metrics.
//!
//! No task or channel per stream: the client connection polls this body only when it can write, so a slow
//! client stops the reads from the upstream socket (backpressure) and nothing is buffered beyond one frame.
//! How the stream ended (completed, upstream error, client gone) is recorded exactly once, on drop at the latest.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use tokio::time::Sleep;

use super::conn::Flushes;
use super::dedicated::UpstreamIncoming;
use super::forward::UpstreamErrorKind;
use super::metrics::Metrics;
use super::negotiate::Mode;
use super::observe::StreamObserver;
use crate::sse::encoder::KEEPALIVE;
use crate::translate::{StreamEnd, Translator};

/// Error type of response bodies: an upstream failure in a pass-through body aborts the client response.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: a small body made by the gateway, or an upstream body passed on or translated.
pub enum ResponseBody {
    Full(Full<Bytes>),
    Upstream(Box<GatewayBody>),
}

impl ResponseBody {
    pub fn full(b: impl Into<Bytes>) -> Self {
        ResponseBody::Full(Full::new(b.into()))
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            ResponseBody::Full(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(|e: Infallible| match e {}))),
            ResponseBody::Upstream(b) => Pin::new(&mut **b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(b) => b.is_end_stream(),
            ResponseBody::Upstream(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(b) => b.size_hint(),
            ResponseBody::Upstream(b) => b.size_hint(),
        }
    }
}

/// How a stream ended; the `outcome` label. Recorded exactly once per stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    UpstreamError,
    ClientGone,
}

impl Outcome {
    /// In declaration order, so `o as usize` indexes it.
    pub const ALL: [Outcome; 3] = [Outcome::Completed, Outcome::UpstreamError, Outcome::ClientGone];

    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::UpstreamError => "upstream_error",
            Outcome::ClientGone => "client_gone",
        }
    }
}

/// What the adapter knows about the stream it carries.
pub struct StreamInfo {
    pub mode: Mode,
    /// A `text/event-stream` response: stream metrics and the end-of-stream log line apply.
    pub event_stream: bool,
    /// When the request arrived (downstream time to first byte).
    pub request_start: Instant,
    /// The request's span, for the end-of-stream log line.
    pub span: tracing::Span,
}

/// Keepalive state of a translated stream.
struct Keepalive {
    interval: Duration,
    sleep: Pin<Box<Sleep>>,
    last_output: Instant,
}

/// Ends a stream whose upstream has sent nothing for `limit`.
struct IdleTimeout {
    limit: Duration,
    sleep: Pin<Box<Sleep>>,
    last_input: Instant,
}

enum State {
    Streaming,
    /// The upstream ended; `None` next.
    Done,
}

/// How long an aborting pass-through body waits for what it already yielded to be flushed to the client. hyper
/// drops its unwritten buffer when a body fails, so the abort waits for the connection's next flush (HTTP/1
/// flushes at once; an HTTP/2 connection only when it has frames to write, hence a bound).
const ABORT_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// A pass-through abort held back until the client connection has flushed.
struct Aborting {
    error: BodyError,
    flushes: Arc<Flushes>,
    epoch: u64,
    wait: Pin<Box<Sleep>>,
}

/// An upstream poll's result kept for the next poll: the end, an error or trailers met while gathering data.
type Deferred = Option<Option<Result<Frame<Bytes>, hyper::Error>>>;

/// The adapter over one upstream response body.
pub struct GatewayBody {
    /// Dropped as soon as the stream ends, so the upstream connection is released (or closed) at once.
    inner: Option<UpstreamIncoming>,
    /// Present in translate and shadow modes.
    translator: Option<Box<Translator<StreamObserver>>>,
    info: StreamInfo,
    metrics: Arc<Metrics>,
    keepalive: Option<Keepalive>,
    idle: Option<IdleTimeout>,
    /// What the upstream body returned after the frames gathered into the last client frame.
    deferred: Deferred,
    /// Upstream bytes read but not yet translated: one read's output stops at `TRANSLATED_FRAME_LIMIT`, and the
    /// rest is translated at the next poll, before the upstream is read again.
    carry: Option<Bytes>,
    state: State,
    outcome: Option<Outcome>,
    /// The client connection's flushes, for `aborting`.
    flushes: Option<Arc<Flushes>>,
    aborting: Option<Aborting>,
    started: Instant,
    first_byte_sent: bool,
    bytes_in: u64,
    bytes_out: u64,
}

impl GatewayBody {
    /// Wraps `inner`. `translator` must be given in translate and shadow modes; `keepalive` applies to
    /// translate mode only (shadow and pass-through streams stay byte-identical).
    pub fn new(
        inner: UpstreamIncoming,
        translator: Option<Translator<StreamObserver>>,
        info: StreamInfo,
        metrics: Arc<Metrics>,
        keepalive: Option<Duration>,
    ) -> Self {
        let now = Instant::now();
        let keepalive = match (info.mode, keepalive) {
            (Mode::Translate, Some(interval)) if !interval.is_zero() => Some(Keepalive {
                interval,
                sleep: Box::pin(tokio::time::sleep(interval)),
                last_output: now,
            }),
            _ => None,
        };
        if info.event_stream {
            metrics.mode(info.mode).active_streams.inc();
        }
        Self {
            inner: Some(inner),
            translator: translator.map(Box::new),
            info,
            metrics,
            keepalive,
            idle: None,
            deferred: None,
            carry: None,
            state: State::Streaming,
            outcome: None,
            flushes: None,
            aborting: None,
            started: now,
            first_byte_sent: false,
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    /// Ends the event stream with an `upstream_error` when the upstream is silent for `limit`.
    pub fn with_idle_timeout(mut self, limit: Option<Duration>) -> Self {
        if let (Some(limit), true) = (limit, self.info.event_stream) {
            self.idle = Some(IdleTimeout {
                limit,
                sleep: Box::pin(tokio::time::sleep(limit)),
                last_input: Instant::now(),
            });
        }
        self
    }

    /// Lets a pass-through abort wait for the client connection to flush what was yielded before it.
    pub fn with_flushes(mut self, flushes: Option<Arc<Flushes>>) -> Self {
        self.flushes = flushes;
        self
    }

    /// Ends a byte-exact body that cannot say "error" in-band: the client response is aborted, once the bytes
    /// already yielded (and the head) have been flushed, so the client keeps every complete event.
    fn abort(&mut self, error: BodyError, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.end(Outcome::UpstreamError);
        let Some(flushes) = self.flushes.clone() else {
            return Poll::Ready(Some(Err(error)));
        };
        self.aborting = Some(Aborting {
            error,
            epoch: flushes.epoch(),
            flushes,
            wait: Box::pin(tokio::time::sleep(ABORT_FLUSH_WAIT)),
        });
        self.poll_abort(cx)
    }

    fn poll_abort(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let Some(a) = self.aborting.as_mut() else {
            return Poll::Ready(None);
        };
        if a.flushes.poll_flushed_since(a.epoch, cx).is_pending() && a.wait.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        match self.aborting.take() {
            Some(a) => Poll::Ready(Some(Err(a.error))),
            None => Poll::Ready(None),
        }
    }

    /// Whether the upstream has been silent past the idle timeout (polls its timer).
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(idle) = self.idle.as_mut() else {
            return false;
        };
        loop {
            if idle.sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            // Re-armed lazily, like the keepalive: input moves the deadline without touching the timer.
            let due = idle.last_input + idle.limit;
            if Instant::now() >= due {
                return true;
            }
            idle.sleep.as_mut().reset(due.into());
        }
    }

    /// Hands `bytes` to the client, with the accounting every outgoing frame needs.
    fn emit(&mut self, bytes: Bytes) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.account(&bytes);
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    fn account(&mut self, bytes: &Bytes) {
        let n = bytes.len() as u64;
        self.bytes_out += n;
        self.metrics.mode(self.info.mode).bytes_out.inc_by(n);
        if !self.first_byte_sent {
            self.first_byte_sent = true;
            self.metrics
                .downstream_ttfb
                .observe(self.info.request_start.elapsed().as_secs_f64());
        }
        if let Some(k) = &mut self.keepalive {
            k.last_output = Instant::now();
        }
    }

    /// Sends the stream's last bytes (if any) after recording its end, so the log line counts them.
    fn end_with(&mut self, outcome: Outcome, last: Vec<u8>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if last.is_empty() {
            self.end(outcome);
            return Poll::Ready(None);
        }
        let bytes = Bytes::from(last);
        self.account(&bytes);
        self.end(outcome);
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    /// Records how the stream ended, once; later calls are ignored.
    fn end(&mut self, outcome: Outcome) {
        if self.outcome.is_some() {
            return;
        }
        self.outcome = Some(outcome);
        self.state = State::Done;
        // Release the upstream now: on client_gone this closes the upstream connection at once.
        self.inner = None;
        self.keepalive = None;
        self.idle = None;
        let m = self.metrics.mode(self.info.mode);
        if outcome == Outcome::ClientGone {
            self.metrics.client_disconnects.inc();
        }
        if let Some(t) = &mut self.translator {
            t.observer_mut().flush();
        }
        if !self.info.event_stream {
            return;
        }
        let duration = self.started.elapsed();
        m.active_streams.dec();
        m.stream_duration.observe(duration.as_secs_f64());
        m.outcomes[outcome as usize].inc();
        let (envelopes, parse_errors) = self
            .translator
            .as_ref()
            .map_or((0, 0), |t| (t.observer().envelopes, t.observer().parse_errors));
        let _g = self.info.span.enter();
        tracing::info!(
            mode = self.info.mode.as_str(),
            outcome = outcome.as_str(),
            duration_ms = duration.as_millis() as u64,
            envelopes,
            parse_errors,
            bytes_in = self.bytes_in,
            bytes_out = self.bytes_out,
            "stream ended"
        );
    }

    /// Polls the keepalive timer while the upstream is idle; `Some(frame)` when a comment is due.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> Option<Bytes> {
        let k = self.keepalive.as_mut()?;
        loop {
            if k.sleep.as_mut().poll(cx).is_pending() {
                return None;
            }
            // The timer is not reset per frame (cheaper); when it fires early relative to the last output, it
            // is re-armed for the real deadline.
            let due = k.last_output + k.interval;
            let now = Instant::now();
            if now >= due {
                k.sleep.as_mut().reset((now + k.interval).into());
                self.metrics.keepalives.inc();
                return Some(Bytes::from_static(KEEPALIVE));
            }
            k.sleep.as_mut().reset(due.into());
        }
    }
}

impl Body for GatewayBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        if this.aborting.is_some() {
            return this.poll_abort(cx);
        }
        loop {
            if matches!(this.state, State::Done) {
                return Poll::Ready(None);
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            if let (Some(carry), Some(t)) = (this.carry.take(), this.translator.as_mut()) {
                let mut out = Vec::new();
                let taken = t.feed_bounded(&carry, &mut out, TRANSLATED_FRAME_LIMIT);
                if taken < carry.len() {
                    this.carry = Some(carry.slice(taken..));
                }
                t.observer_mut().flush();
                if out.is_empty() {
                    continue;
                }
                return this.emit(Bytes::from(out));
            }
            let polled = match this.deferred.take() {
                Some(ready) => Poll::Ready(ready),
                None => Pin::new(&mut *inner).poll_frame(cx),
            };
            match polled {
                Poll::Ready(Some(Ok(frame))) => {
                    let first = match frame.into_data() {
                        Ok(data) => data,
                        Err(trailers) => {
                            // Trailers belong to the original body: kept in pass-through and shadow, dropped
                            // from a translated stream.
                            if this.info.mode == Mode::Translate {
                                continue;
                            }
                            return Poll::Ready(Some(Ok(trailers)));
                        }
                    };
                    let arrived = Instant::now();
                    if let Some(idle) = this.idle.as_mut() {
                        idle.last_input = arrived;
                    }
                    // Whatever else the upstream already has is taken too, without waiting: a burst of events
                    // then costs one write to the client instead of one per event.
                    let deferred = &mut this.deferred;
                    let (size, reply) = match (this.info.mode, this.translator.as_mut()) {
                        (Mode::Translate, Some(t)) => {
                            // Each chunk is translated and dropped before the next is read, so the upstream
                            // connection reads into the buffer it already has instead of allocating a new one.
                            let mut out = Vec::with_capacity(first.len() + first.len() / 2 + ENVELOPE_HEADROOM);
                            let mut carry: Option<Bytes> = None;
                            let taken = t.feed_bounded(&first, &mut out, TRANSLATED_FRAME_LIMIT);
                            let size = if taken < first.len() {
                                // The frame is full: the rest waits, and nothing more is read (backpressure).
                                carry = Some(first.slice(taken..));
                                first.len()
                            } else {
                                drop(first);
                                gather_ready(inner, cx, deferred, taken, |data| match carry.take() {
                                    Some(held) => {
                                        let mut joined = BytesMut::with_capacity(held.len() + data.len());
                                        joined.extend_from_slice(&held);
                                        joined.extend_from_slice(&data);
                                        carry = Some(joined.freeze());
                                    }
                                    None => {
                                        let n = t.feed_bounded(&data, &mut out, TRANSLATED_FRAME_LIMIT);
                                        if n < data.len() {
                                            carry = Some(data.slice(n..));
                                        }
                                    }
                                })
                            };
                            this.carry = carry;
                            t.observer_mut().flush();
                            (size, Reply::Translated(out))
                        }
                        (Mode::Shadow, Some(t)) => {
                            let mut scratch = Vec::new();
                            let (size, bytes) = original_frame(first, inner, cx, deferred, |data| {
                                scratch.clear();
                                t.feed(data, &mut scratch);
                            });
                            t.observer_mut().flush();
                            (size, Reply::Original(bytes))
                        }
                        _ => {
                            let (size, bytes) = original_frame(first, inner, cx, deferred, |_| {});
                            (size, Reply::Original(bytes))
                        }
                    };
                    let n = size as u64;
                    this.bytes_in += n;
                    this.metrics.mode(this.info.mode).bytes_in.inc_by(n);
                    let bytes = match reply {
                        // Held bytes (a partial item): read on rather than send an empty frame.
                        Reply::Translated(out) if out.is_empty() => continue,
                        Reply::Translated(out) => Bytes::from(out),
                        Reply::Original(bytes) => bytes,
                    };
                    if this.info.mode != Mode::Passthrough {
                        this.metrics
                            .translator
                            .event_translation
                            .observe(arrived.elapsed().as_secs_f64());
                    }
                    return this.emit(bytes);
                }
                Poll::Ready(Some(Err(e))) => {
                    this.metrics.upstream.error(body_error_kind(&e));
                    let message = upstream_error_message(&e);
                    tracing::warn!(parent: &this.info.span, error = %super::error_chain(&e), "upstream body failed mid-stream");
                    let translated = match (this.info.mode, this.translator.as_mut()) {
                        (Mode::Translate, Some(t)) => {
                            let mut out = Vec::new();
                            t.abort(&message, &mut out);
                            Some(out)
                        }
                        (_, Some(t)) => {
                            // Shadow: count what the translated stream would have ended with.
                            t.abort(&message, &mut Vec::new());
                            None
                        }
                        _ => None,
                    };
                    return match translated {
                        // The client gets a well-formed end: error envelope, then a clean end of body.
                        Some(out) => this.end_with(Outcome::UpstreamError, out),
                        None => this.abort(Box::new(e), cx),
                    };
                }
                Poll::Ready(None) => {
                    let mut out = Vec::new();
                    let mut outcome = Outcome::Completed;
                    if let Some(t) = this.translator.as_mut() {
                        let started = Instant::now();
                        if t.finish(&mut out) == StreamEnd::Cut && this.info.event_stream {
                            // Legacy streams end with [DONE] or the failure JSON; anything else was cut short.
                            this.metrics.upstream.error(UpstreamErrorKind::Truncated);
                            outcome = Outcome::UpstreamError;
                        }
                        if this.info.mode == Mode::Translate && !out.is_empty() {
                            this.metrics
                                .translator
                                .event_translation
                                .observe(started.elapsed().as_secs_f64());
                        }
                    }
                    if this.info.mode != Mode::Translate {
                        out.clear();
                    }
                    return this.end_with(outcome, out);
                }
                Poll::Pending => {
                    if this.idle_expired(cx) {
                        this.metrics.upstream.error(UpstreamErrorKind::Timeout);
                        tracing::warn!(parent: &this.info.span, "upstream idle timeout");
                        let message = "upstream sent nothing within upstream.idle_timeout_secs";
                        return match (this.info.mode, this.translator.as_mut()) {
                            (Mode::Translate, Some(t)) => {
                                let mut out = Vec::new();
                                t.abort(message, &mut out);
                                this.end_with(Outcome::UpstreamError, out)
                            }
                            _ => this.abort(message.into(), cx),
                        };
                    }
                    if let Some(comment) = this.poll_keepalive(cx) {
                        return this.emit(comment);
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // An abort still to come is not an end: hyper would finish the response cleanly.
        matches!(self.state, State::Done) && self.aborting.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.inner, self.info.mode) {
            // Pass-through and shadow send the upstream's bytes: its length is ours.
            (Some(inner), Mode::Passthrough | Mode::Shadow) => inner.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for GatewayBody {
    fn drop(&mut self) {
        // Dropped before its end: the client connection went away (or was closed at the drain deadline).
        self.end(Outcome::ClientGone);
    }
}

/// Upstream bytes gathered into one client frame at most (only what is already there; nothing waits).
const COALESCE_BYTES: usize = 64 << 10;

/// Output of one translated client frame, past which the rest of the input waits for the next poll. With
/// identifiers bounded (`envelope::ids`), one `translate::FEED_STEP` of input adds at most ~70× its size, so a
/// frame stays under ~0.6 MiB, whatever the upstream sends, except where an item held whole (at most
/// `translate.max_item_bytes`) is flushed (docs/SECURITY.md).
const TRANSLATED_FRAME_LIMIT: usize = 256 << 10;

/// Room for the envelope around a translated chunk's text (type, agent id, flags), so a small event's frame is
/// written without growing its buffer.
const ENVELOPE_HEADROOM: usize = 256;

/// What one poll sends the client.
enum Reply {
    Translated(Vec<u8>),
    /// The upstream's bytes (pass-through and shadow).
    Original(Bytes),
}

/// Takes the data chunks the upstream already has, without waiting, until `size` (the bytes taken so far)
/// reaches `COALESCE_BYTES`, and hands each to `take` at once. Whatever ends the run other than `Pending` (the
/// end, an error, trailers) is kept in `deferred` for the next poll. Returns the bytes taken in all.
fn gather_ready(
    inner: &mut UpstreamIncoming,
    cx: &mut Context<'_>,
    deferred: &mut Deferred,
    mut size: usize,
    mut take: impl FnMut(Bytes),
) -> usize {
    while size < COALESCE_BYTES {
        match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) if f.is_data() => {
                if let Ok(data) = f.into_data() {
                    size += data.len();
                    take(data);
                }
            }
            Poll::Pending => break,
            Poll::Ready(other) => {
                *deferred = Some(other);
                break;
            }
        }
    }
    size
}

/// First chunks up to this size are copied out of the upstream connection's read buffer (see `original_frame`).
const COPY_OUT_BYTES: usize = 4 << 10;

/// One client frame of the upstream's own bytes (pass-through and shadow): `first` and what `gather_ready` takes
/// after it, each shown to `seen` once. A small first chunk is copied out and dropped before the next read, so
/// the connection reads into the buffer it has (holding the chunk would make it allocate a new one per event);
/// a large one is passed on uncopied when nothing follows it.
fn original_frame(
    first: Bytes,
    inner: &mut UpstreamIncoming,
    cx: &mut Context<'_>,
    deferred: &mut Deferred,
    mut seen: impl FnMut(&[u8]),
) -> (usize, Bytes) {
    seen(&first);
    if first.len() <= COPY_OUT_BYTES {
        let mut all = BytesMut::from(&first[..]);
        let taken = first.len();
        drop(first);
        let size = gather_ready(inner, cx, deferred, taken, |data| {
            seen(&data);
            all.extend_from_slice(&data);
        });
        return (size, all.freeze());
    }
    let mut more = Vec::new();
    let size = gather_ready(inner, cx, deferred, first.len(), |data| {
        seen(&data);
        more.push(data);
    });
    if more.is_empty() {
        return (size, first);
    }
    let mut all = BytesMut::with_capacity(size);
    all.extend_from_slice(&first);
    for b in &more {
        all.extend_from_slice(b);
    }
    (size, all.freeze())
}

/// How an upstream body failed, for `upstream_errors_total{kind}`: bad framing (hyper reports it as an I/O error
/// of kind InvalidData or InvalidInput) is a protocol error, a timeout
/// a timeout, anything else (reset, early close) a reset.
fn body_error_kind(e: &hyper::Error) -> UpstreamErrorKind {
    if e.is_timeout() {
        return UpstreamErrorKind::Timeout;
    }
    if e.is_parse() {
        return UpstreamErrorKind::Protocol;
    }
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
            ) {
                return UpstreamErrorKind::Protocol;
            }
        }
        source = err.source();
    }
    UpstreamErrorKind::Reset
}

/// A short, payload-free description of an upstream body failure for the error envelope.
fn upstream_error_message(e: &hyper::Error) -> String {
    if e.is_incomplete_message() {
        "upstream connection closed before the response ended".into()
    } else if e.is_timeout() {
        "upstream timed out".into()
    } else {
        format!("upstream connection failed: {e}")
    }
}
