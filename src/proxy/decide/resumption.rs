//! Requests the gateway answers from held streams instead of forwarding (docs/RESUME.md): a reconnect with one
//! of our `Last-Event-ID`s, a watcher's `GET` and a `DELETE` on a stream's URL. A stream this instance holds is
//! read from its hub; another instance's, from the shared store (`resume.store = "redis"`).

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{HeaderMap, Response, StatusCode};

use crate::proxy::body::follow::{Follow, RemoteFollow};

use crate::cors::{Grant, OwnAnswer, Preflight};
use crate::proxy::body::stack::ResponseBody;
use crate::proxy::decide::answers::{gateway_error, Shared};
use crate::proxy::request::headers::{X_ACCEL_BUFFERING, X_STREAM_FORMAT};
use crate::proxy::request::negotiate::Mode;
use crate::resume::id::Token;
use crate::resume::metrics::Resumption;
use crate::resume::redis::StoreError;
use crate::resume::{Opened, Refusal, Resumer, Route, STREAM_HEADER};
use crate::telemetry::error_chain;

/// Answers a request `Resumer::route` did not send upstream.
pub async fn answer(
    r: &Resumer,
    route: Route,
    headers: &HeaderMap,
    shared: &Shared,
    asked: Instant,
) -> Response<ResponseBody> {
    let (token, after, primary) = match route {
        Route::Resume(id) => (id.token, id.seq, true),
        Route::Watch(token, after) => (token, after, false),
        Route::Cancel(token) => return cancel(r, &token, headers, shared).await,
        Route::MethodNotAllowed => {
            let mut resp = gateway_error(
                &shared.metrics,
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "a stream's URL takes GET or DELETE",
            );
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, DELETE, OPTIONS"));
            return resp;
        }
        Route::Forward => return not_found(shared),
    };
    let opened = match r.open(&token, r.binding(headers), after, primary).await {
        Ok(o) => o,
        Err(Refusal::Counted(why)) => return refused(r, shared, why),
        Err(Refusal::Busy) => {
            // A bound of this instance, not of the stream: the client may retry here later or elsewhere.
            return gateway_error(
                &shared.metrics,
                StatusCode::SERVICE_UNAVAILABLE,
                "resume_unavailable",
                "too many streams are read from the shared store on this instance; try again",
            );
        }
        Err(Refusal::Store(e)) => return store_failed(shared, &e),
    };
    let (body, grant) = match opened {
        Opened::Local(stream, cursor) => {
            let grant = stream.cors.clone();
            let follow = Follow::new(stream, cursor, Arc::clone(&r.metrics), asked);
            (
                ResponseBody::follow(follow, shared.keepalive, Arc::clone(&shared.metrics)),
                grant,
            )
        }
        Opened::Remote(reader) => {
            let grant = reader.cors().cloned().map(Arc::new);
            let follow = RemoteFollow::new(*reader, after, Arc::clone(&r.metrics), asked);
            (
                ResponseBody::remote(follow, shared.keepalive, Arc::clone(&shared.metrics)),
                grant,
            )
        }
    };
    replaying(r, &token, shared, primary, body, grant)
}

/// The answer to a request for a stream that cannot be read, counted by why.
fn refused(r: &Resumer, shared: &Shared, why: Resumption) -> Response<ResponseBody> {
    r.metrics.resumption(why);
    let m = &shared.metrics;
    match why {
        Resumption::Gap => gateway_error(
            m,
            StatusCode::GONE,
            "resume_gap",
            "the stream no longer holds the events after that id",
        ),
        Resumption::Unknown => gateway_error(
            m,
            StatusCode::GONE,
            "resume_unknown",
            "no such stream is held (unknown or expired), or it has not sent that id",
        ),
        // The client may watch again later (or after another watcher left); nothing is wrong with the gateway.
        Resumption::WatchersFull => gateway_error(
            m,
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_watchers",
            "this stream has as many watchers as it allows; try again later",
        ),
        // Other bound headers: as if there were no such stream (the 404).
        Resumption::Denied | Resumption::Replayed => not_found(shared),
    }
}

