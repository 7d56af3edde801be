//! The synthetic legacy upstream: `GET /stream?…` answers a stamped legacy event stream (runs as its own process).
//!
//! Query keys: `kind` (`rated`, `idle`, `large`), `interval_us` (0: as fast as the reader takes them),
//! `until_ns` (wall clock: stop sending deltas, close the block, send `meta_final` and `[DONE]`), `phase_us`
//! (delay of the first delta, spreads streams over the period), `bytes` (size of the large tool result), `id`.
//! Each text delta is stamped with its send time (see `common::write_delta`); `meta_final` carries
//! `load_events`, the number of deltas sent, so the client can check that none was lost.

use std::convert::Infallible;
use std::future::Future;
use std::io::{BufRead, Write};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::time::Sleep;

use crate::common::{now_ns, push_u64, write_delta};

/// Size of one SSE event of the large tool result.
const LARGE_CHUNK: usize = 32 << 10;
/// The upstream gives up by itself after this long, whatever the driver does.
const MAX_LIFETIME: Duration = Duration::from_secs(3600);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rated,
    Idle,
    Large,
}

struct Spec {
    kind: Kind,
    interval: Duration,
    until: Instant,
    phase: Duration,
    /// No delta before this (streams opened during the ramp stay quiet until the load starts).
    start: Instant,
    bytes: u64,
    id: u64,
}

fn parse_spec(query: &str) -> Spec {
    let mut s = Spec {
        kind: Kind::Rated,
        interval: Duration::from_millis(10),
        until: Instant::now() + Duration::from_secs(1),
        phase: Duration::ZERO,
        start: Instant::now(),
        bytes: 0,
        id: 0,
    };
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n = v.parse::<u64>().unwrap_or(0);
        match k {
            "kind" => {
                s.kind = match v {
                    "idle" => Kind::Idle,
                    "large" => Kind::Large,
                    _ => Kind::Rated,
                }
            }
            "interval_us" => s.interval = Duration::from_micros(n),
            "until_ns" => s.until = Instant::now() + Duration::from_nanos(n.saturating_sub(now_ns())),
            "phase_us" => s.phase = Duration::from_micros(n),
            "start_ns" => s.start = Instant::now() + Duration::from_nanos(n.saturating_sub(now_ns())),
            "bytes" => s.bytes = n,
            "id" => s.id = n,
            _ => {}
        }
    }
    s
}

enum Step {
    Head,
    Deltas,
    Large,
    Tail,
    Done,
}

/// One legacy event stream, produced as the connection polls it (backpressure: nothing is queued).
struct LegacyBody {
    spec: Spec,
    step: Step,
    seq: u64,
    next_due: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
    large_left: u64,
    chunk: Bytes,
}

fn event(out: &mut Vec<u8>, item: &[u8]) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(item);
    out.extend_from_slice(b"\n\n");
}

impl LegacyBody {
    fn new(spec: Spec, chunk: Bytes) -> Self {
        let next_due = Instant::now().max(spec.start) + spec.phase;
        Self {
            large_left: spec.bytes,
            spec,
            step: Step::Head,
            seq: 0,
            next_due,
            sleep: None,
            chunk,
        }
    }

    fn head(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        let agent = format!("00000000-0000-4000-8000-{:012x}", self.spec.id);
        let init = format!(
            "<meta_init data=\"{{&quot;format&quot;:&quot;xml&quot;,&quot;user_query&quot;:&quot;load&quot;,\
             &quot;agent_uuid&quot;:&quot;{agent}&quot;,&quot;parent_agent_uuid&quot;:null,\
             &quot;model&quot;:&quot;synthetic&quot;}}\"></meta_init>"
        );
        event(&mut out, init.as_bytes());
        match self.spec.kind {
            Kind::Large => {
                event(
                    &mut out,
                    b"<content-block-tool_call id=\"toolu_big\" name=\"read_file\" \
                      arguments=\"{&quot;path&quot;:&quot;/big.log&quot;}\"></content-block-tool_call>",
                );
                event(
                    &mut out,
                    b"<content-block-tool_result id=\"toolu_big\" name=\"read_file\"><![CDATA[",
                );
            }
            _ => event(&mut out, b"<content-block-text>"),
        }
        out
    }

    fn tail(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        match self.spec.kind {
            Kind::Large => event(&mut out, b"]]></content-block-tool_result>"),
            _ => event(&mut out, b"</content-block-text>"),
        }
        let mut fin =
            b"<meta_final data=\"{&quot;stop_reason&quot;:&quot;end_turn&quot;,&quot;load_events&quot;:".to_vec();
        push_u64(&mut fin, self.seq);
        fin.extend_from_slice(b"}\"></meta_final>");
        event(&mut out, &fin);
        event(&mut out, b"[DONE]");
        out
    }

    /// Waits until `at`; `true` when the time has come.
    fn wait(&mut self, cx: &mut Context<'_>, at: Instant) -> bool {
        if Instant::now() >= at {
            return true;
        }
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at.into())));
        if sleep.deadline() != at.into() {
            sleep.as_mut().reset(at.into());
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}

