//! Translation: each batch of upstream chunks becomes one frame of envelopes, each chunk translated (and dropped)
//! before the next is read; the upstream's end or failure becomes the stream's last envelopes.

use std::cell::RefCell;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame};

use crate::proxy::body::layer::{poll_kept_by_frame, Drain, Ending, Keep, Layer, Polled, Totals};

use crate::envelope::EnvelopeKind;
use crate::proxy::base::drain::{write_draining_envelope, DrainCut, DRAINING_MESSAGE};
use crate::proxy::body::layer::Gather;
use crate::proxy::metrics::edge::Metrics;
use crate::proxy::metrics::tap::RunEnd;
use crate::proxy::metrics::translator::StreamObserver;
use crate::proxy::request::negotiate::Mode;
use crate::translate::{Observer, StreamEnd, Translator};

/// Output of one translated client frame, past which the rest of the input waits for the next poll. With
/// identifiers bounded (`envelope::ids`), one `translate::FEED_STEP` of input adds at most ~70× its size, so a
/// frame stays under ~0.6 MiB, whatever the upstream sends, except where an item held whole (at most
/// `translate.max_item_bytes`) is flushed (docs/SECURITY.md).
pub const TRANSLATED_FRAME_LIMIT: usize = 256 << 10;

/// Room for the envelope around a translated chunk's text (type, agent id, flags), so a small event's frame is
/// written without growing its buffer.
const ENVELOPE_HEADROOM: usize = 256;

/// The translated stream of the upstream body `B`.
pub struct Translate<B> {
    inner: B,
    translator: Translator<StreamObserver>,
    metrics: Arc<Metrics>,
    /// Upstream bytes read but not yet translated: one read's output stops at `TRANSLATED_FRAME_LIMIT`, and the
    /// rest is translated at the next poll, before the upstream is read again.
    carry: Option<Bytes>,
    /// How the stream ended, once its last frame has been made (until `Record` takes it).
    ending: Option<Ending>,
    done: bool,
    bytes_in: u64,
}

impl<B: Gather> Translate<B> {
    pub fn new(inner: B, translator: Translator<StreamObserver>, metrics: Arc<Metrics>) -> Self {
        Self {
            inner,
            translator,
            metrics,
            carry: None,
            ending: None,
            done: false,
            bytes_in: 0,
        }
    }

    /// Translates a batch that starts with `first` into one frame's bytes in `out` (possibly none: a partial item
    /// is held).
    fn batch(&mut self, first: Bytes, out: &mut Vec<u8>, cx: &mut Context<'_>) {
        let t = &mut self.translator;
        // Each chunk is translated and dropped before the next is read, so the upstream connection reads into the
        // buffer it already has instead of allocating a new one.
        let room = first.len() + first.len() / 2 + ENVELOPE_HEADROOM;
        if out.capacity() == 0 {
            *out = Vec::with_capacity(room);
        } else {
            out.reserve(room);
        }
        let mut size = first.len();
        // A full frame: the rest waits, and nothing more is read (backpressure).
        let mut carry = feed(t, first, out);
        if carry.is_none() {
            while let Some(data) = self.inner.poll_more(cx) {
                size += data.len();
                carry = match carry.take() {
                    Some(held) => {
                        let mut joined = BytesMut::with_capacity(held.len() + data.len());
                        joined.extend_from_slice(&held);
                        joined.extend_from_slice(&data);
                        Some(joined.freeze())
                    }
                    None => feed(t, data, out),
                };
            }
        }
        self.carry = carry;
        let n = size as u64;
        self.bytes_in += n;
        self.metrics.mode(Mode::Translate).bytes_in.inc_by(n);
    }

    fn end(&mut self, ending: Ending) {
        self.ending = Some(ending);
        self.done = true;
        self.carry = None;
        self.translator.observer_mut().flush();
    }

    /// The stream's last frame, if `out` has bytes, after which the body has ended.
    fn last(&mut self, ending: Ending, out: &[u8]) -> Poll<bool> {
        self.end(ending);
        Poll::Ready(!out.is_empty())
    }

