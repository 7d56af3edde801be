//! Admin listener: `GET /metrics` (Prometheus text format), `GET /healthz` (alive), `GET /readyz` (accepting), and
//! with `[debug] streams` the stream inspector under `/debug/` (`inspect::serve`; 404 there otherwise).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, IntGauge, Registry, TextEncoder};
use tokio::net::TcpListener;

use crate::inspect::serve::{self as inspector, Routes};
use crate::telemetry::gauge;

/// Readiness and drain state, mirrored into the `ready` and `draining` gauges. Ready means: serving, the public
/// listener able to accept (not out of file descriptors), and not draining.
pub struct Health {
    state: Mutex<HealthState>,
    ready: IntGauge,
    draining: IntGauge,
}

#[derive(Clone, Copy, Default)]
struct HealthState {
    accepting: bool,
    draining: bool,
}

impl HealthState {
    fn ready(self) -> bool {
        self.accepting && !self.draining
    }
}

impl Health {
    /// Not ready yet; creates the `ready` and `draining` gauges and registers them on `r`.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            state: Mutex::new(HealthState::default()),
            ready: gauge(r, "ready", "1 while the gateway accepts traffic.")?,
            draining: gauge(r, "draining", "1 while shutting down and draining streams.")?,
        })
    }

    /// Whether the public listener can take connections: set when serving starts and after each accepted
    /// connection, cleared while accept fails for lack of file descriptors. Returns whether readiness changed.
    pub fn set_accepting(&self, accepting: bool) -> bool {
        self.update(|s| s.accepting = accepting)
    }

    /// Draining after SIGTERM: not ready from then on, whatever accept does.
    pub fn set_draining(&self, draining: bool) {
        self.update(|s| s.draining = draining);
        self.draining.set(i64::from(draining));
    }

    pub fn is_ready(&self) -> bool {
        self.lock().ready()
    }

    /// Applies `change` and mirrors readiness into the gauge under the same lock, so the gauge never lags a
    /// concurrent change; returns whether readiness changed.
    fn update(&self, change: impl FnOnce(&mut HealthState)) -> bool {
        let mut s = self.lock();
        let was = s.ready();
        change(&mut s);
        let now = s.ready();
        self.ready.set(i64::from(now));
        was != now
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        // The state is two plain flags: a panic elsewhere cannot leave it half-written.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Serves the admin endpoints until the task is aborted; `inspector`: the `/debug/` routes, when enabled.
pub async fn serve(listener: TcpListener, registry: Registry, health: Arc<Health>, inspector: Option<Arc<Routes>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let registry = registry.clone();
        let health = Arc::clone(&health);
        let inspector = inspector.clone();
        tokio::spawn(async move {
            // Closes this connection when an inspector feed on it fell behind: a feed is cut, never waited for.
            let cut = Arc::new(tokio::sync::Notify::new());
            let cut_here = Arc::clone(&cut);
            let service = service_fn(move |req: Request<Incoming>| {
                let (registry, health, inspector, cut) = (
                    registry.clone(),
                    Arc::clone(&health),
                    inspector.clone(),
                    Arc::clone(&cut),
                );
                async move {
                    let resp = match inspector.filter(|_| inspector::owns(req.uri().path())) {
                        Some(routes) => routes.respond(req, &cut).await,
                        None => respond(&req, &registry, &health).map(|b| b.boxed_unsync()),
                    };
                    Ok::<_, Infallible>(resp)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = conn => {}
                () = cut_here.notified() => {}
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_needs_accepting_and_not_draining() {
        let h = Health::register(&Registry::new()).unwrap();
        assert!(!h.is_ready(), "ready before serving");
        assert!(h.set_accepting(true));
        assert!(h.is_ready());
        assert_eq!(h.ready.get(), 1);
        assert!(h.set_accepting(false), "out of descriptors");
        assert!(!h.is_ready());
        assert_eq!(h.ready.get(), 0);
        assert!(h.set_accepting(true));
        h.set_draining(true);
        assert!(!h.is_ready());
        assert!(
            !h.set_accepting(true),
            "an accept while draining does not make it ready"
        );
        assert!(!h.is_ready());
        assert_eq!((h.ready.get(), h.draining.get()), (0, 1));
    }
}
