//! The load client: opens N streams to a target, checks every stream, records per-event latency and TTFB.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::common::{event_body, find_number_after, find_stamp, json_string_len, now_ns};

/// Where a workload goes and how it asks for its stream.
#[derive(Clone, Debug)]
pub struct Target {
    pub name: &'static str,
    /// HTTP/1.1 address.
    pub addr: SocketAddr,
    /// Address that speaks h2c with prior knowledge.
    pub h2_addr: SocketAddr,
    /// Sends `X-Stream-Format: <this>`: `legacy` (gateway pass-through), `json` (the envelope stream, as without
    /// the header), `ai-sdk` or `ag-ui` (the envelope stream encoded for a frontend, issue 35).
    pub format: Option<&'static str>,
    /// The stream arrives as JSON envelopes.
    pub translated: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    H1,
    /// h2c with this many streams per connection.
    H2(usize),
}

impl Proto {
    pub fn label(self) -> &'static str {
        match self {
            Proto::H1 => "h1",
            Proto::H2(_) => "h2c",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Rated,
    Idle,
    Large,
}

/// One measured phase: `streams` streams against one target.
#[derive(Clone, Debug)]
pub struct Plan {
    pub kind: Kind,
    pub streams: usize,
    /// Per-stream delta interval; 0 = as fast as the path takes them (saturation).
    pub interval_us: u64,
    /// Streams opened per second.
    pub ramp_per_sec: f64,
    /// After the ramp, before the measured window.
    pub warm: Duration,
    /// The measured window (idle: the hold time).
    pub window: Duration,
    /// Saturation: streams are cut at the window's end, not run to `[DONE]`.
    pub cut_at_end: bool,
    pub large_bytes: u64,
    pub proto: Proto,
    /// How long after the window streams may take to finish before they count as failed.
    pub grace: Duration,
}

/// Shared by the stream tasks of one phase (one current-thread runtime: the lock is never contended long).
pub struct Recorder {
    hists: Mutex<(Histogram<u64>, Histogram<u64>)>,
    window: (u64, u64),
    /// Streams whose first body byte arrived (shared with the scenario, which may watch it).
    pub opened: Arc<AtomicUsize>,
    pub events: AtomicU64,
    pub events_in_window: AtomicU64,
    pub keepalives: AtomicU64,
    pub bytes: AtomicU64,
}

/// The URL of the held stream a response starts (`X-Gateway-Stream`), or why there is none; `what` names the
/// stream in the message.
pub fn stream_url<B>(resp: &http::Response<B>, what: &str) -> Result<String, String> {
    resp.headers()
        .get("x-gateway-stream")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| format!("{what}: no X-Gateway-Stream header (resumption off?)"))
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).unwrap_or_else(|_| Histogram::new(3).expect("histogram"))
}

