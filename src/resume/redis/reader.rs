//! A reader of a stream owned by any instance ([`RemoteReader`]): replays what is stored, follows what comes,
//! tells a lost owner from a stalled Redis, and reports its cursor when it is the stream's primary.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use redis::aio::ConnectionManager;
use redis::{Pipeline, Value};
use tokio::sync::oneshot;

use crate::cors::Grant;

use super::error::{ReadError, StoreError};
use super::follower::Follower;
use super::keys::{entry_id, Keys};
use super::options::{millis, RedisOptions};
use super::reply::parse_entries;
use super::trip::{round_trip, StoreObserver, RETRY_PAUSE};
use crate::resume::metrics::StoreOp;

/// Entries read by one [`RemoteReader::next`] at most (one `XRANGE` `COUNT`; each of at most
/// [`RedisOptions::entry_bounds`] events and bytes).
pub const READ_COUNT: usize = 256;

/// One open remote reader, counted against `max_readers` until dropped.
pub(super) struct ReaderCount(Arc<AtomicUsize>);

impl ReaderCount {
    pub(super) fn take(open: &Arc<AtomicUsize>, max: usize) -> Option<Self> {
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
pub(super) enum Primary {
    No,
    /// Asked for outside a runtime: the report starts at the next `next`.
    Wanted,
    Reporting {
        _stop: oneshot::Sender<()>,
    },
}

/// A reader of a stream on any instance, from [`RedisStore::open`].
pub struct RemoteReader {
    pub(super) keys: Arc<Keys>,
    /// The store's shared connection, for the non-blocking reads.
    pub(super) conn: ConnectionManager,
    /// Where it waits for new events.
    pub(super) follower: Arc<Follower>,
    pub(super) opts: RedisOptions,
    pub(super) observer: Arc<dyn StoreObserver>,
    /// The seq of the last event returned (0: none), shared with the primary report.
    pub(super) cursor: Arc<AtomicU64>,
    /// The finished stream's last event was returned.
    pub(super) done: bool,
    pub(super) primary: Primary,
    /// The stream's agent, from its meta hash.
    pub(super) agent: String,
    /// The stream's CORS answer, from its meta hash.
    pub(super) cors: Option<Grant>,
    /// Since when (on this reader's clock) the owner key of a live stream has been missing.
    pub(super) owner_absent: Option<Instant>,
    pub(super) _count: ReaderCount,
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
    pub(super) async fn query<T: redis::FromRedisValue>(&mut self, pipe: &Pipeline) -> Result<T, StoreError> {
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

    pub(super) fn start_report(&mut self) {
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

    /// Joins the events that follow `cursor` without a hole into one `Bytes`, up to one that is not UTF-8, and moves
    /// the cursor.
    pub(super) fn take(&mut self, cursor: u64, entries: Vec<(u64, Vec<u8>)>) -> Result<(Bytes, u64), ReadError> {
        let mut expected = cursor.saturating_add(1);
        let mut out = BytesMut::with_capacity(entries.iter().map(|(_, e)| e.len()).sum());
        for (seq, event) in entries {
            // The first entry may begin at or before the cursor (an entry holds several events).
            if seq < expected {
                continue;
            }
            if seq != expected {
                return Err(ReadError::Gap { expected, first: seq });
            }
            if std::str::from_utf8(&event).is_err() {
                if out.is_empty() {
                    return Err(ReadError::NotText { seq });
                }
                // What came before it is read first; the next read fails on it.
                break;
            }
            out.extend_from_slice(&event);
            expected = seq.saturating_add(1);
        }
        let last = expected - 1;
        self.cursor.store(last, Ordering::Release);
        Ok((out.freeze(), last))
    }
}
