//! The answers the edge writes itself when a request is not forwarded or its forwarding failed (a JSON error with
//! its code, counted), and what every request handler shares.

use crate::config::{duration, Settings, StreamFormat};
use crate::cors::{Cors, OwnAnswer};
use crate::inspect::Inspector;
use crate::proxy::body::stack::ResponseBody;
use crate::proxy::frontend::adapter::BadBody;
use crate::proxy::frontend::serve::Frontends;
use crate::proxy::metrics::edge::{Fault, Metrics};
use crate::proxy::request::body::ClientErrorKind;
use crate::proxy::request::negotiate::Mode;
use crate::proxy::socket;
use crate::proxy::socket::metrics::SocketMetrics;
use crate::proxy::trace::Traces;
use crate::proxy::upstream::kind::UpstreamErrorKind;
use crate::proxy::upstream::pool::{ForwardError, Upstream};
use crate::resume::Resumer;
use crate::telemetry::error_chain;
use crate::translate::{self};
use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use prometheus::Registry;
use std::sync::Arc;
use std::time::Duration;

/// What every request handler shares.
pub struct Shared {
    pub upstream: Upstream,
    pub metrics: Arc<Metrics>,
    pub options: translate::Options,
    pub default_format: StreamFormat,
    pub shadow: bool,
    pub keepalive: Option<Duration>,
    /// `upstream.idle_timeout_secs`, when set.
    pub idle_timeout: Option<Duration>,
    pub agent_header: HeaderName,
    pub agent_body_max: usize,
    pub trust_forwarded: bool,
    /// `server.body_read_timeout_secs`.
    pub body_read_timeout: Duration,
    /// Resumable translated streams (`resume.enabled`).
    pub resumer: Option<Arc<Resumer>>,
    /// The CORS answer of the responses the gateway writes itself.
    pub cors: Cors,
    /// The WebSocket output (`websocket.enabled`, with resumption).
    pub sockets: Option<Sockets>,
    /// The `[[frontend]]` routes and the frontends' encodings (`X-Stream-Format: ai-sdk | ag-ui`).
    pub frontends: Arc<Frontends>,
    /// The stream inspector (`[debug] streams`); `None`: no stream is tapped for it.
    pub inspector: Option<Arc<Inspector>>,
    /// OpenTelemetry traces, when an endpoint is configured (`proxy::trace`).
    pub traces: Option<Arc<Traces>>,
}

/// What the WebSocket handshakes share.
pub struct Sockets {
    pub shared: Arc<socket::serve::Shared>,
    pub open: Arc<socket::cap::Sockets>,
    /// `websocket.allow_origins` with `[cors] allow_origins`.
    pub allow_origins: Vec<String>,
}

impl Sockets {
    fn new(settings: &Settings, resumer: &Arc<Resumer>, registry: &Registry) -> Result<Self, String> {
        let w = &settings.websocket;
        let metrics = SocketMetrics::register(registry).map_err(|e| e.to_string())?;
        let limits = socket::serve::Limits {
            max_message_bytes: w.max_message_bytes,
            auth_timeout: duration(w.auth_timeout_secs),
            ping_interval: duration(w.ping_interval_secs),
            pong_timeout: duration(w.pong_timeout_secs),
            write_timeout: duration(w.write_timeout_secs),
            max_queued_bytes: w.max_queued_bytes,
            max_streams_per_session: w.max_streams_per_session,
            max_sessions: w.max_sockets,
        };
        Ok(Self {
            shared: Arc::new(socket::serve::Shared {
                resumer: Arc::clone(resumer),
                metrics: Arc::new(metrics),
                limits,
            }),
            open: socket::cap::Sockets::new(w.max_sockets),
            allow_origins: w
                .allow_origins
                .iter()
                .chain(&settings.cors.allow_origins)
                .cloned()
                .collect(),
        })
    }
}

