//! Fault-injection harness shared by tests/faults.rs, tests/stress.rs and benches/soak.rs: the gateway binary as
//! a subprocess, a raw-TCP upstream whose connections run scripts that write exact bytes and then misbehave (and
//! record when the gateway closed them), a raw-TCP HTTP/1.1 client, and checks of the envelope stream.

#![allow(dead_code)]

#[path = "../common/listening.rs"]
mod listening;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Generous bound on anything a test waits for: reaching it is a failure, not a measurement.
pub const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------------------------
// The gateway process
// ---------------------------------------------------------------------------------------------------------------

/// The `sse-gateway` binary run as a subprocess on ephemeral loopback ports; killed on drop.
pub struct Gateway {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// Where its stderr (the logs) goes, for evidence when a test fails.
    pub log: PathBuf,
}

impl Gateway {
    /// Starts the binary this test target was built with.
    pub fn start(upstream: &str, env: &[(&str, &str)]) -> Gateway {
        Gateway::start_bin(env!("CARGO_BIN_EXE_sse-gateway").as_ref(), upstream, env)
    }

    /// Starts `bin` against `upstream` with extra `SSE_GATEWAY__…` settings; waits for its banner.
    pub fn start_bin(bin: &std::path::Path, upstream: &str, env: &[(&str, &str)]) -> Gateway {
        use std::io::{BufRead, BufReader};
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("sse-gw-chaos-{}-{n}.log", std::process::id()));
        let stderr = std::fs::File::create(&log).expect("create gateway log");
        let mut cmd = Command::new(bin);
        for (k, _) in std::env::vars() {
            if k.starts_with("SSE_GATEWAY__") {
                cmd.env_remove(k);
            }
        }
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--upstream",
            upstream,
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn sse-gateway");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (addr, admin) = listening::addresses(&rx, PATIENCE);
        Gateway {
            child,
            addr,
            admin,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size in KiB (VmRSS).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// Open file descriptors (entries of /proc/PID/fd).
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The admin /metrics text.
    pub async fn metrics(&self) -> String {
        let (status, body) = http_get(self.admin, "/metrics").await;
        assert_eq!(status, 200, "GET /metrics");
        String::from_utf8(body).expect("utf-8 metrics")
    }

    /// Sum of a metric's samples whose line contains every label fragment.
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric(&self.metrics().await, name, labels)
    }

