//! `redis`: the Redis store at scale (issue 26, part 4). Two gateway instances, A and B, on one real
//! `redis-server` (`resume.store = "redis"`, one binding key), and a third gateway M with the memory store, all with
//! `resume.buffer_bytes = 64 KiB`, measured in one run:
//!
//! 1. Redis memory per held stream (`INFO memory` used_memory above the empty baseline, per stream) against
//!    `buffer_bytes`, for streams that write many times that;
//! 2. Redis connections of each instance (its sockets whose peer is the Redis port, from /proc) as watchers on B
//!    follow streams owned by A;
//! 3. events per second through the store per instance, paced and at saturation, A alone and A with B;
//! 4. CPU per event of the gateway (and of `redis-server`) with the Redis store against the memory store.
//!
//! Everything is read from outside the gateway (Redis's own `INFO`, /proc, what the client received), so the
//! figures hold whatever the store does inside: the same command measures the code before and after a change.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::client::{run_phase, stream_url, Kind, PhaseResult, Plan, Proto, Target};
use crate::common::now_ns;
use crate::procs::{self, Proc};
use crate::redis_server::RedisServer;
use crate::report::{median, n, readers_failed, verdict, Report};
use crate::resume::{case_env, open, refusal, send, CASES};
use crate::Opts;

/// `resume.buffer_bytes` of every gateway of the scenario: the floor the gateway accepts, so that the bound is
/// visible with streams of a few thousand events.
const BUFFER_BYTES: usize = 64 << 10;
/// Redis memory per held stream counts as bounded by `buffer_bytes` up to this multiple of it (Redis's own
/// per-entry and per-key overhead on top of the events' bytes).
const BOUND_FACTOR: f64 = 2.0;
/// Paced load of the CPU rows: as `cost` (issue 16), 50 streams × 400 events/s.
const PACED: (usize, f64) = (50, 400.0);
/// Streams per instance in the saturation rows.
const SATURATION_STREAMS: usize = 100;
/// Streams owned by A that B's watchers follow, and their pace (events/s each).
const OWNED: usize = 10;
const OWNED_RATE: u64 = 20;
/// One Redis command's longest wait.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

type Gw = (Proc, u16, u16);

/// A small RESP client over its own connection: `INFO`, `CLIENT LIST`; replies that are not a bulk string, a
/// simple string or an integer are errors (the harness asks nothing else).
struct Resp {
    r: BufReader<TcpStream>,
}

impl Resp {
    async fn connect(port: u16) -> Result<Self, String> {
        let s = TcpStream::connect(procs::addr(port))
            .await
            .map_err(|e| format!("redis: connect: {e}"))?;
        Ok(Self { r: BufReader::new(s) })
    }

    async fn cmd(&mut self, args: &[&str]) -> Result<String, String> {
        tokio::time::timeout(REDIS_TIMEOUT, self.round_trip(args))
            .await
            .map_err(|_| format!("redis: {} timed out", args.join(" ")))?
    }

    async fn round_trip(&mut self, args: &[&str]) -> Result<String, String> {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        let io = |e: std::io::Error| format!("redis: {e}");
        self.r.get_mut().write_all(out.as_bytes()).await.map_err(io)?;
        let mut line = String::new();
        self.r.read_line(&mut line).await.map_err(io)?;
        let rest = line.get(1..).unwrap_or("").trim_end();
        match line.as_bytes().first() {
            Some(b'+' | b':') => Ok(rest.to_owned()),
            Some(b'$') => {
                let len: i64 = rest.parse().map_err(|_| format!("redis: bad bulk length {rest:?}"))?;
                let Ok(len) = usize::try_from(len) else {
                    return Ok(String::new());
                };
                let mut buf = vec![0; len + 2];
                self.r.read_exact(&mut buf).await.map_err(io)?;
                buf.truncate(len);
                Ok(String::from_utf8_lossy(&buf).into_owned())
            }
            _ => Err(format!("redis: {} answered {:?}", args.join(" "), line.trim_end())),
        }
    }

    /// What Redis says about itself now (one `INFO all`).
    async fn stat(&mut self) -> Result<RedisStat, String> {
        let info = self.cmd(&["INFO", "all"]).await?;
        let field = |key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // `cmdstat_xadd:calls=N,usec=…` and `db0:keys=N,expires=…`.
        let sub = |prefix: &str, key: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix(key)))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok(RedisStat {
            used_memory: field("used_memory"),
            xadd: sub("cmdstat_xadd:", "calls="),
            commands: field("total_commands_processed"),
            net_in: field("total_net_input_bytes"),
            keys: sub("db0:", "keys="),
            clients: field("connected_clients"),
        })
    }
}

