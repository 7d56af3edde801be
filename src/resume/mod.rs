//! Resumable translated streams (docs/RESUME.md): every envelope event gets an id naming its stream and
//! position; the gateway holds the events, keeps the upstream through a client's disconnect, and answers a
//! reconnect carrying `Last-Event-ID` itself, so the run goes on instead of starting again.
//!
//! - `id`: tokens and event ids (`sg1-<token>-<seq>`).
//! - `hub`: the in-process store of held streams: events, subscribers' cursors, grace and retention.
//! - `redis`: the same events mirrored to Redis/Valkey Streams, read by other instances.
//! - `sessions`: every stream of a binding for a session socket, held now and each new one as it starts.
//! - `announce`: other instances' starts for the sessions here, through one Redis pub/sub connection.
//! - `metrics`: the resume metric families.
//!
//! The edge writes into a stream with its `body::hold` layer and reads one with `body::follow`; nothing here
//! names the edge.

pub mod announce;
pub mod hub;
pub mod id;
pub mod metrics;
pub mod redis;
pub mod sessions;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use http::{HeaderMap, HeaderName, Method};

use self::redis::{Bound, OpenError, RedisOptions, RedisStore, StoreObserver, StoreOp};
use crate::config::{self, duration, StoreKind};
use crate::cors::Grant;
use hub::{Hub, Limits, Stream};
use id::{EventId, Token};
use metrics::{ResumeMetrics, Resumption};
use sessions::{Listed, Session, SessionError, SessionLimits};

/// The `Last-Event-ID` request header.
pub const LAST_EVENT_ID: &str = "last-event-id";
/// The response header that gives a stream's URL.
pub const STREAM_HEADER: &str = "x-gateway-stream";
/// How often ended streams past their retention are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// What a request asks of the resume layer.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Not ours: forwarded as usual.
    Forward,
    /// A reconnect: `Last-Event-ID` is one of our ids.
    Resume(EventId),
    /// `GET <prefix>/<token>`: a watcher, after `after` (0: from the start).
    Watch(Token, u64),
    /// `DELETE <prefix>/<token>`.
    Cancel(Token),
    /// Another method on a stream's URL.
    MethodNotAllowed,
}

/// Resumption for one gateway: the held streams, how requests are bound to them, and the metrics.
pub struct Resumer {
    pub hub: Hub,
    pub metrics: Arc<ResumeMetrics>,
    /// `resume.path_prefix`.
    pub prefix: String,
    key: [u8; 32],
    bind: Vec<BoundValue>,
}

/// One value a stream is bound to (`resume.bind_headers`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum BoundValue {
    /// A whole request header.
    Header(HeaderName),
    /// One cookie of the `Cookie` header: `cookie:<name>`, as configured.
    Cookie(String),
}

impl BoundValue {
    fn parse(s: &str) -> Option<BoundValue> {
        match s.split_once(':') {
            Some((c, name)) if c.eq_ignore_ascii_case("cookie") => {
                config::is_cookie_name(name).then(|| BoundValue::Cookie(format!("cookie:{name}")))
            }
            Some(_) => None,
            None => HeaderName::from_bytes(s.as_bytes()).ok().map(BoundValue::Header),
        }
    }
}

/// The values of the cookies named `name` in a request's `Cookie` fields, in order.
fn cookie_values<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b';'))
        .filter_map(move |pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (pair[..eq].trim_ascii() == name.as_bytes()).then(|| pair[eq + 1..].trim_ascii())
        })
}

impl Resumer {
    /// With the Redis store, connects to it first: a gateway that cannot reach it at start stops with an error
    /// (afterwards, an unreachable store only makes streams not resumable elsewhere).
    pub async fn start(cfg: &config::Resume, metrics: Arc<ResumeMetrics>) -> Result<Arc<Self>, String> {
        let mirror = match cfg.store {
            StoreKind::Memory => None,
            StoreKind::Redis => {
                let opts = RedisOptions {
                    key_prefix: cfg.redis_key_prefix.clone(),
                    max_events: cfg.redis_max_events,
                    buffer_bytes: cfg.buffer_bytes,
                    max_total_bytes: cfg.max_total_bytes,
                    ttl: duration(cfg.grace_secs + cfg.retention_secs).max(Duration::from_secs(1)),
                    stall: duration(cfg.redis_stall_secs),
                    max_readers: cfg.max_remote_readers,
                    follow_connections: cfg.redis_follow_connections,
                    write_linger: Duration::from_millis(cfg.redis_write_linger_ms),
                    ..RedisOptions::default()
                };
                let observer: Arc<dyn StoreObserver> = Arc::clone(&metrics) as _;
                let url = config::redact_userinfo(&cfg.redis_url);
                let store = RedisStore::connect(&cfg.redis_url, opts, observer)
                    .await
                    .map_err(|e| format!("resume.redis_url {url}: {}", crate::telemetry::error_chain(&e)))?;
                Some(store)
            }
        };
        let r = Arc::new(Self::new(cfg, metrics, mirror)?);
        r.spawn_sweeper();
        Ok(r)
    }

