//! The request handler: one request in, answered from a held stream (`resumption`) or forwarded to the upstream,
//! its response passed on or translated.

use crate::proxy::base::flushes::Flushes;
use crate::proxy::decide::answers::{bad_body, client_failed, forward_failed, gateway_error, Shared};
use crate::proxy::decide::resumption;
use crate::proxy::frontend::serve::{self, Read, Step};
use crate::proxy::request::{agent, headers, negotiate};
use crate::proxy::socket;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use tracing::Instrument;

use crate::config::StreamFormat;
use crate::cors::{self, Cors, OwnAnswer, Preflight};
use crate::proxy::body::layer::StreamInfo;
use crate::proxy::body::stack::{ResponseBody, StreamSettings};
use crate::proxy::inspect::{HeldRun, InspectTap};
use crate::proxy::metrics::edge::Fault;
use crate::proxy::metrics::translator::StreamObserver;
use crate::proxy::request::body::UpstreamBody;
use crate::proxy::request::body::{ClientBody, ClientErrorKind};
use crate::proxy::request::headers::{X_ACCEL_BUFFERING, X_REQUEST_ID, X_STREAM_DIALECT, X_STREAM_FORMAT};
use crate::proxy::request::negotiate::Mode;
use crate::proxy::trace::request::{Seen, ServerSpan};
use crate::proxy::upstream::kind::UpstreamErrorKind;
use crate::proxy::upstream::pool::ForwardError;
use crate::resume::{self, Resumer};
use crate::translate::{self, Translator};

/// Longest `X-Request-Id` taken from a client; longer ones are replaced.
const MAX_REQUEST_ID: usize = 128;

/// Whether a client's `X-Request-Id` may be used as is: it is written unescaped into text logs (the request span's
/// `id=` field), so a space, `=` or control character would let a client forge fields of its own log lines.
fn is_safe_request_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Handles one client request end to end (the service function).
pub async fn handle(req: Request<UpstreamBody>, peer: SocketAddr, shared: Arc<Shared>) -> Response<ResponseBody> {
    let request_start = Instant::now();
    let request_id = request_id(&req);
    let span = tracing::info_span!(
        "request",
        id = %request_id,
        method = %req.method(),
        path = %logged_path(req.uri().path(), shared.resumer.as_deref()),
    );
    let origin = cors::origin(req.headers());
    let preflight = Preflight::of(req.method(), req.headers());
    let server_span = shared.traces.as_ref().map(|t| {
        let path = logged_path(req.uri().path(), shared.resumer.as_deref());
        let route = route_of(&shared, req.method(), req.uri().path());
        let seen = Seen {
            method: req.method(),
            scheme: "http",
            path: &path,
            query: req.uri().query(),
            route: &route,
        };
        t.server_span(&seen, req.headers())
    });
    let about = About {
        request_start,
        span: span.clone(),
        request_id: &request_id,
        preflight: preflight.as_ref(),
        server_span: server_span.as_ref(),
    };
    let mut resp = proxy(req, peer, &shared, about).instrument(span).await;
    if let Some(s) = server_span {
        s.respond(resp.status());
        resp = resp.map(|b| b.traced(s));
    }
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        resp.headers_mut().insert(X_REQUEST_ID, v);
    }
    if let Some(origin) = &origin {
        let own = resp.extensions_mut().remove::<OwnAnswer>();
        let (status, h) = (resp.status(), resp.headers_mut());
        match own {
            Some(OwnAnswer::About(grant)) => shared.cors.own_answer(origin, grant.as_deref(), h),
            Some(OwnAnswer::Preflight) => {}
            None => shared.cors.backend_answer(origin, preflight.as_ref(), status, h),
        }
    }
    resp
}

/// The request's route for its span's name and `http.route`: low-cardinality, never a token or a chat id.
fn route_of(shared: &Shared, method: &Method, path: &str) -> String {
    if let Some(r) = &shared.resumer {
        if r.stream_token(path).is_some() {
            return format!("{}/{{token}}", r.prefix);
        }
    }
    match shared.frontends.routes.find(method, path) {
        Some((f, _, crate::proxy::frontend::routes::Asked::Resume(_))) => format!("{}/{{chatId}}/stream", f.path),
        Some((f, _, _)) => f.path.clone(),
        // Forwarded as it is: the gateway's route for it is the catch-all.
        None => "/*".to_owned(),
    }
}

/// The request's path as logged: a stream's URL names its token, which lets whoever holds the bound headers watch
/// or cancel the stream, so it is never written to a log (`<prefix>/<redacted>`).
fn logged_path<'a>(path: &'a str, resumer: Option<&Resumer>) -> std::borrow::Cow<'a, str> {
    match resumer {
        Some(r) if r.stream_token(path).is_some() => format!("{}/<redacted>", r.prefix).into(),
        _ => path.into(),
    }
}

