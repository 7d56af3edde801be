//! Recording: the bytes and first byte sent to the client, how the stream ended (exactly once: a body dropped
//! before its end is a client gone), the stream metrics and the end-of-stream log line.

use crate::proxy::metrics::edge::{Fault, Outcome};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, SizeHint};

use crate::proxy::body::layer::{Drain, Ending, Layer, Polled, StreamInfo};

use crate::proxy::base::drain::DrainCut;
use crate::proxy::metrics::edge::Metrics;
use crate::proxy::upstream::error::StreamError;
use crate::proxy::upstream::kind::UpstreamErrorKind;

/// Records the stream carried by `L`; drops `L` (and so releases the upstream) as soon as the stream ends.
pub struct Record<L: Layer> {
    inner: Option<L>,
    info: StreamInfo,
    metrics: Arc<Metrics>,
    started: Instant,
    first_byte_sent: bool,
    bytes_out: u64,
}

impl<L: Layer> Record<L> {
    /// Counts the stream as active from now.
    pub fn new(inner: L, info: StreamInfo, metrics: Arc<Metrics>) -> Self {
        if info.event_stream {
            metrics.mode(info.mode).active_streams.inc();
        }
        Self {
            inner: Some(inner),
            info,
            metrics,
            started: Instant::now(),
            first_byte_sent: false,
            bytes_out: 0,
        }
    }

    /// The layer recorded, until the stream ends.
    pub fn inner_mut(&mut self) -> Option<&mut L> {
        self.inner.as_mut()
    }

    fn account(&mut self, bytes: &Bytes) {
        let n = bytes.len() as u64;
        self.bytes_out += n;
        self.metrics.mode(self.info.mode).bytes_out.inc_by(n);
        if !self.first_byte_sent {
            self.first_byte_sent = true;
            self.metrics
                .downstream_ttfb
                .observe(self.info.request_start.elapsed().as_secs_f64());
        }
    }

    /// The outcome of a layer's end, with the upstream failure it reports.
    fn outcome(&self, ending: Ending) -> Outcome {
        match ending {
            Ending::Cut if self.info.event_stream => {
                // Legacy streams end with [DONE] or the failure JSON; anything else was cut short.
                self.metrics.upstream.error(UpstreamErrorKind::Truncated);
                Outcome::UpstreamError
            }
            Ending::Completed | Ending::Cut => Outcome::Completed,
            Ending::Failed(e) => self.failed(&e),
            Ending::Drained => Outcome::Drained,
        }
    }

    /// Counts a failed exchange against whoever broke it: the client, if its request body failed (the upstream
    /// then only saw its request cut), else the upstream.
    fn failed(&self, e: &StreamError) -> Outcome {
        e.log(&self.info.span);
        match self.info.client_fault.get() {
            Some(kind) => {
                self.metrics.client_fault(Fault::Request(kind));
                Outcome::ClientGone
            }
            None => {
                self.metrics.upstream.error(e.kind());
                Outcome::UpstreamError
            }
        }
    }

    /// Records how the stream ended, once; later calls are ignored.
    fn end(&mut self, outcome: Outcome) {
        // Release the upstream now: on client_gone this closes the upstream connection at once.
        let Some(inner) = self.inner.take() else {
            return;
        };
        let totals = inner.totals();
        drop(inner);
        if outcome == Outcome::ClientGone {
            self.metrics.client_disconnects.inc();
        }
        if !self.info.event_stream {
            return;
        }
        let m = self.metrics.mode(self.info.mode);
        let duration = self.started.elapsed();
        m.active_streams.dec();
        m.stream_duration.observe(duration.as_secs_f64());
        m.outcomes[outcome as usize].inc();
        let _g = self.info.span.enter();
        tracing::info!(
            mode = self.info.mode.as_str(),
            outcome = outcome.as_str(),
            duration_ms = duration.as_millis() as u64,
            envelopes = totals.envelopes,
            parse_errors = totals.parse_errors,
            bytes_in = totals.bytes_in,
            bytes_out = self.bytes_out,
            "stream ended"
        );
    }
}

