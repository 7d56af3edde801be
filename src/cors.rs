//! CORS on the responses the gateway writes itself (DESIGN 5.1): a page on another origin may read a resumed
//! stream, a watcher, a `DELETE` or one of the gateway's errors only if that answer carries the CORS headers the
//! backend's own answer would have carried. Otherwise the browser hides it ("Failed to fetch") although the
//! gateway did the right thing.
//!
//! The backend's decision is the policy, never widened: what it allowed an origin is read from its answers, kept
//! with each stream (a [`Grant`], in every store) and learned per origin for the answers about no stream. An
//! operator may instead set the policy (`[cors]`), which then applies to every response the gateway writes itself.
//! Only the preflight of a reconnect is changed on its way: `fetch-event-source` re-POSTs with `Last-Event-ID`, so
//! its preflight asks for `last-event-id`, which a backend listing its allowed headers refuses; the gateway asks
//! the backend without it and adds it to an answer that allowed the origin and the method.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::header::{
    self, HeaderMap, HeaderName, HeaderValue, ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS,
    ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD,
};
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};

use crate::config;

/// The request header a reconnect carries, which the gateway answers itself.
const LAST_EVENT_ID: &str = "last-event-id";
/// The response headers of the gateway's own that a page may read.
const EXPOSED: &str = "x-gateway-stream";
/// Origins whose backend answers are remembered at most; past it the oldest is forgotten.
pub const MAX_LEARNED: usize = 256;
/// How long a learned answer stands without being seen again.
pub const LEARNED_FOR: Duration = Duration::from_secs(600);
/// Longest `Origin` value taken (a browser's is a scheme, a host and a port).
const MAX_ORIGIN: usize = 256;
/// Request headers a browser sends cross-origin without asking (the Fetch standard's CORS-safelisted names
/// whose values it checks itself).
const SAFELISTED: [&str; 3] = ["accept", "accept-language", "content-language"];

/// What one origin may do with the gateway's own answers: the backend's CORS answer to it (or the operator's
/// policy). Kept with a stream in every store (serialized with serde), so any instance answers alike.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// `Access-Control-Allow-Origin`: the origin itself, or `*` (then never with credentials).
    pub origin: String,
    /// `Access-Control-Allow-Credentials: true` was sent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credentials: bool,
    /// `Access-Control-Allow-Methods` of the backend's preflight answer, if one was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<String>,
    /// `Access-Control-Allow-Headers` of the backend's preflight answer, if one was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<String>,
    /// `Access-Control-Expose-Headers` of the backend's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expose: Option<String>,
    /// `Access-Control-Max-Age` of the backend's preflight answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
}

impl Grant {
    /// Whether a request from `origin` may read an answer under this grant.
    pub fn allows(&self, origin: &str) -> bool {
        (self.origin == "*" && !self.credentials) || self.origin == origin
    }

    /// The grant a backend's answer to a request from `origin` gives: none unless it allowed that origin.
    fn from_answer(origin: &str, h: &HeaderMap) -> Option<Grant> {
        let allowed = text(h, &ACCESS_CONTROL_ALLOW_ORIGIN)?;
        if allowed != "*" && allowed != origin {
            return None;
        }
        let credentials = text(h, &ACCESS_CONTROL_ALLOW_CREDENTIALS).is_some_and(|v| v == "true");
        Some(Grant {
            origin: allowed.to_owned(),
            // `*` with credentials is refused by browsers: it grants nothing that needs them.
            credentials: credentials && allowed != "*",
            methods: text(h, &ACCESS_CONTROL_ALLOW_METHODS).map(str::to_owned),
            headers: text(h, &ACCESS_CONTROL_ALLOW_HEADERS).map(str::to_owned),
            expose: text(h, &ACCESS_CONTROL_EXPOSE_HEADERS).map(str::to_owned),
            max_age: text(h, &ACCESS_CONTROL_MAX_AGE).map(str::to_owned),
        })
    }

    /// Whether a preflight may go on with `method`: safelisted, or listed by the backend.
    fn allows_method(&self, method: &str) -> bool {
        matches!(method, "GET" | "HEAD" | "POST")
            || self.methods.as_deref().is_some_and(|list| {
                list.split(',')
                    .map(str::trim)
                    .any(|m| m == method || (m == "*" && !self.credentials))
            })
    }

