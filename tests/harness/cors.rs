//! A backend's CORS as Starlette's `CORSMiddleware` answers it (starlette/middleware/cors.py), for the
//! cross-origin tests: the legacy web app's backend is FastAPI behind that middleware, allowing one origin with
//! credentials. [`Cors::apply`] turns an [`Emulator`](super::upstream::Emulator) handler's answer into the answer
//! the middleware would give, byte for byte in the headers that matter to a browser:
//!
//! - no `Origin`: the handler's answer unchanged;
//! - a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`): answered by the middleware alone,
//!   `200 OK`, or `400 Disallowed CORS origin, method, headers` (the failures it found, in that order). Both carry
//!   `Vary: Origin`, `Access-Control-Allow-Methods`, `Access-Control-Max-Age`, `Access-Control-Allow-Headers` (the
//!   safelisted four and the listed ones, sorted, when not `*`) and `Access-Control-Allow-Credentials: true` with
//!   credentials; `Access-Control-Allow-Origin: <origin>` only for an allowed origin;
//! - any other request with `Origin`: the handler's answer with `Access-Control-Allow-Credentials` and
//!   `Access-Control-Expose-Headers` (when set, whatever the origin, as Starlette does), and for an allowed origin
//!   `Access-Control-Allow-Origin: <origin>` and `Origin` added to `Vary`.
//!
//! Not emulated: `allow_origin_regex` and private-network preflights (the legacy app uses neither).

use super::client::{header_value, Client};
use super::upstream::{Recorded, Step};

/// Asserts that the gateway answered `c` with `status` and `Access-Control-Allow-Origin: allowed` (no such header
/// where `None`); a failure names `what` (the case, or the logs) and the response head.
pub fn assert_answer(c: &Client, status: u16, allowed: Option<&str>, what: &str) {
    assert_eq!(c.status, status, "{what}\n{}", c.head);
    assert_eq!(
        header_value(&c.head, "access-control-allow-origin"),
        allowed,
        "{what}\n{}",
        c.head
    );
}

/// What `allow_methods=["*"]` stands for in Starlette.
pub const ALL_METHODS: [&str; 7] = ["DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"];
/// Starlette always lists these in `Access-Control-Allow-Headers`, beside the configured ones.
const SAFELISTED_HEADERS: [&str; 4] = ["Accept", "Accept-Language", "Content-Language", "Content-Type"];

/// The middleware's own answer to a preflight.
#[derive(Debug, Clone)]
pub struct Preflight {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// A `CORSMiddleware` configuration (Starlette's parameters, same defaults: `max_age` 600, nothing exposed).
#[derive(Debug, Clone)]
pub struct Cors {
    /// `"*"` allows every origin.
    pub allow_origins: Vec<String>,
    pub allow_methods: Vec<String>,
    /// `"*"` mirrors whatever a preflight asks for.
    pub allow_headers: Vec<String>,
    pub allow_credentials: bool,
    pub expose_headers: Vec<String>,
    pub max_age: u32,
}

impl Cors {
    /// The legacy web app's backend: exactly `origin`, with credentials, every method (`allow_methods=["*"]`), and
    /// an explicit header list (`authorization` beside the safelisted four) rather than `*`: the configuration
    /// that refuses a preflight asking for `last-event-id`.
    pub fn legacy_app(origin: &str) -> Cors {
        Cors {
            allow_origins: vec![origin.to_owned()],
            allow_methods: ALL_METHODS.iter().map(|m| (*m).to_owned()).collect(),
            allow_headers: vec!["authorization".to_owned()],
            allow_credentials: true,
            expose_headers: Vec::new(),
            max_age: 600,
        }
    }

    /// The same policy, exposing `headers` to allowed origins.
    pub fn exposing(mut self, headers: &[&str]) -> Cors {
        self.expose_headers = headers.iter().map(|h| (*h).to_owned()).collect();
        self
    }

    fn allow_all_origins(&self) -> bool {
        self.allow_origins.iter().any(|o| o == "*")
    }

    fn allow_all_headers(&self) -> bool {
        self.allow_headers.iter().any(|h| h == "*")
    }

    /// Whether the middleware allows `origin`.
    pub fn allows(&self, origin: &str) -> bool {
        self.allow_all_origins() || self.allow_origins.iter().any(|o| o == origin)
    }