/// What the handler knows of a request besides the request itself.
struct About<'a> {
    request_start: Instant,
    span: tracing::Span,
    request_id: &'a str,
    preflight: Option<&'a Preflight>,
    server_span: Option<&'a ServerSpan>,
}

async fn proxy(
    mut req: Request<UpstreamBody>,
    peer: SocketAddr,
    shared: &Shared,
    about: About<'_>,
) -> Response<ResponseBody> {
    let About {
        request_start,
        span,
        request_id,
        preflight,
        server_span,
    } = about;
    let metrics = &shared.metrics;
    if req.method() == Method::CONNECT {
        // Not an open proxy: no tunnels.
        return gateway_error(
            metrics,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "CONNECT is not supported",
        );
    }
    if !host_count_ok(&req) {
        return client_failed(metrics, ClientErrorKind::BadHost);
    }
    if let Some(s) = shared.sockets.as_ref().filter(|_| socket::upgrade::is_websocket(&req)) {
        // Another path than the gateway's goes on as any other request (its Upgrade header is not forwarded).
        match socket::upgrade::accept(&mut req, &s.shared, &s.open, &shared.cors, &s.allow_origins).await {
            Some(Ok(resp)) => return resp,
            Some(Err(why)) => {
                let mut resp = gateway_error(metrics, why.status, why.code, why.message);
                resp.headers_mut().extend(why.headers());
                return resp;
            }
            None => {}
        }
    }
    // A frontend's route: its turn adapted (or answered here), its response encoded.
    let step = if shared.frontends.routes.is_empty() {
        Step::Pass
    } else {
        let binding = match &shared.resumer {
            Some(r) => r.binding(req.headers()),
            None => serve::unbound(req.headers()),
        };
        shared.frontends.step(&mut req, binding, shared.body_read_timeout).await
    };
    let mut read = match step {
        Step::Pass => None,
        Step::Forward(read) => Some(read),
        Step::Bad(bad) => return bad_body(metrics, &bad),
        Step::BodyFailed(too_large) => {
            let kind = if too_large {
                ClientErrorKind::BadBody
            } else {
                ClientErrorKind::BodyTimeout
            };
            return client_failed(metrics, kind);
        }
        Step::Resume(found) => return resume_chat(shared, found, req.headers(), request_start, server_span).await,
    };
    if let Some(r) = &shared.resumer {
        if let (Some(p), Some(token)) = (preflight, r.stream_token(req.uri().path())) {
            return resumption::preflight(r, &token, p, shared).await;
        }
        let route = r.route(req.method(), req.uri().path(), req.headers());
        if let (Some(token), Some(s)) = (r.stream_token(req.uri().path()), server_span) {
            link_to_run(shared, &token, s);
        }
        match route {
            resume::Route::Forward => {}
            // Never forwarded: the upstream would start the run again.
            route => return resumption::answer(r, route, req.headers(), shared, request_start).await,
        }
    }
    let negotiated = negotiate::requested(req.headers(), req.uri(), shared.default_format)
        .and_then(|f| Ok((f, negotiate::requested_dialect(req.headers(), req.uri())?)));
    let (wants, dialect) = match negotiated {
        Ok(n) => n,
        Err(e) => return gateway_error(metrics, StatusCode::BAD_REQUEST, e.code(), &e.to_string()),
    };
    if read.is_none() {
        read = negotiate::requested_protocol(req.headers(), req.uri()).map(|p| {
            shared.frontends.count(p, serve::Outcome::Encoded);
            Read::fresh(p)
        });
    }
    let may_translate = wants == StreamFormat::Json;
    let method = req.method().clone();
    // The inspector lists a stream by its path (never the query: it may carry credentials).
    let inspect_path = shared.inspector.as_ref().map(|_| req.uri().path().to_owned());
    let origin = cors::origin(req.headers());
    let client_host = headers::client_host(&req);
    let (mut parts, body) = req.into_parts();
    let flushes = parts.extensions.get::<Arc<Flushes>>().cloned();

    // The fallback agent for this stream (DESIGN 3.5 / 3.6): agent_uuid of a small JSON body (resumed runs send
    // no meta_init), else the agent header, else a fresh id.
    let (body, body_agent) = if may_translate {
        // The whole read is bounded: the body is small, and a client that stalls in it must not hold the
        // connection (the upstream has not been contacted yet).
        let sniffed = tokio::time::timeout(
            shared.body_read_timeout,
            sniff_agent(&parts, body, shared.agent_body_max),
        );
        match sniffed.await {
            Ok(Ok(r)) => r,
            Ok(Err(())) => return client_failed(metrics, ClientErrorKind::BadBody),
            Err(_) => return client_failed(metrics, ClientErrorKind::BodyTimeout),
        }
    } else {
        (body, None)
    };
    // Only a translated (or shadowed) stream uses the agent: a legacy request's header is not judged.
    let choice = if may_translate {
        agent::choose(body_agent.as_deref(), &parts.headers, &shared.agent_header)
    } else {
        agent::Choice::default()
    };
    for source in &choice.rejected {
        // Not the value: it is what a hostile client controls.
        tracing::debug!(
            source = source.as_str(),
            "client-supplied agent id refused (too long or unsafe characters)"
        );
        metrics.client_fault(Fault::AgentId(*source));
    }
    let agent = choice.agent.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());

    // The bound headers as the client sent them, before any is rewritten.
    let binding = shared
        .resumer
        .as_ref()
        .filter(|_| may_translate)
        .map(|r| r.binding(&parts.headers));
    let h = &mut parts.headers;
    headers::strip_hop_by_hop(h);
    keep_chunked_body(&method, h, &body);
    headers::set_forwarded(h, peer.ip(), client_host.as_deref(), shared.trust_forwarded);
    h.remove(X_STREAM_FORMAT);
    h.remove(X_STREAM_DIALECT);
    if let Some(p) = preflight {
        Cors::forward_preflight(p, h);
    }
    if may_translate {
        // We must read the event stream to translate it: ask for it uncompressed. (Other responses to these
        // requests then come uncompressed too; the hop to the upstream is local.)
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert(X_REQUEST_ID, v);
    }

    // The upstream request carries the gateway's own context: the run's span for a run it may translate, else
    // the request's.
    let run_span = match (&shared.traces, server_span) {
        (Some(t), Some(s)) => {
            let conversation = read.as_ref().and_then(|r| r.conversation.as_deref());
            let run = may_translate.then(|| t.run_span(s.context(), &agent, conversation));
            t.inject(run.as_ref().map_or(s.context(), |r| r.context()), &mut parts.headers);
            run
        }
        _ => None,
    };
    let connection = shared
        .upstream
        .connection_for(negotiate::accepts_event_stream(&parts.headers));
    metrics.upstream.request(connection);
    let sent = Instant::now();
    let body = ClientBody::new(body, shared.body_read_timeout);
    let client_fault = body.fault();
    let upstream_resp = match shared.upstream.send(Request::from_parts(parts, body), connection).await {
        Ok(r) => r,
        // No answer while the upstream still waited for the client's body: the client stalled, not the upstream.
        Err(ForwardError::Timeout(_)) if client_fault.waiting_for_client() => {
            return client_failed(metrics, ClientErrorKind::BodyTimeout)
        }
        Err(e) => {
            if let Some(run) = run_span {
                run.failed("upstream_error");
            }
            return forward_failed(metrics, e);
        }
    };
    metrics.upstream.ttfb.observe(sent.elapsed().as_secs_f64());
    let (mut parts, body) = upstream_resp.into_parts();
    if parts.status.is_server_error() {
        metrics.upstream.error(UpstreamErrorKind::Status);
    }
    if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        // The Upgrade header is never forwarded, so a 101 is unsolicited; passed on, it would switch an
        // HTTP/1.1 client's connection to nothing and is not even legal in HTTP/2.
        metrics.upstream.error(UpstreamErrorKind::Protocol);
        tracing::warn!("upstream answered 101 Switching Protocols unasked: 502");
        return gateway_error(
            metrics,
            StatusCode::BAD_GATEWAY,
            "upstream_failed",
            "unsolicited 101 response",
        );
    }
    drop_conflicting_length(&mut parts.headers);
    headers::strip_hop_by_hop(&mut parts.headers);
    let event_stream = negotiate::is_event_stream(&parts.headers);
    let translatable = negotiate::is_translatable(&method, parts.status, &parts.headers);
    if event_stream && may_translate && !translatable {
        tracing::warn!(status = %parts.status, "event stream not translatable (status or content encoding): passed through");
    }
    let mode = negotiate::body_mode(wants, shared.shadow, translatable);
    // Only a translated stream is tapped for the inspector, and only when it is on: off, this costs nothing.
    let watched = match (&shared.inspector, &inspect_path) {
        (Some(i), Some(path)) if mode == Mode::Translate => {
            let encoder = read.as_ref().map_or("json", |r| r.protocol.as_str());
            Some((Arc::clone(i), i.open(path, encoder)))
        }
        _ => None,
    };
    let mut translator = match mode {
        Mode::Passthrough => None,
        Mode::Translate | Mode::Shadow => {
            let mut observer = StreamObserver::new(Arc::clone(&metrics.translator));
            if let Some((i, w)) = &watched {
                observer.tap(Box::new(InspectTap::new(Arc::clone(i), Arc::clone(w))));
            }
            Some(Translator::with_observer(
                translate::Options {
                    dialect: dialect.unwrap_or(shared.options.dialect),
                    ..shared.options.clone()
                },
                &agent,
                observer,
            ))
        }
    };
    // The run's span follows the translated stream (and outlives the request when the stream is held).
    let mut run_of_stream = None;
    if let (Some(run), Some(t)) = (run_span, &shared.traces) {
        match translator.as_mut().filter(|_| mode == Mode::Translate) {
            Some(tr) => {
                use opentelemetry::trace::TraceContextExt as _;
                run_of_stream = Some(run.context().span().span_context().clone());
                tr.observer_mut().tap(Box::new(run.follow(t, sent)));
            }
            None if parts.status.is_server_error() => run.failed("upstream_error"),
            None => {}
        }
    }
    if mode == Mode::Translate {
        let h = &mut parts.headers;
        h.remove(header::CONTENT_LENGTH);
        h.remove(header::CONTENT_ENCODING);
        keep_uncached(h);
        h.insert(X_ACCEL_BUFFERING, HeaderValue::from_static("no"));
        h.insert(X_STREAM_FORMAT, HeaderValue::from_static("json"));
    }
    let held = match (&shared.resumer, binding) {
        (Some(r), Some(b)) if mode == Mode::Translate && event_stream => {
            let grant = origin
                .as_ref()
                .and_then(|o| shared.cors.stream_grant(o, &parts.headers));
            r.create(b, &agent, grant)
        }
        .inspect(|s| {
            if let Some((_, w)) = &watched {
                w.hold(&s.hex, Arc::new(HeldRun(Arc::downgrade(s))));
            }
            if let (Some(t), Some(run)) = (&shared.traces, &run_of_stream) {
                t.remember_run(s.token, run.clone());
            }
            let url = r.url(&s.token);
            if let Some(read) = &read {
                read.held(&url);
            }
            if let Ok(v) = HeaderValue::from_str(&url) {
                parts.headers.insert(resume::STREAM_HEADER, v);
            }
        }),
        _ => None,
    };
    metrics.request(mode, parts.status);
    tracing::debug!(status = %parts.status, mode = mode.as_str(), "upstream responded");
    let info = StreamInfo {
        mode,
        event_stream,
        request_start,
        span,
        client_fault,
    };
    let settings = StreamSettings {
        keepalive: shared.keepalive,
        idle_timeout: shared.idle_timeout,
        flushes,
        held,
    };
    let mut body = ResponseBody::upstream(body, translator, info, Arc::clone(metrics), settings);
    if let Some(read) = read.filter(|_| mode == Mode::Translate) {
        if body.encode(read.encoder(), read.learn()) {
            read.set_headers(&mut parts.headers);
        }
    }
    Response::from_parts(parts, body)
}

