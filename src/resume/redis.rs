//! The Redis/Valkey store of resumable streams: the owning instance mirrors each event to a Stream entry
//! `0-<seq>` through one batching writer task; any instance replays (`XRANGE`) and follows (a few follower
//! tasks per instance, each one blocking `XREAD` over every waiting reader's stream).
//!
//! Keys of one stream share the hash tag `{<token>}`, so a cluster keeps them on one slot:
//!
//! ```text
//! <prefix>{<token>}:events   Stream, one entry per event: id 0-<seq>, field "e" = the event's bytes
//! <prefix>{<token>}:meta     hash: binding (hex), agent, state live|finished|lost, last_seq, end
//! <prefix>{<token>}:owner    the owner's liveness: PX 3 x heartbeat, refreshed every heartbeat
//! <prefix>{<token>}:primary  the cursor of a primary reader on another instance: SET PX 3 x heartbeat
//! <prefix>{<token>}:cancel   a cancel asked by any instance: SET PX ttl
//! <prefix>bind:<binding>     sorted set of the binding's streams (token hex, scored by creation time in ms):
//!                            the newest BINDING_INDEX_MAX, expiring with the streams' ttl (session listings)
//! ```
//!
//! With the stream's create, the owner also publishes `<instance>:<token>` on the channel
//! `<prefix>started:<binding>` (`<binding>`: the binding's 64 hex digits), for the sessions of every instance
//! (`announce`).
//!
//! Order is what makes reading safe without transactions. The writer sends one pipeline at a time on one
//! connection, so Redis applies a stream's commands in the order they were queued: its events before its
//! `state finished`, and `state finished` before the owner key is deleted. A reader asks for the owner key
//! first, then the meta hash, then the events, in one pipeline: `finished` seen means every event is there
//! (or was dropped to keep a bound: the reader then gets a gap, never a silent end), and an owner key gone
//! while the state is still `live`, and still gone a heartbeat later on the reader's clock (a stall also lets
//! it expire; the owner sets it again as soon as Redis answers), means the owner died. A
//! pipeline whose round trip failed is sent again as it was (a repeated `XADD` of an id already there is a
//! no-op), so retrying keeps that order.
//!
//! Bounds: the owner knows each stored event's seq and size; it trims a stream with `XTRIM MINID` to
//! `buffer_bytes` (plus the newest frame), and everything this instance has in Redis (live streams, and
//! finished ones until their keys expire) to `max_total_bytes`: the oldest finished streams' events go first,
//! then live streams are trimmed down to [`LIVE_FLOOR_BYTES`].
//!
//! A stream whose own command Redis refuses (out of memory under `noeviction`, a key of another type), whose
//! queue overflows, or whose meta hash vanished (a flush, a failover to an empty replica) is not resumable for
//! good: nothing more of it is written (so no hole can appear in the middle of what is stored), its state
//! becomes `lost` where Redis still takes it, and its owner key is deleted. Readers get every stored event,
//! then [`ReadError::Lost`]. Out of memory, the stream holding the most is given up (its events deleted) and
//! the others' refused commands are sent again, so one long run cannot take every stream down with it.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Pipeline, RedisError, Value};
use thiserror::Error;

use crate::cors::Grant;
use tokio::sync::{mpsc, oneshot, Notify};

/// Frames taken into one writer round trip at most.
pub const MAX_BATCH_FRAMES: usize = 1024;
/// Event bytes taken into one writer round trip at most (a batch closes once it has reached this).
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// Events returned by one [`RemoteReader::next`] at most (one `XRANGE` `COUNT`).
pub const READ_COUNT: usize = 256;
/// The longest block of a follower's `XREAD`: a reader that starts waiting while one is blocked is in the next,
/// so its first live event may wait this long (later ones wake it at once).
pub const FOLLOW_BLOCK: Duration = Duration::from_millis(250);
/// Liveness keys (owner, primary cursor) expire after this many heartbeats without a refresh.
pub const LIVENESS_HEARTBEATS: u32 = 3;
/// How far live streams are trimmed when this instance's total in Redis is over `max_total_bytes`.
pub const LIVE_FLOOR_BYTES: usize = 64 << 10;
/// Pause between two tries of a round trip that failed as a whole.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The field of a stream's meta hash that holds its CORS answer (`cors::Grant` as JSON).
const CORS_FIELD: &str = "cors";

/// A stored CORS answer; one that does not parse (another version's) grants nothing.
fn parse_grant(stored: Option<String>) -> Option<Grant> {
    stored.and_then(|s| serde_json::from_str(&s).ok())
}

/// The field of a Stream entry that holds the event's bytes.
const EVENT_FIELD: &str = "e";
/// Streams kept in a binding's index (`<prefix>bind:<binding>`), the newest: no listing asks for more (the
/// ceiling of `websocket.max_streams_per_session`).
pub const BINDING_INDEX_MAX: usize = 1024;

/// The sorted set of a binding's streams.
pub(crate) fn binding_index(prefix: &str, binding: &[u8; 32]) -> String {
    format!("{prefix}bind:{}", hex(binding))
}

/// The channel a binding's new streams are announced on.
pub(crate) fn start_channel(prefix: &str, binding: &[u8; 32]) -> String {
    format!("{prefix}started:{}", hex(binding))
}

/// Microseconds since the Unix epoch (a binding index's scores: exact in a double until the year 2255).
pub(crate) fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A stream of a binding's index whose meta hash still exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Indexed {
    /// The token, as stored (hex).
    pub token: String,
    /// When it was created (µs since the Unix epoch, the owner's clock).
    pub created_us: u64,
    /// Finished, or lost: no more events will come.
    pub ended: bool,
}

/// Settings of the Redis store.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// Prefix of every key; default `"sse-gateway:"`.
    pub key_prefix: String,
    /// `MAXLEN ~` of each stream's events; default 100,000.
    pub max_events: usize,
    /// Event bytes kept per stream in Redis (plus its newest frame): `resume.buffer_bytes`; default 1 MiB.
    pub buffer_bytes: usize,
    /// Event bytes this instance keeps in Redis over all its streams, finished ones included until their keys
    /// expire: `resume.max_total_bytes`; default 256 MiB.
    pub max_total_bytes: usize,
    /// Expiry of a stream's keys, refreshed on every write and heartbeat: grace + retention; default 330 s.
    pub ttl: Duration,
    /// How often the owner refreshes its liveness keys; they expire after 3 of these; default 1 s.
    pub heartbeat: Duration,
    /// Events queued and not yet written before a stream is dropped from the store; default 4096.
    pub queue: usize,
    /// Time limit of each Redis round trip (connecting included); default 1 s.
    pub op_timeout: Duration,
    /// How long Redis may fail to answer before the writer gives up the streams of the round it retries and a
    /// reader ends with an error: `resume.redis_stall_secs`; default 5 s.
    pub stall: Duration,
    /// Readers of streams owned elsewhere open at once on this instance: `resume.max_remote_readers`; default
    /// 1024.
    pub max_readers: usize,
    /// Connections (each with one follower task) that block in `XREAD` for this instance's remote readers:
    /// `resume.redis_follow_connections`; default 1.
    pub follow_connections: usize,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            key_prefix: "sse-gateway:".to_owned(),
            max_events: 100_000,
            buffer_bytes: 1 << 20,
            max_total_bytes: 256 << 20,
            ttl: Duration::from_secs(30 + 300),
            heartbeat: Duration::from_secs(1),
            queue: 4096,
            op_timeout: Duration::from_secs(1),
            stall: Duration::from_secs(5),
            max_readers: 1024,
            follow_connections: 1,
        }
    }
}

/// Most follower connections per instance (the ceiling of `resume.redis_follow_connections`).
pub use crate::config::MAX_FOLLOW_CONNECTIONS;

impl RedisOptions {
    /// Checks the settings, before anything connects.
    pub fn validate(&self) -> Result<(), StoreError> {
        let problem = if self.max_events == 0 {
            "max_events must be at least 1"
        } else if self.queue == 0 {
            "queue must be at least 1"
        } else if self.buffer_bytes == 0 {
            "buffer_bytes must be at least 1"
        } else if self.max_total_bytes < self.buffer_bytes {
            "max_total_bytes must be at least buffer_bytes"
        } else if self.max_readers == 0 {
            "max_readers must be at least 1"
        } else if !(1..=MAX_FOLLOW_CONNECTIONS).contains(&self.follow_connections) {
            "follow_connections must be between 1 and 16"
        } else if self.heartbeat < Duration::from_millis(10) {
            "heartbeat must be at least 10 ms"
        } else if self.op_timeout < Duration::from_millis(1) {
            "op_timeout must be at least 1 ms"
        } else if self.op_timeout.saturating_mul(2) > self.liveness() {
            // A refresh comes at most a heartbeat plus one round trip after the last one; the key lives 3.
            "op_timeout must be at most 1.5 heartbeats, or a slow round trip lets the owner key expire"
        } else if self.stall < self.op_timeout {
            "stall must be at least op_timeout"
        } else if self.ttl < self.liveness() {
            "ttl must be at least 3 heartbeats"
        } else {
            return Ok(());
        };
        Err(StoreError::Options(problem))
    }

