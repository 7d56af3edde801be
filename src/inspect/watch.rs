//! One watched stream: its summary (what the list shows) and its ring of records, written by the stream's tap on
//! the stream's own task and read by the admin routes; the live feeds reading it, cut when the ring passes them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{watch, Notify};

use super::record::{Envelope, Raw};
use super::ring::Ring;
use crate::envelope::agent_of;
use crate::protocol::EnvelopeKind;
use crate::sse::encoder;
use crate::translate::Dialect;

/// Agents a stream's summary lists at most (the first to appear).
pub const MAX_AGENTS: usize = 64;
/// Longest agent id listed; a longer one is cut.
const MAX_AGENT_ID: usize = 128;

/// How a watched stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Live,
    Finished,
    Failed,
    Cancelled,
}

/// What the list says of a stream held for resumption: its readers and grace, asked when listed.
pub trait Held: Send + Sync {
    /// Readers attached now (the client and watchers; never an inspector).
    fn readers(&self) -> usize;
    /// Time left before a stream nobody reads is given up (`None` while read or ended).
    fn grace_left(&self) -> Option<Duration>;
}

/// What the list shows of a stream, besides what `Held` tells.
#[derive(Serialize)]
struct Summary {
    state: State,
    dialect: Option<&'static str>,
    agents: Vec<String>,
    /// By type, in `EnvelopeKind::ALL` order (`[DONE]` is not an envelope).
    #[serde(skip)]
    envelopes: [u64; EnvelopeKind::ALL.len()],
    bytes_in: u64,
    bytes_out: u64,
    raw_events: u64,
    first_upstream_ms: Option<u64>,
    first_envelope_ms: Option<u64>,
    parse_errors: u64,
    /// Why it ended, when not `Done`: `upstream_failed: <kind>`, `backend_error`, `cut`, `drained`, `cancelled`.
    ended: Option<&'static str>,
    duration_ms: Option<u64>,
}

struct Inner {
    summary: Summary,
    ring: Ring,
    held: Option<Arc<dyn Held>>,
    /// The first characters of the stream's token, when held for resumption.
    token_prefix: Option<String>,
    feeds: Vec<Arc<Feed>>,
    raw_seq: u64,
    envelope_seq: u64,
}

/// One stream as the inspector keeps it.
pub struct Watched {
    pub id: u64,
    path: String,
    encoder: &'static str,
    capture: bool,
    started: Instant,
    started_unix_ms: u64,
    inner: Mutex<Inner>,
    /// The ring's end position, for live feeds (sent only when a feed listens).
    live: watch::Sender<u64>,
}

/// A live feed's place: where it reads next, and how to cut it when the ring passes that.
pub struct Feed {
    cursor: AtomicU64,
    cut: Arc<Notify>,
    is_cut: AtomicBool,
}

impl Feed {
    pub fn cursor(&self) -> u64 {
        self.cursor.load(Ordering::Acquire)
    }

    pub fn advance(&self, to: u64) {
        self.cursor.store(to, Ordering::Release);
    }

    pub fn is_cut(&self) -> bool {
        self.is_cut.load(Ordering::Acquire)
    }

    fn cut(&self) {
        if !self.is_cut.swap(true, Ordering::AcqRel) {
            // Its connection closes: a feed that does not read is never waited for.
            self.cut.notify_one();
        }
    }
}

