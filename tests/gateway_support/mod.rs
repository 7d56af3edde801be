//! Test support: a scriptable upstream emulator on raw TCP, an in-process gateway, HTTP helpers and SSE parsing.

#![allow(dead_code)]

#[path = "../common/listening.rs"]
pub mod listening;

pub mod legacy;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sse_gateway::config::Settings;
use sse_gateway::proxy::server::Gateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// Generous bound on anything a test waits for: reaching it is a failure, not a measurement.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A request as the emulator received it.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One thing the emulator does on a connection, in order.
#[derive(Debug, Clone)]
pub enum Step {
    /// Status line and headers; `chunked` frames the body with chunked encoding, else it is close-delimited
    /// unless the headers carry a Content-Length. `Connection: close` is always added.
    Head {
        status: u16,
        headers: Vec<(String, String)>,
        chunked: bool,
    },
    /// Body bytes written in random-sized pieces with small random pauses.
    Write(Vec<u8>),
    /// Body bytes written at once.
    WriteAll(Vec<u8>),
    Pause(Duration),
    /// `total` bytes of SSE text deltas (`data: xxxx…\n\n`), generated as written, reporting progress.
    Flood {
        total: u64,
    },
    /// Ends the chunked body (`0\r\n\r\n`).
    EndChunks,
    /// Aborts the connection with a TCP reset.
    Reset,
    /// Never answers (the request is read).
    Hang,
    /// Waits until the gateway closes the connection, then reports it on `closed`.
    AwaitClose,
}

impl Step {
    /// A `Head` from string pairs.
    pub fn head(status: u16, headers: &[(&str, &str)], chunked: bool) -> Self {
        Step::Head {
            status,
            headers: headers.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect(),
            chunked,
        }
    }
}

type Handler = Arc<dyn Fn(&Recorded) -> Vec<Step> + Send + Sync>;

/// A legacy backend emulator: answers each connection's request with the handler's script, then closes.
pub struct Emulator {
    pub addr: SocketAddr,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    /// When an `AwaitClose` step saw the gateway close the connection.
    pub closed: mpsc::UnboundedReceiver<Instant>,
    /// Bytes written so far by `Flood` steps.
    pub flooded: Arc<std::sync::atomic::AtomicU64>,
}

impl Emulator {
    pub async fn start(handler: impl Fn(&Recorded) -> Vec<Step> + Send + Sync + 'static) -> Emulator {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind emulator");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let flooded = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let handler: Handler = Arc::new(handler);
        let (reqs, fl) = (Arc::clone(&requests), Arc::clone(&flooded));
        tokio::spawn(async move {
            let mut seed = 1u64;
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                seed += 1;
                let (handler, reqs, closed_tx, fl) = (
                    Arc::clone(&handler),
                    Arc::clone(&reqs),
                    closed_tx.clone(),
                    Arc::clone(&fl),
                );
                tokio::spawn(async move {
                    let _ = serve_conn(stream, handler, reqs, closed_tx, fl, seed).await;
                });
            }
        });
        Emulator {
            addr,
            requests,
            closed,
            flooded,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().expect("lock").clone()
    }
}

