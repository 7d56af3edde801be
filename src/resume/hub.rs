//! The in-process store of held streams: each stream's events (one copy, read by every subscriber at its own
//! cursor), who reads them, and its life (live → grace → retained → gone).
//!
//! ```text
//!            primary detaches                     grace_secs pass, DELETE, or the upstream ends
//!   Live ───────────────────────▶ Grace ──────────────────────────────────────▶ Retained ──▶ gone
//!     ▲  ◀───────────────────────── │    primary (a reconnection) attaches          retention_secs,
//!     └─────────────────────────────┘                                              or max_total_bytes
//! ```
//!
//! The writer is the original response body while its client is attached, then a task of its own (`pump`), so
//! the connected case costs no task and no wake-up. Events the primary (the original client, then whoever
//! resumed it) has not been sent are never evicted: when they fill `buffer_bytes`, the writer waits.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;

use super::id::{IdLine, Token};
use super::metrics::{End, Held, Limit, ResumeMetrics};
use super::redis::{unix_us, Mirrored, RedisStore};
use super::sessions::{Listed, Sessions};
use crate::cors::Grant;
use crate::envelope::write_gateway_error;

/// The bounds and times of held streams (`resume.*`).
#[derive(Debug, Clone)]
pub struct Limits {
    pub buffer_bytes: usize,
    pub max_total_bytes: usize,
    pub grace: Duration,
    pub retention: Duration,
    pub retry_ms: u64,
    /// Streams in grace over all bindings (`resume.max_grace_streams`): past it the oldest is given up.
    pub max_grace_streams: usize,
    /// Streams in grace per binding (`resume.max_grace_streams_per_binding`): past it that binding's oldest is
    /// given up.
    pub max_grace_per_binding: usize,
    /// Watchers (non-primary subscribers) per stream (`resume.max_watchers_per_stream`).
    pub max_watchers: usize,
    /// How long a watcher's client may leave an event frame unread (`resume.watcher_write_timeout_secs`).
    pub watcher_write_timeout: Duration,
    /// Starts queued for a session that does not take them; past it the oldest go (`resume.session_queue`).
    pub session_queue: usize,
}

impl Limits {
    /// The documented defaults of `resume.*` (config/default.toml).
    pub fn defaults() -> Self {
        Self {
            buffer_bytes: 1 << 20,
            max_total_bytes: 256 << 20,
            grace: Duration::from_secs(30),
            retention: Duration::from_secs(300),
            retry_ms: 1000,
            max_grace_streams: 256,
            max_grace_per_binding: 32,
            max_watchers: 16,
            watcher_write_timeout: Duration::from_secs(30),
            session_queue: 64,
        }
    }
}

/// Held events are written into blocks, each shared by the frames written to it, so that an event keeps its
/// bytes allocated and not the translator's spare room, and a stream grows its memory by blocks rather than by
/// frames. A stream's first block is this large (or its first frame's size); each next one is twice the last,
/// up to `MAX_BLOCK` (a larger frame gets a block of its own size). What is counted (`held_bytes`) is the events'
/// bytes, and a block's unused tail once no more events go to it; a block whose first events were evicted stays
/// allocated until its last one is, so a stream holds up to two blocks more than it counts.
const FIRST_BLOCK: usize = 512;
const MAX_BLOCK: usize = 64 << 10;
/// Events of one frame whose offsets `push` keeps on the stack (more take an allocation).
const INLINE_EVENTS: usize = 16;

/// Most bytes a subscriber's catching-up frame gathers from held events.
const CATCH_UP_FRAME: usize = 64 << 10;

/// What every held stream shares with the hub.
struct Shared {
    limits: Limits,
    /// Its `held_bytes` gauge is also the hub's count of bytes held over all streams (one atomic per frame).
    metrics: Arc<ResumeMetrics>,
    /// Where events are mirrored for other instances (`resume.store = "redis"`).
    mirror: Option<RedisStore>,
    /// `retry: <retry_ms>\n`, written after the first event's id.
    retry_line: Vec<u8>,
    /// Writers with no primary attached waiting for the hub's total to fall under `max_total_bytes`.
    room: Mutex<Vec<Weak<Stream>>>,
    /// Set while `room` lists a writer: only then does freeing bytes take its lock.
    room_wanted: AtomicBool,
    /// The streams in grace, oldest first, for the caps on them.
    grace: Mutex<GraceIndex>,
}

impl Shared {
    /// Bytes held over all streams.
    fn total(&self) -> usize {
        self.metrics.held_bytes.get().max(0) as usize
    }

    /// Whether a writer nobody reads may hold more (see `Stream::writer_check`).
    fn has_room(&self) -> bool {
        self.total() < self.limits.max_total_bytes
    }

    /// Wakes the writers waiting for room, if there is room. Called wherever bytes are freed, so it costs one
    /// atomic load when nobody waits (no fence on that path: a wake-up lost to a race between a waiter listing
    /// itself and bytes freed meanwhile is made up by the sweeper within a second, see `Hub::sweep`).
    fn wake_room(&self) {
        if !self.room_wanted.load(Ordering::Acquire) || !self.has_room() {
            return;
        }
        let waiting = {
            let mut room = lock(&self.room);
            self.room_wanted.store(false, Ordering::Relaxed);
            std::mem::take(&mut *room)
        };
        for s in waiting.iter().filter_map(Weak::upgrade) {
            s.room_listed.store(false, Ordering::Release);
            s.writer.wake();
        }
    }

    /// Gives up the oldest streams in grace past the caps, `binding`'s first (after a stream of it entered grace).
    fn enforce_grace_caps(&self, binding: &[u8; 32]) {
        let victims = lock(&self.grace).over_caps(binding, &self.limits);
        for (s, why) in victims.into_iter().filter_map(|(w, why)| Some((w.upgrade()?, why))) {
            s.give_up(why);
        }
    }
}

/// The streams in grace in the order they entered it, over all and per binding (the bindings' counts bound one
/// client's share of the upstream slots streams in grace keep).
#[derive(Default)]
struct GraceIndex {
    next: u64,
    order: BTreeMap<u64, (Weak<Stream>, [u8; 32])>,
    by_binding: HashMap<[u8; 32], BTreeSet<u64>>,
}

impl GraceIndex {
    fn enter(&mut self, stream: Weak<Stream>, binding: [u8; 32]) -> u64 {
        let entry = self.next;
        self.next += 1;
        self.order.insert(entry, (stream, binding));
        self.by_binding.entry(binding).or_default().insert(entry);
        entry
    }

    fn leave(&mut self, entry: u64) -> Option<Weak<Stream>> {
        let (stream, binding) = self.order.remove(&entry)?;
        if let Some(set) = self.by_binding.get_mut(&binding) {
            set.remove(&entry);
            if set.is_empty() {
                self.by_binding.remove(&binding);
            }
        }
        Some(stream)
    }

    /// Takes out the streams past the caps (oldest first): `binding`'s, then any.
    fn over_caps(&mut self, binding: &[u8; 32], limits: &Limits) -> Vec<(Weak<Stream>, Limit)> {
        let mut out = Vec::new();
        while let Some(&oldest) = self
            .by_binding
            .get(binding)
            .filter(|set| set.len() > limits.max_grace_per_binding)
            .and_then(BTreeSet::first)
        {
            out.extend(self.leave(oldest).map(|w| (w, Limit::GracePerBinding)));
        }
        while self.order.len() > limits.max_grace_streams {
            let Some((&oldest, _)) = self.order.first_key_value() else {
                break;
            };
            out.extend(self.leave(oldest).map(|w| (w, Limit::GraceStreams)));
        }
        out
    }
}

/// Every held stream of this process, by token, and the sessions told of each new one.
pub struct Hub {
    streams: Mutex<HashMap<Token, Arc<Stream>>>,
    shared: Arc<Shared>,
    sessions: Sessions,
}

