//! The stream's timers: `Idle` ends an upstream silent for `upstream.idle_timeout_secs`; `Keepalive` writes an
//! SSE comment while a translated stream has had no output for `translate.keepalive_interval_secs`.
//!
//! Neither resets its timer per frame (cheaper): input or output moves the deadline, and a timer that fires
//! before it is re-armed for the real one. Both are polled only while the upstream has nothing.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::time::{Instant, Sleep};

use crate::proxy::body::layer::{Drain, Ending, Layer, Polled, Totals};

use crate::proxy::body::layer::Gather;

use crate::proxy::base::drain::DrainCut;
use crate::proxy::base::quiet::Quiet;
use crate::proxy::metrics::edge::Metrics;
use crate::proxy::upstream::error::StreamError;
use crate::sse::encoder::KEEPALIVE;

/// A timer whose deadline is `interval` after the last `touch`.
struct Lazy {
    interval: Duration,
    sleep: Quiet<Pin<Box<Sleep>>>,
    last: Instant,
}

impl Lazy {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            sleep: Quiet::new(Box::pin(tokio::time::sleep(interval))),
            last: Instant::now(),
        }
    }

    /// Watches what the layer inside returned: data moves the deadline; while it has nothing, the timer is polled.
    /// Returns the time when the deadline has passed.
    fn watch(&mut self, polled: &Polled, cx: &mut Context<'_>) -> Option<Instant> {
        match polled {
            Poll::Ready(Some(Ok(f))) if f.is_data() => {
                self.last = Instant::now();
                None
            }
            Poll::Pending => match self.poll_due(cx) {
                Poll::Ready(now) => Some(now),
                Poll::Pending => None,
            },
            _ => None,
        }
    }

    /// Ready once `interval` has passed since the last touch; registers for the deadline otherwise.
    fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<Instant> {
        loop {
            if Pin::new(&mut self.sleep).poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = self.last + self.interval;
            let now = Instant::now();
            if now >= due {
                return Poll::Ready(now);
            }
            self.sleep.get_mut().as_mut().reset(due);
        }
    }
}

/// Ends the stream with `StreamError::IdleTimeout` when the upstream has sent no data for the limit.
pub struct Idle<B> {
    inner: B,
    timer: Option<Lazy>,
}

impl<B> Idle<B> {
    /// `limit`: none for no timeout.
    pub fn new(inner: B, limit: Option<Duration>) -> Self {
        Self {
            inner,
            timer: limit.map(Lazy::new),
        }
    }
}

/// The inner body's poll, and when `timer` ran out, if it did (it watches what the poll gave).
fn poll_watched<B>(inner: &mut B, timer: Option<&mut Lazy>, cx: &mut Context<'_>) -> (Polled, Option<Instant>)
where
    B: Body<Data = Bytes, Error = StreamError> + Unpin,
{
    let polled = Pin::new(inner).poll_frame(cx);
    let ran_out = timer.and_then(|t| t.watch(&polled, cx));
    (polled, ran_out)
}

impl<B: Gather> Body for Idle<B> {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        match poll_watched(&mut this.inner, this.timer.as_mut(), cx) {
            (_, Some(_)) => Poll::Ready(Some(Err(StreamError::IdleTimeout))),
            (polled, None) => polled,
        }
    }

    body_hints_from!(inner);
}

impl<B: Gather> Gather for Idle<B> {
    /// Only chunks already there: the batch's first frame moved the deadline, and nothing waits here.
    fn poll_more(&mut self, cx: &mut Context<'_>) -> Option<Bytes> {
        self.inner.poll_more(cx)
    }
}

/// Writes a keepalive comment (`: keepalive`) when the stream has sent nothing for the interval and the layer
/// inside has nothing either.
pub struct Keepalive<L> {
    inner: L,
    timer: Option<Lazy>,
    metrics: Arc<Metrics>,
}