    /// Whether a preflight may go on with request header `name` (lowercase): safelisted, `last-event-id` (the
    /// gateway's own), or listed by the backend.
    fn allows_header(&self, name: &str) -> bool {
        SAFELISTED.contains(&name)
            || name == LAST_EVENT_ID
            || self.headers.as_deref().is_some_and(|list| {
                list.split(',')
                    .map(str::trim)
                    .any(|h| h.eq_ignore_ascii_case(name) || (h == "*" && !self.credentials))
            })
    }

    /// Writes the answer's CORS headers for a request from `origin` (which this grant allows).
    fn write(&self, origin: &HeaderValue, h: &mut HeaderMap) {
        if self.origin == "*" && !self.credentials {
            h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
        } else {
            h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
            h.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
            vary_origin(h);
        }
        if !self.credentials {
            h.remove(ACCESS_CONTROL_ALLOW_CREDENTIALS);
        }
        let expose = match self.expose.as_deref() {
            Some("*") if !self.credentials => "*".to_owned(),
            Some(list) if !list.trim().is_empty() => format!("{list}, {EXPOSED}"),
            _ => EXPOSED.to_owned(),
        };
        if let Ok(v) = HeaderValue::from_str(&expose) {
            h.insert(ACCESS_CONTROL_EXPOSE_HEADERS, v);
        }
    }
}

/// A response the gateway wrote itself, as an extension of it (an answer without it is the backend's).
#[derive(Clone, Debug)]
pub enum OwnAnswer {
    /// The CORS answer is added on the way out: from the stream's grant when the answer is about one.
    About(Option<Arc<Grant>>),
    /// A preflight answer that already carries its CORS headers (or was refused).
    Preflight,
}

/// The gateway's CORS policy: the operator's, or what the backend answered each origin.
pub struct Cors {
    explicit: Option<Explicit>,
    learned: Mutex<HashMap<String, Learned>>,
}

struct Learned {
    grant: Grant,
    seen: Instant,
}

/// `[cors]` with origins set.
struct Explicit {
    any: bool,
    origins: Vec<String>,
    credentials: bool,
    methods: String,
    headers: String,
    expose: Option<String>,
    max_age: String,
}

/// Why a preflight for one of the gateway's own paths is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the origin is not allowed")]
    Origin,
    #[error("the method is not allowed")]
    Method,
    #[error("a request header is not allowed")]
    Header,
}

/// A preflight request's question: its origin, method and request headers.
#[derive(Debug)]
pub struct Preflight {
    pub origin: HeaderValue,
    pub method: String,
    /// Lowercase, trimmed, without empty items.
    pub headers: Vec<String>,
}

impl Preflight {
    /// The request as a CORS preflight: `OPTIONS` with `Origin` and `Access-Control-Request-Method`.
    pub fn of(method: &Method, h: &HeaderMap) -> Option<Preflight> {
        if method != Method::OPTIONS {
            return None;
        }
        let origin = origin(h)?;
        let method = text(h, &ACCESS_CONTROL_REQUEST_METHOD)?.to_owned();
        let headers = h
            .get_all(ACCESS_CONTROL_REQUEST_HEADERS)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
            .collect();
        Some(Preflight {
            origin,
            method,
            headers,
        })
    }

    fn asks_last_event_id(&self) -> bool {
        self.headers.iter().any(|h| h == LAST_EVENT_ID)
    }
}

/// The request's `Origin`, if it is one a browser could send (an opaque `null` origin is never granted anything
/// of its own).
pub fn origin(h: &HeaderMap) -> Option<HeaderValue> {
    let v = h.get(header::ORIGIN)?;
    let s = v.to_str().ok()?;
    (s.len() <= MAX_ORIGIN && s != "null" && s.contains("://")).then(|| v.clone())
}

fn text<'a>(h: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