    /// Translates the next frame into `out` (empty when called): ready with true when it holds the frame's bytes,
    /// false when the stream has ended.
    fn poll_into(&mut self, cx: &mut Context<'_>, out: &mut Vec<u8>) -> Poll<bool> {
        loop {
            if self.done {
                return Poll::Ready(false);
            }
            if let Some(carry) = self.carry.take() {
                self.carry = feed(&mut self.translator, carry, out);
                self.translator.observer_mut().flush();
                if out.is_empty() {
                    continue;
                }
                return Poll::Ready(true);
            }
            match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    // Trailers belong to the original body: dropped from a translated stream.
                    let Ok(first) = frame.into_data() else {
                        continue;
                    };
                    let arrived = Instant::now();
                    self.batch(first, out, cx);
                    // Held bytes (a partial item): read on rather than send an empty frame.
                    if out.is_empty() {
                        continue;
                    }
                    self.translator.observer_mut().frame_done(arrived);
                    return Poll::Ready(true);
                }
                Some(Err(e)) => {
                    // The client gets a well-formed end: error envelope, then a clean end of body.
                    self.translator.observer_mut().input_ended();
                    self.translator.abort(&e.message(), out);
                    let kind = e.kind().as_str();
                    self.translator.observer_mut().ended(RunEnd::UpstreamFailed { kind });
                    return self.last(Ending::Failed(e), out);
                }
                None => {
                    let started = Instant::now();
                    self.translator.observer_mut().input_ended();
                    let end = self.translator.finish(out);
                    let obs = self.translator.observer_mut();
                    if !out.is_empty() {
                        obs.frame_done(started);
                    }
                    obs.ended(match end {
                        StreamEnd::Done => RunEnd::Done,
                        StreamEnd::Failed => RunEnd::BackendError,
                        StreamEnd::Cut => RunEnd::Cut,
                    });
                    return self.last(Ending::finished(end), out);
                }
            }
        }
    }
}

