//! The daemon's settings: one typed struct, loaded in layers and validated before any port is bound.
//!
//! Layers, lowest first: built-in defaults < `config/default.toml` (if present in the working directory)
//! < `--config FILE` < environment `SSE_GATEWAY__SECTION__KEY` < command-line flags.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;
use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::translate;

/// The committed defaults file, read from the working directory when it exists.
pub const DEFAULT_FILE: &str = "config/default.toml";
/// Prefix of environment overrides: `SSE_GATEWAY__UPSTREAM__URL`.
pub const ENV_PREFIX: &str = "SSE_GATEWAY";
/// hyper refuses an HTTP/1 read buffer smaller than this.
const MIN_HEADER_BYTES: usize = 8192;
/// Largest header block we let a client send (hyper's own ceiling is ~400 KiB).
const MAX_HEADER_BYTES: usize = 1 << 20;
/// Most `server.workers` (threads serving client connections).
const MAX_WORKERS: usize = 1024;
/// A sanity ceiling on `upstream.max_connections` (far above any file descriptor limit).
const MAX_UPSTREAM_CONNECTIONS: usize = 1 << 24;
/// A sanity ceiling on durations (one day): larger values are typos.
const MAX_SECS: f64 = 86_400.0;
/// Ceiling of `translate.budget`: an envelope is one SSE line a client parses whole; beyond 1 MiB the budget bounds
/// nothing a client can hold.
pub const MAX_BUDGET: usize = 1 << 20;
/// Ceiling of `translate.max_item_bytes`: one buffered legacy item per stream; 1 GiB is already far beyond any
/// single tool result, and larger values are typos that turn one stream into an out-of-memory kill.
pub const MAX_ITEM_BYTES_CEILING: usize = 1 << 30;
/// Ceiling of `translate.max_text_event_bytes` and `translate.json_sniff_bytes` (16 MiB): both are held per stream.
pub const MAX_HELD_BYTES_CEILING: usize = 16 << 20;
/// Ceiling of `translate.agent_body_max_bytes` (16 MiB): request bodies up to it are read into memory before the
/// upstream sees a byte; resumed-run bodies are a few KiB.
pub const MAX_AGENT_BODY_BYTES: usize = 16 << 20;
/// Floor of a non-zero `translate.keepalive_interval_secs`: below a second, keepalives are a write storm on every
/// idle stream, not a keepalive.
pub const MIN_KEEPALIVE_SECS: f64 = 1.0;

/// Everything the daemon reads from configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub server: Server,
    pub upstream: Upstream,
    #[serde(deserialize_with = "translate_by_key")]
    pub translate: Translate,
    pub resume: Resume,
    pub cors: Cors,
    pub websocket: WebSocket,
    pub log: Log,
    /// `[debug]`: the stream inspector on the admin listener (DESIGN 6.2, docs/OPERATIONS.md).
    pub debug: Debug,
    /// `[telemetry]`: OpenTelemetry traces (docs/OBSERVABILITY.md); the standard `OTEL_*` variables win.
    pub telemetry: Telemetry,
    /// `[[frontend]]`: public paths that speak a frontend's protocol to the backend's run (docs/FRONTENDS.md).
    #[serde(rename = "frontend")]
    pub frontends: Vec<Frontend>,
}

/// One `[[frontend]]` route: a path a `useChat` app or an AG-UI `HttpAgent` posts to, its protocol, and the
/// backend's paths its requests become.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Frontend {
    /// The public path the app posts to (`/api/chat`); the AI SDK's resume route is `<path>/<chat id>/stream`.
    pub path: String,
    /// `"ai-sdk"` or `"ag-ui"`.
    pub protocol: String,
    /// The backend's run path (`POST {user_prompt, agent_uuid?, agent_type?}`).
    pub run: String,
    /// The backend's tool-results path (`POST {agent_uuid, tool_results}`).
    pub tool_results: String,
    /// `agent_type` of the legacy body when the request names none (default: none sent).
    #[serde(default)]
    pub agent_type: Option<String>,
}

impl Frontend {
    /// The protocol, once validated.
    pub fn protocol(&self) -> crate::frontend::Protocol {
        crate::frontend::Protocol::parse(&self.protocol).unwrap_or(crate::frontend::Protocol::AiSdk)
    }
}

/// Validates the `[[frontend]]` routes: known protocols, paths that are paths, none inside another or under the
/// resumption prefix.
fn validate_frontends(frontends: &[Frontend], resume_prefix: &str) -> Result<(), ConfigError> {
    let safe = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'.' | b'~');
    let is_path = |p: &str| p.starts_with('/') && !p.contains("//") && p.bytes().all(safe);
    let inside = |a: &str, b: &str| a == b || a.starts_with(&format!("{}/", b.trim_end_matches('/')));
    for (i, f) in frontends.iter().enumerate() {
        if crate::frontend::Protocol::parse(&f.protocol).is_none() {
            return Err(invalid(
                "frontend.protocol",
                format!("[[frontend]] {i}: {:?} is not \"ai-sdk\" or \"ag-ui\"", f.protocol),
            ));
        }
        if !is_path(&f.path) || f.path.len() < 2 || f.path.ends_with('/') {
            return Err(invalid(
                "frontend.path",
                format!(
                    "[[frontend]] {i}: {:?} is not a path like \"/api/chat\" (no trailing /)",
                    f.path
                ),
            ));
        }
        for (key, p) in [("frontend.run", &f.run), ("frontend.tool_results", &f.tool_results)] {
            if !is_path(p) {
                return Err(invalid(
                    key,
                    format!("[[frontend]] {i}: {p:?} is not a path like \"/agent/run\""),
                ));
            }
        }
        if inside(&f.path, resume_prefix) || inside(resume_prefix, &f.path) {
            return Err(invalid(
                "frontend.path",
                format!(
                    "[[frontend]] {i}: {:?} overlaps resume.path_prefix {resume_prefix:?}",
                    f.path
                ),
            ));
        }
        if let Some(other) = frontends[..i]
            .iter()
            .find(|o| inside(&f.path, &o.path) || inside(&o.path, &f.path))
        {
            return Err(invalid(
                "frontend.path",
                format!(
                    "[[frontend]] {i}: {:?} overlaps another route's {:?}",
                    f.path, other.path
                ),
            ));
        }
        if f.agent_type.as_deref().is_some_and(|t| t.is_empty() || t.len() > 256) {
            return Err(invalid(
                "frontend.agent_type",
                format!("[[frontend]] {i}: must be 1 to 256 bytes"),
            ));
        }
    }
    Ok(())
}

/// Listeners and connection limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Server {
    /// Public listener (default "0.0.0.0:8080").
    pub listen: String,
    /// Admin listener for /metrics, /healthz, /readyz (default "127.0.0.1:9090").
    pub admin_listen: String,
    /// Seconds a client has to send a complete request head (default 10).
    pub header_read_timeout_secs: f64,
    /// Seconds a request body may stall: the whole of a small body the gateway reads itself, and any pause
    /// between two reads of a body streamed upstream; past it: 408 (default 60, like nginx's
    /// `client_body_timeout`).
    pub body_read_timeout_secs: f64,
    /// Seconds a client connection (HTTP/1.1 keep-alive or HTTP/2) may stay open with no request in flight
    /// before it is closed (HTTP/2: GOAWAY); open streams are never cut by it (default 60).
    pub idle_timeout_secs: f64,
    /// Largest request head in bytes, HTTP/1 buffer and HTTP/2 header list (default 65536).
    pub max_header_bytes: usize,
    /// Seconds open streams may run after SIGTERM before the process exits; translated streams still open then get
    /// a `gateway_draining` error envelope (default 30).
    pub drain_timeout_secs: f64,
    /// Accept HTTP/2 (prior knowledge, h2c) besides HTTP/1.1 (default true).
    pub http2: bool,
    /// Threads serving client connections, each a single-threaded runtime a connection stays on (default 0:
    /// one per CPU core).
    pub workers: usize,
    /// Whether a layer (file, environment, flag) set `listen`; not a key. The demo backend's gateway binds
    /// loopback unless it did (see `demo_listen`).
    #[serde(skip)]
    pub listen_given: bool,
    /// Keep X-Forwarded-Proto / X-Forwarded-Host, `Forwarded` and `X-Real-IP` set by a proxy in front instead of
    /// overwriting or removing them (default false: only trust it when a load balancer you run sits in front).
    pub trust_forwarded_headers: bool,
}