/// The AI SDK's resume route: the chat's held stream read again from the start, encoded as its first read was;
/// 204 when there is none (never held, or no longer).
async fn resume_chat(
    shared: &Shared,
    found: Option<(String, Read)>,
    headers: &http::HeaderMap,
    asked: Instant,
    server_span: Option<&ServerSpan>,
) -> Response<ResponseBody> {
    let no_stream = || {
        let mut resp = Response::new(ResponseBody::full(bytes::Bytes::new()));
        *resp.status_mut() = StatusCode::NO_CONTENT;
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp.extensions_mut().insert(cors::OwnAnswer::About(None));
        shared.metrics.request(Mode::Passthrough, StatusCode::NO_CONTENT);
        resp
    };
    let (Some((url, read)), Some(r)) = (found, &shared.resumer) else {
        return no_stream();
    };
    let Some(token) = r.stream_token(&url) else {
        return no_stream();
    };
    if let Some(s) = server_span {
        link_to_run(shared, &token, s);
    }
    let mut resp = resumption::answer(r, resume::Route::Watch(token, 0), headers, shared, asked).await;
    if resp.status() != StatusCode::OK || !resp.body_mut().encode(read.encoder(), read.learn()) {
        return no_stream();
    }
    read.set_headers(resp.headers_mut());
    resp
}