/// A snapshot of Redis's `INFO`.
#[derive(Clone, Copy, Default)]
struct RedisStat {
    used_memory: f64,
    /// `XADD` commands so far (one per stored event when each event is an entry).
    xadd: f64,
    commands: f64,
    net_in: f64,
    keys: f64,
    /// Connected clients, this harness's own connection included.
    clients: f64,
}

/// ESTABLISHED TCP sockets (their inodes) whose peer port is `port`, from /proc/net/tcp and tcp6.
fn sockets_to(port: u16) -> Vec<u64> {
    let mut out = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for l in text.lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (Some(rem), Some(st), Some(inode)) = (f.get(2), f.get(3), f.get(9)) else {
                continue;
            };
            let rem_port = rem.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if rem_port == Some(port) && *st == "01" {
                if let Ok(i) = inode.parse() {
                    out.push(i);
                }
            }
        }
    }
    out
}

/// How many of `pid`'s open sockets are among `inodes`: its connections to Redis.
fn conns_of(pid: u32, inodes: &[u64]) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse::<u64>()
                .ok()
        })
        .filter(|i| inodes.contains(i))
        .count()
}

/// The `redis-server` this driver started (its child).
fn redis_pid() -> Option<u32> {
    procs::children(std::process::id())
        .into_iter()
        .find(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "redis-server"))
}

/// A metric of one gateway (0 when unreadable).
fn metric(admin: u16, name: &str) -> f64 {
    procs::http_get(admin, "/metrics")
        .ok()
        .and_then(|page| procs::metric(&page, name, ""))
        .unwrap_or(0.0)
}

/// A gateway's settings as environment variables.
pub(crate) type Settings = Vec<(String, String)>;

/// The settings of the Redis-store gateways (on `redis_port`) and of the memory-store one: their defaults but
/// `buffer_bytes`.
pub(crate) fn envs(redis_port: u16) -> (Settings, Settings) {
    let buffer = ("SSE_GATEWAY__RESUME__BUFFER_BYTES".to_owned(), BUFFER_BYTES.to_string());
    let mut redis_env = case_env(&CASES[1], Some(redis_port));
    redis_env.push(buffer.clone());
    (redis_env, vec![buffer])
}

/// The scenario's processes: Redis, the Redis-store instances A and B, the memory-store gateway M.
struct Rig {
    redis: RedisServer,
    redis_pid: Option<u32>,
    a: Gw,
    b: Gw,
    m: Gw,
    resp: Resp,
    tck: f64,
}

impl Rig {
    async fn start(opts: &Opts, up: &[u16]) -> Result<Self, String> {
        let redis = procs::start_redis()?;
        let (redis_env, memory_env) = envs(redis.port);
        let gw = |tag: &str, upstream: u16, env: &[(String, String)]| {
            procs::spawn_gateway(
                &opts.gateway,
                &procs::Place {
                    wrapper: &[],
                    dir: &procs::scratch(&format!("redis-{tag}")),
                    upstream,
                    cpus: opts.proxy_cpus(),
                    env,
                },
            )
        };
        let a = gw("a", up[2], &redis_env)?;
        let b = gw("b", up[3], &redis_env)?;
        let m = gw("memory", up[4], &memory_env)?;
        let resp = Resp::connect(redis.port).await?;
        Ok(Self {
            redis_pid: redis_pid(),
            redis,
            a,
            b,
            m,
            resp,
            tck: procs::clk_tck(),
        })
    }

    fn check_alive(&mut self) -> Result<(), String> {
        for g in [&mut self.a, &mut self.b, &mut self.m] {
            if !g.0.alive() {
                return Err(
                    "a gateway of the redis scenario exited (see its log under /tmp/sse-gateway-load-*)".into(),
                );
            }
        }
        Ok(())
    }

    /// Connections to Redis of A and B.
    fn conns(&self) -> (usize, usize) {
        let inodes = sockets_to(self.redis.port);
        (conns_of(self.a.0.pid(), &inodes), conns_of(self.b.0.pid(), &inodes))
    }

    /// Waits until Redis has had no `XADD` for half a second (the store's writer caught up), at most 10 s.
    async fn quiesce(&mut self) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(10);
        let mut last = self.resp.stat().await?.xadd;
        let mut still = 0;
        while still < 2 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.resp.stat().await?.xadd;
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
        Ok(())
    }
}

fn target(name: &'static str, port: u16) -> Target {
    Target {
        name,
        addr: procs::addr(port),
        h2_addr: procs::addr(port),
        format: None,
        translated: true,
    }
}