impl Server {
    /// `workers`, with 0 read as one per CPU core (std counts a cgroup's CPU quota: a pod's limit).
    pub fn worker_threads(&self) -> usize {
        match self.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

impl Default for Server {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:8080".into(),
            admin_listen: "127.0.0.1:9090".into(),
            header_read_timeout_secs: 10.0,
            body_read_timeout_secs: 60.0,
            idle_timeout_secs: 60.0,
            max_header_bytes: 64 << 10,
            drain_timeout_secs: 30.0,
            http2: true,
            workers: 0,
            listen_given: false,
            trust_forwarded_headers: false,
        }
    }
}

/// The one backend every request goes to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Upstream {
    /// Base URL, `http://host:port[/prefix]` (default: unset, which starts the built-in demo backend; set but empty
    /// is refused, so a blank variable cannot silently turn a deployment into the demo).
    pub url: String,
    /// Seconds to establish the TCP connection (default 5); past it: 502.
    pub connect_timeout_secs: f64,
    /// Seconds from sending the request to the response head (default 60); past it: 504.
    pub response_timeout_secs: f64,
    /// Seconds an idle pooled connection is kept (default 90).
    pub pool_idle_timeout_secs: f64,
    /// Idle pooled connections kept (default 64).
    pub pool_max_idle: usize,
    /// Upstream requests in flight at once, each holding a connection until its response ends; requests over
    /// it are answered 503 (default 1024, Envoy's default circuit breaker).
    pub max_connections: usize,
    /// Connection of requests that accept `text/event-stream` (default "dedicated"); others are pooled.
    pub stream_connections: UpstreamConnection,
    /// Seconds an event stream may go without a byte from the upstream before it is ended with an
    /// `upstream_error` envelope; 0 disables (default 0: agents may run long silent tools, and keepalive
    /// comments keep the client's connection open meanwhile).
    pub idle_timeout_secs: f64,
}

impl Default for Upstream {
    fn default() -> Self {
        Self {
            url: String::new(),
            connect_timeout_secs: 5.0,
            response_timeout_secs: 60.0,
            pool_idle_timeout_secs: 90.0,
            pool_max_idle: 64,
            max_connections: 1024,
            stream_connections: UpstreamConnection::Dedicated,
            idle_timeout_secs: 0.0,
        }
    }
}

label_enum! {
    /// Which upstream connection a request goes on (also the `connection` label of `upstream_requests_total`).
    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum UpstreamConnection {
        /// The shared pool.
        Pooled = "pooled",
        /// A connection of its own, read by the response body itself: no task hand-off per upstream chunk, so
        /// the chunks already read go to the client together. Closed when the response ends.
        Dedicated = "dedicated",
    }
}

/// The wire format a request gets when it does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamFormat {
    /// JSON envelopes (translated).
    #[default]
    Json,
    /// The legacy stream, unchanged.
    Legacy,
}

/// The `[translate]` table: negotiation and the daemon's own keys, beside the translator's `Options`, whose keys
/// (budget, dialect, line_ends, framing, data_join, rewrite_format, include_traceback, unknown_tags, max_item_bytes,
/// max_text_event_bytes, json_sniff_bytes), doc lines and defaults are its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Translate {
    /// Format for requests without `X-Stream-Format` or `stream_format=` (default "json").
    pub default_format: StreamFormat,
    /// Translate and count, but send the original bytes (default false).
    pub shadow: bool,
    /// The translator's keys, in this same table.
    #[serde(flatten)]
    pub options: translate::Options,
    /// Seconds of silence before a `: keepalive` comment on a translated stream; 0 disables, else at least 1
    /// (default 15).
    pub keepalive_interval_secs: f64,
    /// Request header naming the agent until the stream's `meta_init` does (default "x-agent-id").
    pub agent_header: String,
    /// JSON request bodies up to this size are read for `agent_uuid` (resumed runs); 0 disables (default 65536; at most
    /// 16 MiB).
    pub agent_body_max_bytes: usize,
    /// A translated stream that ends without `[DONE]` (or the backend's failure JSON) gets an
    /// `upstream_error` envelope and counts as an upstream error (default true, unlike the translator's own).
    pub require_done: bool,
}

impl Default for Translate {
    fn default() -> Self {
        Self {
            default_format: StreamFormat::Json,
            shadow: false,
            options: translate::Options::default(),
            keepalive_interval_secs: 15.0,
            agent_header: "x-agent-id".into(),
            agent_body_max_bytes: 64 << 10,
            require_done: true,
        }
    }
}

/// Deserializes `[translate]` key by key, so that its errors read as any other table's: serde checks flattened
/// values only after the whole table, where serde_path_to_error no longer knows the key (`translate: invalid type`
/// for `translate.budget: invalid type`), and lists no keys for an unknown one.
fn translate_by_key<'de, D: Deserializer<'de>>(d: D) -> Result<Translate, D::Error> {
    d.deserialize_map(TranslateByKey)
}

struct TranslateByKey;

/// The keys of a table, in declaration order: those of its default, serialized.
fn keys_of(default: impl Serialize) -> Vec<String> {
    match serde_json::to_value(default) {
        Ok(Value::Object(fields)) => fields.into_iter().map(|(k, _)| k).collect(),
        _ => Vec::new(),
    }
}

impl<'de> Visitor<'de> for TranslateByKey {
    type Value = Translate;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("struct Translate")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Translate, A::Error> {
        let (keys, options) = (keys_of(Translate::default()), keys_of(translate::Options::default()));
        let mut table = Map::new();
        while let Some(key) = map.next_key_seed(KnownKey(&keys))? {
            let value = map.next_value_seed(CheckedValue(&key, options.contains(&key)))?;
            table.insert(key, value);
        }
        Translate::deserialize(Value::Object(table)).map_err(de::Error::custom)
    }
}

/// A key of the table, or serde's error for an unknown field.
struct KnownKey<'a>(&'a [String]);

impl<'de> DeserializeSeed<'de> for KnownKey<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        let key = String::deserialize(d)?;
        if self.0.contains(&key) {
            return Ok(key);
        }
        let expected: Vec<String> = self.0.iter().map(|k| format!("`{k}`")).collect();
        Err(de::Error::custom(format_args!(
            "unknown field `{key}`, expected one of {}",
            expected.join(", ")
        )))
    }
}

/// The value of one key, checked while the key is on serde_path_to_error's path: deserialized alone into the struct
/// that declares it (`Options` directly for its keys, as the flattened copy would buffer it and word errors apart).
struct CheckedValue<'a>(&'a str, bool);

impl<'de> DeserializeSeed<'de> for CheckedValue<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        let value = Value::deserialize(d)?;
        let alone = Value::Object(Map::from_iter([(self.0.to_owned(), value.clone())]));
        let checked = if self.1 {
            translate::Options::deserialize(alone).map(drop)
        } else {
            Translate::deserialize(alone).map(drop)
        };
        checked.map_err(de::Error::custom)?;
        Ok(value)
    }
}

