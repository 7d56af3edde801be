//! Resumption across gateway instances (issue 15): two gateway processes, A and B, share a real `redis-server`
//! (`resume.store = "redis"`, one binding key) in front of one paced legacy upstream. A run started on A is
//! resumed, watched, cancelled and read after A's death on B; Redis dies under a live run; a reconnection on B
//! keeps A's grace period going. Skipped (with a note) when `redis-server` is not installed, unless CI=true.

mod harness;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use harness::cors::{assert_answer, Cors};
use harness::legacy::text_block;
use harness::prelude::*;
use harness::redis_server::RedisServer;
use harness::sse::split_id;
use sse_gateway::translate::{translate_all, Options};

/// The binding key both instances share (at least 32 characters).
const KEY: &str = "resume-instances-test-binding-key-0123456789";
/// The client's credentials: a bound header.
const AUTH: &str = "Bearer user-1";
const AGENT: &str = "agent-7";
/// The page's origin, which the backend allows with credentials; and one it does not.
const APP: &str = "http://127.0.0.1:5173";
const EVIL: &str = "http://evil.test";
/// Pause between two text pieces of the paced upstream.
const PACE: Duration = Duration::from_millis(80);
/// Bound on any single wait of these tests; reaching it is a failure.
const WAIT: Duration = Duration::from_secs(10);

// ---- the upstream ----

/// The legacy stream of a run: an open text block, `words` pieces, its end, a `meta_final` and `[DONE]`, item by
/// item.
fn legacy_items(words: usize) -> Vec<Vec<u8>> {
    text_block(
        (0..words).map(|i| format!("word{i:03} ")),
        &["<meta_final data=\"{&quot;ok&quot;:true}\"></meta_final>", "[DONE]"],
    )
}

/// The whole legacy body of a run of `words` pieces.
fn legacy(words: usize) -> Vec<u8> {
    legacy_items(words).concat()
}

/// What the gateway must send for it, ids aside.
fn expected(words: usize) -> Vec<u8> {
    translate_all(Options::default(), AGENT, &legacy(words)).0
}

/// An upstream answering `/run/<words>` (and `/run/<words>/<anything>`) with a paced run of that many pieces;
/// `/hold` with a run that never ends, reporting when the gateway closes it. Its CORS is the legacy app's
/// (Starlette's middleware allowing [`APP`] with credentials); requests without `Origin` are not affected.
async fn upstream() -> Emulator {
    Emulator::start(|r| Cors::legacy_app(APP).apply(r, || run_answer(r))).await
}

fn run_answer(r: &Recorded) -> Vec<Step> {
    {
        if r.target == "/hold" {
            return vec![
                sse_head(),
                Step::write_all(b"data: <content-block-text>\n\ndata: one \n\ndata: two \n\ndata: three \n\n"),
                Step::AwaitClose,
            ];
        }
        let words = r
            .target
            .trim_start_matches("/run/")
            .split('/')
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or(5);
        paced(legacy_items(words), PACE)
    }
}

// ---- the instances ----

/// Redis, the upstream and the two gateways.
struct Setup {
    redis: RedisServer,
    up: Emulator,
    a: Process,
    b: Process,
}

/// Starts Redis, the upstream and two gateways on it; A gets `a_extra` settings too. `None`: no redis-server.
async fn setup(a_extra: &[(&str, &str)]) -> Option<Setup> {
    let redis = RedisServer::start()?;
    let up = upstream().await;
    let url = redis.url();
    let shared = [
        ("SSE_GATEWAY__RESUME__STORE", "redis"),
        ("SSE_GATEWAY__RESUME__REDIS_URL", url.as_str()),
        ("SSE_GATEWAY__RESUME__BINDING_KEY", KEY),
    ];
    let a_env: Vec<(&str, &str)> = shared.iter().chain(a_extra).copied().collect();
    let a = Process::against(&up.url(), &a_env);
    let b = Process::against(&up.url(), &shared);
    Some(Setup { redis, up, a, b })
}

impl Setup {
    /// A connection to the Redis server, to look at what the store holds.
    async fn redis_conn(&self) -> redis::aio::MultiplexedConnection {
        self.redis.connection().await
    }

    async fn wait_visible(&self, token: &str) {
        self.redis.wait_visible(token, WAIT).await;
    }

