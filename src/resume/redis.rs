//! The Redis/Valkey store of resumable streams: the owning instance mirrors each event to a Stream entry
//! `0-<seq>` through one batching writer task; any instance replays (`XRANGE`) and follows (blocking `XREAD`).
//!
//! Keys of one stream share the hash tag `{<token>}`, so a cluster keeps them on one slot:
//!
//! ```text
//! <prefix>{<token>}:events   Stream, one entry per event: id 0-<seq>, field "e" = the event's bytes
//! <prefix>{<token>}:meta     hash: binding (hex), state live|finished|lost, last_seq, end
//! <prefix>{<token>}:owner    the owner's liveness: SET PX 3 x heartbeat, refreshed every heartbeat
//! <prefix>{<token>}:primary  the cursor of a primary reader on another instance: SET PX 3 x heartbeat
//! <prefix>{<token>}:cancel   a cancel asked by any instance: SET PX ttl
//! ```
//!
//! Order is what makes reading safe without transactions. The writer sends one pipeline at a time on one
//! connection, so Redis applies a stream's commands in the order they were queued: its events before its
//! `state finished`, and `state finished` before the owner key is deleted. A reader asks for the owner key
//! first, then the meta hash, then the events, in one pipeline: `finished` seen means every event is there,
//! and an owner key gone while the state is still `live` means the owner died.
//!
//! A write that fails or a queue that overflows marks the stream not resumable for good: nothing more of it
//! is written (so no hole can appear in the middle of what is stored), its state becomes `lost` where Redis
//! still takes it, and its owner key is no longer refreshed. Readers get every stored event, then
//! [`ReadError::Lost`].

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, RedisError, Value};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

/// Frames taken into one writer round trip at most.
pub const MAX_BATCH_FRAMES: usize = 1024;
/// Event bytes taken into one writer round trip at most (a batch closes once it has reached this).
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// Events returned by one [`RemoteReader::next`] at most (one `XRANGE`/`XREAD` `COUNT`).
pub const READ_COUNT: usize = 256;
/// The longest blocking `XREAD` of a follower; the owner's liveness is checked again after each.
pub const FOLLOW_BLOCK: Duration = Duration::from_secs(1);
/// Liveness keys (owner, primary cursor) expire after this many heartbeats without a refresh.
pub const LIVENESS_HEARTBEATS: u32 = 3;
/// The field of a Stream entry that holds the event's bytes.
const EVENT_FIELD: &str = "e";

/// Settings of the Redis store.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// Prefix of every key; default `"sse-gateway:"`.
    pub key_prefix: String,
    /// `MAXLEN ~` of each stream's events; default 100,000.
    pub max_events: usize,
    /// Expiry of a stream's keys, refreshed on every write: grace + retention; default 330 s.
    pub ttl: Duration,
    /// How often the owner refreshes its liveness keys; they expire after 3 of these; default 1 s.
    pub heartbeat: Duration,
    /// Events queued and not yet written before a stream is dropped from the store; default 4096.
    pub queue: usize,
    /// Time limit of each Redis round trip (connecting included); default 1 s.
    pub op_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            key_prefix: "sse-gateway:".to_owned(),
            max_events: 100_000,
            ttl: Duration::from_secs(30 + 300),
            heartbeat: Duration::from_secs(1),
            queue: 4096,
            op_timeout: Duration::from_secs(1),
        }
    }
}

