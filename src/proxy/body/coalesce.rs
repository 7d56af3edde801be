//! Coalescing: the upstream chunks already there are taken in one client frame, so a burst of events costs one
//! write to the client instead of one per event.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::proxy::body::layer::{Gather, Polled};

use crate::proxy::upstream::error::StreamError;

/// Upstream bytes gathered into one client frame at most (only what is already there; nothing waits).
pub const COALESCE_BYTES: usize = 64 << 10;

/// An upstream poll's result kept for the next poll: the end, an error or trailers met while gathering data.
type Deferred<E> = Option<Option<Result<Frame<Bytes>, E>>>;

/// Batches of what the inner body has ready.
pub struct Coalesce<B: Body> {
    inner: B,
    deferred: Deferred<B::Error>,
    /// Bytes taken in the current batch.
    batch: usize,
}

impl<B: Body> Coalesce<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            deferred: None,
            batch: 0,
        }
    }
}

impl<B> Gather for Coalesce<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Unpin,
    B::Error: Into<StreamError>,
{
    fn poll_more(&mut self, cx: &mut Context<'_>) -> Option<Bytes> {
        if self.batch >= COALESCE_BYTES || self.deferred.is_some() {
            return None;
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(f))) if f.is_data() => {
                let data = f.into_data().ok()?;
                self.batch += data.len();
                Some(data)
            }
            Poll::Pending => None,
            Poll::Ready(other) => {
                self.deferred = Some(other);
                None
            }
        }
    }
}

#[cfg(test)]
impl<B: Body> Coalesce<B> {
    pub fn inner_ref(&self) -> &B {
        &self.inner
    }
}

impl<B> Body for Coalesce<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Unpin,
    B::Error: Into<StreamError>,
{
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        let polled = match this.deferred.take() {
            Some(ready) => ready,
            None => match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(ready) => ready,
                Poll::Pending => return Poll::Pending,
            },
        };
        if let Some(Ok(f)) = &polled {
            this.batch = f.data_ref().map_or(0, Bytes::len);
        }
        Poll::Ready(polled.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        match &self.deferred {
            Some(ready) => ready.is_none(),
            None => self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::script::{data, more, poll, Script, Seen, Step};

    #[test]
    fn a_batch_takes_what_is_ready_and_stops_at_pending() {
        let mut c = Coalesce::new(Script::new([data("a"), data("b"), Step::Pending, data("c")]));
        assert_eq!(poll(&mut c), Seen::data("a"));
        assert_eq!(more(&mut c).as_deref(), Some("b"));
        assert_eq!(more(&mut c), None, "pending ends the batch");
        assert_eq!(poll(&mut c), Seen::data("c"), "the next batch");
    }

    #[test]
    fn the_end_met_while_gathering_is_kept_for_the_next_poll() {
        let mut c = Coalesce::new(Script::new([data("a"), Step::End, data("never")]));
        assert_eq!(poll(&mut c), Seen::data("a"));
        assert_eq!(more(&mut c), None);
        assert!(c.is_end_stream(), "the kept end is known");
        assert_eq!(more(&mut c), None, "nothing is read past it");
        assert_eq!(poll(&mut c), Seen::End);
        assert_eq!(c.inner.polls(), 2);
    }

    #[test]
    fn errors_and_trailers_met_while_gathering_wait_their_turn() {
        let mut c = Coalesce::new(Script::new([data("a"), Step::Trailers, Step::Fail]));
        assert_eq!(poll(&mut c), Seen::data("a"));
        assert_eq!(more(&mut c), None);
        assert_eq!(poll(&mut c), Seen::Trailers);
        assert_eq!(poll(&mut c), Seen::Err);
    }

    #[test]
    fn a_batch_stops_at_coalesce_bytes() {
        let half = "x".repeat(COALESCE_BYTES / 2);
        let mut c = Coalesce::new(Script::new([data(&half), data(&half), data("next")]));
        assert_eq!(poll(&mut c), Seen::data(&half));
        assert!(more(&mut c).is_some());
        assert_eq!(more(&mut c), None, "the batch is full");
        assert_eq!(c.inner.polls(), 2, "and nothing more was read");
        assert_eq!(poll(&mut c), Seen::data("next"));
    }
}