/// Resumable translated streams (docs/RESUME.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Resume {
    /// Give translated events ids and answer `Last-Event-ID` reconnects (default true).
    pub enabled: bool,
    /// The `retry:` (milliseconds) sent with a stream's first event (default 1000).
    pub retry_ms: u64,
    /// Seconds the upstream is kept, and its events held, once no client reads the stream; 0 drops it at once
    /// (default 30).
    pub grace_secs: f64,
    /// Seconds an ended stream stays readable (default 300).
    pub retention_secs: f64,
    /// Bytes of events held per stream (default 1 MiB).
    pub buffer_bytes: usize,
    /// Bytes of events held over all streams; past it the oldest ended streams go first (default 256 MiB).
    pub max_total_bytes: usize,
    /// Request headers a reader must repeat to read a stream, or single cookies as `cookie:<name>`, compared as
    /// keyed hashes (default `authorization`, `cookie`; never empty).
    pub bind_headers: Vec<String>,
    /// Key of those hashes, at least 32 characters; empty: random per process (default). Must be set, the same
    /// on every instance, with the Redis store.
    pub binding_key: String,
    /// Where a stream's URL lives: `GET` watches it, `DELETE` cancels it (default "/_gateway/streams").
    pub path_prefix: String,
    /// "memory" (one instance) or "redis" (shared by instances; default "memory").
    pub store: StoreKind,
    /// `redis://host:port[/db]` of the Redis or Valkey server for `store = "redis"`.
    pub redis_url: String,
    /// Prefix of every Redis key (default "sse-gateway:").
    pub redis_key_prefix: String,
    /// Events kept per stream in Redis (trimmed with `XTRIM MINID` beside the byte bound, at most a sixteenth or
    /// 100 past it; default 100000).
    pub redis_max_events: usize,
    /// Streams in their grace period (each keeps its upstream connection) over all clients; past it the one
    /// waiting longest is given up (default 256: a quarter of the default upstream connections).
    pub max_grace_streams: usize,
    /// Streams in their grace period per binding (the bound headers' values: one client); past it that
    /// client's longest waiting is given up (default 32).
    pub max_grace_streams_per_binding: usize,
    /// Watchers of one stream; one more is refused with 429 (default 16).
    pub max_watchers_per_stream: usize,
    /// Seconds a watcher's client may read nothing while the gateway has events for it before the watcher
    /// is closed (default 30).
    pub watcher_write_timeout_secs: f64,
    /// Seconds Redis may not answer before the streams being written are given up and remote readers end with
    /// an error; a shorter stall loses nothing (default 5).
    pub redis_stall_secs: f64,
    /// Readers of streams owned by another instance open at once here; past it 503 `resume_unavailable`
    /// (default 1024).
    pub max_remote_readers: usize,
    /// Redis connections that block in `XREAD` for all of this instance's remote readers (default 1).
    pub redis_follow_connections: usize,
    /// Milliseconds the Redis writer, woken by an event, waits for more to write them in one round trip: events
    /// reach other instances this much later (default 5, at most 100; 0 writes at once).
    pub redis_write_linger_ms: u64,
    /// Streams' starts queued for a session (a session socket) that does not take them; past it the oldest are
    /// dropped (default 64).
    pub session_queue: usize,
}

impl Default for Resume {
    fn default() -> Self {
        Self {
            enabled: true,
            retry_ms: 1000,
            grace_secs: 30.0,
            retention_secs: 300.0,
            buffer_bytes: 1 << 20,
            max_total_bytes: 256 << 20,
            bind_headers: vec!["authorization".into(), "cookie".into()],
            binding_key: String::new(),
            path_prefix: "/_gateway/streams".into(),
            store: StoreKind::Memory,
            redis_url: String::new(),
            redis_key_prefix: "sse-gateway:".into(),
            redis_max_events: 100_000,
            max_grace_streams: 256,
            max_grace_streams_per_binding: 32,
            max_watchers_per_stream: 16,
            watcher_write_timeout_secs: 30.0,
            redis_stall_secs: 5.0,
            max_remote_readers: 1024,
            redis_follow_connections: 1,
            redis_write_linger_ms: DEFAULT_REDIS_WRITE_LINGER_MS,
            session_queue: 64,
        }
    }
}

/// Where held streams live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    Memory,
    Redis,
}

/// Floor of `resume.buffer_bytes`: a translated frame can be this large.
pub const MIN_RESUME_BUFFER: usize = 64 << 10;
/// Ceiling of `resume.buffer_bytes` and `resume.max_total_bytes`.
pub const MAX_RESUME_BYTES: usize = 64 << 30;
/// Default of `resume.redis_write_linger_ms`.
pub const DEFAULT_REDIS_WRITE_LINGER_MS: u64 = 5;
/// Ceiling of `resume.redis_write_linger_ms`.
pub const MAX_REDIS_WRITE_LINGER_MS: u64 = 100;
/// Ceiling of `resume.session_queue`.
pub const MAX_SESSION_QUEUE: usize = 4096;

/// Ceiling of `resume.max_grace_streams` and `resume.max_watchers_per_stream`.
pub const MAX_RESUME_COUNT: usize = 1 << 20;
/// Ceiling of `resume.redis_follow_connections`: Redis connections blocking in `XREAD` per instance.
pub const MAX_FOLLOW_CONNECTIONS: usize = 16;
/// Shortest `resume.binding_key`.
pub const MIN_BINDING_KEY: usize = 32;

/// `value` of `key` within `lo..=hi`, each bound given with how the message names it.
fn between<T: PartialOrd + std::fmt::Display>(
    key: &'static str,
    value: T,
    lo: (T, &str),
    hi: (T, &str),
) -> Result<(), ConfigError> {
    if lo.0 <= value && value <= hi.0 {
        return Ok(());
    }
    Err(invalid(key, format!("{value} is not between {} and {}", lo.1, hi.1)))
}

