//! The inspector's routes on the admin listener (DESIGN 6.2): the pages, `streams.json`, a stream's
//! `capture.ndjson` and its live `events` feed, the token form. Every answer is `no-store`, `nosniff`, without
//! any `Access-Control-*`; pages carry the CSP.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::Incoming;
use tokio::sync::{watch, Notify};

use super::auth::{self, Auth};
use super::record;
use super::watch::{Feed, Watched};
use super::{page, Attach, FeedPlace, Inspector};

/// An admin response body: whole, or a live feed.
pub type AdminBody = UnsyncBoxBody<Bytes, Infallible>;

/// Largest token form body read.
const MAX_FORM_BYTES: usize = 4096;
/// Bytes of records sent in one frame of a feed at most.
const FEED_FRAME_BYTES: usize = 64 << 10;
/// A comment after this long with nothing to send, so a feed whose client is gone is noticed.
const FEED_KEEPALIVE: Duration = Duration::from_secs(15);

/// Where every inspector route lives.
pub const PREFIX: &str = "/debug/";

/// Whether the inspector answers `path`.
pub fn owns(path: &str) -> bool {
    path.starts_with(PREFIX) || path == "/debug"
}

pub fn whole(body: impl Into<Bytes>) -> AdminBody {
    Full::new(body.into()).boxed_unsync()
}

/// What kind of answer, for its headers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Page,
    Other,
}

fn answer(status: StatusCode, content_type: &'static str, kind: Kind, body: AdminBody) -> Response<AdminBody> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if kind == Kind::Page {
        h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(page::CSP));
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    r
}

fn text(status: StatusCode, body: &'static str) -> Response<AdminBody> {
    answer(status, "text/plain; charset=utf-8", Kind::Other, whole(body))
}

fn html(status: StatusCode, body: String) -> Response<AdminBody> {
    answer(status, "text/html; charset=utf-8", Kind::Page, whole(body))
}

/// The routes under `/debug/`, once the request is known to be one.
pub struct Routes {
    inspector: Arc<Inspector>,
    auth: Auth,
}