    /// Polls until `sse_gateway_active_streams` is 0; returns the last value seen.
    pub async fn wait_no_active_streams(&self, within: Duration) -> f64 {
        let deadline = Instant::now() + within;
        loop {
            let v = self.metric("sse_gateway_active_streams", &[]).await;
            if v == 0.0 || Instant::now() > deadline {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls until the fd count is at most `limit`; returns the last count seen.
    pub async fn wait_fds_at_most(&self, limit: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let n = self.fds();
            if n <= limit || Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of the gateway's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Samples a process's RSS every `every` in a background thread; `stop()` returns the peak in KiB.
pub struct RssSampler {
    peak: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    pub fn start(pid: u32, every: Duration) -> RssSampler {
        use std::sync::atomic::Ordering;
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(rss_kib(pid)));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p, s) = (Arc::clone(&peak), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(every);
            }
        });
        RssSampler {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    pub fn peak_kib(&self) -> u64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak_kib()
    }
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

// ---------------------------------------------------------------------------------------------------------------
// The fault-injecting upstream
// ---------------------------------------------------------------------------------------------------------------

/// What the upstream saw on one connection.
#[derive(Debug, Clone)]
pub struct ConnLog {
    /// Request target (path and query).
    pub path: String,
    pub accepted: Instant,
    /// When the upstream saw the gateway close (EOF, reset, or a failed write), if it did.
    pub closed: Option<Instant>,
    /// Body bytes written (framing excluded).
    pub written: u64,
    /// Set while a write is in progress: how long the current write has been blocked.
    pub write_started: Option<Instant>,
    /// The script finished (or failed) and the upstream dropped the connection.
    pub done: bool,
}

type Logs = Arc<Mutex<Vec<ConnLog>>>;
pub type BoxFut = Pin<Box<dyn Future<Output = ()> + Send>>;
type Script = Arc<dyn Fn(UpConn) -> BoxFut + Send + Sync>;

/// A legacy-backend emulator on 127.0.0.1: reads each request head, then hands the connection to the script.
pub struct Upstream {
    pub addr: SocketAddr,
    logs: Logs,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// `script` runs once per connection (it can branch on `conn.path`).
    pub async fn start<F, Fut>(script: F) -> Upstream
    where
        F: Fn(UpConn) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let script: Script = Arc::new(move |c| Box::pin(script(c)));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let logs: Logs = Arc::new(Mutex::new(Vec::new()));
        let l2 = Arc::clone(&logs);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let (script, logs) = (Arc::clone(&script), Arc::clone(&l2));
                tokio::spawn(async move {
                    let accepted = Instant::now();
                    let _ = stream.set_nodelay(true);
                    let mut stream = stream;
                    let Ok(path) = read_request_head(&mut stream).await else {
                        return;
                    };
                    let idx = {
                        let mut l = logs.lock().expect("lock");
                        l.push(ConnLog {
                            path: path.clone(),
                            accepted,
                            closed: None,
                            written: 0,
                            write_started: None,
                            done: false,
                        });
                        l.len() - 1
                    };
                    let conn = UpConn {
                        stream: Some(stream),
                        path,
                        idx,
                        logs: Arc::clone(&logs),
                        chunked: false,
                    };
                    script(conn).await;
                    logs.lock().expect("lock")[idx].done = true;
                });
            }
        });
        Upstream { addr, logs, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn logs(&self) -> Vec<ConnLog> {
        self.logs.lock().expect("lock").clone()
    }

    /// The log of the first connection whose path is `path`.
    pub fn conn(&self, path: &str) -> Option<ConnLog> {
        self.logs().into_iter().find(|c| c.path == path)
    }

    /// Waits until a connection for `path` shows up.
    pub async fn wait_conn(&self, path: &str) -> ConnLog {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(c) = self.conn(path) {
                return c;
            }
            assert!(Instant::now() < deadline, "no upstream connection for {path}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The upstream's side of one connection, after the request head was read.
pub struct UpConn {
    stream: Option<TcpStream>,
    pub path: String,
    idx: usize,
    logs: Logs,
    chunked: bool,
}

/// The gateway closed the connection (or the write failed).
#[derive(Debug)]
pub struct Closed;

impl UpConn {
    fn mark_closed(&self) {
        let mut l = self.logs.lock().expect("lock");
        let c = &mut l[self.idx];
        c.write_started = None;
        if c.closed.is_none() {
            c.closed = Some(Instant::now());
        }
    }

    /// A `200 text/event-stream` head; `chunked` frames the body, else it is close-delimited.
    pub async fn sse_head(&mut self, chunked: bool) -> Result<(), Closed> {
        self.chunked = chunked;
        let te = if chunked { "Transfer-Encoding: chunked\r\n" } else { "" };
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n{te}Connection: close\r\n\r\n"
        );
        self.raw(head.as_bytes()).await
    }

    /// Writes bytes exactly as given (no framing).
    pub async fn raw(&mut self, bytes: &[u8]) -> Result<(), Closed> {
        let Some(s) = self.stream.as_mut() else {
            return Err(Closed);
        };
        self.logs.lock().expect("lock")[self.idx].write_started = Some(Instant::now());
        let r = s.write_all(bytes).await;
        self.logs.lock().expect("lock")[self.idx].write_started = None;
        if r.is_err() {
            self.mark_closed();
            return Err(Closed);
        }
        Ok(())
    }

    /// Body bytes, in one chunk when the body is chunked.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), Closed> {
        if bytes.is_empty() {
            return Ok(());
        }
        if self.chunked {
            let mut framed = format!("{:x}\r\n", bytes.len()).into_bytes();
            framed.extend_from_slice(bytes);
            framed.extend_from_slice(b"\r\n");
            self.raw(&framed).await?;
        } else {
            self.raw(bytes).await?;
        }
        self.logs.lock().expect("lock")[self.idx].written += bytes.len() as u64;
        Ok(())
    }

    /// Waits `d`, watching for the gateway closing the connection meanwhile.
    pub async fn pause(&mut self, d: Duration) -> Result<(), Closed> {
        let Some(s) = self.stream.as_mut() else {
            return Err(Closed);
        };
        let mut buf = [0u8; 256];
        let sleep = tokio::time::sleep(d);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => return Ok(()),
                r = s.read(&mut buf) => match r {
                    Ok(0) | Err(_) => {
                        self.mark_closed();
                        return Err(Closed);
                    }
                    Ok(_) => {}
                },
            }
        }
    }

