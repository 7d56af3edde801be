//! Holding: gives each translated event its id and keeps it in the stream's hub entry, so a reconnect can be
//! answered from it; when the client goes away mid-run, hands the upstream to a task of its own (`pump`) that
//! reads it on, into the hub, through the grace period.
//!
//! While the client is attached, this layer is the stream's writer inline (no task, no channel); the pump exists
//! only between a disconnect and the run's end.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use crate::proxy::base::drain::DrainCut;
use crate::proxy::body::layer::{Drain, Ending, Layer, Polled, Totals};
use crate::resume::hub::{Go, Stream};
use crate::resume::metrics::End;

/// The translated stream `L`, held in `stream` when it is resumable (`None`: passed on untouched).
pub struct Hold<L: Layer + Send + 'static> {
    inner: Option<L>,
    stream: Option<Arc<Stream>>,
    ended: bool,
    /// The stream was given the run's own agent (see `write_next`).
    named: bool,
}

impl<L: Layer + Send + 'static> Hold<L> {
    pub fn new(inner: L, stream: Option<Arc<Stream>>) -> Self {
        Self {
            inner: Some(inner),
            stream,
            ended: false,
            named: false,
        }
    }

    fn stop(&mut self, out: Bytes) -> Polled {
        self.ended = true;
        self.inner = None;
        if out.is_empty() {
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Ok(Frame::data(out))))
    }
}

impl<L: Layer + Send + 'static> Body for Hold<L> {
    type Data = Bytes;
    type Error = crate::proxy::upstream::error::StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let Some(stream) = this.stream.as_ref() else {
            return Pin::new(inner).poll_frame(cx);
        };
        if this.ended {
            return Poll::Ready(None);
        }
        // While it is the primary, the original always has room: the state is read only when it changed.
        if stream.must_check() {
            match stream.writer_check(Instant::now(), cx) {
                Go::Read => {}
                Go::Wait => return Poll::Pending,
                Go::Stop(_, out) => return this.stop(out),
            }
        }
        let polled = write_next(inner, stream, &mut this.named, cx);
        this.ended = matches!(polled, Poll::Ready(None | Some(Err(_))));
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.as_ref().is_none_or(|i| i.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl<L: Layer + Send + 'static> Drain for Hold<L> {
    /// The draining envelope is held too, with its id: a reader on another instance then sees why the run ended.
    fn cut_for_drain(&mut self) -> DrainCut {
        let Some(inner) = self.inner.as_mut() else {
            return DrainCut::Nothing;
        };
        let cut = inner.cut_for_drain();
        match (cut, self.stream.as_ref()) {
            (DrainCut::Final(last), Some(stream)) if !self.ended => {
                self.ended = true;
                DrainCut::Final(stream.finish(&last, End::Drained))
            }
            (cut, _) => cut,
        }
    }
}

impl<L: Layer + Send + 'static> Layer for Hold<L> {
    fn ending(&mut self) -> Ending {
        self.inner.as_mut().map_or(Ending::Completed, |i| i.ending())
    }

    fn totals(&self) -> Totals {
        self.inner.as_ref().map(|i| i.totals()).unwrap_or_default()
    }
}

impl<L: Layer + Send + 'static> Drop for Hold<L> {
    /// The client went away mid-run: the grace period starts, with a pump reading the upstream on; with no grace
    /// the run ends now, as it would without resumption.
    fn drop(&mut self) {
        let (Some(inner), Some(stream)) = (self.inner.take(), self.stream.take()) else {
            return;
        };
        if self.ended {
            return;
        }
        stream.original_gone();
        match tokio::runtime::Handle::try_current() {
            // Grace left, or a reconnection already attached (no deadline then).
            Ok(rt) if stream.grace_deadline().is_none_or(|d| d > Instant::now()) => {
                rt.spawn(Pump {
                    inner,
                    stream,
                    grace: None,
                    named: self.named,
                });
            }
            // No grace, or no runtime to read on in (shutdown): ends now with its `stream_abandoned` envelope.
            _ => stream.abandon(),
        }
    }
}

/// Reads a stream's upstream into the hub while no client is attached, until the run ends, nobody comes back
/// within the grace period, or it is cancelled.
struct Pump<L: Layer> {
    inner: L,
    stream: Arc<Stream>,
    grace: Option<Pin<Box<Sleep>>>,
    named: bool,
}

impl<L: Layer> Pump<L> {
    /// Arms the grace timer for the stream's deadline; true when it has passed.
    fn grace_over(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.stream.grace_deadline() else {
            self.grace = None;
            return false;
        };
        let deadline = tokio::time::Instant::from_std(deadline);
        let sleep = self
            .grace
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}

impl<L: Layer> Future for Pump<L> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match this.stream.writer_check(Instant::now(), cx) {
                Go::Read => {}
                Go::Stop(..) => return Poll::Ready(()),
                Go::Wait => {
                    if this.grace_over(cx) {
                        continue;
                    }
                    return Poll::Pending;
                }
            }
            match write_next(&mut this.inner, &this.stream, &mut this.named, cx) {
                Poll::Pending if this.grace_over(cx) => continue,
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
            }
        }
    }
}

/// One read of the upstream into the stream, for both writers (the original body, then the pump): its events
/// with their ids, or its end held. Pending, the writer is registered for a reconnection, a detach or a cancel.
/// Until the run names its own agent (`named`), each frame asks the translator whether it has: the envelopes the
/// gateway writes about the stream then name it (one flag test per frame afterwards). The frame's bytes are
/// copied into the stream (`poll_kept`), so the translator lends its buffer instead of allocating one.
fn write_next<L: Layer>(inner: &mut L, stream: &Stream, named: &mut bool, cx: &mut Context<'_>) -> Polled {
    let mut keep = |data: &[u8], agent: Option<&str>| {
        if let (false, Some(agent)) = (*named, agent) {
            stream.set_agent(agent);
            *named = true;
        }
        stream.append(data)
    };
    match inner.poll_kept(cx, &mut keep) {
        Poll::Pending => {
            if !stream.writer_waits(cx) {
                // A cancel came meanwhile: poll again to see it.
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        }
        ended @ Poll::Ready(None | Some(Err(_))) => {
            stream.finish(&[], End::Completed);
            ended
        }
        frame => frame,
    }
}