    pub fn new(cfg: &config::Resume, metrics: Arc<ResumeMetrics>, mirror: Option<RedisStore>) -> Result<Self, String> {
        let key = if cfg.binding_key.is_empty() {
            let mut k = [0u8; 32];
            getrandom::fill(&mut k).map_err(|e| format!("no randomness for resume.binding_key: {e}"))?;
            k
        } else {
            blake3::derive_key("sse-gateway resume binding v1", cfg.binding_key.as_bytes())
        };
        let bind = cfg
            .bind_headers
            .iter()
            .map(|h| {
                BoundValue::parse(h)
                    .ok_or_else(|| format!("resume.bind_headers: {h:?} is not a header or cookie:<name>"))
            })
            .collect::<Result<_, _>>()?;
        let limits = Limits {
            buffer_bytes: cfg.buffer_bytes,
            max_total_bytes: cfg.max_total_bytes,
            grace: duration(cfg.grace_secs),
            retention: duration(cfg.retention_secs),
            retry_ms: cfg.retry_ms,
            max_grace_streams: cfg.max_grace_streams,
            max_grace_per_binding: cfg.max_grace_streams_per_binding,
            max_watchers: cfg.max_watchers_per_stream,
            watcher_write_timeout: duration(cfg.watcher_write_timeout_secs),
            session_queue: cfg.session_queue,
        };
        Ok(Self {
            hub: Hub::new(limits, Arc::clone(&metrics), mirror),
            metrics,
            prefix: cfg.path_prefix.clone(),
            key,
            bind,
        })
    }