    /// Sends nothing more until the gateway closes the connection, or `limit` passes.
    pub async fn stall(&mut self, limit: Duration) -> Result<(), Closed> {
        self.pause(limit).await
    }

    /// The last chunk (`0\r\n\r\n`) of a chunked body.
    pub async fn end_chunks(&mut self) -> Result<(), Closed> {
        self.raw(b"0\r\n\r\n").await
    }

    /// Ends cleanly: FIN, then waits (bounded) for the gateway to close its side.
    pub async fn close(mut self) {
        if let Some(s) = self.stream.as_mut() {
            let _ = s.shutdown().await;
        }
        let _ = self.pause(Duration::from_secs(5)).await;
    }

    /// Aborts with a TCP reset: SO_LINGER 0, then close.
    pub fn reset(mut self) {
        if let Some(s) = self.stream.take() {
            let _ = s.set_zero_linger();
            drop(s);
        }
    }
}

/// Reads a request head (and a small Content-Length or chunked body); returns the request target.
async fn read_request_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let end = loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            break p;
        }
        let n = stream.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&tmp[..n]);
        if buf.len() > 1 << 20 {
            return Err(std::io::Error::other("request head too large"));
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let target = String::from_utf8_lossy(&buf[..end])
        .split(' ')
        .nth(1)
        .unwrap_or("")
        .to_owned();
    let mut rest = buf[end + 4..].to_vec();
    if let Some(len) = header_value(&head, "content-length").and_then(|v| v.parse::<usize>().ok()) {
        while rest.len() < len {
            let n = stream.read(&mut tmp).await?;
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&tmp[..n]);
        }
    } else if header_value(&head, "transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        while find(&rest, b"0\r\n\r\n").is_none() {
            let n = stream.read(&mut tmp).await?;
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&tmp[..n]);
        }
    }
    Ok(target)
}

fn header_value<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == name)
        .map(|(_, v)| v.trim())
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

// ---------------------------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------------------------

/// A raw HTTP/1.1 client connection with an incremental chunked-body decoder.
pub struct Client {
    pub stream: TcpStream,
    /// Undecoded bytes read from the socket.
    raw: Vec<u8>,
    pub status: u16,
    pub head: String,
    chunked: bool,
    /// Bytes left in the current chunk (chunked bodies).
    chunk_left: usize,
    /// The body ended (last chunk, or EOF of a close-delimited body).
    pub ended: bool,
    /// Decoded body bytes.
    pub body: Vec<u8>,
}

/// A request for `path` as a translating client sends it (with `Accept: text/event-stream`, like EventSource and
/// the SSE client libraries, so the gateway reads the stream on a dedicated upstream connection by default).
pub fn request(path: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: gateway\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n\
         X-Agent-Id: fallback\r\nX-Stream-Format: json\r\nContent-Length: 2\r\n\r\n{{}}"
    )
    .into_bytes()
}

