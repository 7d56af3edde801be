//! The store's handle ([`RedisStore`]): connects, registers and queues what the owner writes (the writer task
//! writes it), opens readers, and answers the one-shot questions (remote state, cancel, CORS, chats, listings).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Value};
use smallvec::SmallVec;
use std::time::Duration;
use tokio::sync::mpsc;

use crate::cors::Grant;

use super::error::{OpenError, StoreError};
use super::follower::{follower_of, Follower};
use super::keys::{binding_index, hex, same, unix_us, Keys, BINDING_INDEX_MAX, CORS_FIELD};
use super::options::{millis, RedisOptions};
use super::reader::{Primary, ReaderCount, RemoteReader};
use super::reply::parse_entries;
use super::slot::{fail, starts_fit, Op, Owned, Slot};
use super::trip::{round_trip, StoreObserver};
use super::writer::Writer;
use crate::resume::metrics::{End, StoreOp};

/// A stored CORS answer; one that does not parse (another version's) grants nothing.
fn parse_grant(stored: Option<String>) -> Option<Grant> {
    stored.and_then(|s| serde_json::from_str(&s).ok())
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

/// What another instance tells the owner of a stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteState {
    /// The cursor (last seq delivered) of a primary reader on another instance; `None` without a live report.
    pub primary_cursor: Option<u64>,
    /// Whether any instance asked to cancel the stream.
    pub cancelled: bool,
}

/// What the store's handles share.
pub(super) struct Shared {
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

/// A stream this instance writes, as `create` made it: the owner's handle for appending to it.
pub struct Mirrored(Arc<Slot>);

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
            next_sweep: None,
            run: Vec::new(),
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
    pub fn create(&self, token: &str, binding: [u8; 32], agent: &str) -> Mirrored {
        self.create_with_cors(token, binding, agent, None)
    }

    /// As `create`, keeping what the backend allowed the original request's origin (CORS), so every instance
    /// answers that origin alike.
    pub fn create_with_cors(&self, token: &str, binding: [u8; 32], agent: &str, cors: Option<&Grant>) -> Mirrored {
        let slot = Arc::new(Slot {
            keys: Keys::new(&self.shared.opts.key_prefix, token),
            pending: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            stored: Mutex::default(),
        });
        self.owned().insert(token.to_owned(), slot.clone());
        self.send(Op::Create {
            slot: slot.clone(),
            token: token.to_owned(),
            created_us: unix_us(),
            binding,
            agent: agent.to_owned(),
            cors: cors.and_then(|g| serde_json::to_string(g).ok()),
        });
        Mirrored(slot)
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
        self.append_to(&Mirrored(slot), first_seq, frame, starts)
    }

    /// As `append`, to the stream `create` returned `stream` for: no lookup of its token on the write path.
    pub fn append_to(&self, stream: &Mirrored, first_seq: u64, frame: Bytes, starts: &[u32]) -> bool {
        let slot = &stream.0;
        if slot.failed.load(Ordering::Acquire) {
            return false;
        }
        if starts.is_empty() {
            return true;
        }
        let valid = starts_fit(frame.len(), starts);
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
            self.give_up(slot.clone());
            return false;
        }
        self.send(Op::Append {
            slot: slot.clone(),
            first_seq,
            frame,
            starts: SmallVec::from_slice(starts),
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

    pub(super) fn check_binding(&self, stored: Option<String>, binding: &[u8; 32]) -> Result<(), OpenError> {
        match stored {
            None => Err(OpenError::Unknown),
            Some(stored) if same(stored.as_bytes(), hex(binding).as_bytes()) => Ok(()),
            Some(_) => Err(OpenError::Denied),
        }
    }

    pub(super) fn owned(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        // A panic while holding this lock leaves the map consistent (every critical section is one call).
        self.shared.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands an op to the writer; false (and the stream given up) if the writer is gone.
    pub(super) fn send(&self, op: Op) -> bool {
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
    pub(super) fn give_up(&self, slot: Arc<Slot>) {
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
pub(super) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    match getrandom::fill(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => unix_us() ^ (u64::from(std::process::id()) << 32),
    }
}
