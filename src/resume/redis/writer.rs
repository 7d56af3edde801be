//! The write path: the one task that writes every stream this instance owns, a pipeline per round, and keeps the
//! per-stream and per-instance bounds.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Pipeline, Value};
use tokio::sync::mpsc;

use super::keys::{
    binding_index, entry_id, hex, start_channel, unix_us, BINDING_INDEX_MAX, CORS_FIELD, EVENTS_FIELD, EVENT_FIELD,
};
use super::options::{millis, RedisOptions};
use super::slot::{event_ranges, fail, starts_fit, Entry, Op, Owned, Slot};
use super::trip::{round_trip, StoreObserver, RETRY_PAUSE};
use crate::resume::metrics::{Bound, StoreOp};

/// Frames taken into one writer round trip at most.
pub const MAX_BATCH_FRAMES: usize = 1024;
/// Event bytes taken into one writer round trip at most (a batch closes once it has reached this).
pub const MAX_BATCH_BYTES: usize = 4 << 20;
/// Arguments of an entry's `XADD` at most besides its events' (`NOMKSTREAM` included), and its bytes besides the
/// key and the events'.
const XADD_ARGS: usize = 4;
const XADD_BYTES: usize = 48;
/// Events of a stream's run whose list `Writer::add_entries` keeps for the next (a paced round lists a few).
const RUN_KEPT: usize = 1024;
/// How far live streams are trimmed when this instance's total in Redis is over `max_total_bytes`.
pub const LIVE_FLOOR_BYTES: usize = 64 << 10;

/// What one reply of a writer's pipeline tells.
pub(super) enum Tag {
    /// Nothing to learn from it.
    Ignore,
    /// A heartbeat's `PEXPIRE` of the meta hash: 0 for a created stream means Redis lost it.
    MetaAlive(Arc<Slot>),
    /// A command of the stream's create.
    Create(Arc<Slot>),
    /// The `XADD` of an entry whose last event is `seq`.
    Add(Arc<Slot>, u64),
    /// A `PEXPIRE` of the events key: 1 means the key has its expiry, which the heartbeat refreshes from then on.
    EventsExpire(Arc<Slot>),
    /// Another command whose refusal gives the stream up (its finish, its agent).
    Must(Arc<Slot>),
}

/// One pipeline, what each of its replies means, and the ops it writes: kept whole to be sent again after a
/// round trip that failed.
#[derive(Default)]
pub(super) struct Round {
    pub(super) pipe: Pipeline,
    pub(super) tags: Vec<Tag>,
    pub(super) ops: Vec<Op>,
}

impl Round {
    pub(super) fn add(&mut self, cmd: redis::Cmd, tag: Tag) {
        self.pipe.add_command(cmd);
        self.tags.push(tag);
    }
}

/// A command's refusal by Redis: its code (`OOM`, `WRONGTYPE`, ...) and message.
pub(super) struct Refusal<'a> {
    pub(super) code: &'a str,
    pub(super) message: &'a str,
}

impl<'a> Refusal<'a> {
    pub(super) fn of(reply: &'a Value) -> Option<Self> {
        match reply {
            Value::ServerError(e) => Some(Self {
                code: e.code(),
                message: e.details().unwrap_or_default(),
            }),
            _ => None,
        }
    }

    /// For want of memory (`maxmemory` with `noeviction`).
    pub(super) fn out_of_memory(&self) -> bool {
        self.code == "OOM"
    }

    /// An `XADD` whose entry is already there (a round sent again after a lost answer).
    pub(super) fn already_added(&self) -> bool {
        self.message.contains("equal or smaller")
    }
}