impl Client {
    /// Connects and sends the request; does not wait for the response.
    pub async fn send(addr: SocketAddr, path: &str) -> std::io::Result<Client> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        stream.write_all(&request(path)).await?;
        Ok(Client {
            stream,
            raw: Vec::new(),
            status: 0,
            head: String::new(),
            chunked: false,
            chunk_left: 0,
            ended: false,
            body: Vec::new(),
        })
    }

    /// Connects, sends the request and reads the response head.
    pub async fn open(addr: SocketAddr, path: &str) -> std::io::Result<Client> {
        let mut c = Client::send(addr, path).await?;
        c.read_head().await?;
        Ok(c)
    }

    async fn fill(&mut self, max: usize) -> std::io::Result<usize> {
        let mut tmp = vec![0u8; max.clamp(1, 64 << 10)];
        let n = self.stream.read(&mut tmp).await?;
        self.raw.extend_from_slice(&tmp[..n]);
        Ok(n)
    }

    pub async fn read_head(&mut self) -> std::io::Result<()> {
        let end = loop {
            if let Some(p) = find(&self.raw, b"\r\n\r\n") {
                break p;
            }
            if self.fill(64 << 10).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        };
        self.head = String::from_utf8_lossy(&self.raw[..end]).into_owned();
        self.raw.drain(..end + 4);
        self.status = self.head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let lower = self.head.to_ascii_lowercase();
        self.chunked = header_value(&lower, "transfer-encoding").is_some_and(|v| v.contains("chunked"));
        Ok(())
    }

    /// Decodes what `raw` holds into `body`; returns the bytes decoded.
    fn decode(&mut self) -> std::io::Result<usize> {
        let before = self.body.len();
        if !self.chunked {
            self.body.append(&mut self.raw);
            return Ok(self.body.len() - before);
        }
        loop {
            if self.ended {
                break;
            }
            if self.chunk_left > 0 {
                let n = self.chunk_left.min(self.raw.len());
                if n == 0 {
                    break;
                }
                self.body.extend_from_slice(&self.raw[..n]);
                self.raw.drain(..n);
                self.chunk_left -= n;
                continue;
            }
            // At a chunk boundary: optional CRLF after data, then a size line.
            if self.raw.starts_with(b"\r\n") {
                self.raw.drain(..2);
            }
            let Some(eol) = find(&self.raw, b"\r\n") else {
                break;
            };
            let line = String::from_utf8_lossy(&self.raw[..eol]).into_owned();
            let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size line {line:?}")))?;
            if size == 0 {
                // The last chunk, then an (empty) trailer section ending in a blank line.
                if find(&self.raw[eol..], b"\r\n\r\n").is_some() {
                    self.raw.clear();
                    self.ended = true;
                }
                break;
            }
            self.raw.drain(..eol + 2);
            self.chunk_left = size;
        }
        Ok(self.body.len() - before)
    }

    /// Reads at most `max` socket bytes once; returns the body bytes decoded (0 with `ended` or at EOF).
    pub async fn read_some(&mut self, max: usize) -> std::io::Result<usize> {
        loop {
            let n = self.decode()?;
            if n > 0 || self.ended {
                return Ok(n);
            }
            if self.fill(max).await? == 0 {
                if !self.chunked {
                    self.ended = true;
                }
                return Ok(0);
            }
        }
    }

    /// Reads until the body ends or the connection closes; `Err` on timeout.
    pub async fn read_to_end(&mut self, within: Duration) -> Result<(), String> {
        let fut = async {
            loop {
                if self.ended {
                    return Ok(());
                }
                self.decode().map_err(|e| e.to_string())?;
                if self.ended {
                    return Ok(());
                }
                match self.fill(64 << 10).await {
                    Ok(0) => {
                        let _ = self.decode();
                        return if self.ended || !self.chunked {
                            self.ended = true;
                            Ok(())
                        } else {
                            Err("connection closed before the last chunk".to_owned())
                        };
                    }
                    Ok(_) => {}
                    Err(e) => return Err(format!("read failed: {e}")),
                }
            }
        };
        tokio::time::timeout(within, fut)
            .await
            .map_err(|_| format!("body did not end within {within:?}"))?
    }

    /// Reads until the decoded body holds at least `n` bytes (or it ends).
    pub async fn read_until_len(&mut self, n: usize, within: Duration) -> Result<(), String> {
        let fut = async {
            while self.body.len() < n && !self.ended {
                self.decode().map_err(|e| e.to_string())?;
                if self.body.len() >= n || self.ended {
                    break;
                }
                match self.fill(64 << 10).await {
                    Ok(0) => return Err("eof".to_owned()),
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(())
        };
        tokio::time::timeout(within, fut)
            .await
            .map_err(|_| format!("fewer than {n} body bytes within {within:?}"))?
    }

    /// Reads until the body contains `needle` (or it ends).
    pub async fn read_until_contains(&mut self, needle: &[u8], within: Duration) -> Result<(), String> {
        let fut = async {
            while find(&self.body, needle).is_none() && !self.ended {
                self.decode().map_err(|e| e.to_string())?;
                if find(&self.body, needle).is_some() || self.ended {
                    break;
                }
                match self.fill(64 << 10).await {
                    Ok(0) => return Err("eof".to_owned()),
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(())
        };
        tokio::time::timeout(within, fut)
            .await
            .map_err(|_| format!("{:?} not seen within {within:?}", String::from_utf8_lossy(needle)))?
    }

    /// Closes abruptly: a reset (SO_LINGER 0) when `rst`, else a FIN.
    pub fn disconnect(self, rst: bool) {
        if rst {
            let _ = self.stream.set_zero_linger();
        }
        drop(self.stream);
    }
}

/// GET `path` on `addr` (Connection: close); returns status and decoded body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let fut = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.expect("write");
        let mut c = Client {
            stream,
            raw: Vec::new(),
            status: 0,
            head: String::new(),
            chunked: false,
            chunk_left: 0,
            ended: false,
            body: Vec::new(),
        };
        c.read_head().await.expect("response head");
        c.read_to_end(PATIENCE).await.expect("response body");
        (c.status, c.body)
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .expect("admin answered in time")
}

// ---------------------------------------------------------------------------------------------------------------
// Checking envelope streams
// ---------------------------------------------------------------------------------------------------------------

/// One SSE event of the gateway's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    Envelope(Value),
    Done,
    /// A `:` comment line (keepalive).
    Comment(String),
}

/// Parses a translated stream strictly: events end with a blank line, every `data:` line is `[DONE]` or a JSON
/// object with string `type`, string `agent`, boolean `final` and string `delta`. Returns the events in order.
pub fn parse_stream(bytes: &[u8]) -> Result<Vec<Out>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("output is not UTF-8: {e}"))?;
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let Some(end) = rest.find("\n\n") else {
            return Err(format!("unterminated event at the end: {:?}", clip(rest)));
        };
        let event = &rest[..end];
        rest = &rest[end + 2..];
        for line in event.split('\n') {
            if let Some(c) = line.strip_prefix(':') {
                out.push(Out::Comment(c.trim().to_owned()));
            } else if let Some(d) = line.strip_prefix("data: ") {
                if d == "[DONE]" {
                    out.push(Out::Done);
                    continue;
                }
                let v: Value =
                    serde_json::from_str(d).map_err(|e| format!("data line is not JSON ({e}): {}", clip(d)))?;
                let ok = v.get("type").is_some_and(Value::is_string)
                    && v.get("agent").is_some_and(Value::is_string)
                    && v.get("final").is_some_and(Value::is_boolean)
                    && v.get("delta").is_some_and(Value::is_string);
                if !ok {
                    return Err(format!("envelope lacks type/agent/final/delta: {}", clip(d)));
                }
                out.push(Out::Envelope(v));
            } else {
                return Err(format!("unexpected line in output: {:?}", clip(line)));
            }
        }
    }
    Ok(out)
}