impl Hub {
    /// With a mirror, needs a tokio runtime (the sessions' announcements task).
    pub fn new(limits: Limits, metrics: Arc<ResumeMetrics>, mirror: Option<RedisStore>) -> Self {
        Self {
            sessions: Sessions::new(limits.session_queue, Arc::clone(&metrics), mirror.as_ref()),
            streams: Mutex::new(HashMap::new()),
            shared: Arc::new(Shared {
                retry_line: format!("retry: {}\n", limits.retry_ms).into_bytes(),
                limits,
                metrics,
                mirror,
                room: Mutex::new(Vec::new()),
                room_wanted: AtomicBool::new(false),
                grace: Mutex::new(GraceIndex::default()),
            }),
        }
    }

    pub fn mirror(&self) -> Option<&RedisStore> {
        self.shared.mirror.as_ref()
    }

    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// The streams of `binding` held here, the newest `limit`, oldest first, each with when it was created (µs
    /// since the Unix epoch).
    pub fn list(&self, binding: &[u8; 32], limit: usize) -> Vec<(u64, Listed)> {
        let mut out: Vec<(u64, Listed)> = lock(&self.streams)
            .values()
            .filter(|s| s.binding == *binding)
            .map(|s| {
                let listed = Listed {
                    token: s.token,
                    ended: s.has_ended(),
                };
                (s.created_us, listed)
            })
            .collect();
        out.sort_unstable_by_key(|(at, l)| (*at, l.token.hex()));
        out.drain(..out.len().saturating_sub(limit));
        out
    }

    /// A new live stream whose first writer, the original response body, is its primary. `None` if the OS has
    /// no randomness to name it with (the stream is then not resumable).
    pub fn create(&self, binding: [u8; 32], agent: &str) -> Option<Arc<Stream>> {
        self.create_with_cors(binding, agent, None)
    }

    /// As `create`, keeping what the backend allowed the original request's origin (CORS).
    pub fn create_with_cors(&self, binding: [u8; 32], agent: &str, cors: Option<Arc<Grant>>) -> Option<Arc<Stream>> {
        let token = Token::random()?;
        let now = Instant::now();
        let hex = token.hex();
        let mirrored = (self.shared.mirror.as_ref()).map(|m| m.create_with_cors(&hex, binding, agent, cors.as_deref()));
        let stream = Arc::new_cyclic(|me| Stream {
            token,
            hex,
            mirrored,
            binding,
            created_us: unix_us(),
            me: me.clone(),
            cors,
            shared: Arc::clone(&self.shared),
            writer: AtomicWaker::new(),
            slow: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            room_listed: AtomicBool::new(false),
            state: Mutex::new(State {
                agent: agent.to_owned(),
                events: VecDeque::new(),
                first: 1,
                next: 1,
                bytes: 0,
                delivered: 1,
                primary: Some(0),
                original: true,
                generations: 1,
                away_since: now,
                phase: Held::Live,
                end: None,
                ended_at: now,
                readers: Vec::new(),
                cursors: 0,
                watchers: 0,
                grace_entry: None,
                id_line: IdLine::new(&token, 1),
                block: BytesMut::new(),
                block_cap: 0,
                mirrored: self.shared.mirror.is_some(),
            }),
        });
        self.shared.metrics.held(Held::Live).inc();
        lock(&self.streams).insert(token, Arc::clone(&stream));
        // After it is in the map: a session opening now lists it, or is told of it (it registers, then lists).
        self.sessions.announce(binding, token);
        Some(stream)
    }

    pub fn get(&self, token: &Token) -> Option<Arc<Stream>> {
        lock(&self.streams).get(token).cloned()
    }

    /// Forgets ended streams past their retention, then the oldest ended ones while all streams together hold
    /// more than `max_total_bytes`. Returns how many were forgotten.
    pub fn sweep(&self, now: Instant) -> usize {
        let limits = &self.shared.limits;
        let mut streams = lock(&self.streams);
        let before = streams.len();
        streams.retain(|_, s| match s.ended_at() {
            Some(at) if now.saturating_duration_since(at) >= limits.retention => {
                s.forget();
                false
            }
            _ => true,
        });
        if self.shared.total() > limits.max_total_bytes {
            let mut ended: Vec<(Instant, Token)> = streams
                .iter()
                .filter_map(|(t, s)| s.ended_at().map(|at| (at, *t)))
                .collect();
            ended.sort_unstable_by_key(|(at, _)| *at);
            for (_, token) in ended {
                if self.shared.total() <= limits.max_total_bytes {
                    break;
                }
                if let Some(s) = streams.remove(&token) {
                    s.forget();
                }
            }
        }
        // Still over with live streams only: they give up the events their attached client was sent, down to
        // `LIVE_FLOOR` each (a reconnect after losing more than that in flight then gets `resume_gap`).
        if self.shared.total() > limits.max_total_bytes {
            for s in streams.values() {
                if self.shared.total() <= limits.max_total_bytes {
                    break;
                }
                s.trim_delivered(LIVE_FLOOR);
            }
        }
        let gone = before - streams.len();
        drop(streams);
        // Writers waiting for room are woken as bytes are freed; this catches any wake-up lost to a race.
        fence(Ordering::SeqCst);
        self.shared.wake_room();
        gone
    }
}

/// What a live stream keeps of the events its client was sent when all streams together hold more than
/// `resume.max_total_bytes`.
pub const LIVE_FLOOR: usize = 64 << 10;

/// One held stream: its events and who reads them.
pub struct Stream {
    pub token: Token,
    /// The token in hex: the stream's name in the mirror.
    pub hex: String,
    /// Its handle in the mirror, if there is one.
    mirrored: Option<Mirrored>,
    /// Keyed hash of the bound request headers of the original request.
    pub binding: [u8; 32],
    /// When it was created, in µs since the Unix epoch (a session's listing merges these with other instances').
    created_us: u64,
    /// This stream, for the hub's lists of streams waiting for room and in grace.
    me: Weak<Stream>,
    /// What the backend allowed the original request's origin (CORS), for the answers about this stream.
    pub cors: Option<Arc<Grant>>,
    shared: Arc<Shared>,
    state: Mutex<State>,
    /// The writer waiting for room, a primary, or a cancel (registered without the lock, and without a clone
    /// when it is the same task).
    writer: AtomicWaker,
    /// Set while the original body, writing inline, must check the state before each read (it is not the
    /// primary, or a cancel came); clear, it reads on without taking the lock.
    slow: AtomicBool,
    /// A cancel (`DELETE`) came: the writer ends the run at its next check.
    cancelled: AtomicBool,
    /// The writer is listed in the hub's `room` (so it is listed once however often it waits).
    room_listed: AtomicBool,
}

struct State {
    /// The stream's agent, for the envelopes the gateway writes into it or about it: the request's fallback
    /// until the run names its own (`Stream::set_agent`).
    agent: String,
    /// Whole events, each with its `id:` line; `events[0]` is event `first`.
    events: VecDeque<HeldEvent>,
    first: u64,
    /// The seq the next event gets.
    next: u64,
    bytes: usize,
    /// Events before this one were sent to the primary: only those may be evicted.
    delivered: u64,
    /// The generation of the attached primary; `None`: nobody attached since `away_since` (grace).
    primary: Option<u64>,
    /// The original response body still writes to its client (it may have lost the primary to a reconnection).
    original: bool,
    generations: u64,
    away_since: Instant,
    phase: Held,
    end: Option<End>,
    ended_at: Instant,
    /// Subscribers waiting for events, by cursor id: one entry per cursor, removed when it detaches (a silent
    /// stream would otherwise keep every departed watcher's waker until its next event).
    readers: Vec<(u64, Waker)>,
    /// Cursor ids given so far.
    cursors: u64,
    /// Watchers attached (subscribers that are not a primary).
    watchers: usize,
    /// Its place in the hub's `GraceIndex` while in grace.
    grace_entry: Option<u64>,
    /// The `id:` line of event `next`, counted up with it (an event's id is one copy, nothing formatted).
    id_line: IdLine,
    /// Where the next events are written: the rest of the last block (see `FIRST_BLOCK`).
    block: BytesMut,
    /// The capacity the last block was made with.
    block_cap: usize,
    /// Events still go to the mirror (false once it fell behind or failed: the stream is then resumable only
    /// here).
    mirrored: bool,
}