    /// The keyed hash of the bound values: each bound header's field value as its lines combine (`, `; for
    /// `Cookie`, `; `, since HTTP/2 clients may split it into one field per cookie), or each bound cookie's value
    /// (`cookie:<name>`: the other cookies may change, as a session's rotating ones do); an absent value differs
    /// from an empty one.
    pub fn binding(&self, headers: &HeaderMap) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        for bound in &self.bind {
            // A cookie's label (`cookie:<name>`) is no header name, so the two kinds never hash alike.
            let (label, values): (&str, Vec<&[u8]>) = match bound {
                BoundValue::Header(name) => (
                    name.as_str(),
                    headers.get_all(name).iter().map(|v| v.as_bytes()).collect(),
                ),
                BoundValue::Cookie(label) => (
                    label.as_str(),
                    cookie_values(headers, &label["cookie:".len()..]).collect(),
                ),
            };
            let sep: &[u8] = match bound {
                BoundValue::Header(name) if name != http::header::COOKIE => b", ",
                _ => b"; ",
            };
            h.update(&(label.len() as u64).to_le_bytes());
            h.update(label.as_bytes());
            let mut values = values.into_iter();
            match values.next() {
                None => h.update(&[0]),
                Some(first) => {
                    h.update(&[1]);
                    h.update(first);
                    for v in values {
                        h.update(sep);
                        h.update(v);
                    }
                    h.update(&[0xff])
                }
            };
        }
        *h.finalize().as_bytes()
    }

    /// Whether `authorization` is among the bound values (a browser's socket cannot send it in the handshake).
    pub fn binds_authorization(&self) -> bool {
        self.bind
            .iter()
            .any(|b| matches!(b, BoundValue::Header(h) if h == http::header::AUTHORIZATION))
    }

    /// Whether the request carries any bound value at all (a session without one would be everybody's).
    pub fn has_bound_values(&self, headers: &HeaderMap) -> bool {
        self.bind.iter().any(|b| match b {
            BoundValue::Header(name) => headers.contains_key(name),
            BoundValue::Cookie(label) => cookie_values(headers, &label["cookie:".len()..]).next().is_some(),
        })
    }

    /// The token of a stream's URL (`<prefix>/<token>`, 32 hex digits). Nothing else under the prefix is the
    /// gateway's: a prefix such as `/agent` must not hide the backend's `/agent/run`.
    pub fn stream_token(&self, path: &str) -> Option<Token> {
        path.strip_prefix(self.prefix.as_str())?
            .strip_prefix('/')
            .and_then(Token::parse)
    }

    /// Whether the request is one the gateway answers from held streams.
    pub fn route(&self, method: &Method, path: &str, headers: &HeaderMap) -> Route {
        let last = headers
            .get(LAST_EVENT_ID)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| EventId::parse(v.trim()));
        if let Some(token) = self.stream_token(path) {
            return match *method {
                Method::GET => Route::Watch(token, last.filter(|l| l.token == token).map_or(0, |l| l.seq)),
                Method::DELETE => Route::Cancel(token),
                _ => Route::MethodNotAllowed,
            };
        }
        match last {
            Some(id) => Route::Resume(id),
            None => Route::Forward,
        }
    }

    /// A new resumable stream for a translated response (see `Hub::create`); with a mirror, the owner also
    /// watches what other instances ask of it (a primary reading there, a cancel).
    pub fn create(&self, binding: [u8; 32], agent: &str, cors: Option<Grant>) -> Option<Arc<Stream>> {
        let stream = self.hub.create_with_cors(binding, agent, cors.map(Arc::new))?;
        if let Some(store) = self.hub.mirror() {
            tokio::spawn(watch_remote(Arc::downgrade(&stream), store.clone()));
        }
        Some(stream)
    }

    /// A session of `binding`: the streams held now (here, and with the Redis store those other instances
    /// indexed whose keys still exist), the newest `limits.max_listed` oldest first, then each new one as it
    /// starts on any instance. Errors: `Full` (`limits.max_sessions` open here), `Store` (Redis did not answer
    /// the subscription or the listing).
    pub async fn session(&self, binding: [u8; 32], limits: SessionLimits) -> Result<Session, SessionError> {
        // Registered (and subscribed) before listing: a stream started meanwhile is listed, told, or both (then
        // told once).
        let mut session = self.hub.sessions().open(binding, limits).await?;
        let mut listed = self.hub.list(&binding, limits.max_listed);
        if let Some(store) = self.hub.mirror() {
            for i in store.list_binding(&binding, limits.max_listed).await? {
                let Some(token) = Token::parse(&i.token) else { continue };
                // This instance's own are listed from the hub, which knows best whether they ended.
                if !listed.iter().any(|(_, l)| l.token == token) {
                    listed.push((i.created_us, Listed { token, ended: i.ended }));
                }
            }
            listed.sort_unstable_by_key(|(at, l)| (*at, l.token.hex()));
            listed.drain(..listed.len().saturating_sub(limits.max_listed));
        }
        session.set_listed(listed.into_iter().map(|(_, l)| l).collect());
        Ok(session)
    }

    /// A stream's URL (`<prefix>/<token>`).
    pub fn url(&self, token: &Token) -> String {
        format!("{}/{}", self.prefix, token.hex())
    }

    /// Forgets expired streams every second, for as long as the resumer lives.
    fn spawn_sweeper(self: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(r) = weak.upgrade() else { return };
                r.hub.sweep(Instant::now());
            }
        });
    }
}

/// How often the owner of a mirrored stream asks what other instances want of it.
const REMOTE_EVERY: Duration = Duration::from_secs(1);

/// Until the run ends: applies a remote primary's cursor (the run is not abandoned) and a remote cancel.
async fn watch_remote(stream: Weak<Stream>, store: RedisStore) {
    loop {
        tokio::time::sleep(REMOTE_EVERY).await;
        let Some(s) = stream.upgrade().filter(|s| !s.has_ended()) else {
            return;
        };
        // A failed read is counted by the store's observer; the next tick tries again.
        let Ok(remote) = store.remote_state(&s.hex).await else {
            continue;
        };
        if remote.cancelled {
            s.cancel();
        }
        if let Some(cursor) = remote.primary_cursor {
            s.remote_primary(cursor);
        }
    }
}

impl StoreObserver for ResumeMetrics {
    fn op(&self, op: StoreOp, ok: bool, seconds: f64) {
        self.store_ops[op as usize][usize::from(!ok)].inc();
        self.store_seconds[op as usize].observe(seconds);
    }

    fn unresumable(&self) {
        self.unresumable.inc();
    }

    fn evicted(&self, bound: Bound, bytes: u64) {
        self.store_evicted_bytes[bound as usize].inc_by(bytes);
    }

    fn store_lost(&self) {
        self.store_lost.inc();
    }
}

/// A held stream opened for a reader: here, or in the shared store.
pub enum Opened {
    Local(Arc<Stream>, hub::Cursor),
    Remote(Box<redis::RemoteReader>),
}

