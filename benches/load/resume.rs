//! `resume`: reconnect-to-first-replayed-byte latency of resumable streams (issue 15, docs/RESUME.md), per store,
//! and the saturation throughput of each store against the memory store.
//!
//! Each stream is a translated stream through the gateway (HTTP/1.1). The client reads `READ_DELTAS` deltas,
//! notes the last event id, cuts its TCP connection (the connection task is aborted: the socket closes), waits,
//! and sends the same request again on a new connection with `Last-Event-ID`. Timed: from sending that request
//! (the connection is already open) to the first byte of the replayed body. Then it reads the rest and checks
//! the whole: ids contiguous from the one it gave, no delta lost or repeated, `[DONE]` with the upstream's count.
//!
//! Stores are `Case`s; `DEFAULT_CASES` names those a run measures (`--stores` overrides): the memory store, the
//! Redis store resumed on the same instance, and on a second one. Each Redis case starts its own `redis-server`
//! (`procs::start_redis`: the tests' `RedisServer`), and is skipped with a note when it is not installed
//! (apt-get install -y redis-server).

use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::{JoinHandle, JoinSet};

use crate::client::{histogram, run_phase, Proto, Target};
use crate::common::{event_body, event_id, find_number_after, find_stamp, now_ns};
use crate::procs::{self, Proc};
use crate::redis_server::RedisServer;
use crate::report::{ms, n, q, verdict, Report};
use crate::Opts;

/// Where held events live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Memory,
    Redis,
}

/// One store set-up: its name (`--stores`), store, and whether the reconnect goes to a second gateway
/// instance (which then reads the stream from the store: the case the Redis store exists for).
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    pub store: Store,
    pub other_instance: bool,
}

/// Every case the harness knows.
pub const CASES: [Case; 3] = [
    Case {
        name: "memory",
        store: Store::Memory,
        other_instance: false,
    },
    Case {
        name: "redis",
        store: Store::Redis,
        other_instance: false,
    },
    Case {
        name: "redis-other",
        store: Store::Redis,
        other_instance: true,
    },
];

/// The cases a run measures unless `--stores` says otherwise. Add `"redis", "redis-other"` once the gateway's
/// Redis store lands (this build accepts `resume.store = "redis"` but holds events in memory: the harness
/// notices, from `sse_gateway_resume_store_operations_total`, and says so).
pub const DEFAULT_CASES: &[&str] = &["memory", "redis", "redis-other"];

/// The binding key the gateways of a Redis case share (`resume.binding_key`, at least 32 characters).
const BINDING_KEY: &str = "sse-gateway-load-harness-binding-key-0001";

/// Per-stream delta interval while the reconnects happen: 20 ev/s per stream.
const INTERVAL_US: u64 = 50_000;
/// Deltas read before the cut.
const READ_DELTAS: u64 = 10;
/// Between the cut and the reconnect (staggered): the pump reads on meanwhile, so events are held after the
/// client's last id.
const GAP: Duration = Duration::from_millis(100);
/// Live after the reconnect, before the upstream ends the stream.
const TAIL: Duration = Duration::from_secs(1);

/// The environment of a case's gateway(s).
pub(crate) fn case_env(case: &Case, redis_port: Option<u16>) -> Vec<(String, String)> {
    let mut env = Vec::new();
    if case.store == Store::Redis {
        let port = redis_port.unwrap_or(0);
        env.push(("SSE_GATEWAY__RESUME__STORE".into(), "redis".into()));
        env.push((
            "SSE_GATEWAY__RESUME__REDIS_URL".into(),
            format!("redis://127.0.0.1:{port}"),
        ));
        env.push(("SSE_GATEWAY__RESUME__BINDING_KEY".into(), BINDING_KEY.into()));
    }
    env
}

/// A case's processes: the Redis server (Redis cases), the gateway the streams start on (A) and the one the
/// reconnects go to (B: A again, or a second instance).
struct Running {
    _redis: Option<RedisServer>,
    a: (Proc, u16, u16),
    b: Option<(Proc, u16, u16)>,
}

