//! The translator's `Observer` for the daemon: counts per stream locally and flushes to Prometheus per frame.

use std::sync::Arc;

use prometheus::local::LocalHistogram;

use crate::envelope::EnvelopeKind;
use crate::telemetry::Metrics;
use crate::translate::{Observer, ParseErrorKind};

/// Per-stream accumulator. Envelope and item counts are summed locally and added to the shared counters once
/// per upstream frame (`flush`), so a frame that yields fifty envelopes touches each atomic once.
pub struct StreamObserver {
    metrics: Arc<Metrics>,
    envelope_bytes: LocalHistogram,
    item_events: LocalHistogram,
    /// Envelopes since the last flush, by kind.
    pending: [u32; 13],
    pending_items: u64,
    pending_fragmented: u64,
    /// Totals over the stream, for the end-of-stream log line.
    pub envelopes: u64,
    pub parse_errors: u64,
    pub unknown_tags: u64,
}

impl StreamObserver {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            envelope_bytes: metrics.translator.envelope_bytes.local(),
            item_events: metrics.translator.item_upstream_events.local(),
            metrics,
            pending: [0; 13],
            pending_items: 0,
            pending_fragmented: 0,
            envelopes: 0,
            parse_errors: 0,
            unknown_tags: 0,
        }
    }

    /// Adds what was counted since the last flush to the shared metrics.
    pub fn flush(&mut self) {
        let t = &self.metrics.translator;
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
        self.metrics.translator.oversize[kind as usize].inc();
    }

    fn block_closed(&mut self, kind: EnvelopeKind, chunks: u32) {
        self.metrics.translator.block_chunks[kind as usize].observe(f64::from(chunks));
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
        self.metrics.translator.parse_errors[kind as usize].inc();
    }

    fn unknown_tag(&mut self) {
        // Logged once per stream (the core's contract leaves that to the caller); never the tag's content.
        if self.unknown_tags == 0 {
            tracing::warn!("unknown legacy tag in stream (counted; further ones not logged)");
        }
        self.unknown_tags += 1;
        self.metrics.translator.unknown_tags.inc();
    }

    fn scope_conflict(&mut self) {
        self.metrics.translator.scope_conflicts.inc();
    }
}
