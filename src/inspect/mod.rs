//! The stream inspector (DESIGN 6.2, docs/OPERATIONS.md): with `[debug] streams` on, each translated stream's
//! summary and a bounded ring of its records (`watch`, `ring`, `record`), kept while it runs and for a while
//! after, shown on the admin listener under `/debug/` (`serve`, `page`) to whoever holds the token (`auth`).
//! Off, nothing here is created: the edge attaches no tap and the admin listener answers 404.

pub mod auth;
pub mod page;
pub mod record;
pub mod ring;
pub mod serve;
pub mod watch;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus::{IntCounter, Registry};

use crate::config::Debug;
use crate::telemetry::counters;

pub use watch::{Held, State, Watched};

/// What a request to the inspector opened, as `sse_gateway_debug_attach_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attach {
    /// A stream's page.
    Page,
    /// A stream's live feed (`/events`).
    Events,
    /// A stream's snapshot (`capture.ndjson`).
    Capture,
}

impl Attach {
    pub const ALL: [Attach; 3] = [Attach::Page, Attach::Events, Attach::Capture];

    pub const fn as_str(self) -> &'static str {
        match self {
            Attach::Page => "page",
            Attach::Events => "events",
            Attach::Capture => "capture",
        }
    }
}

/// The streams kept: live ones by id, finished ones oldest first with when they finished.
#[derive(Default)]
struct Streams {
    live: BTreeMap<u64, Arc<Watched>>,
    finished: VecDeque<(Instant, Arc<Watched>)>,
}

/// The inspector: the streams it keeps, its settings and its counters.
pub struct Inspector {
    pub settings: Debug,
    streams: Mutex<Streams>,
    next_id: AtomicU64,
    /// Live feeds open now (at most `settings.max_inspectors`).
    feeds: AtomicUsize,
    attach: [IntCounter; Attach::ALL.len()],
}

impl Inspector {
    /// The inspector of `settings` (with `streams` on), its counter registered on `r`.
    pub fn register(settings: &Debug, r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            settings: settings.clone(),
            streams: Mutex::new(Streams::default()),
            next_id: AtomicU64::new(1),
            feeds: AtomicUsize::new(0),
            attach: counters(
                r,
                "debug_attach_total",
                "Stream inspector attaches (pages, live feeds, snapshots), by what was opened.",
                "kind",
                Attach::ALL.map(Attach::as_str),
            )?,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Streams> {
        // Plain maps, each change one call: a panic elsewhere cannot leave them half-written.
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts keeping a stream of request path `path` (without its query), encoded as `encoder`.
    pub fn open(&self, path: &str, encoder: &'static str) -> Arc<Watched> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let w = Arc::new(Watched::new(
            id,
            path,
            encoder,
            self.settings.capture_content,
            self.settings.ring_bytes,
        ));
        self.lock().live.insert(id, Arc::clone(&w));
        w
    }

    /// `w` ended as `state`: listed as finished for `keep_finished_secs`, at most `keep_finished` of them.
    pub fn finish(&self, w: &Arc<Watched>, state: State, why: Option<&'static str>) {
        w.end(state, why);
        let now = Instant::now();
        let mut s = self.lock();
        if let Some(w) = s.live.remove(&w.id) {
            s.finished.push_back((now, w));
        }
        self.prune(&mut s, now);
    }

    fn prune(&self, s: &mut Streams, now: Instant) {
        let keep = Duration::from_secs_f64(self.settings.keep_finished_secs);
        while s.finished.len() > self.settings.keep_finished
            || s.finished
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) > keep)
        {
            s.finished.pop_front();
        }
    }

    /// The streams listed now: live ones, then finished ones, newest first.
    pub fn list(&self) -> Vec<Arc<Watched>> {
        let mut s = self.lock();
        self.prune(&mut s, Instant::now());
        let mut out: Vec<_> = s.live.values().rev().cloned().collect();
        out.extend(s.finished.iter().rev().map(|(_, w)| Arc::clone(w)));
        out
    }

    /// A listed stream by its id.
    pub fn get(&self, id: u64) -> Option<Arc<Watched>> {
        let mut s = self.lock();
        self.prune(&mut s, Instant::now());
        s.live
            .get(&id)
            .or_else(|| s.finished.iter().find(|(_, w)| w.id == id).map(|(_, w)| w))
            .cloned()
    }

    /// Counts an attach.
    pub fn attached(&self, what: Attach) {
        self.attach[what as usize].inc();
    }

    /// Takes a live feed's place, if fewer than `max_inspectors` are open; the place is given back on drop.
    pub fn feed_place(self: &Arc<Self>) -> Option<FeedPlace> {
        let max = self.settings.max_inspectors;
        self.feeds
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| FeedPlace(Arc::clone(self)))
    }

    /// Live feeds open now.
    pub fn feeds_open(&self) -> usize {
        self.feeds.load(Ordering::Acquire)
    }
}

/// One of the `max_inspectors` places of live feeds, held while the feed is open.
pub struct FeedPlace(Arc<Inspector>);

impl Drop for FeedPlace {
    fn drop(&mut self) {
        self.0.feeds.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inspector(keep: usize, secs: f64) -> Arc<Inspector> {
        let d = Debug {
            streams: true,
            keep_finished: keep,
            keep_finished_secs: secs,
            max_inspectors: 2,
            ..Debug::default()
        };
        Arc::new(Inspector::register(&d, &Registry::new()).unwrap())
    }

    #[test]
    fn finished_streams_are_kept_up_to_the_count() {
        let i = inspector(2, 300.0);
        let ws: Vec<_> = (0..3).map(|_| i.open("/run", "json")).collect();
        for w in &ws {
            i.finish(w, State::Finished, None);
        }
        let listed: Vec<u64> = i.list().iter().map(|w| w.id).collect();
        assert_eq!(listed, [ws[2].id, ws[1].id]);
        assert!(i.get(ws[0].id).is_none());
    }

    #[test]
    fn finished_streams_go_after_their_time() {
        let i = inspector(10, 0.0);
        let w = i.open("/run", "json");
        let live = i.open("/run", "json");
        i.finish(&w, State::Cancelled, Some("cancelled"));
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(i.list().len(), 1, "only the live one");
        assert!(i.get(live.id).is_some());
    }

    #[test]
    fn feeds_are_capped_and_places_given_back() {
        let i = inspector(10, 300.0);
        let a = i.feed_place();
        let b = i.feed_place();
        assert!(a.is_some() && b.is_some());
        assert!(i.feed_place().is_none(), "past max_inspectors");
        drop(a);
        assert!(i.feed_place().is_some());
    }
}