impl Body for LegacyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        loop {
            match this.step {
                Step::Head => {
                    this.step = match this.spec.kind {
                        Kind::Large => Step::Large,
                        _ => Step::Deltas,
                    };
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(this.head())))));
                }
                Step::Deltas => {
                    let idle = this.spec.kind == Kind::Idle && this.seq >= 1;
                    let due = if idle {
                        this.spec.until
                    } else {
                        this.next_due.min(this.spec.until)
                    };
                    if !this.wait(cx, due) {
                        return Poll::Pending;
                    }
                    if Instant::now() >= this.spec.until {
                        this.step = Step::Tail;
                        continue;
                    }
                    // Catch up after a late wake-up (burst), so the offered rate holds.
                    this.next_due += this.spec.interval;
                    let mut out = Vec::with_capacity(56);
                    out.extend_from_slice(b"data: ");
                    write_delta(&mut out, now_ns(), this.seq);
                    out.extend_from_slice(b"\n\n");
                    this.seq += 1;
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
                Step::Large => {
                    if this.large_left == 0 {
                        this.step = Step::Tail;
                        continue;
                    }
                    let payload = this.chunk.len() - 8; // minus "data: " and "\n\n"
                    if this.large_left >= payload as u64 {
                        this.large_left -= payload as u64;
                        return Poll::Ready(Some(Ok(Frame::data(this.chunk.clone()))));
                    }
                    let n = this.large_left as usize;
                    this.large_left = 0;
                    let mut out = Vec::with_capacity(n + 8);
                    event(&mut out, &this.chunk[6..6 + n]);
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                }
                Step::Tail => {
                    this.step = Step::Done;
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(this.tail())))));
                }
                Step::Done => return Poll::Ready(None),
            }
        }
    }
}

/// One 32 KiB event of the large tool result: log lines whose newlines are the two characters `\n`, as the
/// backend escapes client tool results (DESIGN 3.3). Returns the event and the decoded length of its payload.
pub fn large_chunk() -> Bytes {
    let line = b"2024-05-01T12:00:00Z INFO worker-7 processed batch with status ok and no warnings\\n";
    let mut out = Vec::with_capacity(LARGE_CHUNK + 8);
    out.extend_from_slice(b"data: ");
    while out.len() + line.len() <= LARGE_CHUNK + 6 {
        out.extend_from_slice(line);
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Decoded length of `n` payload bytes of `large_chunk` repeated (each `\n` escape is one byte).
pub fn large_decoded_len(n: u64) -> u64 {
    let chunk = large_chunk();
    let payload = &chunk[6..chunk.len() - 2];
    let per = payload.len() as u64;
    let escapes_in = |s: &[u8]| memchr::memchr_iter(b'\\', s).count() as u64;
    let full = n / per;
    let rest = (n % per) as usize;
    // A cut inside an escape leaves a lone backslash at the end: counted as one byte, like the translator's
    // `\x` left as it is; the harness's sizes never cut one.
    n - full * escapes_in(payload) - escapes_in(&payload[..rest])
}

async fn serve(
    req: Request<Incoming>,
    chunk: Bytes,
) -> Result<Response<http_body_util::Either<LegacyBody, String>>, Infallible> {
    use http_body_util::Either;
    if req.uri().path() != "/stream" {
        let mut r = Response::new(Either::Right("ok\n".to_owned()));
        if req.uri().path() != "/healthz" {
            *r.status_mut() = StatusCode::NOT_FOUND;
        }
        return Ok(r);
    }
    let spec = parse_spec(req.uri().query().unwrap_or(""));
    let resp = Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Either::Left(LegacyBody::new(spec, chunk)))
        .unwrap_or_else(|_| Response::new(Either::Right(String::new())));
    Ok(resp)
}

/// Listeners: direct, nginx, gateway, gateway with resumption off, `--baseline` gateway.
pub const LISTENERS: usize = 5;

fn bind() -> std::io::Result<std::net::TcpListener> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.set_reuseaddr(true)?;
    sock.bind(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
    sock.listen(4096)?.into_std()
}

/// Accepts on its own thread: a runtime busy saturating thousands of streams must not leave connections in
/// the kernel's accept queue (overflowing it drops SYNs, and a proxy's 5 s connect timeout turns that into 502).
fn accept_thread(listener: std::net::TcpListener, rt: tokio::runtime::Handle, chunk: Bytes) {
    if listener.set_nonblocking(false).is_err() {
        return;
    }
    std::thread::spawn(move || loop {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => {
                // EMFILE and the like: back off rather than spin.
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let _ = stream.set_nonblocking(true);
        let chunk = chunk.clone();
        rt.spawn(async move {
            let Ok(stream) = tokio::net::TcpStream::from_std(stream) else {
                return;
            };
            let svc = service_fn(move |req| serve(req, chunk.clone()));
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    });
}

/// The upstream process: binds `LISTENERS` ports on 127.0.0.1, prints `PORTS <a> <b> <c> <d> <e>`, serves until stdin closes (the driver went away)
/// or `MAX_LIFETIME`.
pub fn main() -> std::process::ExitCode {
    crate::raise_nofile();
    std::thread::spawn(|| {
        // The driver holds our stdin: EOF means it is gone.
        let mut sink = String::new();
        let _ = std::io::stdin().lock().read_line(&mut sink);
        while std::io::stdin()
            .lock()
            .read_line(&mut sink)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
        std::process::exit(0);
    });
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("upstream: runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        // One listener per proxy under test, so the connections (and TIME_WAIT ports) of one do not eat the
        // ephemeral port range of another; backlog 4096 so 10,000-stream ramps are not refused.
        let mut ports = Vec::new();
        let chunk = large_chunk();
        for _ in 0..LISTENERS {
            let listener = match bind() {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("upstream: bind: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            ports.push(listener.local_addr().map(|a| a.port()).unwrap_or(0).to_string());
            accept_thread(listener, tokio::runtime::Handle::current(), chunk.clone());
        }
        println!("PORTS {}", ports.join(" "));
        let _ = std::io::stdout().flush();
        tokio::time::sleep(MAX_LIFETIME).await;
        std::process::ExitCode::SUCCESS
    })
}