impl Running {
    fn start(opts: &Opts, case: &Case, upstream: u16) -> Result<Self, String> {
        let dir = procs::scratch(&format!("resume-{}", case.name));
        let (redis, port) = match case.store {
            Store::Redis => {
                let redis = procs::start_redis()?;
                let port = redis.port;
                (Some(redis), Some(port))
            }
            Store::Memory => (None, None),
        };
        let env = case_env(case, port);
        let gw = |tag: &str| {
            let d = dir.join(tag);
            procs::spawn_gateway(
                &opts.gateway,
                &procs::Place {
                    wrapper: &[],
                    dir: &d,
                    upstream,
                    cpus: opts.proxy_cpus(),
                    env: &env,
                },
            )
        };
        let a = gw("a")?;
        let b = if case.other_instance { Some(gw("b")?) } else { None };
        Ok(Self { _redis: redis, a, b })
    }

    fn b(&self) -> &(Proc, u16, u16) {
        self.b.as_ref().unwrap_or(&self.a)
    }

    fn check_alive(&mut self) -> Result<(), String> {
        let b_dead = self.b.as_mut().is_some_and(|b| !b.0.alive());
        if !self.a.0.alive() || b_dead {
            return Err("a gateway of the resume scenario exited (see its log under /tmp/sse-gateway-load-*)".into());
        }
        Ok(())
    }

    /// Sum of a metric over the gateway(s).
    fn metric(&self, name: &str, labels: &str) -> f64 {
        let mut admins = vec![self.a.2];
        if let Some(b) = &self.b {
            admins.push(b.2);
        }
        admins
            .into_iter()
            .filter_map(|a| procs::http_get(a, "/metrics").ok())
            .filter_map(|page| procs::metric(&page, name, labels))
            .sum()
    }
}

/// When the reconnects happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timing {
    /// Each stream on its own, `GAP` after its cut: the streams start over a ramp, so the reconnects are spread
    /// over it (the latency of one reconnect, with the others' live traffic going on).
    Staggered,
    /// All at the same instant, after every stream has been cut (a load balancer restart).
    Burst,
}

impl Timing {
    fn label(self) -> &'static str {
        match self {
            Timing::Staggered => "staggered",
            Timing::Burst => "burst",
        }
    }
}

/// What one phase's streams share.
struct Ctx {
    a: SocketAddr,
    b: SocketAddr,
    start_ns: u64,
    until_ns: u64,
    reconnect_at: Option<Instant>,
    deadline: Instant,
}

/// One stream's figures.
struct Sample {
    /// Request sent → first byte of the replayed body.
    first_byte: Duration,
    /// Request sent → response head.
    head: Duration,
    /// TCP connect + HTTP/1.1 handshake of the new connection (not in `first_byte`).
    connect: Duration,
}

/// One SSE event as the resume check needs it.
struct Event {
    /// The seq of its `id:` (none: a comment, or no id).
    seq: Option<u64>,
    /// `sg1-<token>-` of its id.
    stem: Option<String>,
    id: Option<String>,
    delta: Option<u64>,
    done: bool,
    announced: Option<u64>,
    error: Option<String>,
}

/// Splits a body into events as it arrives.
#[derive(Default)]
struct Events {
    carry: Vec<u8>,
}

impl Events {
    fn feed(&mut self, data: &[u8]) -> Vec<Event> {
        self.carry.extend_from_slice(data);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(p) = memchr::memmem::find(&self.carry[start..], b"\n\n") {
            let raw = &self.carry[start..start + p];
            start += p + 2;
            if raw.first() == Some(&b':') {
                continue;
            }
            let id = event_id(raw).map(|v| String::from_utf8_lossy(v).into_owned());
            let (stem, seq) = match id.as_deref().and_then(|i| i.rsplit_once('-')) {
                Some((stem, seq)) => (Some(format!("{stem}-")), seq.parse().ok()),
                None => (None, None),
            };
            let body = event_body(raw);
            let data = body.strip_prefix(b"data: ").unwrap_or(body);
            out.push(Event {
                seq,
                stem,
                id,
                delta: find_stamp(data).map(|(_, s)| s),
                done: data == b"[DONE]",
                announced: find_number_after(data, b"load_events"),
                error: memchr::memmem::find(data, b"\"type\":\"error\"")
                    .map(|_| String::from_utf8_lossy(&data[..data.len().min(300)]).into_owned()),
            });
        }
        self.carry.drain(..start);
        out
    }
}

