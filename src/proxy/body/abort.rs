//! Aborting a pass-through stream: a byte-exact body cannot say "error" in-band, so the client response is
//! aborted, once the bytes already yielded (and the head) have been flushed, so the client keeps every complete
//! event.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, SizeHint};
use tokio::time::Sleep;

use crate::proxy::body::layer::{Drain, Polled};

use crate::proxy::base::drain::DrainCut;
use crate::proxy::base::flushes::Flushes;
use crate::proxy::upstream::error::StreamError;

/// How long an aborting pass-through body waits for what it already yielded to be flushed to the client. hyper
/// drops its unwritten buffer when a body fails, so the abort waits for the connection's next flush (HTTP/1
/// flushes at once; an HTTP/2 connection only when it has frames to write, hence a bound).
pub const ABORT_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// An abort held back until the client connection has flushed.
struct Aborting {
    error: StreamError,
    flushes: Arc<Flushes>,
    epoch: u64,
    wait: Pin<Box<Sleep>>,
}

/// Holds the failure of the body `B` back until the client connection's next flush.
pub struct Abort<B> {
    inner: B,
    /// The client connection's flushes; without them a failure is passed on at once.
    flushes: Option<Arc<Flushes>>,
    aborting: Option<Aborting>,
}

impl<B> Abort<B> {
    pub fn new(inner: B, flushes: Option<Arc<Flushes>>) -> Self {
        Self {
            inner,
            flushes,
            aborting: None,
        }
    }

    fn poll_abort(&mut self, cx: &mut Context<'_>) -> Polled {
        let Some(a) = self.aborting.as_mut() else {
            return Poll::Ready(None);
        };
        if a.flushes.poll_flushed_since(a.epoch, cx).is_pending() && a.wait.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(self.aborting.take().map(|a| Err(a.error)))
    }
}

impl<B: Body<Data = Bytes, Error = StreamError> + Unpin> Body for Abort<B> {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        if this.aborting.is_some() {
            return this.poll_abort(cx);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(error))) => {
                let Some(flushes) = this.flushes.take() else {
                    return Poll::Ready(Some(Err(error)));
                };
                this.aborting = Some(Aborting {
                    error,
                    epoch: flushes.epoch(),
                    flushes,
                    wait: Box::pin(tokio::time::sleep(ABORT_FLUSH_WAIT)),
                });
                this.poll_abort(cx)
            }
            polled => polled,
        }
    }

    fn is_end_stream(&self) -> bool {
        // An abort still to come is not an end: hyper would finish the response cleanly.
        self.aborting.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Drain> Drain for Abort<B> {
    fn cut_for_drain(&mut self) -> DrainCut {
        if self.aborting.is_some() {
            return DrainCut::Nothing;
        }
        self.inner.cut_for_drain()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::proxy::body::coalesce::Coalesce;
    use crate::proxy::body::script::{data, poll, Script, Seen, Step};

    impl Drain for Coalesce<Script> {
        fn cut_for_drain(&mut self) -> DrainCut {
            DrainCut::Abort
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_waits_for_the_next_flush() {
        let flushes = Arc::new(Flushes::default());
        let mut body = Abort::new(
            Coalesce::new(Script::new([data("a"), Step::Fail])),
            Some(Arc::clone(&flushes)),
        );
        assert_eq!(poll(&mut body), Seen::data("a"));
        assert_eq!(poll(&mut body), Seen::Pending, "held back");
        assert!(!body.is_end_stream(), "an abort to come is no end");
        assert!(matches!(body.cut_for_drain(), DrainCut::Nothing), "already ending");
        flushes.flushed();
        assert_eq!(poll(&mut body), Seen::Err);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_without_a_flush_waits_at_most_abort_flush_wait() {
        let flushes = Arc::new(Flushes::default());
        let mut body = Abort::new(Coalesce::new(Script::new([Step::Fail])), Some(flushes));
        let start = tokio::time::Instant::now();
        assert!(body.frame().await.expect("a frame").is_err());
        assert_eq!(start.elapsed(), ABORT_FLUSH_WAIT);
    }

    #[test]
    fn without_flushes_a_failure_is_passed_on_at_once() {
        let mut body = Abort::new(Coalesce::new(Script::new([Step::Fail])), None);
        assert_eq!(poll(&mut body), Seen::Err);
    }
}
