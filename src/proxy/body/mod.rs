//! The response body: a stack of small `Body` adapters over the upstream body, each with one job.
//!
//! No task or channel per stream: the client connection polls this body only when it can write, so a slow
//! client stops the reads from the upstream socket (backpressure) and nothing is buffered beyond one frame.
//! How the stream ended (completed, upstream error, client gone) is recorded exactly once, on drop at the latest.
//!
//! The stacks, outermost first (each adapter polls the one inside it; all static dispatch):
//!
//! ```text
//! translated:    Record ─ Keepalive ─ Hold ─ Translate ─┐
//! pass-through:  Abort ─ Record ─ Original ─────────────┴─ Idle ─ Coalesce ─ UpstreamIncoming
//! resumed:       Keepalive ─ Follow ─ (the hub)
//! ```
//!
//! - `coalesce`: the upstream chunks already there, gathered per client frame (`Gather`).
//! - `timers`: `Idle` ends a silent upstream; `Keepalive` writes comments while a translated stream waits.
//! - `translate`: the translator over each batch (translate mode); `original`: the upstream's own bytes
//!   (pass-through, and shadow with its translator watching).
//! - `hold`: ids on the translated events, held for resumption; a pump reads on through a disconnect.
//! - `follow`: a reconnection or a watcher reading a held stream.
//! - `record`: the stream's metrics, its outcome (once, drop included) and its end-of-stream log line.
//! - `abort`: a pass-through failure held back until the client connection has flushed.
//!
//! A new layer over the translated stream (a replay buffer, another output) is a `Layer` adapter placed between
//! `Translate` and `Keepalive`, forwarding `ending`, `totals` and `cut_for_drain`.

mod abort;
mod coalesce;
mod errors;
mod follow;
mod hold;
mod original;
mod record;
#[cfg(test)]
mod script;
mod timers;
mod translate;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use super::conn::Flushes;
use super::drain::DrainCut;
use super::forward::UpstreamIncoming;
use super::metrics::Metrics;
use super::negotiate::Mode;
use super::observe::StreamObserver;
use super::request_body::ClientFault;
use crate::resume::hub::Stream;
use crate::translate::{StreamEnd, Translator};

pub use abort::Abort;
pub use coalesce::{Coalesce, Gather};
pub use errors::StreamError;
pub use follow::{Follow, RemoteFollow};
pub use hold::Hold;
pub use original::Original;
pub use record::{Outcome, Record};
pub use timers::{Idle, Keepalive};
pub use translate::Translate;

/// Error type of response bodies: an upstream failure in a pass-through body aborts the client response.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// The upstream as the frame-making layers read it.
pub type Input = Idle<Coalesce<UpstreamIncoming>>;

/// A translated stream (translate mode).
pub type Translated = Record<Keepalive<Hold<Translate<Input>>>>;

/// A held stream read by a reconnection or a watcher.
pub type Followed = Keepalive<Follow>;

/// A stream held by another instance, read from the shared store.
pub type RemoteFollowed = Keepalive<RemoteFollow>;

/// A stream of the upstream's own bytes (pass-through and shadow modes).
pub type Passed = Abort<Record<Original<Input>>>;

/// A response body: a small body made by the gateway, or an upstream body translated or passed on.
pub enum ResponseBody {
    Full(Full<Bytes>),
    Translated(Box<Translated>),
    Passed(Box<Passed>),
    Followed(Box<Followed>),
    Remote(Box<RemoteFollowed>),
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
    /// Set when the client's request body fails: a broken exchange is then the client's, not the upstream's.
    pub client_fault: ClientFault,
}

/// How an upstream stream is carried besides its mode.
pub struct StreamSettings {
    /// `translate.keepalive_interval_secs`: comments while a translated stream waits (translate mode only, so
    /// shadow and pass-through streams stay byte-identical).
    pub keepalive: Option<Duration>,
    /// `upstream.idle_timeout_secs`: ends an event stream whose upstream is silent that long.
    pub idle_timeout: Option<Duration>,
    /// The client connection's flushes, which a pass-through abort waits for.
    pub flushes: Option<Arc<Flushes>>,
    /// The hub entry a resumable translated stream is held in.
    pub held: Option<Arc<Stream>>,
}

impl ResponseBody {
    pub fn full(b: impl Into<Bytes>) -> Self {
        ResponseBody::Full(Full::new(b.into()))
    }