impl Resume {
    fn validate(&self) -> Result<(), ConfigError> {
        secs("resume.grace_secs", self.grace_secs, true)?;
        secs("resume.retention_secs", self.retention_secs, true)?;
        between("resume.retry_ms", self.retry_ms, (1, "1"), (3_600_000, "3600000"))?;
        let (floor, ceiling) = (MIN_RESUME_BUFFER.to_string(), MAX_RESUME_BYTES.to_string());
        let ceiling = (MAX_RESUME_BYTES, ceiling.as_str());
        between(
            "resume.buffer_bytes",
            self.buffer_bytes,
            (MIN_RESUME_BUFFER, &floor),
            ceiling,
        )?;
        let buffer = (self.buffer_bytes, "resume.buffer_bytes");
        between("resume.max_total_bytes", self.max_total_bytes, buffer, ceiling)?;
        let count = MAX_RESUME_COUNT.to_string();
        let count = (MAX_RESUME_COUNT, count.as_str());
        between("resume.max_grace_streams", self.max_grace_streams, (1, "1"), count)?;
        let grace = (self.max_grace_streams, "resume.max_grace_streams");
        between(
            "resume.max_grace_streams_per_binding",
            self.max_grace_streams_per_binding,
            (1, "1"),
            grace,
        )?;
        let queue = MAX_SESSION_QUEUE.to_string();
        let queue = (MAX_SESSION_QUEUE, queue.as_str());
        between("resume.session_queue", self.session_queue, (1, "1"), queue)?;
        between(
            "resume.max_watchers_per_stream",
            self.max_watchers_per_stream,
            (1, "1"),
            count,
        )?;
        secs(
            "resume.watcher_write_timeout_secs",
            self.watcher_write_timeout_secs,
            false,
        )?;
        if self.bind_headers.is_empty() {
            return Err(invalid(
                "resume.bind_headers",
                "is empty: anyone who learns a stream's token could then read and cancel it; bind at least one \
                 header (e.g. \"authorization\") or cookie (\"cookie:<name>\")",
            ));
        }
        let bindable = |h: &str| match h.split_once(':') {
            Some((c, name)) => c.eq_ignore_ascii_case("cookie") && is_cookie_name(name),
            None => http::HeaderName::from_bytes(h.as_bytes()).is_ok(),
        };
        if let Some(h) = self.bind_headers.iter().find(|h| !bindable(h)) {
            return Err(invalid(
                "resume.bind_headers",
                format!("{h:?} is neither a header name nor cookie:<name>"),
            ));
        }
        if !self.binding_key.is_empty() && self.binding_key.len() < MIN_BINDING_KEY {
            return Err(invalid(
                "resume.binding_key",
                format!("is shorter than {MIN_BINDING_KEY} characters"),
            ));
        }
        let p = &self.path_prefix;
        let safe = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'_' | b'-' | b'.');
        if !p.starts_with('/') || p.len() < 2 || p.ends_with('/') || p.contains("//") || !p.bytes().all(safe) {
            return Err(invalid(
                "resume.path_prefix",
                format!("{p:?} is not a path like \"/_gateway/streams\" (letters, digits, / _ - .; no trailing /)"),
            ));
        }
        if self.store == StoreKind::Redis {
            if self.redis_url.is_empty() {
                return Err(invalid("resume.redis_url", "must be set with resume.store = \"redis\""));
            }
            if self.binding_key.is_empty() {
                return Err(invalid(
                    "resume.binding_key",
                    "must be set (the same on every instance) with resume.store = \"redis\"",
                ));
            }
            if self.redis_max_events == 0 {
                return Err(invalid("resume.redis_max_events", "must be greater than 0"));
            }
            secs("resume.redis_stall_secs", self.redis_stall_secs, false)?;
            if !(1.0..=3600.0).contains(&self.redis_stall_secs) {
                return Err(invalid(
                    "resume.redis_stall_secs",
                    format!("{} is not between 1 and 3600", self.redis_stall_secs),
                ));
            }
            if !(1..=1_000_000).contains(&self.max_remote_readers) {
                return Err(invalid(
                    "resume.max_remote_readers",
                    format!("{} is not between 1 and 1000000", self.max_remote_readers),
                ));
            }
            if !(1..=MAX_FOLLOW_CONNECTIONS).contains(&self.redis_follow_connections) {
                return Err(invalid(
                    "resume.redis_follow_connections",
                    format!(
                        "{} is not between 1 and {}",
                        self.redis_follow_connections, MAX_FOLLOW_CONNECTIONS
                    ),
                ));
            }
            if self.redis_write_linger_ms > MAX_REDIS_WRITE_LINGER_MS {
                return Err(invalid(
                    "resume.redis_write_linger_ms",
                    format!(
                        "{} is not between 0 and {MAX_REDIS_WRITE_LINGER_MS}",
                        self.redis_write_linger_ms
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The WebSocket output (docs/WEBSOCKET.md): sockets on held streams' URLs and the session socket on
/// `resume.path_prefix`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebSocket {
    /// Whether `<prefix>` and `<prefix>/<token>` accept WebSocket upgrades (default true; needs resume.enabled).
    pub enabled: bool,
    /// Origins (`scheme://host[:port]`, or `"*"`) that may open sockets besides those the backend allowed by name
    /// (default none; `[cors] allow_origins` counts too).
    pub allow_origins: Vec<String>,
    /// Sockets open at once (default 10000, at most 1000000).
    pub max_sockets: usize,
    /// Streams one session socket carries at once (default 32, at most 1024).
    pub max_streams_per_session: usize,
    /// Largest client message in bytes (default 4096, 64 to 1 MiB).
    pub max_message_bytes: usize,
    /// Seconds a socket bound to `Authorization` waits for its credential message (default 5, 0.1 to 60).
    pub auth_timeout_secs: f64,
    /// Seconds of silence before a ping (default 15, 1 to 3600).
    pub ping_interval_secs: f64,
    /// Seconds a ping waits for any frame back before the socket is closed (default 30, 1 to 3600).
    pub pong_timeout_secs: f64,
    /// Seconds one write may stay pending before the socket is closed as behind (default 30, 0.1 to 3600).
    pub write_timeout_secs: f64,
    /// Bytes of messages queued while a write is pending before the socket is closed as behind (default 1 MiB,
    /// 4 KiB to 64 MiB).
    pub max_queued_bytes: usize,
}

impl Default for WebSocket {
    fn default() -> Self {
        Self {
            enabled: true,
            allow_origins: Vec::new(),
            max_sockets: 10_000,
            max_streams_per_session: 32,
            max_message_bytes: 4096,
            auth_timeout_secs: 5.0,
            ping_interval_secs: 15.0,
            pong_timeout_secs: 30.0,
            write_timeout_secs: 30.0,
            max_queued_bytes: 1 << 20,
        }
    }
}

impl WebSocket {
    fn validate(&self) -> Result<(), ConfigError> {
        for o in &self.allow_origins {
            let ok = o == "*"
                || ((o.starts_with("http://") || o.starts_with("https://"))
                    && !o.ends_with('/')
                    && o.split_once("://")
                        .is_some_and(|(_, host)| !host.is_empty() && !host.contains('/')));
            if !ok {
                return Err(invalid(
                    "websocket.allow_origins",
                    format!("{o:?} is not an origin like \"https://app.example.com\" or \"*\""),
                ));
            }
        }
        let sizes: [(&'static str, usize, usize, usize); 4] = [
            ("websocket.max_sockets", self.max_sockets, 1, 1_000_000),
            (
                "websocket.max_streams_per_session",
                self.max_streams_per_session,
                1,
                1024,
            ),
            ("websocket.max_message_bytes", self.max_message_bytes, 64, 1 << 20),
            ("websocket.max_queued_bytes", self.max_queued_bytes, 4096, 64 << 20),
        ];
        for (key, v, lo, hi) in sizes {
            if !(lo..=hi).contains(&v) {
                return Err(invalid(key, format!("{v} is outside {lo}..={hi}")));
            }
        }
        let secs: [(&'static str, f64, f64, f64); 4] = [
            ("websocket.auth_timeout_secs", self.auth_timeout_secs, 0.1, 60.0),
            ("websocket.ping_interval_secs", self.ping_interval_secs, 1.0, 3600.0),
            ("websocket.pong_timeout_secs", self.pong_timeout_secs, 1.0, 3600.0),
            ("websocket.write_timeout_secs", self.write_timeout_secs, 0.1, 3600.0),
        ];
        for (key, v, lo, hi) in secs {
            if !(v.is_finite() && (lo..=hi).contains(&v)) {
                return Err(invalid(key, format!("{v} is outside {lo}..={hi} seconds")));
            }
        }
        Ok(())
    }
}

/// An explicit CORS policy for the responses the gateway writes itself (DESIGN 5.1, docs/RESUME.md). Unset (no
/// origins), the backend's own answers are the policy; set, it applies to every response the gateway writes
/// itself, whatever the backend said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Cors {
    /// Origins (`scheme://host[:port]`) allowed, or `["*"]` (not with credentials); empty: the backend decides
    /// (default).
    pub allow_origins: Vec<String>,
    /// Whether those origins may send credentials (cookies) (default false).
    pub allow_credentials: bool,
    /// Methods a preflight may ask for on the gateway's own paths (default GET, POST, DELETE).
    pub allow_methods: Vec<String>,
    /// Request headers a preflight may ask for (default content-type, authorization, last-event-id).
    pub allow_headers: Vec<String>,
    /// Response headers exposed to the page besides `X-Gateway-Stream` (default none).
    pub expose_headers: Vec<String>,
    /// `Access-Control-Max-Age` of the gateway's preflight answers, in seconds (default 600, at most 86400).
    pub max_age_secs: u64,
}

impl Default for Cors {
    fn default() -> Self {
        Self {
            allow_origins: Vec::new(),
            allow_credentials: false,
            allow_methods: vec!["GET".into(), "POST".into(), "DELETE".into()],
            allow_headers: vec!["content-type".into(), "authorization".into(), "last-event-id".into()],
            expose_headers: Vec::new(),
            max_age_secs: 600,
        }
    }
}

impl Cors {
    fn validate(&self) -> Result<(), ConfigError> {
        for o in &self.allow_origins {
            if o == "*" {
                if self.allow_credentials {
                    return Err(invalid(
                        "cors.allow_origins",
                        "\"*\" cannot be used with cors.allow_credentials = true (browsers refuse it); list the origins",
                    ));
                }
                continue;
            }
            let ok = (o.starts_with("http://") || o.starts_with("https://"))
                && !o.ends_with('/')
                && o.split_once("://")
                    .is_some_and(|(_, host)| !host.is_empty() && !host.contains('/'))
                && http::HeaderValue::from_str(o).is_ok();
            if !ok {
                return Err(invalid(
                    "cors.allow_origins",
                    format!("{o:?} is not an origin like \"https://app.example.com\" (scheme, host, optional port)"),
                ));
            }
        }
        if let Some(m) = self
            .allow_methods
            .iter()
            .find(|m| http::Method::from_bytes(m.as_bytes()).is_err())
        {
            return Err(invalid("cors.allow_methods", format!("{m:?} is not a method")));
        }
        for (key, list) in [
            ("cors.allow_headers", &self.allow_headers),
            ("cors.expose_headers", &self.expose_headers),
        ] {
            if let Some(h) = list
                .iter()
                .find(|h| http::HeaderName::from_bytes(h.as_bytes()).is_err())
            {
                return Err(invalid(key, format!("{h:?} is not a header name")));
            }
        }
        if self.max_age_secs > 86_400 {
            return Err(invalid(
                "cors.max_age_secs",
                format!("{} is over 86400", self.max_age_secs),
            ));
        }
        Ok(())
    }
}

/// Whether `name` is a cookie name (RFC 6265: an HTTP token).
pub fn is_cookie_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

/// The stream inspector (DESIGN 6.2): `/debug/streams…` on the admin listener. Off by default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Debug {
    /// Serve the inspector and keep what it shows (default false: nothing served, nothing kept).
    pub streams: bool,
    /// Bearer token for `/debug/` (at least 32 characters; empty: none, allowed only on a loopback admin
    /// listener; default empty).
    pub token: String,
    /// Records carry the events' and envelopes' content (default false: counts and timings only).
    pub capture_content: bool,
    /// Seconds a finished stream stays listed (default 300, at most 86400).
    pub keep_finished_secs: f64,
    /// Finished streams listed at most; the oldest go first (default 100, at most 10000).
    pub keep_finished: usize,
    /// Bytes of records kept per stream past its newest 1,024 (default 1 MiB, 64 KiB to 64 MiB).
    pub ring_bytes: usize,
    /// Live feeds (`/debug/streams/{id}` pages and `/events`) open at once; one more is answered 429
    /// (default 4, 1 to 64).
    pub max_inspectors: usize,
}

impl Default for Debug {
    fn default() -> Self {
        Self {
            streams: false,
            token: String::new(),
            capture_content: false,
            keep_finished_secs: 300.0,
            keep_finished: 100,
            ring_bytes: 1 << 20,
            max_inspectors: 4,
        }
    }
}

/// Shortest `debug.token`.
pub const MIN_DEBUG_TOKEN: usize = 32;

impl Debug {
    /// `admin` is the admin listener's address: off loopback the token is required.
    fn validate(&self, admin: SocketAddr) -> Result<(), ConfigError> {
        if !self.token.is_empty() && self.token.chars().count() < MIN_DEBUG_TOKEN {
            return Err(invalid(
                "debug.token",
                format!("is shorter than {MIN_DEBUG_TOKEN} characters"),
            ));
        }
        if self.token.bytes().any(|b| !(0x21..=0x7e).contains(&b)) {
            // It travels in a header and a cookie: printable ASCII without spaces.
            return Err(invalid("debug.token", "must be printable ASCII without spaces"));
        }
        if self.streams && self.token.is_empty() && !admin.ip().is_loopback() {
            return Err(invalid(
                "debug.token",
                format!("is required: debug.streams is on and the admin listener {admin} is not loopback"),
            ));
        }
        secs("debug.keep_finished_secs", self.keep_finished_secs, true)?;
        between(
            "debug.keep_finished_secs",
            self.keep_finished_secs,
            (0.0, "0"),
            (86_400.0, "86400"),
        )?;
        between("debug.keep_finished", self.keep_finished, (0, "0"), (10_000, "10000"))?;
        between(
            "debug.ring_bytes",
            self.ring_bytes,
            (64 << 10, "65536"),
            (64 << 20, "67108864"),
        )?;
        between("debug.max_inspectors", self.max_inspectors, (1, "1"), (64, "64"))?;
        Ok(())
    }
}

/// OpenTelemetry traces. Off unless an endpoint is given here or by `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Telemetry {
    /// The OTLP/HTTP traces URL, used as is (`http://127.0.0.1:4318/v1/traces`); default none (no traces).
    pub otlp_endpoint: String,
    /// What an incoming W3C `traceparent` does: `continue` (default: the request's span is its child) or `link`
    /// (a new root that links to it: a gateway facing the public does not let clients pick its trace ids).
    pub incoming_trace: IncomingTrace,
    /// `gen_ai.provider.name` of every run; default: told by the dialect (docs/OBSERVABILITY.md).
    pub provider_name: Option<String>,
}

/// See [`Telemetry::incoming_trace`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncomingTrace {
    #[default]
    Continue,
    Link,
}

/// Log output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Log {
    /// "text" or "json" (default "text").
    pub format: LogFormat,
    /// A tracing filter such as "info" or "sse_gateway=debug" (default "info"); RUST_LOG wins when set.
    pub level: String,
}

impl Default for Log {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Values given on the command line; they override every other layer.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub config_file: Option<PathBuf>,
    pub upstream: Option<String>,
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
}

/// Why the configuration was rejected; `Display` is the one line printed before exit 2.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: String, message: String },
    #[error("{0}")]
    Load(String),
    #[error("{key}: {problem}")]
    Invalid { key: &'static str, problem: String },
}

fn invalid(key: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        problem: problem.into(),
    }
}

/// The upstream target, parsed once.
#[derive(Debug, Clone)]
pub struct UpstreamTarget {
    pub scheme: Scheme,
    pub authority: Authority,
    /// Path prefix without a trailing slash ("" for none).
    pub prefix: String,
}

impl UpstreamTarget {
    /// Parses `http://host:port[/prefix]`; only plain HTTP is spoken to the upstream.
    pub fn parse(url: &str) -> Result<Self, String> {
        let uri: Uri = url.parse().map_err(|e| format!("not a URL ({e})"))?;
        let scheme = uri.scheme().cloned().ok_or("needs a scheme, e.g. http://host:port")?;
        if scheme != Scheme::HTTP {
            return Err(format!(
                "scheme {scheme} is not supported (plain http only; terminate TLS in front)"
            ));
        }
        let authority = uri.authority().cloned().ok_or("needs a host")?;
        if authority.host().is_empty() {
            return Err("needs a host".into());
        }
        // userinfo would go out in Host and be printed wherever the URL is; secrets belong elsewhere.
        if authority.as_str().contains('@') {
            return Err(
                "must not contain credentials (user:password@): the upstream gets no authentication from the \
                        gateway, and the URL is logged"
                    .into(),
            );
        }
        if uri.query().is_some() {
            return Err("must not have a query".into());
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        // Client paths are confined under the prefix (`proxy::upstream::pool::upstream_path`); a prefix that climbs
        // itself would make "under" meaningless.
        if prefix.split('/').any(|s| dot_segment(s).is_some()) {
            return Err("the path prefix must not contain . or .. segments".into());
        }
        Ok(Self {
            scheme,
            authority,
            prefix,
        })
    }

    /// Whether connecting here could reach `listener` (same port, and the same host or both local). Names other
    /// than `localhost` are not resolved: validation does no DNS.
    pub fn points_at(&self, listener: SocketAddr) -> bool {
        let port = self.authority.port_u16().unwrap_or(80);
        let host = self.authority.host().trim_start_matches('[').trim_end_matches(']');
        let ip = if host.eq_ignore_ascii_case("localhost") {
            IpAddr::from(std::net::Ipv4Addr::LOCALHOST)
        } else {
            match host.parse::<IpAddr>() {
                Ok(ip) => ip,
                Err(_) => return false,
            }
        };
        reaches(SocketAddr::new(ip, port), listener)
    }
}

/// Whether a connection to `to` reaches `listener`: the same non-zero port, and the same address or both local
/// (loopback, or unspecified: a wildcard listener answers on loopback, and connecting to 0.0.0.0 reaches this
/// host). A wildcard listener also answers on this host's other addresses, which are not known here: an upstream
/// on another host with the same port is common, so only local addresses count.
fn reaches(to: SocketAddr, listener: SocketAddr) -> bool {
    let local = |ip: IpAddr| ip.is_loopback() || ip.is_unspecified();
    listener.port() != 0
        && listener.port() == to.port()
        && (listener.ip() == to.ip() || (local(listener.ip()) && local(to.ip())))
}

/// Whether two listeners would claim the same socket: the same non-zero port, and the same address or either a
/// wildcard.
fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

impl Settings {
    /// Loads every layer and validates the result.
    pub fn load(overrides: &Overrides) -> Result<Settings, ConfigError> {
        Self::load_with_env(overrides, std::env::vars())
    }