/// Links a reconnect's or watcher's span to the run it reads, when this instance made that run.
fn link_to_run(shared: &Shared, token: &resume::id::Token, span: &ServerSpan) {
    if let Some(run) = shared.traces.as_ref().and_then(|t| t.run_of(token)) {
        span.link(run);
    }
}

/// A translated stream is never cached (DESIGN 5: `Cache-Control: no-cache`), and what the upstream said against
/// caching stands: `private, no-store` is kept as it is, not weakened to `no-cache`.
fn keep_uncached(h: &mut http::HeaderMap) {
    let forbids = h
        .get_all(header::CACHE_CONTROL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|d| matches!(d.trim().to_ascii_lowercase().as_str(), "no-store" | "no-cache"));
    if !forbids {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
}

/// RFC 9112 §3.2: an HTTP/1.1 request without exactly one `Host` header must be refused with 400 (an earlier
/// or later hop could pick a different one of two). HTTP/1.0 may omit it; HTTP/2 has `:authority`.
fn host_count_ok<B>(req: &Request<B>) -> bool {
    req.version() != http::Version::HTTP_11 || req.headers().get_all(header::HOST).iter().count() == 1
}

/// hyper's client sends no body with a GET or HEAD of unknown length unless the request says it has one; a
/// client's chunked body is forwarded (as nginx does), so it is said again after the hop-by-hop fields went.
fn keep_chunked_body(method: &Method, h: &mut http::HeaderMap, body: &UpstreamBody) {
    use http_body::Body as _;
    let unknown_length = !body.is_end_stream() && body.size_hint().exact().is_none();
    if matches!(*method, Method::GET | Method::HEAD) && unknown_length && !h.contains_key(header::CONTENT_LENGTH) {
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
}

/// A response framed by `Transfer-Encoding` was read to its chunked end whatever its `Content-Length` said
/// (RFC 9112 §6.3: the length must then be ignored, and a proxy must remove it); passing the length on would
/// cut the client's copy short and let it look complete.
fn drop_conflicting_length(h: &mut http::HeaderMap) {
    if h.contains_key(header::TRANSFER_ENCODING) && h.remove(header::CONTENT_LENGTH).is_some() {
        tracing::warn!("upstream sent Content-Length with Transfer-Encoding: length dropped");
    }
}

/// Reads `agent_uuid` from a small JSON body (bounded by `max` and by its declared Content-Length) and returns
/// the body to forward with that candidate, unchecked (`agent::choose` checks it); any other body is streamed
/// untouched. `Err` when the client's body fails.
async fn sniff_agent(
    parts: &http::request::Parts,
    body: UpstreamBody,
    max: usize,
) -> Result<(UpstreamBody, Option<String>), ()> {
    if !agent::body_is_sniffable(&parts.headers, max) {
        return Ok((body, None));
    }
    let bytes = Limited::new(body, max).collect().await.map_err(|_| ())?.to_bytes();
    let agent = agent::body_agent(&bytes);
    let body = Full::new(bytes).map_err(|never| match never {}).boxed();
    Ok((body, agent))
}

fn request_id<B>(req: &Request<B>) -> String {
    req.headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|s| is_safe_request_id(s))
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string())
}