/// The head of a stream read back.
fn replaying(
    r: &Resumer,
    token: &Token,
    shared: &Shared,
    primary: bool,
    body: ResponseBody,
    grant: Option<Arc<Grant>>,
) -> Response<ResponseBody> {
    r.metrics.resumption(Resumption::Replayed);
    tracing::info!(primary, "stream resumed from held events");
    shared.metrics.request(Mode::Translate, StatusCode::OK);
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(X_ACCEL_BUFFERING, HeaderValue::from_static("no"));
    h.insert(X_STREAM_FORMAT, HeaderValue::from_static("json"));
    if let Ok(v) = HeaderValue::from_str(&r.url(token)) {
        h.insert(STREAM_HEADER, v);
    }
    resp.extensions_mut().insert(OwnAnswer::About(grant));
    resp
}

async fn cancel(r: &Resumer, token: &Token, headers: &HeaderMap, shared: &Shared) -> Response<ResponseBody> {
    // A failed store is not "no such stream": the client must learn that its cancel did not happen, as a
    // reconnect in the same outage does.
    let grant = match r.cancel(token, r.binding(headers)).await {
        Ok(Some(grant)) => grant,
        Ok(None) => return not_found(shared),
        Err(e) => return store_failed(shared, &e),
    };
    tracing::info!("stream cancelled by DELETE");
    shared.metrics.request(Mode::Passthrough, StatusCode::NO_CONTENT);
    let mut resp = Response::new(ResponseBody::full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::NO_CONTENT;
    resp.extensions_mut().insert(OwnAnswer::About(grant));
    resp
}

/// A CORS preflight for a stream's URL (a watcher's `GET`, a `DELETE`), answered from what the backend allowed
/// the stream's origin (or the operator's policy): 204 with the CORS headers, or 403 without them.
pub async fn preflight(r: &Resumer, token: &Token, p: &Preflight, shared: &Shared) -> Response<ResponseBody> {
    let grant = match (r.hub.get(token), r.hub.mirror()) {
        (Some(stream), _) => stream.cors.clone(),
        // A stream held on another instance: the answer kept with it in the store (none if the store fails:
        // the preflight then goes by what the backend last answered that origin).
        (None, Some(store)) => store.cors(&token.hex()).await.ok().flatten().map(Arc::new),
        (None, None) => None,
    };
    let mut resp = match shared.cors.own_preflight(p, grant.as_deref()) {
        Ok(cors) => {
            shared.metrics.request(Mode::Passthrough, StatusCode::NO_CONTENT);
            let mut resp = Response::new(ResponseBody::full(bytes::Bytes::new()));
            *resp.status_mut() = StatusCode::NO_CONTENT;
            resp.headers_mut().extend(cors);
            resp
        }
        Err(why) => {
            tracing::info!(%why, "CORS preflight for a stream's URL refused");
            gateway_error(
                &shared.metrics,
                StatusCode::FORBIDDEN,
                "cors_refused",
                "this origin, method or header is not allowed for the stream",
            )
        }
    };
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, DELETE, OPTIONS"));
    resp.extensions_mut().insert(OwnAnswer::Preflight);
    resp
}

/// The shared store failed: `503`, never "no such stream" (the client retries; the stream may well exist).
fn store_failed(shared: &Shared, e: &StoreError) -> Response<ResponseBody> {
    tracing::warn!(error = %error_chain(e), "resume: the shared store failed");
    gateway_error(
        &shared.metrics,
        StatusCode::SERVICE_UNAVAILABLE,
        "resume_unavailable",
        "the shared stream store is unavailable; try again",
    )
}

fn not_found(shared: &Shared) -> Response<ResponseBody> {
    gateway_error(&shared.metrics, StatusCode::NOT_FOUND, "not_found", "no such stream")
}