impl<L: Layer> Body for Record<L> {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(&mut *inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let last = inner.is_end_stream().then(|| inner.ending());
                if let Some(data) = frame.data_ref() {
                    this.account(data);
                }
                // The stream's last bytes: its end is recorded before they are sent, so the log line counts them.
                if let Some(ending) = last {
                    let outcome = this.outcome(ending);
                    this.end(outcome);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let outcome = this.failed(&e);
                this.end(outcome);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                let ending = inner.ending();
                let outcome = this.outcome(ending);
                this.end(outcome);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.as_ref().map_or_else(SizeHint::default, L::size_hint)
    }
}

impl<L: Layer> Drain for Record<L> {
    /// Records the `drained` outcome; a translated stream's last frame (its `gateway_draining` envelope) is
    /// counted as sent.
    fn cut_for_drain(&mut self) -> DrainCut {
        let Some(inner) = self.inner.as_mut() else {
            return DrainCut::Nothing;
        };
        let cut = inner.cut_for_drain();
        match &cut {
            DrainCut::Final(last) => self.account(last),
            DrainCut::Abort => {}
            DrainCut::Nothing => return cut,
        }
        self.end(Outcome::Drained);
        cut
    }
}

impl<L: Layer> Drop for Record<L> {
    fn drop(&mut self) {
        // Dropped before its end: the client connection went away (or was closed at the drain deadline).
        self.end(Outcome::ClientGone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::body::coalesce::Coalesce;
    use crate::proxy::body::original::Original;
    use crate::proxy::body::script::{data, poll, Script, Seen, Step};
    use crate::proxy::body::translate::Translate;
    use crate::proxy::metrics::translator::StreamObserver;
    use crate::proxy::request::body::ClientErrorKind;
    use crate::proxy::request::negotiate::Mode;
    use crate::translate::{Options, Translator};

    type Translated = Record<Translate<Coalesce<Script>>>;

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::register(&prometheus::Registry::new()).expect("metrics"))
    }

    fn info(mode: Mode, event_stream: bool) -> StreamInfo {
        StreamInfo {
            mode,
            event_stream,
            request_start: Instant::now(),
            span: tracing::Span::none(),
            client_fault: Default::default(),
        }
    }

    fn translated(m: &Arc<Metrics>, steps: impl IntoIterator<Item = Step>) -> Translated {
        let t = Translator::with_observer(
            Options::default(),
            "agent-1",
            StreamObserver::new(Arc::clone(&m.translator)),
        );
        let inner = Translate::new(Coalesce::new(Script::new(steps)), t, Arc::clone(m));
        Record::new(inner, info(Mode::Translate, true), Arc::clone(m))
    }

    fn errors(m: &Metrics, kind: UpstreamErrorKind) -> u64 {
        m.upstream.errors[kind as usize].get()
    }

    fn streams(m: &Metrics, mode: Mode, outcome: Outcome) -> u64 {
        m.mode(mode).outcomes[outcome as usize].get()
    }

    #[test]
    fn a_completed_stream_is_recorded_once_with_its_bytes() {
        let m = metrics();
        let mode = m.mode(Mode::Translate);
        let mut body = translated(&m, [data("data: [DONE]\n\n"), Step::End]);
        assert_eq!(mode.active_streams.get(), 1);
        let Seen::Data(out) = poll(&mut body) else {
            panic!("a frame")
        };
        assert_eq!(poll(&mut body), Seen::End);
        assert!(body.is_end_stream());
        assert_eq!(mode.active_streams.get(), 0);
        assert_eq!(mode.outcomes[Outcome::Completed as usize].get(), 1);
        assert_eq!(mode.bytes_out.get(), out.len() as u64);
        assert_eq!(m.downstream_ttfb.get_sample_count(), 1);
        drop(body);
        assert_eq!(
            mode.outcomes[Outcome::ClientGone as usize].get(),
            0,
            "the end was recorded already"
        );
        assert_eq!(m.client_disconnects.get(), 0);
    }

    #[test]
    fn a_body_dropped_before_its_end_is_a_client_gone() {
        let m = metrics();
        let body = translated(&m, [data("data: <content-block-text>\n\n")]);
        drop(body);
        assert_eq!(streams(&m, Mode::Translate, Outcome::ClientGone), 1);
        assert_eq!(m.client_disconnects.get(), 1);
        assert_eq!(m.mode(Mode::Translate).active_streams.get(), 0);
    }

