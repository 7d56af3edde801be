//! The translator's metric families, and its `Observer` for the daemon: counts per stream locally and flushes to
//! Prometheus at most once per `FLUSH_EVERY` while the stream runs (with a frame), and when it ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::local::LocalHistogram;
use prometheus::{exponential_buckets, Histogram, IntCounter, Registry};

use super::tap::{RunEnd, Tap, Taps};
use crate::envelope::EnvelopeKind;
use crate::sse::SseEvent;
use crate::telemetry::{counter, counters, histogram, histograms, latency_buckets};
use crate::translate::{Dialect, Observer, ParseErrorKind};

/// The dialects a stream is told as (never `auto`).
const DIALECTS: [Dialect; 4] = [Dialect::Xml, Dialect::Raw, Dialect::Cogency, Dialect::AgentSdk];

/// Translator-level families, resolved per envelope kind.
pub struct TranslatorMetrics {
    pub envelopes: [IntCounter; EnvelopeKind::ALL.len()],
    pub oversize: [IntCounter; EnvelopeKind::ALL.len()],
    pub block_chunks: [Histogram; EnvelopeKind::ALL.len()],
    pub envelope_bytes: Histogram,
    pub items: IntCounter,
    pub fragmented_items: IntCounter,
    pub item_upstream_events: Histogram,
    pub parse_errors: [IntCounter; ParseErrorKind::ALL.len()],
    pub unknown_tags: IntCounter,
    pub scope_conflicts: IntCounter,
    /// Streams by the dialect they were read as (`auto` is told as what it found).
    pub dialects: [IntCounter; DIALECTS.len()],
    /// Recorded by the response body, around each `feed`.
    pub event_translation: Histogram,
}

impl TranslatorMetrics {
    /// Creates the translator's families and registers them on `r`.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        let types = EnvelopeKind::ALL.map(EnvelopeKind::as_str);
        let block_chunks = histograms(
            r,
            "block_chunks",
            "Envelopes per closed block.",
            "type",
            exponential_buckets(1.0, 2.0, 14)?,
        )?;
        Ok(Self {
            envelopes: counters(r, "envelopes_total", "Envelopes written, by type.", "type", types)?,
            oversize: counters(
                r,
                "oversize_envelopes_total",
                "Envelopes sent over the byte budget (citations, oversized fixed fields).",
                "type",
                types,
            )?,
            block_chunks: types.map(|t| block_chunks.with_label_values(&[t])),
            envelope_bytes: histogram(
                r,
                "envelope_bytes",
                "Size of each envelope's JSON object.",
                exponential_buckets(32.0, 2.0, 12)?,
            )?,
            items: counter(r, "items_total", "Legacy items translated.")?,
            fragmented_items: counter(
                r,
                "fragmented_items_total",
                "Legacy items that spanned more than one upstream event or data: line.",
            )?,
            item_upstream_events: histogram(
                r,
                "item_upstream_events",
                "Upstream SSE events one legacy item spanned.",
                exponential_buckets(1.0, 2.0, 12)?,
            )?,
            parse_errors: counters(
                r,
                "parse_errors_total",
                "Bad upstream input answered by an error envelope.",
                "kind",
                ParseErrorKind::ALL.map(ParseErrorKind::as_str),
            )?,
            unknown_tags: counter(r, "unknown_tags_total", "Unknown legacy tags seen.")?,
            scope_conflicts: counter(
                r,
                "scope_conflicts_total",
                "Blocks opened while another was open, or sibling subagents interleaved.",
            )?,
            dialects: counters(
                r,
                "stream_dialects_total",
                "Translated streams by the upstream dialect they were read as.",
                "dialect",
                DIALECTS.map(Dialect::as_str),
            )?,
            event_translation: histogram(
                r,
                "event_translation_seconds",
                "Upstream body frame arrival to its translated output being yielded.",
                latency_buckets(),
            )?,
        })
    }
}

/// How long a running stream's counts stay local at least: they reach Prometheus with its first frame after that,
/// and at its end (a stream that pauses shows its last counts when it goes on or ends). A flush adds every touched
/// histogram bucket and counter to the shared atomics: once per frame, that cost more than the frame's own counting
/// (~400 instructions per event).
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Per-stream accumulator. Envelope and item counts and the frames' translation times are summed locally and added
/// to the shared families by `flush`: by `frame_done` at most once per `FLUSH_EVERY`, and when the stream ends.
pub struct StreamObserver {
    metrics: Arc<TranslatorMetrics>,
    envelope_bytes: LocalHistogram,
    item_events: LocalHistogram,
    translation: LocalHistogram,
    flushed: Instant,
    /// Envelopes since the last flush, by kind.
    pending: [u32; EnvelopeKind::ALL.len()],
    pending_items: u64,
    pending_fragmented: u64,
    /// Totals over the stream, for the end-of-stream log line.
    pub envelopes: u64,
    pub parse_errors: u64,
    pub unknown_tags: u64,
    /// The stream's other watchers (none unless traces or the inspector are on).
    taps: Taps,
}

impl StreamObserver {
    pub fn new(metrics: Arc<TranslatorMetrics>) -> Self {
        Self {
            envelope_bytes: metrics.envelope_bytes.local(),
            item_events: metrics.item_upstream_events.local(),
            translation: metrics.event_translation.local(),
            flushed: Instant::now(),
            metrics,
            pending: [0; EnvelopeKind::ALL.len()],
            pending_items: 0,
            pending_fragmented: 0,
            envelopes: 0,
            parse_errors: 0,
            unknown_tags: 0,
            taps: Taps::default(),
        }
    }