fn clip(s: &str) -> String {
    if s.len() <= 300 {
        return s.to_owned();
    }
    let mut end = 300;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// The envelopes only (keepalives and `[DONE]` dropped).
pub fn envelopes(events: &[Out]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| match e {
            Out::Envelope(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

pub fn kind(v: &Value) -> &str {
    v["type"].as_str().unwrap_or("")
}

pub fn delta(v: &Value) -> &str {
    v["delta"].as_str().unwrap_or("")
}

pub fn is_final(v: &Value) -> bool {
    v["final"].as_bool().unwrap_or(false)
}

/// The `type` field of an `error` envelope's delta when it is JSON (`upstream_error`, `parse_error`), else "".
pub fn error_type(v: &Value) -> String {
    serde_json::from_str::<Value>(delta(v))
        .ok()
        .and_then(|d| d.get("type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// [`assert_ends_in_error`], and that error is the gateway's `upstream_error` (not a parse error of the content).
pub fn assert_ends_in_upstream_error(bytes: &[u8], what: &str) -> Vec<Value> {
    let envs = assert_ends_in_error(bytes, what);
    let last = envs.last().expect("assert_ends_in_error found one");
    assert_eq!(error_type(last), "upstream_error", "{what}: {envs:?}");
    envs
}

/// Checks the shape every faulted stream must have: well-formed, its last envelope an `error` (final) with no
/// `[DONE]` after it, and no streamed text/thinking block still open when that error arrives. Returns the envelopes.
pub fn assert_ends_in_error(bytes: &[u8], what: &str) -> Vec<Value> {
    let events = parse_stream(bytes).unwrap_or_else(|e| panic!("{what}: malformed output: {e}"));
    let envs = envelopes(&events);
    let last = envs
        .last()
        .unwrap_or_else(|| panic!("{what}: no envelope at all: {}", String::from_utf8_lossy(bytes)));
    assert_eq!(
        kind(last),
        "error",
        "{what}: the stream does not end in an error envelope; last events: {:?}",
        &events[events.len().saturating_sub(4)..]
    );
    assert!(is_final(last), "{what}: error envelope not final: {last}");
    let last_event = events
        .iter()
        .rev()
        .find(|e| !matches!(e, Out::Comment(_)))
        .expect("an event");
    assert!(
        matches!(last_event, Out::Envelope(_)),
        "{what}: something follows the error envelope: {last_event:?}"
    );
    // Streamed blocks open at the error (a text/thinking delta with no final marker after it).
    let mut open: Vec<(String, String)> = Vec::new();
    for v in &envs[..envs.len() - 1] {
        let k = kind(v);
        if k == "text" || k == "thinking" {
            let key = (k.to_owned(), v["agent"].as_str().unwrap_or("").to_owned());
            if is_final(v) {
                open.retain(|o| o != &key);
            } else if !open.contains(&key) {
                open.push(key);
            }
        }
    }
    assert!(
        open.is_empty(),
        "{what}: blocks {open:?} are still open when the error envelope arrives"
    );
    envs
}

/// A translated stream as blocks: (type, agent, concatenated deltas) per block, a block ending at `final:true`
/// (citations and images are their own blocks). Makes comparisons independent of how content was chunked.
pub fn blocks(envs: &[Value]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    let mut open: Option<(String, String, String)> = None;
    for v in envs {
        let (k, a, d) = (
            kind(v).to_owned(),
            v["agent"].as_str().unwrap_or("").to_owned(),
            delta(v),
        );
        match &mut open {
            Some((ok, oa, od)) if *ok == k && *oa == a => od.push_str(d),
            _ => {
                if let Some(b) = open.take() {
                    out.push(b);
                }
                open = Some((k, a, d.to_owned()));
            }
        }
        if is_final(v) {
            out.extend(open.take());
        }
    }
    out.extend(open);
    out
}

/// The legacy formatter's escape for streamed text: `\` → `\\`, then newline → `\n`.
pub fn escape_text(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A normal, complete legacy stream for `agent`: meta_init, a text block of `deltas`, a tool call, its result,
/// `[DONE]`; as SSE events (one element per event).
pub fn normal_stream(agent: &str, deltas: &[String]) -> Vec<Vec<u8>> {
    let meta = format!(
        "{{&quot;format&quot;: &quot;xml&quot;, &quot;user_query&quot;: &quot;q&quot;, &quot;agent_uuid&quot;: \
         &quot;{agent}&quot;, &quot;parent_agent_uuid&quot;: null, &quot;model&quot;: &quot;m&quot;}}"
    );
    let mut ev = vec![format!("data: <meta_init data=\"{meta}\"></meta_init>\n\n").into_bytes()];
    ev.push(b"data: <content-block-text>\n\n".to_vec());
    for d in deltas {
        ev.push(format!("data: {}\n\n", escape_text(d)).into_bytes());
    }
    ev.push(b"data: </content-block-text>\n\n".to_vec());
    ev.push(
        b"data: <content-block-tool_call id=\"call_1\" name=\"lookup\" arguments=\"{&quot;q&quot;: &quot;x&quot;}\"></content-block-tool_call>\n\n"
            .to_vec(),
    );
    ev.push(
        b"data: <content-block-tool_result id=\"call_1\" name=\"lookup\"><![CDATA[result body]]></content-block-tool_result>\n\n"
            .to_vec(),
    );
    ev.push(b"data: [DONE]\n\n".to_vec());
    ev
}

/// Serves `events` with `gap` between them (chunked), then ends the body; returns early if the gateway closes.
pub async fn serve_events(mut conn: UpConn, events: &[Vec<u8>], gap: Duration) {
    if conn.sse_head(true).await.is_err() {
        return;
    }
    for e in events {
        if conn.send(e).await.is_err() || conn.pause(gap).await.is_err() {
            return;
        }
    }
    if conn.end_chunks().await.is_ok() {
        conn.close().await;
    }
}

/// A concurrent "bystander" stream: checks that the gateway serves a normal stream correctly while a fault is
/// injected elsewhere. Its upstream path is `/control`; call `control_script` from the upstream's script for it.
pub fn control_deltas() -> Vec<String> {
    (0..40)
        .map(|i| format!("delta {i}: naïve café 日本語 🎉 a<b & \"q\" \\ back\nslash "))
        .collect()
}

pub async fn control_script(conn: UpConn) {
    let events = normal_stream("control-agent", &control_deltas());
    serve_events(conn, &events, Duration::from_millis(50)).await;
}

/// Runs the control stream through the gateway and checks it arrived complete and exact.
pub async fn run_control(gw: SocketAddr) -> Result<(), String> {
    let mut c = Client::open(gw, "/control")
        .await
        .map_err(|e| format!("control: {e}"))?;
    if c.status != 200 {
        return Err(format!("control: status {}", c.status));
    }
    c.read_to_end(PATIENCE).await.map_err(|e| format!("control: {e}"))?;
    let events = parse_stream(&c.body).map_err(|e| format!("control: {e}"))?;
    if events.last() != Some(&Out::Done) {
        return Err(format!("control: stream does not end with [DONE]: {:?}", events.last()));
    }
    let got = blocks(&envelopes(&events));
    let want_text: String = control_deltas().concat();
    let expected = vec![
        ("meta_init".to_owned(), "control-agent".to_owned(), None),
        ("text".to_owned(), "control-agent".to_owned(), Some(want_text)),
        (
            "tool_call".to_owned(),
            "control-agent".to_owned(),
            Some("{\"q\": \"x\"}".to_owned()),
        ),
        (
            "tool_result".to_owned(),
            "control-agent".to_owned(),
            Some("result body".to_owned()),
        ),
    ];
    if got.len() != expected.len() {
        return Err(format!("control: blocks {got:?}"));
    }
    for (g, (k, a, d)) in got.iter().zip(&expected) {
        if &g.0 != k || &g.1 != a || d.as_ref().is_some_and(|d| d != &g.2) {
            return Err(format!("control: block {g:?} != expected {k} {a} {d:?}"));
        }
    }
    Ok(())
}