/// Why a stream could not be opened for a reader.
#[derive(Debug)]
pub enum Refusal {
    /// Counted as `resume_resumptions_total{outcome}` (gap, unknown, denied, watchers full).
    Counted(Resumption),
    /// This instance reads `resume.max_remote_readers` streams from the store already.
    Busy,
    /// The shared store failed: the stream may well exist.
    Store(redis::StoreError),
}

impl Resumer {
    /// Opens `token` for a reader bound to `binding`, after `after`: from the hub when this instance holds it,
    /// else from the shared store. `primary`: the original's reconnection, not a watcher.
    pub async fn open(&self, token: &Token, binding: [u8; 32], after: u64, primary: bool) -> Result<Opened, Refusal> {
        if let Some(stream) = self.hub.get(token) {
            if stream.binding != binding {
                return Err(Refusal::Counted(Resumption::Denied));
            }
            return match stream.attach(after, primary) {
                Ok(cursor) => Ok(Opened::Local(stream, cursor)),
                Err(hub::AttachError::Gap) => Err(Refusal::Counted(Resumption::Gap)),
                Err(hub::AttachError::Unknown) => Err(Refusal::Counted(Resumption::Unknown)),
                Err(hub::AttachError::Full) => Err(Refusal::Counted(Resumption::WatchersFull)),
            };
        }
        let Some(store) = self.hub.mirror() else {
            return Err(Refusal::Counted(Resumption::Unknown));
        };
        match store.open(&token.hex(), binding, Some(after)).await {
            Ok(mut reader) => {
                if primary {
                    reader.set_primary();
                }
                Ok(Opened::Remote(Box::new(reader)))
            }
            Err(OpenError::Unknown) => Err(Refusal::Counted(Resumption::Unknown)),
            Err(OpenError::Gap { .. }) => Err(Refusal::Counted(Resumption::Gap)),
            Err(OpenError::Denied) => Err(Refusal::Counted(Resumption::Denied)),
            Err(OpenError::Busy) => {
                self.metrics.remote_readers_refused.inc();
                Err(Refusal::Busy)
            }
            Err(OpenError::Store(e)) => Err(Refusal::Store(e)),
        }
    }