impl Recorder {
    fn new(window: (u64, u64), opened: Arc<AtomicUsize>) -> Self {
        Self {
            hists: Mutex::new((histogram(), histogram())),
            window,
            opened,
            events: AtomicU64::new(0),
            events_in_window: AtomicU64::new(0),
            keepalives: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }
}

/// What one phase measured.
pub struct PhaseResult {
    pub latency: Histogram<u64>,
    pub ttfb: Histogram<u64>,
    pub streams_ok: usize,
    pub failures: Vec<String>,
    pub events: u64,
    pub events_in_window: u64,
    pub keepalives: u64,
    /// Body bytes received over the whole phase (every stream, every event and comment).
    pub bytes: u64,
    pub window: Duration,
    /// Large: payload bytes (decoded) delivered, and first request → last byte.
    pub large_decoded: u64,
    pub large_elapsed: Duration,
}

impl PhaseResult {
    pub fn failed(&self) -> usize {
        self.failures.len()
    }
    pub fn rate(&self) -> f64 {
        self.events_in_window as f64 / self.window.as_secs_f64()
    }
}

/// Incremental reader of one response body.
struct StreamParser {
    carry: Vec<u8>,
    translated: bool,
    large: bool,
    next_seq: u64,
    gap: Option<String>,
    announced: Option<u64>,
    done: bool,
    error: Option<String>,
    decoded: u64,
    lat: Vec<u64>,
}

impl StreamParser {
    fn feed(&mut self, data: &[u8], recv_ns: u64, rec: &Recorder) {
        let owned;
        let buf: &[u8] = if self.carry.is_empty() {
            data
        } else {
            self.carry.extend_from_slice(data);
            owned = std::mem::take(&mut self.carry);
            &owned
        };
        let mut start = 0;
        let mut in_window = 0;
        let mut events = 0;
        let finder = memchr::memmem::Finder::new(b"\n\n");
        while let Some(p) = finder.find(&buf[start..]) {
            let ev = event_body(&buf[start..start + p]);
            start += p + 2;
            if ev.first() == Some(&b':') {
                rec.keepalives.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if self.large {
                self.large_event(ev);
                continue;
            }
            if let Some((ns, seq)) = find_stamp(ev) {
                events += 1;
                if seq != self.next_seq && self.gap.is_none() {
                    self.gap = Some(format!("expected event {} got {}", self.next_seq, seq));
                }
                self.next_seq = seq + 1;
                if ns >= rec.window.0 && ns < rec.window.1 {
                    self.lat.push(recv_ns.saturating_sub(ns));
                }
                if recv_ns >= rec.window.0 && recv_ns < rec.window.1 {
                    in_window += 1;
                }
                continue;
            }
            self.other_event(ev);
        }
        self.carry.clear();
        self.carry.extend_from_slice(&buf[start..]);
        if events > 0 {
            rec.events.fetch_add(events, Ordering::Relaxed);
            rec.events_in_window.fetch_add(in_window, Ordering::Relaxed);
        }
        if !self.lat.is_empty() {
            if let Ok(mut h) = rec.hists.lock() {
                for v in self.lat.drain(..) {
                    h.0.saturating_record(v);
                }
            }
            self.lat.clear();
        }
    }

    fn other_event(&mut self, ev: &[u8]) {
        // Resumable streams put an `id:` line before it (resume.enabled, the default). AG-UI has no `[DONE]`: its
        // run ends with `RUN_FINISHED` (or `RUN_ERROR`).
        let has = |s: &[u8]| memchr::memmem::find(ev, s).is_some();
        if ev.split(|&b| b == b'\n').any(|line| line == b"data: [DONE]")
            || (self.translated && has(b"\"type\":\"RUN_FINISHED\""))
        {
            self.done = true;
        } else if let Some(n) = find_number_after(ev, b"load_events") {
            self.announced = Some(n);
        } else if self.translated
            && (has(b"\"type\":\"error\"") || has(b"\"type\":\"RUN_ERROR\""))
            && self.error.is_none()
        {
            self.error = Some(String::from_utf8_lossy(&ev[..ev.len().min(300)]).into_owned());
        }
    }

    fn large_event(&mut self, ev: &[u8]) {
        let Some(payload) = ev.strip_prefix(b"data: ") else {
            return;
        };
        if self.translated {
            if memchr::memmem::find(payload, b"{\"type\":\"tool_result\"").is_some() {
                if let Some(p) = memchr::memmem::find(payload, b"\"delta\":\"") {
                    if let Some((n, _)) = json_string_len(&payload[p + 9..]) {
                        self.decoded += n as u64;
                    }
                }
            } else {
                self.other_event(ev);
            }
        } else if payload.first() == Some(&b'<') || payload.starts_with(b"]]>") || payload == b"[DONE]" {
            self.other_event(ev);
        } else {
            self.decoded += (payload.len() - memchr::memchr_iter(b'\\', payload).count()) as u64;
        }
    }
}

enum Sender {
    H1(Box<http1::SendRequest<Empty<Bytes>>>),
    H2(http2::SendRequest<Empty<Bytes>>),
}

struct StreamEnd {
    ok: Result<(), String>,
    decoded: u64,
}

fn uri(target: &Target, plan: &Plan, id: usize, start_ns: u64, until_ns: u64) -> String {
    let kind = match plan.kind {
        Kind::Rated => "rated",
        Kind::Idle => "idle",
        Kind::Large => "large",
    };
    // Spread the streams' first deltas over one period (a fixed hash of the id), so they do not tick together.
    let phase = if plan.interval_us > 0 {
        (id as u64).wrapping_mul(2_654_435_761) % plan.interval_us
    } else {
        0
    };
    format!(
        "http://{}/stream?kind={kind}&interval_us={}&start_ns={start_ns}&until_ns={until_ns}&phase_us={phase}&bytes={}&id={id}",
        target.addr, plan.interval_us, plan.large_bytes
    )
}

#[allow(clippy::too_many_arguments)]
async fn one_stream(
    sender: Sender,
    target: Target,
    plan: Arc<Plan>,
    id: usize,
    (start_ns, until_ns): (u64, u64),
    rec: Arc<Recorder>,
    cut_at: Option<Instant>,
) -> StreamEnd {
    let mut req = Request::get(uri(&target, &plan, id, start_ns, until_ns));
    if matches!(sender, Sender::H1(_)) {
        // HTTP/1.1 needs Host; h2 takes :authority from the URI (nginx answers 400 to a Host that differs).
        req = req.header("host", target.addr.to_string());
    }
    if let Some(format) = target.format {
        req = req.header("x-stream-format", format);
    }
    // As EventSource and the SSE client libraries do (the gateway gives such requests a dedicated connection).
    req = req.header("accept", "text/event-stream");
    let req = match req.body(Empty::<Bytes>::new()) {
        Ok(r) => r,
        Err(e) => return end(Err(format!("request: {e}"))),
    };
    let sent = Instant::now();
    let resp = match sender {
        Sender::H1(mut s) => s.send_request(req).await,
        Sender::H2(mut s) => match s.ready().await {
            Ok(()) => s.send_request(req).await,
            Err(e) => Err(e),
        },
    };
    let resp = match resp {
        Ok(r) => r,
        Err(e) => return end(Err(format!("stream {id}: request failed: {e}"))),
    };
    if !resp.status().is_success() {
        return end(Err(format!("stream {id}: status {}", resp.status())));
    }
    let mut body = resp.into_body();
    let mut p = StreamParser {
        carry: Vec::new(),
        translated: target.translated,
        large: plan.kind == Kind::Large,
        next_seq: 0,
        gap: None,
        announced: None,
        done: false,
        error: None,
        decoded: 0,
        lat: Vec::with_capacity(64),
    };
    let mut first = true;
    loop {
        let frame = match cut_at {
            Some(at) => match tokio::time::timeout_at(at.into(), body.frame()).await {
                Ok(f) => f,
                // Saturation phases end by cutting the streams: not a failure.
                Err(_) => return end(Ok(())),
            },
            None => body.frame().await,
        };
        let Some(frame) = frame else { break };
        let frame = match frame {
            Ok(f) => f,
            // Cutting the other streams of an h2 connection can fail this one too: past the cut, not a failure.
            Err(_) if cut_at.is_some_and(|at| Instant::now() + Duration::from_millis(50) >= at) => return end(Ok(())),
            Err(e) => return end(Err(format!("stream {id}: body failed after event {}: {e}", p.next_seq))),
        };
        let Ok(data) = frame.into_data() else { continue };
        let recv = now_ns();
        if first {
            first = false;
            rec.opened.fetch_add(1, Ordering::Relaxed);
            let ttfb = u64::try_from(sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
            if let Ok(mut h) = rec.hists.lock() {
                h.1.saturating_record(ttfb);
            }
        }
        rec.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        p.feed(&data, recv, &rec);
    }
    let ok = if let Some(e) = p.error {
        Err(format!("stream {id}: error envelope: {e}"))
    } else if let Some(g) = p.gap {
        Err(format!("stream {id}: lost events: {g}"))
    } else if !p.done {
        Err(format!("stream {id}: ended without [DONE] after {} events", p.next_seq))
    } else if plan.kind == Kind::Large {
        let want = crate::upstream::large_decoded_len(plan.large_bytes);
        if p.decoded == want {
            Ok(())
        } else {
            Err(format!("stream {id}: tool result {} bytes, want {want}", p.decoded))
        }
    } else if p.announced != Some(p.next_seq) {
        Err(format!(
            "stream {id}: {} events, upstream sent {:?}",
            p.next_seq, p.announced
        ))
    } else {
        Ok(())
    };
    return StreamEnd { ok, decoded: p.decoded };

    fn end(ok: Result<(), String>) -> StreamEnd {
        StreamEnd { ok, decoded: 0 }
    }
}

async fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

async fn h1_sender(addr: SocketAddr) -> Result<Sender, String> {
    let io = TokioIo::new(connect(addr).await?);
    let (s, conn) = http1::handshake(io).await.map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(Sender::H1(Box::new(s)))
}

async fn h2_sender(addr: SocketAddr) -> Result<http2::SendRequest<Empty<Bytes>>, String> {
    let io = TokioIo::new(connect(addr).await?);
    let (s, conn) = http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(1 << 20)
        .initial_connection_window_size(8 << 20)
        .handshake(io)
        .await
        .map_err(|e| format!("h2 handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(s)
}

/// Runs one phase against `target` and returns what it measured; `opened` counts streams with a first byte.
pub async fn run_phase(target: &Target, plan: &Plan, opened: Arc<AtomicUsize>) -> PhaseResult {
    let plan = Arc::new(plan.clone());
    let t0 = Instant::now();
    let t0_ns = now_ns();
    let ramp = Duration::from_secs_f64(plan.streams as f64 / plan.ramp_per_sec);
    let ws = t0_ns + u64::try_from((ramp + plan.warm).as_nanos()).unwrap_or(0);
    let we = ws + u64::try_from(plan.window.as_nanos()).unwrap_or(0);
    let until_ns = if plan.kind == Kind::Large { u64::MAX / 2 } else { we };
    // Streams opened during the ramp stay quiet until it is over: the ramp does not overlap the load.
    let start_ns = t0_ns + u64::try_from(ramp.as_nanos()).unwrap_or(0);
    let window_end = t0 + ramp + plan.warm + plan.window;
    let cut_at = plan.cut_at_end.then_some(window_end);
    let deadline = window_end + plan.grace;
    let rec = Arc::new(Recorder::new((ws, we), opened));
    let mut failures = Vec::new();
    let mut h2: Vec<http2::SendRequest<Empty<Bytes>>> = Vec::new();
    if let Proto::H2(per) = plan.proto {
        let conns = plan.streams.div_ceil(per.max(1));
        for _ in 0..conns {
            match h2_sender(target.h2_addr).await {
                Ok(s) => h2.push(s),
                Err(e) => failures.push(e),
            }
        }
    }
    let mut set = JoinSet::new();
    let dt = Duration::from_secs_f64(1.0 / plan.ramp_per_sec);
    let grace = plan.grace;
    for id in 0..plan.streams {
        let at = t0 + dt * id as u32;
        let target = target.clone();
        let plan2 = Arc::clone(&plan);
        let rec = Arc::clone(&rec);
        let h2s = if h2.is_empty() {
            None
        } else {
            Some(h2[id % h2.len()].clone())
        };
        set.spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let sender = match h2s {
                Some(s) => Sender::H2(s),
                None => match h1_sender(target.addr).await {
                    Ok(s) => s,
                    Err(e) => return (StreamEnd { ok: Err(e), decoded: 0 }, Instant::now()),
                },
            };
            let fut = one_stream(sender, target, plan2, id, (start_ns, until_ns), rec, cut_at);
            match tokio::time::timeout_at(deadline.into(), fut).await {
                Ok(end) => (end, Instant::now()),
                Err(_) => (
                    StreamEnd {
                        ok: Err(format!("stream {id}: not finished {grace:?} after the window")),
                        decoded: 0,
                    },
                    Instant::now(),
                ),
            }
        });
    }
    drop(h2);
    let mut ok = 0;
    let mut decoded = 0;
    let mut last = t0;
    while let Some(r) = set.join_next().await {
        match r {
            Ok((end, at)) => {
                decoded += end.decoded;
                last = last.max(at);
                match end.ok {
                    Ok(()) => ok += 1,
                    Err(e) => failures.push(e),
                }
            }
            Err(e) => failures.push(format!("stream task: {e}")),
        }
    }
    let rec = Arc::into_inner(rec).expect("all stream tasks joined");
    let (latency, ttfb) = rec.hists.into_inner().unwrap_or_else(|p| p.into_inner());
    PhaseResult {
        latency,
        ttfb,
        streams_ok: ok,
        failures,
        events: rec.events.into_inner(),
        events_in_window: rec.events_in_window.into_inner(),
        keepalives: rec.keepalives.into_inner(),
        bytes: rec.bytes.into_inner(),
        window: plan.window,
        large_decoded: decoded,
        large_elapsed: last - t0,
    }
}