impl State {
    /// Writes an event into the block: `lines` (its lines, each with its newline), its id line, `retry` (the
    /// first event's `retry:` line, else empty), the blank line; the id line becomes the next event's.
    fn put_event(&mut self, lines: &[u8], retry: &[u8]) {
        self.block.extend_from_slice(lines);
        self.block.extend_from_slice(self.id_line.as_bytes());
        if !retry.is_empty() {
            self.block.extend_from_slice(retry);
        }
        self.block.extend_from_slice(b"\n");
        self.id_line.increment();
    }
}

/// What the writer should do next (`Stream::writer_check`).
#[derive(Debug, PartialEq, Eq)]
pub enum Go {
    /// Read the upstream.
    Read,
    /// No room: the waker is woken when there is.
    Wait,
    /// End the run now: the stream has ended (with its `error` envelope, given here, when it ends it now).
    Stop(End, Bytes),
}

/// A subscriber's place in a stream.
#[derive(Debug)]
pub struct Cursor {
    /// Its key among the stream's waiting readers.
    id: u64,
    /// The seq of the next event to send.
    next: u64,
    /// Set for a primary (the original's reconnection): its generation.
    generation: Option<u64>,
    pub replay_until: u64,
}

impl Cursor {
    /// A reconnection (the original's primary), not a watcher.
    pub fn is_primary(&self) -> bool {
        self.generation.is_some()
    }
}

/// One held event and the bytes it keeps allocated: its own, and the unused tail of its block if it is the
/// block's last.
struct HeldEvent {
    event: Bytes,
    charge: usize,
}

/// What a subscriber reads next.
pub enum Read {
    /// Whole events: their bytes, how many, and whether they were held before the subscriber attached
    /// (replayed).
    Events(Bytes, u64, bool),
    /// The subscriber's position was evicted (only a watcher can fall behind).
    Behind,
    /// Nothing more: the stream ended.
    End,
}

/// Why a subscriber could not attach.
#[derive(Debug, PartialEq, Eq)]
pub enum AttachError {
    /// The position asked for is no longer held.
    Gap,
    /// The position asked for has not been written yet (not an id we sent).
    Unknown,
    /// A watcher, and the stream has `max_watchers_per_stream` of them.
    Full,
}

impl Stream {
    /// The stream's agent: the run's own once its translator named it (`set_agent`), else the request's.
    pub fn agent(&self) -> String {
        self.state().agent.clone()
    }

    /// The run named its agent (the translator's root agent): every envelope the gateway writes into or about
    /// the stream names it from now on. Called by the writer only when it changes.
    pub fn set_agent(&self, agent: &str) {
        let mut st = self.state();
        if st.agent != agent {
            st.agent = agent.to_owned();
            // Readers on other instances name it too.
            if let (true, Some(m)) = (st.mirrored, &self.shared.mirror) {
                m.set_agent(&self.hex, agent);
            }
        }
    }

    /// The bounds of the hub holding it.
    pub fn limits(&self) -> &Limits {
        &self.shared.limits
    }