impl<L> Keepalive<L> {
    /// `interval`: none (or zero) for no keepalives.
    pub fn new(inner: L, interval: Option<Duration>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            timer: interval.filter(|i| !i.is_zero()).map(Lazy::new),
            metrics,
        }
    }

    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }
}

impl<L: Layer> Body for Keepalive<L> {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        let (polled, ran_out) = poll_watched(&mut this.inner, this.timer.as_mut(), cx);
        if let (Some(now), Some(timer)) = (ran_out, this.timer.as_mut()) {
            timer.last = now;
            timer.sleep.get_mut().as_mut().reset(now + timer.interval);
            this.metrics.keepalives.inc();
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(KEEPALIVE)))));
        }
        polled
    }

    body_hints_from!(inner);
}

impl<L: Layer> Drain for Keepalive<L> {
    fn cut_for_drain(&mut self) -> DrainCut {
        self.inner.cut_for_drain()
    }
}

impl<L: Layer> Layer for Keepalive<L> {
    fn ending(&mut self) -> Ending {
        self.inner.ending()
    }

    fn totals(&self) -> Totals {
        self.inner.totals()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::proxy::body::coalesce::Coalesce;
    use crate::proxy::body::script::{data, more, poll, Script, Seen, Step};

    #[tokio::test(start_paused = true)]
    async fn a_silent_upstream_times_out_after_the_limit() {
        let mut idle = Idle::new(Coalesce::new(Script::new([])), Some(Duration::from_secs(5)));
        let start = Instant::now();
        let e = idle.frame().await.expect("a frame").expect_err("a timeout");
        assert!(matches!(e, StreamError::IdleTimeout));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn data_moves_the_idle_deadline() {
        let script = Script::new([Step::Pending, data("a")]);
        let mut idle = Idle::new(Coalesce::new(script), Some(Duration::from_secs(5)));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(poll(&mut idle), Seen::Pending, "not yet");
        assert_eq!(poll(&mut idle), Seen::data("a"));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(poll(&mut idle), Seen::Pending, "4 s after the data");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(poll(&mut idle), Seen::Err, "5 s after the data");
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_timer_is_not_polled_while_gathering() {
        let mut idle = Idle::new(Coalesce::new(Script::new([data("a")])), Some(Duration::from_secs(1)));
        assert_eq!(poll(&mut idle), Seen::data("a"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(more(&mut idle), None, "a batch ends without the timer");
        assert_eq!(poll(&mut idle), Seen::Err);
    }

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::register(&prometheus::Registry::new()).expect("metrics"))
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_stream_gets_a_comment_per_interval() {
        let m = metrics();
        let mut k = Keepalive::new(Script::new([]), Some(Duration::from_secs(15)), Arc::clone(&m));
        let start = Instant::now();
        for n in 1..=3 {
            let frame = k.frame().await.expect("a frame").expect("a comment");
            assert_eq!(frame.into_data().ok().as_deref(), Some(KEEPALIVE));
            assert_eq!(start.elapsed(), Duration::from_secs(15 * n));
        }
        assert_eq!(m.keepalives.get(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn output_moves_the_keepalive_deadline_and_zero_disables_it() {
        let mut k = Keepalive::new(Script::new([]), Some(Duration::from_secs(15)), metrics());
        assert_eq!(poll(&mut k), Seen::Pending);
        tokio::time::advance(Duration::from_secs(10)).await;
        k.inner.push(data("x"));
        assert_eq!(poll(&mut k), Seen::data("x"));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            poll(&mut k),
            Seen::Pending,
            "15 s after the start, 10 s after the output"
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(poll(&mut k), Seen::data(": keepalive\n\n"));

        let mut off = Keepalive::new(Script::new([]), Some(Duration::ZERO), metrics());
        tokio::time::advance(Duration::from_secs(100)).await;
        assert_eq!(poll(&mut off), Seen::Pending);
    }
}