/// Adds `Origin` to `Vary` unless it is there.
fn vary_origin(h: &mut HeaderMap) {
    let has = h
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case("origin") || v.trim() == "*");
    if !has {
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

impl Cors {
    pub fn new(cfg: &config::Cors) -> Self {
        let explicit = (!cfg.allow_origins.is_empty()).then(|| Explicit {
            any: cfg.allow_origins.iter().any(|o| o == "*"),
            origins: cfg.allow_origins.clone(),
            credentials: cfg.allow_credentials,
            methods: cfg.allow_methods.join(", "),
            headers: cfg.allow_headers.join(", "),
            expose: (!cfg.expose_headers.is_empty()).then(|| cfg.expose_headers.join(", ")),
            max_age: cfg.max_age_secs.to_string(),
        });
        Self {
            explicit,
            learned: Mutex::new(HashMap::new()),
        }
    }

    /// Before a preflight is forwarded: a reconnect's `last-event-id` is taken out of the headers it asks for (the
    /// gateway answers that request itself; a backend listing its headers would refuse the preflight for it).
    pub fn forward_preflight(preflight: &Preflight, h: &mut HeaderMap) {
        if !preflight.asks_last_event_id() {
            return;
        }
        h.remove(ACCESS_CONTROL_REQUEST_HEADERS);
        let rest: Vec<&str> = preflight
            .headers
            .iter()
            .map(String::as_str)
            .filter(|n| *n != LAST_EVENT_ID)
            .collect();
        if !rest.is_empty() {
            if let Ok(v) = HeaderValue::from_str(&rest.join(",")) {
                h.insert(ACCESS_CONTROL_REQUEST_HEADERS, v);
            }
        }
    }

    /// The backend's answer to a request from `origin`, on its way to the client: what it allowed is learned;
    /// an allowed preflight that asked for `last-event-id` gets it added; an allowed answer exposes
    /// `X-Gateway-Stream` when it carries one.
    pub fn backend_answer(
        &self,
        origin: &HeaderValue,
        preflight: Option<&Preflight>,
        status: StatusCode,
        h: &mut HeaderMap,
    ) {
        let Ok(o) = origin.to_str() else { return };
        let Some(grant) = Grant::from_answer(o, h) else {
            return;
        };
        match preflight {
            Some(p) if status.is_success() && grant.allows_method(&p.method) => {
                self.learn(o, grant.clone(), true);
                if p.asks_last_event_id() && !grant.allows_header_listed(LAST_EVENT_ID) {
                    let list = match grant.headers.as_deref() {
                        Some(l) if !l.trim().is_empty() => format!("{l}, {LAST_EVENT_ID}"),
                        _ => LAST_EVENT_ID.to_owned(),
                    };
                    if let Ok(v) = HeaderValue::from_str(&list) {
                        h.insert(ACCESS_CONTROL_ALLOW_HEADERS, v);
                    }
                }
            }
            Some(_) => {}
            None => {
                self.learn(o, grant.clone(), false);
                if h.contains_key(EXPOSED) {
                    grant.write(origin, h);
                }
            }
        }
    }

    /// The grant a new stream keeps for its origin: its response's CORS answer, with what the backend's
    /// preflight for that origin allowed.
    pub fn stream_grant(&self, origin: &HeaderValue, response: &HeaderMap) -> Option<Grant> {
        let o = origin.to_str().ok()?;
        let mut grant = Grant::from_answer(o, response)?;
        if let Some(l) = self.lookup(o) {
            grant.methods = grant.methods.or(l.methods);
            grant.headers = grant.headers.or(l.headers);
            grant.max_age = grant.max_age.or(l.max_age);
        }
        Some(grant)
    }

    /// The grant for a request from `origin` to an answer the gateway writes itself: the operator's policy if
    /// set; else the stream's, when the answer is about one; else what the backend last answered that origin.
    pub fn grant_for(&self, origin: &HeaderValue, stream: Option<&Grant>) -> Option<Grant> {
        let o = origin.to_str().ok()?;
        if let Some(e) = &self.explicit {
            return e.grant(o);
        }
        match stream {
            Some(g) => g.allows(o).then(|| g.clone()),
            None => self.lookup(o).filter(|g| g.allows(o)),
        }
    }

    /// Whether a WebSocket handshake from `origin` may read a stream (`stream`: its grant) or a session: the
    /// operator's policy if set; else an origin the backend allowed by name (a `*` grant does not do: a browser
    /// sends cookies with any site's socket, so only an origin named for it may use them).
    pub fn socket_allows(&self, origin: &str, stream: Option<&Grant>) -> bool {
        if let Some(e) = &self.explicit {
            return e.grant(origin).is_some();
        }
        match stream {
            Some(g) => g.origin == origin,
            None => self.lookup(origin).is_some_and(|g| g.origin == origin),
        }
    }

    /// Adds the CORS answer to a response the gateway wrote itself, for a request from `origin`.
    pub fn own_answer(&self, origin: &HeaderValue, stream: Option<&Grant>, h: &mut HeaderMap) {
        if let Some(g) = self.grant_for(origin, stream) {
            g.write(origin, h);
        }
    }

    /// The answer to a preflight for one of the gateway's own paths (a stream's URL), from what `origin` was
    /// allowed: the CORS headers of a 204, or why it is refused.
    pub fn own_preflight(&self, p: &Preflight, stream: Option<&Grant>) -> Result<HeaderMap, Refused> {
        let grant = self.grant_for(&p.origin, stream).ok_or(Refused::Origin)?;
        if !matches!(p.method.as_str(), "GET" | "DELETE") || !grant.allows_method(&p.method) {
            return Err(Refused::Method);
        }
        if !p.headers.iter().all(|n| grant.allows_header(n)) {
            return Err(Refused::Header);
        }
        let mut h = HeaderMap::new();
        grant.write(&p.origin, &mut h);
        h.remove(ACCESS_CONTROL_EXPOSE_HEADERS);
        if let Ok(v) = HeaderValue::from_str(&p.method) {
            h.insert(ACCESS_CONTROL_ALLOW_METHODS, v);
        }
        if !p.headers.is_empty() {
            if let Ok(v) = HeaderValue::from_str(&p.headers.join(", ")) {
                h.insert(ACCESS_CONTROL_ALLOW_HEADERS, v);
            }
        }
        if let Some(v) = grant.max_age.as_deref().and_then(|a| HeaderValue::from_str(a).ok()) {
            h.insert(ACCESS_CONTROL_MAX_AGE, v);
        }
        Ok(h)
    }

    /// What the backend last allowed `origin`, if it still stands.
    fn lookup(&self, origin: &str) -> Option<Grant> {
        let learned = self.learned.lock().unwrap_or_else(|p| p.into_inner());
        learned
            .get(origin)
            .filter(|l| l.seen.elapsed() < LEARNED_FOR)
            .map(|l| l.grant.clone())
    }

    /// Remembers the backend's answer to `origin`: a preflight's answer replaces the methods, headers and max-age;
    /// an actual response's the origin, credentials and exposed headers.
    fn learn(&self, origin: &str, grant: Grant, preflight: bool) {
        let mut learned = self.learned.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if !learned.contains_key(origin) && learned.len() >= MAX_LEARNED {
            learned.retain(|_, l| l.seen.elapsed() < LEARNED_FOR);
            if learned.len() >= MAX_LEARNED {
                if let Some(oldest) = learned.iter().min_by_key(|(_, l)| l.seen).map(|(k, _)| k.clone()) {
                    learned.remove(&oldest);
                }
            }
        }
        let entry = learned.entry(origin.to_owned()).or_insert_with(|| Learned {
            grant: grant.clone(),
            seen: now,
        });
        let old = std::mem::take(&mut entry.grant);
        entry.grant = if preflight {
            Grant {
                expose: old.expose,
                ..grant
            }
        } else {
            Grant {
                methods: old.methods,
                headers: old.headers,
                max_age: old.max_age,
                ..grant
            }
        };
        entry.seen = now;
    }
}

impl Grant {
    /// Whether the backend's own list (not the gateway's additions) already allows `name`.
    fn allows_header_listed(&self, name: &str) -> bool {
        self.headers.as_deref().is_some_and(|list| {
            list.split(',')
                .map(str::trim)
                .any(|h| h.eq_ignore_ascii_case(name) || (h == "*" && !self.credentials))
        })
    }
}

impl Explicit {
    fn grant(&self, origin: &str) -> Option<Grant> {
        let listed = self.origins.iter().any(|o| o == origin);
        if !listed && !self.any {
            return None;
        }
        Some(Grant {
            origin: if listed { origin.to_owned() } else { "*".to_owned() },
            credentials: self.credentials && listed,
            methods: Some(self.methods.clone()),
            headers: Some(self.headers.clone()),
            expose: self.expose.clone(),
            max_age: Some(self.max_age.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = "http://127.0.0.1:5173";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    /// Starlette's CORSMiddleware answer to a preflight from an allowed origin, with an explicit header list.
    fn starlette_preflight() -> HeaderMap {
        headers(&[
            ("access-control-allow-origin", APP),
            ("access-control-allow-credentials", "true"),
            (
                "access-control-allow-methods",
                "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT",
            ),
            (
                "access-control-allow-headers",
                "Accept, Accept-Language, Content-Language, Content-Type",
            ),
            ("access-control-max-age", "600"),
            ("vary", "Origin"),
        ])
    }

    fn preflight(method: &str, asked: &str) -> Preflight {
        let h = headers(&[
            ("origin", APP),
            ("access-control-request-method", method),
            ("access-control-request-headers", asked),
        ]);
        Preflight::of(&Method::OPTIONS, &h).unwrap()
    }

    fn backend() -> Cors {
        Cors::new(&config::Cors::default())
    }

    #[test]
    fn a_reconnects_preflight_asks_the_backend_without_last_event_id_and_gets_it_back() {
        let cors = backend();
        let p = preflight("POST", "content-type,Last-Event-ID");
        let mut forwarded = headers(&[("access-control-request-headers", "content-type,Last-Event-ID")]);
        Cors::forward_preflight(&p, &mut forwarded);
        assert_eq!(forwarded["access-control-request-headers"], "content-type");
        let mut answer = starlette_preflight();
        cors.backend_answer(&p.origin, Some(&p), StatusCode::OK, &mut answer);
        assert_eq!(
            answer["access-control-allow-headers"],
            "Accept, Accept-Language, Content-Language, Content-Type, last-event-id"
        );
        // Refused by the backend (another origin): nothing added.
        let mut other = headers(&[("access-control-allow-origin", "http://elsewhere")]);
        cors.backend_answer(&p.origin, Some(&p), StatusCode::OK, &mut other);
        assert!(other.get("access-control-allow-headers").is_none());
        // A method the backend did not list: nothing added.
        let put = preflight("PUT", "last-event-id");
        let mut narrow = headers(&[
            ("access-control-allow-origin", APP),
            ("access-control-allow-methods", "GET, POST"),
            ("access-control-allow-headers", "content-type"),
        ]);
        cors.backend_answer(&put.origin, Some(&put), StatusCode::OK, &mut narrow);
        assert_eq!(narrow["access-control-allow-headers"], "content-type");
    }

    #[test]
    fn own_answers_carry_the_streams_grant_only_to_its_origin() {
        let cors = backend();
        let p = preflight("POST", "content-type");
        cors.backend_answer(&p.origin, Some(&p), StatusCode::OK, &mut starlette_preflight());
        let response = headers(&[
            ("access-control-allow-origin", APP),
            ("access-control-allow-credentials", "true"),
        ]);
        let grant = cors.stream_grant(&p.origin, &response).expect("allowed");
        assert_eq!(
            grant.methods.as_deref(),
            Some("DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT")
        );
        let mut own = HeaderMap::new();
        cors.own_answer(&p.origin, Some(&grant), &mut own);
        assert_eq!(own["access-control-allow-origin"], APP);
        assert_eq!(own["access-control-allow-credentials"], "true");
        assert_eq!(own["access-control-expose-headers"], "x-gateway-stream");
        assert_eq!(own["vary"], "Origin");
        let mut stranger = HeaderMap::new();
        cors.own_answer(
            &HeaderValue::from_static("http://evil.test"),
            Some(&grant),
            &mut stranger,
        );
        assert!(stranger.is_empty(), "never widened: {stranger:?}");
    }

    #[test]
    fn a_stream_urls_preflight_is_answered_from_what_the_backend_allowed() {
        let cors = backend();
        let grant = Grant {
            origin: APP.into(),
            credentials: true,
            methods: Some("GET, POST".into()),
            headers: Some("content-type".into()),
            ..Grant::default()
        };
        let ok = cors
            .own_preflight(&preflight("GET", "last-event-id"), Some(&grant))
            .expect("GET");
        assert_eq!(ok["access-control-allow-methods"], "GET");
        assert_eq!(ok["access-control-allow-headers"], "last-event-id");
        assert_eq!(
            cors.own_preflight(&preflight("DELETE", ""), Some(&grant)).unwrap_err(),
            Refused::Method,
            "DELETE was not allowed"
        );
        assert_eq!(
            cors.own_preflight(&preflight("GET", "x-secret"), Some(&grant))
                .unwrap_err(),
            Refused::Header
        );
        let wide = Grant {
            methods: Some("DELETE, GET".into()),
            ..grant
        };
        assert!(cors.own_preflight(&preflight("DELETE", ""), Some(&wide)).is_ok());
        assert!(
            cors.own_preflight(&preflight("DELETE", ""), None).is_err(),
            "nothing learned"
        );
    }

    #[test]
    fn a_wildcard_never_goes_out_with_credentials() {
        let cors = backend();
        let o = HeaderValue::from_static(APP);
        let answer = headers(&[
            ("access-control-allow-origin", "*"),
            ("access-control-allow-credentials", "true"),
        ]);
        let g = cors.stream_grant(&o, &answer).expect("wildcard");
        assert!(!g.credentials);
        let mut own = HeaderMap::new();
        cors.own_answer(&o, Some(&g), &mut own);
        assert_eq!(own["access-control-allow-origin"], "*");
        assert!(own.get("access-control-allow-credentials").is_none());
    }

    #[test]
    fn answers_about_no_stream_use_what_the_backend_last_answered_that_origin() {
        let cors = backend();
        let o = HeaderValue::from_static(APP);
        let mut none = HeaderMap::new();
        cors.own_answer(&o, None, &mut none);
        assert!(none.is_empty(), "nothing learned yet");
        cors.backend_answer(
            &o,
            None,
            StatusCode::OK,
            &mut headers(&[("access-control-allow-origin", APP)]),
        );
        let mut learned = HeaderMap::new();
        cors.own_answer(&o, None, &mut learned);
        assert_eq!(learned["access-control-allow-origin"], APP);
        assert!(learned.get("access-control-allow-credentials").is_none());
    }

    #[test]
    fn the_learned_origins_are_bounded() {
        let cors = backend();
        for i in 0..MAX_LEARNED + 50 {
            let o = format!("http://h{i}.test");
            let v = HeaderValue::from_str(&o).unwrap();
            cors.backend_answer(
                &v,
                None,
                StatusCode::OK,
                &mut headers(&[("access-control-allow-origin", &o)]),
            );
        }
        assert_eq!(cors.learned.lock().unwrap().len(), MAX_LEARNED);
    }

    #[test]
    fn an_explicit_policy_applies_to_every_own_answer() {
        let cfg = config::Cors {
            allow_origins: vec![APP.into()],
            allow_credentials: true,
            ..config::Cors::default()
        };
        let cors = Cors::new(&cfg);
        let o = HeaderValue::from_static(APP);
        let mut own = HeaderMap::new();
        cors.own_answer(&o, None, &mut own);
        assert_eq!(own["access-control-allow-origin"], APP);
        assert_eq!(own["access-control-allow-credentials"], "true");
        let p = preflight("DELETE", "last-event-id");
        assert!(cors.own_preflight(&p, None).is_ok());
        let mut other = HeaderMap::new();
        cors.own_answer(&HeaderValue::from_static("http://evil.test"), None, &mut other);
        assert!(other.is_empty());
    }

    #[test]
    fn a_grant_round_trips_through_its_stored_text() {
        let g = Grant {
            origin: APP.into(),
            credentials: true,
            methods: Some("GET".into()),
            ..Grant::default()
        };
        let text = serde_json::to_string(&g).unwrap();
        assert_eq!(serde_json::from_str::<Grant>(&text).unwrap(), g);
    }
}