    /// How long a liveness key (owner, primary cursor) lives without a refresh.
    fn liveness(&self) -> Duration {
        self.heartbeat.saturating_mul(LIVENESS_HEARTBEATS)
    }

    /// The longest block of a follower's `XREAD`, and the longest a waiting reader waits before it looks at the
    /// owner's liveness again.
    fn follow_block(&self) -> Duration {
        self.heartbeat.min(FOLLOW_BLOCK)
    }
}

/// How a stream ended, stored in its meta hash (`End::as_str`).
pub use super::metrics::End;

/// What another instance tells the owner of a stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteState {
    /// The cursor (last seq delivered) of a primary reader on another instance; `None` without a live report.
    pub primary_cursor: Option<u64>,
    /// Whether any instance asked to cancel the stream.
    pub cancelled: bool,
}

/// The bounds that evict events and the kinds of round trip, as the metrics label them.
pub use super::metrics::{Bound, StoreOp};

/// Told of every Redis round trip and of every stream that stops being resumable (for the metrics).
pub trait StoreObserver: Send + Sync {
    /// One round trip: its operation, whether it succeeded, and how long it took (a `follow` includes its block).
    fn op(&self, op: StoreOp, ok: bool, seconds: f64);
    /// A stream was marked not resumable through the store (queue overflow, refused or failed write, store
    /// lost); once per stream.
    fn unresumable(&self);
    /// Event bytes removed from Redis to keep a bound.
    fn evicted(&self, bound: Bound, bytes: u64);
    /// A stream's meta hash vanished from Redis without a failed write (a flush, a failover to an empty
    /// replica): counted once per stream, which is then also [`StoreObserver::unresumable`].
    fn store_lost(&self);
}