    /// As `load`, with the environment given (tests).
    pub fn load_with_env(
        overrides: &Overrides,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder();
        if Path::new(DEFAULT_FILE).is_file() {
            builder = builder.add_source(config::File::new(DEFAULT_FILE, config::FileFormat::Toml));
        }
        if let Some(path) = &overrides.config_file {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            builder = builder.add_source(config::File::from_str(&text, config::FileFormat::Toml));
        }
        let env_map: config::Map<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(&format!("{ENV_PREFIX}__")))
            .collect();
        builder = builder.add_source(
            config::Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("resume.bind_headers")
                .with_list_parse_key("cors.allow_origins")
                .with_list_parse_key("cors.allow_methods")
                .with_list_parse_key("cors.allow_headers")
                .with_list_parse_key("cors.expose_headers")
                .source(Some(env_map)),
        );
        let set = |b: config::ConfigBuilder<_>, key: &str, v: &Option<String>| match v {
            Some(v) => b.set_override(key, v.as_str()),
            None => Ok(b),
        };
        let err = |e: config::ConfigError| ConfigError::Load(one_line(&e.to_string()));
        builder = set(builder, "upstream.url", &overrides.upstream).map_err(err)?;
        builder = set(builder, "server.listen", &overrides.listen).map_err(err)?;
        builder = set(builder, "server.admin_listen", &overrides.admin_listen).map_err(err)?;
        let cfg = builder.build().map_err(err)?;
        // Which keys some layer set, as opposed to the built-in defaults (which are serde's, not config's).
        let given = |key: &str| cfg.get::<config::Value>(key).is_ok();
        let (url_given, listen_given) = (given("upstream.url"), given("server.listen"));
        // Through a plain value so that serde_path_to_error can name the key (`translate.dialect`), which
        // config's own messages leave out for unknown keys and bad enum values.
        let value: serde_json::Value = cfg.try_deserialize().map_err(err)?;
        let mut settings: Settings = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let inner = one_line(&e.into_inner().to_string());
            if path.is_empty() || path == "." {
                ConfigError::Load(inner)
            } else {
                ConfigError::Load(format!("{path}: {inner}"))
            }
        })?;
        if url_given && settings.upstream.url.is_empty() {
            // Only an absent upstream means the demo; an empty one is a blank variable or a typo.
            return Err(invalid(
                "upstream.url",
                "is set but empty (leave it unset for the built-in demo backend)",
            ));
        }
        settings.server.listen_given = listen_given;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks every value a type cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let (s, u) = (&self.server, &self.upstream);
        let listen = parse_addr("server.listen", &s.listen)?;
        let admin = parse_addr("server.admin_listen", &s.admin_listen)?;
        if overlaps(listen, admin) {
            return Err(invalid(
                "server.admin_listen",
                format!("{admin} is the public listener server.listen ({listen}); the admin port must be its own"),
            ));
        }
        // (key, seconds, whether 0 is allowed)
        for (key, v, zero_ok) in [
            ("server.header_read_timeout_secs", s.header_read_timeout_secs, false),
            ("server.body_read_timeout_secs", s.body_read_timeout_secs, false),
            ("server.idle_timeout_secs", s.idle_timeout_secs, false),
            ("server.drain_timeout_secs", s.drain_timeout_secs, true),
            ("upstream.connect_timeout_secs", u.connect_timeout_secs, false),
            ("upstream.response_timeout_secs", u.response_timeout_secs, false),
            ("upstream.pool_idle_timeout_secs", u.pool_idle_timeout_secs, true),
            ("upstream.idle_timeout_secs", u.idle_timeout_secs, true),
        ] {
            secs(key, v, zero_ok)?;
        }
        if !(MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&s.max_header_bytes) {
            return Err(invalid(
                "server.max_header_bytes",
                format!("must be between {MIN_HEADER_BYTES} and {MAX_HEADER_BYTES}"),
            ));
        }
        if s.workers > MAX_WORKERS {
            return Err(invalid(
                "server.workers",
                format!("{} is over {MAX_WORKERS}", s.workers),
            ));
        }
        if !u.url.is_empty() {
            let target = UpstreamTarget::parse(&u.url).map_err(|p| invalid("upstream.url", p))?;
            // Every request would come back to us, and each of those too, until the fds run out.
            for (key, addr) in [("server.listen", listen), ("server.admin_listen", admin)] {
                if target.points_at(addr) {
                    return Err(invalid(
                        "upstream.url",
                        format!("points at the gateway's own listener {key} ({addr})"),
                    ));
                }
            }
        }
        if !(1..=MAX_UPSTREAM_CONNECTIONS).contains(&u.max_connections) {
            return Err(invalid(
                "upstream.max_connections",
                format!("must be between 1 and {MAX_UPSTREAM_CONNECTIONS}"),
            ));
        }
        let t = &self.translate;
        let o = &t.options;
        if !(translate::MIN_BUDGET..=MAX_BUDGET).contains(&o.budget) {
            return Err(invalid(
                "translate.budget",
                format!("{} is not between {} and {MAX_BUDGET}", o.budget, translate::MIN_BUDGET),
            ));
        }
        for (key, v, max) in [
            ("translate.max_item_bytes", o.max_item_bytes, MAX_ITEM_BYTES_CEILING),
            (
                "translate.max_text_event_bytes",
                o.max_text_event_bytes,
                MAX_HELD_BYTES_CEILING,
            ),
            ("translate.json_sniff_bytes", o.json_sniff_bytes, MAX_HELD_BYTES_CEILING),
        ] {
            if !(1..=max).contains(&v) {
                return Err(invalid(key, format!("{v} is not between 1 and {max}")));
            }
        }
        if t.agent_body_max_bytes > MAX_AGENT_BODY_BYTES {
            return Err(invalid(
                "translate.agent_body_max_bytes",
                format!("{} is above the ceiling {MAX_AGENT_BODY_BYTES}", t.agent_body_max_bytes),
            ));
        }
        secs("translate.keepalive_interval_secs", t.keepalive_interval_secs, true)?;
        if t.keepalive_interval_secs > 0.0 && t.keepalive_interval_secs < MIN_KEEPALIVE_SECS {
            return Err(invalid(
                "translate.keepalive_interval_secs",
                format!(
                    "{} is below the floor {MIN_KEEPALIVE_SECS} (0 turns keepalives off)",
                    t.keepalive_interval_secs
                ),
            ));
        }
        if http::HeaderName::from_bytes(t.agent_header.as_bytes()).is_err() {
            return Err(invalid(
                "translate.agent_header",
                format!("{:?} is not a header name", t.agent_header),
            ));
        }
        self.resume.validate()?;
        self.cors.validate()?;
        self.websocket.validate()?;
        self.debug.validate(admin)?;
        validate_frontends(&self.frontends, &self.resume.path_prefix)?;
        if let Some(p) = &self.telemetry.provider_name {
            let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
            if p.is_empty() || p.len() > 64 || !p.bytes().all(ok) {
                return Err(invalid(
                    "telemetry.provider_name",
                    "must be 1 to 64 letters, digits, '.', '_' or '-' (e.g. \"anthropic\")",
                ));
            }
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log.level).is_err() {
            return Err(invalid(
                "log.level",
                format!("{:?} is not a tracing filter", self.log.level),
            ));
        }
        Ok(())
    }

    pub fn listen_addr(&self) -> SocketAddr {
        parse_addr("", &self.server.listen).unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 8080)))
    }

    pub fn admin_addr(&self) -> SocketAddr {
        parse_addr("", &self.server.admin_listen).unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 9090)))
    }

    /// The translator options these settings describe.
    pub fn translate_options(&self) -> translate::Options {
        translate::Options {
            require_done: self.translate.require_done,
            ..self.translate.options.clone()
        }
    }

    /// The effective configuration as TOML (for `--check-config`), the upstream URL without userinfo.
    pub fn to_toml(&self) -> String {
        let mut shown = self.clone();
        shown.upstream.url = redact_userinfo(&self.upstream.url);
        shown.resume.redis_url = redact_userinfo(&self.resume.redis_url);
        if !shown.resume.binding_key.is_empty() {
            shown.resume.binding_key = "<redacted>".into();
        }
        if !shown.debug.token.is_empty() {
            shown.debug.token = "<redacted>".into();
        }
        toml::to_string(&shown).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// The public listener of a gateway in front of the demo backend: as configured when a layer set it, else
    /// the default's port on loopback, so that `cargo run` on a laptop does not serve canned agent output to
    /// the network.
    pub fn demo_listen(&self) -> String {
        if self.server.listen_given {
            return self.server.listen.clone();
        }
        let port = parse_addr("", &self.server.listen).map_or(8080, |a| a.port());
        SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port)).to_string()
    }
}