fn kib(bytes: f64) -> String {
    format!("{:.1}", bytes / 1024.0)
}

pub async fn redis(opts: &Opts, up: &[u16], rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    rep.line("## redis: the Redis store at scale (issue 26)\n");
    if !procs::redis_installed() {
        rep.line("Skipped: redis-server is not installed (apt-get install -y redis-server).\n");
        return Ok(());
    }
    let mut rig = Rig::start(opts, up).await?;
    let version = rig.resp.cmd(&["INFO", "server"]).await.unwrap_or_default();
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    rep.line(format!(
        "One `redis-server` {version} (pid {}, port {}, no persistence, its defaults) started by the harness; \
         gateways A (pid {}) and B (pid {}) with `resume.store = \"redis\"` and one binding key, M (pid {}) with the \
         memory store; all three with `resume.buffer_bytes = {}` and their other defaults, release binary. \
         Redis figures come from its `INFO`; an instance's Redis connections are its ESTABLISHED sockets to the \
         Redis port (/proc); CPU is /proc user+system ticks (10 ms) of the process over the phase. The client, \
         upstream, gateways and Redis share the machine's cores.\n",
        rig.redis_pid.map_or("?".into(), |p| p.to_string()),
        rig.redis.port,
        rig.a.0.pid(),
        rig.b.0.pid(),
        rig.m.0.pid(),
        n(BUFFER_BYTES as f64)
    ));
    // Memory first, on the empty server: later phases leave retained streams behind.
    held_memory(opts, &mut rig, rep, ok).await?;
    rig.check_alive()?;
    connections(opts, &mut rig, rep, ok).await?;
    rig.check_alive()?;
    throughput(opts, &mut rig, rep, ok).await?;
    rig.check_alive()?;
    let (redis_env, memory_env) = envs(rig.redis.port);
    crate::instructions::redis_store(opts, up, memory_env, redis_env, rep, ok).await?;
    Ok(())
}