/// A failure to talk to Redis.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The options are not usable.
    #[error("invalid Redis store options: {0}")]
    Options(&'static str),
    /// The client or the server reported an error.
    #[error("Redis {op} failed")]
    Redis {
        op: &'static str,
        #[source]
        source: RedisError,
    },
    /// No answer within `op_timeout`.
    #[error("Redis {op}: no answer within {after:?}")]
    Timeout { op: &'static str, after: Duration },
    /// An answer of an unexpected shape (a key of another type, say).
    #[error("Redis {op}: unexpected reply: {what}")]
    Reply { op: &'static str, what: String },
}

/// Why a stream cannot be opened (or cancelled).
#[derive(Debug, Error)]
pub enum OpenError {
    /// No such stream, or it expired.
    #[error("unknown stream")]
    Unknown,
    /// The stream exists but was opened with another binding.
    #[error("binding differs")]
    Denied,
    /// The event after the asked position is older than the first stored event.
    #[error("position no longer held: first stored event is {first}")]
    Gap { first: u64 },
    /// This instance already has `max_readers` remote readers open.
    #[error("too many remote readers on this instance")]
    Busy,
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a remote reader cannot go on.
#[derive(Debug, Error)]
pub enum ReadError {
    /// Every stored event was read, and the owner died (or stopped writing) before the stream's end.
    #[error("the stream's owner was lost before its end")]
    Lost,
    /// The events after the reader's position were trimmed while it read.
    #[error("events {expected}.. trimmed: first stored event is {first}")]
    Gap { expected: u64, first: u64 },
    /// Redis failed; the reader keeps its position, so `next` may be called again.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The keys of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Keys {
    events: String,
    meta: String,
    owner: String,
    primary: String,
    cancel: String,
}

impl Keys {
    fn new(prefix: &str, token: &str) -> Self {
        let key = |what: &str| format!("{prefix}{{{token}}}:{what}");
        Self {
            events: key("events"),
            meta: key("meta"),
            owner: key("owner"),
            primary: key("primary"),
            cancel: key("cancel"),
        }
    }
}

/// The Stream entry ID of event `seq`.
fn entry_id(seq: u64) -> String {
    format!("0-{seq}")
}

/// The seq of a Stream entry ID written by [`entry_id`].
fn parse_entry_id(id: &[u8]) -> Option<u64> {
    std::str::from_utf8(id.strip_prefix(b"0-")?).ok()?.parse().ok()
}

/// Lowercase hex of a binding, as stored in the meta hash.
fn hex(binding: &[u8; 32]) -> String {
    let mut s = String::with_capacity(64);
    for b in binding {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Compares two byte strings in time that depends on their length only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The byte range of each event of a frame of `len` bytes whose events start at `starts`; `None` unless the
/// starts increase strictly and lie within the frame. Bytes before the first start belong to no event.
fn event_ranges(len: usize, starts: &[u32]) -> Option<Vec<Range<usize>>> {
    let mut ranges = Vec::with_capacity(starts.len());
    for (i, &s) in starts.iter().enumerate() {
        let s = usize::try_from(s).ok()?;
        let end = match starts.get(i + 1) {
            Some(&next) => usize::try_from(next).ok()?,
            None => len,
        };
        if s >= end || end > len {
            return None;
        }
        ranges.push(s..end);
    }
    Some(ranges)
}

/// The entries of an `XRANGE` reply (or of one stream of an `XREAD` reply): `(seq, event bytes)`.
fn parse_entries(op: &'static str, v: Value) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    let bad = |what: &str| StoreError::Reply {
        op,
        what: what.to_owned(),
    };
    let Value::Array(items) = v else {
        return match v {
            Value::Nil => Ok(Vec::new()),
            _ => Err(bad("entries not an array")),
        };
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Value::Array(mut pair) = item else {
            return Err(bad("entry not an array"));
        };
        if pair.len() != 2 {
            return Err(bad("entry not [id, fields]"));
        }
        let fields = pair.pop();
        let id = match pair.pop() {
            Some(Value::BulkString(id)) => parse_entry_id(&id).ok_or_else(|| bad("entry id not 0-<seq>"))?,
            Some(Value::SimpleString(id)) => {
                parse_entry_id(id.as_bytes()).ok_or_else(|| bad("entry id not 0-<seq>"))?
            }
            _ => return Err(bad("entry id not a string")),
        };
        let fields = match fields {
            Some(Value::Array(f)) => f,
            Some(Value::Map(m)) => m.into_iter().flat_map(|(k, v)| [k, v]).collect(),
            _ => return Err(bad("entry fields not an array")),
        };
        let mut data = None;
        let mut it = fields.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            if matches!(&k, Value::BulkString(k) if k == EVENT_FIELD.as_bytes()) {
                if let Value::BulkString(v) = v {
                    data = Some(v);
                }
            }
        }
        out.push((id, data.ok_or_else(|| bad("entry without its event"))?));
    }
    Ok(out)
}

/// Runs one round trip within `limit` and tells the observer.
pub(crate) async fn round_trip<T>(
    observer: &dyn StoreObserver,
    op: StoreOp,
    limit: Duration,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(StoreError::Redis {
            op: op.as_str(),
            source,
        }),
        Err(_) => Err(StoreError::Timeout {
            op: op.as_str(),
            after: limit,
        }),
    };
    observer.op(op, result.is_ok(), started.elapsed().as_secs_f64());
    result
}

/// One stream owned by this instance, shared by the store's handles and its writer.
#[derive(Debug)]
struct Slot {
    keys: Keys,
    /// Events queued and not yet written (or given up).
    pending: AtomicUsize,
    /// Not resumable through the store any more; nothing more of it is written.
    failed: AtomicBool,
    /// What the writer knows it has in Redis; only the writer locks it.
    stored: Mutex<Stored>,
}

impl Slot {
    fn stored(&self) -> std::sync::MutexGuard<'_, Stored> {
        // Only the writer task locks it, one call at a time: a poisoned lock still holds consistent numbers.
        self.stored.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer's account of one stream in Redis.
#[derive(Debug, Default)]
struct Stored {
    /// Its create round succeeded: its meta hash is in Redis, so a missing one means Redis lost it.
    created: bool,
    /// The last seq Redis took (a retried round skips what is already there).
    written: u64,
    /// The last seq counted in `entries` (counted when sent, so a retry does not count twice).
    counted: u64,
    /// Stored events, oldest first: (seq, bytes).
    entries: VecDeque<(u64, usize)>,
    /// Their bytes.
    bytes: usize,
    /// The first seq of its newest frame, which the per-stream bound never trims.
    newest_frame: u64,
    /// When it finished or was given up: its keys expire `ttl` after, and then it no longer counts.
    ended: Option<Instant>,
}

/// The streams this instance owns and has not finished: `append` looks them up, the heartbeat refreshes them.
type Owned = Arc<Mutex<HashMap<String, Arc<Slot>>>>;

/// What the writer task is asked to write.
enum Op {
    Create {
        slot: Arc<Slot>,
        /// The token (hex), announced to other instances' sessions.
        token: String,
        /// When it was created (µs since the Unix epoch): its score in its binding's index.
        created_us: u64,
        binding: [u8; 32],
        agent: String,
        /// The CORS answer kept with the stream (`cors::Grant` as JSON), if its request had an allowed origin.
        cors: Option<String>,
    },
    Append {
        slot: Arc<Slot>,
        first_seq: u64,
        frame: Bytes,
        starts: Vec<u32>,
    },
    Agent {
        slot: Arc<Slot>,
        agent: String,
    },
    Finish {
        slot: Arc<Slot>,
        last_seq: u64,
        how: End,
    },
    /// The stream failed: mark it `lost` and drop its owner key, so readers end at once; with `drop_events`
    /// (Redis refused it for want of memory, or lost it) its events go too.
    Lost {
        slot: Arc<Slot>,
        drop_events: bool,
    },
}

impl Op {
    fn bytes(&self) -> usize {
        match self {
            Op::Append { frame, .. } => frame.len(),
            _ => 0,
        }
    }

    fn slot(&self) -> &Arc<Slot> {
        match self {
            Op::Create { slot, .. }
            | Op::Append { slot, .. }
            | Op::Agent { slot, .. }
            | Op::Finish { slot, .. }
            | Op::Lost { slot, .. } => slot,
        }
    }
}

/// What the store's handles share.
struct Shared {
    opts: RedisOptions,
    observer: Arc<dyn StoreObserver>,
    conn: ConnectionManager,
    /// For the connections of other tasks (the session announcements' pub/sub).
    client: Client,
    /// This instance's name in announcements (random hex), so it skips its own.
    instance: String,
    owned: Owned,
    /// The writer's queue. Unbounded as a channel, bounded per stream by `queue` events (each stream's
    /// `pending`) plus its create, agent, finish and lost ops.
    tx: mpsc::UnboundedSender<Op>,
    /// The follower tasks' waiting lists; a stream's readers all wait on the same one.
    followers: Vec<Arc<Follower>>,
    /// Remote readers open now, at most `max_readers`.
    readers: Arc<AtomicUsize>,
}

/// The Redis store: cheap to clone; when every clone is dropped the writer drains its queue and stops, and
/// with it the owner's heartbeat.
#[derive(Clone)]
pub struct RedisStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("opts", &self.shared.opts)
            .finish_non_exhaustive()
    }
}

/// Marks a slot not resumable; true if it was not already (the caller then tells the observer once).
fn fail(slot: &Slot) -> bool {
    !slot.failed.swap(true, Ordering::AcqRel)
}

impl RedisStore {
    /// Connects (PING) within op_timeout; an error here stops the gateway before bind.
    pub async fn connect(url: &str, opts: RedisOptions, observer: Arc<dyn StoreObserver>) -> Result<Self, StoreError> {
        opts.validate()?;
        let client = Client::open(url).map_err(|source| StoreError::Redis { op: "connect", source })?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(opts.op_timeout)
            .set_response_timeout(opts.op_timeout)
            .set_number_of_retries(1);
        let connecting = async {
            let mut conn = ConnectionManager::new_with_config(client.clone(), config).await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            Ok(conn)
        };
        let conn = round_trip(observer.as_ref(), StoreOp::Connect, opts.op_timeout, connecting).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let owned: Owned = Arc::default();
        let instance = format!("{:016x}", random_u64());
        let writer = Writer {
            instance: instance.clone(),
            conn: conn.clone(),
            opts: opts.clone(),
            observer: observer.clone(),
            owned: owned.clone(),
            lost: Vec::new(),
            again: Vec::new(),
            held: Vec::new(),
            total: 0,
            stalled_since: None,
            refused_since: None,
        };
        tokio::spawn(writer.run(rx));
        let followers = (0..opts.follow_connections)
            .map(|_| {
                let f = Arc::new(Follower::default());
                tokio::spawn(Follower::run(
                    Arc::downgrade(&f),
                    client.clone(),
                    opts.clone(),
                    observer.clone(),
                ));
                f
            })
            .collect();
        Ok(Self {
            shared: Arc::new(Shared {
                opts,
                observer,
                conn,
                client,
                instance,
                owned,
                tx,
                followers,
                readers: Arc::default(),
            }),
        })
    }

    /// Registers a stream owned by this instance, run by `agent`. Never blocks: the writer task writes its meta
    /// and owner key in its next round trip (other instances see the stream from then on).
    pub fn create(&self, token: &str, binding: [u8; 32], agent: &str) {
        self.create_with_cors(token, binding, agent, None)
    }

    /// As `create`, keeping what the backend allowed the original request's origin (CORS), so every instance
    /// answers that origin alike.
    pub fn create_with_cors(&self, token: &str, binding: [u8; 32], agent: &str, cors: Option<&Grant>) {
        let slot = Arc::new(Slot {
            keys: Keys::new(&self.shared.opts.key_prefix, token),
            pending: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            stored: Mutex::default(),
        });
        self.owned().insert(token.to_owned(), slot.clone());
        self.send(Op::Create {
            slot,
            token: token.to_owned(),
            created_us: unix_us(),
            binding,
            agent: agent.to_owned(),
            cors: cors.and_then(|g| serde_json::to_string(g).ok()),
        });
    }

    /// The stream's agent as learnt later (the run's `meta_init`): queued like an event, so readers elsewhere
    /// name it in the envelopes they write from then on.
    pub fn set_agent(&self, token: &str, agent: &str) {
        let Some(slot) = self.owned().get(token).cloned() else {
            return;
        };
        if !slot.failed.load(Ordering::Acquire) {
            self.send(Op::Agent {
                slot,
                agent: agent.to_owned(),
            });
        }
    }

    /// Queues one frame (events back to back; `starts`: where each begins; `first_seq`: the first's seq).
    /// Never blocks. Returns false once the stream is not resumable through the store (its queue
    /// overflowed or a write failed, or it is not registered); it stays false for that stream.
    pub fn append(&self, token: &str, first_seq: u64, frame: Bytes, starts: &[u32]) -> bool {
        let Some(slot) = self.owned().get(token).cloned() else {
            return false;
        };
        if slot.failed.load(Ordering::Acquire) {
            return false;
        }
        if starts.is_empty() {
            return true;
        }
        let valid = event_ranges(frame.len(), starts).is_some();
        debug_assert!(
            valid,
            "append: event starts {starts:?} do not fit a frame of {} bytes",
            frame.len()
        );
        let queued = slot
            .pending
            .fetch_add(starts.len(), Ordering::AcqRel)
            .saturating_add(starts.len());
        if !valid || queued > self.shared.opts.queue {
            slot.pending.fetch_sub(starts.len(), Ordering::AcqRel);
            self.give_up(slot);
            return false;
        }
        self.send(Op::Append {
            slot,
            first_seq,
            frame,
            starts: starts.to_vec(),
        })
    }

    /// The stream's end: its last seq, and how. Stops the owner's heartbeat of it.
    pub fn finish(&self, token: &str, last_seq: u64, how: End) {
        let Some(slot) = self.owned().remove(token) else {
            return;
        };
        if !slot.failed.load(Ordering::Acquire) {
            self.send(Op::Finish { slot, last_seq, how });
        }
    }

    /// The owner polls this for a stream in its grace period or blocked on a full buffer: the cursor reported by
    /// a primary reader on another instance (None without a live report), and whether a cancel was asked.
    pub async fn remote_state(&self, token: &str) -> Result<RemoteState, StoreError> {
        let keys = Keys::new(&self.shared.opts.key_prefix, token);
        let mut pipe = redis::pipe();
        pipe.get(&keys.primary).exists(&keys.cancel);
        let mut conn = self.shared.conn.clone();
        let (primary, cancelled): (Option<String>, bool) = round_trip(
            self.shared.observer.as_ref(),
            StoreOp::RemoteState,
            self.shared.opts.op_timeout,
            pipe.query_async(&mut conn),
        )
        .await?;
        Ok(RemoteState {
            primary_cursor: primary.and_then(|c| c.parse().ok()),
            cancelled,
        })
    }

    /// Any instance: opens a stream for reading after event `after` (None: from the start), once its binding
    /// matches. Errors: Busy (`max_readers` open here), Unknown (no such stream, or expired), Denied, Gap
    /// (`after + 1` is older than the first stored event), Store.
    pub async fn open(&self, token: &str, binding: [u8; 32], after: Option<u64>) -> Result<RemoteReader, OpenError> {
        let count = ReaderCount::take(&self.shared.readers, self.shared.opts.max_readers).ok_or(OpenError::Busy)?;
        let keys = Keys::new(&self.shared.opts.key_prefix, token);
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(&keys.meta)
            .arg("binding")
            .arg("state")
            .arg("last_seq")
            .arg("agent")
            .arg(CORS_FIELD);
        pipe.cmd("XRANGE")
            .arg(&keys.events)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1);
        let mut conn = self.shared.conn.clone();
        let (meta, first): (Vec<Option<String>>, Value) = round_trip(
            self.shared.observer.as_ref(),
            StoreOp::Open,
            self.shared.opts.op_timeout,
            pipe.query_async(&mut conn),
        )
        .await?;
        self.check_binding(meta.first().cloned().flatten(), &binding)?;
        let want = after.unwrap_or(0).saturating_add(1);
        let first = parse_entries("open", first)?.first().map(|(seq, _)| *seq);
        let finished = meta.get(1).cloned().flatten().as_deref() == Some("finished");
        let last_seq: u64 = meta.get(2).cloned().flatten().and_then(|s| s.parse().ok()).unwrap_or(0);
        match first {
            Some(first) if first > want => return Err(OpenError::Gap { first }),
            // Finished with events stored once but none now: dropped for a bound, or expired before the meta.
            None if finished && want <= last_seq => {
                return Err(OpenError::Gap {
                    first: last_seq.saturating_add(1),
                })
            }
            _ => {}
        }
        let follower = self.shared.followers[follower_of(&keys.events, self.shared.followers.len())].clone();
        Ok(RemoteReader {
            keys: Arc::new(keys),
            conn,
            follower,
            opts: self.shared.opts.clone(),
            observer: self.shared.observer.clone(),
            cursor: Arc::new(AtomicU64::new(after.unwrap_or(0))),
            done: false,
            primary: Primary::No,
            agent: meta.get(3).cloned().flatten().unwrap_or_default(),
            cors: parse_grant(meta.get(4).cloned().flatten()),
            owner_absent: None,
            _count: count,
        })
    }

    /// Any instance: asks the owner to cancel (binding checked as in open); the owner sees it in
    /// [`RedisStore::remote_state`]. Returns the stream's CORS answer.
    pub async fn cancel(&self, token: &str, binding: [u8; 32]) -> Result<Option<Grant>, OpenError> {
        let keys = Keys::new(&self.shared.opts.key_prefix, token);
        let mut conn = self.shared.conn.clone();
        let observer = self.shared.observer.as_ref();
        let limit = self.shared.opts.op_timeout;
        let mut hmget = redis::cmd("HMGET");
        hmget.arg(&keys.meta).arg("binding").arg(CORS_FIELD);
        let stored: Vec<Option<String>> =
            round_trip(observer, StoreOp::Cancel, limit, hmget.query_async(&mut conn)).await?;
        self.check_binding(stored.first().cloned().flatten(), &binding)?;
        let ttl = millis(self.shared.opts.ttl);
        let mut set = redis::cmd("SET");
        set.arg(&keys.cancel).arg(1).arg("PX").arg(ttl);
        round_trip(observer, StoreOp::Cancel, limit, set.query_async::<()>(&mut conn)).await?;
        Ok(parse_grant(stored.get(1).cloned().flatten()))
    }

    /// Any instance: the CORS answer kept with a stream (`None` for no such stream, or none kept), for a
    /// preflight of its URL.
    pub async fn cors(&self, token: &str) -> Result<Option<Grant>, StoreError> {
        let keys = Keys::new(&self.shared.opts.key_prefix, token);
        let mut conn = self.shared.conn.clone();
        let mut hget = redis::cmd("HGET");
        hget.arg(&keys.meta).arg(CORS_FIELD);
        let stored: Option<String> = round_trip(
            self.shared.observer.as_ref(),
            StoreOp::Cors,
            self.shared.opts.op_timeout,
            hget.query_async(&mut conn),
        )
        .await?;
        Ok(parse_grant(stored))
    }

    /// Any instance: a frontend chat's record (`proxy::frontend::chats`), by its key's hex; `None` when there is
    /// none (never written, or expired).
    pub async fn chat_get(&self, key: &str) -> Result<Option<String>, StoreError> {
        let mut conn = self.shared.conn.clone();
        let mut get = redis::cmd("GET");
        get.arg(format!("{}chat:{key}", self.shared.opts.key_prefix));
        let (observer, timeout) = (self.shared.observer.as_ref(), self.shared.opts.op_timeout);
        round_trip(observer, StoreOp::Chat, timeout, get.query_async(&mut conn)).await
    }

    /// Any instance: writes a frontend chat's record, which expires `ttl` after its last write.
    pub async fn chat_set(&self, key: &str, record: &str, ttl: Duration) -> Result<(), StoreError> {
        let mut conn = self.shared.conn.clone();
        let mut set = redis::cmd("SET");
        set.arg(format!("{}chat:{key}", self.shared.opts.key_prefix))
            .arg(record)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64);
        let (observer, timeout) = (self.shared.observer.as_ref(), self.shared.opts.op_timeout);
        round_trip::<()>(observer, StoreOp::Chat, timeout, set.query_async(&mut conn)).await
    }

    /// Any instance: the newest `limit` streams of a binding's index whose meta hash still exists (ended or
    /// not), oldest first; at most [`BINDING_INDEX_MAX`].
    pub async fn list_binding(&self, binding: &[u8; 32], limit: usize) -> Result<Vec<Indexed>, StoreError> {
        let limit = limit.min(BINDING_INDEX_MAX);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let observer = self.shared.observer.as_ref();
        let op_timeout = self.shared.opts.op_timeout;
        let prefix = &self.shared.opts.key_prefix;
        let mut conn = self.shared.conn.clone();
        let mut zrange = redis::cmd("ZRANGE");
        zrange
            .arg(binding_index(prefix, binding))
            .arg(-(limit as i64))
            .arg(-1)
            .arg("WITHSCORES");
        let members: Vec<(String, f64)> =
            round_trip(observer, StoreOp::List, op_timeout, zrange.query_async(&mut conn)).await?;
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (token, _) in &members {
            pipe.cmd("HMGET")
                .arg(Keys::new(prefix, token).meta)
                .arg("state")
                .arg("end");
        }
        let metas: Vec<Vec<Option<String>>> =
            round_trip(observer, StoreOp::List, op_timeout, pipe.query_async(&mut conn)).await?;
        Ok(members
            .into_iter()
            .zip(metas)
            .filter_map(|((token, score), meta)| {
                let state = meta.first().cloned().flatten()?;
                let ended = state != "live" || meta.get(1).cloned().flatten().is_some();
                Some(Indexed {
                    token,
                    created_us: score.max(0.0) as u64,
                    ended,
                })
            })
            .collect())
    }

    /// The client the store connects with.
    pub(crate) fn client(&self) -> &Client {
        &self.shared.client
    }

    pub(crate) fn options(&self) -> &RedisOptions {
        &self.shared.opts
    }

    pub(crate) fn observer(&self) -> &Arc<dyn StoreObserver> {
        &self.shared.observer
    }

    /// This instance's name in announcements.
    pub(crate) fn instance(&self) -> &str {
        &self.shared.instance
    }

    fn check_binding(&self, stored: Option<String>, binding: &[u8; 32]) -> Result<(), OpenError> {
        match stored {
            None => Err(OpenError::Unknown),
            Some(stored) if same(stored.as_bytes(), hex(binding).as_bytes()) => Ok(()),
            Some(_) => Err(OpenError::Denied),
        }
    }

    fn owned(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        // A panic while holding this lock leaves the map consistent (every critical section is one call).
        self.shared.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands an op to the writer; false (and the stream given up) if the writer is gone.
    fn send(&self, op: Op) -> bool {
        match self.shared.tx.send(op) {
            Ok(()) => true,
            Err(mpsc::error::SendError(op)) => {
                if fail(op.slot()) {
                    self.shared.observer.unresumable();
                }
                false
            }
        }
    }

    /// Marks a stream not resumable and asks the writer to mark it lost in Redis.
    fn give_up(&self, slot: Arc<Slot>) {
        if fail(&slot) {
            self.shared.observer.unresumable();
            self.send(Op::Lost {
                slot,
                drop_events: false,
            });
        }
    }
}

