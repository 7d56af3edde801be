//! A request's SERVER span (the HTTP server conventions), the W3C context it continues or links to, and the
//! context the upstream request carries: the gateway's own span's, never the client's header passed on as is.

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Link, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};

use super::Traces;
use crate::config::IncomingTrace;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The SERVER span of one request; ended when dropped (with the response body, so a stream's span lasts as long
/// as the stream).
pub struct ServerSpan {
    cx: Context,
}

/// What the SERVER span is made of: the request as the logs may show it.
pub struct Seen<'a> {
    pub method: &'a Method,
    /// `http` (the gateway speaks no TLS).
    pub scheme: &'a str,
    /// The path with a stream token written `<redacted>`.
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The route, low-cardinality (`/streams/{token}`, a frontend's path, `/*` for a forwarded path).
    pub route: &'a str,
}

impl Traces {
    /// Starts a request's SERVER span under the incoming `traceparent` (or as a new root linking to it, with
    /// `[telemetry] incoming_trace = "link"`).
    pub fn server_span(&self, seen: &Seen<'_>, headers: &HeaderMap) -> ServerSpan {
        let incoming = self.propagator.extract(&Headers(headers));
        let remote = incoming.span().span_context().clone();
        let (parent, links) = match self.settings.incoming {
            IncomingTrace::Continue => (incoming, Vec::new()),
            IncomingTrace::Link if remote.is_valid() => (Context::new(), vec![Link::with_context(remote)]),
            IncomingTrace::Link => (Context::new(), Vec::new()),
        };
        let mut attrs = vec![
            KeyValue::new("http.request.method", seen.method.as_str().to_owned()),
            KeyValue::new("url.scheme", seen.scheme.to_owned()),
            KeyValue::new("url.path", seen.path.to_owned()),
            KeyValue::new("http.route", seen.route.to_owned()),
        ];
        if let Some(q) = seen.query.filter(|q| !q.is_empty()) {
            attrs.push(KeyValue::new("url.query", redact_query(q)));
        }
        let span = self
            .tracer
            .span_builder(format!("{} {}", seen.method, seen.route))
            .with_kind(SpanKind::Server)
            .with_attributes(attrs)
            .with_links(links)
            .start_with_context(&self.tracer, &parent);
        ServerSpan {
            cx: parent.with_span(span),
        }
    }

    /// Writes `cx`'s span as the upstream request's `traceparent` (its `tracestate` kept), in place of the
    /// client's.
    pub fn inject(&self, cx: &Context, h: &mut HeaderMap) {
        h.remove(TRACEPARENT);
        h.remove(TRACESTATE);
        self.propagator.inject_context(cx, &mut HeadersMut(h));
    }
}

impl ServerSpan {
    pub fn context(&self) -> &Context {
        &self.cx
    }

    /// Links this request to a run it reads (a reconnect, a watcher).
    pub fn link(&self, run: opentelemetry::trace::SpanContext) {
        self.cx.span().add_link(run, Vec::new());
    }

    /// The response's status: Error for 5xx only (the HTTP server conventions).
    pub fn respond(&self, status: StatusCode) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status.as_u16())));
        if status.is_server_error() {
            span.set_attribute(KeyValue::new("error.type", status.as_str().to_owned()));
            span.set_status(Status::error(""));
        }
    }
}

impl Drop for ServerSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// `a=1&b=2` as `a=REDACTED&b=REDACTED` (the URL conventions' word): a query may carry a credential.
fn redact_query(q: &str) -> String {
    let mut out = String::with_capacity(q.len());
    for (i, pair) in q.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((k, _)) => {
                out.push_str(k);
                out.push_str("=REDACTED");
            }
            None => out.push_str(pair),
        }
    }
    out
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(key.as_bytes()), HeaderValue::from_str(&value)) {
            self.0.insert(k, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_redacted_and_keys_kept() {
        assert_eq!(redact_query("token=abc&x&y=1"), "token=REDACTED&x&y=REDACTED");
    }
}