    /// The events the store holds for a stream, in order: (seq, text).
    async fn stored(&self, token: &str) -> Vec<(u64, String)> {
        let mut conn = self.redis_conn().await;
        let events = harness::redis_server::stored_events(&mut conn, token).await;
        events
            .into_iter()
            .map(|(seq, e)| (seq, String::from_utf8(e).expect("utf-8 event")))
            .collect()
    }

    /// Starts a run of `path` on A with the client's credentials, reads its first `n` events and waits until the
    /// store knows the stream; returns A's client, the stream's URL and its token.
    async fn run_on_a(&self, path: &str, n: usize) -> (Client, String, String) {
        let mut on_a = open(self.a.addr, &run_request(path, &[("Authorization", AUTH)])).await;
        let (url, token) = stream_of(&on_a);
        read_events(&mut on_a, n).await;
        self.wait_visible(&token).await;
        (on_a, url, token)
    }

    /// A watcher of stream `url` on B, with the client's credentials; answered 200.
    async fn watch_on_b(&self, url: &str) -> Client {
        let c = open(self.b.addr, &bare_request("GET", url, &[("Authorization", AUTH)])).await;
        assert_eq!(c.status, 200, "{}\n{}", c.head, self.logs());
        c
    }

    /// The client's reconnection on `addr` to its run of `path` after event `seq` of stream `token`; answered 200.
    async fn resume(&self, addr: SocketAddr, path: &str, token: &str, seq: u64) -> Client {
        let id = last_id(token, seq);
        let c = open(
            addr,
            &run_request(path, &[("Authorization", AUTH), ("Last-Event-ID", &id)]),
        )
        .await;
        assert_eq!(c.status, 200, "{}\n{}", c.head, self.logs());
        c
    }

    /// Both gateways' logs, for failure messages.
    fn logs(&self) -> String {
        format!("A's log:\n{}\nB's log:\n{}", self.a.log_tail(), self.b.log_tail())
    }
}

/// Fails the test if `fut` takes longer than `limit`.
async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"))
}

// ---- the clients ----

/// A translated run's request as an SSE client library sends it (the reconnection repeats it whole), with
/// `extra` headers.
fn run_request(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: gateway\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n\
         X-Agent-Id: {AGENT}\r\nX-Stream-Format: json\r\nContent-Length: 2\r\n"
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n{}");
    head.into_bytes()
}