/// A request's route under `/debug/`.
enum Route<'a> {
    Asset(&'static str, &'static str),
    Login,
    List,
    ListJson,
    Stream(&'a str),
    Events(&'a str),
    Capture(&'a str),
    Unknown,
}

fn route(path: &str) -> Route<'_> {
    match path {
        "/debug/assets/inspector.js" => Route::Asset("text/javascript; charset=utf-8", page::SCRIPT),
        "/debug/assets/inspector.css" => Route::Asset("text/css; charset=utf-8", page::STYLE),
        "/debug/assets/icon.svg" => Route::Asset("image/svg+xml", page::ICON),
        "/debug/login" => Route::Login,
        "/debug/streams" | "/debug/streams/" => Route::List,
        "/debug/streams.json" => Route::ListJson,
        _ => match path.strip_prefix("/debug/streams/") {
            Some(rest) => match rest.split_once('/') {
                None => Route::Stream(rest),
                Some((id, "events")) => Route::Events(id),
                Some((id, "capture.ndjson")) => Route::Capture(id),
                Some(_) => Route::Unknown,
            },
            None => Route::Unknown,
        },
    }
}

impl Routes {
    pub fn new(inspector: Arc<Inspector>) -> Self {
        let auth = Auth::new(&inspector.settings.token);
        Self { inspector, auth }
    }

    /// Answers a request under `/debug/`; `cut` closes its connection (a feed the ring passed).
    pub async fn respond(&self, req: Request<Incoming>, cut: &Arc<Notify>) -> Response<AdminBody> {
        let path = req.uri().path().to_owned();
        let r = route(&path);
        if let Route::Login = r {
            return self.login(req).await;
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        if let Route::Asset(ct, body) = r {
            // Static and the same for everyone: the login form needs them before any token.
            return answer(StatusCode::OK, ct, Kind::Other, whole(body));
        }
        if !self.auth.allows(req.headers()) {
            return self.refused(&r, req.headers());
        }
        match r {
            Route::List => html(StatusCode::OK, page::list()),
            Route::ListJson => self.list_json(),
            Route::Stream(id) => match self.find(id) {
                Some(w) => {
                    self.inspector.attached(Attach::Page);
                    tracing::info!(stream = w.id, "inspector: stream page opened");
                    html(StatusCode::OK, page::stream())
                }
                None => text(StatusCode::NOT_FOUND, "no such stream\n"),
            },
            Route::Capture(id) => match self.find(id) {
                Some(w) => self.capture(&w),
                None => text(StatusCode::NOT_FOUND, "no such stream\n"),
            },
            Route::Events(id) => match self.find(id) {
                Some(w) => self.events(w, cut),
                None => text(StatusCode::NOT_FOUND, "no such stream\n"),
            },
            Route::Asset(..) | Route::Login | Route::Unknown => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    fn find(&self, id: &str) -> Option<Arc<Watched>> {
        self.inspector.get(id.parse().ok()?)
    }

    /// Refused for want of the token: a browser opening a page is sent to the token form (a `401` page would be a
    /// console error), anything else gets `401`.
    fn refused(&self, r: &Route<'_>, headers: &http::HeaderMap) -> Response<AdminBody> {
        let browser = headers
            .get_all(header::ACCEPT)
            .iter()
            .any(|v| v.as_bytes().windows(9).any(|w| w == b"text/html"));
        if browser && matches!(r, Route::List | Route::Stream(_)) {
            let mut resp = text(StatusCode::SEE_OTHER, "see /debug/login\n");
            resp.headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("/debug/login"));
            return resp;
        }
        let mut resp = text(StatusCode::UNAUTHORIZED, "debug.token required\n");
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"sse-gateway debug\""),
        );
        resp
    }

    /// `POST /debug/login`: the form's token, kept in an `HttpOnly`, `SameSite=Strict` cookie for `/debug/`.
    async fn login(&self, req: Request<Incoming>) -> Response<AdminBody> {
        if req.method() == Method::GET || req.method() == Method::HEAD {
            return html(StatusCode::OK, page::login(false));
        }
        if req.method() != Method::POST {
            return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        }
        let Ok(body) = Limited::new(req.into_body(), MAX_FORM_BYTES).collect().await else {
            return text(StatusCode::BAD_REQUEST, "bad form\n");
        };
        let given = auth::form_token(&body.to_bytes());
        match given.filter(|t| self.auth.matches(t)) {
            Some(_) => {
                let mut r = text(StatusCode::SEE_OTHER, "see /debug/streams\n");
                r.headers_mut()
                    .insert(header::LOCATION, HeaderValue::from_static("/debug/streams"));
                if let Ok(v) = HeaderValue::from_str(&Auth::cookie(&self.inspector.settings.token)) {
                    r.headers_mut().insert(header::SET_COOKIE, v);
                }
                r
            }
            None => {
                tracing::warn!("inspector: wrong token given in the form");
                html(StatusCode::UNAUTHORIZED, page::login(true))
            }
        }
    }

    fn list_json(&self) -> Response<AdminBody> {
        let streams: Vec<serde_json::Value> = self.inspector.list().iter().map(|w| w.listed()).collect();
        let body = serde_json::json!({
            "streams": streams,
            "capture_content": self.inspector.settings.capture_content,
            "inspectors": self.inspector.feeds_open(),
            "max_inspectors": self.inspector.settings.max_inspectors,
        });
        answer(StatusCode::OK, "application/json", Kind::Other, whole(body.to_string()))
    }

    /// A snapshot of the records kept: one JSON object a line, a `gap` first when the ring lost some.
    fn capture(&self, w: &Watched) -> Response<AdminBody> {
        self.inspector.attached(Attach::Capture);
        tracing::info!(stream = w.id, "inspector: capture taken");
        let b = w.read(0, usize::MAX);
        let mut out = BytesMut::new();
        if b.lost > 0 {
            out.extend_from_slice(&record::gap(b.lost));
            out.extend_from_slice(b"\n");
        }
        for r in &b.records {
            out.extend_from_slice(r);
            out.extend_from_slice(b"\n");
        }
        let mut r = answer(StatusCode::OK, "application/x-ndjson", Kind::Other, whole(out.freeze()));
        if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"stream-{}.ndjson\"", w.id)) {
            r.headers_mut().insert(header::CONTENT_DISPOSITION, v);
        }
        r
    }

    /// The records as SSE from the ring's start, then live; at most `max_inspectors` at once (429 past it).
    fn events(&self, w: Arc<Watched>, cut: &Arc<Notify>) -> Response<AdminBody> {
        let Some(place) = self.inspector.feed_place() else {
            tracing::warn!(stream = w.id, "inspector: feed refused, max_inspectors open");
            return text(
                StatusCode::TOO_MANY_REQUESTS,
                "too many inspectors (debug.max_inspectors)\n",
            );
        };
        self.inspector.attached(Attach::Events);
        tracing::info!(stream = w.id, "inspector: live feed attached");
        let (feed, rx) = w.attach(Arc::clone(cut));
        let state = Reading {
            w,
            feed,
            rx,
            next: 0,
            done: false,
            _place: place,
        };
        let frames = futures_util::stream::unfold(state, |mut s| async move {
            let frame = s.step().await?;
            Some((Ok::<_, Infallible>(Frame::data(frame)), s))
        });
        answer(
            StatusCode::OK,
            "text/event-stream",
            Kind::Other,
            StreamBody::new(frames).boxed_unsync(),
        )
    }
}

