//! `websocket`: the WebSocket output against SSE (issue 28), side by side in one run, same gateway binary:
//!
//! 1. memory per idle reader: held streams (translated, their owners connected and reading, the upstream silent
//!    after its first delta), then N readers attached to them, either N SSE watchers (`GET <prefix>/<token>`) or
//!    N sockets on the same URLs; per reader = (peak RSS during the hold − RSS before the readers) / N. A fresh
//!    gateway per row, the same N and held streams in both;
//! 2. CPU per event: paced streams whose owner request leaves once the stream's URL is known (the stream goes on
//!    in its grace period), each read from its start by one reader, an SSE watcher or a socket; per event = user +
//!    system CPU of the gateway from the first paced delta to the last reader's end / deltas delivered.
//!
//! Every reader checks what it got: as many deltas as the upstream's `meta_final` announces, then `[DONE]` (SSE)
//! or a close 1000 (socket). The socket client is tokio-tungstenite (`sse-gateway.v1`, the default subprotocol).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use tokio::net::TcpStream;
use tokio::task::{JoinHandle, JoinSet};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use crate::client::stream_url;
use crate::common::{find_number_after, now_ns};
use crate::procs::{self, Proc};
use crate::report::{median, n, readers_failed, verdict, Report};
use crate::resume::{open, send};
use crate::Opts;

/// Paced load of the CPU rows: as `cost` (issue 16), 50 streams × 400 events/s.
const PACED: (usize, f64) = (50, 400.0);
/// Readers per held stream in the memory rows (below `resume.max_watchers_per_stream`, 16 by default).
const READERS_PER_STREAM: usize = 10;
/// How long a reader may take past the end of its stream.
const GRACE: Duration = Duration::from_secs(15);

type Gw = (Proc, u16, u16);

/// How a reader reads a held stream.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Via {
    /// `GET <prefix>/<token>`, `Accept: text/event-stream`: a watcher.
    Sse,
    /// A WebSocket on `<prefix>/<token>` (subprotocol `sse-gateway.v1`, the default).
    Socket,
}

impl Via {
    const BOTH: [Via; 2] = [Via::Sse, Via::Socket];

    fn label(self) -> &'static str {
        match self {
            Via::Sse => "SSE watcher",
            Via::Socket => "WebSocket",
        }
    }
}

fn spawn(opts: &Opts, upstream: u16, tag: &str) -> Result<Gw, String> {
    procs::spawn_gateway(
        &opts.gateway,
        &procs::Place {
            wrapper: &[],
            dir: &procs::scratch(&format!("websocket-{tag}")),
            upstream,
            cpus: opts.proxy_cpus(),
            env: &[],
        },
    )
}

fn ns_at(at: Instant) -> u64 {
    now_ns() + u64::try_from(at.saturating_duration_since(Instant::now()).as_nanos()).unwrap_or(0)
}

fn auth(i: usize) -> String {
    format!("Bearer ws-load-{i}")
}

/// Starts stream `i` on the gateway (`kind`: the upstream's `idle` or `rated`); returns its URL
/// (`X-Gateway-Stream`) and the owner's response, whose body the caller reads or drops.
async fn start(addr: SocketAddr, i: usize, query: &str) -> Result<(String, Incoming, Conn), String> {
    let (mut s, conn) = open(addr).await?;
    let req = event_stream_get(addr, &format!("/stream?{query}&id={i}"), i)?;
    let resp = send(&mut s, req, i).await?;
    let url = stream_url(&resp, &format!("stream {i}"))?;
    Ok((url, resp.into_body(), Conn(conn, s)))
}

