//! The client to the one configured upstream (a pool, and dedicated connections for event streams), and the
//! rewrite of a client request into an upstream one.

use crate::proxy::upstream::kind::UpstreamErrorKind;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use prometheus::{Histogram, IntCounter, Registry};
use thiserror::Error;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service;

use crate::config::{dot_segment, duration, Settings, UpstreamConnection, UpstreamTarget};
use crate::proxy::request::body::ClientBody;
use crate::proxy::upstream::dedicated;
use crate::proxy::upstream::error::StreamError;
use crate::telemetry::{counter, counters, histogram, latency_buckets};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why no upstream response head arrived.
#[derive(Debug, Error)]
pub enum ForwardError {
    /// TCP connect failed or timed out (answered 502).
    #[error("upstream unreachable: {0}")]
    Connect(#[source] BoxError),
    /// No response head within the response timeout (answered 504).
    #[error("upstream sent no response head within {0:?}")]
    Timeout(Duration),
    /// The connection failed after it was made, before a head arrived (answered 502).
    #[error("upstream failed: {0}")]
    Protocol(#[source] BoxError),
    /// The request URI could not be rebuilt for the upstream (answered 400).
    #[error("bad request target")]
    BadTarget,
    /// `upstream.max_connections` requests are in flight already (answered 503).
    #[error("{0} upstream connections in use (upstream.max_connections)")]
    Busy(usize),
}

/// The upstream's families, recorded by the request handler and the response body.
pub struct UpstreamMetrics {
    /// By `UpstreamConnection`.
    pub requests: [IntCounter; UpstreamConnection::ALL.len()],
    /// By `UpstreamErrorKind`.
    pub errors: [IntCounter; UpstreamErrorKind::ALL.len()],
    pub ttfb: Histogram,
    pub rejected: IntCounter,
}

impl UpstreamMetrics {
    /// Creates the upstream's families and registers them on `r`.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            requests: counters(
                r,
                "upstream_requests_total",
                "Requests sent upstream, by the connection they went on.",
                "connection",
                UpstreamConnection::ALL.map(UpstreamConnection::as_str),
            )?,
            errors: counters(
                r,
                "upstream_errors_total",
                "Upstream failures, by kind.",
                "kind",
                UpstreamErrorKind::ALL.map(UpstreamErrorKind::as_str),
            )?,
            ttfb: histogram(
                r,
                "upstream_ttfb_seconds",
                "Request sent upstream to response head received.",
                latency_buckets(),
            )?,
            rejected: counter(
                r,
                "upstream_rejected_total",
                "Requests answered 503 because upstream.max_connections requests were in flight.",
            )?,
        })
    }

    pub fn request(&self, c: UpstreamConnection) {
        self.requests[c as usize].inc();
    }

    pub fn error(&self, k: UpstreamErrorKind) {
        self.errors[k as usize].inc();
    }
}

/// The upstream: where every request goes, never a host taken from the request.
pub struct Upstream {
    client: Client<HttpConnector, ClientBody>,
    /// Makes the dedicated connections (the pool has its own copy).
    connector: HttpConnector,
    /// The connection of requests that accept `text/event-stream`.
    stream_connection: UpstreamConnection,
    target: UpstreamTarget,
    host: HeaderValue,
    response_timeout: Duration,
    /// `upstream.max_connections` permits, one per request in flight upstream.
    slots: Arc<Semaphore>,
    max_connections: usize,
}

