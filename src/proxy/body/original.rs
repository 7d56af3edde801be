//! The upstream's own bytes (pass-through and shadow modes): each batch of chunks is one client frame; in shadow
//! mode a translator reads along, for the metrics only.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::proxy::body::layer::{Drain, Ending, Layer, Polled, Totals};

use crate::proxy::body::layer::Gather;

use crate::proxy::base::drain::DrainCut;
use crate::proxy::metrics::edge::Metrics;
use crate::proxy::metrics::translator::StreamObserver;
use crate::proxy::request::negotiate::Mode;
use crate::proxy::upstream::error::StreamError;
use crate::translate::Translator;

/// First chunks up to this size are copied out of the upstream connection's read buffer (see `frame`).
pub const COPY_OUT_BYTES: usize = 4 << 10;

/// The upstream body `B` passed on byte for byte.
pub struct Original<B> {
    inner: B,
    /// Present in shadow mode.
    shadow: Option<Translator<StreamObserver>>,
    metrics: Arc<Metrics>,
    ending: Option<Ending>,
    done: bool,
    bytes_in: u64,
}

impl<B: Gather> Original<B> {
    pub fn new(inner: B, shadow: Option<Translator<StreamObserver>>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            shadow,
            metrics,
            ending: None,
            done: false,
            bytes_in: 0,
        }
    }

    fn mode(&self) -> Mode {
        if self.shadow.is_some() {
            Mode::Shadow
        } else {
            Mode::Passthrough
        }
    }

    fn end(&mut self, ending: Ending) {
        self.ending = Some(ending);
        self.stop();
    }

    /// No more frames: what the shadow translator counted goes to the shared metrics now.
    fn stop(&mut self) {
        self.done = true;
        if let Some(t) = self.shadow.as_mut() {
            t.observer_mut().flush();
        }
    }
}