    /// Attaches a watcher to this stream.
    pub fn tap(&mut self, tap: Box<dyn Tap>) {
        self.taps.push(tap);
    }

    /// Tells the taps that the upstream's input ended: what is written from here on is the gateway's own.
    pub fn input_ended(&mut self) {
        if !self.taps.is_empty() {
            self.taps.each(|t| t.input_ended());
        }
    }

    /// Tells the taps how the run ended (once; a stream dropped untold is `Cancelled`).
    pub fn ended(&mut self, end: RunEnd) {
        self.taps.ended(end);
    }

    /// A frame whose input arrived at `arrived` is translated: its time is counted, and what was counted goes to
    /// the shared metrics if `FLUSH_EVERY` has passed since the last time.
    pub fn frame_done(&mut self, arrived: Instant) {
        let now = Instant::now();
        self.translation
            .observe(now.saturating_duration_since(arrived).as_secs_f64());
        if now.saturating_duration_since(self.flushed) >= FLUSH_EVERY {
            self.flushed = now;
            self.flush();
        }
    }

    /// Adds what was counted since the last flush to the shared metrics.
    pub fn flush(&mut self) {
        let t = &self.metrics;
        for (i, n) in self.pending.iter_mut().enumerate() {
            if *n > 0 {
                t.envelopes[i].inc_by(u64::from(*n));
                *n = 0;
            }
        }
        if self.pending_items > 0 {
            t.items.inc_by(std::mem::take(&mut self.pending_items));
            self.item_events.flush();
        }
        if self.pending_fragmented > 0 {
            t.fragmented_items.inc_by(std::mem::take(&mut self.pending_fragmented));
        }
        self.envelope_bytes.flush();
        self.translation.flush();
    }
}

impl Drop for StreamObserver {
    fn drop(&mut self) {
        self.flush();
    }
}

impl Observer for StreamObserver {
    fn envelope(&mut self, kind: EnvelopeKind, json_bytes: usize) {
        self.pending[kind as usize] += 1;
        self.envelopes += 1;
        self.envelope_bytes.observe(json_bytes as f64);
    }

    fn oversize(&mut self, kind: EnvelopeKind) {
        self.metrics.oversize[kind as usize].inc();
    }

    fn block_closed(&mut self, kind: EnvelopeKind, chunks: u32) {
        self.metrics.block_chunks[kind as usize].observe(f64::from(chunks));
    }

    fn item(&mut self, events: u32, lines: u32) {
        self.pending_items += 1;
        if events > 1 || lines > 1 {
            self.pending_fragmented += 1;
        }
        self.item_events.observe(f64::from(events));
    }

    fn parse_error(&mut self, kind: ParseErrorKind) {
        self.parse_errors += 1;
        self.metrics.parse_errors[kind as usize].inc();
        if !self.taps.is_empty() {
            self.taps.each(|t| t.parse_error(kind));
        }
    }

    fn unknown_tag(&mut self) {
        // Logged once per stream (the core's contract leaves that to the caller); never the tag's content.
        if self.unknown_tags == 0 {
            tracing::warn!("unknown legacy tag in stream (counted; further ones not logged)");
        }
        self.unknown_tags += 1;
        self.metrics.unknown_tags.inc();
    }

    fn scope_conflict(&mut self) {
        self.metrics.scope_conflicts.inc();
    }

    fn dialect(&mut self, dialect: Dialect) {
        if let Some(at) = DIALECTS.iter().position(|d| *d == dialect) {
            self.metrics.dialects[at].inc();
        }
        if !self.taps.is_empty() {
            self.taps.each(|t| t.dialect(dialect));
        }
    }

    fn sse(&mut self, ev: &SseEvent<'_>) {
        self.taps.sse(ev);
    }

    fn written(&mut self, kind: EnvelopeKind, event: &[u8]) {
        if !self.taps.is_empty() {
            self.taps.each(|t| t.written(kind, event));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observer() -> StreamObserver {
        let metrics = TranslatorMetrics::register(&Registry::new()).unwrap();
        StreamObserver::new(Arc::new(metrics))
    }

    /// What the shared families hold: text envelopes, envelope sizes, frame times.
    fn shared(o: &StreamObserver) -> (u64, u64, u64) {
        let m = &o.metrics;
        let text = m.envelopes[EnvelopeKind::Text as usize].get();
        (
            text,
            m.envelope_bytes.get_sample_count(),
            m.event_translation.get_sample_count(),
        )
    }

    #[test]
    fn counts_reach_the_shared_families_once_a_second_and_at_the_end() {
        let mut o = observer();
        o.envelope(EnvelopeKind::Text, 100);
        o.frame_done(Instant::now());
        assert_eq!(shared(&o), (0, 0, 0), "flushed before FLUSH_EVERY");
        // The last flush a second ago: the next frame carries everything counted since.
        o.flushed = Instant::now() - FLUSH_EVERY;
        o.envelope(EnvelopeKind::Text, 100);
        o.frame_done(Instant::now());
        assert_eq!(shared(&o), (2, 2, 2));
        o.envelope(EnvelopeKind::Text, 100);
        o.frame_done(Instant::now());
        assert_eq!(shared(&o), (2, 2, 2), "a second flush within FLUSH_EVERY");
        let metrics = Arc::clone(&o.metrics);
        drop(o);
        assert_eq!(
            metrics.envelopes[EnvelopeKind::Text as usize].get(),
            3,
            "the end flushes"
        );
        assert_eq!(metrics.event_translation.get_sample_count(), 3);
    }
}