/// The one task that writes a store's streams: it takes what is queued (up to a batch), sends it as one
/// pipeline, waits for the answer, and repeats; every heartbeat the same pipeline refreshes the owner keys and
/// checks that each owned stream's meta hash is still there.
pub(super) struct Writer {
    /// This instance's name in announcements.
    pub(super) instance: String,
    pub(super) conn: ConnectionManager,
    pub(super) opts: RedisOptions,
    pub(super) observer: Arc<dyn StoreObserver>,
    pub(super) owned: Owned,
    /// Streams given up by the writer, to be marked lost in the next round (with their events deleted?).
    pub(super) lost: Vec<(Arc<Slot>, bool)>,
    /// Ops of streams whose commands Redis refused for want of memory, sent again first.
    pub(super) again: Vec<Op>,
    /// Every stream with events counted in `total`, until its keys expire.
    pub(super) held: Vec<Arc<Slot>>,
    /// Event bytes this instance has in Redis (as far as the writer knows).
    pub(super) total: usize,
    /// Since when round trips fail as a whole (Redis down or stalled).
    pub(super) stalled_since: Option<Instant>,
    /// Since when Redis refuses commands for want of memory.
    pub(super) refused_since: Option<Instant>,
    /// When `held` is next swept of the streams whose keys expired: once a heartbeat (a sweep looks at every
    /// stream of the last `ttl`, too many for every round), and before anything is evicted.
    pub(super) next_sweep: Option<Instant>,
    /// A stream's events of one round not yet in Redis, as `add_entries` splits them into entries: (seq, the
    /// op's index in the round's run, the event's bytes in its frame). Kept to be reused, round after round.
    pub(super) run: Vec<(u64, usize, Range<usize>)>,
}