/// One client frame of the upstream's own bytes: `first` and the chunks ready after it, each shown to `seen`
/// once. A small first chunk is copied out and dropped before the next read, so the connection reads into the
/// buffer it has (holding the chunk would make it allocate a new one per event); a large one is passed on
/// uncopied when nothing follows it. Returns the bytes taken and the frame.
fn frame(first: Bytes, inner: &mut impl Gather, cx: &mut Context<'_>, mut seen: impl FnMut(&[u8])) -> (usize, Bytes) {
    seen(&first);
    let mut size = first.len();
    if first.len() <= COPY_OUT_BYTES {
        let mut all = BytesMut::from(&first[..]);
        drop(first);
        while let Some(data) = inner.poll_more(cx) {
            size += data.len();
            seen(&data);
            all.extend_from_slice(&data);
        }
        return (size, all.freeze());
    }
    let mut more = Vec::new();
    while let Some(data) = inner.poll_more(cx) {
        size += data.len();
        seen(&data);
        more.push(data);
    }
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

impl<B: Gather> Body for Original<B> {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(f)) => {
                // Trailers belong to the original body: passed on.
                let first = match f.into_data() {
                    Ok(data) => data,
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                };
                let mode = this.mode();
                let (size, bytes) = match this.shadow.as_mut() {
                    Some(t) => {
                        let arrived = Instant::now();
                        let mut scratch = Vec::new();
                        let framed = frame(first, &mut this.inner, cx, |data| {
                            scratch.clear();
                            t.feed(data, &mut scratch);
                        });
                        t.observer_mut().frame_done(arrived);
                        framed
                    }
                    None => frame(first, &mut this.inner, cx, |_| {}),
                };
                let n = size as u64;
                this.bytes_in += n;
                this.metrics.mode(mode).bytes_in.inc_by(n);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Some(Err(e)) => {
                // Shadow: count what the translated stream would have ended with (an upstream failure; an idle
                // timeout is not counted so).
                if let Some(t) = this.shadow.as_mut().filter(|_| !matches!(e, StreamError::IdleTimeout)) {
                    t.abort(&e.message(), &mut Vec::new());
                }
                this.stop();
                Poll::Ready(Some(Err(e)))
            }
            None => {
                let ending = match this.shadow.as_mut() {
                    Some(t) => Ending::finished(t.finish(&mut Vec::new())),
                    None => Ending::Completed,
                };
                this.end(ending);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        // The upstream's bytes: its length is ours.
        self.inner.size_hint()
    }
}

impl<B: Gather> Drain for Original<B> {
    /// A stream of the upstream's bytes cannot say in-band that it was cut: it is aborted.
    fn cut_for_drain(&mut self) -> DrainCut {
        if self.done {
            return DrainCut::Nothing;
        }
        self.end(Ending::Drained);
        DrainCut::Abort
    }
}

impl<B: Gather> Layer for Original<B> {
    fn ending(&mut self) -> Ending {
        self.ending.take().unwrap_or(Ending::Drained)
    }

    fn totals(&self) -> Totals {
        Totals::of(self.bytes_in, self.shadow.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::coalesce::Coalesce;
    use crate::proxy::body::script::{data, poll, Script, Seen, Step};
    use crate::translate::Options;

    fn original(shadow: bool, steps: impl IntoIterator<Item = Step>) -> (Original<Coalesce<Script>>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::register(&prometheus::Registry::new()).expect("metrics"));
        let t = shadow.then(|| {
            Translator::with_observer(
                Options::default(),
                "agent-1",
                StreamObserver::new(Arc::clone(&metrics.translator)),
            )
        });
        (
            Original::new(Coalesce::new(Script::new(steps)), t, Arc::clone(&metrics)),
            metrics,
        )
    }

    #[test]
    fn ready_chunks_are_one_frame_of_the_same_bytes() {
        let big = "x".repeat(COPY_OUT_BYTES + 1);
        let (mut body, metrics) = original(
            false,
            [
                data("a"),
                data("b"),
                Step::Pending,
                data(&big),
                Step::Pending,
                data(&big),
                data("c"),
                Step::End,
            ],
        );
        assert_eq!(poll(&mut body), Seen::data("ab"), "up to the upstream's pending");
        assert!(
            poll(&mut body) == Seen::data(&big),
            "a large chunk alone is passed on as it is"
        );
        assert!(poll(&mut body) == Seen::Data(big.clone() + "c"));
        assert_eq!(poll(&mut body), Seen::End);
        assert!(matches!(body.ending(), Ending::Completed));
        let size = 2 + 2 * big.len() as u64 + 1;
        assert_eq!(body.totals().bytes_in, size);
        assert_eq!(metrics.mode(Mode::Passthrough).bytes_in.get(), size);
    }

    #[test]
    fn trailers_and_failures_are_passed_up() {
        let (mut body, _) = original(false, [data("a"), Step::Trailers, Step::Fail]);
        assert_eq!(poll(&mut body), Seen::data("a"));
        assert_eq!(poll(&mut body), Seen::Trailers);
        assert_eq!(poll(&mut body), Seen::Err);
        assert!(body.is_end_stream());
    }

    #[test]
    fn a_shadow_translator_reads_along_without_changing_a_byte() {
        let stream = "data: <content-block-text>\n\ndata: hi\n\ndata: </content-block-text>\n\n";
        let (mut body, metrics) = original(true, [data(stream), Step::End]);
        assert_eq!(poll(&mut body), Seen::data(stream));
        assert_eq!(poll(&mut body), Seen::End);
        assert!(body.totals().envelopes > 0);
        assert!(matches!(body.ending(), Ending::Cut), "no [DONE]");
        assert_eq!(metrics.mode(Mode::Shadow).bytes_in.get(), stream.len() as u64);
        assert_eq!(metrics.translator.event_translation.get_sample_count(), 1);
    }

    #[test]
    fn the_drain_cut_aborts() {
        let (mut body, _) = original(false, [data("a")]);
        assert_eq!(poll(&mut body), Seen::data("a"));
        assert!(matches!(body.cut_for_drain(), DrainCut::Abort));
        assert!(matches!(body.cut_for_drain(), DrainCut::Nothing));
        assert_eq!(poll(&mut body), Seen::End);
    }
}
