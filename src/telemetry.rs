//! What every metric family shares (the name prefix, registration, latency buckets) and tracing setup. Each
//! family is defined beside the code that records it, registered on the one `Registry` made in main.

use std::io::IsTerminal;

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

use crate::config::{Log, LogFormat};

/// Every metric name starts with this.
pub const PREFIX: &str = "sse_gateway";

/// `sse_gateway_{n}`.
pub fn name(n: &str) -> String {
    format!("{PREFIX}_{n}")
}

/// Registers `c` on `r` and returns it.
pub fn register<T: Collector + Clone + 'static>(r: &Registry, c: T) -> prometheus::Result<T> {
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

/// A registered counter `sse_gateway_{n}`.
pub fn counter(r: &Registry, n: &str, help: &str) -> prometheus::Result<IntCounter> {
    register(r, IntCounter::new(name(n), help)?)
}

/// A registered gauge `sse_gateway_{n}`.
pub fn gauge(r: &Registry, n: &str, help: &str) -> prometheus::Result<IntGauge> {
    register(r, IntGauge::new(name(n), help)?)
}

/// A registered histogram `sse_gateway_{n}`.
pub fn histogram(r: &Registry, n: &str, help: &str, buckets: Vec<f64>) -> prometheus::Result<Histogram> {
    register(
        r,
        Histogram::with_opts(HistogramOpts::new(name(n), help).buckets(buckets))?,
    )
}

/// A registered counter family `sse_gateway_{n}` with one label, resolved for each of `values`: every series
/// exists from the start, and the hot path indexes an array instead of looking labels up.
pub fn counters<const N: usize>(
    r: &Registry,
    n: &str,
    help: &str,
    label: &str,
    values: [&str; N],
) -> prometheus::Result<[IntCounter; N]> {
    let family = register(r, IntCounterVec::new(Opts::new(name(n), help), &[label])?)?;
    Ok(values.map(|v| family.with_label_values(&[v])))
}

/// A registered histogram family `sse_gateway_{n}` with one label.
pub fn histograms(
    r: &Registry,
    n: &str,
    help: &str,
    label: &str,
    buckets: Vec<f64>,
) -> prometheus::Result<HistogramVec> {
    register(
        r,
        HistogramVec::new(HistogramOpts::new(name(n), help).buckets(buckets), &[label])?,
    )
}

/// Latency buckets from 10 µs to ~40 s.
pub fn latency_buckets() -> Vec<f64> {
    exponential_buckets(0.000_01, 4.0, 12).unwrap_or_default()
}

/// An error with its causes, `outer: cause: root cause`, so a log line tells "connection refused" from
/// "no free local port" or a reset (hyper's own messages name only the outermost kind).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        // Errors that print their source themselves would repeat it.
        if !msg.ends_with(&part) {
            msg.push_str(": ");
            msg.push_str(&part);
        }
        source = s.source();
    }
    msg
}

/// Targets that log what the gateway keeps out of its logs (docs/SECURITY.md): the WebSocket library writes
/// every frame it sends (stream tokens, in ids) and every message it receives (the `sse-gateway.auth`
/// credential) at `debug` and `trace`.
const FRAME_LOGGERS: [&str; 2] = ["tungstenite", "tokio_tungstenite"];

/// Whether an event of `target` at `level` may be written: the frame loggers only from `info` up, whatever
/// `RUST_LOG` enables (a directive naming them or one of their modules included).
fn loggable(target: &str, level: &tracing::Level) -> bool {
    *level <= tracing::Level::INFO
        || !FRAME_LOGGERS.iter().any(|t| {
            target
                .strip_prefix(t)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
}

/// Installs the global tracing subscriber (logs go to stderr; stdout is for the startup banner).
pub fn init_tracing(log: &Log) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{filter, fmt, Layer};

    let env = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| filter::EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| filter::EnvFilter::new(&log.level));
    let layer = match log.format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Text => fmt::layer()
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let quiet = filter::filter_fn(|m| loggable(m.target(), m.level()));
    let result = tracing_subscriber::registry()
        .with(env)
        .with(layer.with_filter(quiet))
        .try_init();
    // A second init (tests starting several gateways in one process) keeps the first subscriber.
    drop(result);
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn the_websocket_librarys_frame_logging_is_never_written() {
        for target in [
            "tungstenite",
            "tungstenite::protocol",
            "tokio_tungstenite",
            "tokio_tungstenite::compat",
        ] {
            assert!(!loggable(target, &Level::TRACE), "{target}");
            assert!(!loggable(target, &Level::DEBUG), "{target}");
            assert!(loggable(target, &Level::WARN), "{target}");
        }
        assert!(loggable("sse_gateway::proxy", &Level::TRACE));
        assert!(loggable("tungstenite_other", &Level::TRACE));
    }
}
