//! Following: a subscriber's stream read from the hub — a reconnection (the original's primary again) or a
//! watcher — replaying what it missed, then the events as the writer holds them, then the stream's end.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{Drain, Ending, Layer, Polled, Totals};
use crate::envelope::write_gateway_error;
use crate::proxy::drain::{write_draining_envelope, DrainCut, DRAINING_MESSAGE};
use crate::resume::hub::{Cursor, Read, Stream, BEHIND};
use crate::resume::metrics::ResumeMetrics;

/// One subscriber of a held stream.
pub struct Follow {
    stream: Arc<Stream>,
    cursor: Cursor,
    metrics: Arc<ResumeMetrics>,
    /// When the request came, until its first byte is sent.
    asked: Option<Instant>,
    done: bool,
}

impl Follow {
    pub fn new(stream: Arc<Stream>, cursor: Cursor, metrics: Arc<ResumeMetrics>, asked: Instant) -> Self {
        Self {
            stream,
            cursor,
            metrics,
            asked: Some(asked),
            done: false,
        }
    }
}

impl Body for Follow {
    type Data = Bytes;
    type Error = super::StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let read = std::task::ready!(this.stream.poll_read(&mut this.cursor, cx));
        let bytes = match read {
            Read::Events(bytes, events, replayed) => {
                if replayed {
                    this.metrics.replayed_events.inc_by(events);
                    this.metrics.replayed_bytes.inc_by(bytes.len() as u64);
                }
                bytes
            }
            Read::Behind => {
                this.done = true;
                this.metrics.watchers_closed.inc();
                let mut out = Vec::new();
                write_gateway_error(&mut out, this.stream.agent(), "watcher_behind", BEHIND);
                Bytes::from(out)
            }
            Read::End => {
                this.done = true;
                return Poll::Ready(None);
            }
        };
        if let Some(asked) = this.asked.take() {
            this.metrics.first_replayed_byte.observe(asked.elapsed().as_secs_f64());
        }
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drain for Follow {
    /// Ends with a `gateway_draining` envelope without an id: the client resumes from its last event elsewhere.
    fn cut_for_drain(&mut self) -> DrainCut {
        if self.done {
            return DrainCut::Nothing;
        }
        self.done = true;
        let mut out = Vec::new();
        write_draining_envelope(&mut out, self.stream.agent(), DRAINING_MESSAGE);
        DrainCut::Final(Bytes::from(out))
    }
}

impl Layer for Follow {
    fn ending(&mut self) -> Ending {
        Ending::Completed
    }

    fn totals(&self) -> Totals {
        Totals::default()
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.stream.detach(&self.cursor);
    }
}