/// What the stream has shown so far, checked event by event.
#[derive(Default)]
struct Check {
    stem: Option<String>,
    last_seq: u64,
    last_id: Option<String>,
    next_delta: u64,
    done: bool,
    announced: Option<u64>,
}

impl Check {
    fn take(&mut self, id: usize, ev: Event) -> Result<(), String> {
        if let Some(e) = ev.error {
            return Err(format!("stream {id}: error envelope: {e}"));
        }
        if let (Some(seq), Some(stem)) = (ev.seq, ev.stem) {
            if self.stem.as_ref().is_some_and(|s| *s != stem) {
                return Err(format!("stream {id}: another stream's id {stem}"));
            }
            if seq != self.last_seq + 1 {
                return Err(format!("stream {id}: id {seq} after {}", self.last_seq));
            }
            self.stem = Some(stem);
            self.last_seq = seq;
            self.last_id = ev.id;
        } else if !ev.done {
            return Err(format!("stream {id}: an event without an id"));
        }
        if let Some(d) = ev.delta {
            if d != self.next_delta {
                return Err(format!("stream {id}: delta {d}, expected {}", self.next_delta));
            }
            self.next_delta += 1;
        }
        if ev.announced.is_some() {
            self.announced = ev.announced;
        }
        self.done |= ev.done;
        Ok(())
    }
}

pub(crate) async fn open(addr: SocketAddr) -> Result<(http1::SendRequest<Empty<Bytes>>, JoinHandle<()>), String> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    let (send, conn) = http1::handshake(TokioIo::new(s))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((send, task))
}

fn request(ctx: &Ctx, addr: SocketAddr, id: usize, last: Option<&str>) -> Result<Request<Empty<Bytes>>, String> {
    let phase = (id as u64).wrapping_mul(2_654_435_761) % INTERVAL_US;
    let mut r = Request::get(format!(
        "http://{addr}/stream?kind=rated&interval_us={INTERVAL_US}&start_ns={}&until_ns={}&phase_us={phase}&bytes=0&id={id}",
        ctx.start_ns, ctx.until_ns
    ))
    .header("host", addr.to_string())
    .header("accept", "text/event-stream")
    // A bound header (resume.bind_headers): the reconnect repeats it, as a browser repeats its cookie.
    .header("authorization", format!("Bearer load-{id}"));
    if let Some(last) = last {
        r = r.header("last-event-id", last);
    }
    r.body(Empty::new()).map_err(|e| e.to_string())
}

pub(crate) async fn send(
    s: &mut http1::SendRequest<Empty<Bytes>>,
    req: Request<Empty<Bytes>>,
    id: usize,
) -> Result<http::Response<Incoming>, String> {
    let resp = s
        .send_request(req)
        .await
        .map_err(|e| format!("stream {id}: request failed: {e}"))?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("stream {id}: status {}", refusal(resp).await));
    }
    Ok(resp)
}

/// A response that is not the stream, for a report: `<status>: <the first 200 bytes of its body>`.
pub async fn refusal(resp: http::Response<Incoming>) -> String {
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    format!("{status}: {}", String::from_utf8_lossy(&body[..body.len().min(200)]))
}