/// A `GET` (a watcher) or another bodiless request with `extra` headers.
fn bare_request(method: &str, path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: gateway\r\n");
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// Sends `request` to `addr` and reads the response head.
async fn open(addr: SocketAddr, request: &[u8]) -> Client {
    within(WAIT, "a response head", async {
        let mut c = Client::write(addr, request).await.expect("connect and write");
        c.read_head().await.expect("response head");
        c
    })
    .await
}

/// A response header's value (the raw head's lines).
fn header(c: &Client, name: &str) -> Option<String> {
    c.head
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
}

/// The stream's URL and token, from `X-Gateway-Stream`.
fn stream_of(c: &Client) -> (String, String) {
    let url = header(c, "x-gateway-stream").unwrap_or_else(|| panic!("no X-Gateway-Stream in\n{}", c.head));
    let token = url.rsplit('/').next().expect("token").to_owned();
    assert_eq!(token.len(), 32, "{url}");
    (url, token)
}

/// One event a client got.
#[derive(Debug, Clone, PartialEq)]
struct Ev {
    /// Its seq, when it has an id.
    seq: Option<u64>,
    /// The whole event, its `id:`/`retry:` lines and its blank line included.
    text: String,
}

impl Ev {
    /// The event's envelope (its `data:` line as JSON).
    fn envelope(&self) -> serde_json::Value {
        envelopes(self.text.as_bytes()).pop().expect("an envelope")
    }
}

/// The whole events of a body (a cut last one left out; comment-only events, keepalives, skipped), checking
/// that every id names `token` when given.
fn events_of(body: &[u8]) -> Vec<Ev> {
    let text = String::from_utf8_lossy(body);
    let whole = text.rfind("\n\n").map_or("", |end| &text[..end + 2]);
    whole
        .split_inclusive("\n\n")
        .filter(|e| e.lines().any(|l| !l.is_empty() && !l.starts_with(':')))
        .map(|e| Ev {
            seq: e
                .lines()
                .find_map(|l| l.strip_prefix("id: "))
                .map(|id| split_id(id).unwrap_or_else(|| panic!("id {id:?} not ours")).1),
            text: e
                .lines()
                .filter(|l| !l.starts_with(':'))
                .map(|l| format!("{l}\n"))
                .collect(),
        })
        .collect()
}

/// Reads until the body holds at least `n` whole events; returns them.
async fn read_events(c: &mut Client, n: usize) -> Vec<Ev> {
    within(WAIT, &format!("{n} events"), async {
        loop {
            let evs = events_of(&c.body);
            if evs.len() >= n {
                return evs;
            }
            assert!(!c.ended, "the stream ended after {} events", evs.len());
            let got = c.read_some(64 << 10).await.expect("read");
            assert!(got > 0 || c.ended, "connection closed after {} events", evs.len());
        }
    })
    .await
}

/// Reads to the end of the body (its last chunk: never a silent cut); returns its events.
async fn read_all(c: &mut Client) -> Vec<Ev> {
    c.read_to_end(WAIT).await.expect("the body's end");
    assert!(c.ended, "the body ended without its last chunk");
    events_of(&c.body)
}

/// The events of several deliveries of one stream, each id once in order (a duplicate must be the same
/// event), as one text: every id from 1 without a gap.
fn merge(deliveries: &[&[Ev]]) -> String {
    let mut out: Vec<&Ev> = Vec::new();
    for ev in deliveries.iter().flat_map(|d| d.iter()) {
        let seq = ev.seq.expect("every event of the run has an id");
        match out.get(seq as usize - 1) {
            Some(held) => assert_eq!(held.text, ev.text, "two deliveries of event {seq} differ"),
            None => {
                assert_eq!(
                    seq as usize,
                    out.len() + 1,
                    "event {seq} after {} events: a gap",
                    out.len()
                );
                out.push(ev);
            }
        }
    }
    out.iter().map(|e| e.text.as_str()).collect()
}

/// The events as one text.
fn text(evs: &[Ev]) -> String {
    evs.iter().map(|e| e.text.as_str()).collect()
}

/// The `error` events among `evs`, for failure messages.
fn errors(evs: &[Ev]) -> String {
    let errors: Vec<&Ev> = evs.iter().filter(|e| kind(&e.envelope()) == "error").collect();
    errors.iter().map(|e| e.text.as_str()).collect()
}

/// The last event is an `error` envelope of delta type `kind` (and the stream ended there).
fn assert_ends_with_error(evs: &[Ev], kind: &str, who: &str) {
    let last = evs.last().unwrap_or_else(|| panic!("{who}: no events")).envelope();
    assert_eq!(
        (harness::sse::kind(&last), error_type(&last).as_str()),
        ("error", kind),
        "{who}: last envelope {last}"
    );
}

/// The requests the upstream received for `path`.
fn requests_for(up: &Emulator, path: &str) -> usize {
    up.recorded().iter().filter(|r| r.target == path).count()
}

/// `Last-Event-ID` of event `seq` of `token`.
fn last_id(token: &str, seq: u64) -> String {
    format!("sg1-{token}-{seq}")
}

// ---- the tests ----

/// Start on A, cut, resume on B: B sends the rest live, then the end; the deliveries make the uninterrupted
/// run, and the upstream ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_on_a_is_resumed_on_b() {
    let Some(s) = setup(&[]).await else { return };
    const WORDS: usize = 30;
    let cut_path = format!("/run/{WORDS}/cut");
    let auth = [("Authorization", AUTH)];

    // The same script read whole, on its own path, meanwhile.
    let whole_addr = s.b.addr;
    let whole_path = format!("/run/{WORDS}/whole");
    let whole = tokio::spawn(async move {
        let mut c = open(whole_addr, &run_request(&whole_path, &auth)).await;
        assert_eq!(c.status, 200, "{}", c.head);
        read_all(&mut c).await
    });

    let mut on_a = open(s.a.addr, &run_request(&cut_path, &auth)).await;
    assert_eq!(on_a.status, 200, "{}", on_a.head);
    let (_, token) = stream_of(&on_a);
    let first = read_events(&mut on_a, 8).await;
    on_a.disconnect(true);
    s.wait_visible(&token).await;

    // Resumed two events before the last one received: those two come again.
    let from = first.last().and_then(|e| e.seq).expect("an id") - 2;
    let mut on_b = s.resume(s.b.addr, &cut_path, &token, from).await;
    assert_eq!(stream_of(&on_b).1, token, "B names the same stream");
    let b_first = read_events(&mut on_b, 3).await;
    let upstream_running = !s.up.conn(&cut_path).expect("the run's connection").done;
    let rest = read_all(&mut on_b).await;
    assert!(
        upstream_running,
        "B's first events came after the upstream ended: not live"
    );
    assert_eq!(b_first[0].seq, Some(from + 1), "B starts after the Last-Event-ID");
    assert!(rest.len() > 5, "B sent the rest: {} events", rest.len());
    assert!(
        rest.iter().all(|e| !matches!(kind(&e.envelope()), "error")),
        "an error in B's stream: {}",
        errors(&rest)
    );

    let merged = merge(&[&first, &rest]);
    let whole = within(WAIT, "the whole run", whole).await.expect("whole run task");
    assert_eq!(
        String::from_utf8_lossy(&without_ids(merged.as_bytes())),
        String::from_utf8_lossy(&without_ids(text(&whole).as_bytes())),
        "the cut run's deliveries differ from the uninterrupted run"
    );
    assert_eq!(requests_for(&s.up, &cut_path), 1, "the upstream ran the cut run once");
}