/// `url` with any userinfo (`user:password@`) replaced by `***@`, for printing. Validation refuses userinfo; this
/// guards every place a URL is shown against a value that did not pass through it.
pub fn redact_userinfo(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..].find(['/', '?', '#']).map_or(url.len(), |i| start + i);
    match url[start..end].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]),
        None => url.to_owned(),
    }
}

/// Converts validated seconds to a `Duration`.
pub fn duration(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs).unwrap_or(Duration::ZERO)
}

fn parse_addr(key: &'static str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse()
        .map_err(|_| invalid(key, format!("{v:?} is not an address like 127.0.0.1:8080")))
}

fn secs(key: &'static str, v: f64, zero_ok: bool) -> Result<(), ConfigError> {
    if !v.is_finite() || !(0.0..=MAX_SECS).contains(&v) {
        return Err(invalid(
            key,
            format!("{v} is not a number of seconds between 0 and {MAX_SECS}"),
        ));
    }
    if !zero_ok && v == 0.0 {
        return Err(invalid(key, "must be greater than 0"));
    }
    Ok(())
}

/// The `config` crate's messages can span lines; the exit message is one.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `Some(1)` for a `.` segment, `Some(2)` for `..`, each dot written as `.`, `%2e` or `%2E`; `None` otherwise.
pub fn dot_segment(seg: &str) -> Option<u8> {
    let mut rest = seg.as_bytes();
    let mut dots = 0u8;
    while !rest.is_empty() {
        if rest[0] == b'.' {
            rest = &rest[1..];
        } else if rest.len() >= 3 && rest[0] == b'%' && rest[1] == b'2' && rest[2].eq_ignore_ascii_case(&b'e') {
            rest = &rest[3..];
        } else {
            return None;
        }
        dots += 1;
        if dots > 2 {
            return None;
        }
    }
    (dots > 0).then_some(dots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)], o: Overrides) -> Result<Settings, ConfigError> {
        Settings::load_with_env(&o, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn defaults_validate() {
        let s = load(&[], Overrides::default()).unwrap();
        assert_eq!(s.translate.options.budget, 2048);
        assert_eq!(s.server.listen, "0.0.0.0:8080");
    }

    #[test]
    fn the_daemon_runs_the_translators_defaults_but_requires_done() {
        let o = Settings::default().translate_options();
        assert_eq!(
            o,
            translate::Options {
                require_done: true,
                ..translate::Options::default()
            }
        );
    }

    #[test]
    fn env_overrides_nested_keys() {
        let s = load(
            &[
                ("SSE_GATEWAY__TRANSLATE__BUDGET", "4096"),
                ("SSE_GATEWAY__TRANSLATE__SHADOW", "true"),
                ("SSE_GATEWAY__UPSTREAM__URL", "http://127.0.0.1:9/x/"),
            ],
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.translate.options.budget, 4096);
        assert!(s.translate.shadow);
        assert_eq!(UpstreamTarget::parse(&s.upstream.url).unwrap().prefix, "/x");
    }

    #[test]
    fn flags_beat_env() {
        let s = load(
            &[("SSE_GATEWAY__SERVER__LISTEN", "127.0.0.1:1")],
            Overrides {
                listen: Some("127.0.0.1:2".into()),
                ..Overrides::default()
            },
        )
        .unwrap();
        assert_eq!(s.server.listen, "127.0.0.1:2");
    }

    #[test]
    fn errors_name_the_key() {
        let e = load(&[("SSE_GATEWAY__TRANSLATE__BUDGET", "12")], Overrides::default()).unwrap_err();
        assert!(e.to_string().starts_with("translate.budget:"), "{e}");
        let e = load(&[("SSE_GATEWAY__TRANSLATE__BUDGETT", "3000")], Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("budgett"), "{e}");
        let e = load(&[("SSE_GATEWAY__TRANSLATE__BUDGET", "lots")], Overrides::default()).unwrap_err();
        assert!(e.to_string().contains("budget"), "{e}");
        let e = load(&[("SSE_GATEWAY__UPSTREAM__URL", "https://x")], Overrides::default()).unwrap_err();
        assert!(e.to_string().starts_with("upstream.url:"), "{e}");
    }

    #[test]
    fn every_dialect_name_loads_and_a_bad_one_names_the_key() {
        for d in translate::Dialect::ALL {
            let s = load(&[("SSE_GATEWAY__TRANSLATE__DIALECT", d.as_str())], Overrides::default()).unwrap();
            assert_eq!(s.translate_options().dialect, d);
        }
        let e = load(
            &[("SSE_GATEWAY__TRANSLATE__DIALECT", "agent-sdk")],
            Overrides::default(),
        )
        .unwrap_err();
        let e = e.to_string();
        assert!(e.starts_with("translate.dialect:") && e.contains("agent_sdk"), "{e}");
    }

    #[test]
    fn unbound_streams_and_bad_cors_policies_are_refused_naming_the_key() {
        for (env, key) in [
            (("SSE_GATEWAY__RESUME__BIND_HEADERS", ""), "resume.bind_headers:"),
            (("SSE_GATEWAY__RESUME__BIND_HEADERS", "cookie:"), "resume.bind_headers:"),
            (
                ("SSE_GATEWAY__RESUME__BIND_HEADERS", "cookie:a b"),
                "resume.bind_headers:",
            ),
            (
                ("SSE_GATEWAY__CORS__ALLOW_ORIGINS", "app.example.com"),
                "cors.allow_origins:",
            ),
            (
                ("SSE_GATEWAY__CORS__ALLOW_ORIGINS", "https://app.example.com/"),
                "cors.allow_origins:",
            ),
            (("SSE_GATEWAY__CORS__MAX_AGE_SECS", "100000"), "cors.max_age_secs:"),
        ] {
            let e = load(&[env], Overrides::default()).unwrap_err();
            assert!(e.to_string().starts_with(key), "{env:?}: {e}");
        }
        let wildcard = load(
            &[
                ("SSE_GATEWAY__CORS__ALLOW_ORIGINS", "*"),
                ("SSE_GATEWAY__CORS__ALLOW_CREDENTIALS", "true"),
            ],
            Overrides::default(),
        )
        .unwrap_err();
        assert!(wildcard.to_string().starts_with("cors.allow_origins:"), "{wildcard}");
        let ok = load(
            &[
                ("SSE_GATEWAY__RESUME__BIND_HEADERS", "authorization,cookie:session_id"),
                (
                    "SSE_GATEWAY__CORS__ALLOW_ORIGINS",
                    "https://a.example,http://127.0.0.1:5173",
                ),
            ],
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(ok.resume.bind_headers, ["authorization", "cookie:session_id"]);
        assert_eq!(ok.cors.allow_origins.len(), 2);
    }

    #[test]
    fn the_redis_store_bounds_are_checked_and_named() {
        let redis = [
            ("SSE_GATEWAY__RESUME__STORE", "redis"),
            ("SSE_GATEWAY__RESUME__REDIS_URL", "redis://127.0.0.1:6379"),
            ("SSE_GATEWAY__RESUME__BINDING_KEY", "0123456789abcdef0123456789abcdef"),
        ];
        assert!(load(&redis, Overrides::default()).is_ok());
        for (key, value, named) in [
            (
                "SSE_GATEWAY__RESUME__REDIS_STALL_SECS",
                "0.5",
                "resume.redis_stall_secs:",
            ),
            (
                "SSE_GATEWAY__RESUME__MAX_REMOTE_READERS",
                "0",
                "resume.max_remote_readers:",
            ),
            (
                "SSE_GATEWAY__RESUME__REDIS_FOLLOW_CONNECTIONS",
                "17",
                "resume.redis_follow_connections:",
            ),
            (
                "SSE_GATEWAY__RESUME__REDIS_WRITE_LINGER_MS",
                "101",
                "resume.redis_write_linger_ms:",
            ),
        ] {
            let env: Vec<(&str, &str)> = redis.iter().copied().chain([(key, value)]).collect();
            let e = load(&env, Overrides::default()).unwrap_err();
            assert!(e.to_string().starts_with(named), "{e}");
        }
    }

    #[test]
    fn an_empty_upstream_is_refused_and_only_an_absent_one_means_the_demo() {
        for (env, flag) in [
            (vec![("SSE_GATEWAY__UPSTREAM__URL", "")], None),
            (vec![], Some(String::new())),
        ] {
            let o = Overrides {
                upstream: flag,
                ..Overrides::default()
            };
            let e = load(&env, o).unwrap_err();
            assert!(e.to_string().starts_with("upstream.url:"), "{e}");
        }
        assert_eq!(load(&[], Overrides::default()).unwrap().upstream.url, "");
    }

    #[test]
    fn credentials_in_the_upstream_url_are_refused_without_echoing_them() {
        for url in ["http://user:s3cret@127.0.0.1:9", "http://s3cret@127.0.0.1:9/api"] {
            let e = load(&[("SSE_GATEWAY__UPSTREAM__URL", url)], Overrides::default()).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with("upstream.url:") && !msg.contains("s3cret"), "{msg}");
        }
        assert_eq!(redact_userinfo("http://u:p@h:1/x@y"), "http://***@h:1/x@y");
        assert_eq!(redact_userinfo("u:p@h:1"), "***@h:1");
        assert_eq!(redact_userinfo("http://h:1/a"), "http://h:1/a");
        assert!(UpstreamTarget::parse("http://h:1/api/%2e%2E/x").is_err());
    }

    #[test]
    fn an_upstream_reaches_a_listener_only_on_the_same_port_and_a_local_or_equal_address() {
        let t = |url: &str| UpstreamTarget::parse(url).unwrap();
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(t("http://127.0.0.1:8080").points_at(any));
        assert!(t("http://LOCALHOST:8080/api").points_at(any));
        assert!(t("http://[::1]:8080").points_at(any));
        assert!(t("http://0.0.0.0:8080").points_at("127.0.0.1:8080".parse().unwrap()));
        assert!(t("http://10.0.0.5:8080").points_at("10.0.0.5:8080".parse().unwrap()));
        assert!(
            t("http://127.0.0.1").points_at("[::]:80".parse().unwrap()),
            "port 80 by default"
        );
        assert!(
            !t("http://10.0.0.5:8080").points_at(any),
            "another host on the same port"
        );
        assert!(!t("http://127.0.0.1:8081").points_at(any));
        assert!(!t("http://127.0.0.1:8080").points_at("10.0.0.5:8080".parse().unwrap()));
        assert!(
            !t("http://127.0.0.1:0").points_at("127.0.0.1:0".parse().unwrap()),
            "ephemeral"
        );
        assert!(!t("http://backend:8080").points_at(any), "names are not resolved");
    }

    #[test]
    fn a_keepalive_below_a_second_is_refused_and_zero_is_off() {
        let ka = |v: &str| {
            load(
                &[("SSE_GATEWAY__TRANSLATE__KEEPALIVE_INTERVAL_SECS", v)],
                Overrides::default(),
            )
        };
        assert!(ka("0.5")
            .unwrap_err()
            .to_string()
            .starts_with("translate.keepalive_interval_secs:"));
        assert_eq!(ka("0").unwrap().translate.keepalive_interval_secs, 0.0);
        assert_eq!(ka("1").unwrap().translate.keepalive_interval_secs, 1.0);
    }

    #[test]
    fn workers_are_one_per_core_by_default_and_bounded() {
        let w = |v: &str| load(&[("SSE_GATEWAY__SERVER__WORKERS", v)], Overrides::default());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(load(&[], Overrides::default()).unwrap().server.worker_threads(), cores);
        assert_eq!(w("3").unwrap().server.worker_threads(), 3);
        assert!(w("1025").unwrap_err().to_string().starts_with("server.workers:"));
    }

    #[test]
    fn the_demo_binds_loopback_unless_listen_was_given() {
        let s = load(&[], Overrides::default()).unwrap();
        assert_eq!(s.demo_listen(), "127.0.0.1:8080");
        let s = load(&[("SSE_GATEWAY__SERVER__LISTEN", "0.0.0.0:8080")], Overrides::default()).unwrap();
        assert_eq!(s.demo_listen(), "0.0.0.0:8080");
        let o = Overrides {
            listen: Some("127.0.0.2:7".into()),
            ..Overrides::default()
        };
        assert_eq!(load(&[], o).unwrap().demo_listen(), "127.0.0.2:7");
    }
}
