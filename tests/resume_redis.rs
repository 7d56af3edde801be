//! The Redis store of resumable streams against a real `redis-server` (Debian's, started per test): replay
//! from each position, gap, unknown, denied, follow, owner lost, cancel, primary cursor, Redis killed
//! mid-stream, queue overflow, a write burst in few round trips, and a linger's events in one. Two stores on one
//! server stand for two gateway instances: `a` owns and writes, `b` reads.

#[path = "harness/redis_server.rs"]
mod redis_server;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis_server::{RawEntry, RedisServer};
use sse_gateway::resume::redis::{
    Bound, End, OpenError, ReadError, RedisOptions, RedisStore, RemoteReader, RemoteState, StoreObserver, StoreOp,
};

/// The agent streams are created with.
const AGENT: &str = "agent-1";
/// Bound on anything a test waits for: reaching it is a failure.
const PATIENCE: Duration = Duration::from_secs(10);

/// Counts round trips by operation and result, and streams given up.
#[derive(Default)]
struct Counts {
    ops: Mutex<HashMap<&'static str, (u64, u64)>>,
    unresumable: AtomicUsize,
    evicted: Mutex<HashMap<&'static str, u64>>,
    store_lost: AtomicUsize,
}

impl StoreObserver for Counts {
    fn op(&self, op: StoreOp, ok: bool, _seconds: f64) {
        let mut ops = self.ops.lock().unwrap();
        let e = ops.entry(op.as_str()).or_default();
        if ok {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
    fn unresumable(&self) {
        self.unresumable.fetch_add(1, Ordering::SeqCst);
    }
    fn evicted(&self, bound: Bound, bytes: u64) {
        *self.evicted.lock().unwrap().entry(bound.as_str()).or_default() += bytes;
    }
    fn store_lost(&self) {
        self.store_lost.fetch_add(1, Ordering::SeqCst);
    }
}

impl Counts {
    fn ok(&self, op: &str) -> u64 {
        self.ops.lock().unwrap().get(op).map_or(0, |e| e.0)
    }
    fn total(&self) -> u64 {
        self.ops.lock().unwrap().values().map(|e| e.0 + e.1).sum()
    }
}

/// Fails the test if `fut` takes longer than `limit`.
async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"))
}

fn opts() -> RedisOptions {
    RedisOptions {
        heartbeat: Duration::from_millis(300),
        op_timeout: Duration::from_millis(450),
        ttl: Duration::from_secs(60),
        ..RedisOptions::default()
    }
}

fn token() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

fn binding(n: u8) -> [u8; 32] {
    [n; 32]
}

/// Event `seq` of stream `token`, as the gateway writes it.
fn event(token: &str, seq: u64) -> String {
    format!(
        "id: sg1-{token}-{seq}\ndata: {{\"type\":\"text\",\"n\":{seq},\"pad\":\"{}\"}}\n\n",
        "x".repeat(seq as usize % 7)
    )
}

fn events(token: &str, seqs: impl IntoIterator<Item = u64>) -> String {
    seqs.into_iter().map(|s| event(token, s)).collect()
}

/// Events `seqs` back to back in one frame, with where each starts.
fn frame(token: &str, seqs: std::ops::RangeInclusive<u64>) -> (Bytes, Vec<u32>) {
    let mut buf = String::new();
    let mut starts = Vec::new();
    for s in seqs {
        starts.push(buf.len() as u32);
        buf.push_str(&event(token, s));
    }
    (Bytes::from(buf), starts)
}

fn append(store: &RedisStore, token: &str, seqs: std::ops::RangeInclusive<u64>) -> bool {
    let first = *seqs.start();
    let (f, starts) = frame(token, seqs);
    store.append(token, first, f, &starts)
}

/// A server and two stores on it: `a` (the owner's instance) and `b` (another instance).
struct Two {
    server: RedisServer,
    a: RedisStore,
    b: RedisStore,
    a_counts: Arc<Counts>,
}

async fn two(opts: RedisOptions) -> Option<Two> {
    let server = RedisServer::start()?;
    let a_counts = Arc::new(Counts::default());
    let a = RedisStore::connect(&server.url(), opts.clone(), a_counts.clone())
        .await
        .expect("connect a");
    let b = RedisStore::connect(&server.url(), opts, Arc::new(Counts::default()))
        .await
        .expect("connect b");
    Some(Two { server, a, b, a_counts })
}

impl Two {
    /// A new stream, created by the owner `a` with binding 1; its token.
    fn created(&self) -> String {
        let tok = token();
        self.a.create(&tok, binding(1), AGENT);
        tok
    }
}

/// Opens `token` on `store` once the owner's first write has landed.
async fn open_when_visible(store: &RedisStore, token: &str, b: [u8; 32], after: Option<u64>) -> RemoteReader {
    within(PATIENCE, "stream visible", async {
        loop {
            match store.open(token, b, after).await {
                Err(OpenError::Unknown) => tokio::time::sleep(Duration::from_millis(5)).await,
                r => return r.expect("open"),
            }
        }
    })
    .await
}

/// Reads until the end: the text, the seq after each `next`, and how it ended.
async fn read_all(reader: &mut RemoteReader) -> (String, Vec<u64>, Result<(), ReadError>) {
    within(PATIENCE, "read to the end", async {
        let mut text = String::new();
        let mut lasts = Vec::new();
        loop {
            match reader.next().await {
                Ok(Some((bytes, last))) => {
                    text.push_str(std::str::from_utf8(&bytes).expect("utf-8"));
                    lasts.push(last);
                }
                Ok(None) => return (text, lasts, Ok(())),
                Err(e) => return (text, lasts, Err(e)),
            }
        }
    })
    .await
}

/// Polls the owner's view of `token` until `f` holds.
async fn remote_state_until(store: &RedisStore, token: &str, what: &str, f: impl Fn(&RemoteState) -> bool) {
    within(PATIENCE, what, async {
        loop {
            let s = store.remote_state(token).await.expect("remote_state");
            if f(&s) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_from_the_start_and_from_each_position() {
    let Some(t) = two(opts()).await else { return };
    let tok = t.created();
    assert!(append(&t.a, &tok, 1..=1));
    assert!(append(&t.a, &tok, 2..=4));
    assert!(append(&t.a, &tok, 5..=6));
    t.a.finish(&tok, 6, End::Completed);

    let mut r = open_when_visible(&t.b, &tok, binding(1), None).await;
    let (text, lasts, end) = read_all(&mut r).await;
    end.expect("a finished stream ends with Ok(None)");
    assert_eq!(text, events(&tok, 1..=6));
    assert_eq!(lasts.last(), Some(&6));
    assert!(lasts.windows(2).all(|w| w[0] < w[1]), "{lasts:?}");
    assert!(r.next().await.expect("after the end").is_none(), "stays at its end");

    for after in 0..=6 {
        let mut r = t.b.open(&tok, binding(1), Some(after)).await.expect("open after");
        let (text, _, end) = read_all(&mut r).await;
        end.expect("ends");
        assert_eq!(text, events(&tok, after + 1..=6), "after {after}");
    }
    // Past the end of a finished stream: nothing, then the end.
    let mut r = t.b.open(&tok, binding(1), Some(9)).await.expect("open past the end");
    assert!(r.next().await.expect("next").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trimmed_position_is_a_gap() {
    let o = RedisOptions {
        max_events: 10,
        ..opts()
    };
    let Some(t) = two(o).await else { return };
    let tok = t.created();
    // A reader at the start before anything is written: trimmed under it, it must say so.
    let mut early = open_when_visible(&t.b, &tok, binding(1), None).await;
    for first in (1..=500).step_by(10) {
        assert!(append(&t.a, &tok, first..=first + 9));
    }
    t.a.finish(&tok, 500, End::Completed);

    let mut last = open_when_visible(&t.b, &tok, binding(1), Some(499)).await;
    let (text, _, end) = read_all(&mut last).await;
    end.expect("ends");
    assert_eq!(text, event(&tok, 500));

    for after in [None, Some(0), Some(1)] {
        match t.b.open(&tok, binding(1), after).await {
            Err(OpenError::Gap { first }) => assert!(first > 2, "first stored {first}"),
            other => panic!("after {after:?}: expected a gap, got {other:?}"),
        }
    }
    match within(PATIENCE, "early reader", early.next()).await {
        Err(ReadError::Gap { expected: 1, first }) => assert!(first > 1),
        other => panic!("expected a gap under the reader, got {other:?}"),
    }
}

/// An event that is not UTF-8 is no gateway's (they write their translator's text): a reader gets what came
/// before it and then the store's failure, never the bytes (a socket would send them as a text message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_event_that_is_not_utf8_ends_the_read() {
    let Some(t) = two(opts()).await else { return };
    let tok = t.created();
    assert!(append(&t.a, &tok, 1..=2));
    let bad = [
        b"id: sg1-x-3\ndata: {\"type\":\"text\",\"delta\":\"".as_slice(),
        b"\xff\xfe",
        b"\"}\n\n",
    ]
    .concat();
    assert!(t.a.append(&tok, 3, Bytes::from(bad), &[0]));
    assert!(append(&t.a, &tok, 4..=4));
    t.a.finish(&tok, 4, End::Completed);

    let mut reader = open_when_visible(&t.b, &tok, binding(1), None).await;
    let (text, _, end) = read_all(&mut reader).await;
    assert_eq!(text, events(&tok, 1..=2), "what came before the bad event");
    assert!(matches!(end, Err(ReadError::NotText { seq: 3 })), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_denied() {
    let Some(t) = two(opts()).await else { return };
    let tok = token();
    assert!(matches!(
        t.b.open(&tok, binding(1), None).await,
        Err(OpenError::Unknown)
    ));
    assert!(matches!(t.b.cancel(&tok, binding(1)).await, Err(OpenError::Unknown)));
    assert!(!append(&t.a, &tok, 1..=1), "append to a stream never created");

    t.a.create(&tok, binding(1), AGENT);
    open_when_visible(&t.b, &tok, binding(1), None).await;
    assert!(matches!(t.b.open(&tok, binding(2), None).await, Err(OpenError::Denied)));
    assert!(matches!(t.b.cancel(&tok, binding(2)).await, Err(OpenError::Denied)));
    let s = t.a.remote_state(&tok).await.expect("remote_state");
    assert!(!s.cancelled, "a denied cancel is not a cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_gets_later_events_in_order() {
    let Some(t) = two(opts()).await else { return };
    let tok = t.created();
    let mut r = open_when_visible(&t.b, &tok, binding(1), None).await;
    let reading = tokio::spawn(async move { read_all(&mut r).await });
    for seq in 1..=20 {
        assert!(append(&t.a, &tok, seq..=seq));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A pause longer than a follower's block, then a frame of several events.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(append(&t.a, &tok, 21..=25));
    t.a.finish(&tok, 25, End::Completed);
    let (text, lasts, end) = within(PATIENCE, "follower", reading).await.expect("reader task");
    end.expect("ends");
    assert_eq!(text, events(&tok, 1..=25));
    assert!(lasts.len() > 1, "followed live, not read once at the end: {lasts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_owner_ends_readers_with_lost_after_every_stored_event() {
    let Some(Two { server, a, b, .. }) = two(opts()).await else {
        return;
    };
    let tok = token();
    a.create(&tok, binding(1), AGENT);
    assert!(append(&a, &tok, 1..=3));
    assert!(append(&a, &tok, 4..=5));
    let mut r = open_when_visible(&b, &tok, binding(1), None).await;
    let mut got = String::new();
    within(PATIENCE, "the stored events", async {
        while !got.ends_with(&event(&tok, 5)) {
            let (bytes, _) = r.next().await.expect("next").expect("live");
            got.push_str(std::str::from_utf8(&bytes).unwrap());
        }
    })
    .await;
    assert_eq!(got, events(&tok, 1..=5));

    // The owner instance goes away mid-stream: its heartbeat stops.
    drop(a);
    let died = Instant::now();
    let (more, _, end) = read_all(&mut r).await;
    assert_eq!(more, "");
    assert!(matches!(end, Err(ReadError::Lost)), "{end:?}");
    let took = died.elapsed();
    assert!(took < Duration::from_secs(4), "lost seen after {took:?}");
    eprintln!("owner lost seen by the follower after {took:?}");

    // A reader that comes afterwards gets every stored event, then Lost too.
    let mut late = b.open(&tok, binding(1), None).await.expect("open");
    let (text, _, end) = read_all(&mut late).await;
    assert_eq!(text, events(&tok, 1..=5));
    assert!(matches!(end, Err(ReadError::Lost)), "{end:?}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_is_seen_by_remote_state() {
    let Some(t) = two(opts()).await else { return };
    let tok = t.created();
    open_when_visible(&t.b, &tok, binding(1), None).await;
    assert_eq!(t.a.remote_state(&tok).await.expect("state"), RemoteState::default());
    t.b.cancel(&tok, binding(1)).await.expect("cancel");
    remote_state_until(&t.a, &tok, "cancel seen", |s| s.cancelled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cursor_is_seen_by_remote_state() {
    let Some(t) = two(opts()).await else { return };
    let tok = t.created();
    assert!(append(&t.a, &tok, 1..=4));
    let mut r = open_when_visible(&t.b, &tok, binding(1), Some(2)).await;
    assert_eq!(t.a.remote_state(&tok).await.expect("state").primary_cursor, None);
    r.set_primary();
    remote_state_until(&t.a, &tok, "cursor 2 reported", |s| s.primary_cursor == Some(2)).await;
    let (bytes, last) = within(PATIENCE, "next", r.next()).await.expect("next").expect("events");
    assert_eq!(
        (std::str::from_utf8(&bytes).unwrap(), last),
        (events(&tok, 3..=4).as_str(), 4)
    );
    remote_state_until(&t.a, &tok, "cursor 4 reported", |s| s.primary_cursor == Some(4)).await;
    // The reader goes: its report expires within 3 heartbeats.
    drop(r);
    let gone = Instant::now();
    remote_state_until(&t.a, &tok, "report expired", |s| s.primary_cursor.is_none()).await;
    assert!(gone.elapsed() < Duration::from_secs(3), "{:?}", gone.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflowing_queue_gives_the_stream_up() {
    let Some(t) = two(RedisOptions { queue: 4, ..opts() }).await else {
        return;
    };
    let tok = t.created();
    assert!(append(&t.a, &tok, 1..=2));
    assert!(!append(&t.a, &tok, 3..=7), "5 events at once exceed a queue of 4");
    assert_eq!(t.a_counts.unresumable.load(Ordering::SeqCst), 1);
    assert!(!append(&t.a, &tok, 8..=8), "stays given up");
    t.a.finish(&tok, 8, End::Completed);
    assert_eq!(t.a_counts.unresumable.load(Ordering::SeqCst), 1, "told once");
    // Readers elsewhere: what was stored, then Lost, not a silent end.
    let mut r = open_when_visible(&t.b, &tok, binding(1), None).await;
    let (text, _, end) = read_all(&mut r).await;
    assert!(events(&tok, 1..=2).starts_with(&text), "{text}");
    assert!(matches!(end, Err(ReadError::Lost)), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_stream_gives_streams_up_without_blocking() {
    let o = RedisOptions {
        stall: Duration::from_secs(1),
        ..opts()
    };
    let Some(mut t) = two(o).await else { return };
    let tok = t.created();
    let mut r = open_when_visible(&t.b, &tok, binding(1), None).await;
    for seq in 1..=20 {
        assert!(append(&t.a, &tok, seq..=seq));
    }
    let (first, _) = within(PATIENCE, "first events", r.next())
        .await
        .expect("next")
        .expect("events");
    assert!(!first.is_empty());

    assert_eq!(t.a_counts.unresumable.load(Ordering::SeqCst), 0);
    t.server.kill();
    let killed = Instant::now();
    let mut seq = 21;
    let mut slowest = Duration::ZERO;
    loop {
        let started = Instant::now();
        let ok = append(&t.a, &tok, seq..=seq);
        slowest = slowest.max(started.elapsed());
        if !ok {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "append still true {:?} after the kill",
            killed.elapsed()
        );
        seq += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "append false {:?} after the kill; slowest append {slowest:?}",
        killed.elapsed()
    );
    assert!(slowest < Duration::from_millis(50), "append blocked for {slowest:?}");
    assert!(t.a_counts.unresumable.load(Ordering::SeqCst) >= 1);
    assert!(!append(&t.a, &tok, seq + 1..=seq + 1), "stays false");

    // Every other call answers within its timeout, with an error, and nothing panics.
    let bound = Duration::from_secs(3);
    assert!(within(bound, "remote_state", t.a.remote_state(&tok)).await.is_err());
    assert!(matches!(
        within(bound, "open", t.b.open(&tok, binding(1), None)).await,
        Err(OpenError::Store(_))
    ));
    assert!(matches!(
        within(bound, "cancel", t.b.cancel(&tok, binding(1))).await,
        Err(OpenError::Store(_))
    ));
    let mut drained = false;
    for _ in 0..100 {
        match within(bound, "reader", r.next()).await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("a silent end"),
            Err(_) => {
                drained = true;
                break;
            }
        }
    }
    assert!(drained, "the reader ends with an error");
    // A stream created while Redis is down is given up too, soon.
    let other = token();
    t.a.create(&other, binding(1), AGENT);
    within(PATIENCE, "new stream given up", async {
        let mut s = 1;
        while append(&t.a, &other, s..=s) {
            s += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    t.a.finish(&tok, seq, End::Completed);
    t.a.finish(&other, 1, End::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_written_in_few_round_trips() {
    const STREAMS: u64 = 50;
    const PER_STREAM: u64 = 200;
    let Some(t) = two(opts()).await else { return };
    let tokens: Vec<String> = (0..STREAMS).map(|_| token()).collect();
    let started = Instant::now();
    for tok in &tokens {
        t.a.create(tok, binding(1), AGENT);
    }
    // One event per frame, the streams interleaved: the worst case for batching.
    for seq in 1..=PER_STREAM {
        for tok in &tokens {
            assert!(
                append(&t.a, tok, seq..=seq),
                "append never refuses in a burst within the queue"
            );
        }
    }
    for tok in &tokens {
        t.a.finish(tok, PER_STREAM, End::Completed);
    }
    let queued = started.elapsed();
    // The writer keeps the order of what was queued: the last stream's end readable elsewhere means every
    // event is written.
    let last = tokens.last().expect("a stream");
    let mut r = open_when_visible(&t.b, last, binding(1), Some(PER_STREAM)).await;
    assert!(within(PATIENCE, "end", r.next()).await.expect("next").is_none());
    let written = started.elapsed();
    let total = STREAMS * PER_STREAM;
    let writes = t.a_counts.ok("write");
    eprintln!(
        "burst: {total} events over {STREAMS} streams queued in {queued:?}, written in {written:?} \
         ({:.0} events/s) with {writes} write round trips ({} ops in all)",
        total as f64 / written.as_secs_f64(),
        t.a_counts.total()
    );
    assert!(writes * 20 < total, "{writes} round trips for {total} events");
    assert_eq!(t.a_counts.unresumable.load(Ordering::SeqCst), 0);
    for tok in &tokens {
        let mut r = t.b.open(tok, binding(1), None).await.expect("open");
        let (text, _, end) = read_all(&mut r).await;
        end.expect("ends");
        assert_eq!(text, events(tok, 1..=PER_STREAM));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_within_the_write_linger_share_one_round_trip() {
    // Ten events 5 ms apart, then the end: without a linger each wakes the idle writer for a round trip of its
    // own; with one, the first wakes it and the rest join its round. Nothing is lost or reordered either way.
    let mut rounds = Vec::new();
    for linger in [Duration::ZERO, Duration::from_millis(100)] {
        let Some(t) = two(RedisOptions {
            write_linger: linger,
            ..opts()
        })
        .await
        else {
            return;
        };
        let tok = t.created();
        open_when_visible(&t.b, &tok, binding(1), None).await;
        let before = t.a_counts.ok("write");
        for seq in 1..=10 {
            assert!(append(&t.a, &tok, seq..=seq));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        t.a.finish(&tok, 10, End::Completed);
        let mut r = t.b.open(&tok, binding(1), None).await.expect("open");
        let (text, _, end) = read_all(&mut r).await;
        end.expect("ends");
        assert_eq!(text, events(&tok, 1..=10), "linger {linger:?}");
        rounds.push(t.a_counts.ok("write") - before);
    }
    eprintln!(
        "write round trips for 10 events 5 ms apart and the end: linger 0: {}, 100 ms: {}",
        rounds[0], rounds[1]
    );
    // The events' round, and at most a heartbeat's of its own.
    assert!(rounds[1] <= 2, "{} round trips with a 100 ms linger", rounds[1]);
    assert!(rounds[0] > rounds[1], "no linger: {} round trips", rounds[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rounds_events_of_a_stream_are_a_few_entries_read_from_any_position() {
    // Forty events queued within one linger, each its own frame (as a paced stream's): written as entries of
    // several events, each within `entry_bounds`, not an entry (and a command) per event; a reader elsewhere
    // gets exactly what follows any position, inside an entry or at its edge.
    const N: u64 = 40;
    let o = RedisOptions {
        write_linger: Duration::from_millis(100),
        ..opts()
    };
    let (most_events, _) = o.entry_bounds();
    let Some(t) = two(o).await else { return };
    let mut conn = redis_conn(&t.server).await;
    let tok = t.created();
    for seq in 1..=N {
        assert!(append(&t.a, &tok, seq..=seq));
    }
    t.a.finish(&tok, N, End::Completed);
    wait_finished(&t.b, &tok, N).await;
    let raw: Vec<RawEntry> = redis::cmd("XRANGE")
        .arg(format!("sse-gateway:{{{tok}}}:events"))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    let sizes: Vec<usize> = raw.iter().map(|(_, fields)| fields.len()).collect();
    eprintln!("{N} events queued in one linger: entries of {sizes:?} events (at most {most_events})");
    assert!(
        sizes.len() <= 2 * N.div_ceil(most_events as u64) as usize,
        "entries {sizes:?}"
    );
    assert!(sizes.iter().all(|n| *n <= most_events), "entries {sizes:?}");
    let seqs: Vec<u64> = stored(&mut conn, &tok).await.iter().map(|e| e.0).collect();
    assert_eq!(seqs, (1..=N).collect::<Vec<_>>());
    for after in 0..=N {
        let mut r = t.b.open(&tok, binding(1), Some(after)).await.expect("open");
        let (text, _, end) = read_all(&mut r).await;
        end.expect("ends");
        assert_eq!(text, events(&tok, after + 1..=N), "after {after}");
    }
}

// ---- issue 26: bounds, refusals, stalls, a lost store, followers, the agent ----

/// A plain connection to the server, to look at what the store holds.
async fn redis_conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(server.url()).expect("redis url");
    client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

/// [`two`] on [`opts`] as `change` sets them, and a plain connection to its server, for the tests that look at
/// what Redis holds; `None` without a redis-server, as [`two`].
async fn two_watched(change: impl FnOnce(&mut RedisOptions)) -> Option<(Two, redis::aio::MultiplexedConnection)> {
    let mut o = opts();
    change(&mut o);
    let t = two(o).await?;
    let conn = redis_conn(&t.server).await;
    Some((t, conn))
}

/// The events (seq, size) stored for `token`.
async fn stored(conn: &mut redis::aio::MultiplexedConnection, token: &str) -> Vec<(u64, usize)> {
    let events = redis_server::stored_events(conn, token).await;
    events.into_iter().map(|(seq, e)| (seq, e.len())).collect()
}

/// An event of about `size` bytes.
fn sized_event(token: &str, seq: u64, size: usize) -> String {
    let head = format!("id: sg1-{token}-{seq}\ndata: {{\"n\":{seq},\"pad\":\"");
    let pad = size.saturating_sub(head.len() + 4);
    format!("{head}{}\"}}\n\n", "x".repeat(pad))
}

fn append_sized(store: &RedisStore, token: &str, seqs: std::ops::RangeInclusive<u64>, size: usize) -> bool {
    let first = *seqs.start();
    let mut buf = String::new();
    let mut starts = Vec::new();
    for s in seqs {
        starts.push(buf.len() as u32);
        buf.push_str(&sized_event(token, s, size));
    }
    store.append(token, first, Bytes::from(buf), &starts)
}

/// Waits until the owner's writes up to the stream's end are readable elsewhere.
async fn wait_finished(store: &RedisStore, token: &str, last: u64) {
    let mut r = open_when_visible(store, token, binding(1), Some(last)).await;
    assert!(within(PATIENCE, "end", r.next()).await.expect("next").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_keeps_about_max_events_in_redis() {
    // Small events far under the byte bound: only the count bound trims (the writer's, an `XADD` has no `MAXLEN`).
    const MAX: usize = 64;
    const EVENTS: u64 = 1000;
    let Some((t, mut conn)) = two_watched(|o| o.max_events = MAX).await else {
        return;
    };
    let tok = t.created();
    let slack =
        (MAX / sse_gateway::resume::redis::TRIM_SLACK_FRACTION).min(sse_gateway::resume::redis::MAX_EVENTS_SLACK);
    let bound = MAX + slack + 1;
    let mut most = 0usize;
    for seq in 1..=EVENTS {
        assert!(append_sized(&t.a, &tok, seq..=seq, 64));
        if seq % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            most = most.max(stored(&mut conn, &tok).await.len());
        }
    }
    t.a.finish(&tok, EVENTS, End::Completed);
    wait_finished(&t.b, &tok, EVENTS).await;
    let events = stored(&mut conn, &tok).await;
    assert!(events.len() >= MAX, "trimmed below the bound: {} events", events.len());
    assert!(
        events.len() <= bound,
        "{} events held at the end (bound {bound})",
        events.len()
    );
    assert!(most <= bound, "{most} events held mid-run (bound {bound})");
    assert_eq!(events.last().map(|e| e.0), Some(EVENTS), "the newest events are kept");
    let seqs: Vec<u64> = events.iter().map(|e| e.0).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "what is kept has no hole: {seqs:?}"
    );
    assert!(matches!(
        t.b.open(&tok, binding(1), Some(0)).await,
        Err(OpenError::Gap { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_keeps_about_buffer_bytes_in_redis() {
    const BUFFER: usize = 16 << 10;
    const EVENT: usize = 100;
    const EVENTS: u64 = 4000;
    let Some((t, mut conn)) = two_watched(|o| o.buffer_bytes = BUFFER).await else {
        return;
    };
    let tok = t.created();
    let mut most = 0usize;
    for seq in 1..=EVENTS {
        assert!(append_sized(&t.a, &tok, seq..=seq, EVENT));
        if seq % 500 == 0 {
            // Let the writer catch up, then look at what Redis holds mid-run.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let held: usize = stored(&mut conn, &tok).await.iter().map(|(_, b)| b).sum();
            most = most.max(held);
        }
    }
    t.a.finish(&tok, EVENTS, End::Completed);
    wait_finished(&t.b, &tok, EVENTS).await;
    let events = stored(&mut conn, &tok).await;
    let held: usize = events.iter().map(|(_, b)| b).sum();
    let usage: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(format!("sse-gateway:{{{tok}}}:events"))
        .arg("SAMPLES")
        .arg(0)
        .query_async(&mut conn)
        .await
        .expect("MEMORY USAGE");
    eprintln!(
        "{EVENTS} events of {EVENT} B, buffer {BUFFER}: {} held ({held} B, most seen mid-run {most} B); \
         MEMORY USAGE {usage} B",
        events.len()
    );
    // The bound and its documented slack (a sixteenth), plus the newest frame (one event here).
    let bound = BUFFER + BUFFER / sse_gateway::resume::redis::TRIM_SLACK_FRACTION + EVENT;
    assert!(held <= bound, "{held} B held at the end");
    assert!(most <= bound, "{most} B held mid-run");
    assert!(usage < 4 * BUFFER as u64, "MEMORY USAGE {usage}");
    assert_eq!(events.last().map(|e| e.0), Some(EVENTS), "the newest events are kept");
    assert_eq!(t.a_counts.unresumable.load(Ordering::SeqCst), 0);
    assert!(t.a_counts.evicted.lock().unwrap().get("stream").copied().unwrap_or(0) > 0);

    // A reader elsewhere: an old position is a gap; a recent one gets the events, then the end.
    assert!(matches!(
        t.b.open(&tok, binding(1), Some(10)).await,
        Err(OpenError::Gap { .. })
    ));
    let mut r = t.b.open(&tok, binding(1), Some(EVENTS - 10)).await.expect("open");
    let (text, _, end) = read_all(&mut r).await;
    end.expect("ends");
    let want: String = (EVENTS - 9..=EVENTS).map(|s| sized_event(&tok, s, EVENT)).collect();
    assert_eq!(text, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_total_bytes_the_oldest_finished_streams_go_first() {
    const BUFFER: usize = 16 << 10;
    let Some((t, mut conn)) = two_watched(|o| {
        o.buffer_bytes = BUFFER;
        o.max_total_bytes = 3 * BUFFER;
    })
    .await
    else {
        return;
    };
    // Five finished streams of a full buffer each, one after the other: only the last three fit.
    let mut tokens = Vec::new();
    for _ in 0..5 {
        let tok = t.created();
        for first in (1..=160).step_by(10) {
            assert!(append_sized(&t.a, &tok, first..=first + 9, 100));
        }
        t.a.finish(&tok, 160, End::Completed);
        wait_finished(&t.b, &tok, 160).await;
        tokens.push(tok);
    }
    let mut total = 0;
    for tok in &tokens {
        total += stored(&mut conn, tok).await.iter().map(|(_, b)| b).sum::<usize>();
    }
    assert!(total <= 3 * BUFFER + 1000, "{total} B held over all streams");
    for old in &tokens[..2] {
        assert!(
            matches!(t.b.open(old, binding(1), None).await, Err(OpenError::Gap { .. })),
            "an oldest finished stream's events are gone: a gap, never wrong data"
        );
    }
    let newest = tokens.last().expect("a stream");
    let mut r = t.b.open(newest, binding(1), Some(150)).await.expect("open");
    let (text, _, end) = read_all(&mut r).await;
    end.expect("ends");
    assert_eq!(
        text,
        (151..=160).map(|s| sized_event(newest, s, 100)).collect::<String>()
    );
    assert!(t.a_counts.evicted.lock().unwrap().get("total").copied().unwrap_or(0) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_gives_up_only_the_stream_that_filled_redis() {
    let Some((t, mut conn)) = two_watched(|o| {
        o.buffer_bytes = 64 << 20;
        o.max_total_bytes = 1 << 30;
    })
    .await
    else {
        return;
    };
    let big = t.created();
    let small = t.created();
    assert!(append(&t.a, &small, 1..=1));
    open_when_visible(&t.b, &small, binding(1), None).await;
    open_when_visible(&t.b, &big, binding(1), None).await;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used + (2 << 20))
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET maxmemory");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET maxmemory-policy");

    // Both written in the same rounds: the big one, 40 KiB a frame, fills Redis; the small one goes on.
    let (mut b_seq, mut s_seq) = (0u64, 1u64);
    let mut big_given_up = false;
    within(PATIENCE, "the big stream given up", async {
        while !big_given_up {
            if append_sized(&t.a, &big, b_seq + 1..=b_seq + 10, 4096) {
                b_seq += 10;
            } else {
                big_given_up = true;
            }
            s_seq += 1;
            assert!(
                append(&t.a, &small, s_seq..=s_seq),
                "the small stream given up at {s_seq}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    for _ in 0..20 {
        s_seq += 1;
        assert!(
            append(&t.a, &small, s_seq..=s_seq),
            "the small stream given up at {s_seq}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    t.a.finish(&small, s_seq, End::Completed);
    t.a.finish(&big, b_seq, End::Completed);
    eprintln!("big stream given up after {b_seq} events; small stream wrote {s_seq}");
    let mut r = t.b.open(&small, binding(1), None).await.expect("open the small stream");
    let (text, _, end) = read_all(&mut r).await;
    end.expect("the small stream ends normally");
    assert_eq!(text, events(&small, 1..=s_seq));
    assert_eq!(t.a_counts.unresumable.load(Ordering::SeqCst), 1, "only the big stream");
    match t.b.open(&big, binding(1), None).await {
        Ok(mut r) => {
            let (_, _, end) = read_all(&mut r).await;
            assert!(matches!(end, Err(ReadError::Lost)), "{end:?}");
        }
        Err(e) => assert!(matches!(e, OpenError::Unknown | OpenError::Gap { .. }), "{e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_s_redis_stall_loses_nothing() {
    // The owner key lives 1.5 s: it expires during the stall.
    let o = RedisOptions {
        heartbeat: Duration::from_millis(500),
        op_timeout: Duration::from_millis(500),
        ..opts()
    };
    let Some(t) = two(o).await else { return };
    let tok = t.created();
    assert!(append(&t.a, &tok, 1..=1));
    let mut r = open_when_visible(&t.b, &tok, binding(1), None).await;
    let reading = tokio::spawn(async move {
        let mut text = String::new();
        let end = loop {
            match r.next().await {
                Ok(Some((bytes, _))) => text.push_str(std::str::from_utf8(&bytes).expect("utf-8")),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        (text, end)
    });
    const LAST: u64 = 100;
    for seq in 2..=LAST {
        if seq == 20 {
            t.server.pause();
        }
        if seq == 80 {
            t.server.resume();
        }
        // 50 ms apart: the pause lasts 3 s.
        assert!(append(&t.a, &tok, seq..=seq), "given up at {seq}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.a.finish(&tok, LAST, End::Completed);
    let (text, end) = within(Duration::from_secs(20), "the reader", reading)
        .await
        .expect("reader task");
    end.expect("the normal end, not upstream_lost");
    assert_eq!(text, events(&tok, 1..=LAST));
    assert_eq!(t.a_counts.unresumable.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_its_data_is_noticed_and_counted() {
    let Some((t, mut conn)) = two_watched(|_| {}).await else {
        return;
    };
    let tok = t.created();
    assert!(append(&t.a, &tok, 1..=3));
    open_when_visible(&t.b, &tok, binding(1), None).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.expect("FLUSHALL");
    within(PATIENCE, "the loss counted", async {
        while t.a_counts.store_lost.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(t.a_counts.store_lost.load(Ordering::SeqCst), 1);
    assert_eq!(t.a_counts.unresumable.load(Ordering::SeqCst), 1);
    assert!(!append(&t.a, &tok, 4..=4), "given up in the store");
    // Never a partial stream: unknown elsewhere.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(
        t.b.open(&tok, binding(1), None).await,
        Err(OpenError::Unknown)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_written_after_a_flush_never_make_a_key_without_expiry() {
    // No heartbeat during the test: an owner that dies before its next one would leave such a key forever.
    let Some((t, mut conn)) = two_watched(|o| o.heartbeat = Duration::from_secs(15)).await else {
        return;
    };
    let tok = t.created();
    assert!(append(&t.a, &tok, 1..=3));
    open_when_visible(&t.b, &tok, binding(1), None).await;
    let events_key = format!("sse-gateway:{{{tok}}}:events");
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.expect("FLUSHALL");
    // Queued before the writer learns of the loss: written to a Redis without the stream's keys.
    let _ = append(&t.a, &tok, 4..=6);
    // Until the writer has sent them: the loss counted, or (without `NOMKSTREAM`) the key made again.
    within(PATIENCE, "the writer's round after the flush", async {
        loop {
            let made: u64 = redis::cmd("EXISTS")
                .arg(&events_key)
                .query_async(&mut conn)
                .await
                .expect("EXISTS");
            if made == 1 || t.a_counts.store_lost.load(Ordering::SeqCst) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&events_key)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    // -2: no such key; -1 would be a key without expiry.
    assert_eq!(pttl, -2, "the events key after the flush");
    assert_eq!(t.a_counts.store_lost.load(Ordering::SeqCst), 1);
    assert!(!append(&t.a, &tok, 7..=7), "given up in the store");
}

/// Connected clients, as Redis counts them.
async fn clients(conn: &mut redis::aio::MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_followers_share_the_instances_connections() {
    const READERS: usize = 40;
    let Some((t, mut conn)) = two_watched(|o| o.max_readers = READERS).await else {
        return;
    };
    let tokens: Vec<String> = (0..4).map(|_| t.created()).collect();
    for tok in &tokens {
        open_when_visible(&t.b, tok, binding(1), None).await;
    }
    // One reader waits, so that b's follower connection exists before the count.
    let mut first = t.b.open(&tokens[0], binding(1), None).await.expect("open");
    let first_read = tokio::spawn(async move { read_all(&mut first).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = clients(&mut conn).await;
    let mut reading = vec![first_read];
    for i in 1..READERS {
        let tok = tokens[i % tokens.len()].clone();
        let mut r = t.b.open(&tok, binding(1), None).await.expect("open");
        reading.push(tokio::spawn(async move { read_all(&mut r).await }));
    }
    assert!(
        matches!(t.b.open(&tokens[0], binding(1), None).await, Err(OpenError::Busy)),
        "past max_readers, refused"
    );
    for seq in 1..=30 {
        for tok in &tokens {
            assert!(append(&t.a, tok, seq..=seq));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let during = clients(&mut conn).await;
    for tok in &tokens {
        t.a.finish(tok, 30, End::Completed);
    }
    for (i, r) in reading.into_iter().enumerate() {
        let (text, _, end) = within(PATIENCE, "a follower", r).await.expect("reader task");
        end.expect("ends");
        assert_eq!(text, events(&tokens[i % tokens.len()], 1..=30), "reader {i}");
    }
    eprintln!("Redis clients: {before} with one follower, {during} with {READERS}");
    assert!(
        during <= before,
        "{before} clients before, {during} with {READERS} followers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_get_the_streams_agent_as_stored_and_updated() {
    let Some(t) = two(opts()).await else { return };
    let tok = t.created();
    let mut r = open_when_visible(&t.b, &tok, binding(1), None).await;
    assert_eq!(r.agent(), AGENT);
    t.a.set_agent(&tok, "agent-9");
    assert!(append(&t.a, &tok, 1..=1));
    let (bytes, _) = within(PATIENCE, "next", r.next()).await.expect("next").expect("events");
    assert_eq!(std::str::from_utf8(&bytes).unwrap(), event(&tok, 1));
    assert_eq!(r.agent(), "agent-9", "the agent learnt after the create");
}

// ---- issue 38: what the write path costs Redis ----

/// Redis's own count of the commands it ran (`INFO commandstats`), by command, and their sum.
async fn commands(conn: &mut redis::aio::MultiplexedConnection) -> (HashMap<String, u64>, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    let mut by = HashMap::new();
    for line in info.lines() {
        // `cmdstat_xadd:calls=12,usec=…`
        let Some((name, rest)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else {
            continue;
        };
        let calls = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        by.insert(name.to_owned(), calls);
    }
    let total = by.values().sum();
    (by, total)
}

/// `streams` streams written one event per append at `rate` events/s each for `secs`, as a gateway's owner
/// writes paced upstreams; the Redis commands per event over the run (every command Redis ran but this probe's
/// own `INFO`), and the count by command.
async fn commands_per_event(streams: usize, rate: u64, secs: u64) -> Option<(f64, Vec<(String, f64)>)> {
    let server = RedisServer::start()?;
    // The production heartbeat; a buffer the run overfills, so the per-stream bound trims too.
    let o = RedisOptions {
        buffer_bytes: 16 << 10,
        ..RedisOptions::default()
    };
    let counts = Arc::new(Counts::default());
    let store = RedisStore::connect(&server.url(), o, counts.clone())
        .await
        .expect("connect");
    let mut conn = redis_conn(&server).await;
    let (before, before_total) = commands(&mut conn).await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let store = store.clone();
        tasks.spawn(async move {
            let tok = token();
            store.create(&tok, binding(1), AGENT);
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let last = rate * secs;
            for seq in 1..=last {
                tick.tick().await;
                assert!(append(&store, &tok, seq..=seq), "the store keeps up");
            }
            store.finish(&tok, last, End::Completed);
            tok
        });
    }
    let tokens: Vec<String> = tasks.join_all().await;
    let last = rate * secs;
    for tok in &tokens {
        server.wait_visible(tok, PATIENCE).await;
    }
    // Every stream's end in Redis means every write of it is done.
    within(PATIENCE, "every stream finished", async {
        loop {
            let mut pipe = redis::pipe();
            for tok in &tokens {
                pipe.hget(format!("sse-gateway:{{{tok}}}:meta"), "state");
            }
            let states: Vec<Option<String>> = pipe.query_async(&mut conn).await.expect("HGET");
            if states.iter().all(|s| s.as_deref() == Some("finished")) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let (after, after_total) = commands(&mut conn).await;
    let events = (streams as u64 * last) as f64;
    // This probe's own: the INFOs, and the EXISTS and HGETs of the waits.
    let own = |k: &str| matches!(k, "info" | "hget" | "exists");
    let probe: u64 = after
        .iter()
        .filter(|(k, _)| own(k))
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0))
        .sum();
    let mut by: Vec<(String, f64)> = after
        .iter()
        .filter(|(k, _)| !own(k))
        .map(|(k, v)| (k.clone(), (v - before.get(k).copied().unwrap_or(0)) as f64 / events))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    by.sort_by(|a, b| b.1.total_cmp(&a.1));
    let per_event = (after_total - before_total - probe) as f64 / events;
    eprintln!(
        "{:.1} events per write round",
        events / counts.ok("write").max(1) as f64
    );
    Some((per_event, by))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_writes_cost_at_most_1_5_redis_commands_per_event() {
    // The two loads: light (events one per write round) and the paced `cost` load.
    let mut over = Vec::new();
    for (streams, rate, secs) in [(10, 100, 4), (50, 400, 3)] {
        let Some((per_event, by)) = commands_per_event(streams, rate, secs).await else {
            return;
        };
        let by: Vec<String> = by.iter().map(|(k, v)| format!("{k} {v:.3}")).collect();
        eprintln!(
            "{streams} streams × {rate} events/s for {secs} s: {per_event:.2} Redis commands per event ({})",
            by.join(", ")
        );
        if per_event > 1.5 {
            over.push(format!("{per_event:.2} at {streams} × {rate}/s"));
        }
    }
    assert!(over.is_empty(), "commands per event over 1.5: {over:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_nobody_refreshes_expires() {
    // Appends set no expiry but the first: a stream whose owner is gone must still go `ttl` after.
    let ttl = Duration::from_millis(1500);
    let Some((t, mut conn)) = two_watched(|o| o.ttl = ttl).await else {
        return;
    };
    let tok = t.created();
    for seq in 1..=50 {
        assert!(append(&t.a, &tok, seq..=seq));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut r = open_when_visible(&t.b, &tok, binding(1), Some(49)).await;
    let (events, _) = within(PATIENCE, "the last event", r.next())
        .await
        .expect("next")
        .expect("an event");
    assert_eq!(events, Bytes::from(event(&tok, 50)));
    let key = |what: &str| format!("sse-gateway:{{{tok}}}:{what}");
    for what in ["events", "meta", "owner"] {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key(what))
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(pttl > 0 && pttl <= ttl.as_millis() as i64, "{what}: PTTL {pttl}");
    }
    // The owner's instance goes (its writer and heartbeat stop); nothing refreshes the stream any more.
    let Two { server, a, b, .. } = t;
    drop((a, b, r));
    within(PATIENCE, "the stream's keys expire", async {
        loop {
            let left: u64 = redis::cmd("EXISTS")
                .arg(key("events"))
                .arg(key("meta"))
                .arg(key("owner"))
                .query_async(&mut conn)
                .await
                .expect("EXISTS");
            if left == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    drop(server);
}