impl RedisOptions {
    /// Checks the settings, before anything connects.
    pub fn validate(&self) -> Result<(), StoreError> {
        let problem = if self.max_events == 0 {
            "max_events must be at least 1"
        } else if self.queue == 0 {
            "queue must be at least 1"
        } else if self.heartbeat < Duration::from_millis(10) {
            "heartbeat must be at least 10 ms"
        } else if self.op_timeout < Duration::from_millis(1) {
            "op_timeout must be at least 1 ms"
        } else if self.op_timeout.saturating_mul(2) > self.liveness() {
            // A refresh comes at most a heartbeat plus one round trip after the last one; the key lives 3.
            "op_timeout must be at most 1.5 heartbeats, or a slow round trip lets the owner key expire"
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

    /// The longest block of a follower's `XREAD`.
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

/// Told of every Redis round trip and of every stream that stops being resumable (for the metrics).
pub trait StoreObserver: Send + Sync {
    /// One round trip: its operation (`connect`, `write`, `open`, `read`, `follow`, `report`, `remote_state`,
    /// `cancel`), whether it succeeded, and how long it took (a `follow` includes its block).
    fn op(&self, op: &'static str, ok: bool, seconds: f64);
    /// A stream was marked not resumable through the store (queue overflow or failed write); once per stream.
    fn unresumable(&self);
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

/// The entries of an `XREAD` reply for one stream: `Nil` on a timeout, else `[[key, entries]]` (RESP2) or
/// `{key: entries}` (RESP3).
fn parse_xread(v: Value) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    const OP: &str = "follow";
    let streams: Vec<Value> = match v {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams,
        Value::Map(m) => m.into_iter().map(|(k, v)| Value::Array(vec![k, v])).collect(),
        _ => {
            return Err(StoreError::Reply {
                op: OP,
                what: "XREAD reply not an array".to_owned(),
            })
        }
    };
    let mut out = Vec::new();
    for s in streams {
        match s {
            Value::Array(mut kv) if kv.len() == 2 => out.extend(parse_entries(OP, kv.pop().unwrap_or(Value::Nil))?),
            _ => {
                return Err(StoreError::Reply {
                    op: OP,
                    what: "XREAD stream not [key, entries]".to_owned(),
                })
            }
        }
    }
    Ok(out)
}

/// Runs one round trip within `limit` and tells the observer.
async fn round_trip<T>(
    observer: &dyn StoreObserver,
    op: &'static str,
    limit: Duration,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(StoreError::Redis { op, source }),
        Err(_) => Err(StoreError::Timeout { op, after: limit }),
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
}

/// The streams this instance owns and has not finished: `append` looks them up, the heartbeat refreshes them.
type Owned = Arc<Mutex<HashMap<String, Arc<Slot>>>>;

/// What the writer task is asked to write.
enum Op {
    Create {
        slot: Arc<Slot>,
        binding: [u8; 32],
    },
    Append {
        slot: Arc<Slot>,
        first_seq: u64,
        frame: Bytes,
        starts: Vec<u32>,
    },
    Finish {
        slot: Arc<Slot>,
        last_seq: u64,
        how: End,
    },
    /// The stream failed: mark it `lost` and drop its owner key, so readers end at once.
    Lost {
        slot: Arc<Slot>,
    },
}

impl Op {
    fn bytes(&self) -> usize {
        match self {
            Op::Append { frame, .. } => frame.len(),
            _ => 0,
        }
    }
}

/// What the store's handles share.
struct Shared {
    opts: RedisOptions,
    observer: Arc<dyn StoreObserver>,
    client: Client,
    conn: ConnectionManager,
    owned: Owned,
    /// The writer's queue. Unbounded as a channel, bounded per stream by `queue` events (each stream's
    /// `pending`) plus its create, finish and lost ops.
    tx: mpsc::UnboundedSender<Op>,
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
        let conn = round_trip(observer.as_ref(), "connect", opts.op_timeout, connecting).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let owned: Owned = Arc::default();
        let writer = Writer {
            conn: conn.clone(),
            opts: opts.clone(),
            observer: observer.clone(),
            owned: owned.clone(),
            lost: Vec::new(),
        };
        tokio::spawn(writer.run(rx));
        Ok(Self {
            shared: Arc::new(Shared {
                opts,
                observer,
                client,
                conn,
                owned,
                tx,
            }),
        })
    }

    /// Registers a stream owned by this instance. Never blocks: the writer task writes its meta and owner
    /// key in its next round trip (other instances see the stream from then on).
    pub fn create(&self, token: &str, binding: [u8; 32]) {
        let slot = Arc::new(Slot {
            keys: Keys::new(&self.shared.opts.key_prefix, token),
            pending: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
        });
        self.owned().insert(token.to_owned(), slot.clone());
        self.send(Op::Create { slot, binding });
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
            "remote_state",
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
    /// matches. Errors: Unknown (no such stream, or expired), Denied, Gap (`after + 1` is older than the
    /// first stored event), Store.
    pub async fn open(&self, token: &str, binding: [u8; 32], after: Option<u64>) -> Result<RemoteReader, OpenError> {
        let keys = Keys::new(&self.shared.opts.key_prefix, token);
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(&keys.meta)
            .arg("binding")
            .arg("state")
            .arg("last_seq");
        pipe.cmd("XRANGE")
            .arg(&keys.events)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1);
        let mut conn = self.shared.conn.clone();
        let (meta, first): (Vec<Option<String>>, Value) = round_trip(
            self.shared.observer.as_ref(),
            "open",
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
            // Finished with events stored once but none now: the events key expired before the meta hash.
            None if finished && want <= last_seq => {
                return Err(OpenError::Gap {
                    first: last_seq.saturating_add(1),
                })
            }
            _ => {}
        }
        Ok(RemoteReader {
            keys: Arc::new(keys),
            conn,
            client: self.shared.client.clone(),
            follow: None,
            opts: self.shared.opts.clone(),
            observer: self.shared.observer.clone(),
            cursor: Arc::new(AtomicU64::new(after.unwrap_or(0))),
            done: false,
            primary: Primary::No,
        })
    }

    /// Any instance: asks the owner to cancel (binding checked as in open); the owner sees it in
    /// [`RedisStore::remote_state`].
    pub async fn cancel(&self, token: &str, binding: [u8; 32]) -> Result<(), OpenError> {
        let keys = Keys::new(&self.shared.opts.key_prefix, token);
        let mut conn = self.shared.conn.clone();
        let observer = self.shared.observer.as_ref();
        let limit = self.shared.opts.op_timeout;
        let stored: Option<String> = round_trip(
            observer,
            "cancel",
            limit,
            redis::cmd("HGET").arg(&keys.meta).arg("binding").query_async(&mut conn),
        )
        .await?;
        self.check_binding(stored, &binding)?;
        let ttl = millis(self.shared.opts.ttl);
        let mut set = redis::cmd("SET");
        set.arg(&keys.cancel).arg(1).arg("PX").arg(ttl);
        round_trip(observer, "cancel", limit, set.query_async::<()>(&mut conn)).await?;
        Ok(())
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
                let slot = match op {
                    Op::Create { slot, .. } | Op::Append { slot, .. } | Op::Finish { slot, .. } | Op::Lost { slot } => {
                        slot
                    }
                };
                if fail(&slot) {
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
            self.send(Op::Lost { slot });
        }
    }
}

/// Milliseconds of a duration, for `PX` and `PEXPIRE` (at least 1: 0 is not a valid expiry).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The one task that writes a store's streams: it takes what is queued (up to a batch), sends it as one
/// pipeline, waits for the answer, and repeats; every heartbeat the same pipeline refreshes the owner keys.
struct Writer {
    conn: ConnectionManager,
    opts: RedisOptions,
    observer: Arc<dyn StoreObserver>,
    owned: Owned,
    /// Streams that failed in the last round trip, to be marked lost in the next.
    lost: Vec<Arc<Slot>>,
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Op>) {
        let mut next_beat = tokio::time::Instant::now();
        let mut ops = Vec::new();
        loop {
            let beat = tokio::select! {
                biased;
                op = rx.recv() => match op {
                    Some(op) => {
                        ops.push(op);
                        tokio::time::Instant::now() >= next_beat
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(next_beat) => true,
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
            while ops.len() < MAX_BATCH_FRAMES && bytes < MAX_BATCH_BYTES {
                match rx.try_recv() {
                    Ok(op) => {
                        bytes += op.bytes();
                        ops.push(op);
                    }
                    Err(_) => break,
                }
            }
            self.round(&beating, &mut ops).await;
        }
        // The store is gone: what was queued has been written; the owner keys now expire.
        tracing::debug!("redis store: writer stopped");
    }

    /// One round trip: the heartbeat of `beating`, then `ops` in order.
    async fn round(&mut self, beating: &[Arc<Slot>], ops: &mut Vec<Op>) {
        let liveness = millis(self.opts.liveness());
        let ttl = millis(self.opts.ttl);
        let mut pipe = redis::pipe();
        let mut touched: Vec<Arc<Slot>> = Vec::new();
        let mut touch = |slot: &Arc<Slot>| {
            if !touched.iter().any(|t| Arc::ptr_eq(t, slot)) {
                touched.push(slot.clone());
            }
        };
        for slot in beating {
            pipe.cmd("SET")
                .arg(&slot.keys.owner)
                .arg(1)
                .arg("PX")
                .arg(liveness)
                .ignore();
        }
        for slot in self.lost.drain(..) {
            let k = &slot.keys;
            pipe.cmd("HSET").arg(&k.meta).arg("state").arg("lost").ignore();
            pipe.del(&k.owner).ignore();
            touch(&slot);
        }
        let mut appended: Vec<(Arc<Slot>, usize)> = Vec::new();
        for op in ops.drain(..) {
            match op {
                Op::Create { slot, binding } => {
                    let k = &slot.keys;
                    // The owner key first: a reader that finds the meta hash finds a live owner.
                    pipe.cmd("SET").arg(&k.owner).arg(1).arg("PX").arg(liveness).ignore();
                    pipe.cmd("HSET")
                        .arg(&k.meta)
                        .arg("binding")
                        .arg(hex(&binding))
                        .arg("state")
                        .arg("live")
                        .arg("last_seq")
                        .arg(0)
                        .ignore();
                    touch(&slot);
                }
                Op::Append {
                    slot,
                    first_seq,
                    frame,
                    starts,
                } => {
                    appended.push((slot.clone(), starts.len()));
                    if slot.failed.load(Ordering::Acquire) {
                        continue;
                    }
                    let ranges = event_ranges(frame.len(), &starts).unwrap_or_default();
                    for (seq, range) in (first_seq..).zip(ranges) {
                        pipe.cmd("XADD")
                            .arg(&slot.keys.events)
                            .arg("MAXLEN")
                            .arg("~")
                            .arg(self.opts.max_events)
                            .arg(entry_id(seq))
                            .arg(EVENT_FIELD)
                            .arg(&frame[range])
                            .ignore();
                    }
                    touch(&slot);
                }
                Op::Finish { slot, last_seq, how } => {
                    if slot.failed.load(Ordering::Acquire) {
                        continue;
                    }
                    let k = &slot.keys;
                    pipe.cmd("HSET")
                        .arg(&k.meta)
                        .arg("state")
                        .arg("finished")
                        .arg("last_seq")
                        .arg(last_seq)
                        .arg("end")
                        .arg(how.as_str())
                        .ignore();
                    pipe.del(&k.owner).ignore();
                    touch(&slot);
                }
                Op::Lost { slot } => {
                    let k = &slot.keys;
                    pipe.cmd("HSET").arg(&k.meta).arg("state").arg("lost").ignore();
                    pipe.del(&k.owner).ignore();
                    touch(&slot);
                }
            }
        }
        for slot in &touched {
            pipe.pexpire(&slot.keys.events, ttl as i64).ignore();
            pipe.pexpire(&slot.keys.meta, ttl as i64).ignore();
        }
        if !beating.is_empty() || !touched.is_empty() {
            let mut conn = self.conn.clone();
            let result = round_trip(
                self.observer.as_ref(),
                "write",
                self.opts.op_timeout,
                pipe.query_async::<()>(&mut conn),
            )
            .await;
            if let Err(e) = result {
                tracing::debug!(error = %e, "redis store: write failed; its streams are no longer resumable");
                for slot in touched.iter().chain(beating) {
                    if fail(slot) {
                        self.observer.unresumable();
                        self.lost.push(slot.clone());
                    }
                }
            }
        }
        for (slot, n) in appended {
            slot.pending.fetch_sub(n, Ordering::AcqRel);
        }
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
    client: Client,
    /// This reader's own connection for blocking `XREAD`, so that it blocks nobody else.
    follow: Option<MultiplexedConnection>,
    opts: RedisOptions,
    observer: Arc<dyn StoreObserver>,
    /// The seq of the last event returned (0: none), shared with the primary report.
    cursor: Arc<AtomicU64>,
    /// The finished stream's last event was returned.
    done: bool,
    primary: Primary,
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
    /// stored event when the owner died (or its stream failed) before the end: never a silent end. Follows a
    /// live stream with blocking `XREAD` on a connection of its own. Cancel-safe: the position moves only when
    /// events are returned.
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
            pipe.cmd("HMGET").arg(&self.keys.meta).arg("state").arg("last_seq");
            pipe.cmd("XRANGE")
                .arg(&self.keys.events)
                .arg(entry_id(cursor.saturating_add(1)))
                .arg("+")
                .arg("COUNT")
                .arg(READ_COUNT);
            let (owner, meta, entries): (bool, Vec<Option<String>>, Value) = round_trip(
                self.observer.as_ref(),
                "read",
                self.opts.op_timeout,
                pipe.query_async(&mut self.conn),
            )
            .await?;
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
                // Finished with events missing, lost, expired, or live without a live owner.
                Some("live") if owner => {}
                _ => return Err(ReadError::Lost),
            }
            let entries = self.follow(cursor).await?;
            if !entries.is_empty() {
                return self.take(cursor, entries).map(Some);
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
                let _ = round_trip(observer.as_ref(), "report", limit, set.query_async::<()>(&mut conn)).await;
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
    }

    /// Blocks on this reader's own connection until events after `cursor` arrive or the block ends.
    async fn follow(&mut self, cursor: u64) -> Result<Vec<(u64, Vec<u8>)>, ReadError> {
        let block = self.opts.follow_block();
        let limit = block.saturating_add(self.opts.op_timeout);
        let observer = self.observer.clone();
        let conn = match self.follow.as_mut() {
            Some(conn) => conn,
            None => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(self.opts.op_timeout)
                    .set_response_timeout(limit);
                let conn = round_trip(
                    observer.as_ref(),
                    "connect",
                    self.opts.op_timeout,
                    self.client.get_multiplexed_async_connection_with_config(&config),
                )
                .await?;
                self.follow.insert(conn)
            }
        };
        let mut xread = redis::cmd("XREAD");
        xread
            .arg("COUNT")
            .arg(READ_COUNT)
            .arg("BLOCK")
            .arg(millis(block))
            .arg("STREAMS")
            .arg(&self.keys.events)
            .arg(entry_id(cursor));
        let reply = round_trip(observer.as_ref(), "follow", limit, xread.query_async::<Value>(conn)).await;
        match reply {
            Ok(v) => Ok(parse_xread(v)?),
            Err(e) => {
                // The connection may still be blocked in the XREAD: start afresh next time.
                self.follow = None;
                Err(e.into())
            }
        }
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
    fn xread_replies_parse_in_resp2_and_resp3() {
        assert!(parse_xread(Value::Nil).unwrap().is_empty());
        let entries = Value::Array(vec![entry(7, b"x")]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"k".to_vec()),
            entries.clone(),
        ])]);
        assert_eq!(parse_xread(resp2).unwrap(), vec![(7, b"x".to_vec())]);
        let resp3 = Value::Map(vec![(Value::BulkString(b"k".to_vec()), entries)]);
        assert_eq!(parse_xread(resp3).unwrap(), vec![(7, b"x".to_vec())]);
    }

    #[test]
    fn options_are_checked() {
        assert!(RedisOptions::default().validate().is_ok());
        let bad = [
            RedisOptions {
                max_events: 0,
                ..Default::default()
            },
            RedisOptions {
                queue: 0,
                ..Default::default()
            },
            RedisOptions {
                heartbeat: Duration::ZERO,
                ..Default::default()
            },
            RedisOptions {
                op_timeout: Duration::ZERO,
                ..Default::default()
            },
            RedisOptions {
                ttl: Duration::from_secs(2),
                ..Default::default()
            },
            RedisOptions {
                op_timeout: Duration::from_secs(2),
                ..Default::default()
            },
        ];
        for o in bad {
            assert!(matches!(o.validate(), Err(StoreError::Options(_))), "{o:?}");
        }
    }

    #[test]
    fn millis_is_never_zero() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }
}
