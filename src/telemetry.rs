//! Metric families (registered on the one `Registry` made in main, then handed out) and tracing setup.

use std::io::IsTerminal;

use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry,
};

use crate::config::{Log, LogFormat, UpstreamConnection};
use crate::envelope::EnvelopeKind;
use crate::translate::ParseErrorKind;

/// Where a client-supplied agent id came from; the `source` label of `rejected_agent_ids_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentSource {
    /// The configured agent header (`translate.agent_header`).
    Header,
    /// `agent_uuid` of a small JSON request body.
    Body,
}

impl AgentSource {
    /// In declaration order, so `s as usize` indexes it.
    pub const ALL: [AgentSource; 2] = [AgentSource::Header, AgentSource::Body];

    pub const fn as_str(self) -> &'static str {
        match self {
            AgentSource::Header => "header",
            AgentSource::Body => "body",
        }
    }
}

/// Every metric name starts with this.
pub const PREFIX: &str = "sse_gateway";

/// What the gateway did with a response body; the `mode` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Translate,
    Passthrough,
    Shadow,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Translate, Mode::Passthrough, Mode::Shadow];

    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Translate => "translate",
            Mode::Passthrough => "passthrough",
            Mode::Shadow => "shadow",
        }
    }
}

/// How a stream ended; the `outcome` label. Recorded exactly once per stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    UpstreamError,
    ClientGone,
    /// Still open at the drain deadline (`server.drain_timeout_secs` after SIGTERM) and ended by the gateway.
    Drained,
}

impl Outcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::UpstreamError => "upstream_error",
            Outcome::ClientGone => "client_gone",
            Outcome::Drained => "drained",
        }
    }
}

/// The `kind` label of `upstream_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamErrorKind {
    /// TCP connect failed or timed out.
    Connect,
    /// No response head within `upstream.response_timeout_secs`.
    Timeout,
    /// The response body failed mid-stream.
    Reset,
    /// Any other HTTP-level failure before the response head.
    Protocol,
    /// The upstream answered with a 5xx status.
    Status,
    /// An event stream ended without `[DONE]` or the backend's failure JSON.
    Truncated,
}

impl UpstreamErrorKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            UpstreamErrorKind::Connect => "connect",
            UpstreamErrorKind::Timeout => "timeout",
            UpstreamErrorKind::Reset => "reset",
            UpstreamErrorKind::Protocol => "protocol",
            UpstreamErrorKind::Status => "status",
            UpstreamErrorKind::Truncated => "truncated",
        }
    }
}

/// The `kind` label of `client_errors_total`: requests that failed through the client's fault, kept apart from
/// the upstream's so that no client can raise upstream-health alerts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientErrorKind {
    /// The request body broke its framing (answered 400).
    BadBody,
    /// The request body stalled past `server.body_read_timeout_secs` (answered 408).
    BodyTimeout,
    /// The client closed its connection before its request body ended.
    BodyIncomplete,
    /// An HTTP/1.1 request with no `Host` header or more than one (answered 400).
    BadHost,
}

impl ClientErrorKind {
    pub const ALL: [ClientErrorKind; 4] = [
        ClientErrorKind::BadBody,
        ClientErrorKind::BodyTimeout,
        ClientErrorKind::BodyIncomplete,
        ClientErrorKind::BadHost,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            ClientErrorKind::BadBody => "bad_body",
            ClientErrorKind::BodyTimeout => "body_timeout",
            ClientErrorKind::BodyIncomplete => "body_incomplete",
            ClientErrorKind::BadHost => "bad_host",
        }
    }
}

/// The `kind` label of `accept_errors_total`: why the public listener failed to accept a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptErrorKind {
    /// EMFILE: the process is at its open-file limit (`ulimit -n`, `LimitNOFILE`).
    Emfile,
    /// ENFILE: the system-wide open-file table is full.
    Enfile,
    /// Anything else (a connection reset before it was accepted, out of memory, ...).
    Other,
}

impl AcceptErrorKind {
    pub const ALL: [AcceptErrorKind; 3] = [AcceptErrorKind::Emfile, AcceptErrorKind::Enfile, AcceptErrorKind::Other];

