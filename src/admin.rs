//! Admin listener: `GET /metrics` (Prometheus text format), `GET /healthz` (alive), `GET /readyz` (accepting).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, IntGauge, Registry, TextEncoder};
use tokio::net::TcpListener;

use crate::telemetry::gauge;

/// Readiness and drain state, mirrored into the `ready` and `draining` gauges.
pub struct Health {
    ready: AtomicBool,
    ready_gauge: IntGauge,
    draining: IntGauge,
}

impl Health {
    /// Not ready yet; creates the `ready` and `draining` gauges and registers them on `r`.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            ready: AtomicBool::new(false),
            ready_gauge: gauge(r, "ready", "1 while the gateway accepts traffic.")?,
            draining: gauge(r, "draining", "1 while shutting down and draining streams.")?,
        })
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
        self.ready_gauge.set(i64::from(ready));
    }

    pub fn set_draining(&self, draining: bool) {
        self.draining.set(i64::from(draining));
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

/// Serves the admin endpoints until the task is aborted.
pub async fn serve(listener: TcpListener, registry: Registry, health: Arc<Health>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let registry = registry.clone();
        let health = Arc::clone(&health);
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let resp = respond(&req, &registry, &health);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn respond(req: &Request<Incoming>, registry: &Registry, health: &Health) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/metrics" => {
            let encoder = TextEncoder::new();
            let mut buf = Vec::new();
            if encoder.encode(&registry.gather(), &mut buf).is_err() {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
            }
            let mut r = Response::new(Full::new(Bytes::from(buf)));
            if let Ok(v) = header::HeaderValue::from_str(encoder.format_type()) {
                r.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            r
        }
        "/healthz" => text(StatusCode::OK, "ok\n"),
        "/readyz" if health.is_ready() => text(StatusCode::OK, "ready\n"),
        "/readyz" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