    /// `sg1-<token>-`: what the stream's ids start with.
    pub fn stem(&self) -> String {
        format!("{}{}-", super::id::PREFIX, self.hex)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn ended_at(&self) -> Option<Instant> {
        let st = self.state();
        st.end.map(|_| st.ended_at)
    }

    /// Before the writer reads the upstream: whether it may.
    pub fn writer_check(&self, now: Instant, cx: &mut Context<'_>) -> Go {
        let mut st = self.state();
        if let Some(how) = st.end {
            return Go::Stop(how, Bytes::new());
        }
        let stop = if self.cancelled.load(Ordering::Acquire) {
            Some((End::Cancelled, "stream_cancelled", CANCELLED))
        } else if st.primary.is_none() && now.saturating_duration_since(st.away_since) >= self.shared.limits.grace {
            Some((End::Abandoned, "stream_abandoned", ABANDONED))
        } else {
            None
        };
        if let Some((how, kind, message)) = stop {
            return Go::Stop(how, self.stop(&mut st, how, kind, message));
        }
        // Nobody reads it here, so nothing it holds can go: it holds more only while all streams together hold
        // less than `max_total_bytes` (each at most a frame past it), and waits for room otherwise.
        if st.primary.is_none() && !self.shared.has_room() {
            self.writer.register(cx.waker());
            if self.wait_for_room() {
                return Go::Wait;
            }
        }
        // Room, or the oldest event was delivered and may go (only while a primary is attached: see `evict`).
        if st.bytes < self.shared.limits.buffer_bytes || (st.primary.is_some() && st.first < st.delivered) {
            return Go::Read;
        }
        self.writer.register(cx.waker());
        Go::Wait
    }

    /// Lists the writer (registered) to be woken when the hub's total falls under `max_total_bytes`; false
    /// when it already has (read on).
    fn wait_for_room(&self) -> bool {
        if !self.room_listed.swap(true, Ordering::AcqRel) {
            self.shared.metrics.limited(Limit::TotalBytes);
            lock(&self.shared.room).push(self.me.clone());
        }
        self.shared.room_wanted.store(true, Ordering::Release);
        // Bytes freed before the flag was seen: read on rather than wait for the sweeper.
        fence(Ordering::SeqCst);
        !self.shared.has_room()
    }

    /// Ends the run with the `error` envelope that says why; returns it as held (with its id).
    fn stop(&self, st: &mut State, how: End, kind: &str, message: &str) -> Bytes {
        let out = self.push(st, &gateway_error(&st.agent, kind, message));
        self.end(st, how);
        wake_all(&mut st.readers);
        out
    }

    /// The upstream is dropped mid-run without a pump to read it (no grace period, or no runtime left): the run
    /// ends now, its readers told so by a `stream_abandoned` envelope.
    pub fn abandon(&self) {
        let mut st = self.state();
        if st.end.is_none() {
            self.stop(&mut st, End::Abandoned, "stream_abandoned", ABANDONED);
        }
    }

    /// A cap on streams in grace (`why`) gives this one up: ended as abandoned, its writer woken to drop the
    /// upstream (unless a reconnection came meanwhile).
    fn give_up(&self, why: Limit) {
        let mut st = self.state();
        if st.primary.is_some() || st.end.is_some() {
            return;
        }
        self.shared.metrics.limited(why);
        self.stop(&mut st, End::Abandoned, "stream_abandoned", GRACE_FULL);
        drop(st);
        self.writer.wake();
    }

    /// Registers the writer to be woken by a reconnection, a detach or a cancel while the upstream has nothing;
    /// false when a cancel came meanwhile (check again).
    pub fn writer_waits(&self, cx: &mut Context<'_>) -> bool {
        self.writer.register(cx.waker());
        // After the registration: a cancel before it is seen here, one after it wakes the writer.
        !self.cancelled.load(Ordering::Acquire)
    }

    /// Whether the original body, writing inline, must call `writer_check` before reading (it is no longer the
    /// primary, or a cancel came); while it is the primary it always has room and reads on without the lock.
    pub fn must_check(&self) -> bool {
        self.slow.load(Ordering::Acquire)
    }

    /// Keeps `slow` in step with the state: the original body is the primary and nothing was cancelled.
    fn update_slow(&self, st: &State) {
        let cancelled = self.cancelled.load(Ordering::Acquire);
        self.slow.store(cancelled || st.primary != Some(0), Ordering::Release);
    }

    /// Readers attached now: the primary (the client, or its reconnection) and the watchers.
    pub fn readers(&self) -> usize {
        let st = self.state();
        st.watchers + usize::from(st.primary.is_some())
    }

    /// When the grace period of a stream nobody reads ends (`None` while a primary is attached).
    pub fn grace_deadline(&self) -> Option<Instant> {
        let st = self.state();
        match (st.primary, st.end) {
            (None, None) => Some(st.away_since + self.shared.limits.grace),
            _ => None,
        }
    }

    /// Appends the events of a translated frame (`data:` events without ids): gives each its id, holds them and
    /// returns them as the client gets them (copied: `frame` may be a buffer its writer reuses).
    pub fn append(&self, frame: &[u8]) -> Bytes {
        let mut st = self.state();
        let out = self.push(&mut st, frame);
        self.evict(&mut st);
        if st.readers.is_empty() {
            return out;
        }
        // Woken once the lock is let go: a reader on another thread woken under it would find it taken and spin.
        let woken: SmallVec<[Waker; 4]> = st.readers.drain(..).map(|(_, w)| w).collect();
        drop(st);
        woken.into_iter().for_each(Waker::wake);
        out
    }

    /// The stream's end: `last` (the translator's last events, maybe none) is held, and the run is over.
    pub fn finish(&self, last: &[u8], how: End) -> Bytes {
        let mut st = self.state();
        let out = self.push(&mut st, last);
        self.end(&mut st, how);
        wake_all(&mut st.readers);
        out
    }

    /// Asks the writer to end the run at once (`DELETE`).
    pub fn cancel(&self) {
        let st = self.state();
        self.cancelled.store(true, Ordering::Release);
        self.update_slow(&st);
        self.writer.wake();
    }

    /// Whether the run has ended.
    pub fn has_ended(&self) -> bool {
        self.state().end.is_some()
    }

    /// A primary reading on another instance reported its cursor (the last event it got): the run is not
    /// abandoned, and what it got may be evicted here.
    pub fn remote_primary(&self, cursor: u64) {
        let mut st = self.state();
        if st.primary.is_none() {
            st.away_since = Instant::now();
            // Read elsewhere: not the longest waiting for a reconnection, whatever the caps on grace give up.
            if let Some(entry) = st.grace_entry.take() {
                let mut index = lock(&self.shared.grace);
                index.leave(entry);
                st.grace_entry = Some(index.enter(self.me.clone(), self.binding));
            }
        }
        st.delivered = st.delivered.max(cursor.saturating_add(1).min(st.next));
        // It reads from the store, which holds them: what it got may go here, so the writer has room again
        // (`evict` keeps delivered events while no primary is attached here).
        let half = self.shared.limits.buffer_bytes / 2;
        self.evict_to(&mut st, half, cursor.saturating_add(1));
        self.writer.wake();
    }

    /// The original body's client went away: the grace period starts (if it was still the primary).
    pub fn original_gone(&self) {
        self.state().original = false;
        self.detach_primary(0);
    }

    /// Attaches a subscriber after event `after` (0: from the start). A primary (a reconnection) takes over
    /// from any earlier one and ends the grace period.
    pub fn attach(&self, after: u64, primary: bool) -> Result<Cursor, AttachError> {
        let mut st = self.state();
        if after >= st.next {
            return Err(AttachError::Unknown);
        }
        if after + 1 < st.first {
            return Err(AttachError::Gap);
        }
        if !primary {
            if st.watchers >= self.shared.limits.max_watchers {
                return Err(AttachError::Full);
            }
            st.watchers += 1;
        }
        let generation = primary.then(|| {
            let g = st.generations;
            st.generations += 1;
            st.primary = Some(g);
            self.update_slow(&st);
            // What it says it has was delivered (it may say less than we sent: those are kept).
            st.delivered = after + 1;
            if st.end.is_none() {
                self.set_phase(&mut st, Held::Live);
            }
            self.writer.wake();
            g
        });
        self.shared.metrics.subscribers.inc();
        st.cursors += 1;
        Ok(Cursor {
            id: st.cursors,
            next: after + 1,
            generation,
            replay_until: st.next,
        })
    }

    /// A subscriber goes away.
    pub fn detach(&self, cursor: &Cursor) {
        self.shared.metrics.subscribers.dec();
        {
            let mut st = self.state();
            st.readers.retain(|(id, _)| *id != cursor.id);
            if cursor.generation.is_none() {
                st.watchers = st.watchers.saturating_sub(1);
            }
        }
        if let Some(g) = cursor.generation {
            self.detach_primary(g);
        }
    }

    fn detach_primary(&self, generation: u64) {
        let mut st = self.state();
        if st.primary != Some(generation) {
            return;
        }
        let was_in_grace = st.grace_entry.is_some();
        if generation != 0 && st.original {
            // A reconnection leaves while the original client still reads: the original is the primary again
            // (it was sent every event), rather than nobody, whose writer would wait for room with no grace timer.
            st.primary = Some(0);
            st.delivered = st.next;
        } else {
            st.primary = None;
            st.away_since = Instant::now();
            if st.end.is_none() {
                self.set_phase(&mut st, Held::Grace);
            }
        }
        self.update_slow(&st);
        let entered_grace = !was_in_grace && st.grace_entry.is_some();
        drop(st);
        self.writer.wake();
        // Outside the stream's lock: giving up another stream takes its lock.
        if entered_grace {
            self.shared.enforce_grace_caps(&self.binding);
        }
    }

    /// The subscriber's next events, or `Pending` with its waker registered.
    pub fn poll_read(&self, cursor: &mut Cursor, cx: &mut Context<'_>) -> Poll<Read> {
        let mut st = self.state();
        if cursor.next < st.first {
            return Poll::Ready(Read::Behind);
        }
        let at = (cursor.next - st.first) as usize;
        if at >= st.events.len() {
            if st.end.is_some() {
                return Poll::Ready(Read::End);
            }
            match st.readers.iter_mut().find(|(id, _)| *id == cursor.id) {
                Some((_, w)) => w.clone_from(cx.waker()),
                None => st.readers.push((cursor.id, cx.waker().clone())),
            }
            return Poll::Pending;
        }
        let replayed = cursor.next < cursor.replay_until;
        let mut taken = 1;
        let bytes = if at + 1 == st.events.len() {
            st.events[at].event.clone()
        } else {
            let mut out = Vec::new();
            taken = 0;
            for e in st.events.range(at..).map(|h| &h.event) {
                if taken > 0 && out.len() + e.len() > CATCH_UP_FRAME {
                    break;
                }
                out.extend_from_slice(e);
                taken += 1;
            }
            Bytes::from(out)
        };
        cursor.next += taken as u64;
        let primary = cursor.generation.is_some() && cursor.generation == st.primary;
        if primary {
            st.delivered = st.delivered.max(cursor.next);
        }
        drop(st);
        // After the lock, as `append` wakes its readers: the writer, on another thread, takes it at once.
        if primary {
            self.writer.wake();
        }
        Poll::Ready(Read::Events(bytes, taken as u64, replayed))
    }

    /// Gives each event of `frame` its id (and the first its `retry:`) and holds them; its caller wakes the readers.
    fn push(&self, st: &mut State, frame: &[u8]) -> Bytes {
        if frame.is_empty() {
            return Bytes::new();
        }
        // Each event becomes its data line(s), its id line (the first event's `retry:` too), the blank line: the
        // id after the data, since fetch-event-source takes an id as the stream's position as soon as it reads
        // it, so an id first would let a cut between it and the data lose the event. A whole event loses its
        // blank line (one newline stays); a tail (a frame that does not end with a whole event) keeps what it
        // has and gets a newline if it has none.
        let first = st.next;
        let first_end = blank_line_end(frame);
        let (out, count) = if first_end == Some(frame.len()) {
            // One whole event, the usual frame: no list of where events end.
            let retry = self.retry_of(first);
            self.block_for(st, frame.len() + st.id_line.as_bytes().len() + retry.len());
            st.put_event(&frame[..frame.len() - 1], retry);
            let out = st.block.split().freeze();
            self.mirror(st, first, &out, &[0]);
            st.events.push_back(HeldEvent {
                charge: out.len(),
                event: out.clone(),
            });
            (out, 1)
        } else {
            self.push_many(st, frame, first_end)
        };
        st.next += count;
        debug_assert_eq!(st.id_line.as_bytes(), IdLine::new(&self.token, st.next).as_bytes());
        st.bytes += out.len();
        self.shared.metrics.held_bytes.add(out.len() as i64);
        // While the original body writes to its client, what it holds is what it sends.
        if st.primary == Some(0) {
            st.delivered = st.next;
        }
        out
    }

    /// `push` for a frame of several events, or with a tail (`first_end`: where its first event ends, if it
    /// does): the frame as held, and how many events it has.
    fn push_many(&self, st: &mut State, frame: &[u8], first_end: Option<usize>) -> (Bytes, u64) {
        let tail = !frame.ends_with(b"\n\n");
        let tail_newline = usize::from(!frame.ends_with(b"\n"));
        // Where each event ends, past its blank line, and the bytes they take held.
        let mut ends = SmallVec::<[u32; INLINE_EVENTS]>::new();
        let mut size = if tail { 1 + tail_newline } else { 0 };
        let (mut from, mut end, mut seq) = (0, first_end, st.next);
        while from < frame.len() {
            let to = end.unwrap_or(frame.len());
            ends.push(to as u32);
            size += to - from + st.id_line.len_of(seq) + self.retry_of(seq).len();
            (from, seq) = (to, seq + 1);
            end = blank_line_end(&frame[from..]).map(|e| from + e);
        }
        let count = ends.len();
        self.block_for(st, size);
        let mut begin = 0;
        for (k, end) in ends.iter_mut().enumerate() {
            let start = st.block.len();
            let retry = self.retry_of(st.next + k as u64);
            if tail && k + 1 == count {
                let mut last = &frame[begin..];
                if tail_newline == 1 {
                    st.block.extend_from_slice(last);
                    last = b"\n";
                }
                st.put_event(last, retry);
            } else {
                st.put_event(&frame[begin..*end as usize - 1], retry);
            }
            begin = *end as usize;
            *end = start as u32;
        }
        debug_assert_eq!(st.block.len(), size);
        // The block's allocation is shared by its frames: split off, the rest of it stays for the next ones.
        let out = st.block.split().freeze();
        self.mirror(st, st.next, &out, &ends);
        ends.push(out.len() as u32);
        for w in ends.windows(2) {
            let event = out.slice(w[0] as usize..w[1] as usize);
            st.events.push_back(HeldEvent {
                charge: event.len(),
                event,
            });
        }
        (out, count as u64)
    }

    /// The `retry:` line event `seq` carries after its id: the first event's only.
    fn retry_of(&self, seq: u64) -> &[u8] {
        if seq == 1 {
            &self.shared.retry_line
        } else {
            &[]
        }
    }

    /// Makes room for `size` more bytes in the stream's block: a new block when the rest of this one is too small
    /// (the translator's buffer has room to spare, which held events would keep, so frames are copied into blocks).
    fn block_for(&self, st: &mut State, size: usize) {
        if st.block.capacity() < size {
            let cap = size.max((st.block_cap * 2).clamp(FIRST_BLOCK, MAX_BLOCK));
            self.retire_block(st);
            st.block = BytesMut::with_capacity(cap);
            st.block_cap = cap;
        }
    }

    /// Sends the held frame `out` (events `first`… starting at `starts`) to the mirror, while it keeps up.
    fn mirror(&self, st: &mut State, first: u64, out: &Bytes, starts: &[u32]) {
        if st.mirrored {
            if let (Some(m), Some(handle)) = (&self.shared.mirror, &self.mirrored) {
                st.mirrored = m.append_to(handle, first, out.clone(), starts);
            }
        }
    }

    /// Drops the oldest delivered events while the stream holds more than `buffer_bytes`. Not while no primary is
    /// attached: "delivered" only means written to its connection, and the last of those may never have reached
    /// the client that went away; its reconnection says what it got (`attach`), and until then they are kept.
    fn evict(&self, st: &mut State) {
        self.evict_to(st, self.shared.limits.buffer_bytes, Self::evictable(st));
    }

    /// Events before this one may be evicted: those the attached primary was sent; none while nobody is attached.
    fn evictable(st: &State) -> u64 {
        if st.primary.is_some() {
            st.delivered
        } else {
            st.first
        }
    }

    /// Drops the oldest events before `upto` while the stream holds more than `floor` bytes.
    fn evict_to(&self, st: &mut State, floor: usize, upto: u64) {
        let mut freed = 0;
        while st.bytes > floor && st.first < upto {
            let Some(e) = st.events.pop_front() else { break };
            st.bytes -= e.charge;
            freed += e.charge;
            st.first += 1;
        }
        self.release(freed);
    }

    /// Accounts for `freed` bytes no longer held.
    fn release(&self, freed: usize) {
        if freed > 0 {
            self.shared.metrics.held_bytes.sub(freed as i64);
            self.shared.wake_room();
        }
    }

    /// No more events go to the current block: its unused tail stays allocated as long as its last event is
    /// held, so that event carries it.
    fn retire_block(&self, st: &mut State) {
        let spare = std::mem::take(&mut st.block).capacity();
        if let (Some(last), true) = (st.events.back_mut(), spare > 0) {
            last.charge += spare;
            st.bytes += spare;
            self.shared.metrics.held_bytes.add(spare as i64);
        }
    }

    fn end(&self, st: &mut State, how: End) {
        if st.end.is_some() {
            return;
        }
        self.retire_block(st);
        st.end = Some(how);
        st.ended_at = Instant::now();
        if let (true, Some(m)) = (st.mirrored, &self.shared.mirror) {
            m.finish(&self.hex, st.next - 1, how);
            // The store has the stream's end: nothing held after it (a write racing the end) is mirrored past it.
            st.mirrored = false;
        }
        self.set_phase(st, Held::Retained);
        self.shared.metrics.ended(how);
        wake_all(&mut st.readers);
    }

    fn set_phase(&self, st: &mut State, phase: Held) {
        if st.phase != phase {
            self.shared.metrics.held(st.phase).dec();
            self.shared.metrics.held(phase).inc();
            st.phase = phase;
            self.index_grace(st);
        }
    }

    /// Keeps the hub's `GraceIndex` in step with the phase (the stream's lock, then the index's: never the other
    /// way round).
    fn index_grace(&self, st: &mut State) {
        let mut index = lock(&self.shared.grace);
        match (st.phase == Held::Grace, st.grace_entry) {
            (true, None) => st.grace_entry = Some(index.enter(self.me.clone(), self.binding)),
            (false, Some(entry)) => {
                index.leave(entry);
                st.grace_entry = None;
            }
            _ => {}
        }
    }

    /// Evicts events the attached primary was sent while the stream holds more than `floor` bytes.
    fn trim_delivered(&self, floor: usize) {
        let mut st = self.state();
        let upto = Self::evictable(&st);
        self.evict_to(&mut st, floor, upto);
    }

    /// Releases what the stream holds (it leaves the hub).
    fn forget(&self) {
        let mut st = self.state();
        let bytes = std::mem::take(&mut st.bytes);
        st.events.clear();
        st.block = BytesMut::new();
        st.first = st.next;
        self.release(bytes);
        self.shared.metrics.held(st.phase).dec();
        if let Some(entry) = st.grace_entry.take() {
            lock(&self.shared.grace).leave(entry);
        }
        wake_all(&mut st.readers);
    }
}

/// An `error` envelope made by the gateway, as an event (no id: `push` gives it one when it is held).
pub fn gateway_error(agent: &str, kind: &str, message: &str) -> Bytes {
    let mut out = Vec::new();
    write_gateway_error(&mut out, agent, kind, message);
    Bytes::from(out)
}

/// Where the first event of `s` ends: just past its blank line (`\n\n`).
fn blank_line_end(s: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', s)
        .find(|&i| s.get(i + 1) == Some(&b'\n'))
        .map(|i| i + 2)
}

/// The `message` of the envelope that ends a run nobody came back to.
pub const ABANDONED: &str = "nobody reconnected within the grace period: the run was stopped";
/// The `message` of the envelope that ends a run given up for a newer one in grace (`resume.max_grace_streams`,
/// `resume.max_grace_streams_per_binding`).
pub const GRACE_FULL: &str =
    "too many runs were waiting for a reconnection: this one, the longest waiting, was stopped";
/// The `message` of the envelope that ends a cancelled run.
pub const CANCELLED: &str = "the run was cancelled";
/// The `message` of the envelope that closes a watcher that fell behind.
pub const BEHIND: &str = "this watcher fell behind what the stream holds; attach again to continue";

/// Wakes the readers waiting for events (an empty list, the usual case, is left as it is), under the stream's
/// lock: for a run's end and a stream's removal, once each. An event's readers are woken after it (`append`).
fn wake_all(readers: &mut Vec<(u64, Waker)>) {
    if !readers.is_empty() {
        for (_, w) in readers.drain(..) {
            w.wake();
        }
    }
}

/// A poisoned lock only means another thread panicked mid-update of plain counters and queues: carry on.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(buffer_bytes: usize, grace_ms: u64) -> Hub {
        let limits = Limits {
            buffer_bytes,
            max_total_bytes: 4 * buffer_bytes,
            grace: Duration::from_millis(grace_ms),
            retention: Duration::from_secs(300),
            ..Limits::defaults()
        };
        hub_with(limits)
    }

    /// A hub on `limits`, counting into a registry of its own.
    fn hub_with(limits: Limits) -> Hub {
        Hub::new(
            limits,
            Arc::new(ResumeMetrics::register(&prometheus::Registry::new()).unwrap()),
            None,
        )
    }

    /// A new run (binding all `binding`) holding one event of `size`, its original client gone: in its grace period.
    fn away(h: &Hub, binding: u8, size: usize) -> Arc<Stream> {
        let s = holding(h, binding, 1, size);
        s.original_gone();
        s
    }

    /// A new run (binding all `binding`) holding `events` events of `size`.
    fn holding(h: &Hub, binding: u8, events: usize, size: usize) -> Arc<Stream> {
        let s = h.create([binding; 32], "a").unwrap();
        for _ in 0..events {
            s.append(&event(size));
        }
        s
    }

    /// An event in a buffer of its size (held, a buffer counts whole).
    fn event(n: usize) -> Vec<u8> {
        let mut e = format!("data: {{\"delta\":\"{}\"}}\n\n", "x".repeat(n)).into_bytes();
        e.shrink_to_fit();
        e
    }

    fn read_all(s: &Stream, c: &mut Cursor) -> (Vec<u8>, bool) {
        let mut cx = Context::from_waker(Waker::noop());
        let mut out = Vec::new();
        loop {
            match s.poll_read(c, &mut cx) {
                Poll::Ready(Read::Events(b, _, _)) => out.extend_from_slice(&b),
                Poll::Ready(Read::Behind) => return (out, true),
                Poll::Ready(Read::End) | Poll::Pending => return (out, false),
            }
        }
    }

    /// A stream's output and held events, its stem made `STEM` (streams' tokens differ).
    fn held_of(s: &Stream, out: &[u8]) -> (String, String) {
        let stem = s.stem();
        let mut c = s.attach(0, false).unwrap();
        let (held, _) = read_all(s, &mut c);
        let of = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap().replace(&stem, "STEM");
        (of(out), of(&held))
    }

    proptest::proptest! {
        /// A frame of whole events is held and sent as its events appended one at a time would be (one event a
        /// frame takes `push`'s path for one, several its path for many), across any grouping of them into frames.
        #[test]
        fn events_are_held_alike_whatever_frames_carry_them(
            events in proptest::collection::vec(proptest::collection::vec("[a-z:{}\" ]{1,12}", 1..4), 1..40),
            cuts in proptest::collection::vec(proptest::bool::ANY, 40),
        ) {
            let events: Vec<String> = events.iter().map(|lines| format!("data: {}\n\n", lines.join("\ndata: "))).collect();
            let h = hub(1 << 20, 1000);
            let (one, grouped) = (h.create([1; 32], "a").unwrap(), h.create([2; 32], "a").unwrap());
            let mut out = (Vec::new(), Vec::new());
            let mut frame = String::new();
            for (k, e) in events.iter().enumerate() {
                out.0.extend_from_slice(&one.append(e.as_bytes()));
                frame.push_str(e);
                if cuts[k] || k + 1 == events.len() {
                    out.1.extend_from_slice(&grouped.append(std::mem::take(&mut frame).as_bytes()));
                }
            }
            let (a, b) = (held_of(&one, &out.0), held_of(&grouped, &out.1));
            proptest::prop_assert_eq!(&a, &b);
            // Each event has its data lines, then its id (the first its retry too), then the blank line.
            let retry = format!("retry: {}\n", Limits::defaults().retry_ms);
            let want: String = events
                .iter()
                .enumerate()
                .map(|(k, e)| format!("{}id: STEM{}\n{}\n", &e[..e.len() - 1], k + 1, if k == 0 { &retry } else { "" }))
                .collect();
            proptest::prop_assert_eq!(&a.0, &want);
            proptest::prop_assert_eq!(&a.1, &a.0);
        }
    }

    #[test]
    fn each_event_gets_the_next_id_and_the_first_the_retry() {
        let h = hub(1 << 16, 1000);
        let s = h.create([0; 32], "a").unwrap();
        let stem = s.stem();
        let mut two = event(1);
        two.extend(event(2));
        let out = s.append(&two);
        let data = |n| String::from_utf8(event(n)).unwrap().trim_end().to_owned();
        let want = format!("{}\nid: {stem}1\nretry: 1000\n\n{}\nid: {stem}2\n\n", data(1), data(2));
        assert_eq!(String::from_utf8(out.to_vec()).unwrap(), want);
        let mut c = s.attach(1, false).unwrap();
        let (after_one, _) = read_all(&s, &mut c);
        assert!(after_one.ends_with(format!("id: {stem}2\n\n").as_bytes()));
        assert_eq!(s.attach(3, false).unwrap_err(), AttachError::Unknown);
    }

    #[test]
    fn a_frame_of_many_events_gives_each_its_id_across_a_new_digit() {
        let h = hub(1 << 20, 1000);
        let s = h.create([0; 32], "a").unwrap();
        let stem = s.stem();
        s.append(&event(1));
        // Events 2 to 101 in one frame: more than a frame's offsets kept on the stack, across 9 → 10 and 99 → 100.
        let frame: Vec<u8> = (2..=101).flat_map(event).collect();
        let out = s.append(&frame);
        let want: String = (2..=101)
            .map(|n| {
                let data = String::from_utf8(event(n)).unwrap();
                format!("{}\nid: {stem}{n}\n\n", data.trim_end())
            })
            .collect();
        assert_eq!(String::from_utf8(out.to_vec()).unwrap(), want);
        let mut c = s.attach(99, false).unwrap();
        let (after, _) = read_all(&s, &mut c);
        let data = |n| String::from_utf8(event(n)).unwrap().trim_end().to_owned();
        assert_eq!(
            String::from_utf8(after).unwrap(),
            format!("{}\nid: {stem}100\n\n{}\nid: {stem}101\n\n", data(100), data(101))
        );
    }

    #[test]
    fn a_frame_that_does_not_end_with_a_whole_event_still_gets_ids() {
        let h = hub(1 << 16, 1000);
        let s = h.create([0; 32], "a").unwrap();
        let stem = s.stem();
        for seq in 1..12 {
            s.append(b"data: x\n\n");
            assert_eq!(s.state().next, seq + 1);
        }
        let out = s.append(b"data: a\n\ndata: b\n");
        assert_eq!(
            String::from_utf8(out.to_vec()).unwrap(),
            format!("data: a\nid: {stem}12\n\ndata: b\nid: {stem}13\n\n")
        );
        let out = s.append(b"data: c");
        assert_eq!(
            String::from_utf8(out.to_vec()).unwrap(),
            format!("data: c\nid: {stem}14\n\n")
        );
    }

    #[test]
    fn only_delivered_events_are_evicted_and_the_writer_waits_for_the_rest() {
        let h = hub(1000, 60_000);
        let s = h.create([0; 32], "a").unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        // The original client got these: they may go.
        for _ in 0..10 {
            s.append(&event(200));
        }
        assert!(
            s.state().bytes <= 1000 + 300,
            "delivered events are evicted past the buffer"
        );
        assert_eq!(s.attach(0, false).unwrap_err(), AttachError::Gap);
        // Its client gone, a pump writes on; nothing is evicted any more (the last events written to the client
        // may not have reached it), so the writer waits once the buffer is full.
        s.original_gone();
        let delivered = s.state().next - 1;
        let first = s.state().first;
        while s.writer_check(Instant::now(), &mut cx) == Go::Read {
            s.append(&event(200));
        }
        let end = s.state().next - 1;
        assert!(end > delivered);
        assert_eq!(s.state().first, first, "nothing evicted while nobody is attached");
        // The reconnection reads from where it was, every event: no gap.
        let mut c = s.attach(delivered, true).unwrap();
        let (got, behind) = read_all(&s, &mut c);
        assert!(!behind);
        assert_eq!(memchr::memmem::find_iter(&got, b"\n\n").count() as u64, end - delivered);
        assert_eq!(
            s.writer_check(Instant::now(), &mut cx),
            Go::Read,
            "delivered: room again"
        );
    }

    #[test]
    fn a_primary_reading_on_another_instance_makes_room_here() {
        let h = hub(1000, 60_000);
        let s = h.create([0; 32], "a").unwrap();
        s.original_gone();
        let mut cx = Context::from_waker(Waker::noop());
        while s.writer_check(Instant::now(), &mut cx) == Go::Read {
            s.append(&event(200));
        }
        let end = s.state().next - 1;
        s.remote_primary(end);
        assert_eq!(
            s.writer_check(Instant::now(), &mut cx),
            Go::Read,
            "what it got is in the store: room"
        );
        assert!(s.state().bytes <= 500);
    }

    #[test]
    fn past_the_total_live_streams_give_up_what_their_client_was_sent() {
        let h = hub(1 << 20, 60_000);
        let live: Vec<_> = (0..5).map(|_| holding(&h, 0, 17, 60_000)).collect();
        assert!(h.shared.total() > 4 << 20);
        assert_eq!(h.sweep(Instant::now()), 0, "no live stream is forgotten");
        assert!(h.shared.total() <= 4 << 20);
        let trimmed = live.iter().filter(|s| s.state().bytes <= LIVE_FLOOR + 60_100).count();
        assert!(
            (1..5).contains(&trimmed),
            "down to the floor, only as many as it takes: {trimmed}"
        );
    }

    #[test]
    fn held_events_count_their_bytes_and_a_retired_block_its_unused_tail() {
        let h = hub(1 << 20, 1000);
        let s = h.create([0; 32], "a").unwrap();
        // The translator's room to spare is not held.
        let mut roomy = Vec::with_capacity(10_000);
        roomy.extend_from_slice(&event(10));
        let out = s.append(&roomy);
        assert_eq!(s.state().bytes, out.len());
        assert_eq!(h.shared.total(), s.state().bytes);
        // Filling blocks: each full one is counted whole.
        let mut sent = out.len();
        let mut blocks = vec![FIRST_BLOCK];
        for _ in 0..1000 {
            let room = s.state().block.capacity();
            let out = s.append(&event(100));
            sent += out.len();
            if s.state().block.capacity() + out.len() != room {
                blocks.push(s.state().block_cap);
            }
        }
        assert!(blocks.len() > 3, "{blocks:?}");
        assert_eq!(blocks.last(), Some(&MAX_BLOCK), "{blocks:?}");
        // A retired block's tail is what the event after it did not fit in.
        let tails = s.state().bytes - sent;
        assert!(tails < (blocks.len() - 1) * 200, "{tails}");
        // Once the run ends, the last block's unused tail is counted too: everything the blocks allocated.
        s.finish(&[], End::Completed);
        assert_eq!(s.state().bytes, blocks.iter().sum::<usize>());
        assert_eq!(h.shared.total(), s.state().bytes);
    }

    #[test]
    fn a_watcher_left_behind_is_told_so() {
        let h = hub(1000, 60_000);
        let s = h.create([0; 32], "a").unwrap();
        let mut w = s.attach(0, false).unwrap();
        for _ in 0..20 {
            s.append(&event(200));
        }
        assert!(matches!(
            s.poll_read(&mut w, &mut Context::from_waker(Waker::noop())),
            Poll::Ready(Read::Behind)
        ));
        s.detach(&w);
    }

    #[test]
    fn nobody_back_within_the_grace_period_ends_the_run_with_an_envelope() {
        let h = hub(1 << 16, 50);
        let s = away(&h, 0, 1);
        let deadline = s.grace_deadline().unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(s.writer_check(deadline - Duration::from_millis(1), &mut cx), Go::Read);
        let Go::Stop(End::Abandoned, last) = s.writer_check(deadline, &mut cx) else {
            panic!("not abandoned at the deadline");
        };
        assert!(String::from_utf8_lossy(&last).contains("stream_abandoned"));
        // A reconnection after it reads the held events, then that envelope, then the end.
        let mut c = s.attach(0, true).unwrap();
        let (got, _) = read_all(&s, &mut c);
        assert!(got.ends_with(&last));
        assert!(s.grace_deadline().is_none());
    }

    #[test]
    fn an_upstream_dropped_without_a_pump_ends_the_run_for_its_readers() {
        let h = hub(1 << 16, 60_000);
        let s = away(&h, 0, 1);
        // A reconnection already attached: it must still see the run end, not wait forever.
        let mut c = s.attach(1, true).unwrap();
        s.abandon();
        let (got, _) = read_all(&s, &mut c);
        assert!(String::from_utf8_lossy(&got).contains("stream_abandoned"));
        assert!(s.has_ended());
        s.abandon();
        assert_eq!(s.state().next, 3, "once");
        s.detach(&c);
    }

    #[test]
    fn a_reconnection_stops_the_grace_period_and_a_cancel_ends_the_run() {
        let h = hub(1 << 16, 0);
        let s = away(&h, 0, 1);
        let c = s.attach(1, true).unwrap();
        assert!(s.grace_deadline().is_none());
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(s.writer_check(Instant::now(), &mut cx), Go::Read);
        s.cancel();
        assert!(matches!(
            s.writer_check(Instant::now(), &mut cx),
            Go::Stop(End::Cancelled, _)
        ));
        s.detach(&c);
    }

    /// A waker that counts its wake-ups.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        (Arc::clone(&c), Waker::from(c))
    }

    fn limited(h: &Hub, l: Limit) -> u64 {
        h.shared.metrics.limited[l as usize].get()
    }

    /// A waker that notes, each time it is woken, whether its stream's lock was free then.
    struct LockProbe {
        stream: Weak<Stream>,
        free: Mutex<Vec<bool>>,
    }

    impl std::task::Wake for LockProbe {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            let free = self.stream.upgrade().is_some_and(|s| s.state.try_lock().is_ok());
            lock(&self.free).push(free);
        }
    }

    #[test]
    fn a_watcher_and_the_writer_are_woken_after_the_streams_lock_is_let_go() {
        // Woken under it, a task on another thread would take the lock at once and spin while it is held.
        let h = hub(1 << 16, 60_000);
        let s = h.create([0; 32], "a").unwrap();
        let probe = Arc::new(LockProbe {
            stream: Arc::downgrade(&s),
            free: Mutex::new(Vec::new()),
        });
        let waker = Waker::from(Arc::clone(&probe));
        let mut cx = Context::from_waker(&waker);
        // A watcher waiting for the next event: an append wakes it.
        let mut w = s.attach(0, false).unwrap();
        assert!(s.poll_read(&mut w, &mut cx).is_pending());
        s.append(&event(10));
        // A reconnection (the primary) reading: what it was sent may be evicted, so the writer is woken.
        s.original_gone();
        let mut p = s.attach(0, true).unwrap();
        assert!(s.writer_waits(&mut cx));
        let mut noop = Context::from_waker(Waker::noop());
        assert!(matches!(s.poll_read(&mut p, &mut noop), Poll::Ready(Read::Events(..))));
        assert_eq!(
            *lock(&probe.free),
            [true, true],
            "woken while the stream's lock was held"
        );
    }

    #[test]
    fn writers_nobody_reads_stop_at_the_total_and_are_woken_when_room_frees() {
        // 64 KiB buffers, 256 KiB over all: ten streams in grace could hold 640 KiB without the total.
        let h = hub(64 << 10, 60_000);
        let frame = event(1000).len() + 64;
        let streams: Vec<_> = (0..10).map(|_| away(&h, 0, 1000)).collect();
        let mut cx = Context::from_waker(Waker::noop());
        // Round-robin, as their pumps would run: each reads until told to wait.
        let mut waiting = vec![false; streams.len()];
        while waiting.iter().any(|w| !w) {
            for (s, w) in streams.iter().zip(&mut waiting) {
                match s.writer_check(Instant::now(), &mut cx) {
                    Go::Read => {
                        s.append(&event(1000));
                    }
                    Go::Wait => *w = true,
                    Go::Stop(..) => panic!("stopped"),
                }
            }
        }
        let total = h.shared.total();
        assert!(total >= 256 << 10, "stopped short of the total: {total}");
        assert!(
            total <= (256 << 10) + streams.len() * frame,
            "{total} bytes held past the total and a frame per stream"
        );
        assert!(limited(&h, Limit::TotalBytes) >= 1);
        // A waiting writer is woken once bytes are freed: here ended streams forgotten past the total.
        let (woken, waker) = counting();
        let mut wcx = Context::from_waker(&waker);
        assert_eq!(streams[0].writer_check(Instant::now(), &mut wcx), Go::Wait);
        for s in &streams[1..3] {
            s.finish(&[], End::Completed);
        }
        assert!(h.sweep(Instant::now()) >= 1);
        assert!(h.shared.total() < 256 << 10);
        assert!(woken.0.load(Ordering::SeqCst) >= 1, "not woken when room freed");
        assert_eq!(streams[0].writer_check(Instant::now(), &mut wcx), Go::Read);
    }

    #[test]
    fn watchers_that_leave_a_silent_stream_leave_no_waker_behind() {
        let h = hub(1 << 16, 60_000);
        let s = h.create([0; 32], "a").unwrap();
        s.append(&event(10));
        for _ in 0..1000 {
            let mut w = s.attach(0, false).unwrap();
            let (_, waker) = counting();
            let mut cx = Context::from_waker(&waker);
            assert!(matches!(s.poll_read(&mut w, &mut cx), Poll::Ready(Read::Events(..))));
            assert!(s.poll_read(&mut w, &mut cx).is_pending(), "the stream is silent");
            s.detach(&w);
        }
        assert_eq!(s.state().readers.len(), 0, "wakers of departed watchers kept");
        // One still attached is woken by the next event.
        let mut w = s.attach(1, false).unwrap();
        let (woken, waker) = counting();
        assert!(s.poll_read(&mut w, &mut Context::from_waker(&waker)).is_pending());
        assert!(s.poll_read(&mut w, &mut Context::from_waker(&waker)).is_pending());
        assert_eq!(s.state().readers.len(), 1, "one entry per cursor");
        s.append(&event(10));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        s.detach(&w);
    }

    #[test]
    fn past_the_caps_on_streams_in_grace_the_longest_waiting_is_given_up() {
        let limits = Limits {
            max_grace_streams: 3,
            max_grace_per_binding: 2,
            ..Limits::defaults()
        };
        let h = hub_with(limits);
        let abandoned = |s: &Stream| {
            let mut c = s.attach(0, false).unwrap();
            let (got, _) = read_all(s, &mut c);
            s.detach(&c);
            s.has_ended() && String::from_utf8_lossy(&got).contains(GRACE_FULL)
        };
        let a: Vec<_> = (0..3).map(|_| away(&h, 1, 1)).collect();
        assert!(abandoned(&a[0]), "binding 1's oldest is given up at its third");
        assert!(!a[1].has_ended() && !a[2].has_ended());
        assert_eq!(limited(&h, Limit::GracePerBinding), 1);
        // Its writer learns it at its next check (and drops the upstream).
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(
            a[0].writer_check(Instant::now(), &mut cx),
            Go::Stop(End::Abandoned, _)
        ));
        // A reconnection takes a stream out of grace: it no longer counts.
        let back = a[1].attach(1, true).unwrap();
        let b: Vec<_> = (0..2).map(|_| away(&h, 2, 1)).collect();
        assert!(!a[2].has_ended(), "three in grace: within the cap");
        let b3 = away(&h, 3, 1);
        assert!(abandoned(&a[2]), "the oldest of all is given up at the fourth");
        assert!(!a[1].has_ended() && !b.iter().any(|s| s.has_ended()) && !b3.has_ended());
        assert_eq!(limited(&h, Limit::GraceStreams), 1);
        assert_eq!(h.shared.metrics.held(Held::Grace).get(), 3);
        a[1].detach(&back);
    }

    #[test]
    fn a_stream_takes_as_many_watchers_as_its_cap_and_any_reconnection() {
        let limits = Limits {
            max_watchers: 2,
            ..Limits::defaults()
        };
        let h = hub_with(limits);
        let s = h.create([0; 32], "a").unwrap();
        s.append(&event(1));
        let w1 = s.attach(0, false).unwrap();
        let w2 = s.attach(0, false).unwrap();
        assert_eq!(s.attach(0, false).unwrap_err(), AttachError::Full);
        let r = s.attach(1, true).expect("a reconnection is never refused for watchers");
        s.detach(&w1);
        let w3 = s.attach(0, false).expect("room again once one left");
        for c in [&w2, &w3, &r] {
            s.detach(c);
        }
    }

    #[test]
    fn the_envelopes_the_gateway_writes_name_the_agent_the_run_named() {
        let h = hub(1 << 16, 60_000);
        let s = h.create([0; 32], "fallback-uuid").unwrap();
        s.append(&event(1));
        s.set_agent("agent-x");
        s.cancel();
        let Go::Stop(End::Cancelled, out) = s.writer_check(Instant::now(), &mut Context::from_waker(Waker::noop()))
        else {
            panic!("not cancelled");
        };
        let out = String::from_utf8_lossy(&out);
        assert!(out.contains(r#""agent":"agent-x""#), "{out}");
        assert_eq!(s.agent(), "agent-x");
    }

    #[test]
    fn ended_streams_go_after_their_retention_and_the_oldest_first_past_the_total() {
        let h = hub(1 << 16, 0);
        // Each stream keeps about one 60 KB event (its buffer is 64 KiB); six of them pass the 256 KiB total.
        let ended: Vec<_> = (0..5)
            .map(|_| {
                let s = holding(&h, 0, 1, 60_000);
                s.finish(&[], End::Completed);
                s
            })
            .collect();
        let live = holding(&h, 0, 1, 60_000);
        assert_eq!(h.sweep(Instant::now()), 2, "the two oldest ended streams go");
        assert!(h.get(&ended[0].token).is_none() && h.get(&ended[1].token).is_none());
        assert!(h.get(&ended[2].token).is_some());
        assert_eq!(
            h.sweep(Instant::now() + Duration::from_secs(301)),
            3,
            "past their retention"
        );
        assert!(h.get(&live.token).is_some(), "a live stream is never forgotten");
    }
}