    /// Classifies a failed `accept`.
    pub fn of(e: &std::io::Error) -> Self {
        // libc's EMFILE and ENFILE, which have the same values on Linux, the BSDs and macOS (std has no
        // `ErrorKind` for them, and libc is not a direct dependency for two constants).
        const EMFILE: i32 = 24;
        const ENFILE: i32 = 23;
        match e.raw_os_error() {
            Some(EMFILE) if cfg!(unix) => AcceptErrorKind::Emfile,
            Some(ENFILE) if cfg!(unix) => AcceptErrorKind::Enfile,
            _ => AcceptErrorKind::Other,
        }
    }

    /// Out of file descriptors: no connection can be accepted until one is closed.
    pub const fn is_fd_exhaustion(self) -> bool {
        matches!(self, AcceptErrorKind::Emfile | AcceptErrorKind::Enfile)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            AcceptErrorKind::Emfile => "emfile",
            AcceptErrorKind::Enfile => "enfile",
            AcceptErrorKind::Other => "other",
        }
    }
}

/// Per-mode handles resolved once, so the hot path never looks labels up.
#[derive(Clone)]
pub struct ModeMetrics {
    pub active_streams: IntGauge,
    pub stream_duration: Histogram,
    pub bytes_in: IntCounter,
    pub bytes_out: IntCounter,
    pub completed: IntCounter,
    pub upstream_error: IntCounter,
    pub client_gone: IntCounter,
    pub drained: IntCounter,
}

/// Translator-level families, resolved per envelope kind.
#[derive(Clone)]
pub struct TranslatorMetrics {
    pub envelopes: [IntCounter; 13],
    pub oversize: [IntCounter; 13],
    pub block_chunks: [Histogram; 13],
    pub envelope_bytes: Histogram,
    pub items: IntCounter,
    pub fragmented_items: IntCounter,
    pub item_upstream_events: Histogram,
    pub parse_errors: [IntCounter; ParseErrorKind::ALL.len()],
    pub unknown_tags: IntCounter,
    pub scope_conflicts: IntCounter,
    pub event_translation: Histogram,
}

/// All the daemon's metrics.
#[derive(Clone)]
pub struct Metrics {
    pub requests: IntCounterVec,
    pub modes: [ModeMetrics; 3],
    pub upstream_ttfb: Histogram,
    pub downstream_ttfb: Histogram,
    pub translator: TranslatorMetrics,
    /// By `UpstreamConnection`.
    pub upstream_requests: [IntCounter; 2],
    pub upstream_errors: IntCounterVec,
    /// By `ClientErrorKind`.
    pub client_errors: [IntCounter; 4],
    pub client_disconnects: IntCounter,
    /// By `AcceptErrorKind`.
    pub accept_errors: [IntCounter; 3],
    pub upstream_rejected: IntCounter,
    pub keepalives: IntCounter,
    /// By `proxy::agent::Source`.
    pub rejected_agent_ids: [IntCounter; 2],
    pub ready: IntGauge,
    pub draining: IntGauge,
}

fn name(n: &str) -> String {
    format!("{PREFIX}_{n}")
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> prometheus::Result<T> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

/// Latency buckets from 10 µs to ~40 s.
fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.000_01, 4.0, 12).unwrap_or_default()
}