thread_local! {
    /// The buffer each thread lends a held stream's translation (`Layer::poll_kept`): the hub copies the frame
    /// out at once, so the frame needs no allocation of its own.
    static LENT: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Past this, the lent buffer is given back after its frame, so one large frame does not stay allocated per
/// thread.
const LENT_KEPT: usize = 64 << 10;

/// Translates `input` into `out` up to `TRANSLATED_FRAME_LIMIT`; returns the input left for the next frame. The
/// input is dropped before this returns when all of it was taken.
fn feed(t: &mut Translator<StreamObserver>, input: Bytes, out: &mut Vec<u8>) -> Option<Bytes> {
    let taken = t.feed_bounded(&input, out, TRANSLATED_FRAME_LIMIT);
    (taken < input.len()).then(|| input.slice(taken..))
}

impl<B: Gather> Body for Translate<B> {
    type Data = Bytes;
    type Error = crate::proxy::upstream::error::StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let mut out = Vec::new();
        match ready!(self.get_mut().poll_into(cx, &mut out)) {
            true => Poll::Ready(Some(Ok(Frame::data(Bytes::from(out))))),
            false => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

impl<B: Gather> Drain for Translate<B> {
    /// The stream's last frame is a `gateway_draining` envelope: what it had not yet translated is dropped, open
    /// blocks stay unclosed (the envelope says the stream was cut).
    fn cut_for_drain(&mut self) -> DrainCut {
        if self.done {
            return DrainCut::Nothing;
        }
        let t = &mut self.translator;
        t.observer_mut().input_ended();
        let mut out = Vec::new();
        let n = write_draining_envelope(&mut out, t.agent(), DRAINING_MESSAGE);
        let obs = t.observer_mut();
        obs.envelope(EnvelopeKind::Error, n);
        obs.written(EnvelopeKind::Error, &out);
        obs.block_closed(EnvelopeKind::Error, 1);
        obs.ended(RunEnd::Drained);
        self.end(Ending::Drained);
        DrainCut::Final(Bytes::from(out))
    }
}

impl<B: Gather> Layer for Translate<B> {
    fn ending(&mut self) -> Ending {
        self.ending.take().unwrap_or(Ending::Drained)
    }

    fn totals(&self) -> Totals {
        Totals::of(self.bytes_in, Some(&self.translator))
    }

    fn agent(&self) -> Option<&str> {
        self.translator.root_agent()
    }

    /// The frame is translated into this thread's lent buffer (or a buffer of its own if that is in use).
    fn poll_kept(&mut self, cx: &mut Context<'_>, keep: Keep<'_>) -> Polled {
        LENT.with(|lent| {
            let Ok(mut out) = lent.try_borrow_mut() else {
                return poll_kept_by_frame(self, cx, keep);
            };
            out.clear();
            let polled = match self.poll_into(cx, &mut out) {
                Poll::Ready(true) => Poll::Ready(Some(Ok(Frame::data(keep(&out, self.agent()))))),
                Poll::Ready(false) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            };
            if out.capacity() > LENT_KEPT {
                *out = Vec::new();
            }
            polled
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::coalesce::Coalesce;
    use crate::proxy::body::script::{data, poll, Script, Seen, Step};
    use crate::translate::{translate_all, Options};

    const AGENT: &str = "agent-1";

    fn translate(steps: impl IntoIterator<Item = Step>) -> (Translate<Coalesce<Script>>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::register(&prometheus::Registry::new()).expect("metrics"));
        let t = Translator::with_observer(
            Options::default(),
            AGENT,
            StreamObserver::new(Arc::clone(&metrics.translator)),
        );
        let body = Translate::new(Coalesce::new(Script::new(steps)), t, Arc::clone(&metrics));
        (body, metrics)
    }

    /// A legacy text block of `events` events of `size` bytes each.
    fn text_stream(events: usize, size: usize) -> Vec<String> {
        let mut s = vec!["data: <content-block-text>\n\n".to_owned()];
        s.extend((0..events).map(|i| {
            format!(
                "data: {}\n\n",
                char::from(b'a' + (i % 26) as u8).to_string().repeat(size)
            )
        }));
        s.push("data: </content-block-text>\n\ndata: [DONE]\n\n".to_owned());
        s
    }

    fn expected(chunks: &[String]) -> String {
        let (out, _) = translate_all(Options::default(), AGENT, chunks.concat().as_bytes());
        String::from_utf8(out).expect("utf-8")
    }

    /// The frames `poll_frame` gives until the end, pending polls skipped.
    fn frames_of(body: &mut Translate<Coalesce<Script>>) -> Vec<String> {
        let mut frames = Vec::new();
        loop {
            match poll(body) {
                Seen::Data(d) => frames.push(d),
                Seen::Pending => continue,
                Seen::End => return frames,
                other => panic!("{other:?}"),
            }
        }
    }

    /// Frames through `poll_kept` (what `keep` was given, and the stream's agent), with the lent buffer held by
    /// someone else during each poll when `lent_in_use`.
    fn kept_frames(steps: Vec<Step>, lent_in_use: bool) -> Vec<(String, Option<String>)> {
        let (mut body, _) = translate(steps);
        let mut kept = Vec::new();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        loop {
            let mut keep = |data: &[u8], agent: Option<&str>| {
                kept.push((String::from_utf8_lossy(data).into_owned(), agent.map(str::to_owned)));
                Bytes::from_static(b"kept")
            };
            let polled = LENT.with(|l| {
                // Held across the poll, the translation must fall back to a frame of its own.
                let _held = lent_in_use.then(|| l.borrow_mut());
                body.poll_kept(&mut cx, &mut keep)
            });
            match polled {
                Poll::Ready(Some(Ok(frame))) => {
                    assert_eq!(frame.into_data().ok(), Some(Bytes::from_static(b"kept")))
                }
                Poll::Ready(None) => break,
                Poll::Pending => continue,
                Poll::Ready(Some(Err(_))) => panic!("a translated stream ends in-band"),
            }
        }
        kept
    }

    #[test]
    fn kept_frames_are_the_frames_whether_or_not_the_buffer_is_lent() {
        let chunks = text_stream(40, 30);
        let steps = || {
            let mut steps: Vec<Step> = chunks.iter().map(|c| data(c)).collect();
            steps.insert(3, Step::Pending);
            steps.insert(20, Step::Pending);
            steps.push(Step::End);
            steps
        };
        let frames = frames_of(&mut translate(steps()).0);
        assert_eq!(frames.concat(), expected(&chunks));
        let lent = kept_frames(steps(), false);
        let own = kept_frames(steps(), true);
        assert_eq!(lent, own);
        assert_eq!(lent.into_iter().map(|(d, _)| d).collect::<Vec<_>>(), frames);
    }

    #[test]
    fn a_large_frame_does_not_stay_in_the_lent_buffer() {
        let chunks = text_stream(1, LENT_KEPT * 2);
        let mut steps: Vec<Step> = chunks.iter().map(|c| data(c)).collect();
        steps.push(Step::End);
        let kept = kept_frames(steps, false);
        assert!(kept.iter().map(|(d, _)| d.len()).sum::<usize>() > LENT_KEPT * 2);
        assert!(LENT.with(|l| l.borrow().capacity()) <= LENT_KEPT);
    }

    #[test]
    fn ready_chunks_make_one_frame_and_the_end_its_last() {
        let chunks = text_stream(3, 10);
        let mut steps: Vec<Step> = chunks.iter().map(|c| data(c)).collect();
        steps.insert(2, Step::Pending);
        steps.push(Step::End);
        let (mut body, metrics) = translate(steps);
        let frames = frames_of(&mut body);
        assert_eq!(frames.len(), 2, "two batches; the end's output joins the second");
        assert_eq!(frames.concat(), expected(&chunks));
        assert!(body.is_end_stream());
        assert!(matches!(body.ending(), Ending::Completed));
        let size: usize = chunks.iter().map(String::len).sum();
        assert_eq!(body.totals().bytes_in, size as u64);
        assert_eq!(metrics.mode(Mode::Translate).bytes_in.get(), size as u64);
        // Within the first second, the stream's end is what flushed its translator counts.
        assert_eq!(metrics.translator.event_translation.get_sample_count(), 2);
        assert!(metrics.translator.items.get() > 0);
    }

    #[test]
    fn a_full_frame_leaves_the_rest_of_its_input_unread_until_the_next_poll() {
        let chunks = text_stream(400, 1000);
        let (mut body, _) = translate([data(&chunks.concat()), Step::End]);
        let Seen::Data(first) = poll(&mut body) else {
            panic!("a frame")
        };
        assert!(first.len() >= TRANSLATED_FRAME_LIMIT, "{}", first.len());
        assert!(first.len() < TRANSLATED_FRAME_LIMIT + 70 * crate::translate::FEED_STEP);
        assert!(body.carry.is_some());
        assert_eq!(body.inner_polls(), 1, "nothing more was read");
        let Seen::Data(rest) = poll(&mut body) else {
            panic!("the carry's frame")
        };
        assert!(body.carry.is_none());
        assert_eq!(
            body.inner_polls(),
            1,
            "the carry is translated before the upstream is read again"
        );
        let mut all = first + &rest;
        while let Seen::Data(d) = poll(&mut body) {
            all.push_str(&d);
        }
        assert_eq!(all, expected(&chunks));
    }

    #[test]
    fn an_upstream_failure_ends_the_stream_with_an_error_envelope() {
        let (mut body, _) = translate([data("data: <content-block-text>\n\ndata: hi\n\n"), Step::Fail]);
        assert!(matches!(poll(&mut body), Seen::Data(_)));
        let Seen::Data(last) = poll(&mut body) else {
            panic!("the error envelope")
        };
        assert!(
            last.contains("upstream_error") && last.contains("upstream.idle_timeout_secs"),
            "{last}"
        );
        assert!(body.is_end_stream());
        assert!(matches!(body.ending(), Ending::Failed(_)));
        assert_eq!(poll(&mut body), Seen::End);
    }

    #[test]
    fn trailers_are_dropped_and_a_cut_stream_says_so() {
        let (mut body, _) = translate([data("data: <content-block-text>\n\n"), Step::Trailers, Step::End]);
        let mut seen = Vec::new();
        while !body.is_end_stream() {
            seen.push(poll(&mut body));
        }
        assert!(!seen.contains(&Seen::Trailers), "{seen:?}");
        assert!(matches!(body.ending(), Ending::Cut));
    }

    #[test]
    fn the_drain_cut_is_a_gateway_draining_envelope_then_the_end() {
        let (mut body, _) = translate([data("data: <content-block-text>\n\ndata: hi\n\n")]);
        assert!(matches!(poll(&mut body), Seen::Data(_)));
        let DrainCut::Final(last) = body.cut_for_drain() else {
            panic!("a final frame")
        };
        assert!(String::from_utf8_lossy(&last).contains("gateway_draining"));
        assert!(matches!(body.cut_for_drain(), DrainCut::Nothing), "once");
        assert_eq!(poll(&mut body), Seen::End);
        assert!(matches!(body.ending(), Ending::Drained));
    }

    impl Translate<Coalesce<Script>> {
        fn inner_polls(&self) -> usize {
            self.inner.inner_ref().polls()
        }
    }
}