    /// The header list a preflight answer names: the safelisted four and the configured ones, sorted as Python
    /// sorts strings (by code point, so capitalised names first), without duplicates.
    fn listed_headers(&self) -> Vec<String> {
        let mut all: Vec<String> = SAFELISTED_HEADERS
            .iter()
            .map(|h| (*h).to_owned())
            .chain(self.allow_headers.iter().cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The answer to `req` when it is a preflight: status, headers and body, as the middleware sends them.
    pub fn preflight(&self, req: &Recorded) -> Option<Preflight> {
        let origin = req.header("origin")?;
        let method = req.header("access-control-request-method")?;
        if req.method != "OPTIONS" {
            return None;
        }
        let explicit_origin = !self.allow_all_origins() || self.allow_credentials;
        let mut headers: Vec<(String, String)> = Vec::new();
        let mut failures = Vec::new();
        if explicit_origin {
            headers.push(("Vary".into(), "Origin".into()));
        } else {
            headers.push(("Access-Control-Allow-Origin".into(), "*".into()));
        }
        headers.push(("Access-Control-Allow-Methods".into(), self.allow_methods.join(", ")));
        headers.push(("Access-Control-Max-Age".into(), self.max_age.to_string()));
        let listed = self.listed_headers();
        if !self.allow_all_headers() {
            headers.push(("Access-Control-Allow-Headers".into(), listed.join(", ")));
        }
        if self.allow_credentials {
            headers.push(("Access-Control-Allow-Credentials".into(), "true".into()));
        }
        if self.allows(origin) {
            if explicit_origin {
                headers.push(("Access-Control-Allow-Origin".into(), origin.to_owned()));
            }
        } else {
            failures.push("origin");
        }
        if !self.allow_methods.iter().any(|m| m == method) {
            failures.push("method");
        }
        if let Some(asked) = req.header("access-control-request-headers") {
            if self.allow_all_headers() {
                set(&mut headers, "Access-Control-Allow-Headers", asked);
            } else {
                let lower: Vec<String> = listed.iter().map(|h| h.to_ascii_lowercase()).collect();
                if asked
                    .split(',')
                    .any(|h| !lower.contains(&h.trim().to_ascii_lowercase()))
                {
                    failures.push("headers");
                }
            }
        }
        let (status, body) = if failures.is_empty() {
            (200, "OK".to_owned())
        } else {
            (400, format!("Disallowed CORS {}", failures.join(", ")))
        };
        headers.push(("Content-Type".into(), "text/plain; charset=utf-8".into()));
        headers.push(("Content-Length".into(), body.len().to_string()));
        Some(Preflight { status, headers, body })
    }

    /// The headers the middleware sets on the answer to a request that is not a preflight (none without `Origin`);
    /// `Vary` is the value to add to the answer's own.
    pub fn simple_headers(&self, req: &Recorded) -> Vec<(String, String)> {
        let Some(origin) = req.header("origin") else {
            return Vec::new();
        };
        let mut headers = Vec::new();
        if self.allow_all_origins() {
            headers.push(("Access-Control-Allow-Origin".to_owned(), "*".to_owned()));
        }
        if self.allow_credentials {
            headers.push(("Access-Control-Allow-Credentials".to_owned(), "true".to_owned()));
        }
        if !self.expose_headers.is_empty() {
            headers.push((
                "Access-Control-Expose-Headers".to_owned(),
                self.expose_headers.join(", "),
            ));
        }
        let has_cookie = req.header("cookie").is_some();
        let has_authorization = req.header("authorization").is_some();
        // Starlette names the origin instead of `*` when the request carries credentials; and always for a
        // listed origin.
        let explicit = if self.allow_all_origins() {
            (self.allow_credentials && has_authorization) || has_cookie
        } else {
            self.allows(origin)
        };
        if explicit {
            headers.push(("Access-Control-Allow-Origin".to_owned(), origin.to_owned()));
            headers.push(("Vary".to_owned(), "Origin".to_owned()));
        }
        headers
    }

    /// `answer` (a handler's steps for `req`) as the middleware in front of that handler sends it: a preflight
    /// answered alone, the CORS headers of any other request merged into the answer's head.
    pub fn apply(&self, req: &Recorded, answer: impl FnOnce() -> Vec<Step>) -> Vec<Step> {
        if let Some(Preflight { status, headers, body }) = self.preflight(req) {
            return vec![
                Step::Head {
                    status,
                    headers,
                    chunked: false,
                },
                Step::WriteAll(body.into_bytes()),
            ];
        }
        let mut steps = answer();
        let added = self.simple_headers(req);
        if let Some(Step::Head { headers, .. }) = steps.iter_mut().find(|s| matches!(s, Step::Head { .. })) {
            for (k, v) in added {
                if k == "Vary" {
                    let vary = match headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("vary")) {
                        Some((_, old)) => format!("{old}, {v}"),
                        None => v,
                    };
                    set(headers, "Vary", &vary);
                } else {
                    set(headers, &k, &v);
                }
            }
        }
        steps
    }
}

/// Sets header `name` to `value`, replacing any of that name (as Starlette's `MutableHeaders` item assignment).
fn set(headers: &mut Vec<(String, String)>, name: &str, value: &str) {
    headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
    headers.push((name.to_owned(), value.to_owned()));
}