/// An HTTP/1.1 client connection, cut when dropped (its task aborted, its socket closed); the request handle is
/// only held, so that the connection does not end on its own.
struct Conn(JoinHandle<()>, #[allow(dead_code)] SendRequest<Empty<Bytes>>);

impl Drop for Conn {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What one reader got.
#[derive(Default)]
struct Got {
    deltas: u64,
    announced: Option<u64>,
    /// `[DONE]` (SSE) or a close 1000 (socket).
    ended: bool,
}

impl Got {
    /// Counts the deltas (`"t=` opens each stamped delta in an envelope) and the announced count in `bytes`.
    fn take(&mut self, bytes: &[u8]) {
        self.deltas += memchr::memmem::find_iter(bytes, b"\"t=").count() as u64;
        if let Some(v) = find_number_after(bytes, b"load_events") {
            self.announced = Some(v);
        }
    }

    fn check(&self, what: &str) -> Result<u64, String> {
        if !self.ended {
            return Err(format!("{what}: no normal end after {} deltas", self.deltas));
        }
        if self.announced != Some(self.deltas) {
            return Err(format!(
                "{what}: {} deltas, the upstream announced {:?}",
                self.deltas, self.announced
            ));
        }
        Ok(self.deltas)
    }
}

/// An attached reader: SSE's response body, or the socket.
enum Reader {
    Sse(Incoming, Conn),
    Socket(Box<tokio_tungstenite::WebSocketStream<TcpStream>>),
}

/// A `GET` of `path` asking for an event stream, bound as stream `i`'s owner.
fn event_stream_get(addr: SocketAddr, path: &str, i: usize) -> Result<Request<Empty<Bytes>>, String> {
    Request::get(format!("http://{addr}{path}"))
        .header("host", addr.to_string())
        .header("accept", "text/event-stream")
        .header("authorization", auth(i))
        .body(Empty::new())
        .map_err(|e| e.to_string())
}

/// Attaches a reader of `via` to the stream at `url`, bound as stream `i`'s owner.
async fn attach(addr: SocketAddr, url: &str, i: usize, via: Via) -> Result<Reader, String> {
    match via {
        Via::Sse => {
            let (mut s, conn) = open(addr).await?;
            let req = event_stream_get(addr, url, i)?;
            let resp = send(&mut s, req, i).await?;
            Ok(Reader::Sse(resp.into_body(), Conn(conn, s)))
        }
        Via::Socket => {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("socket {i}: connect: {e}"))?;
            let _ = tcp.set_nodelay(true);
            let mut req = format!("ws://{addr}{url}")
                .into_client_request()
                .map_err(|e| format!("socket {i}: {e}"))?;
            let value = auth(i).parse().map_err(|e| format!("socket {i}: {e}"))?;
            req.headers_mut().insert(http::header::AUTHORIZATION, value);
            let (ws, _) = tokio_tungstenite::client_async(req, tcp)
                .await
                .map_err(|e| format!("socket {i}: handshake: {e}"))?;
            Ok(Reader::Socket(Box::new(ws)))
        }
    }
}

/// Reads a reader to its end.
async fn read(reader: Reader, what: String) -> Result<u64, String> {
    let mut got = Got::default();
    match reader {
        Reader::Sse(mut body, _conn) => {
            let mut carry = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| format!("{what}: body failed after {} deltas: {e}", got.deltas))?;
                let Ok(data) = frame.into_data() else { continue };
                carry.extend_from_slice(&data);
                let mut from = 0;
                while let Some(p) = memchr::memmem::find(&carry[from..], b"\n\n") {
                    let ev = &carry[from..from + p];
                    got.take(ev);
                    got.ended |= ev.split(|b| *b == b'\n').any(|l| l == b"data: [DONE]");
                    from += p + 2;
                }
                carry.drain(..from);
            }
        }
        Reader::Socket(mut ws) => {
            while let Some(msg) = ws.next().await {
                match msg.map_err(|e| format!("{what}: failed after {} deltas: {e}", got.deltas))? {
                    Message::Text(t) => got.take(t.as_bytes()),
                    Message::Close(c) => {
                        got.ended = c.as_ref().is_some_and(|c| c.code == CloseCode::Normal);
                        if !got.ended {
                            return Err(format!("{what}: closed with {c:?} after {} deltas", got.deltas));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    got.check(&what)
}

/// Sums RSS peaks of `pid` sampled every 100 ms until `stop` is set.
async fn rss_peak(pid: u32, stop: Arc<AtomicUsize>) -> u64 {
    let mut peak = 0;
    while stop.load(Ordering::Relaxed) == 0 {
        peak = peak.max(procs::rss_kib(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    peak.max(procs::rss_kib(pid).unwrap_or(0))
}

/// One memory row: a fresh gateway, `readers / READERS_PER_STREAM` idle held streams with their owners reading,
/// a few readers of `via` attached and dropped (warm-up), the RSS baseline, then `readers` readers of `via`
/// attached and held `hold`. Returns KiB per reader.
async fn memory_row(
    opts: &Opts,
    upstream: u16,
    via: Via,
    readers: usize,
    hold: Duration,
    round: usize,
) -> Result<(f64, u64), String> {
    let mut gw = spawn(opts, upstream, &format!("mem-{round}-{via:?}"))?;
    let addr = procs::addr(gw.1);
    let streams = readers.div_ceil(READERS_PER_STREAM);
    // Long enough for the attach, the hold and a margin; the gateway is killed after the row anyway.
    let until = ns_at(Instant::now() + hold + Duration::from_secs(60 + readers as u64 / 50));
    let mut owners = Vec::with_capacity(streams);
    let mut bodies = JoinSet::new();
    for i in 0..streams {
        let (url, mut body, guard) =
            start(addr, i, &format!("kind=idle&interval_us=1000&until_ns={until}&bytes=0")).await?;
        bodies.spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
        owners.push((url, guard));
    }
    // Warm-up: lazily built state of this kind of reader exists before the baseline.
    for (i, (url, _)) in owners.iter().enumerate().take(10) {
        drop(attach(addr, url, i, via).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = gw.0.pid();
    let base = procs::rss_kib(pid).unwrap_or(0);
    let stop = Arc::new(AtomicUsize::new(0));
    let sampler = tokio::spawn(rss_peak(pid, Arc::clone(&stop)));
    let mut held = JoinSet::new();
    for r in 0..readers {
        let i = r % streams;
        let reader = attach(addr, &owners[i].0, i, via).await?;
        // Read (a socket answers pings), never to an end in this row: the task is aborted with the row.
        held.spawn(async move {
            let _ = read(reader, String::new()).await;
        });
    }
    tokio::time::sleep(hold).await;
    stop.store(1, Ordering::Relaxed);
    let peak = sampler.await.unwrap_or(0);
    if !gw.0.alive() {
        return Err("the gateway of a websocket memory row exited (see its log under /tmp/sse-gateway-load-*)".into());
    }
    held.abort_all();
    bodies.abort_all();
    drop(owners);
    Ok((peak.saturating_sub(base) as f64 / readers as f64, base))
}

/// What one CPU row measured.
struct CpuRow {
    /// µs per delta, user+system, and of which system.
    cpu: f64,
    system: f64,
    deltas: u64,
    failures: Vec<String>,
}

/// `streams` streams on `gw` paced at `rate` events/s each for `window`, their owners gone, each read by one
/// reader of `via` from its start: the readers and when the paced window begins (a second from now, time for
/// the owners to come and go and the readers to attach).
async fn paced_readers(
    gw: &Gw,
    via: Via,
    window: Duration,
    (streams, rate): (usize, f64),
) -> Result<(Instant, Vec<Reader>), String> {
    let addr = procs::addr(gw.1);
    let interval_us = (1e6 / rate).round() as u64;
    let begin = Instant::now() + Duration::from_millis(1000);
    let (start_ns, until_ns) = (ns_at(begin), ns_at(begin + window));
    let mut readers = Vec::with_capacity(streams);
    for i in 0..streams {
        let phase = (i as u64).wrapping_mul(2_654_435_761) % interval_us;
        let (url, body, owner) = start(
            addr,
            i,
            &format!(
                "kind=rated&interval_us={interval_us}&start_ns={start_ns}&until_ns={until_ns}&phase_us={phase}&bytes=0"
            ),
        )
        .await?;
        // The owner leaves: the stream goes on (its grace period) and is read by the reader alone.
        drop((body, owner));
        readers.push(attach(addr, &url, i, via).await?);
    }
    Ok((begin, readers))
}

/// Reads every reader to its end (or `deadline`): the deltas they got and what failed.
async fn read_all(readers: Vec<Reader>, via: Via, deadline: Instant) -> (u64, Vec<String>) {
    let mut set = JoinSet::new();
    for (i, r) in readers.into_iter().enumerate() {
        let what = format!("{} {i}", via.label());
        set.spawn(async move {
            tokio::time::timeout_at(deadline.into(), read(r, what.clone()))
                .await
                .unwrap_or_else(|_| Err(format!("{what}: not finished by the deadline")))
        });
    }
    let (mut deltas, mut failures) = (0, Vec::new());
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(d)) => deltas += d,
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(format!("reader task: {e}")),
        }
    }
    (deltas, failures)
}

/// One CPU row on `gw`: `PACED` streams read by readers of `via`; CPU from the first paced delta to the last
/// reader's end.
async fn cpu_row(gw: &Gw, via: Via, window: Duration, tck: f64) -> Result<CpuRow, String> {
    let (begin, readers) = paced_readers(gw, via, window, PACED).await?;
    tokio::time::sleep_until(begin.into()).await;
    let pid = gw.0.pid();
    let before = procs::usage(pid).ok_or("no /proc usage of the gateway")?;
    let (deltas, failures) = read_all(readers, via, begin + window + GRACE).await;
    let spent = procs::usage(pid).ok_or("no /proc usage of the gateway")?.since(before);
    let per = 1e6 / tck / deltas.max(1) as f64;
    Ok(CpuRow {
        cpu: (spent.user + spent.system) as f64 * per,
        system: spent.system as f64 * per,
        deltas,
        failures,
    })
}

/// Streams and events per second each of the callgrind rows: `instructions`' load, low enough that callgrind
/// keeps up.
const COUNTED: (usize, f64) = (
    crate::instructions::STREAMS,
    crate::instructions::RATE / crate::instructions::STREAMS as f64,
);

/// `instructions --readers sse,socket`: the gateway's user-space instructions per event delivered to an SSE
/// watcher and over a socket, under callgrind: `COUNTED` streams read as the CPU rows read them, two phases of
/// `window` and twice that with the counters zeroed when the paced window begins and dumped after the last
/// reader's end; per event = the phases' difference, so what a stream costs once (its start, its end, the
/// close) cancels out.
pub async fn instructions(opts: &Opts, up: &[u16], rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(1).max(1);
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 3.0 } else { 10.0 }));
    let dir = procs::scratch("callgrind-websocket");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let wrapper = crate::instructions::callgrind(&dir);
    let gw = procs::spawn_gateway(
        &opts.gateway,
        &procs::Place {
            wrapper: &wrapper,
            dir: &dir.join("gateway"),
            upstream: up[crate::upstream::LISTENERS - 1],
            cpus: None,
            env: &[],
        },
    )?;
    let (streams, rate) = COUNTED;
    rep.line("## instructions: a socket against an SSE watcher, per event delivered\n");
    rep.line(format!(
        "One gateway (its defaults) under callgrind. {streams} streams paced at {rate:.0} events/s each, their owners \
         gone, each read from its start by one SSE watcher or one socket (`sse-gateway.v1`); two phases of {:.0} s and \
         {:.0} s, the counters zeroed as the paced window begins and dumped after the last reader's end; per event = \
         (instructions₂ − instructions₁) / (deltas₂ − deltas₁). {rounds} interleaved round(s); the ratio is the median \
         of (socket / SSE in the same round).\n",
        window.as_secs_f64(),
        2.0 * window.as_secs_f64()
    ));
    rep.line(
        "| reader | instructions per event (by round) | deltas in the two phases | instructions in the two phases |",
    );
    rep.line("|---|---|---|---|");
    let mut per = [Vec::new(), Vec::new()];
    let mut failures = Vec::new();
    for round in 0..rounds {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            let via = Via::BOTH[k];
            let mut counted = [(0u64, 0u64); 2];
            for (phase, w) in [window, 2 * window].into_iter().enumerate() {
                let (begin, readers) = paced_readers(&gw, via, w, COUNTED).await?;
                tokio::time::sleep_until(begin.into()).await;
                crate::instructions::control("-z", gw.0.pid())?;
                let (deltas, failed) = read_all(readers, via, begin + w + GRACE).await;
                crate::instructions::control("-d", gw.0.pid())?;
                failures.extend(failed);
                counted[phase] = (crate::instructions::newest_dump(&dir, gw.0.pid())?, deltas);
            }
            let (v, phases) = crate::instructions::of_phases(counted);
            per[k].push(v);
            rep.line(format!(
                "| {} (round {}) | {} | {phases} |",
                via.label(),
                round + 1,
                n(v)
            ));
        }
    }
    readers_failed(rep, ok, &failures, "readers");
    let r = crate::report::round_ratio(&per[1], &per[0]);
    rep.line(format!(
        "\n- socket / SSE watcher, instructions per event = {:.0} / {:.0} = **{r:.3}×** (median of same-round \
         ratios)\n",
        median(per[1].clone()),
        median(per[0].clone())
    ));
    Ok(())
}

/// A metric of the gateway (0 when unreadable).
fn metric(admin: u16, name: &str, labels: &str) -> f64 {
    procs::http_get(admin, "/metrics")
        .ok()
        .and_then(|page| procs::metric(&page, name, labels))
        .unwrap_or(0.0)
}

pub async fn websocket(opts: &Opts, up: &[u16], rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 }).max(1);
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.5 } else { 5.0 }));
    let readers = opts.idle_streams.unwrap_or(if opts.quick { 500 } else { 1000 });
    let hold = Duration::from_secs_f64(opts.hold_secs.unwrap_or(if opts.quick { 1.0 } else { 5.0 }));
    let upstream = up[crate::upstream::LISTENERS - 1];
    let tck = procs::clk_tck();
    let (streams, rate) = PACED;
    rep.line("## websocket: memory per idle socket and CPU per event, a socket against SSE (issue 28)\n");
    rep.line(format!(
        "Same gateway binary, its defaults (resumption and the WebSocket output on), release build. **Memory**: \
         {} held translated streams (their owners connected and reading, the upstream silent after the first \
         delta), then {} readers attached, {READERS_PER_STREAM} per stream, all SSE watchers (`GET <prefix>/<token>`, \
         the stream's bound `authorization`) or all sockets on the same URLs (tokio-tungstenite, `sse-gateway.v1`), \
         held {:.1} s; per reader = (peak RSS over the hold − RSS before the readers, after 10 readers of the same \
         kind came and went) / readers; a fresh gateway per row. **CPU**: {streams} streams paced at {rate:.0} \
         events/s each ({} events/s in all) for {:.1} s; each stream's owner request leaves once `X-Gateway-Stream` \
         is known and one reader, an SSE watcher or a socket, reads it from its start to its end; per event = \
         user + system CPU of the gateway (/proc ticks of 10 ms) from the first paced delta to the last reader's \
         end / deltas delivered, one gateway for every CPU row. Each reader checks it got every delta the upstream \
         announced and a normal end (`[DONE]`; close 1000). {rounds} interleaved round(s); the tables give the \
         median over rounds, the ratio is the median of (socket / SSE in the same round).\n",
        n(readers.div_ceil(READERS_PER_STREAM) as f64),
        n(readers as f64),
        hold.as_secs_f64(),
        n(streams as f64 * rate),
        window.as_secs_f64()
    ));
    // [via][round]
    let mut mem = [Vec::new(), Vec::new()];
    let mut cpu = [Vec::new(), Vec::new()];
    let mut sys = [Vec::new(), Vec::new()];
    let mut deltas = [Vec::new(), Vec::new()];
    let mut failed = [0usize; 2];
    let mut failures = Vec::new();
    let mut gw = spawn(opts, upstream, "cpu")?;
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for &k in &order {
            let row = cpu_row(&gw, Via::BOTH[k], window, tck).await?;
            cpu[k].push(row.cpu);
            sys[k].push(row.system);
            deltas[k].push(row.deltas as f64);
            failed[k] += row.failures.len();
            failures.extend(row.failures);
            if !gw.0.alive() {
                return Err(
                    "the gateway of the websocket CPU rows exited (see its log under /tmp/sse-gateway-load-*)".into(),
                );
            }
        }
    }
    let sent = |name: &str| metric(gw.2, &format!("sse_gateway_websocket_{name}"), "");
    let (messages, batches, batched) = (
        sent("messages_total"),
        sent("batches_total"),
        sent("batched_messages_total"),
    );
    drop(gw);
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 { vec![0, 1] } else { vec![1, 0] };
        for &k in &order {
            let (per, _) = memory_row(opts, upstream, Via::BOTH[k], readers, hold, round).await?;
            mem[k].push(per);
        }
    }
    let ratio =
        |v: &[f64], base: &[f64]| median(v.iter().zip(base).map(|(a, b)| a / b.max(f64::MIN_POSITIVE)).collect());
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ");
    rep.line(format!(
        "| reader | memory per idle reader, KiB ({} readers) | CPU per event, µs (user+system) | of which user / \
         system, µs | deltas delivered per round |",
        n(readers as f64)
    ));
    rep.line("|---|---|---|---|---|");
    for (k, via) in Via::BOTH.iter().enumerate() {
        let cell = |v: &[f64], base: &[f64]| {
            if k == 0 {
                format!("{:.1}", median(v.to_vec()))
            } else {
                format!("{:.1} ({:.2}×)", median(v.to_vec()), ratio(v, base))
            }
        };
        let user: Vec<f64> = cpu[k].iter().zip(&sys[k]).map(|(c, s)| c - s).collect();
        rep.line(format!(
            "| {} | {} | {} | {:.1} / {:.1} | {} |",
            via.label(),
            cell(&mem[k], &mem[0]),
            cell(&cpu[k], &cpu[0]),
            median(user),
            median(sys[k].clone()),
            deltas[k].iter().map(|d| n(*d)).collect::<Vec<_>>().join(", ")
        ));
    }
    rep.line("\nBy round:\n");
    rep.line("| reader | KiB per idle reader | CPU µs/event | of which system | failed readers |");
    rep.line("|---|---|---|---|---|");
    for (k, via) in Via::BOTH.iter().enumerate() {
        rep.line(format!(
            "| {} | {} | {} | {} | {} |",
            via.label(),
            list(&mem[k]),
            list(&cpu[k]),
            list(&sys[k]),
            failed[k]
        ));
    }
    let rm = ratio(&mem[1], &mem[0]);
    let rc = ratio(&cpu[1], &cpu[0]);
    rep.line(format!(
        "\n- memory per idle reader, socket / SSE watcher: {:.1} / {:.1} KiB = {rm:.2}× (goal ≤ 1.0×: {})",
        median(mem[1].clone()),
        median(mem[0].clone()),
        verdict(rm <= 1.0)
    ));
    rep.line(format!(
        "- CPU per event, socket / SSE watcher, {streams} streams × {rate:.0} ev/s: {:.1} / {:.1} µs = {rc:.2}× (goal \
         ≤ 1.0×: {}; wall-clock CPU on a shared machine)",
        median(cpu[1].clone()),
        median(cpu[0].clone()),
        verdict(rc <= 1.0)
    ));
    rep.line(format!(
        "- the CPU gateway's sockets wrote {} messages, {} of them batches carrying {} messages (`websocket_*_total`)",
        n(messages),
        n(batches),
        n(batched)
    ));
    rep.line(format!("- none dropped: {}\n", verdict(failures.is_empty())));
    readers_failed(rep, ok, &failures, "");
    Ok(())
}