#[cfg(test)]
mod tests {
    use crate::proxy::decide::handler::{is_safe_request_id, request_id, MAX_REQUEST_ID};
    use crate::telemetry::error_chain;

    #[test]
    fn a_request_id_that_could_forge_log_fields_is_replaced() {
        let with = |id: &str| request_id(&http::Request::builder().header("x-request-id", id).body(()).unwrap());
        for ok in ["abc-123", "7f3a.b_c:d", &"a".repeat(MAX_REQUEST_ID)] {
            assert_eq!(with(ok), ok);
        }
        for bad in [
            "a b",
            "id=x",
            "a\tb",
            "a\"b",
            "caf\u{e9}",
            &"a".repeat(MAX_REQUEST_ID + 1),
        ] {
            assert!(!is_safe_request_id(bad), "{bad:?}");
            if let Ok(v) = http::HeaderValue::from_str(bad) {
                let got = with(v.to_str().unwrap_or_default());
                assert!(got != bad && is_safe_request_id(&got), "{bad:?} -> {got:?}");
            }
        }
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("upstream unreachable")]
        Plain(#[source] std::io::Error),
        #[error("upstream unreachable: {0}")]
        Repeats(#[source] std::io::Error),
    }

    #[test]
    fn the_log_chain_names_the_root_cause_once() {
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        assert_eq!(
            error_chain(&Outer::Plain(refused())),
            "upstream unreachable: connection refused"
        );
        assert_eq!(
            error_chain(&Outer::Repeats(refused())),
            "upstream unreachable: connection refused"
        );
    }
}
