//! The stacks of layers a response body is made of, and `ResponseBody`, the one type the connection serves: the
//! only place that knows them all.

use crate::proxy::body::abort::Abort;
use crate::proxy::body::coalesce::Coalesce;
use crate::proxy::body::encode::{Encode, Learn};
use crate::proxy::body::follow::{Follow, RemoteFollow};
use crate::proxy::body::hold::Hold;
use crate::proxy::body::layer::{Drain, StreamInfo};
use crate::proxy::body::original::Original;
use crate::proxy::body::record::Record;
use crate::proxy::body::timers::{Idle, Keepalive};
use crate::proxy::body::translate::Translate;
use crate::proxy::upstream::error::{BodyError, StreamError};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use crate::proxy::base::drain::DrainCut;
use crate::proxy::base::flushes::Flushes;
use crate::proxy::metrics::edge::Metrics;
use crate::proxy::metrics::translator::StreamObserver;
use crate::proxy::request::negotiate::Mode;
use crate::proxy::trace::request::ServerSpan;
use crate::proxy::upstream::pool::UpstreamIncoming;
use crate::resume::hub::Stream;
use crate::translate::Translator;

/// The upstream as the frame-making layers read it.
pub type Input = Idle<Coalesce<UpstreamIncoming>>;

/// A translated stream (translate mode).
pub type Translated = Record<Keepalive<Encode<Hold<Translate<Input>>>>>;

/// A held stream read by a reconnection or a watcher.
pub type Followed = Keepalive<Encode<Follow>>;

/// A stream held by another instance, read from the shared store.
pub type RemoteFollowed = Keepalive<Encode<RemoteFollow>>;

/// A stream of the upstream's own bytes (pass-through and shadow modes).
pub type Passed = Abort<Record<Original<Input>>>;

/// A response body: its stack, and the request's span, ended with the body (so a stream's span lasts as long as
/// the stream).
pub struct ResponseBody {
    stack: Stack,
    trace: Option<ServerSpan>,
}

impl From<Stack> for ResponseBody {
    fn from(stack: Stack) -> Self {
        Self { stack, trace: None }
    }
}

/// What a response body is made of: a small body made by the gateway, or an upstream body translated or passed on.
pub enum Stack {
    Full(Full<Bytes>),
    Translated(Box<Translated>),
    Passed(Box<Passed>),
    Followed(Box<Followed>),
    Remote(Box<RemoteFollowed>),
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
        Stack::Full(Full::new(b.into())).into()
    }

    /// Ends `span` with this body.
    pub fn traced(mut self, span: ServerSpan) -> Self {
        self.trace = Some(span);
        self
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
                    Encode::none(Hold::new(
                        Translate::new(upstream, t, Arc::clone(&metrics)),
                        settings.held,
                    )),
                    settings.keepalive,
                    Arc::clone(&metrics),
                );
                Stack::Translated(Box::new(Record::new(keepalive, info, metrics))).into()
            }
            (mode, translator) => {
                let shadow = translator.filter(|_| mode == Mode::Shadow);
                let original = Original::new(upstream, shadow, Arc::clone(&metrics));
                let recorded = Record::new(original, info, metrics);
                Stack::Passed(Box::new(Abort::new(recorded, settings.flushes))).into()
            }
        }
    }

    /// A held stream's subscriber, with keepalives.
    pub fn follow(follow: Follow, keepalive: Option<Duration>, metrics: Arc<Metrics>) -> Self {
        Stack::Followed(Box::new(Keepalive::new(Encode::none(follow), keepalive, metrics))).into()
    }

    /// A subscriber of a stream another instance holds, with keepalives.
    pub fn remote(follow: RemoteFollow, keepalive: Option<Duration>, metrics: Arc<Metrics>) -> Self {
        Stack::Remote(Box::new(Keepalive::new(Encode::none(follow), keepalive, metrics))).into()
    }

    /// Gives a watcher's body its connection, which it asks to drop when the client reads nothing for
    /// `resume.watcher_write_timeout_secs` (see `Follow::watch_connection`).
    pub fn watch_connection(&mut self, flushes: &Arc<Flushes>) {
        if let Stack::Followed(b) = &mut self.stack {
            b.inner_mut().inner_mut().watch_connection(flushes);
        }
    }

    /// Encodes a translated or held stream for a frontend (`false`: a body with no envelope stream, left as it is).
    pub fn encode(&mut self, encoder: crate::frontend::Encoder, learn: Option<Learn>) -> bool {
        match &mut self.stack {
            Stack::Translated(b) => match b.inner_mut() {
                Some(k) => k.inner_mut().set(encoder, learn),
                None => return false,
            },
            Stack::Followed(b) => b.inner_mut().set(encoder, learn),
            Stack::Remote(b) => b.inner_mut().set(encoder, learn),
            Stack::Full(_) | Stack::Passed(_) => return false,
        }
        true
    }

    /// A body read from the upstream (which the drain deadline cuts), rather than one made by the gateway.
    pub fn is_upstream(&self) -> bool {
        !matches!(self.stack, Stack::Full(_))
    }

    /// Ends the response at the drain deadline (see `drain`); the body must still be polled for what it returns.
    pub fn cut_for_drain(&mut self) -> DrainCut {
        match &mut self.stack {
            Stack::Full(_) => DrainCut::Nothing,
            Stack::Translated(b) => b.cut_for_drain(),
            Stack::Passed(b) => b.cut_for_drain(),
            Stack::Followed(b) => b.cut_for_drain(),
            Stack::Remote(b) => b.cut_for_drain(),
        }
    }
}

/// `$body` for whichever stack `$self` is (every variant is a `Body`).
macro_rules! each_stack {
    ($self:expr, $b:ident => $body:expr) => {
        match $self {
            Stack::Full($b) => $body,
            Stack::Translated($b) => $body,
            Stack::Passed($b) => $body,
            Stack::Followed($b) => $body,
            Stack::Remote($b) => $body,
        }
    };
}

/// A stack's poll with its failure as the client connection's error.
fn poll_stack<B>(b: &mut B, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>>
where
    B: Body<Data = Bytes, Error = StreamError> + Unpin,
{
    Pin::new(b)
        .poll_frame(cx)
        .map(|o| o.map(|r| r.map_err(StreamError::into_body_error)))
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let polled = match &mut this.stack {
            Stack::Full(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(|e: Infallible| match e {}))),
            Stack::Translated(b) => poll_stack(&mut **b, cx),
            Stack::Passed(b) => poll_stack(&mut **b, cx),
            Stack::Followed(b) => poll_stack(&mut **b, cx),
            Stack::Remote(b) => poll_stack(&mut **b, cx),
        };
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.trace = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        each_stack!(&self.stack, b => b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        each_stack!(&self.stack, b => b.size_hint())
    }
}
