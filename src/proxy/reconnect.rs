//! Requests the gateway answers from held streams instead of forwarding (docs/RESUME.md): a reconnect with one
//! of our `Last-Event-ID`s, a watcher's `GET` and a `DELETE` on a stream's URL.

use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{HeaderMap, Response, StatusCode};

use super::body::{Follow, ResponseBody};
use super::headers::{X_ACCEL_BUFFERING, X_STREAM_FORMAT};
use super::{gateway_error, Shared};
use crate::resume::hub::AttachError;
use crate::resume::id::Token;
use crate::resume::metrics::Resumption;
use crate::resume::{Resumer, Route, STREAM_HEADER};

/// Answers a request `Resumer::route` did not send upstream.
pub fn answer(
    r: &Resumer,
    route: Route,
    headers: &HeaderMap,
    shared: &Shared,
    asked: Instant,
) -> Response<ResponseBody> {
    let m = &shared.metrics;
    let (token, after, primary) = match route {
        Route::Resume(id) => (id.token, id.seq, true),
        Route::Watch(token, after) => (token, after, false),
        Route::Cancel(token) => return cancel(r, &token, headers, shared),
        Route::MethodNotAllowed => {
            let mut resp = gateway_error(
                m,
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "a stream's URL takes GET or DELETE",
            );
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, DELETE"));
            return resp;
        }
        Route::NotFound | Route::Forward => return not_found(shared),
    };
    let Some(stream) = r.hub.get(&token) else {
        r.metrics.resumption(Resumption::Unknown);
        return gateway_error(
            m,
            StatusCode::GONE,
            "resume_unknown",
            "no such stream is held (unknown or expired)",
        );
    };
    if stream.binding != r.binding(headers) {
        r.metrics.resumption(Resumption::Denied);
        tracing::debug!("resume refused: bound headers differ");
        return not_found(shared);
    }
    let cursor = match stream.attach(after, primary) {
        Ok(c) => c,
        Err(AttachError::Gap) => {
            r.metrics.resumption(Resumption::Gap);
            return gateway_error(
                m,
                StatusCode::GONE,
                "resume_gap",
                "the stream no longer holds the events after that id",
            );
        }
        Err(AttachError::Unknown) => {
            r.metrics.resumption(Resumption::Unknown);
            return gateway_error(m, StatusCode::GONE, "resume_unknown", "the stream has not sent that id");
        }
    };
    r.metrics.resumption(Resumption::Replayed);
    tracing::info!(primary, "stream resumed from held events");
    m.request(super::negotiate::Mode::Translate, StatusCode::OK);
    let url = r.url(&stream.token);
    let follow = Follow::new(stream, cursor, Arc::clone(&r.metrics), asked);
    let mut resp = Response::new(ResponseBody::follow(follow, shared.keepalive, Arc::clone(m)));
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(X_ACCEL_BUFFERING, HeaderValue::from_static("no"));
    h.insert(X_STREAM_FORMAT, HeaderValue::from_static("json"));
    if let Ok(v) = HeaderValue::from_str(&url) {
        h.insert(STREAM_HEADER, v);
    }
    resp
}

fn cancel(r: &Resumer, token: &Token, headers: &HeaderMap, shared: &Shared) -> Response<ResponseBody> {
    match r.hub.get(token) {
        Some(stream) if stream.binding == r.binding(headers) => {
            stream.cancel();
            tracing::info!("stream cancelled by DELETE");
            shared
                .metrics
                .request(super::negotiate::Mode::Passthrough, StatusCode::NO_CONTENT);
            let mut resp = Response::new(ResponseBody::full(bytes::Bytes::new()));
            *resp.status_mut() = StatusCode::NO_CONTENT;
            resp
        }
        _ => not_found(shared),
    }
}

fn not_found(shared: &Shared) -> Response<ResponseBody> {
    gateway_error(&shared.metrics, StatusCode::NOT_FOUND, "not_found", "no such stream")
}