impl Writer {
    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Op>) {
        let mut next_beat = tokio::time::Instant::now();
        let mut closed = false;
        // The last round took a whole batch: the queue is behind, and a linger would only slow it.
        let mut behind = false;
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
                            // What the streams write meanwhile joins this round: one round trip (two task
                            // wake-ups, a write and a read on each side) for a linger's events instead of a few.
                            if !behind && !self.opts.write_linger.is_zero() {
                                tokio::time::sleep(self.opts.write_linger).await;
                            }
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
            let full = |ops: &[Op], bytes: usize| ops.len() >= MAX_BATCH_FRAMES || bytes >= MAX_BATCH_BYTES;
            while !closed && !full(&ops, bytes) {
                match rx.try_recv() {
                    Ok(op) => {
                        bytes += op.bytes();
                        ops.push(op);
                    }
                    Err(_) => break,
                }
            }
            behind = full(&ops, bytes);
            let round = self.build(&beating, ops);
            self.send(round).await;
        }
        // The store is gone: what was queued has been written; the owner keys now expire.
        tracing::debug!("redis store: writer stopped");
    }

    /// The pipeline of one round: the heartbeat of `beating`, then `ops` in order, then the trims that keep the
    /// bounds, then the keys' expiry.
    pub(super) fn build(&mut self, beating: &[Arc<Slot>], mut ops: Vec<Op>) -> Round {
        let liveness = millis(self.opts.liveness());
        let ttl = millis(self.opts.ttl);
        let now = Instant::now();
        // Most rounds are appends of an event or two per frame, and their expiries: sized for that at once.
        let guess = beating.len() * 4 + ops.len() * 2;
        let mut r = Round {
            pipe: Pipeline::with_capacity(guess),
            tags: Vec::with_capacity(guess),
            ops: Vec::new(),
        };
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
            r.add(
                redis::Cmd::pexpire(&k.events, ttl as i64),
                Tag::EventsExpire(slot.clone()),
            );
        }
        let lost: Vec<Op> = self
            .lost
            .drain(..)
            .map(|(slot, drop_events)| Op::Lost { slot, drop_events })
            .collect();
        ops.splice(0..0, lost);
        // Each stream's ops together, in their order: its appends of the round are then one run, written as
        // entries of several events. The order between streams does not matter (each has its own keys).
        ops.sort_by_key(|op| Arc::as_ptr(op.slot()) as usize);
        // Streams whose meta hash a command of this round wrote (their create, agent, end): their keys' expiry
        // is set after it. An append alone sets none: the heartbeat refreshes a live stream's keys, and a new
        // events key gets its expiry once, in the round of its first `XADD` (`unexpiring`).
        let mut touched: Vec<Arc<Slot>> = Vec::new();
        let mut unexpiring: Vec<Arc<Slot>> = Vec::new();
        let touch = |touched: &mut Vec<Arc<Slot>>, slot: &Arc<Slot>| {
            if !touched.iter().any(|t| Arc::ptr_eq(t, slot)) {
                touched.push(slot.clone());
            }
        };
        let mut added: Vec<Arc<Slot>> = Vec::new();
        let mut next = 0;
        while let Some(op) = ops.get(next) {
            next += 1;
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
                Op::Append { slot, .. } => {
                    // The stream's appends that follow this one in the round join it.
                    let run = next - 1;
                    while matches!(ops.get(next), Some(Op::Append { slot: s, .. }) if Arc::ptr_eq(s, slot)) {
                        next += 1;
                    }
                    if slot.failed.load(Ordering::Acquire) {
                        continue;
                    }
                    if !self.add_entries(&mut r, slot, &ops[run..next]) {
                        touch(&mut unexpiring, slot);
                    }
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
        let (max_bytes, max_events) = (self.opts.buffer_bytes, self.opts.max_events);
        for slot in &added {
            let mut st = slot.stored();
            // Trimmed once it holds its slack more than a bound (bytes or events), back down to the bounds: one
            // `XTRIM` for that many events, not one a round.
            if st.bytes <= max_bytes.saturating_add(self.opts.trim_slack())
                && st.events <= max_events.saturating_add(self.opts.events_slack())
            {
                continue;
            }
            let mut freed = 0;
            let mut keep_from = None;
            // Whole entries, while the stream holds a bound's worth without them: it keeps at least its bounds
            // (an entry of one event: exactly the bound it was over), and less than an entry (half a slack) more.
            while let Some(e) = st.entries.front().copied() {
                let over = st.bytes - e.bytes >= max_bytes || st.events - e.events >= max_events;
                if !over || e.last >= st.newest_frame {
                    break;
                }
                st.entries.pop_front();
                st.events -= e.events;
                st.bytes -= e.bytes;
                freed += e.bytes;
                keep_from = Some(e.last + 1);
            }
            drop(st);
            if let Some(first) = keep_from {
                self.total = self.total.saturating_sub(freed);
                self.observer.evicted(Bound::Stream, freed as u64);
                r.add(trim(&slot.keys.events, first), Tag::Ignore);
            }
        }
        self.keep_total(&mut r, now);
        for slot in &unexpiring {
            if !touched.iter().any(|t| Arc::ptr_eq(t, slot)) {
                r.add(
                    redis::Cmd::pexpire(&slot.keys.events, ttl as i64),
                    Tag::EventsExpire(slot.clone()),
                );
            }
        }
        for slot in &touched {
            r.add(
                redis::Cmd::pexpire(&slot.keys.events, ttl as i64),
                Tag::EventsExpire(slot.clone()),
            );
            r.add(redis::Cmd::pexpire(&slot.keys.meta, ttl as i64), Tag::Ignore);
        }
        r.ops = ops;
        r
    }

    /// The `XADD`s of one stream's appends of a round (`run`, in order): its events not yet in Redis, several to
    /// an entry `0-<its last seq>` within [`RedisOptions::entry_bounds`]. A paced stream has an event or two a
    /// round: one command for them, where a command per event was most of what this store cost the gateway.
    /// Returns whether the stream's events key has its expiry (read under the lock this takes anyway).
    fn add_entries(&mut self, r: &mut Round, slot: &Arc<Slot>, run: &[Op]) -> bool {
        let (most_events, most_bytes) = self.opts.entry_bounds();
        let mut st = slot.stored();
        let mut events = std::mem::take(&mut self.run);
        events.clear();
        for (i, op) in run.iter().enumerate() {
            let Op::Append {
                first_seq,
                frame,
                starts,
                ..
            } = op
            else {
                continue;
            };
            st.newest_frame = *first_seq;
            // `append` queued only frames whose starts fit; checked again, as a range past the frame would panic
            // the slicing below.
            if !starts_fit(frame.len(), starts) {
                continue;
            }
            let ranges = event_ranges(frame.len(), starts);
            events.extend(
                (*first_seq..)
                    .zip(ranges)
                    .filter(|(seq, _)| *seq > st.written)
                    .map(|(seq, range)| (seq, i, range)),
            );
        }
        let mut at = 0;
        while at < events.len() {
            // The entry's extent first: its id (the last seq) comes before its events.
            let (end, bytes) = entry_end(&events, at, most_events, most_bytes);
            let entry = &events[at..end];
            at = end;
            let last = entry[entry.len() - 1].0;
            // Sized once: the command's buffers do not grow arg by arg (the write path's one allocation per
            // entry besides Redis's reply).
            let key = &slot.keys.events;
            let n = entry.len();
            let mut xadd = redis::Cmd::with_capacity(XADD_ARGS + 2 * n, XADD_BYTES + key.len() + bytes + 2 * n);
            xadd.arg("XADD").arg(key);
            if st.events_expire {
                // The key has its expiry: one gone since (Redis flushed, failed over) is not made again without
                // it, which would outlive an owner that dies before its next heartbeat.
                xadd.arg("NOMKSTREAM");
            }
            // No `MAXLEN`: the bounds are kept below, by one `XTRIM` (three arguments less, for Redis to parse
            // too).
            xadd.arg(entry_id(last));
            let field = if n == 1 { EVENT_FIELD } else { EVENTS_FIELD };
            let (mut new, mut new_bytes) = (0, 0);
            for e in entry {
                xadd.arg(field).arg(event_bytes(run, e));
                // Counted when first sent: a round sent again counts nothing twice.
                if e.0 > st.counted {
                    new += 1;
                    new_bytes += e.2.len();
                }
            }
            r.add(xadd, Tag::Add(slot.clone(), last));
            if new > 0 {
                st.entries.push_back(Entry {
                    last,
                    events: new,
                    bytes: new_bytes,
                });
                st.events += new;
                st.bytes += new_bytes;
                st.counted = last;
                self.total += new_bytes;
            }
        }
        // A burst's list is not kept for good.
        if events.capacity() <= RUN_KEPT {
            self.run = events;
        }
        st.events_expire
    }

    /// Indexes a new stream under its binding, then announces it (after its meta hash: an instance told of it can
    /// open it). Neither is the stream's own: a refusal does not give it up.
    pub(super) fn announce(&self, r: &mut Round, token: &str, created_us: u64, binding: &[u8; 32]) {
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
    pub(super) fn forget(&mut self, slot: &Slot) {
        let mut st = slot.stored();
        self.total = self.total.saturating_sub(st.bytes);
        st.bytes = 0;
        st.events = 0;
        st.entries.clear();
    }

    /// Keeps what this instance has in Redis within `max_total_bytes`: streams whose keys expired stop
    /// counting (looked at once a heartbeat, and in any round over the bound); then the events of the streams that ended first are deleted; then live streams are trimmed
    /// to [`LIVE_FLOOR_BYTES`], the largest first.
    pub(super) fn keep_total(&mut self, r: &mut Round, now: Instant) {
        let ttl = self.opts.ttl;
        let due = self.next_sweep.is_none_or(|t| now >= t);
        if !due && self.total <= self.opts.max_total_bytes {
            return;
        }
        self.next_sweep = Some(now + self.opts.heartbeat);
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
                let Some(e) = st.entries.pop_front() else {
                    break;
                };
                st.events -= e.events;
                st.bytes -= e.bytes;
                freed += e.bytes;
                keep_from = Some(e.last + 1);
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
    pub(super) async fn send(&mut self, round: Round) {
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

    /// A stream's keys vanished from Redis (flushed or failed over): counted once, and the stream given up.
    fn vanished(&mut self, slot: &Arc<Slot>) {
        if slot.failed.load(Ordering::Acquire) {
            return;
        }
        tracing::warn!("redis store: a stream's keys vanished from Redis (flushed or failed over)");
        self.observer.store_lost();
        self.forget(slot);
        self.give_up(slot, true);
    }

    /// Reads each reply of a round: gives up only the streams whose own commands were refused.
    pub(super) fn apply(&mut self, round: Round, replies: Vec<Value>) {
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
                    if reply == Value::Int(0) && slot.stored().created {
                        self.vanished(slot);
                    }
                }
                Tag::EventsExpire(slot) => {
                    if reply == Value::Int(1) {
                        slot.stored().events_expire = true;
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
                    // `NOMKSTREAM` found no events key: Redis lost the stream, as a vanished meta hash says.
                    None if reply == Value::Nil => self.vanished(slot),
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
    pub(super) fn settle(&mut self, ops: Vec<Op>, again: &[Arc<Slot>]) {
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
    pub(super) fn give_up(&mut self, slot: &Arc<Slot>, drop_events: bool) {
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

/// Where the entry that starts at `events[at]` ends (exclusive), and its bytes: at most `most_events` events and
/// `most_bytes` bytes (its first event alone may be larger), whose seqs follow each other (readers number an
/// entry's events back from its id).
fn entry_end(
    events: &[(u64, usize, Range<usize>)],
    at: usize,
    most_events: usize,
    most_bytes: usize,
) -> (usize, usize) {
    let (mut end, mut bytes) = (at, 0);
    while let Some((seq, _, range)) = events.get(end) {
        let joins =
            end == at || (end - at < most_events && bytes + range.len() <= most_bytes && *seq == events[end - 1].0 + 1);
        if !joins {
            break;
        }
        bytes += range.len();
        end += 1;
    }
    (end, bytes)
}

/// The bytes of an event of `run` that `Writer::add_entries` listed: (seq, its op's index, its range in the frame).
fn event_bytes<'a>(run: &'a [Op], (_, i, range): &(u64, usize, Range<usize>)) -> &'a [u8] {
    match &run[*i] {
        Op::Append { frame, .. } => &frame[range.clone()],
        _ => &[],
    }
}

/// `XTRIM <events> MINID 0-<first>`: drops the events before `first`.
pub(super) fn trim(events: &str, first: u64) -> redis::Cmd {
    let mut cmd = redis::cmd("XTRIM");
    cmd.arg(events).arg("MINID").arg(entry_id(first));
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entries `entry_end` splits events of these (seq, bytes) into, as their seqs.
    fn split(events: &[(u64, usize)], most_events: usize, most_bytes: usize) -> Vec<Vec<u64>> {
        let listed: Vec<(u64, usize, Range<usize>)> = events.iter().map(|&(seq, len)| (seq, 0, 0..len)).collect();
        let mut entries = Vec::new();
        let mut at = 0;
        while at < listed.len() {
            let (end, bytes) = entry_end(&listed, at, most_events, most_bytes);
            assert_eq!(bytes, listed[at..end].iter().map(|e| e.2.len()).sum::<usize>());
            entries.push(listed[at..end].iter().map(|e| e.0).collect());
            at = end;
        }
        entries
    }

    #[test]
    fn an_entry_holds_events_that_follow_each_other_within_its_bounds() {
        let ten: Vec<(u64, usize)> = (1..=10).map(|seq| (seq, 10)).collect();
        assert_eq!(
            split(&ten, 4, 1000),
            vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8], vec![9, 10]]
        );
        assert_eq!(
            split(&ten, 16, 35),
            vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8, 9], vec![10]]
        );
        // An event larger than the bytes bound is an entry alone.
        assert_eq!(
            split(&[(1, 10), (2, 100), (3, 10)], 16, 50),
            vec![vec![1], vec![2], vec![3]]
        );
        // A seq missing (a frame skipped): the entry ends before it, as its id numbers its events.
        assert_eq!(
            split(&[(1, 1), (2, 1), (4, 1), (5, 1)], 16, 1000),
            vec![vec![1, 2], vec![4, 5]]
        );
        assert_eq!(split(&[(7, 1)], 1, 1), vec![vec![7]]);
    }
}