/// One stream: read, cut, reconnect (timed), read to the end, check.
async fn one(ctx: Arc<Ctx>, id: usize) -> Result<Sample, String> {
    let mut check = Check::default();
    let mut events = Events::default();
    // The original request, read until `READ_DELTAS` deltas.
    {
        let (mut s, conn) = open(ctx.a).await?;
        let resp = send(&mut s, request(&ctx, ctx.a, id, None)?, id).await?;
        let mut body = resp.into_body();
        while check.next_delta < READ_DELTAS {
            let Some(frame) = body.frame().await else {
                return Err(format!("stream {id}: ended before the cut"));
            };
            let frame = frame.map_err(|e| format!("stream {id}: body failed before the cut: {e}"))?;
            let Ok(data) = frame.into_data() else { continue };
            for ev in events.feed(&data) {
                check.take(id, ev)?;
            }
        }
        // The cut: the connection task goes, and with it the socket. What was in flight is lost to the client,
        // as when a network goes away; the reconnect's `Last-Event-ID` says what it has.
        conn.abort();
        drop(body);
        drop(s);
    }
    let last = check
        .last_id
        .clone()
        .ok_or_else(|| format!("stream {id}: no id before the cut"))?;
    events = Events::default();
    let after_cut = Instant::now() + GAP;
    let at = ctx.reconnect_at.map_or(after_cut, |t| t.max(after_cut));
    tokio::time::sleep_until(at.into()).await;
    // The reconnect.
    let t_connect = Instant::now();
    let (mut s, _conn) = open(ctx.b).await?;
    let connect = t_connect.elapsed();
    let req = request(&ctx, ctx.b, id, Some(&last))?;
    let sent = Instant::now();
    let resp = send(&mut s, req, id).await?;
    let head = sent.elapsed();
    let mut body = resp.into_body();
    let mut first_byte = None;
    loop {
        let frame = match tokio::time::timeout_at(ctx.deadline.into(), body.frame()).await {
            Ok(Some(f)) => f.map_err(|e| format!("stream {id}: replayed body failed: {e}"))?,
            Ok(None) => break,
            Err(_) => return Err(format!("stream {id}: not finished by the deadline")),
        };
        let Ok(data) = frame.into_data() else { continue };
        if first_byte.is_none() && !data.is_empty() {
            first_byte = Some(sent.elapsed());
        }
        for ev in events.feed(&data) {
            check.take(id, ev)?;
        }
    }
    if !check.done {
        return Err(format!(
            "stream {id}: ended without [DONE] after delta {}",
            check.next_delta
        ));
    }
    if check.announced != Some(check.next_delta) {
        return Err(format!(
            "stream {id}: {} deltas, upstream sent {:?}",
            check.next_delta, check.announced
        ));
    }
    Ok(Sample {
        first_byte: first_byte.ok_or_else(|| format!("stream {id}: empty replayed body"))?,
        head,
        connect,
    })
}

/// What a phase of one case measured.
struct Measured {
    first_byte: Histogram<u64>,
    head: Histogram<u64>,
    connect: Histogram<u64>,
    ok: usize,
    failures: Vec<String>,
}

async fn reconnect_phase(run: &Running, streams: usize, timing: Timing) -> Measured {
    let ramp_per_sec = 200.0;
    let t0 = Instant::now();
    let ramp = Duration::from_secs_f64(streams as f64 / ramp_per_sec);
    let read = Duration::from_micros(INTERVAL_US * (READ_DELTAS + 1));
    // Staggered: each stream sends at once, so its cut and reconnect follow its own start. Burst: all quiet
    // until the ramp is over, then cut within one interval of each other, reconnecting together.
    let (start, reconnect_at) = match timing {
        Timing::Staggered => (t0, None),
        Timing::Burst => (t0 + ramp, Some(t0 + ramp + read + GAP * 3)),
    };
    let ns =
        |at: Instant| now_ns() + u64::try_from(at.saturating_duration_since(Instant::now()).as_nanos()).unwrap_or(0);
    let end = reconnect_at.unwrap_or(t0 + ramp + read + GAP) + TAIL;
    let ctx = Arc::new(Ctx {
        a: procs::addr(run.a.1),
        b: procs::addr(run.b().1),
        start_ns: ns(start),
        until_ns: ns(end),
        reconnect_at,
        deadline: end + Duration::from_secs(15),
    });
    let dt = Duration::from_secs_f64(1.0 / ramp_per_sec);
    let mut set = JoinSet::new();
    for id in 0..streams {
        let ctx = Arc::clone(&ctx);
        let at = t0 + dt * id as u32;
        set.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let deadline = ctx.deadline;
            match tokio::time::timeout_at(deadline.into(), one(ctx, id)).await {
                Ok(r) => r,
                Err(_) => Err(format!("stream {id}: not finished by the deadline")),
            }
        });
    }
    let mut m = Measured {
        first_byte: histogram(),
        head: histogram(),
        connect: histogram(),
        ok: 0,
        failures: Vec::new(),
    };
    let ns_of = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(s)) => {
                m.ok += 1;
                m.first_byte.saturating_record(ns_of(s.first_byte));
                m.head.saturating_record(ns_of(s.head));
                m.connect.saturating_record(ns_of(s.connect));
            }
            Ok(Err(e)) => m.failures.push(e),
            Err(e) => m.failures.push(format!("stream task: {e}")),
        }
    }
    m
}