/// A random u64 (an instance's name): from the OS, or the clock and the process id without it.
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    match getrandom::fill(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => unix_us() ^ (u64::from(std::process::id()) << 32),
    }
}

/// Milliseconds of a duration, for `PX` and `PEXPIRE` (at least 1: 0 is not a valid expiry).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// What one reply of a writer's pipeline tells.
enum Tag {
    /// Nothing to learn from it.
    Ignore,
    /// A heartbeat's `PEXPIRE` of the meta hash: 0 for a created stream means Redis lost it.
    MetaAlive(Arc<Slot>),
    /// A command of the stream's create.
    Create(Arc<Slot>),
    /// The `XADD` of event `seq`.
    Add(Arc<Slot>, u64),
    /// Another command whose refusal gives the stream up (its finish, its agent).
    Must(Arc<Slot>),
}

/// One pipeline, what each of its replies means, and the ops it writes: kept whole to be sent again after a
/// round trip that failed.
#[derive(Default)]
struct Round {
    pipe: Pipeline,
    tags: Vec<Tag>,
    ops: Vec<Op>,
}

impl Round {
    fn add(&mut self, cmd: redis::Cmd, tag: Tag) {
        self.pipe.add_command(cmd);
        self.tags.push(tag);
    }
}

/// A command's refusal by Redis: its code (`OOM`, `WRONGTYPE`, ...) and message.
struct Refusal<'a> {
    code: &'a str,
    message: &'a str,
}

impl<'a> Refusal<'a> {
    fn of(reply: &'a Value) -> Option<Self> {
        match reply {
            Value::ServerError(e) => Some(Self {
                code: e.code(),
                message: e.details().unwrap_or_default(),
            }),
            _ => None,
        }
    }

    /// For want of memory (`maxmemory` with `noeviction`).
    fn out_of_memory(&self) -> bool {
        self.code == "OOM"
    }