/// 1. Redis memory per held stream against `buffer_bytes`.
async fn held_memory(opts: &Opts, rig: &mut Rig, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let streams = if opts.quick { 20 } else { 50 };
    let window = Duration::from_secs_f64(if opts.quick { 2.0 } else { 3.0 });
    let plan = Plan {
        kind: Kind::Rated,
        streams,
        // 1,000 events/s per stream: a few thousand events, several times `buffer_bytes`, in seconds.
        interval_us: 1000,
        ramp_per_sec: 2000.0,
        warm: Duration::from_millis(200),
        window,
        cut_at_end: false,
        large_bytes: 0,
        proto: Proto::H1,
        grace: Duration::from_secs(15),
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = rig.resp.stat().await?;
    let unres0 = metric(rig.a.2, "sse_gateway_resume_unresumable_total");
    // The live sample: near the end of the window, every stream still running.
    let t0 = Instant::now();
    let ramp = Duration::from_secs_f64(streams as f64 / plan.ramp_per_sec);
    let live_at = t0 + ramp + plan.warm + window.mul_f64(0.9);
    let t = target("A", rig.a.1);
    let p = plan.clone();
    let phase = tokio::spawn(async move { run_phase(&t, &p, Arc::new(AtomicUsize::new(0))).await });
    tokio::time::sleep_until(live_at.into()).await;
    let live = rig.resp.stat().await?;
    let r = phase.await.map_err(|e| format!("held-memory phase: {e}"))?;
    report_failures(&r, "A (held memory)", rep, ok);
    rig.quiesce().await?;
    let end = rig.resp.stat().await?;
    let unres = metric(rig.a.2, "sse_gateway_resume_unresumable_total") - unres0;
    let s = streams as f64;
    let per = |x: f64| x / s;
    let retained = per(end.used_memory - base.used_memory);
    rep.line(format!(
        "### Redis memory per held stream\n\n{streams} streams on A over HTTP/1.1, each 1,000 events/s for {:.1} s \
         (the client reads everything; the upstream ends each with `[DONE]`). Baseline: Redis's used_memory with \
         the three gateways connected and no stream ({} KiB). **Live**: used_memory near the end of the window \
         (every stream running), above the baseline, per stream; **retained**: after every stream ended and \
         Redis saw no more `XADD` for 0.5 s. **Event bytes** = body bytes the client received per stream (the \
         events with their `id:` lines, what a store holds); **into Redis** = Redis's total_net_input_bytes over \
         the phase per stream (commands and their framing).\n",
        (plan.warm + window).as_secs_f64(),
        kib(base.used_memory)
    ));
    rep.line(
        "| streams | events per stream | event bytes per stream, KiB | into Redis per stream, KiB | Redis memory \
         per stream, live, KiB | retained, KiB | retained / buffer_bytes | Redis keys per stream | unresumable | \
         failed |",
    );
    rep.line("|---|---|---|---|---|---|---|---|---|---|");
    rep.line(format!(
        "| {streams} | {} | {} | {} | {} | {} | {:.2} | {:.1} | {} | {} |",
        n(per(r.events as f64)),
        kib(per(r.bytes as f64)),
        kib(per(end.net_in - base.net_in)),
        kib(per(live.used_memory - base.used_memory)),
        kib(retained),
        retained / BUFFER_BYTES as f64,
        per(end.keys - base.keys),
        n(unres),
        r.failed()
    ));
    rep.line(format!(
        "\n- Redis memory per held stream {} KiB against `resume.buffer_bytes` {} KiB: bounded (≤ {BOUND_FACTOR}× \
         buffer_bytes): {}\n",
        kib(retained),
        kib(BUFFER_BYTES as f64),
        verdict(retained <= BOUND_FACTOR * BUFFER_BYTES as f64)
    ));
    Ok(())
}

fn report_failures(r: &PhaseResult, what: &str, rep: &mut Report, ok: &mut bool) {
    if r.failures.is_empty() {
        return;
    }
    *ok = false;
    rep.line(format!(
        "**{} of {} streams FAILED on {what}**; first: {}",
        r.failed(),
        r.failed() + r.streams_ok,
        r.failures.iter().take(3).cloned().collect::<Vec<_>>().join(" | ")
    ));
}

/// Reads a stream's body to its end: (events with an id, whether `[DONE]` came).
async fn drain(mut body: hyper::body::Incoming, first: Arc<AtomicUsize>) -> Result<(u64, bool), String> {
    let (mut events, mut done, mut carry) = (0u64, false, Vec::new());
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("body failed after {events} events: {e}"))?;
        let Ok(data) = frame.into_data() else { continue };
        carry.extend_from_slice(&data);
        let mut start = 0;
        while let Some(p) = memchr::memmem::find(&carry[start..], b"\n\n") {
            let ev = &carry[start..start + p];
            start += p + 2;
            if ev.split(|b| *b == b'\n').any(|l| l.starts_with(b"id:")) {
                if events == 0 {
                    first.fetch_add(1, Ordering::Relaxed);
                }
                events += 1;
            }
            if memchr::memmem::find(ev, b"\"type\":\"error\"").is_some() {
                return Err(format!(
                    "error envelope after {events} events: {}",
                    String::from_utf8_lossy(&ev[..ev.len().min(300)])
                ));
            }
            done |= ev.split(|b| *b == b'\n').any(|l| l == b"data: [DONE]");
        }
        carry.drain(..start);
    }
    Ok((events, done))
}

fn get(addr: SocketAddr, path: &str, auth: &str) -> Result<Request<Empty<Bytes>>, String> {
    Request::get(format!("http://{addr}{path}"))
        .header("host", addr.to_string())
        .header("accept", "text/event-stream")
        .header("authorization", auth)
        .body(Empty::new())
        .map_err(|e| e.to_string())
}

