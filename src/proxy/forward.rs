//! The pooled client to the one configured upstream, and the rewrite of a client request into an upstream one.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, Uri, Version};
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use thiserror::Error;

use crate::config::{duration, Settings, UpstreamTarget};

/// Body of an upstream request: the client's body streamed as is, or a small body already read.
pub type UpstreamBody = BoxBody<Bytes, hyper::Error>;

/// Why no upstream response head arrived.
#[derive(Debug, Error)]
pub enum ForwardError {
    /// TCP connect failed or timed out (answered 502).
    #[error("upstream unreachable: {0}")]
    Connect(#[source] hyper_util::client::legacy::Error),
    /// No response head within the response timeout (answered 504).
    #[error("upstream sent no response head within {0:?}")]
    Timeout(Duration),
    /// The connection failed after it was made, before a head arrived (answered 502).
    #[error("upstream failed: {0}")]
    Protocol(#[source] hyper_util::client::legacy::Error),
    /// The request URI could not be rebuilt for the upstream (answered 400).
    #[error("bad request target")]
    BadTarget,
}

/// The upstream: where every request goes, never a host taken from the request.
pub struct Upstream {
    client: Client<HttpConnector, UpstreamBody>,
    target: UpstreamTarget,
    host: HeaderValue,
    response_timeout: Duration,
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
            .build(connector);
        Ok(Self {
            client,
            target,
            host,
            response_timeout: duration(settings.upstream.response_timeout_secs),
        })
    }

    /// The upstream URI for a client's path and query (the client's authority, if any, is ignored).
    pub fn uri_for(&self, pq: Option<&PathAndQuery>) -> Result<Uri, ForwardError> {
        let pq = pq.map_or("/", PathAndQuery::as_str);
        let path = if self.target.prefix.is_empty() {
            pq.to_owned()
        } else {
            format!("{}{}", self.target.prefix, pq)
        };
        Uri::builder()
            .scheme(self.target.scheme.clone())
            .authority(self.target.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|_| ForwardError::BadTarget)
    }

    /// Points a prepared request at the upstream and sends it; resolves with the response head.
    pub async fn send(&self, mut req: Request<UpstreamBody>) -> Result<Response<Incoming>, ForwardError> {
        *req.uri_mut() = self.uri_for(req.uri().path_and_query())?;
        // The upstream is spoken to in HTTP/1.1 whatever the client used.
        *req.version_mut() = Version::HTTP_11;
        req.headers_mut().insert(header::HOST, self.host.clone());
        match tokio::time::timeout(self.response_timeout, self.client.request(req)).await {
            Err(_) => Err(ForwardError::Timeout(self.response_timeout)),
            Ok(Err(e)) if e.is_connect() => Err(ForwardError::Connect(e)),
            Ok(Err(e)) => Err(ForwardError::Protocol(e)),
            Ok(Ok(resp)) => Ok(resp),
        }
    }
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
}
