//! What every layer of the body stack is: a `Body` of client bytes whose failures are `StreamError`s, that can be
//! cut at the drain deadline (`Drain`) and tells how its stream ended (`Ending`) and what it counted (`Totals`).

use crate::proxy::base::drain::DrainCut;
use crate::proxy::metrics::translator::StreamObserver;
use crate::proxy::request::body::ClientFault;
use crate::proxy::request::negotiate::Mode;
use crate::proxy::upstream::error::StreamError;
use crate::translate::{StreamEnd, Translator};
use bytes::Bytes;
use http_body::{Body, Frame};
use std::task::{Context, Poll};
use std::time::Instant;

/// What the adapter knows about the stream it carries.
pub struct StreamInfo {
    pub mode: Mode,
    /// A `text/event-stream` response: stream metrics and the end-of-stream log line apply.
    pub event_stream: bool,
    /// When the request arrived (downstream time to first byte).
    pub request_start: Instant,
    /// The request's span, for the end-of-stream log line.
    pub span: tracing::Span,
    /// Set when the client's request body fails: a broken exchange is then the client's, not the upstream's.
    pub client_fault: ClientFault,
}

/// A body that can be cut at the drain deadline.
pub trait Drain {
    /// At the drain deadline: the stream's last frame, or an abort, or nothing when it has already ended.
    fn cut_for_drain(&mut self) -> DrainCut;
}

impl Ending {
    /// The translator's verdict on the upstream's end.
    pub fn finished(end: StreamEnd) -> Self {
        match end {
            StreamEnd::Cut => Ending::Cut,
            StreamEnd::Done | StreamEnd::Failed => Ending::Completed,
        }
    }
}

/// How a frame-making layer's stream ended, read once by `Record` after its last frame (`is_end_stream`) or end.
pub enum Ending {
    /// The upstream body ended.
    Completed,
    /// The upstream body ended, but the translator saw a legacy stream stop short (no `[DONE]`, no failure).
    Cut,
    /// The upstream failed; a translated stream said so in-band.
    Failed(StreamError),
    /// Cut at the drain deadline.
    Drained,
}

/// What a layer counted, for the end-of-stream log line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub bytes_in: u64,
    pub envelopes: u64,
    pub parse_errors: u64,
}

impl Totals {
    pub fn of(bytes_in: u64, translator: Option<&Translator<StreamObserver>>) -> Self {
        let (envelopes, parse_errors) =
            translator.map_or((0, 0), |t| (t.observer().envelopes, t.observer().parse_errors));
        Self {
            bytes_in,
            envelopes,
            parse_errors,
        }
    }
}

/// A layer of client bytes under `Record`: a body whose failures are `StreamError`s, telling how it ended.
pub trait Layer: Body<Data = Bytes, Error = StreamError> + Drain + Unpin {
    /// How the stream ended; asked once, when the body has ended.
    fn ending(&mut self) -> Ending;
    /// What the stream counted so far (a layer that reads no upstream counts nothing).
    fn totals(&self) -> Totals {
        Totals::default()
    }
    /// The stream's own agent once the upstream named it (the translator's root agent), for what `Hold` writes.
    fn agent(&self) -> Option<&str> {
        None
    }
    /// `poll_frame` for a caller that copies each data frame's bytes at once (`Hold`): `keep` is given them and
    /// the stream's agent, and its bytes go on instead. A layer that builds its frames may lend a buffer of its
    /// own instead of allocating one per frame.
    fn poll_kept(&mut self, cx: &mut Context<'_>, keep: Keep<'_>) -> Polled {
        poll_kept_by_frame(self, cx, keep)
    }
}

/// What `Layer::poll_kept` gives a data frame's bytes and the stream's agent to; the frame goes on with what it
/// returns.
pub type Keep<'a> = &'a mut dyn FnMut(&[u8], Option<&str>) -> Bytes;

/// `Layer::poll_kept` through `poll_frame`: the frame's own bytes are given to `keep`.
pub fn poll_kept_by_frame<L: Layer + ?Sized>(layer: &mut L, cx: &mut Context<'_>, keep: Keep<'_>) -> Polled {
    match std::pin::Pin::new(&mut *layer).poll_frame(cx) {
        Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_data() {
            Ok(data) => Frame::data(keep(&data, layer.agent())),
            Err(frame) => frame,
        }))),
        other => other,
    }
}

/// A body's poll result with `StreamError` failures.
pub type Polled = Poll<Option<Result<Frame<Bytes>, StreamError>>>;

/// The upstream as a frame-making layer reads it: `poll_frame` waits for a batch's first frame, `poll_more`
/// takes the next chunk of the batch only if the upstream already has it. The caller handles each chunk before
/// it takes the next, so the upstream connection can read into the buffer it already has.
pub trait Gather: Body<Data = Bytes, Error = StreamError> + Unpin {
    /// The batch's next data chunk, if the upstream has one ready and the batch is under `COALESCE_BYTES`.
    /// Whatever else ends the batch (the end, an error, trailers) is kept for the next `poll_frame`.
    fn poll_more(&mut self, cx: &mut Context<'_>) -> Option<Bytes>;
}
