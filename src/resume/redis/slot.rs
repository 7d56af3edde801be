//! A stream this instance owns, as the store's handles and its writer share it ([`Slot`]), and what the handles
//! ask the writer to write ([`Op`]).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use smallvec::SmallVec;

use super::keys::Keys;
use crate::resume::metrics::End;

/// One stream owned by this instance, shared by the store's handles and its writer.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) keys: Keys,
    /// Events queued and not yet written (or given up).
    pub(super) pending: AtomicUsize,
    /// Not resumable through the store any more; nothing more of it is written.
    pub(super) failed: AtomicBool,
    /// What the writer knows it has in Redis; only the writer locks it.
    pub(super) stored: Mutex<Stored>,
}

impl Slot {
    pub(super) fn stored(&self) -> std::sync::MutexGuard<'_, Stored> {
        // Only the writer task locks it, one call at a time: a poisoned lock still holds consistent numbers.
        self.stored.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The writer's account of one stream in Redis.
#[derive(Debug, Default)]
pub(super) struct Stored {
    /// Its create round succeeded: its meta hash is in Redis, so a missing one means Redis lost it.
    pub(super) created: bool,
    /// The last seq Redis took (a retried round skips what is already there).
    pub(super) written: u64,
    /// The last seq counted in `entries` (counted when sent, so a retry does not count twice).
    pub(super) counted: u64,
    /// Stored entries, oldest first: what the bounds trim, a whole entry at a time.
    pub(super) entries: VecDeque<Entry>,
    /// Their events.
    pub(super) events: usize,
    /// Their bytes.
    pub(super) bytes: usize,
    /// The first seq of its newest frame, which the per-stream bound never trims.
    pub(super) newest_frame: u64,
    /// Its events key has its expiry (a `PEXPIRE` of it answered 1): from then on the heartbeat refreshes it, and
    /// appends set none.
    pub(super) events_expire: bool,
    /// When it finished or was given up: its keys expire `ttl` after, and then it no longer counts.
    pub(super) ended: Option<Instant>,
}

/// One stored Stream entry, as the writer counts it: events `last - events + 1 ..= last`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) last: u64,
    pub(super) events: usize,
    pub(super) bytes: usize,
}

/// The streams this instance owns and has not finished: `append` looks them up, the heartbeat refreshes them.
pub(super) type Owned = Arc<Mutex<HashMap<String, Arc<Slot>>>>;

/// Event starts an append carries without allocating.
pub(super) const APPEND_STARTS_INLINE: usize = 4;

/// What the writer task is asked to write.
pub(super) enum Op {
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
        /// Inline for a frame of a few events (a paced stream's): an allocation made by the stream's worker and
        /// freed by the writer's thread was a cross-thread `malloc`/`free` pair per append.
        starts: SmallVec<[u32; APPEND_STARTS_INLINE]>,
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
    pub(super) fn bytes(&self) -> usize {
        match self {
            Op::Append { frame, .. } => frame.len(),
            _ => 0,
        }
    }

    pub(super) fn slot(&self) -> &Arc<Slot> {
        match self {
            Op::Create { slot, .. }
            | Op::Append { slot, .. }
            | Op::Agent { slot, .. }
            | Op::Finish { slot, .. }
            | Op::Lost { slot, .. } => slot,
        }
    }
}

/// Marks a slot not resumable; true if it was not already (the caller then tells the observer once).
pub(super) fn fail(slot: &Slot) -> bool {
    !slot.failed.swap(true, Ordering::AcqRel)
}

/// Whether events starting at `starts` fit a frame of `len` bytes: the starts increase strictly and lie within
/// it. Bytes before the first start belong to no event.
pub(super) fn starts_fit(len: usize, starts: &[u32]) -> bool {
    let mut after = None;
    for &s in starts {
        let s = s as usize;
        if s >= len || after.is_some_and(|a| s <= a) {
            return false;
        }
        after = Some(s);
    }
    true
}

/// The byte range of each event of a frame of `len` bytes whose events start at `starts`, for starts that fit
/// ([`starts_fit`]).
pub(super) fn event_ranges(len: usize, starts: &[u32]) -> impl Iterator<Item = Range<usize>> + Clone + '_ {
    starts
        .iter()
        .enumerate()
        .map(move |(i, &s)| s as usize..starts.get(i + 1).map_or(len, |&next| next as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ranges_split_a_frame() {
        let ranges =
            |len, starts: &[u32]| starts_fit(len, starts).then(|| event_ranges(len, starts).collect::<Vec<_>>());
        assert_eq!(ranges(10, &[0, 4, 7]), Some(vec![0..4, 4..7, 7..10]));
        // Bytes before the first start belong to no event.
        let tail = ranges(10, &[2]).expect("fits");
        assert_eq!((tail.len(), tail.first().cloned()), (1, Some(2..10)));
        assert_eq!(ranges(10, &[]), Some(vec![]));
        // Not increasing, empty, or outside the frame.
        assert_eq!(ranges(10, &[0, 0]), None);
        assert_eq!(ranges(10, &[4, 2]), None);
        assert_eq!(ranges(10, &[10]), None);
        assert_eq!(ranges(10, &[0, 11]), None);
        assert_eq!(ranges(0, &[0]), None);
    }
}