impl Upstream {
    /// Builds the client from validated settings.
    pub fn new(settings: &Settings) -> Result<Self, String> {
        let target = UpstreamTarget::parse(&settings.upstream.url)?;
        let host = HeaderValue::from_str(target.authority.as_str()).map_err(|e| e.to_string())?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(duration(settings.upstream.connect_timeout_secs)));
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(duration(settings.upstream.pool_idle_timeout_secs))
            .pool_max_idle_per_host(settings.upstream.pool_max_idle)
            .build(connector.clone());
        Ok(Self {
            client,
            connector,
            stream_connection: settings.upstream.stream_connections,
            target,
            host,
            response_timeout: duration(settings.upstream.response_timeout_secs),
            slots: Arc::new(Semaphore::new(settings.upstream.max_connections)),
            max_connections: settings.upstream.max_connections,
        })
    }

    /// The upstream URI for a client's path and query (the client's authority, if any, is ignored).
    pub fn uri_for(&self, pq: Option<&PathAndQuery>) -> Result<Uri, ForwardError> {
        let path = upstream_path(&self.target.prefix, pq.map_or("/", PathAndQuery::as_str));
        Uri::builder()
            .scheme(self.target.scheme.clone())
            .authority(self.target.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|_| ForwardError::BadTarget)
    }

    /// The connection for a request. One that accepts `text/event-stream` likely gets a long stream of small
    /// chunks, which is better read on a dedicated connection (unless configured otherwise).
    pub fn connection_for(&self, accepts_event_stream: bool) -> UpstreamConnection {
        if accepts_event_stream {
            self.stream_connection
        } else {
            UpstreamConnection::Pooled
        }
    }

    /// Points a prepared request at the upstream and sends it on `connection`; resolves with the response head.
    pub async fn send(
        &self,
        mut req: Request<ClientBody>,
        connection: UpstreamConnection,
    ) -> Result<Response<UpstreamIncoming>, ForwardError> {
        *req.uri_mut() = self.uri_for(req.uri().path_and_query())?;
        // Refused at once rather than queued: a queue would hold the client's connection without a bound.
        let slot = Arc::clone(&self.slots)
            .try_acquire_owned()
            .map_err(|_| ForwardError::Busy(self.max_connections))?;
        // The upstream is spoken to in HTTP/1.1 whatever the client used.
        *req.version_mut() = Version::HTTP_11;
        req.headers_mut().insert(header::HOST, self.host.clone());
        let exchange = async {
            match connection {
                UpstreamConnection::Dedicated => self.send_dedicated(req).await,
                UpstreamConnection::Pooled => match self.client.request(req).await {
                    Ok(resp) => Ok(resp.map(|b| UpstreamIncoming::new(Source::Pooled(b)))),
                    Err(e) if e.is_connect() => Err(ForwardError::Connect(e.into())),
                    Err(e) => Err(ForwardError::Protocol(e.into())),
                },
            }
        };
        match tokio::time::timeout(self.response_timeout, exchange).await {
            Err(_) => Err(ForwardError::Timeout(self.response_timeout)),
            Ok(r) => r.map(|resp| resp.map(|body| body.holding(slot))),
        }
    }

    async fn send_dedicated(&self, req: Request<ClientBody>) -> Result<Response<UpstreamIncoming>, ForwardError> {
        let io = self
            .connector
            .clone()
            .call(req.uri().clone())
            .await
            .map_err(|e| ForwardError::Connect(e.into()))?;
        let resp = dedicated::connection::send(io.into_inner(), req)
            .await
            .map_err(|e| ForwardError::Protocol(e.into()))?;
        Ok(resp.map(|c| UpstreamIncoming::new(Source::Dedicated(c))))
    }
}

/// An upstream response body, holding its `upstream.max_connections` slot for as long as it lives.
pub struct UpstreamIncoming {
    source: Source,
    _slot: Option<OwnedSemaphorePermit>,
}

enum Source {
    Pooled(Incoming),
    Dedicated(dedicated::connection::Connection),
}

impl UpstreamIncoming {
    fn new(source: Source) -> Self {
        Self { source, _slot: None }
    }

    fn holding(mut self, slot: OwnedSemaphorePermit) -> Self {
        self._slot = Some(slot);
        self
    }
}

impl Body for UpstreamIncoming {
    type Data = Bytes;
    type Error = StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, StreamError>>> {
        match &mut self.get_mut().source {
            Source::Pooled(b) => Pin::new(b).poll_frame(cx).map_err(StreamError::from),
            Source::Dedicated(c) => Pin::new(c).poll_frame(cx).map_err(StreamError::from),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Pooled(b) => b.is_end_stream(),
            Source::Dedicated(c) => c.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Pooled(b) => b.size_hint(),
            Source::Dedicated(c) => c.size_hint(),
        }
    }
}