async fn serve_conn(
    mut stream: TcpStream,
    handler: Handler,
    reqs: Arc<Mutex<Vec<Recorded>>>,
    closed_tx: mpsc::UnboundedSender<Instant>,
    flooded: Arc<std::sync::atomic::AtomicU64>,
    seed: u64,
) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let req = read_request(&mut stream).await?;
    reqs.lock().expect("lock").push(req.clone());
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut chunked = false;
    for step in handler(&req) {
        match step {
            Step::Head {
                status,
                headers,
                chunked: c,
            } => {
                chunked = c;
                let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
                for (k, v) in &headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                if c {
                    head.push_str("Transfer-Encoding: chunked\r\n");
                }
                head.push_str("Connection: close\r\n\r\n");
                stream.write_all(head.as_bytes()).await?;
            }
            Step::Write(bytes) => {
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    let n = rng.usize(1..=rest.len().min(97));
                    write_body(&mut stream, &rest[..n], chunked).await?;
                    rest = &rest[n..];
                    if rng.u8(..) < 16 {
                        tokio::time::sleep(Duration::from_millis(rng.u64(0..3))).await;
                    }
                }
            }
            Step::WriteAll(bytes) => write_body(&mut stream, &bytes, chunked).await?,
            Step::Pause(d) => tokio::time::sleep(d).await,
            Step::Flood { total } => {
                let event = format!("data: {}\n\n", "x".repeat(1000));
                let mut batch = Vec::new();
                for _ in 0..64 {
                    batch.extend_from_slice(event.as_bytes());
                }
                let mut sent = 0u64;
                while sent < total {
                    write_body(&mut stream, &batch, chunked).await?;
                    sent += batch.len() as u64;
                    flooded.fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Step::EndChunks => stream.write_all(b"0\r\n\r\n").await?,
            Step::Reset => {
                stream.set_zero_linger()?;
                drop(stream);
                return Ok(());
            }
            Step::Hang => {
                std::future::pending::<()>().await;
            }
            Step::AwaitClose => {
                let mut buf = [0u8; 1024];
                loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                let _ = closed_tx.send(Instant::now());
                return Ok(());
            }
        }
    }
    stream.shutdown().await
}

async fn write_body(stream: &mut TcpStream, bytes: &[u8], chunked: bool) -> std::io::Result<()> {
    if chunked {
        stream.write_all(format!("{:x}\r\n", bytes.len()).as_bytes()).await?;
        stream.write_all(bytes).await?;
        stream.write_all(b"\r\n").await
    } else {
        stream.write_all(bytes).await
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        302 => "Found",
        404 => "Not Found",
        500 => "Internal Server Error",
        _ => "Status",
    }
}

/// Reads one HTTP/1.1 request (Content-Length or chunked body).
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Recorded> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            break p;
        }
        let n = stream.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut rest = buf[head_end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let mut rec = Recorded {
        method: first.next().unwrap_or("").to_owned(),
        target: first.next().unwrap_or("").to_owned(),
        ..Recorded::default()
    };
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            rec.headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    if let Some(len) = rec.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        while rest.len() < len {
            let n = stream.read(&mut tmp).await?;
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&tmp[..n]);
        }
        rec.body = rest;
    } else if rec
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(p) = find(&rest, b"\r\n") {
                    break p;
                }
                let n = stream.read(&mut tmp).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                rest.extend_from_slice(&tmp[..n]);
            };
            let size_str = String::from_utf8_lossy(&rest[..line_end]).into_owned();
            let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| std::io::Error::other("bad chunk size"))?;
            while rest.len() < line_end + 2 + size + 2 {
                let n = stream.read(&mut tmp).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                rest.extend_from_slice(&tmp[..n]);
            }
            body.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
            rest.drain(..line_end + 2 + size + 2);
            if size == 0 {
                break;
            }
        }
        rec.body = body;
    }
    Ok(rec)
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// An SSE response head.
pub fn sse_head() -> Step {
    Step::Head {
        status: 200,
        headers: vec![("Content-Type".into(), "text/event-stream".into())],
        chunked: true,
    }
}