    /// Wraps an upstream body in the stack its mode needs. `translator` must be given in translate and shadow
    /// modes (without one, a stream is passed through).
    pub fn upstream(
        inner: UpstreamIncoming,
        translator: Option<Translator<StreamObserver>>,
        info: StreamInfo,
        metrics: Arc<Metrics>,
        settings: StreamSettings,
    ) -> Self {
        let idle = settings.idle_timeout.filter(|_| info.event_stream);
        let upstream = Idle::new(Coalesce::new(inner), idle);
        match (info.mode, translator) {
            (Mode::Translate, Some(t)) => {
                let keepalive = Keepalive::new(
                    Hold::new(Translate::new(upstream, t, Arc::clone(&metrics)), settings.held),
                    settings.keepalive,
                    Arc::clone(&metrics),
                );
                ResponseBody::Translated(Box::new(Record::new(keepalive, info, metrics)))
            }
            (mode, translator) => {
                let shadow = translator.filter(|_| mode == Mode::Shadow);
                let original = Original::new(upstream, shadow, Arc::clone(&metrics));
                let recorded = Record::new(original, info, metrics);
                ResponseBody::Passed(Box::new(Abort::new(recorded, settings.flushes)))
            }
        }
    }

    /// A held stream's subscriber, with keepalives.
    pub fn follow(follow: Follow, keepalive: Option<Duration>, metrics: Arc<Metrics>) -> Self {
        ResponseBody::Followed(Box::new(Keepalive::new(follow, keepalive, metrics)))
    }

    /// A subscriber of a stream another instance holds, with keepalives.
    pub fn remote(follow: RemoteFollow, keepalive: Option<Duration>, metrics: Arc<Metrics>) -> Self {
        ResponseBody::Remote(Box::new(Keepalive::new(follow, keepalive, metrics)))
    }

    /// Gives a watcher's body its connection, which it asks to drop when the client reads nothing for
    /// `resume.watcher_write_timeout_secs` (see `Follow::watch_connection`).
    pub fn watch_connection(&mut self, flushes: &Arc<Flushes>) {
        if let ResponseBody::Followed(b) = self {
            b.inner_mut().watch_connection(flushes);
        }
    }

    /// A body read from the upstream (which the drain deadline cuts), rather than one made by the gateway.
    pub fn is_upstream(&self) -> bool {
        !matches!(self, ResponseBody::Full(_))
    }

    /// Ends the response at the drain deadline (see `drain`); the body must still be polled for what it returns.
    pub fn cut_for_drain(&mut self) -> DrainCut {
        match self {
            ResponseBody::Full(_) => DrainCut::Nothing,
            ResponseBody::Translated(b) => b.cut_for_drain(),
            ResponseBody::Passed(b) => b.cut_for_drain(),
            ResponseBody::Followed(b) => b.cut_for_drain(),
            ResponseBody::Remote(b) => b.cut_for_drain(),
        }
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
            ResponseBody::Translated(b) => Pin::new(&mut **b)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(StreamError::into_body_error))),
            ResponseBody::Passed(b) => Pin::new(&mut **b)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(StreamError::into_body_error))),
            ResponseBody::Followed(b) => Pin::new(&mut **b)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(StreamError::into_body_error))),
            ResponseBody::Remote(b) => Pin::new(&mut **b)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(StreamError::into_body_error))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(b) => b.is_end_stream(),
            ResponseBody::Translated(b) => b.is_end_stream(),
            ResponseBody::Passed(b) => b.is_end_stream(),
            ResponseBody::Followed(b) => b.is_end_stream(),
            ResponseBody::Remote(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(b) => b.size_hint(),
            ResponseBody::Translated(b) => b.size_hint(),
            ResponseBody::Passed(b) => b.size_hint(),
            ResponseBody::Followed(b) => b.size_hint(),
            ResponseBody::Remote(b) => b.size_hint(),
        }
    }
}

/// A body that can be cut at the drain deadline.
pub trait Drain {
    /// At the drain deadline: the stream's last frame, or an abort, or nothing when it has already ended.
    fn cut_for_drain(&mut self) -> DrainCut;
}

impl Ending {
    /// The translator's verdict on the upstream's end.
    fn finished(end: StreamEnd) -> Self {
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
    fn of(bytes_in: u64, translator: Option<&Translator<StreamObserver>>) -> Self {
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
    /// What the stream counted so far.
    fn totals(&self) -> Totals;
    /// The stream's own agent once the upstream named it (the translator's root agent), for what `Hold` writes.
    fn agent(&self) -> Option<&str> {
        None
    }
}

/// A body's poll result with `StreamError` failures.
type Polled = Poll<Option<Result<Frame<Bytes>, StreamError>>>;