impl Shared {
    pub fn new(
        settings: &Settings,
        metrics: Arc<Metrics>,
        resumer: Option<Arc<Resumer>>,
        registry: &Registry,
    ) -> Result<Self, String> {
        let t = &settings.translate;
        let mirror = resumer.as_ref().and_then(|r| r.hub.mirror().cloned());
        let sockets = match &resumer {
            Some(r) if settings.websocket.enabled => Some(Sockets::new(settings, r, registry)?),
            _ => None,
        };
        Ok(Self {
            upstream: Upstream::new(settings)?,
            metrics,
            options: settings.translate_options(),
            default_format: t.default_format,
            shadow: t.shadow,
            keepalive: (t.keepalive_interval_secs > 0.0).then(|| duration(t.keepalive_interval_secs)),
            idle_timeout: (settings.upstream.idle_timeout_secs > 0.0)
                .then(|| duration(settings.upstream.idle_timeout_secs)),
            agent_header: HeaderName::from_bytes(t.agent_header.as_bytes()).map_err(|e| e.to_string())?,
            agent_body_max: t.agent_body_max_bytes,
            trust_forwarded: settings.server.trust_forwarded_headers,
            body_read_timeout: duration(settings.server.body_read_timeout_secs),
            resumer,
            cors: Cors::new(&settings.cors),
            sockets,
            frontends: Arc::new(Frontends::new(&settings.frontends, mirror, registry).map_err(|e| e.to_string())?),
            inspector: match settings.debug.streams {
                true => Some(Arc::new(
                    Inspector::register(&settings.debug, registry).map_err(|e| e.to_string())?,
                )),
                false => None,
            },
            traces: Traces::start(&settings.telemetry, registry, &tokio::runtime::Handle::current())?,
        })
    }
}

/// Answers a request whose own body failed (400, or 408 when it stalled), counted as the client's error.
pub fn client_failed(metrics: &Metrics, kind: ClientErrorKind) -> Response<ResponseBody> {
    metrics.client_fault(Fault::Request(kind));
    let (status, code) = crate::proxy::request::body::answer(kind);
    tracing::info!(kind = kind.as_str(), status = status.as_u16(), "request body failed");
    gateway_error(metrics, status, code, "the request body failed or stalled")
}

pub fn forward_failed(metrics: &Metrics, e: ForwardError) -> Response<ResponseBody> {
    // The upstream request fails too when the client's body does; that is not the upstream's fault.
    if let Some(kind) = crate::proxy::request::body::client_fault(&e) {
        return client_failed(metrics, kind);
    }
    let (status, kind, code) = match &e {
        ForwardError::Connect(_) => (
            StatusCode::BAD_GATEWAY,
            Some(UpstreamErrorKind::Connect),
            "upstream_unreachable",
        ),
        ForwardError::Timeout(_) => (
            StatusCode::GATEWAY_TIMEOUT,
            Some(UpstreamErrorKind::Timeout),
            "upstream_timeout",
        ),
        ForwardError::Protocol(_) => (
            StatusCode::BAD_GATEWAY,
            Some(UpstreamErrorKind::Protocol),
            "upstream_failed",
        ),
        ForwardError::BadTarget => (StatusCode::BAD_REQUEST, None, "bad_request_target"),
        ForwardError::Busy(_) => {
            metrics.upstream.rejected.inc();
            (StatusCode::SERVICE_UNAVAILABLE, None, "upstream_busy")
        }
    };
    if let Some(k) = kind {
        metrics.upstream.error(k);
    }
    tracing::warn!(error = %error_chain(&e), status = status.as_u16(), "no upstream response");
    gateway_error(metrics, status, code, &e.to_string())
}

/// A response made by the gateway itself: a small JSON body `{"error": code, "message": ...}`.
/// Answers a frontend request whose body the adapter cannot map: 400 naming the field; nothing was forwarded.
pub fn bad_body(metrics: &Metrics, bad: &BadBody) -> Response<ResponseBody> {
    metrics.client_fault(Fault::Request(ClientErrorKind::BadBody));
    tracing::info!(field = %bad.field, "frontend request body not mapped");
    let mut resp = gateway_error(metrics, StatusCode::BAD_REQUEST, "bad_request_body", &bad.message);
    let body = serde_json::json!({"error": "bad_request_body", "field": bad.field, "message": bad.message});
    *resp.body_mut() = ResponseBody::full(Bytes::from(body.to_string()));
    resp
}

pub fn gateway_error(metrics: &Metrics, status: StatusCode, code: &str, message: &str) -> Response<ResponseBody> {
    metrics.request(Mode::Passthrough, status);
    let body = serde_json::json!({ "error": code, "message": message }).to_string();
    let mut resp = Response::new(ResponseBody::full(Bytes::from(body)));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        h.insert(
            header::ALLOW,
            HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
        );
    }
    resp.extensions_mut().insert(OwnAnswer::About(None));
    resp
}
