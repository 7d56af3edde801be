//! The proxy's metric families: requests, event streams by body mode, client faults; with the translator's
//! (`metrics::translator`) and the upstream's (`upstream::pool`), the handles the handler and the response body record into.

use std::sync::Arc;

use prometheus::{exponential_buckets, Histogram, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::proxy::metrics::translator::TranslatorMetrics;
use crate::proxy::request::agent::Source;
use crate::proxy::request::body::ClientErrorKind;
use crate::proxy::request::negotiate::Mode;
use crate::proxy::upstream::pool::UpstreamMetrics;
use crate::telemetry::{counter, counters, histogram, histograms, latency_buckets, name, register};

/// Per-mode handles resolved once, so the hot path never looks labels up.
pub struct ModeMetrics {
    pub active_streams: IntGauge,
    pub stream_duration: Histogram,
    pub bytes_in: IntCounter,
    pub bytes_out: IntCounter,
    /// `streams_total`, by `Outcome`.
    pub outcomes: [IntCounter; Outcome::ALL.len()],
}

/// A fault of the client's, as the edge counts it.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Its request: the body, the head, a stall.
    Request(ClientErrorKind),
    /// An agent id it supplied, refused.
    AgentId(Source),
}

/// Every family the proxy records.
pub struct Metrics {
    /// By mode, then `STATUS_CLASSES`.
    pub requests: [[IntCounter; STATUS_CLASSES.len()]; Mode::ALL.len()],
    pub modes: [ModeMetrics; Mode::ALL.len()],
    pub downstream_ttfb: Histogram,
    pub translator: Arc<TranslatorMetrics>,
    pub upstream: UpstreamMetrics,
    /// By `ClientErrorKind`.
    pub client_errors: [IntCounter; ClientErrorKind::ALL.len()],
    pub client_disconnects: IntCounter,
    pub keepalives: IntCounter,
    /// By `agent::Source`.
    pub rejected_agent_ids: [IntCounter; Source::ALL.len()],
}

impl Metrics {
    /// Creates the proxy's families (the translator's and the upstream's included) and registers them on `r`.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        let by_mode = |n: &str, help: &str| register(r, IntCounterVec::new(Opts::new(name(n), help), &["mode"])?);
        let streams = register(
            r,
            IntCounterVec::new(
                Opts::new(name("streams_total"), "Event streams ended, by mode and outcome."),
                &["mode", "outcome"],
            )?,
        )?;
        let active = register(
            r,
            IntGaugeVec::new(Opts::new(name("active_streams"), "Event streams open now."), &["mode"])?,
        )?;
        let duration = histograms(
            r,
            "stream_duration_seconds",
            "Event stream lifetime.",
            "mode",
            exponential_buckets(0.01, 3.0, 12)?,
        )?;
        let requests = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("requests_total"),
                    "Requests answered, by body mode and status class.",
                ),
                &["mode", "status_class"],
            )?,
        )?;
        let bytes_in = by_mode("bytes_in_total", "Response body bytes read from the upstream.")?;
        let bytes_out = by_mode("bytes_out_total", "Response body bytes sent to clients.")?;
        let modes = Mode::ALL.map(|m| {
            let l = m.as_str();
            ModeMetrics {
                active_streams: active.with_label_values(&[l]),
                stream_duration: duration.with_label_values(&[l]),
                bytes_in: bytes_in.with_label_values(&[l]),
                bytes_out: bytes_out.with_label_values(&[l]),
                outcomes: Outcome::ALL.map(|o| streams.with_label_values(&[l, o.as_str()])),
            }
        });
        Ok(Self {
            requests: Mode::ALL.map(|m| STATUS_CLASSES.map(|c| requests.with_label_values(&[m.as_str(), c]))),
            modes,
            downstream_ttfb: histogram(
                r,
                "downstream_ttfb_seconds",
                "Request received to first response body byte handed to the client connection.",
                latency_buckets(),
            )?,
            translator: Arc::new(TranslatorMetrics::register(r)?),
            upstream: UpstreamMetrics::register(r)?,
            client_errors: counters(
                r,
                "client_errors_total",
                "Requests failed by the client (bad or stalled request body, bad Host), by kind.",
                "kind",
                ClientErrorKind::ALL.map(ClientErrorKind::as_str),
            )?,
            client_disconnects: counter(
                r,
                "client_disconnects_total",
                "Responses whose client went away before the end.",
            )?,
            keepalives: counter(
                r,
                "keepalives_total",
                "Keepalive comments sent on idle translated streams.",
            )?,
            rejected_agent_ids: counters(
                r,
                "rejected_agent_ids_total",
                "Client-supplied agent ids ignored (too long or unsafe characters), by where they came from.",
                "source",
                Source::ALL.map(Source::as_str),
            )?,
        })
    }

    pub fn mode(&self, m: Mode) -> &ModeMetrics {
        &self.modes[m as usize]
    }

    /// Counts a client's fault: what it sent or how it stalled (`client_errors_total{kind}`), or an agent id
    /// refused (`rejected_agent_ids_total{source}`).
    pub fn client_fault(&self, fault: Fault) {
        match fault {
            Fault::Request(k) => self.client_errors[k as usize].inc(),
            Fault::AgentId(s) => self.rejected_agent_ids[s as usize].inc(),
        }
    }

    pub fn request(&self, m: Mode, status: http::StatusCode) {
        // Codes 600 to 999, which hyper lets through, count as 5xx.
        self.requests[m as usize][usize::from(status.as_u16() / 100).clamp(1, 5) - 1].inc();
    }
}

/// The `status_class` label's values, indexed by the status's first digit less one.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

label_enum! {
    /// How a stream ended; the `outcome` label. Recorded exactly once per stream.
    pub enum Outcome {
        Completed = "completed",
        UpstreamError = "upstream_error",
        ClientGone = "client_gone",
        /// Still open at the drain deadline (`server.drain_timeout_secs` after SIGTERM) and ended by the gateway.
        Drained = "drained",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::Health;

    #[test]
    fn every_contract_family_is_registered() {
        let r = Registry::new();
        let m = Metrics::register(&r).unwrap();
        Health::register(&r).unwrap();
        m.request(Mode::Translate, http::StatusCode::OK);
        m.translator.items.inc();
        m.translator.event_translation.observe(0.001);
        let names: Vec<String> = r.gather().iter().map(|f| f.get_name().to_owned()).collect();
        for n in [
            "requests_total",
            "streams_total",
            "active_streams",
            "stream_duration_seconds",
            "upstream_ttfb_seconds",
            "downstream_ttfb_seconds",
            "event_translation_seconds",
            "envelopes_total",
            "envelope_bytes",
            "oversize_envelopes_total",
            "block_chunks",
            "items_total",
            "fragmented_items_total",
            "item_upstream_events",
            "parse_errors_total",
            "unknown_tags_total",
            "scope_conflicts_total",
            "upstream_requests_total",
            "upstream_errors_total",
            "client_errors_total",
            "upstream_rejected_total",
            "client_disconnects_total",
            "keepalives_total",
            "rejected_agent_ids_total",
            "bytes_in_total",
            "bytes_out_total",
            "ready",
            "draining",
        ] {
            assert!(names.contains(&format!("sse_gateway_{n}")), "missing {n}: {names:?}");
        }
    }
}