/// 2. Redis connections per instance as watchers on B follow streams owned by A.
async fn connections(opts: &Opts, rig: &mut Rig, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let steps: &[usize] = if opts.quick { &[0, 10, 50] } else { &[0, 10, 50, 100] };
    let settle = Duration::from_secs_f64(if opts.quick { 1.0 } else { 2.0 });
    let (a, b) = (procs::addr(rig.a.1), procs::addr(rig.b.1));
    let life = settle * (steps.len() as u32 + 2) + Duration::from_secs(5);
    let until_ns = now_ns() + u64::try_from(life.as_nanos()).unwrap_or(0);
    let deadline = Instant::now() + life + Duration::from_secs(15);
    let mut failures: Vec<String> = Vec::new();
    // The owners on A: each stream's URL (`X-Gateway-Stream`) and its bound `authorization`.
    let mut owned = Vec::new();
    let mut tasks: JoinSet<Result<(u64, bool), String>> = JoinSet::new();
    let unused = Arc::new(AtomicUsize::new(0));
    for i in 0..OWNED {
        let auth = format!("Bearer redis-scale-{i}");
        let path = format!(
            "/stream?kind=rated&interval_us={}&start_ns=0&until_ns={until_ns}&phase_us={}&bytes=0&id={i}",
            1_000_000 / OWNED_RATE,
            i as u64 * 5000
        );
        let (mut s, conn) = open(a).await?;
        let resp = send(&mut s, get(a, &path, &auth)?, i).await?;
        let url = stream_url(&resp, &format!("owned stream {i}"))?;
        owned.push((url, auth));
        let body = resp.into_body();
        let unused = Arc::clone(&unused);
        tasks.spawn(async move {
            let r = drain(body, unused).await.map_err(|e| format!("owned stream {i}: {e}"));
            drop((s, conn));
            r
        });
    }
    let receiving = Arc::new(AtomicUsize::new(0));
    let mut watchers = 0;
    let mut rows = Vec::new();
    let mut attach_failed = 0;
    let mut refused = 0;
    let mut first_refusal: Option<String> = None;
    for &want in steps {
        while watchers < want {
            let (url, auth) = &owned[watchers % OWNED];
            let id = 1000 + watchers;
            watchers += 1;
            let attached = async {
                let (mut s, conn) = open(b).await?;
                let resp = s
                    .send_request(get(b, url, auth)?)
                    .await
                    .map_err(|e| format!("request failed: {e}"))?;
                Ok::<_, String>((s, conn, resp))
            }
            .await;
            let (s, conn, resp) = match attached {
                Ok((s, conn, resp)) if resp.status() == http::StatusCode::OK => (s, conn, resp),
                // A bound on remote readers (503 or 429, documented) is an answer, not a failure: counted apart.
                Ok((_, _, resp)) if matches!(resp.status().as_u16(), 429 | 503) => {
                    refused += 1;
                    if first_refusal.is_none() {
                        first_refusal = Some(refusal(resp).await);
                    }
                    continue;
                }
                Ok((_, _, resp)) => {
                    attach_failed += 1;
                    failures.push(format!("watcher {}: status {}", id - 1000, resp.status()));
                    continue;
                }
                Err(e) => {
                    attach_failed += 1;
                    failures.push(format!("watcher {}: {e}", id - 1000));
                    continue;
                }
            };
            let receiving = Arc::clone(&receiving);
            tasks.spawn(async move {
                let r = drain(resp.into_body(), receiving)
                    .await
                    .map_err(|e| format!("watcher {}: {e}", id - 1000));
                drop((s, conn));
                r
            });
        }
        tokio::time::sleep(settle).await;
        let (ca, cb) = rig.conns();
        let st = rig.resp.stat().await?;
        rows.push((
            want,
            ca,
            cb,
            st.clients - 1.0,
            receiving.load(Ordering::Relaxed),
            refused,
        ));
    }
    let mut ended = 0usize;
    loop {
        match tokio::time::timeout_at(deadline.into(), tasks.join_next()).await {
            Ok(Some(Ok(Ok((_, true))))) => ended += 1,
            Ok(Some(Ok(Ok((events, false))))) => {
                failures.push(format!("a reader ended without [DONE] after {events} events"))
            }
            Ok(Some(Ok(Err(e)))) => failures.push(e),
            Ok(Some(Err(e))) => failures.push(format!("reader task: {e}")),
            Ok(None) => break,
            Err(_) => {
                failures.push(format!("{} readers not finished by the deadline", tasks.len()));
                tasks.abort_all();
                break;
            }
        }
    }
    rep.line(format!(
        "### Redis connections per instance as readers grow\n\n{OWNED} streams owned by A ({OWNED_RATE} events/s \
         each, HTTP/1.1); watchers (`GET <X-Gateway-Stream>` with the stream's bound `authorization`) attached \
         to B, spread over those streams, added step by step and kept, {:.0} s after each step before counting. \
         **A / B connections**: the instance's ESTABLISHED sockets to the Redis port; **Redis clients**: \
         connected_clients less this harness's own connection (A, B and any other client); **receiving**: watchers \
         that got at least one event by then; **refused**: watchers answered 503 or 429 (a cap on remote readers), so far. \
         Every reader is then read to its end (`[DONE]`, no `error` envelope).\n",
        settle.as_secs_f64()
    ));
    rep.line("| watchers on B | A connections | B connections | Redis clients | receiving | refused |");
    rep.line("|---|---|---|---|---|---|");
    for (want, ca, cb, clients, recv, refused) in &rows {
        rep.line(format!("| {want} | {ca} | {cb} | {clients:.0} | {recv} | {refused} |"));
    }
    // B's connections with no watcher, with the first step's watchers, and with the most.
    let none = rows.first().map_or(0, |r| r.2);
    if let (Some(few), Some(most)) = (rows.iter().find(|r| r.0 > 0), rows.last()) {
        rep.line(format!(
            "\n- B's Redis connections: {none} with no watcher, {} with {}, {} with {}: {:+.2} per watcher from 0 to \
             {}; constant in the number of readers (no growth from {} to {} watchers): {}",
            few.2,
            few.0,
            most.2,
            most.0,
            (most.2 as f64 - none as f64) / most.0.max(1) as f64,
            most.0,
            few.0,
            most.0,
            verdict(most.2 <= few.2)
        ));
    }
    let readers = OWNED + watchers - attach_failed - refused;
    rep.line(format!(
        "- readers read to their end: {ended} of {readers} ({attach_failed} watchers failed to attach, {refused} \
         refused{})\n",
        first_refusal.map_or(String::new(), |r| format!("; the first refusal: {r}"))
    ));
    readers_failed(rep, ok, &failures, " (connections phase)");
    Ok(())
}