    /// An `XADD` whose entry is already there (a round sent again after a lost answer).
    fn already_added(&self) -> bool {
        self.message.contains("equal or smaller")
    }
}

/// The one task that writes a store's streams: it takes what is queued (up to a batch), sends it as one
/// pipeline, waits for the answer, and repeats; every heartbeat the same pipeline refreshes the owner keys and
/// checks that each owned stream's meta hash is still there.
struct Writer {
    /// This instance's name in announcements.
    instance: String,
    conn: ConnectionManager,
    opts: RedisOptions,
    observer: Arc<dyn StoreObserver>,
    owned: Owned,
    /// Streams given up by the writer, to be marked lost in the next round (with their events deleted?).
    lost: Vec<(Arc<Slot>, bool)>,
    /// Ops of streams whose commands Redis refused for want of memory, sent again first.
    again: Vec<Op>,
    /// Every stream with events counted in `total`, until its keys expire.
    held: Vec<Arc<Slot>>,
    /// Event bytes this instance has in Redis (as far as the writer knows).
    total: usize,
    /// Since when round trips fail as a whole (Redis down or stalled).
    stalled_since: Option<Instant>,
    /// Since when Redis refuses commands for want of memory.
    refused_since: Option<Instant>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Op>) {
        let mut next_beat = tokio::time::Instant::now();
        let mut closed = false;
        loop {
            let mut ops = std::mem::take(&mut self.again);
            let beat = if ops.is_empty() && self.lost.is_empty() {
                if closed {
                    break;
                }
                tokio::select! {
                    biased;
                    op = rx.recv() => match op {
                        Some(op) => {
                            ops.push(op);
                            tokio::time::Instant::now() >= next_beat
                        }
                        None => {
                            closed = true;
                            continue;
                        }
                    },
                    () = tokio::time::sleep_until(next_beat) => true,
                }
            } else {
                tokio::time::Instant::now() >= next_beat
            };
            // The heartbeat's list is taken before the queue is drained: a stream finished after this point
            // has its finish (and its owner key's deletion) queued after, so written after the refresh.
            let beating: Vec<Arc<Slot>> = if beat {
                next_beat = tokio::time::Instant::now() + self.opts.heartbeat;
                let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
                owned
                    .values()
                    .filter(|s| !s.failed.load(Ordering::Acquire))
                    .cloned()
                    .collect()
            } else {
                Vec::new()
            };
            let mut bytes = ops.iter().map(Op::bytes).sum::<usize>();
            while !closed && ops.len() < MAX_BATCH_FRAMES && bytes < MAX_BATCH_BYTES {
                match rx.try_recv() {
                    Ok(op) => {
                        bytes += op.bytes();
                        ops.push(op);
                    }
                    Err(_) => break,
                }
            }
            let round = self.build(&beating, ops);
            self.send(round).await;
        }
        // The store is gone: what was queued has been written; the owner keys now expire.
        tracing::debug!("redis store: writer stopped");
    }

    /// The pipeline of one round: the heartbeat of `beating`, then `ops` in order, then the trims that keep the
    /// bounds, then the keys' expiry.
    fn build(&mut self, beating: &[Arc<Slot>], mut ops: Vec<Op>) -> Round {
        let liveness = millis(self.opts.liveness());
        let ttl = millis(self.opts.ttl);
        let now = Instant::now();
        let mut r = Round::default();
        for slot in beating {
            let k = &slot.keys;
            // SET recreates a key that expired while Redis stalled; out of memory Redis refuses it (and only
            // it), and the PEXPIRE after it still refreshes the key.
            let mut set = redis::cmd("SET");
            set.arg(&k.owner).arg(1).arg("PX").arg(liveness);
            r.add(set, Tag::Ignore);
            r.add(redis::Cmd::pexpire(&k.owner, liveness as i64), Tag::Ignore);
            // A live stream may stay silent for longer than its keys' expiry: the heartbeat keeps them.
            r.add(redis::Cmd::pexpire(&k.meta, ttl as i64), Tag::MetaAlive(slot.clone()));
            r.add(redis::Cmd::pexpire(&k.events, ttl as i64), Tag::Ignore);
        }
        let lost: Vec<Op> = self
            .lost
            .drain(..)
            .map(|(slot, drop_events)| Op::Lost { slot, drop_events })
            .collect();
        ops.splice(0..0, lost);
        let mut touched: Vec<Arc<Slot>> = Vec::new();
        let touch = |touched: &mut Vec<Arc<Slot>>, slot: &Arc<Slot>| {
            if !touched.iter().any(|t| Arc::ptr_eq(t, slot)) {
                touched.push(slot.clone());
            }
        };
        let mut added: Vec<Arc<Slot>> = Vec::new();
        for op in &ops {
            match op {
                // Written even for a stream already given up: readers elsewhere then see it, lost.
                Op::Create {
                    slot,
                    token,
                    created_us,
                    binding,
                    agent,
                    cors,
                } => {
                    let k = &slot.keys;
                    // The owner key first: a reader that finds the meta hash finds a live owner.
                    let mut set = redis::cmd("SET");
                    set.arg(&k.owner).arg(1).arg("PX").arg(liveness);
                    r.add(set, Tag::Create(slot.clone()));
                    let mut hset = redis::cmd("HSET");
                    hset.arg(&k.meta)
                        .arg("binding")
                        .arg(hex(binding))
                        .arg("agent")
                        .arg(agent)
                        .arg("state")
                        .arg("live")
                        .arg("last_seq")
                        .arg(0);
                    if let Some(cors) = cors {
                        hset.arg(CORS_FIELD).arg(cors);
                    }
                    r.add(hset, Tag::Create(slot.clone()));
                    self.announce(&mut r, token, *created_us, binding);
                    if !self.held.iter().any(|h| Arc::ptr_eq(h, slot)) {
                        self.held.push(slot.clone());
                    }
                    touch(&mut touched, slot);
                }
                Op::Append {
                    slot,
                    first_seq,
                    frame,
                    starts,
                } => {
                    if slot.failed.load(Ordering::Acquire) {
                        continue;
                    }
                    let mut st = slot.stored();
                    st.newest_frame = *first_seq;
                    let ranges = event_ranges(frame.len(), starts).unwrap_or_default();
                    for (seq, range) in (*first_seq..).zip(ranges) {
                        if seq <= st.written {
                            continue;
                        }
                        let len = range.len();
                        let mut xadd = redis::cmd("XADD");
                        xadd.arg(&slot.keys.events)
                            .arg("MAXLEN")
                            .arg("~")
                            .arg(self.opts.max_events)
                            .arg(entry_id(seq))
                            .arg(EVENT_FIELD)
                            .arg(&frame[range]);
                        r.add(xadd, Tag::Add(slot.clone(), seq));
                        if seq > st.counted {
                            st.entries.push_back((seq, len));
                            st.bytes += len;
                            st.counted = seq;
                            self.total += len;
                        }
                    }
                    drop(st);
                    touch(&mut touched, slot);
                    touch(&mut added, slot);
                }
                Op::Agent { slot, agent } => {
                    if slot.failed.load(Ordering::Acquire) {
                        continue;
                    }
                    let mut hset = redis::cmd("HSET");
                    hset.arg(&slot.keys.meta).arg("agent").arg(agent);
                    r.add(hset, Tag::Must(slot.clone()));
                    touch(&mut touched, slot);
                }
                Op::Finish { slot, last_seq, how } => {
                    if slot.failed.load(Ordering::Acquire) {
                        continue;
                    }
                    let k = &slot.keys;
                    let mut hset = redis::cmd("HSET");
                    hset.arg(&k.meta)
                        .arg("state")
                        .arg("finished")
                        .arg("last_seq")
                        .arg(*last_seq)
                        .arg("end")
                        .arg(how.as_str());
                    r.add(hset, Tag::Must(slot.clone()));
                    r.add(redis::Cmd::del(&k.owner), Tag::Ignore);
                    slot.stored().ended.get_or_insert(now);
                    touch(&mut touched, slot);
                }
                Op::Lost { slot, drop_events } => {
                    let k = &slot.keys;
                    let mut hset = redis::cmd("HSET");
                    hset.arg(&k.meta).arg("state").arg("lost");
                    r.add(hset, Tag::Ignore);
                    r.add(redis::Cmd::del(&k.owner), Tag::Ignore);
                    if *drop_events {
                        r.add(redis::Cmd::del(&k.events), Tag::Ignore);
                        self.forget(slot);
                    }
                    slot.stored().ended.get_or_insert(now);
                    touch(&mut touched, slot);
                }
            }
        }
        for slot in &added {
            let mut st = slot.stored();
            let mut freed = 0;
            let mut keep_from = None;
            while st.bytes > self.opts.buffer_bytes {
                match st.entries.front().copied() {
                    Some((seq, len)) if seq < st.newest_frame => {
                        st.entries.pop_front();
                        st.bytes -= len;
                        freed += len;
                        keep_from = Some(seq + 1);
                    }
                    _ => break,
                }
            }
            drop(st);
            if let Some(first) = keep_from {
                self.total = self.total.saturating_sub(freed);
                self.observer.evicted(Bound::Stream, freed as u64);
                r.add(trim(&slot.keys.events, first), Tag::Ignore);
            }
        }
        self.keep_total(&mut r, now);
        for slot in &touched {
            r.add(redis::Cmd::pexpire(&slot.keys.events, ttl as i64), Tag::Ignore);
            r.add(redis::Cmd::pexpire(&slot.keys.meta, ttl as i64), Tag::Ignore);
        }
        r.ops = ops;
        r
    }

    /// Indexes a new stream under its binding, then announces it (after its meta hash: an instance told of it can
    /// open it). Neither is the stream's own: a refusal does not give it up.
    fn announce(&self, r: &mut Round, token: &str, created_us: u64, binding: &[u8; 32]) {
        let prefix = &self.opts.key_prefix;
        let index = binding_index(prefix, binding);
        let ttl = millis(self.opts.ttl);
        r.add(redis::Cmd::zadd(&index, token, created_us), Tag::Ignore);
        // The newest BINDING_INDEX_MAX, and none whose keys have surely expired.
        r.add(
            redis::Cmd::zremrangebyrank(&index, 0, -(BINDING_INDEX_MAX as isize) - 1),
            Tag::Ignore,
        );
        let mut old = redis::cmd("ZREMRANGEBYSCORE");
        let expired = unix_us().saturating_sub(ttl.saturating_mul(1000));
        old.arg(&index).arg("-inf").arg(format!("({expired}"));
        r.add(old, Tag::Ignore);
        r.add(redis::Cmd::pexpire(&index, ttl as i64), Tag::Ignore);
        let mut publish = redis::cmd("PUBLISH");
        publish
            .arg(start_channel(prefix, binding))
            .arg(format!("{}:{token}", self.instance));
        r.add(publish, Tag::Ignore);
    }

    /// Stops counting a stream's events (deleted, or lost by Redis).
    fn forget(&mut self, slot: &Slot) {
        let mut st = slot.stored();
        self.total = self.total.saturating_sub(st.bytes);
        st.bytes = 0;
        st.entries.clear();
    }

    /// Keeps what this instance has in Redis within `max_total_bytes`: streams whose keys expired stop
    /// counting; then the events of the streams that ended first are deleted; then live streams are trimmed
    /// to [`LIVE_FLOOR_BYTES`], the largest first.
    fn keep_total(&mut self, r: &mut Round, now: Instant) {
        let ttl = self.opts.ttl;
        let mut expired = 0;
        self.held.retain(|s| {
            let st = s.stored();
            let gone = st.ended.is_some_and(|t| now.duration_since(t) >= ttl);
            if gone {
                expired += st.bytes;
            }
            !gone
        });
        self.total = self.total.saturating_sub(expired);
        if self.total <= self.opts.max_total_bytes {
            return;
        }
        let mut ended: Vec<(Instant, Arc<Slot>)> = self
            .held
            .iter()
            .filter_map(|s| {
                let st = s.stored();
                st.ended.filter(|_| st.bytes > 0).map(|t| (t, s.clone()))
            })
            .collect();
        ended.sort_by_key(|(t, _)| *t);
        for (_, slot) in ended {
            if self.total <= self.opts.max_total_bytes {
                return;
            }
            let freed = slot.stored().bytes;
            self.forget(&slot);
            self.observer.evicted(Bound::Total, freed as u64);
            r.add(redis::Cmd::del(&slot.keys.events), Tag::Ignore);
        }
        let mut live: Vec<(usize, Arc<Slot>)> = self
            .held
            .iter()
            .map(|s| (s.stored().bytes, s.clone()))
            .filter(|(b, _)| *b > LIVE_FLOOR_BYTES)
            .collect();
        live.sort_by_key(|(b, _)| std::cmp::Reverse(*b));
        for (_, slot) in live {
            if self.total <= self.opts.max_total_bytes {
                return;
            }
            let mut st = slot.stored();
            let mut freed = 0;
            let mut keep_from = None;
            while st.bytes > LIVE_FLOOR_BYTES && st.entries.len() > 1 {
                let Some((seq, len)) = st.entries.pop_front() else {
                    break;
                };
                st.bytes -= len;
                freed += len;
                keep_from = Some(seq + 1);
            }
            drop(st);
            self.total = self.total.saturating_sub(freed);
            if let Some(first) = keep_from {
                self.observer.evicted(Bound::Total, freed as u64);
                r.add(trim(&slot.keys.events, first), Tag::Ignore);
            }
        }
    }

    /// Sends a round until Redis answers it (sent again as it was after a failed round trip, for at most
    /// `stall`), then applies the answer.
    async fn send(&mut self, round: Round) {
        loop {
            if round.tags.is_empty() {
                self.settle(round.ops, &[]);
                return;
            }
            let mut conn = self.conn.clone();
            let n = round.tags.len();
            let result = round_trip(
                self.observer.as_ref(),
                StoreOp::Write,
                self.opts.op_timeout,
                conn.req_packed_commands(&round.pipe, 0, n),
            )
            .await;
            match result {
                Ok(replies) if replies.len() == n => {
                    self.stalled_since = None;
                    self.apply(round, replies);
                    return;
                }
                result => {
                    let since = *self.stalled_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.opts.stall {
                        if let Err(e) = result {
                            tracing::debug!(error = %e, "redis store: writes failed; their streams are no longer resumable");
                        }
                        let slots: Vec<Arc<Slot>> = round
                            .ops
                            .iter()
                            .map(|op| op.slot().clone())
                            .chain(round.tags.iter().filter_map(|t| match t {
                                Tag::MetaAlive(s) => Some(s.clone()),
                                _ => None,
                            }))
                            .collect();
                        for slot in slots {
                            self.give_up(&slot, false);
                        }
                        self.settle(round.ops, &[]);
                        return;
                    }
                    // A short stall loses nothing: the same round goes again (what Redis already took of it
                    // is taken again as a no-op).
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }

    /// Reads each reply of a round: gives up only the streams whose own commands were refused.
    fn apply(&mut self, round: Round, replies: Vec<Value>) {
        // Streams with a refused command: (slot, every refusal was for want of memory).
        let mut refused: Vec<(Arc<Slot>, bool)> = Vec::new();
        let refuse = |refused: &mut Vec<(Arc<Slot>, bool)>, slot: &Arc<Slot>, oom: bool| match refused
            .iter_mut()
            .find(|(s, _)| Arc::ptr_eq(s, slot))
        {
            Some((_, all_oom)) => *all_oom &= oom,
            None => refused.push((slot.clone(), oom)),
        };
        for (tag, reply) in round.tags.iter().zip(replies) {
            let error = Refusal::of(&reply);
            match tag {
                Tag::Ignore => {}
                Tag::MetaAlive(slot) => {
                    let created = slot.stored().created;
                    if reply == Value::Int(0) && created && !slot.failed.load(Ordering::Acquire) {
                        tracing::warn!("redis store: a stream's keys vanished from Redis (flushed or failed over)");
                        self.observer.store_lost();
                        self.forget(slot);
                        self.give_up(slot, true);
                    }
                }
                Tag::Create(slot) => match error {
                    Some(e) => refuse(&mut refused, slot, e.out_of_memory()),
                    None => slot.stored().created = true,
                },
                Tag::Add(slot, seq) => match error {
                    Some(e) if e.already_added() => {
                        let mut st = slot.stored();
                        st.written = st.written.max(*seq);
                    }
                    Some(e) => refuse(&mut refused, slot, e.out_of_memory()),
                    None => {
                        if refused.iter().any(|(s, _)| Arc::ptr_eq(s, slot)) {
                            // An event after a refused one was taken: a hole, which no retry can fill.
                            refuse(&mut refused, slot, false);
                        } else {
                            let mut st = slot.stored();
                            st.written = st.written.max(*seq);
                        }
                    }
                },
                Tag::Must(slot) => {
                    if let Some(e) = error {
                        refuse(&mut refused, slot, e.out_of_memory());
                    }
                }
            }
        }
        let mut again: Vec<Arc<Slot>> = Vec::new();
        let oom: Vec<Arc<Slot>> = refused
            .iter()
            .filter(|(s, oom)| *oom && !s.failed.load(Ordering::Acquire))
            .map(|(s, _)| s.clone())
            .collect();
        for (slot, oom) in &refused {
            if !oom {
                tracing::debug!("redis store: Redis refused a stream's write; it is no longer resumable");
                self.give_up(slot, false);
            }
        }
        if oom.is_empty() {
            self.refused_since = None;
        } else {
            // Redis is full: the stream holding the most goes (its events deleted, which frees memory for the
            // others), the others' refused commands go again; after `stall` of this, all of them go.
            let since = *self.refused_since.get_or_insert_with(Instant::now);
            let all = since.elapsed() >= self.opts.stall;
            let biggest = oom.iter().max_by_key(|s| s.stored().bytes).cloned();
            for slot in oom {
                if all || biggest.as_ref().is_some_and(|b| Arc::ptr_eq(b, &slot)) {
                    tracing::debug!("redis store: Redis is out of memory; a stream is no longer resumable");
                    self.give_up(&slot, true);
                } else {
                    again.push(slot);
                }
            }
        }
        self.settle(round.ops, &again);
    }

    /// The ops of a round that is over: those of the streams in `again` are sent again; the others' events stop
    /// counting against their queue.
    fn settle(&mut self, ops: Vec<Op>, again: &[Arc<Slot>]) {
        for op in ops {
            let slot = op.slot();
            if !slot.failed.load(Ordering::Acquire) && again.iter().any(|s| Arc::ptr_eq(s, slot)) {
                self.again.push(op);
            } else if let Op::Append { slot, starts, .. } = &op {
                slot.pending.fetch_sub(starts.len(), Ordering::AcqRel);
            }
        }
    }

    /// Marks a stream not resumable (told once) and queues its `lost` state for the next round; with
    /// `drop_events`, its events are deleted there too.
    fn give_up(&mut self, slot: &Arc<Slot>, drop_events: bool) {
        if fail(slot) {
            self.observer.unresumable();
            self.lost.push((slot.clone(), drop_events));
        } else if drop_events {
            if let Some(entry) = self.lost.iter_mut().find(|(s, _)| Arc::ptr_eq(s, slot)) {
                entry.1 = true;
            }
        }
    }
}

/// `XTRIM <events> MINID 0-<first>`: drops the events before `first`.
fn trim(events: &str, first: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("XTRIM");
    cmd.arg(events).arg("MINID").arg(entry_id(first));
    cmd
}

/// Which follower a stream's readers wait on.
fn follower_of(key: &str, n: usize) -> usize {
    // FNV-1a: stable, and spreads tokens (random hex) evenly.
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h % n.max(1) as u64) as usize
}

/// A reader waiting for events of a stream after a seq.
struct Waiter {
    events: String,
    after: u64,
    wake: oneshot::Sender<()>,
}

/// One follower connection's readers waiting for events: its task blocks in one `XREAD` over all their
/// streams and wakes those whose streams got events, so Redis sees a fixed number of connections however many
/// readers follow.
#[derive(Default)]
struct Follower {
    waiting: Mutex<Vec<Waiter>>,
    joined: Notify,
}

impl Follower {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        // Every critical section is one push, retain or drain: a poisoned list is still consistent.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves when `events` may have an entry after `after` (or never, if the follower is gone: callers wait
    /// with a timeout).
    fn wait(&self, events: &str, after: u64) -> oneshot::Receiver<()> {
        let (wake, woken) = oneshot::channel();
        self.waiting().push(Waiter {
            events: events.to_owned(),
            after,
            wake,
        });
        self.joined.notify_one();
        woken
    }

    async fn run(me: Weak<Self>, client: Client, opts: RedisOptions, observer: Arc<dyn StoreObserver>) {
        let block = opts.follow_block();
        let limit = block.saturating_add(opts.op_timeout);
        let mut conn: Option<MultiplexedConnection> = None;
        loop {
            let Some(f) = me.upgrade() else { return };
            // Each stream once, from the lowest position any of its readers waits after.
            let mut streams: HashMap<String, u64> = HashMap::new();
            {
                let mut waiting = f.waiting();
                waiting.retain(|w| !w.wake.is_closed());
                for w in waiting.iter() {
                    let after = streams.entry(w.events.clone()).or_insert(w.after);
                    *after = (*after).min(w.after);
                }
            }
            let streams: Vec<(String, u64)> = streams.into_iter().collect();
            if streams.is_empty() {
                // Woken by a reader that joins; the timeout lets the task end once the store is gone.
                let _ = tokio::time::timeout(Duration::from_secs(1), f.joined.notified()).await;
                continue;
            }
            drop(f);
            if conn.is_none() {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(opts.op_timeout)
                    .set_response_timeout(limit);
                let connecting = client.get_multiplexed_async_connection_with_config(&config);
                match round_trip(observer.as_ref(), StoreOp::Connect, opts.op_timeout, connecting).await {
                    Ok(c) => conn = Some(c),
                    Err(_) => {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                }
            }
            let Some(c) = conn.as_mut() else { continue };
            let mut xread = redis::cmd("XREAD");
            xread.arg("COUNT").arg(1).arg("BLOCK").arg(millis(block)).arg("STREAMS");
            for (k, _) in &streams {
                xread.arg(k);
            }
            for (_, after) in &streams {
                xread.arg(entry_id(*after));
            }
            match round_trip(observer.as_ref(), StoreOp::Follow, limit, xread.query_async::<Value>(c)).await {
                Ok(reply) => {
                    let ready: std::collections::HashSet<Vec<u8>> = xread_keys(reply).into_iter().collect();
                    if ready.is_empty() {
                        continue;
                    }
                    let Some(f) = me.upgrade() else { return };
                    let mut waiting = f.waiting();
                    let (wake, keep): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut *waiting)
                        .into_iter()
                        .partition(|w| ready.contains(w.events.as_bytes()));
                    *waiting = keep;
                    drop(waiting);
                    for w in wake {
                        let _ = w.wake.send(());
                    }
                }
                Err(_) => {
                    // The connection may still be blocked in the XREAD: start afresh. Waiting readers look at
                    // the stream themselves when their wait times out.
                    conn = None;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }
}

/// The keys of the streams in an `XREAD` reply: `Nil` on a timeout, else `[[key, entries]]` (RESP2) or
/// `{key: entries}` (RESP3).
fn xread_keys(v: Value) -> Vec<Vec<u8>> {
    let key = |k: Value| match k {
        Value::BulkString(k) => Some(k),
        Value::SimpleString(k) => Some(k.into_bytes()),
        _ => None,
    };
    match v {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut kv) if kv.len() == 2 => {
                    kv.truncate(1);
                    kv.pop().and_then(key)
                }
                _ => None,
            })
            .collect(),
        Value::Map(m) => m.into_iter().filter_map(|(k, _)| key(k)).collect(),
        _ => Vec::new(),
    }
}

/// One open remote reader, counted against `max_readers` until dropped.
struct ReaderCount(Arc<AtomicUsize>);

impl ReaderCount {
    fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
        open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| Self(open.clone()))
    }
}