/// What a reader gets at once: records lost before its cursor, the records, where it reads next, and whether
/// the stream has ended (nothing more will come).
pub struct Batch {
    pub lost: u64,
    pub records: Vec<Bytes>,
    pub next: u64,
    pub ended: bool,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Watched {
    pub fn new(id: u64, path: &str, encoder: &'static str, capture: bool, ring_bytes: usize) -> Self {
        let started_unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, ms);
        Self {
            id,
            path: path.to_owned(),
            encoder,
            capture,
            started: Instant::now(),
            started_unix_ms,
            inner: Mutex::new(Inner {
                summary: Summary {
                    state: State::Live,
                    dialect: None,
                    agents: Vec::new(),
                    envelopes: [0; EnvelopeKind::ALL.len()],
                    bytes_in: 0,
                    bytes_out: 0,
                    raw_events: 0,
                    first_upstream_ms: None,
                    first_envelope_ms: None,
                    parse_errors: 0,
                    ended: None,
                    duration_ms: None,
                },
                ring: Ring::new(ring_bytes),
                held: None,
                token_prefix: None,
                feeds: Vec::new(),
                raw_seq: 0,
                envelope_seq: 0,
            }),
            live: watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every write leaves the state whole: a panic elsewhere cannot leave it half-written.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn t_ms(&self) -> u64 {
        ms(self.started.elapsed())
    }

    pub fn capture(&self) -> bool {
        self.capture
    }

    /// Held for resumption: `token` (only its first 8 characters are kept) and what tells its readers and grace.
    pub fn hold(&self, token: &str, held: Arc<dyn Held>) {
        let mut g = self.lock();
        g.token_prefix = Some(token.chars().take(8).collect());
        g.held = Some(held);
    }

    /// The first bytes of the upstream's body were decoded (its first event is on its way).
    pub fn upstream_started(&self) {
        let t = self.t_ms();
        self.lock().summary.first_upstream_ms.get_or_insert(t);
    }

    /// An upstream event of `bytes` bytes of data was dispatched (`data` only when captured); returns its `seq`.
    pub fn raw(&self, event: &[u8], bytes: usize, data: Option<&[u8]>, truncated: bool) -> u64 {
        let t_ms = self.t_ms();
        let mut g = self.lock();
        let seq = g.raw_seq;
        g.raw_seq += 1;
        g.summary.raw_events += 1;
        g.summary.bytes_in += bytes as u64;
        g.summary.first_upstream_ms.get_or_insert(t_ms);
        let line = Raw {
            seq,
            t_ms,
            event,
            bytes,
            data,
            truncated,
        }
        .line();
        self.push(&mut g, line);
        seq
    }

    /// An envelope's SSE event was written, while event `raw_seq` was read (`None`: the gateway's own).
    pub fn envelope(&self, kind: EnvelopeKind, raw_seq: Option<u64>, event: &[u8]) {
        let t_ms = self.t_ms();
        let json = Some(encoder::data_of(event)).filter(|j| !j.is_empty());
        let agent = json.and_then(agent_of).map(str::as_bytes);
        let mut g = self.lock();
        let seq = g.envelope_seq;
        g.envelope_seq += 1;
        let s = &mut g.summary;
        s.envelopes[kind as usize] += 1;
        s.bytes_out += event.len() as u64;
        s.first_envelope_ms.get_or_insert(t_ms);
        if let Some(a) = agent {
            if s.agents.len() < MAX_AGENTS && !s.agents.iter().any(|k| k.as_bytes() == a) {
                let cut = &a[..a.len().min(MAX_AGENT_ID)];
                s.agents.push(String::from_utf8_lossy(cut).into_owned());
            }
        }
        let line = Envelope {
            seq,
            t_ms,
            raw_seq,
            kind: kind.as_str(),
            bytes: json.map_or(0, <[u8]>::len),
            data: json.filter(|_| self.capture),
        }
        .line();
        self.push(&mut g, line);
    }

    pub fn dialect(&self, d: Dialect) {
        self.lock().summary.dialect = Some(d.as_str());
    }

    pub fn parse_error(&self) {
        self.lock().summary.parse_errors += 1;
    }

    /// The run ended (`why`, when it did not end `Done`); live feeds are woken to end too.
    pub fn end(&self, state: State, why: Option<&'static str>) {
        let t = self.t_ms();
        {
            let mut g = self.lock();
            if g.summary.state != State::Live {
                return;
            }
            g.summary.state = state;
            g.summary.ended = why;
            g.summary.duration_ms = Some(t);
        }
        self.live.send_modify(|_| {});
    }

    pub fn state(&self) -> State {
        self.lock().summary.state
    }

    /// Appends a record; feeds the ring passed are cut, listening feeds woken.
    fn push(&self, g: &mut Inner, line: Bytes) {
        let first = g.ring.push(line);
        let end = g.ring.end();
        if !g.feeds.is_empty() {
            for f in g.feeds.iter().filter(|f| f.cursor() < first) {
                f.cut();
            }
        }
        if !self.live.is_closed() {
            self.live.send_replace(end);
        }
    }

    /// Registers a live feed reading from the ring's start; its connection is closed through `cut` if the ring
    /// passes it.
    pub fn attach(&self, cut: Arc<Notify>) -> (Arc<Feed>, watch::Receiver<u64>) {
        let mut g = self.lock();
        let feed = Arc::new(Feed {
            cursor: AtomicU64::new(g.ring.first()),
            cut,
            is_cut: AtomicBool::new(false),
        });
        g.feeds.push(Arc::clone(&feed));
        (feed, self.live.subscribe())
    }

    pub fn detach(&self, feed: &Arc<Feed>) {
        self.lock().feeds.retain(|f| !Arc::ptr_eq(f, feed));
    }

    /// Records from `from`, up to `max_bytes` of them.
    pub fn read(&self, from: u64, max_bytes: usize) -> Batch {
        let g = self.lock();
        let (lost, records) = g.ring.read(from, max_bytes);
        let next = from.max(g.ring.first()) + records.len() as u64;
        Batch {
            lost,
            ended: g.summary.state != State::Live && next >= g.ring.end(),
            records,
            next,
        }
    }

    /// Live feeds reading this stream now.
    pub fn feeds(&self) -> usize {
        self.lock().feeds.len()
    }

    /// The list's entry: a JSON object.
    pub fn listed(&self) -> serde_json::Value {
        let g = self.lock();
        let s = &g.summary;
        let envelopes: serde_json::Map<String, serde_json::Value> = EnvelopeKind::ALL
            .iter()
            .zip(s.envelopes)
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.as_str().to_owned(), n.into()))
            .collect();
        let held = g.held.clone();
        let mut v = serde_json::json!({
            "id": self.id.to_string(),
            "path": self.path,
            "started_unix_ms": self.started_unix_ms,
            "encoder": self.encoder,
            "stream": g.token_prefix,
            "envelopes": envelopes,
            "inspectors": g.feeds.len(),
            "records": g.ring.end(),
            "records_kept_from": g.ring.first(),
        });
        if let (Some(obj), Ok(serde_json::Value::Object(sum))) = (v.as_object_mut(), serde_json::to_value(s)) {
            obj.extend(sum);
        }
        drop(g);
        // Asked without this stream's lock: the hub takes its own, and may end this stream's run while holding it.
        let (readers, grace) = match &held {
            Some(h) => (Some(h.readers()), h.grace_left().map(|d| d.as_secs_f64())),
            None => (None, None),
        };
        if let Some(obj) = v.as_object_mut() {
            obj.insert("readers".into(), readers.into());
            obj.insert("grace_secs_left".into(), grace.into());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(agent: &str) -> Vec<u8> {
        format!("data: {{\"type\":\"text\",\"agent\":\"{agent}\",\"final\":false,\"delta\":\"x\"}}\n\n").into_bytes()
    }

    #[test]
    fn envelopes_link_their_event_and_are_counted_by_type() {
        let w = Watched::new(1, "/run", "json", true, 1 << 20);
        let seq = w.raw(b"", 3, Some(b"abc"), false);
        w.envelope(EnvelopeKind::Text, Some(seq), &env("a1"));
        w.envelope(EnvelopeKind::Text, None, &env("a2"));
        let b = w.read(0, usize::MAX);
        assert_eq!(b.records.len(), 3);
        let e: serde_json::Value = serde_json::from_slice(&b.records[1]).unwrap();
        assert_eq!(e["raw_seq"], 0);
        assert_eq!(e["data"]["agent"], "a1");
        let l = w.listed();
        assert_eq!(l["envelopes"]["text"], 2);
        assert_eq!(l["agents"], serde_json::json!(["a1", "a2"]));
        assert_eq!(l["state"], "live");
        assert!(!b.ended);
    }

    #[test]
    fn without_capture_no_record_has_data() {
        let w = Watched::new(1, "/run", "json", false, 1 << 20);
        w.raw(b"", 3, None, false);
        w.envelope(EnvelopeKind::Text, Some(0), &env("a"));
        for r in w.read(0, usize::MAX).records {
            let v: serde_json::Value = serde_json::from_slice(&r).unwrap();
            assert!(v.get("data").is_none(), "{v}");
        }
    }

    #[test]
    fn a_feed_the_ring_passes_is_cut_and_the_writer_goes_on() {
        let w = Watched::new(1, "/run", "json", false, 0);
        let cut = Arc::new(Notify::new());
        let (feed, _rx) = w.attach(Arc::clone(&cut));
        for _ in 0..super::super::ring::MIN_RECORDS {
            w.raw(b"", 1, None, false);
        }
        assert!(!feed.is_cut(), "the ring still holds its cursor");
        w.raw(b"", 1, None, false);
        assert!(feed.is_cut());
        w.detach(&feed);
        assert_eq!(w.feeds(), 0);
    }

    #[test]
    fn an_ended_stream_reads_to_its_end() {
        let w = Watched::new(1, "/run", "json", false, 1 << 20);
        w.raw(b"", 1, None, false);
        w.end(State::Failed, Some("cut"));
        let b = w.read(0, usize::MAX);
        assert!(b.ended);
        assert_eq!(w.listed()["ended"], "cut");
    }
}
