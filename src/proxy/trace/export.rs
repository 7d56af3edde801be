//! The exporter: ended spans go to a bounded queue (a full queue drops the span and counts it, never blocks the
//! stream that ended it), and one task sends them in batches as OTLP/HTTP protobuf on the gateway's own hyper
//! client, retrying 429/502/503/504 as the collector's `Retry-After` asks. The SDK's batch processor is not used:
//! it counts its drops only in a log line at shutdown, and the drop count is a metric here.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::Context;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus::{IntCounter, Registry};
use prost::Message;
use tokio::sync::mpsc;

use super::settings::TraceSettings;
use crate::telemetry::counters;

/// The longest `Retry-After` honoured; a collector asking for more gets the batch dropped at its export deadline.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// The first wait before a retry the collector gave no `Retry-After` for; doubled each time.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// A collector's answer body read at most (it is discarded).
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Why spans were dropped (`sse_gateway_otel_spans_dropped_total{reason}`).
#[derive(Clone)]
pub struct DropCounters {
    /// The queue was full: the collector is slower than the spans.
    pub queue_full: IntCounter,
    /// The export failed for good (refused, unreachable past the deadline, or a non-retryable answer).
    pub export_failed: IntCounter,
}

impl DropCounters {
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        let [queue_full, export_failed] = counters(
            r,
            "otel_spans_dropped_total",
            "Spans not exported: the queue was full, or the collector refused or could not be reached in time.",
            "reason",
            ["queue_full", "export_failed"],
        )?;
        Ok(Self {
            queue_full,
            export_failed,
        })
    }
}

/// The span processor: ended spans into the bounded queue.
#[derive(Debug)]
pub struct Queue {
    tx: mpsc::Sender<SpanData>,
    dropped: IntCounter,
}

impl std::fmt::Debug for DropCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DropCounters")
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Starts the export task on `rt`; returns the processor that feeds it.
pub fn start(settings: &TraceSettings, resource: &Resource, drops: DropCounters, rt: &tokio::runtime::Handle) -> Queue {
    let (tx, rx) = mpsc::channel(settings.max_queue);
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(1)
        .build(connector(settings.request_timeout));
    let sender = Sender {
        client,
        settings: Arc::new(settings.clone()),
        resource: ResourceAttributesWithSchema::from(resource),
        failed: drops.export_failed,
    };
    rt.spawn(sender.run(rx));
    Queue {
        tx,
        dropped: drops.queue_full,
    }
}

fn connector(timeout: Duration) -> HttpConnector {
    let mut c = HttpConnector::new();
    c.set_connect_timeout(Some(timeout));
    c.set_nodelay(true);
    c
}

struct Sender {
    client: Client<HttpConnector, Full<Bytes>>,
    settings: Arc<TraceSettings>,
    resource: ResourceAttributesWithSchema,
    failed: IntCounter,
}

/// What one attempt to send a batch came to.
enum Sent {
    Done,
    /// Worth trying again, after the collector's `Retry-After` if it gave one.
    Retry(Option<Duration>),
    Failed,
}

impl Sender {
    /// Collects batches (full, or `schedule_delay` after their first span) and sends each; ends when every
    /// processor is gone, after sending what is left.
    async fn run(self, mut rx: mpsc::Receiver<SpanData>) {
        let max = self.settings.max_batch;
        loop {
            let Some(first) = rx.recv().await else { return };
            let mut batch = Vec::with_capacity(max.min(64));
            batch.push(first);
            let deadline = tokio::time::Instant::now() + self.settings.schedule_delay;
            while batch.len() < max {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(s)) => batch.push(s),
                    Ok(None) | Err(_) => break,
                }
            }
            self.export(batch).await;
        }
    }

    async fn export(&self, batch: Vec<SpanData>) {
        let n = batch.len() as u64;
        let body = match self.encode(batch) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "trace batch not encoded: dropped");
                self.failed.inc_by(n);
                return;
            }
        };
        let deadline = Instant::now() + self.settings.export_timeout;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let wait = match self.send(body.clone()).await {
                Sent::Done => return,
                Sent::Failed => break,
                Sent::Retry(after) => after.unwrap_or(backoff).min(MAX_RETRY_AFTER),
            };
            backoff = (backoff * 2).min(MAX_RETRY_AFTER);
            if Instant::now() + wait >= deadline {
                break;
            }
            tokio::time::sleep(wait).await;
        }
        self.failed.inc_by(n);
    }

    fn encode(&self, batch: Vec<SpanData>) -> std::io::Result<Bytes> {
        let req = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(batch, &self.resource),
        };
        let raw = req.encode_to_vec();
        if !self.settings.gzip {
            return Ok(Bytes::from(raw));
        }
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(raw.len() / 2), flate2::Compression::fast());
        gz.write_all(&raw)?;
        Ok(Bytes::from(gz.finish()?))
    }

    async fn send(&self, body: Bytes) -> Sent {
        let s = &self.settings;
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(s.endpoint.clone())
            .header(header::CONTENT_TYPE, "application/x-protobuf");
        if s.gzip {
            req = req.header(header::CONTENT_ENCODING, "gzip");
        }
        for (k, v) in &s.headers {
            req = req.header(k, v);
        }
        let Ok(req) = req.body(Full::new(body)) else {
            return Sent::Failed;
        };
        let answer = tokio::time::timeout(s.request_timeout, async {
            let resp = self.client.request(req).await?;
            let status = resp.status();
            let after = resp
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| retry_after(v.to_str().ok()?));
            // Read (bounded) and dropped, so the connection can be reused.
            let _ = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await;
            Ok::<_, hyper_util::client::legacy::Error>((status, after))
        });
        match answer.await {
            Ok(Ok((status, _))) if status.is_success() => Sent::Done,
            Ok(Ok((status, after))) if retryable(status) => Sent::Retry(after),
            Ok(Ok((status, _))) => {
                tracing::warn!(%status, "collector refused a trace batch: dropped");
                Sent::Failed
            }
            // Unreachable, reset or slow: transient as far as this end can tell.
            Ok(Err(_)) | Err(_) => Sent::Retry(None),
        }
    }
}

/// The OTLP exporter spec's retryable answers.
fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503 | 504)
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(v: &str) -> Option<Duration> {
    if let Ok(secs) = v.trim().parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v.trim()).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(retry_after("3"), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(60));
        let d = retry_after(&later).expect("a date");
        assert!(d > Duration::from_secs(55) && d <= Duration::from_secs(60), "{d:?}");
        assert_eq!(retry_after("soon"), None);
    }

    #[test]
    fn only_the_spec_s_answers_are_retried() {
        for s in [429, 502, 503, 504] {
            assert!(retryable(StatusCode::from_u16(s).expect("status")));
        }
        for s in [400, 401, 404, 413, 500] {
            assert!(!retryable(StatusCode::from_u16(s).expect("status")));
        }
    }
}