/// A watcher on B, attached mid-run to a stream A runs, gets the whole stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_on_b_gets_the_whole_stream_of_a() {
    let Some(s) = setup(&[]).await else { return };
    let path = "/run/25";
    let (mut on_a, url, _) = s.run_on_a(path, 6).await;

    let mut watcher = s.watch_on_b(&url).await;
    let early = read_events(&mut watcher, 1).await;
    let upstream_running = !s.up.conn(path).expect("the run's connection").done;
    let watched = read_all(&mut watcher).await;
    let original = read_all(&mut on_a).await;
    assert!(
        upstream_running,
        "the watcher attached after the run ended: not mid-run"
    );
    assert_eq!(early[0].seq, Some(1), "from the start");
    assert_eq!(
        text(&watched),
        text(&original),
        "the watcher's stream differs from the original"
    );
    assert_eq!(
        String::from_utf8_lossy(&without_ids(text(&watched).as_bytes())),
        String::from_utf8_lossy(&expected(25))
    );
    assert_eq!(requests_for(&s.up, path), 1);
}

/// A dies mid-run: B's follower gets every event A stored, then `upstream_lost`, then the end; a reconnect to B
/// afterwards, the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_on_b_end_with_upstream_lost_when_a_dies() {
    let Some(s) = setup(&[]).await else { return };
    let path = "/run/60";
    let (on_a, url, token) = s.run_on_a(path, 5).await;
    let mut follower = s.watch_on_b(&url).await;
    read_events(&mut follower, 6).await;

    assert!(
        !s.up.conn(path).expect("the run's connection").done,
        "the run ended before A was killed: not mid-run"
    );
    s.a.signal("KILL");
    let killed = Instant::now();
    let got = read_all(&mut follower).await;
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(6), "the loss seen after {took:?}");
    let conn = s.up.conn(path).expect("the run's connection");
    assert!(
        conn.written < legacy(60).len() as u64,
        "the upstream wrote its whole run: A died after the run"
    );

    let stored = s.stored(&token).await;
    assert!(stored.len() >= 6, "{} events stored", stored.len());
    let (events, last) = got.split_at(got.len() - 1);
    assert_ends_with_error(last, "upstream_lost", "B's follower");
    let want: String = stored.iter().map(|(_, e)| e.as_str()).collect();
    assert_eq!(text(events), want, "B's follower got other than every stored event");
    assert!(stored.iter().enumerate().all(|(i, (seq, _))| *seq == i as u64 + 1));
    // What A's client got is the same stream.
    let from_a = events_of(&on_a.body);
    let common = from_a.len().min(events.len());
    assert_eq!(text(&from_a[..common]), text(&events[..common]));

    // A reconnect after A died: the stored events after its id, then the same envelope.
    let mut again = s.resume(s.b.addr, path, &token, 2).await;
    let replayed = within(Duration::from_secs(6), "the reconnect's end", read_all(&mut again)).await;
    let (events, last) = replayed.split_at(replayed.len() - 1);
    assert_ends_with_error(last, "upstream_lost", "the reconnect");
    assert_eq!(text(events), want[stored[0].1.len() + stored[1].1.len()..]);
    assert_eq!(requests_for(&s.up, path), 1, "never forwarded");
}