/// The upstream path and query for a client's: its dot segments removed (RFC 3986 §5.2.4, `%2e`/`%2E` counting as
/// dots, as many servers decode them before resolving) and then joined under `prefix`, so the result always stays
/// under the prefix: `/../../admin` behind `/api/v1` is `/api/v1/admin`, not a path the upstream resolves to
/// `/admin`. The query is kept as sent. `OPTIONS *` (asterisk-form) asks about the server as a whole; behind a
/// prefix the gateway's "server" is the prefix, so it becomes `OPTIONS <prefix>`; with no prefix it stays `*`.
pub fn upstream_path(prefix: &str, pq: &str) -> String {
    let (path, query) = match pq.find('?') {
        Some(i) => pq.split_at(i),
        None => (pq, ""),
    };
    if path == "*" {
        return if prefix.is_empty() {
            format!("*{query}")
        } else {
            format!("{prefix}{query}")
        };
    }
    let mut kept: Vec<&str> = Vec::new();
    // A path ending in a dot segment names a directory: "/a/b/.." is "/a/".
    let mut ends_in_dir = false;
    for seg in path.strip_prefix('/').unwrap_or(path).split('/') {
        ends_in_dir = true;
        match dot_segment(seg) {
            Some(1) => {}
            Some(_) => {
                kept.pop();
            }
            None => {
                kept.push(seg);
                ends_in_dir = false;
            }
        }
    }
    let mut out = String::with_capacity(prefix.len() + path.len() + query.len() + 1);
    out.push_str(prefix);
    for seg in &kept {
        out.push('/');
        out.push_str(seg);
    }
    if ends_in_dir || kept.is_empty() {
        out.push('/');
    }
    out.push_str(query);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(url: &str) -> Upstream {
        let mut s = Settings::default();
        s.upstream.url = url.into();
        Upstream::new(&s).unwrap()
    }

    #[test]
    fn never_takes_the_host_from_the_request() {
        let u = upstream("http://127.0.0.1:9000");
        let client_uri: Uri = "http://evil.test/agent/run?x=1".parse().unwrap();
        let got = u.uri_for(client_uri.path_and_query()).unwrap();
        assert_eq!(got, "http://127.0.0.1:9000/agent/run?x=1");
    }

    #[test]
    fn keeps_the_configured_prefix() {
        let u = upstream("http://127.0.0.1:9000/api/");
        let pq: PathAndQuery = "/agent/run".parse().unwrap();
        assert_eq!(u.uri_for(Some(&pq)).unwrap(), "http://127.0.0.1:9000/api/agent/run");
    }

    #[test]
    fn dot_segments_cannot_climb_out_of_the_prefix() {
        for (client, want) in [
            ("/../../admin", "/api/v1/admin"),
            ("/a/b/../../../admin?x=1", "/api/v1/admin?x=1"),
            ("/a/%2e%2e/%2E%2E/%2e./.%2E/admin", "/api/v1/admin"),
            ("/a/./b/.", "/api/v1/a/b/"),
            ("/a/b/..", "/api/v1/a/"),
            ("/..", "/api/v1/"),
            ("/", "/api/v1/"),
            ("/a//b/", "/api/v1/a//b/"),
            ("/.../..a/a..", "/api/v1/.../..a/a.."),
            ("/%2e%2e%2fadmin", "/api/v1/%2e%2e%2fadmin"),
            ("/q?p=../../x", "/api/v1/q?p=../../x"),
            ("*", "/api/v1"),
        ] {
            assert_eq!(upstream_path("/api/v1", client), want, "{client}");
        }
    }

    #[test]
    fn without_a_prefix_paths_are_normalized_and_asterisk_form_is_kept() {
        assert_eq!(upstream_path("", "/x/../../etc/passwd"), "/etc/passwd");
        assert_eq!(upstream_path("", "/agent/run?a=b"), "/agent/run?a=b");
        assert_eq!(upstream_path("", "*"), "*");
        let u = upstream("http://127.0.0.1:9000/api");
        let pq: PathAndQuery = "/%2E%2e/admin".parse().unwrap();
        assert_eq!(u.uri_for(Some(&pq)).unwrap(), "http://127.0.0.1:9000/api/admin");
    }
}