impl Drop for ReaderCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a reader reports its cursor, and its reporting task's stop signal (dropped with the reader).
enum Primary {
    No,
    /// Asked for outside a runtime: the report starts at the next `next`.
    Wanted,
    Reporting {
        _stop: oneshot::Sender<()>,
    },
}

/// A reader of a stream on any instance, from [`RedisStore::open`].
pub struct RemoteReader {
    keys: Arc<Keys>,
    /// The store's shared connection, for the non-blocking reads.
    conn: ConnectionManager,
    /// Where it waits for new events.
    follower: Arc<Follower>,
    opts: RedisOptions,
    observer: Arc<dyn StoreObserver>,
    /// The seq of the last event returned (0: none), shared with the primary report.
    cursor: Arc<AtomicU64>,
    /// The finished stream's last event was returned.
    done: bool,
    primary: Primary,
    /// The stream's agent, from its meta hash.
    agent: String,
    /// The stream's CORS answer, from its meta hash.
    cors: Option<Grant>,
    /// Since when (on this reader's clock) the owner key of a live stream has been missing.
    owner_absent: Option<Instant>,
    _count: ReaderCount,
}

impl std::fmt::Debug for RemoteReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteReader")
            .field("cursor", &self.cursor.load(Ordering::Relaxed))
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl RemoteReader {
    /// The next stored events, in order, as one `Bytes` of whole events (each with its id line), with the seq
    /// of the last. `Ok(None)` after the finished stream's last event; `Err(ReadError::Lost)` after every
    /// stored event when the owner died (its key expired, then stayed missing for a heartbeat on this reader's
    /// clock, so a Redis stall is not a death) or its stream failed before the end: never a silent end. A round trip
    /// that fails is tried again for up to `stall` before `Err(ReadError::Store)`. Follows a live stream through
    /// the store's follower. Cancel-safe: the position moves only when events are returned.
    pub async fn next(&mut self) -> Result<Option<(Bytes, u64)>, ReadError> {
        if self.done {
            return Ok(None);
        }
        if matches!(self.primary, Primary::Wanted) {
            self.start_report();
        }
        loop {
            let cursor = self.cursor.load(Ordering::Acquire);
            // Owner first, then meta, then events: see the module's doc for why this order is safe.
            let mut pipe = redis::pipe();
            pipe.exists(&self.keys.owner);
            pipe.cmd("HMGET")
                .arg(&self.keys.meta)
                .arg("state")
                .arg("last_seq")
                .arg("agent");
            pipe.cmd("XRANGE")
                .arg(&self.keys.events)
                .arg(entry_id(cursor.saturating_add(1)))
                .arg("+")
                .arg("COUNT")
                .arg(READ_COUNT);
            let (owner, meta, entries): (bool, Vec<Option<String>>, Value) = self.query(&pipe).await?;
            if let Some(agent) = meta.get(2).cloned().flatten() {
                self.agent = agent;
            }
            let entries = parse_entries("read", entries)?;
            if !entries.is_empty() {
                return self.take(cursor, entries).map(Some);
            }
            let state = meta.first().cloned().flatten();
            let last_seq: u64 = meta.get(1).cloned().flatten().and_then(|s| s.parse().ok()).unwrap_or(0);
            match state.as_deref() {
                Some("finished") if cursor >= last_seq => {
                    self.done = true;
                    return Ok(None);
                }
                // Finished with events missing: dropped to keep a bound, or expired.
                Some("finished") => {
                    return Err(ReadError::Gap {
                        expected: cursor.saturating_add(1),
                        first: last_seq.saturating_add(1),
                    })
                }
                Some("live") if owner => self.owner_absent = None,
                Some("live") => {
                    // The key also expires while Redis stalls (the owner cannot refresh it); the owner sets it
                    // again as soon as Redis answers, well within a heartbeat.
                    let since = *self.owner_absent.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.opts.heartbeat {
                        return Err(ReadError::Lost);
                    }
                }
                // Lost, or its keys expired or vanished.
                _ => return Err(ReadError::Lost),
            }
            // Woken by the follower when the stream has more, or after a heartbeat to look at the owner again
            // (sooner while it is missing).
            let woken = self.follower.wait(&self.keys.events, cursor);
            let recheck = if self.owner_absent.is_some() {
                self.opts.follow_block()
            } else {
                self.opts.heartbeat
            };
            let _ = tokio::time::timeout(recheck, woken).await;
        }
    }

    /// The stream's agent (stored with it when created, or learnt later by its owner).
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The stream's CORS answer (DESIGN 5.1), as its owner kept it.
    pub fn cors(&self) -> Option<&Grant> {
        self.cors.as_ref()
    }

    /// One read round trip, tried again while Redis does not answer, for up to `stall`.
    async fn query<T: redis::FromRedisValue>(&mut self, pipe: &Pipeline) -> Result<T, StoreError> {
        let mut since: Option<Instant> = None;
        loop {
            let result = round_trip(
                self.observer.as_ref(),
                StoreOp::Read,
                self.opts.op_timeout,
                pipe.query_async(&mut self.conn),
            )
            .await;
            match result {
                Err(e @ (StoreError::Redis { .. } | StoreError::Timeout { .. })) => {
                    if since.get_or_insert_with(Instant::now).elapsed() >= self.opts.stall {
                        return Err(e);
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                result => return result,
            }
        }
    }

    /// Marks this reader as the stream's primary (a reconnection): it reports its cursor every heartbeat (SET
    /// with an expiry of 3 heartbeats) until it is dropped, so the owner keeps the upstream and knows what was
    /// delivered.
    pub fn set_primary(&mut self) {
        if matches!(self.primary, Primary::No) {
            self.primary = Primary::Wanted;
            if tokio::runtime::Handle::try_current().is_ok() {
                self.start_report();
            }
        }
    }

    fn start_report(&mut self) {
        let (stop, mut stopped) = oneshot::channel::<()>();
        self.primary = Primary::Reporting { _stop: stop };
        let keys = self.keys.clone();
        let cursor = self.cursor.clone();
        let mut conn = self.conn.clone();
        let observer = self.observer.clone();
        let (every, limit, px) = (self.opts.heartbeat, self.opts.op_timeout, millis(self.opts.liveness()));
        tokio::spawn(async move {
            loop {
                let mut set = redis::cmd("SET");
                set.arg(&keys.primary)
                    .arg(cursor.load(Ordering::Acquire))
                    .arg("PX")
                    .arg(px);
                // A failed report only lets the report expire: the owner then treats the stream as in grace.
                let _ = round_trip(
                    observer.as_ref(),
                    StoreOp::Report,
                    limit,
                    set.query_async::<()>(&mut conn),
                )
                .await;
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
    }

    /// Joins entries that follow `cursor` without a hole into one `Bytes`, and moves the cursor.
    fn take(&mut self, cursor: u64, entries: Vec<(u64, Vec<u8>)>) -> Result<(Bytes, u64), ReadError> {
        let mut expected = cursor.saturating_add(1);
        let mut out = BytesMut::with_capacity(entries.iter().map(|(_, e)| e.len()).sum());
        for (seq, event) in entries {
            if seq != expected {
                return Err(ReadError::Gap { expected, first: seq });
            }
            out.extend_from_slice(&event);
            expected = seq.saturating_add(1);
        }
        let last = expected - 1;
        self.cursor.store(last, Ordering::Release);
        Ok((out.freeze(), last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_token_as_hash_tag() {
        let k = Keys::new("sse-gateway:", "00ff");
        assert_eq!(k.events, "sse-gateway:{00ff}:events");
        assert_eq!(k.meta, "sse-gateway:{00ff}:meta");
        assert_eq!(k.owner, "sse-gateway:{00ff}:owner");
        assert_eq!(k.primary, "sse-gateway:{00ff}:primary");
        assert_eq!(k.cancel, "sse-gateway:{00ff}:cancel");
    }

    #[test]
    fn entry_ids_round_trip() {
        for seq in [0, 1, 42, u64::MAX] {
            assert_eq!(parse_entry_id(entry_id(seq).as_bytes()), Some(seq));
        }
        assert_eq!(parse_entry_id(b"1-5"), None);
        assert_eq!(parse_entry_id(b"0-x"), None);
        assert_eq!(parse_entry_id(b"5"), None);
    }

    #[test]
    fn binding_hex_is_lowercase_and_64_digits() {
        let mut b = [0u8; 32];
        b[0] = 0xAB;
        b[31] = 0x01;
        let h = hex(&b);
        assert_eq!(h.len(), 64);
        assert!(h.starts_with("ab00"));
        assert!(h.ends_with("0001"));
    }

    #[test]
    fn same_compares_whole_strings() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(same(b"", b""));
    }

    #[test]
    fn event_ranges_split_a_frame() {
        assert_eq!(event_ranges(10, &[0, 4, 7]), Some(vec![0..4, 4..7, 7..10]));
        // Bytes before the first start belong to no event.
        let tail = event_ranges(10, &[2]).expect("valid");
        assert_eq!((tail.len(), tail.first().cloned()), (1, Some(2..10)));
        assert_eq!(event_ranges(10, &[]), Some(vec![]));
        // Not increasing, empty, or outside the frame.
        assert_eq!(event_ranges(10, &[0, 0]), None);
        assert_eq!(event_ranges(10, &[4, 2]), None);
        assert_eq!(event_ranges(10, &[10]), None);
        assert_eq!(event_ranges(10, &[0, 11]), None);
    }

    fn entry(seq: u64, data: &[u8]) -> Value {
        Value::Array(vec![
            Value::BulkString(entry_id(seq).into_bytes()),
            Value::Array(vec![Value::BulkString(b"e".to_vec()), Value::BulkString(data.to_vec())]),
        ])
    }

    #[test]
    fn xrange_replies_parse() {
        let v = Value::Array(vec![entry(1, b"a"), entry(2, b"bc")]);
        assert_eq!(
            parse_entries("read", v).unwrap(),
            vec![(1, b"a".to_vec()), (2, b"bc".to_vec())]
        );
        assert!(parse_entries("read", Value::Nil).unwrap().is_empty());
        assert!(parse_entries("read", Value::Int(3)).is_err());
        let no_event = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"0-1".to_vec()),
            Value::Array(vec![Value::BulkString(b"x".to_vec()), Value::BulkString(b"y".to_vec())]),
        ])]);
        assert!(parse_entries("read", no_event).is_err());
    }

    #[test]
    fn xread_replies_name_their_streams_in_resp2_and_resp3() {
        assert!(xread_keys(Value::Nil).is_empty());
        let entries = Value::Array(vec![entry(7, b"x")]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"k".to_vec()),
            entries.clone(),
        ])]);
        assert_eq!(xread_keys(resp2), vec![b"k".to_vec()]);
        let resp3 = Value::Map(vec![(Value::BulkString(b"k".to_vec()), entries)]);
        assert_eq!(xread_keys(resp3), vec![b"k".to_vec()]);
    }

    #[test]
    fn followers_are_chosen_by_key_within_range() {
        for n in 1..=4 {
            assert!(follower_of("sse-gateway:{00ff}:events", n) < n);
        }
        assert_eq!(follower_of("a", 3), follower_of("a", 3));
    }

    #[test]
    fn options_are_checked() {
        assert!(RedisOptions::default().validate().is_ok());
        // Each a default with one thing out of range (or two that contradict each other).
        let bad: [fn(&mut RedisOptions); 10] = [
            |o| o.max_events = 0,
            |o| o.queue = 0,
            |o| o.heartbeat = Duration::ZERO,
            |o| o.op_timeout = Duration::ZERO,
            |o| o.ttl = Duration::from_secs(2),
            |o| o.op_timeout = Duration::from_secs(2),
            |o| {
                o.max_total_bytes = 10;
                o.buffer_bytes = 11;
            },
            |o| o.max_readers = 0,
            |o| o.follow_connections = 0,
            |o| o.stall = Duration::from_millis(10),
        ];
        for change in bad {
            let mut o = RedisOptions::default();
            change(&mut o);
            assert!(matches!(o.validate(), Err(StoreError::Options(_))), "{o:?}");
        }
    }

    #[test]
    fn millis_is_never_zero() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }
}