/// A dies mid-run; a reconnect on B after the last stored event gets no event to take the agent from: the
/// `upstream_lost` envelope still names the stream's agent (stored with the stream), not an empty one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lost_envelope_on_b_names_the_streams_agent() {
    let Some(s) = setup(&[]).await else { return };
    let path = "/run/60";
    let (_on_a, _, token) = s.run_on_a(path, 5).await;
    s.a.signal("KILL");
    let stored = s.stored(&token).await;
    let last = stored.last().map(|(seq, _)| *seq).expect("events stored");
    let mut again = s.resume(s.b.addr, path, &token, last).await;
    let got = within(Duration::from_secs(8), "the reconnect's end", read_all(&mut again)).await;
    // Whatever A stored after that read, then the loss.
    assert_ends_with_error(&got, "upstream_lost", "the reconnect");
    let envelope = got.last().expect("an envelope").envelope();
    assert_eq!(envelope["agent"].as_str(), Some(AGENT), "{envelope}");
}

/// Other bound headers on B: 404 as if unknown; an unknown token on B: 410 `resume_unknown`. None forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_refuses_a_wrong_binding_and_an_unknown_token() {
    let Some(s) = setup(&[]).await else { return };
    let path = "/run/20";
    let (mut on_a, url, token) = s.run_on_a(path, 3).await;
    let b = |p: &str| format!("http://{}{p}", s.b.addr);
    let id = last_id(&token, 1);
    let error_of = |body: &[u8]| -> String {
        serde_json::from_slice::<serde_json::Value>(body).expect("a JSON error body")["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };

    let unknown = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    let unknown_id = last_id(&unknown, 3);
    let (other, auth) = (("authorization", "Bearer user-2"), ("authorization", AUTH));
    let (resume, resume_unknown) = (("last-event-id", id.as_str()), ("last-event-id", unknown_id.as_str()));
    let watch_unknown = b(&format!("/_gateway/streams/{unknown}"));
    // Other bound headers: 404 as if unknown; an unknown token: 410.
    for (what, method, target, headers, status, error) in [
        (
            "reconnect, other Authorization",
            "POST",
            b(path),
            vec![other, resume],
            404,
            "not_found",
        ),
        (
            "reconnect, no Authorization",
            "POST",
            b(path),
            vec![resume],
            404,
            "not_found",
        ),
        (
            "watch, other Authorization",
            "GET",
            b(&url),
            vec![other],
            404,
            "not_found",
        ),
        (
            "cancel, other Authorization",
            "DELETE",
            b(&url),
            vec![other],
            404,
            "not_found",
        ),
        (
            "reconnect, unknown token",
            "POST",
            b(path),
            vec![auth, resume_unknown],
            410,
            "resume_unknown",
        ),
        (
            "watch, unknown token",
            "GET",
            watch_unknown,
            vec![auth],
            410,
            "resume_unknown",
        ),
    ] {
        let (parts, body) = within(WAIT, what, send(method, &target, &headers, "{}")).await;
        assert_eq!(parts.status, status, "{what}: {}", String::from_utf8_lossy(&body));
        assert_eq!(error_of(&body), error, "{what}");
    }

    // The refused cancel cancelled nothing: A's run ends as it would have.
    let all = read_all(&mut on_a).await;
    assert_eq!(
        String::from_utf8_lossy(&without_ids(text(&all).as_bytes())),
        String::from_utf8_lossy(&expected(20))
    );
    assert_eq!(requests_for(&s.up, path), 1, "nothing forwarded");
    assert_eq!(s.up.recorded().len(), 1, "nothing forwarded");
    let m = s.b.metrics().await;
    assert_eq!(resume_requests(&m, "denied"), 3.0);
    assert_eq!(resume_requests(&m, "unknown"), 2.0);
}

/// `DELETE` on B of a stream A holds: 204, A drops the upstream within about 3 s, and A's client ends with a
/// `stream_cancelled` envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_on_b_cancels_the_run_on_a() {
    let Some(mut s) = setup(&[]).await else { return };
    let auth = [("Authorization", AUTH)];
    let (mut on_a, url, _) = s.run_on_a("/hold", 3).await;

    let target = format!("http://{}{url}", s.b.addr);
    let (parts, body) = within(WAIT, "DELETE", send("DELETE", &target, &auth, "")).await;
    assert_eq!(parts.status, 204, "{}\n{}", String::from_utf8_lossy(&body), s.logs());
    let deleted = Instant::now();
    let closed = tokio::time::timeout(Duration::from_secs(4), s.up.closed.recv()).await;
    assert!(
        matches!(closed, Ok(Some(_))),
        "the upstream connection still open 4 s after the DELETE\n{}",
        s.logs()
    );
    let took = deleted.elapsed();
    assert!(
        took < Duration::from_millis(3500),
        "upstream closed {took:?} after the DELETE"
    );
    let all = read_all(&mut on_a).await;
    assert_ends_with_error(&all, "stream_cancelled", "A's client");
    assert!(
        all.last().and_then(|e| e.seq).is_some(),
        "the cancel envelope is held, with its id"
    );
    assert_eq!(requests_for(&s.up, "/hold"), 1);
}