    /// Cancels `token` for a caller bound to `binding`: `Ok(Some(grant))` when it was cancelled (with the CORS
    /// answer kept with it), `Ok(None)` when there is no such stream for that binding. A stream held on another
    /// instance is cancelled through the store; its owner sees it within a second.
    pub async fn cancel(
        &self,
        token: &Token,
        binding: [u8; 32],
    ) -> Result<Option<Option<Arc<Grant>>>, redis::StoreError> {
        match (self.hub.get(token), self.hub.mirror()) {
            (Some(stream), _) => Ok((stream.binding == binding).then(|| {
                stream.cancel();
                stream.cors.clone()
            })),
            (None, Some(store)) => match store.cancel(&token.hex(), binding).await {
                Ok(kept) => Ok(Some(kept.map(Arc::new))),
                Err(OpenError::Store(e)) => Err(e),
                Err(_) => Ok(None),
            },
            (None, None) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resumer() -> Resumer {
        let metrics = Arc::new(ResumeMetrics::register(&prometheus::Registry::new()).unwrap());
        Resumer::new(&config::Resume::default(), metrics, None).unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_binding_is_the_bound_headers_values_however_a_cookie_is_split() {
        let r = resumer();
        let b = |pairs: &[(&str, &str)]| r.binding(&headers(pairs));
        let one = b(&[("cookie", "a=1; b=2"), ("authorization", "Bearer x"), ("x-other", "1")]);
        assert_eq!(
            one,
            b(&[("authorization", "Bearer x"), ("cookie", "a=1"), ("cookie", "b=2")])
        );
        assert_eq!(
            one,
            b(&[("cookie", "a=1; b=2"), ("authorization", "Bearer x")]),
            "unbound headers do not count"
        );
        assert_ne!(one, b(&[("cookie", "a=1; b=3"), ("authorization", "Bearer x")]));
        assert_ne!(one, b(&[("cookie", "a=1; b=2")]));
        assert_ne!(b(&[]), b(&[("authorization", "")]), "absent is not empty");
        assert_ne!(
            one,
            resumer().binding(&headers(&[("cookie", "a=1; b=2"), ("authorization", "Bearer x")])),
            "keyed"
        );
    }

    #[test]
    fn a_bound_cookie_is_its_own_value_whatever_the_other_cookies_do() {
        let cfg = config::Resume {
            bind_headers: vec!["authorization".into(), "cookie:session".into()],
            ..config::Resume::default()
        };
        let metrics = Arc::new(ResumeMetrics::register(&prometheus::Registry::new()).unwrap());
        let r = Resumer::new(&cfg, metrics, None).unwrap();
        let b = |pairs: &[(&str, &str)]| r.binding(&headers(pairs));
        let one = b(&[("cookie", "session=s1; csrf=a"), ("authorization", "Bearer x")]);
        assert_eq!(
            one,
            b(&[("cookie", "csrf=b; session=s1"), ("authorization", "Bearer x")]),
            "rotated csrf"
        );
        assert_eq!(
            one,
            b(&[
                ("cookie", "csrf=b"),
                ("cookie", "session=s1"),
                ("authorization", "Bearer x")
            ])
        );
        assert_ne!(
            one,
            b(&[("cookie", "session=s2; csrf=a"), ("authorization", "Bearer x")])
        );
        assert_ne!(one, b(&[("cookie", "csrf=a"), ("authorization", "Bearer x")]), "absent");
        assert_ne!(b(&[("cookie", "session=")]), b(&[]), "empty is not absent");
        assert_ne!(one, b(&[("cookie", "session=s1; csrf=a")]));
    }

    /// The session's next start, failing the test rather than hang.
    async fn next(s: &mut Session) -> Option<Token> {
        tokio::time::timeout(Duration::from_secs(5), s.next_start())
            .await
            .expect("no start within 5 s")
    }

    #[tokio::test]
    async fn a_session_lists_its_bindings_held_streams_then_is_told_each_new_one() {
        let r = resumer();
        let limits = SessionLimits {
            max_sessions: 4,
            max_listed: 2,
        };
        let mine = [1; 32];
        let old = r.create(mine, "a", None).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        let ended = r.create(mine, "a", None).unwrap();
        ended.finish(&[], metrics::End::Completed);
        std::thread::sleep(Duration::from_millis(2));
        let live = r.create(mine, "a", None).unwrap();
        let _other = r.create([2; 32], "a", None).unwrap();
        let mut s = r.session(mine, limits).await.unwrap();
        assert_eq!(
            s.listed(),
            [
                Listed {
                    token: ended.token,
                    ended: true
                },
                Listed {
                    token: live.token,
                    ended: false
                }
            ],
            "the newest two of the binding, oldest first"
        );
        assert!(s.listed().iter().all(|l| l.token != old.token));
        let _elsewhere = r.create([2; 32], "a", None).unwrap();
        let new = r.create(mine, "a", None).unwrap();
        assert_eq!(
            next(&mut s).await,
            Some(new.token),
            "its binding's start, not another's"
        );
        let mut two = r.session(mine, limits).await.unwrap();
        let newer = r.create(mine, "a", None).unwrap();
        assert_eq!(next(&mut s).await, Some(newer.token));
        assert_eq!(next(&mut two).await, Some(newer.token), "every session of the binding");
        assert_eq!(r.metrics.sessions.get(), 2);
        drop((s, two));
        assert_eq!(r.metrics.sessions.get(), 0);
    }

    #[test]
    fn requests_are_routed_by_their_last_event_id_and_the_stream_urls() {
        let r = resumer();
        let t = Token::random().unwrap();
        let id = |seq: u64| format!("sg1-{}-{seq}", t.hex());
        let route = |m: Method, path: &str, last: Option<&str>| {
            let h = last.map_or_else(HeaderMap::new, |l| headers(&[("last-event-id", l)]));
            r.route(&m, path, &h)
        };
        assert_eq!(route(Method::POST, "/agent/run", None), Route::Forward);
        assert_eq!(route(Method::POST, "/agent/run", Some("42")), Route::Forward);
        assert_eq!(
            route(Method::POST, "/agent/run", Some(&id(7))),
            Route::Resume(EventId { token: t, seq: 7 })
        );
        let url = r.url(&t);
        assert_eq!(route(Method::GET, &url, None), Route::Watch(t, 0));
        assert_eq!(route(Method::GET, &url, Some(&id(3))), Route::Watch(t, 3));
        assert_eq!(route(Method::DELETE, &url, None), Route::Cancel(t));
        assert_eq!(route(Method::PUT, &url, None), Route::MethodNotAllowed);
        // Only a stream's URL is the gateway's: anything else under the prefix goes to the backend.
        for other in [
            "/_gateway/streams",
            "/_gateway/streams/",
            "/_gateway/streams/xyz",
            &format!("{url}/x"),
        ] {
            assert_eq!(route(Method::GET, other, None), Route::Forward, "{other}");
        }
        assert_eq!(route(Method::GET, "/_gateway/streamsX", None), Route::Forward);
    }
}