/// Which gateways a row loads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    A,
    M,
    AB,
}

/// One leg of a row run: what the client got from one instance, and what that instance spent.
struct Leg {
    rate: f64,
    events: u64,
    ticks: (u64, u64),
    unresumable: f64,
    failed: usize,
}

/// One run of a row: its legs and what Redis did meanwhile.
struct RowRun {
    legs: Vec<Leg>,
    redis_ticks: u64,
    xadd_per_sec: f64,
    commands_per_sec: f64,
    /// `XADD`s from the phase's start until Redis was quiet again.
    xadd_total: f64,
}

async fn run_row(rig: &mut Rig, who: Who, plan: &Plan, rep: &mut Report, ok: &mut bool) -> Result<RowRun, String> {
    let gws: Vec<(&'static str, u32, u16, u16)> = match who {
        Who::A => vec![("A", rig.a.0.pid(), rig.a.1, rig.a.2)],
        Who::M => vec![("M", rig.m.0.pid(), rig.m.1, rig.m.2)],
        Who::AB => vec![
            ("A", rig.a.0.pid(), rig.a.1, rig.a.2),
            ("B", rig.b.0.pid(), rig.b.1, rig.b.2),
        ],
    };
    let usage = |pid: u32| procs::usage(pid).unwrap_or_default();
    let before: Vec<procs::Usage> = gws.iter().map(|g| usage(g.1)).collect();
    let unres0: Vec<f64> = gws
        .iter()
        .map(|g| metric(g.3, "sse_gateway_resume_unresumable_total"))
        .collect();
    let redis0 = rig.redis_pid.map(usage).unwrap_or_default();
    let xadd0 = rig.resp.stat().await?.xadd;
    let t0 = Instant::now();
    let ramp = Duration::from_secs_f64(plan.streams as f64 / plan.ramp_per_sec);
    let ws = t0 + ramp + plan.warm;
    let mut set = JoinSet::new();
    for (i, g) in gws.iter().enumerate() {
        let t = target(g.0, g.2);
        let p = plan.clone();
        set.spawn(async move { (i, run_phase(&t, &p, Arc::new(AtomicUsize::new(0))).await) });
    }
    tokio::time::sleep_until(ws.into()).await;
    let s0 = rig.resp.stat().await?;
    tokio::time::sleep_until((ws + plan.window).into()).await;
    let s1 = rig.resp.stat().await?;
    let mut results: Vec<Option<PhaseResult>> = gws.iter().map(|_| None).collect();
    while let Some(r) = set.join_next().await {
        let (i, r) = r.map_err(|e| format!("phase task: {e}"))?;
        report_failures(&r, gws[i].0, rep, ok);
        results[i] = Some(r);
    }
    rig.check_alive()?;
    // What the store's writer does after the client's phase belongs to these events too.
    rig.quiesce().await?;
    let mut legs = Vec::new();
    for (i, g) in gws.iter().enumerate() {
        let r = results[i].take().ok_or("a phase returned nothing")?;
        let u = usage(g.1).since(before[i]);
        legs.push(Leg {
            rate: r.rate(),
            events: r.events,
            ticks: (u.user, u.system),
            unresumable: metric(g.3, "sse_gateway_resume_unresumable_total") - unres0[i],
            failed: r.failed(),
        });
    }
    let redis_ticks = rig.redis_pid.map(usage).unwrap_or_default().since(redis0);
    Ok(RowRun {
        legs,
        redis_ticks: redis_ticks.user + redis_ticks.system,
        xadd_per_sec: (s1.xadd - s0.xadd) / plan.window.as_secs_f64(),
        commands_per_sec: (s1.commands - s0.commands) / plan.window.as_secs_f64(),
        xadd_total: rig.resp.stat().await?.xadd - xadd0,
    })
}