pub async fn resume(opts: &Opts, up: &[u16], rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let streams = opts.resume_streams.unwrap_or(if opts.quick { 50 } else { 200 });
    let names: Vec<String> = match &opts.stores {
        Some(s) => s.clone(),
        None => DEFAULT_CASES.iter().map(|s| s.to_string()).collect(),
    };
    let mut cases = Vec::new();
    for name in &names {
        let case = CASES
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| format!("--stores: unknown store case {name:?} (known: memory, redis, redis-other)"))?;
        cases.push(*case);
    }
    rep.line("## resume: reconnect with Last-Event-ID, to the first replayed byte\n");
    rep.line(format!(
        "{streams} translated streams over HTTP/1.1 per phase (`--resume-streams` sets it), each at {} ev/s, \
         opened at 200/s. Each reads {READ_DELTAS} deltas, then its client cuts the TCP connection and, {} ms \
         later (staggered) or all at one instant after every stream was cut (burst), sends the same request on \
         a new connection with `Last-Event-ID` (and the same `authorization`, a bound header). **First byte** = \
         that request sent → first byte of the replayed body (the connection is open before: its TCP connect + \
         handshake is the last column); **head** = → response head. Every stream is then read to its end and \
         checked: ids contiguous from the one given, no delta lost or repeated, `[DONE]` with the upstream's \
         count. `replayed` is the gateways' `sse_gateway_resume_requests_total{{outcome=\"replayed\"}}`; \
         `gateway first byte` their own `sse_gateway_resume_first_byte_seconds` (mean). Fresh gateway(s) per \
         store; the client shares the 2 cores with the gateway and upstream, so these are wall-clock figures on \
         a shared machine.\n",
        1_000_000 / INTERVAL_US,
        GAP.as_millis()
    ));
    rep.line("| store | reconnect to | timing | reconnects ok | first byte p50 / p99 / max ms | head p50 / p99 ms | connect p50 / p99 ms | replayed | gateway first byte mean ms | failed |");
    rep.line("|---|---|---|---|---|---|---|---|---|---|");
    // (case, staggered first-byte p99, reconnects that succeeded).
    let mut staggered_p99: Vec<(Case, f64, usize)> = Vec::new();
    let mut not_used: Vec<&'static str> = Vec::new();
    let mut running = Vec::new();
    for case in &cases {
        if case.store == Store::Redis && !procs::redis_installed() {
            rep.line(format!(
                "| {} | — | — | skipped: redis-server is not installed (apt-get install -y redis-server) | | | | | | |",
                case.name
            ));
            continue;
        }
        let mut run = Running::start(opts, case, up[2])?;
        for timing in [Timing::Staggered, Timing::Burst] {
            let replayed0 = run.metric("sse_gateway_resume_requests_total", "outcome=\"replayed\"");
            let (fb_sum0, fb_n0) = (
                run.metric("sse_gateway_resume_first_byte_seconds_sum", ""),
                run.metric("sse_gateway_resume_first_byte_seconds_count", ""),
            );
            let m = reconnect_phase(&run, streams, timing).await;
            run.check_alive()?;
            let replayed = run.metric("sse_gateway_resume_requests_total", "outcome=\"replayed\"") - replayed0;
            let fb_sum = run.metric("sse_gateway_resume_first_byte_seconds_sum", "") - fb_sum0;
            let fb_n = run.metric("sse_gateway_resume_first_byte_seconds_count", "") - fb_n0;
            if !m.failures.is_empty() {
                *ok = false;
                rep.line(format!(
                    "**{} of {streams} reconnecting streams FAILED ({}, {})**; first: {}",
                    m.failures.len(),
                    case.name,
                    timing.label(),
                    m.failures.iter().take(3).cloned().collect::<Vec<_>>().join(" | ")
                ));
            }
            if timing == Timing::Staggered {
                staggered_p99.push((*case, q(&m.first_byte, 0.99), m.ok));
            }
            rep.line(format!(
                "| {} | {} | {} | {} | {} / {} / {} | {} / {} | {} / {} | {} | {} | {} |",
                case.name,
                if case.other_instance {
                    "another instance"
                } else {
                    "same instance"
                },
                timing.label(),
                n(m.ok as f64),
                ms(q(&m.first_byte, 0.5)),
                ms(q(&m.first_byte, 0.99)),
                ms(m.first_byte.max() as f64),
                ms(q(&m.head, 0.5)),
                ms(q(&m.head, 0.99)),
                ms(q(&m.connect, 0.5)),
                ms(q(&m.connect, 0.99)),
                n(replayed),
                if fb_n > 0.0 {
                    format!("{:.2}", fb_sum / fb_n * 1e3)
                } else {
                    "—".into()
                },
                m.failures.len()
            ));
        }
        if case.store == Store::Redis && run.metric("sse_gateway_resume_store_operations_total", "") <= 0.0 {
            not_used.push(case.name);
        }
        running.push((*case, run));
    }
    rep.line("");
    for (case, p99, done) in &staggered_p99 {
        let (limit, what) = match case.store {
            Store::Memory => (5e6, "memory store"),
            Store::Redis => (10e6, "Redis on loopback"),
        };
        let v = if *done == 0 {
            "MISSED (no reconnect succeeded)"
        } else if not_used.contains(&case.name) {
            "not a Redis figure (see below)"
        } else {
            verdict(*p99 <= limit)
        };
        rep.line(format!(
            "- {} ({}): first replayed byte p99 {} ms, staggered; target ≤ {} ms ({what}, issue 15): {v}",
            case.name,
            if case.other_instance {
                "reconnect to another instance"
            } else {
                "same instance"
            },
            ms(*p99),
            limit / 1e6,
        ));
    }
    for name in &not_used {
        rep.line(format!(
            "- **{name}: the gateway did not use Redis** (`sse_gateway_resume_store_operations_total` is 0): this \
             build does not implement `resume.store = \"redis\"`; its figures are the memory store's"
        ));
    }
    // One throughput row per store: the streams run on instance A, so a second instance changes nothing.
    let mut seen = Vec::new();
    running.retain(|(c, _)| {
        let first = !seen.contains(&c.store);
        seen.push(c.store);
        first
    });
    saturation(opts, &mut running, &not_used, rep, ok).await?;
    Ok(())
}