/// Redis down: a `DELETE` on B of a stream it cannot look up answers 503 `resume_unavailable` (as a reconnect
/// does), never 404 "no such stream", and A's run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_on_b_while_redis_is_down_is_503() {
    let Some(mut s) = setup(&[]).await else { return };
    let (mut on_a, url, _) = s.run_on_a("/run/20", 3).await;
    s.redis.kill();
    let target = format!("http://{}{url}", s.b.addr);
    let (parts, body) = within(WAIT, "DELETE", send("DELETE", &target, &[("Authorization", AUTH)], "")).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(parts.status, 503, "{body}\n{}", s.logs());
    assert!(body.contains("resume_unavailable"), "{body}");
    let all = read_all(&mut on_a).await;
    assert!(errors(&all).is_empty(), "A's run was not cancelled: {}", errors(&all));
}

/// Redis dies mid-run: A's client still gets the whole run, the stream is counted not resumable, A stays ready
/// and resumes it from memory; B answers a reconnect with 410 or 503 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_mid_run_spares_the_live_stream() {
    let Some(mut s) = setup(&[]).await else { return };
    const WORDS: usize = 30;
    let path = "/run/30";
    let (mut on_a, _, token) = s.run_on_a(path, 5).await;
    assert_eq!(s.a.metric("sse_gateway_resume_unresumable_total", &[]).await, 0.0);

    s.redis.kill();
    assert!(
        !s.up.conn(path).expect("the run's connection").done,
        "the run ended before Redis was killed: not mid-run"
    );
    let all = read_all(&mut on_a).await;
    assert_eq!(
        String::from_utf8_lossy(&without_ids(text(&all).as_bytes())),
        String::from_utf8_lossy(&expected(WORDS)),
        "A's live client did not get the whole run\n{}",
        s.logs()
    );

    within(WAIT, "the stream counted not resumable", async {
        while s.a.metric("sse_gateway_resume_unresumable_total", &[]).await < 1.0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let (status, _) = http_get(s.a.admin, "/readyz").await;
    assert_eq!(status, 200, "A stays ready without Redis");

    // A still holds it.
    let mut again = s.resume(s.a.addr, path, &token, 2).await;
    let replayed = read_all(&mut again).await;
    assert_eq!(text(&replayed), text(&all[2..]), "A's replay from memory");

    // B cannot read it: refused, and soon.
    let asked = Instant::now();
    let id = last_id(&token, 2);
    let headers = [("authorization", AUTH), ("last-event-id", id.as_str())];
    let b_url = format!("http://{}{path}", s.b.addr);
    let (parts, body) = within(
        Duration::from_secs(5),
        "B's answer",
        send("POST", &b_url, &headers, "{}"),
    )
    .await;
    assert!(
        matches!(parts.status.as_u16(), 410 | 503),
        "B answered {} after {:?}: {}\n{}",
        parts.status,
        asked.elapsed(),
        String::from_utf8_lossy(&body),
        s.logs()
    );
    assert_eq!(requests_for(&s.up, path), 1, "never forwarded");
}

/// With a 2 s grace period on A, a client that leaves A and resumes on B at once reads on for longer than the
/// grace period: B reports its cursor, so A keeps the upstream to the run's natural end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_b_keeps_the_run_on_a_past_its_grace_period() {
    let Some(s) = setup(&[("SSE_GATEWAY__RESUME__GRACE_SECS", "2")]).await else {
        return;
    };
    const WORDS: usize = 60;
    let path = "/run/60";
    let auth = [("Authorization", AUTH)];
    let mut on_a = open(s.a.addr, &run_request(path, &auth)).await;
    let (_, token) = stream_of(&on_a);
    let first = read_events(&mut on_a, 4).await;
    on_a.disconnect(true);
    let left = Instant::now();
    s.wait_visible(&token).await;

    let last = first.last().and_then(|e| e.seq).expect("an id");
    let mut on_b = s.resume(s.b.addr, path, &token, last).await;
    // Slowly: a small read, then a pause, to the end.
    within(Duration::from_secs(15), "B's slow read", async {
        while !on_b.ended {
            if on_b.read_some(512).await.expect("read") == 0 && !on_b.ended {
                panic!("B's connection closed before the end of the body");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let read_for = left.elapsed();
    let rest = events_of(&on_b.body);
    assert!(
        rest.iter().all(|e| kind(&e.envelope()) != "error"),
        "B's stream has an error (the run abandoned?): {}\n{}",
        errors(&rest),
        s.logs()
    );
    assert!(
        read_for > Duration::from_secs(3),
        "the run ended {read_for:?} after the client left A: not past the 2 s grace period"
    );
    assert_eq!(
        String::from_utf8_lossy(&without_ids(merge(&[&first, &rest]).as_bytes())),
        String::from_utf8_lossy(&expected(WORDS))
    );

    // The upstream ran to its natural end: every byte written, never closed by A first.
    let conn = within(WAIT, "the upstream's end", async {
        loop {
            let c = s.up.conn(path).expect("the run's connection");
            if c.done {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(conn.closed, None, "A closed the upstream connection early");
    assert_eq!(
        conn.written,
        legacy(WORDS).len() as u64,
        "the upstream wrote its whole run"
    );
    assert_eq!(requests_for(&s.up, path), 1);
    let m = s.a.metrics().await;
    assert_eq!(resume_ended(&m, "abandoned"), 0.0);
    assert_eq!(resume_ended(&m, "completed"), 1.0);
}

/// A page on another origin reaches B for a stream A holds: B answers with the CORS answer A kept with the stream
/// in the store (DESIGN 5.1), to that origin only: the resumed stream, a preflight of the stream's URL, and a
/// `DELETE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_answers_a_cross_origin_page_with_the_streams_kept_cors() {
    let Some(s) = setup(&[]).await else { return };
    let from_app = [("Authorization", AUTH), ("Origin", APP)];
    // As a browser does before a JSON POST: what the backend allows this origin is learned from the answer.
    let ask = [
        ("Origin", APP),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "authorization,content-type"),
    ];
    let allowed = open(s.a.addr, &bare_request("OPTIONS", "/run/40", &ask)).await;
    assert_eq!(allowed.status, 200, "{}", allowed.head);
    let mut on_a = open(s.a.addr, &run_request("/run/40", &from_app)).await;
    assert_eq!(
        header_value(&on_a.head, "access-control-allow-origin"),
        Some(APP),
        "{}",
        on_a.head
    );
    let (url, token) = stream_of(&on_a);
    read_events(&mut on_a, 2).await;
    s.wait_visible(&token).await;
    let id = last_id(&token, 1);
    for (origin, want) in [(APP, Some(APP)), (EVIL, None)] {
        let h = [
            ("Authorization", AUTH),
            ("Origin", origin),
            ("Last-Event-ID", id.as_str()),
        ];
        let resumed = open(s.b.addr, &run_request("/run/40", &h)).await;
        assert_answer(&resumed, 200, want, &format!("{origin}\n{}", s.logs()));
        if want.is_some() {
            assert_eq!(
                header_value(&resumed.head, "access-control-allow-credentials"),
                Some("true")
            );
        }
    }
    let preflight = [("Origin", APP), ("Access-Control-Request-Method", "DELETE")];
    let pre = open(s.b.addr, &bare_request("OPTIONS", &url, &preflight)).await;
    assert_answer(&pre, 204, Some(APP), &s.logs());
    assert_eq!(header_value(&pre.head, "access-control-allow-methods"), Some("DELETE"));
    let deleted = open(s.b.addr, &bare_request("DELETE", &url, &from_app)).await;
    assert_answer(&deleted, 204, Some(APP), "a DELETE from the page's origin");
    assert_eq!(s.up.recorded().iter().filter(|r| r.method == "POST").count(), 1);
}