/// 3 and 4. Events per second through the store per instance, and CPU per event against the memory store.
async fn throughput(opts: &Opts, rig: &mut Rig, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 }).max(1);
    let paced_window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.5 } else { 5.0 }));
    let sat_window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.0 } else { 3.0 }));
    let (paced_streams, per_stream) = PACED;
    let paced = crate::scenarios::rated_plan(
        paced_streams,
        paced_streams as f64 * per_stream,
        paced_window,
        Proto::H1,
    );
    let sat = crate::scenarios::saturation_plan(SATURATION_STREAMS, sat_window, Proto::H1);
    // (label, store, who, plan)
    let rows: [(&str, &str, Who, &Plan); 5] = [
        ("paced", "redis", Who::A, &paced),
        ("paced", "memory", Who::M, &paced),
        ("saturation", "redis", Who::A, &sat),
        ("saturation", "memory", Who::M, &sat),
        ("saturation, A and B at once", "redis", Who::AB, &sat),
    ];
    let mut runs: Vec<Vec<RowRun>> = rows.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        // Paced rows together, then saturation rows; reversed on odd rounds.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        if round % 2 == 1 {
            order[..2].reverse();
            order[2..].reverse();
        }
        for k in order {
            let (_, _, who, plan) = rows[k];
            runs[k].push(run_row(rig, who, plan, rep, ok).await?);
        }
    }
    let tck = rig.tck;
    rep.line(format!(
        "### Events per second through the store, and CPU per event against the memory store\n\n**paced**: \
         {paced_streams} streams × {per_stream:.0} events/s over HTTP/1.1 ({} events/s offered; {:.1} s warm-up, \
         {:.1} s window), as `cost`; **saturation**: {SATURATION_STREAMS} streams per instance as fast as they go \
         ({:.1} s window), cut at the window's end; A and B at once: {SATURATION_STREAMS} on each. **events/s**: \
         delivered to the client in the window (median over {rounds} interleaved round(s); by round); **XADD/s**: \
         Redis's `cmdstat_xadd` calls in the window (all instances); **XADD/event**: `XADD` calls from the phase's \
         start until Redis was quiet again, per event delivered over the phase (all instances; above 1 at \
         saturation, where the gateway reads events its cut clients never get); **Redis commands/event**: every command Redis \
         processed in the window per event delivered in it (all instances; this harness's two `INFO` included); **CPU µs/event**: the instance's user+system \
         CPU over the whole phase and until Redis saw no `XADD` for 0.5 s, per event delivered (of which user / \
         system), and `redis-server`'s CPU per event delivered (all instances' events); **unresumable**: the \
         instance's `sse_gateway_resume_unresumable_total` over the phase (streams whose writes to Redis were \
         given up).\n",
        n(paced_streams as f64 * per_stream),
        paced.warm.as_secs_f64(),
        paced_window.as_secs_f64(),
        sat_window.as_secs_f64()
    ));
    rep.line(
        "| load | store | instance | events/s (median) | by round | XADD/s | XADD/event | Redis commands/event | gateway CPU µs/event | of which user / \
         system | redis-server CPU µs/event | gateway + redis-server µs/event | unresumable | failed |",
    );
    rep.line("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let us_per_event = |ticks: u64, events: u64| ticks as f64 / tck * 1e6 / events.max(1) as f64;
    // (row, leg) → median gateway µs/event, gateway + Redis µs/event, events/s.
    let mut summary: Vec<Vec<(f64, f64, f64)>> = Vec::new();
    for (k, (label, store, who, _)) in rows.iter().enumerate() {
        let names: &[&str] = match who {
            Who::A => &["A"],
            Who::M => &["M"],
            Who::AB => &["A", "B"],
        };
        let mut row_summary = Vec::new();
        for (li, name) in names.iter().enumerate() {
            let legs: Vec<&Leg> = runs[k].iter().map(|r| &r.legs[li]).collect();
            let rates: Vec<f64> = legs.iter().map(|l| l.rate).collect();
            let cpu = median(
                legs.iter()
                    .map(|l| us_per_event(l.ticks.0 + l.ticks.1, l.events))
                    .collect(),
            );
            let user = median(legs.iter().map(|l| us_per_event(l.ticks.0, l.events)).collect());
            let system = median(legs.iter().map(|l| us_per_event(l.ticks.1, l.events)).collect());
            // Redis's CPU over every leg's events of the run.
            let redis = median(
                runs[k]
                    .iter()
                    .map(|r| us_per_event(r.redis_ticks, r.legs.iter().map(|l| l.events).sum()))
                    .collect(),
            );
            let both = median(
                runs[k]
                    .iter()
                    .map(|r| {
                        let l = &r.legs[li];
                        let all: u64 = r.legs.iter().map(|l| l.events).sum();
                        us_per_event(l.ticks.0 + l.ticks.1, l.events) + us_per_event(r.redis_ticks, all)
                    })
                    .collect(),
            );
            let xadd = median(runs[k].iter().map(|r| r.xadd_per_sec).collect());
            let stored = median(
                runs[k]
                    .iter()
                    .map(|r| r.xadd_total / r.legs.iter().map(|l| l.events).sum::<u64>().max(1) as f64)
                    .collect(),
            );
            let per_event = median(
                runs[k]
                    .iter()
                    .map(|r| r.commands_per_sec / r.legs.iter().map(|l| l.rate).sum::<f64>().max(1.0))
                    .collect(),
            );
            let rate = median(rates.clone());
            rep.line(format!(
                "| {label} | {store} | {name} | {} | {} | {} | {} | {} | {cpu:.2} | {user:.2} / {system:.2} | {} | {} | {} | {} |",
                n(rate),
                rates.iter().map(|r| n(*r)).collect::<Vec<_>>().join(", "),
                n(xadd),
                if *store == "redis" { format!("{stored:.2}") } else { "—".into() },
                if *store == "redis" { format!("{per_event:.2}") } else { "—".into() },
                if *store == "redis" { format!("{redis:.2}") } else { "—".into() },
                if *store == "redis" { format!("{both:.2}") } else { format!("{cpu:.2}") },
                n(legs.iter().map(|l| l.unresumable).sum()),
                legs.iter().map(|l| l.failed).sum::<usize>()
            ));
            // redis-server's CPU during a memory row is the other instances' background, not this row's.
            row_summary.push((cpu, if *store == "redis" { both } else { cpu }, rate));
        }
        summary.push(row_summary);
    }
    let (pr, pm) = (summary[0][0], summary[1][0]);
    rep.line(format!(
        "\n- CPU per paced event, gateway with the Redis store / memory store: {:.2} / {:.2} µs = {:.2}×; with \
         redis-server's share: {:.2} / {:.2} µs = {:.2}× (wall-clock CPU, 10 ms ticks, on a shared machine)",
        pr.0,
        pm.0,
        pr.0 / pm.0.max(f64::MIN_POSITIVE),
        pr.1,
        pm.1,
        pr.1 / pm.1.max(f64::MIN_POSITIVE)
    ));
    // Per row: XADD/s (median), streams given up by the store and streams run, over all rounds.
    let store = |k: usize| {
        let given_up: f64 = runs[k].iter().flat_map(|r| &r.legs).map(|l| l.unresumable).sum();
        let streams = runs[k].iter().map(|r| r.legs.len()).sum::<usize>() * rows[k].3.streams;
        (
            median(runs[k].iter().map(|r| r.xadd_per_sec).collect()),
            given_up,
            streams,
        )
    };
    let (sr, sm) = (summary[2][0].2, summary[3][0].2);
    let ratio = sr / sm.max(1.0);
    let (sat_xadd, sat_given_up, sat_streams) = store(2);
    rep.line(format!(
        "- saturation, Redis store / memory store, one instance: {} / {} events/s = {ratio:.2} (target ≥ 0.8, \
         issue 15: {}{})",
        n(sr),
        n(sm),
        verdict(ratio >= 0.8),
        if sat_given_up > 0.0 {
            format!(
                "; but the store gave up {} of {sat_streams} streams: those events were not all written",
                n(sat_given_up)
            )
        } else {
            String::new()
        }
    ));
    let (paced_xadd, _, _) = store(0);
    let (ab_xadd, ab_given_up, ab_streams) = store(4);
    rep.line(format!(
        "- through the store (Redis `XADD`s per second in the window): paced, A: {} for {} events/s delivered; \
         saturation, A alone: {} for {} events/s delivered, {} of {sat_streams} streams given up; A and B at \
         once: {} in all, {} of {ab_streams} streams given up",
        n(paced_xadd),
        n(summary[0][0].2),
        n(sat_xadd),
        n(sr),
        n(sat_given_up),
        n(ab_xadd),
        n(ab_given_up)
    ));
    let ab: f64 = summary[4].iter().map(|l| l.2).sum();
    rep.line(format!(
        "- saturation, A and B at once on one Redis: {} events/s in all ({}), against A alone {}\n",
        n(ab),
        summary[4]
            .iter()
            .zip(["A", "B"])
            .map(|(l, name)| format!("{name} {}", n(l.2)))
            .collect::<Vec<_>>()
            .join(", "),
        n(sr)
    ));
    Ok(())
}