/// Saturation throughput of each store, interleaved rounds (the Redis store's target: ≥ 0.8 × memory).
async fn saturation(
    opts: &Opts,
    running: &mut [(Case, Running)],
    not_used: &[&str],
    rep: &mut Report,
    ok: &mut bool,
) -> Result<(), String> {
    if running.is_empty() {
        return Ok(());
    }
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 });
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.0 } else { 3.0 }));
    let plan = crate::scenarios::saturation_plan(100, window, Proto::H1);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); running.len()];
    for round in 0..rounds {
        let mut idx: Vec<usize> = (0..running.len()).collect();
        if round % 2 == 1 {
            idx.reverse();
        }
        for i in idx {
            let (case, run) = &mut running[i];
            let t = Target {
                name: case.name,
                addr: procs::addr(run.a.1),
                h2_addr: procs::addr(run.a.1),
                format: None,
                translated: true,
            };
            let r = run_phase(&t, &plan, Arc::new(AtomicUsize::new(0))).await;
            run.check_alive()?;
            crate::scenarios::report_failures(&r, &t, &plan, rep, ok);
            rates[i].push(r.rate());
        }
    }
    rep.line(format!(
        "\n### resume: saturation throughput by store (100 streams over HTTP/1.1, {:.0} s window, {rounds} \
         interleaved round(s), median)\n",
        window.as_secs_f64()
    ));
    rep.line("| store | events/s (median) | by round | / memory |");
    rep.line("|---|---|---|---|");
    let med = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let memory = running
        .iter()
        .position(|(c, _)| c.store == Store::Memory)
        .map(|i| med(&rates[i]));
    for ((case, _), r) in running.iter().zip(&rates) {
        let ratio = memory.map(|m| med(r) / m.max(1.0));
        rep.line(format!(
            "| {} | {} | {} | {} |",
            case.name,
            n(med(r)),
            r.iter().map(|v| n(*v)).collect::<Vec<_>>().join(", "),
            match ratio {
                Some(x) if not_used.contains(&case.name) => format!("{x:.2} (not a Redis figure)"),
                Some(x) if case.store == Store::Redis => format!("{x:.2} (target ≥ 0.8: {})", verdict(x >= 0.8)),
                Some(x) => format!("{x:.2}"),
                None => "—".into(),
            }
        ));
    }
    rep.line("");
    Ok(())
}