/// A live feed's reading state; detached from its stream when dropped.
struct Reading {
    w: Arc<Watched>,
    feed: Arc<Feed>,
    rx: watch::Receiver<u64>,
    /// The ring position read next (0 at first: the gap before the ring, if any, is told).
    next: u64,
    done: bool,
    _place: FeedPlace,
}

impl Reading {
    /// The next frame: records, `event: end` once the stream ended and all was sent, or a keepalive comment.
    async fn step(&mut self) -> Option<Bytes> {
        if self.done || self.feed.is_cut() {
            return None;
        }
        loop {
            self.rx.borrow_and_update();
            let b = self.w.read(self.next, FEED_FRAME_BYTES);
            if b.lost > 0 || !b.records.is_empty() {
                let mut out = BytesMut::new();
                if b.lost > 0 {
                    event(&mut out, &record::gap(b.lost));
                }
                for r in &b.records {
                    event(&mut out, r);
                }
                self.next = b.next;
                self.feed.advance(b.next);
                return Some(out.freeze());
            }
            if b.ended {
                self.done = true;
                let state = serde_json::json!({ "state": self.w.state() }).to_string();
                return Some(Bytes::from(format!("event: end\ndata: {state}\n\n")));
            }
            tokio::select! {
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                () = tokio::time::sleep(FEED_KEEPALIVE) => return Some(Bytes::from_static(b": keepalive\n\n")),
            }
        }
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.w.detach(&self.feed);
        if self.feed.is_cut() {
            tracing::warn!(stream = self.w.id, "inspector: live feed cut, it fell behind the ring");
        }
    }
}

fn event(out: &mut BytesMut, record: &[u8]) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(record);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_read_from_the_path() {
        assert!(matches!(route("/debug/streams"), Route::List));
        assert!(matches!(route("/debug/streams.json"), Route::ListJson));
        assert!(matches!(route("/debug/streams/7"), Route::Stream("7")));
        assert!(matches!(route("/debug/streams/7/events"), Route::Events("7")));
        assert!(matches!(route("/debug/streams/7/capture.ndjson"), Route::Capture("7")));
        assert!(matches!(route("/debug/streams/7/x"), Route::Unknown));
        assert!(owns("/debug/streams") && !owns("/debugger") && !owns("/metrics"));
    }
}