/// A gateway running in this process, on ephemeral ports.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestGateway {
    pub async fn start(upstream: &str, tweak: impl FnOnce(&mut Settings)) -> TestGateway {
        let mut s = Settings::default();
        s.server.listen = "127.0.0.1:0".into();
        s.server.admin_listen = "127.0.0.1:0".into();
        s.upstream.url = upstream.to_owned();
        tweak(&mut s);
        s.validate().expect("test settings are valid");
        let gw = Gateway::bind(s, prometheus::Registry::new())
            .await
            .expect("bind gateway");
        let (addr, admin) = (gw.local_addr(), gw.admin_addr());
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(gw.run(async move {
            let _ = rx.await;
        }));
        TestGateway {
            addr,
            admin,
            stop: Some(tx),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn metrics(&self) -> String {
        let (_, body) = get(&format!("http://{}/metrics", self.admin)).await;
        String::from_utf8(body).expect("utf-8 metrics")
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(PATIENCE, &mut self.task).await;
    }
}

/// Checks, in a `/metrics` text, how many requests went upstream on each kind of connection.
pub fn assert_upstream_connections(metrics: &str, pooled: usize, dedicated: usize) {
    let on = |c: &str| {
        metric(
            metrics,
            "sse_gateway_upstream_requests_total",
            &[&format!("connection=\"{c}\"")],
        )
    };
    assert_eq!(
        (on("pooled"), on("dedicated")),
        (pooled as f64, dedicated as f64),
        "requests on (pooled, dedicated) connections"
    );
}

/// Sum of a metric's samples whose line contains every given fragment (e.g. `mode="translate"`).
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends a request and reads the whole response.
pub async fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> (http::response::Parts, Vec<u8>) {
    let mut b = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(body.into())).expect("request");
    let fut = async {
        let resp = client().request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.expect("body").to_bytes().to_vec();
        (parts, bytes)
    };
    tokio::time::timeout(PATIENCE, fut).await.expect("response in time")
}

pub async fn get(url: &str) -> (http::response::Parts, Vec<u8>) {
    send("GET", url, &[], Bytes::new()).await
}

/// Writes raw bytes on a fresh connection to `addr` and returns the stream.
pub async fn raw(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    s
}

/// Reads until EOF (or error); `None` if it takes longer than `PATIENCE`.
pub async fn read_to_eof(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    let fut = async {
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(PATIENCE, fut).await.ok()?;
    Some(all)
}

/// The `data:` payloads of an SSE byte stream, comments (keepalives) skipped.
pub fn sse_data(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut out = Vec::new();
    for event in text.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            out.push(data.join("\n"));
        }
    }
    out
}

/// The envelopes of a translated stream (`[DONE]` kept as a string value).
pub fn envelopes(bytes: &[u8]) -> Vec<serde_json::Value> {
    sse_data(bytes)
        .into_iter()
        .map(|d| {
            if d == "[DONE]" {
                serde_json::Value::String(d)
            } else {
                serde_json::from_str(&d).unwrap_or_else(|e| panic!("envelope is not JSON ({e}): {d}"))
            }
        })
        .collect()
}

/// A gateway binary run as a subprocess.
pub struct Process {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub stdout_lines: Arc<Mutex<Vec<String>>>,
}

impl Process {
    /// Starts the binary with `args` (ports 0 unless given) and waits for its banner.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Process {
        Self::spawn(Command::new(env!("CARGO_BIN_EXE_sse-gateway")), args, env)
    }

    /// Like [`Process::start`], with the open-file limit (`ulimit -n`) set to `limit` for the gateway only: a
    /// shell lowers its own limit and then execs the binary, so the test process keeps its own.
    pub fn start_with_fd_limit(limit: u32, args: &[&str], env: &[(&str, &str)]) -> Process {
        let mut cmd = Command::new("bash");
        cmd.args([
            "-c",
            &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
            env!("CARGO_BIN_EXE_sse-gateway"),
        ]);
        Self::spawn(cmd, args, env)
    }

    /// Runs `cmd` (the binary, or a wrapper that execs it) with `args` and waits for the banner.
    fn spawn(mut cmd: Command, args: &[&str], env: &[(&str, &str)]) -> Process {
        cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn sse-gateway");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                l2.lock().expect("lock").push(line);
            }
        });
        let (addr, admin) = listening::addresses(&rx, PATIENCE);
        Process {
            child,
            addr,
            admin,
            stdout_lines: lines,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("read /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS")
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits for the exit status, at most `PATIENCE`.
    pub fn wait(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