    #[test]
    fn the_error_envelope_ends_the_stream_as_it_is_sent() {
        let m = metrics();
        let mut body = translated(&m, [data("data: <content-block-text>\n\n"), Step::Fail]);
        let Seen::Data(last) = poll(&mut body) else {
            panic!("the error envelope")
        };
        assert!(last.contains("upstream_error"), "{last}");
        assert!(
            body.is_end_stream(),
            "hyper may drop the body now: the outcome is already recorded"
        );
        assert_eq!(streams(&m, Mode::Translate, Outcome::UpstreamError), 1);
        assert_eq!(errors(&m, UpstreamErrorKind::Timeout), 1);
        assert_eq!(m.mode(Mode::Translate).bytes_out.get(), last.len() as u64);
        drop(body);
        assert_eq!(m.client_disconnects.get(), 0);
    }

    #[test]
    fn a_cut_event_stream_is_truncated() {
        let m = metrics();
        let mut body = translated(&m, [data("data: <content-block-text>\n\n"), Step::End]);
        while poll(&mut body) != Seen::End {}
        assert_eq!(errors(&m, UpstreamErrorKind::Truncated), 1);
        assert_eq!(streams(&m, Mode::Translate, Outcome::UpstreamError), 1);
    }

    /// A pass-through event stream whose upstream sends `a`, then fails.
    fn failing_pass_through(m: &Arc<Metrics>, info: StreamInfo) -> Record<Original<Coalesce<Script>>> {
        let inner = Original::new(Coalesce::new(Script::new([data("a"), Step::Fail])), None, Arc::clone(m));
        Record::new(inner, info, Arc::clone(m))
    }

    #[test]
    fn a_pass_through_failure_is_recorded_and_passed_up() {
        let m = metrics();
        let mut body = failing_pass_through(&m, info(Mode::Passthrough, true));
        assert_eq!(poll(&mut body), Seen::data("a"));
        assert_eq!(poll(&mut body), Seen::Err);
        assert!(body.is_end_stream());
        assert_eq!(streams(&m, Mode::Passthrough, Outcome::UpstreamError), 1);
        assert_eq!(errors(&m, UpstreamErrorKind::Timeout), 1);
        assert_eq!(m.mode(Mode::Passthrough).bytes_in.get(), 1);
    }

    #[test]
    fn a_failure_after_the_clients_request_body_failed_is_the_clients() {
        let m = metrics();
        let info = info(Mode::Passthrough, true);
        let fault = info.client_fault.clone();
        let mut body = failing_pass_through(&m, info);
        assert_eq!(poll(&mut body), Seen::data("a"));
        // The request body broke while the response streamed (hyper then fails the response generically).
        fault.mark(ClientErrorKind::BadBody);
        assert_eq!(poll(&mut body), Seen::Err);
        assert_eq!(m.client_errors[ClientErrorKind::BadBody as usize].get(), 1);
        assert_eq!(errors(&m, UpstreamErrorKind::Timeout), 0, "no upstream error counted");
        assert_eq!(streams(&m, Mode::Passthrough, Outcome::UpstreamError), 0);
        assert_eq!(streams(&m, Mode::Passthrough, Outcome::ClientGone), 1);
    }

    #[test]
    fn the_drain_cut_counts_its_envelope_and_records_drained() {
        let m = metrics();
        let mut body = translated(&m, [data("data: <content-block-text>\n\n")]);
        let DrainCut::Final(last) = body.cut_for_drain() else {
            panic!("a final frame")
        };
        assert_eq!(m.mode(Mode::Translate).bytes_out.get(), last.len() as u64);
        assert_eq!(streams(&m, Mode::Translate, Outcome::Drained), 1);
        assert!(matches!(body.cut_for_drain(), DrainCut::Nothing));
        assert_eq!(poll(&mut body), Seen::End);
        drop(body);
        assert_eq!(m.client_disconnects.get(), 0);
    }

    #[test]
    fn a_response_that_is_no_event_stream_counts_only_a_disconnect() {
        let m = metrics();
        let inner = Original::new(Coalesce::new(Script::new([data("{}")])), None, Arc::clone(&m));
        let mut body = Record::new(inner, info(Mode::Passthrough, false), Arc::clone(&m));
        assert_eq!(poll(&mut body), Seen::data("{}"));
        drop(body);
        assert_eq!(m.client_disconnects.get(), 1);
        assert_eq!(streams(&m, Mode::Passthrough, Outcome::ClientGone), 0);
        assert_eq!(m.mode(Mode::Passthrough).active_streams.get(), 0);
    }
}