impl Metrics {
    /// Creates every family and registers it on `r`.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        let requests = reg(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("requests_total"),
                    "Requests answered, by body mode and status class.",
                ),
                &["mode", "status_class"],
            )?,
        )?;
        let streams = reg(
            r,
            IntCounterVec::new(
                Opts::new(name("streams_total"), "Event streams ended, by mode and outcome."),
                &["mode", "outcome"],
            )?,
        )?;
        let active = reg(
            r,
            IntGaugeVec::new(Opts::new(name("active_streams"), "Event streams open now."), &["mode"])?,
        )?;
        let duration = reg(
            r,
            HistogramVec::new(
                HistogramOpts::new(name("stream_duration_seconds"), "Event stream lifetime.")
                    .buckets(exponential_buckets(0.01, 3.0, 12)?),
                &["mode"],
            )?,
        )?;
        let bytes_in = reg(
            r,
            IntCounterVec::new(
                Opts::new(name("bytes_in_total"), "Response body bytes read from the upstream."),
                &["mode"],
            )?,
        )?;
        let bytes_out = reg(
            r,
            IntCounterVec::new(
                Opts::new(name("bytes_out_total"), "Response body bytes sent to clients."),
                &["mode"],
            )?,
        )?;
        let modes = Mode::ALL.map(|m| {
            let l = m.as_str();
            ModeMetrics {
                active_streams: active.with_label_values(&[l]),
                stream_duration: duration.with_label_values(&[l]),
                bytes_in: bytes_in.with_label_values(&[l]),
                bytes_out: bytes_out.with_label_values(&[l]),
                completed: streams.with_label_values(&[l, Outcome::Completed.as_str()]),
                upstream_error: streams.with_label_values(&[l, Outcome::UpstreamError.as_str()]),
                client_gone: streams.with_label_values(&[l, Outcome::ClientGone.as_str()]),
                drained: streams.with_label_values(&[l, Outcome::Drained.as_str()]),
            }
        });
        let hist = |n: &str, help: &str, buckets: Vec<f64>| -> prometheus::Result<Histogram> {
            reg(
                r,
                Histogram::with_opts(HistogramOpts::new(name(n), help).buckets(buckets))?,
            )
        };
        let upstream_ttfb = hist(
            "upstream_ttfb_seconds",
            "Request sent upstream to response head received.",
            latency_buckets(),
        )?;
        let downstream_ttfb = hist(
            "downstream_ttfb_seconds",
            "Request received to first response body byte handed to the client connection.",
            latency_buckets(),
        )?;
        let event_translation = hist(
            "event_translation_seconds",
            "Upstream body frame arrival to its translated output being yielded.",
            latency_buckets(),
        )?;
        let envelope_bytes = hist(
            "envelope_bytes",
            "Size of each envelope's JSON object.",
            exponential_buckets(32.0, 2.0, 12)?,
        )?;
        let item_upstream_events = hist(
            "item_upstream_events",
            "Upstream SSE events one legacy item spanned.",
            exponential_buckets(1.0, 2.0, 12)?,
        )?;
        let envelopes = reg(
            r,
            IntCounterVec::new(
                Opts::new(name("envelopes_total"), "Envelopes written, by type."),
                &["type"],
            )?,
        )?;
        let oversize = reg(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("oversize_envelopes_total"),
                    "Envelopes sent over the byte budget (citations, oversized fixed fields).",
                ),
                &["type"],
            )?,
        )?;
        let block_chunks = reg(
            r,
            HistogramVec::new(
                HistogramOpts::new(name("block_chunks"), "Envelopes per closed block.")
                    .buckets(exponential_buckets(1.0, 2.0, 14)?),
                &["type"],
            )?,
        )?;
        let parse_errors = reg(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("parse_errors_total"),
                    "Bad upstream input answered by an error envelope.",
                ),
                &["kind"],
            )?,
        )?;
        let counter = |n: &str, help: &str| reg(r, IntCounter::new(name(n), help)?);
        let translator = TranslatorMetrics {
            envelopes: EnvelopeKind::ALL.map(|k| envelopes.with_label_values(&[k.as_str()])),
            oversize: EnvelopeKind::ALL.map(|k| oversize.with_label_values(&[k.as_str()])),
            block_chunks: EnvelopeKind::ALL.map(|k| block_chunks.with_label_values(&[k.as_str()])),
            envelope_bytes,
            items: counter("items_total", "Legacy items translated.")?,
            fragmented_items: counter(
                "fragmented_items_total",
                "Legacy items that spanned more than one upstream event or data: line.",
            )?,
            item_upstream_events,
            parse_errors: ParseErrorKind::ALL.map(|k| parse_errors.with_label_values(&[k.as_str()])),
            unknown_tags: counter("unknown_tags_total", "Unknown legacy tags seen.")?,
            scope_conflicts: counter(
                "scope_conflicts_total",
                "Blocks opened while another was open, or sibling subagents interleaved.",
            )?,
            event_translation,
        };
        let upstream_requests = reg(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("upstream_requests_total"),
                    "Requests sent upstream, by the connection they went on.",
                ),
                &["connection"],
            )?,
        )?;
        let upstream_requests = UpstreamConnection::ALL.map(|c| upstream_requests.with_label_values(&[c.as_str()]));
        let upstream_errors = reg(
            r,
            IntCounterVec::new(
                Opts::new(name("upstream_errors_total"), "Upstream failures, by kind."),
                &["kind"],
            )?,
        )?;
        for k in [
            UpstreamErrorKind::Connect,
            UpstreamErrorKind::Timeout,
            UpstreamErrorKind::Reset,
            UpstreamErrorKind::Protocol,
            UpstreamErrorKind::Status,
            UpstreamErrorKind::Truncated,
        ] {
            upstream_errors.with_label_values(&[k.as_str()]);
        }
        let client_errors = reg(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("client_errors_total"),
                    "Requests failed by the client (bad or stalled request body, bad Host), by kind.",
                ),
                &["kind"],
            )?,
        )?;
        let client_errors = ClientErrorKind::ALL.map(|k| client_errors.with_label_values(&[k.as_str()]));
        let rejected_agent_ids = reg(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("rejected_agent_ids_total"),
                    "Client-supplied agent ids ignored (too long or unsafe characters), by where they came from.",
                ),
                &["source"],
            )?,
        )?;
        let rejected_agent_ids = AgentSource::ALL.map(|s| rejected_agent_ids.with_label_values(&[s.as_str()]));
        let accept_errors = reg(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("accept_errors_total"),
                    "Failed accepts on the public listener, by kind (emfile, enfile: out of file descriptors).",
                ),
                &["kind"],
            )?,
        )?;
        let accept_errors = AcceptErrorKind::ALL.map(|k| accept_errors.with_label_values(&[k.as_str()]));
        Ok(Self {
            requests,
            modes,
            upstream_ttfb,
            downstream_ttfb,
            translator,
            upstream_requests,
            upstream_errors,
            client_errors,
            accept_errors,
            upstream_rejected: counter(
                "upstream_rejected_total",
                "Requests answered 503 because upstream.max_connections requests were in flight.",
            )?,
            client_disconnects: counter(
                "client_disconnects_total",
                "Responses whose client went away before the end.",
            )?,
            keepalives: counter(
                "keepalives_total",
                "Keepalive comments sent on idle translated streams.",
            )?,
            rejected_agent_ids,
            ready: reg(r, IntGauge::new(name("ready"), "1 while the gateway accepts traffic.")?)?,
            draining: reg(
                r,
                IntGauge::new(name("draining"), "1 while shutting down and draining streams.")?,
            )?,
        })
    }

    pub fn mode(&self, m: Mode) -> &ModeMetrics {
        &self.modes[m as usize]
    }

    pub fn upstream_request(&self, c: UpstreamConnection) {
        self.upstream_requests[c as usize].inc();
    }

    pub fn rejected_agent_id(&self, s: AgentSource) {
        self.rejected_agent_ids[s as usize].inc();
    }

    pub fn upstream_error(&self, k: UpstreamErrorKind) {
        self.upstream_errors.with_label_values(&[k.as_str()]).inc();
    }

    pub fn accept_error(&self, k: AcceptErrorKind) {
        self.accept_errors[k as usize].inc();
    }

    pub fn client_error(&self, k: ClientErrorKind) {
        self.client_errors[k as usize].inc();
    }

    pub fn request(&self, m: Mode, status: http::StatusCode) {
        let class = match status.as_u16() / 100 {
            1 => "1xx",
            2 => "2xx",
            3 => "3xx",
            4 => "4xx",
            _ => "5xx",
        };
        self.requests.with_label_values(&[m.as_str(), class]).inc();
    }
}

/// Installs the global tracing subscriber (logs go to stderr; stdout is for the startup banner).
pub fn init_tracing(log: &Log) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| tracing_subscriber::EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(&log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match log.format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
    };
    // A second init (tests starting several gateways in one process) keeps the first subscriber.
    drop(result);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_out_of_descriptors_are_told_apart() {
        let of = |code| AcceptErrorKind::of(&std::io::Error::from_raw_os_error(code));
        if cfg!(unix) {
            assert_eq!(of(24), AcceptErrorKind::Emfile);
            assert_eq!(of(23), AcceptErrorKind::Enfile);
            assert!(of(24).is_fd_exhaustion() && of(23).is_fd_exhaustion());
        }
        let reset = AcceptErrorKind::of(&std::io::ErrorKind::ConnectionAborted.into());
        assert_eq!(reset, AcceptErrorKind::Other);
        assert!(!reset.is_fd_exhaustion());
    }

    #[test]
    fn every_contract_family_is_registered() {
        let r = Registry::new();
        let m = Metrics::register(&r).unwrap();
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
            "accept_errors_total",
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
