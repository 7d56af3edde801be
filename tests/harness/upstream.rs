//! The one legacy-backend emulator: a raw-TCP upstream on 127.0.0.1 that reads each request and hands the
//! connection to a script. Scripts are either a closure over an [`UpConn`] (exact bytes, faults, and when the
//! gateway closed: [`Upstream`]) or a list of [`Step`]s ([`Emulator`]), both run on the same connection.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::PATIENCE;

/// A request as the upstream received it (header names lower-cased, body de-chunked).
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
type Requests = Arc<Mutex<Vec<Recorded>>>;
pub type BoxFut = Pin<Box<dyn Future<Output = ()> + Send>>;
type Script = Arc<dyn Fn(UpConn) -> BoxFut + Send + Sync>;

/// The accept loop: reads each connection's request, logs it, then runs `script` on the connection.
async fn listen(script: Script) -> (SocketAddr, Logs, Requests, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    let logs: Logs = Arc::new(Mutex::new(Vec::new()));
    let requests: Requests = Arc::new(Mutex::new(Vec::new()));
    let (l2, r2) = (Arc::clone(&logs), Arc::clone(&requests));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let (script, logs, requests) = (Arc::clone(&script), Arc::clone(&l2), Arc::clone(&r2));
            tokio::spawn(async move {
                let accepted = Instant::now();
                let _ = stream.set_nodelay(true);
                let mut stream = stream;
                let Ok(request) = read_request(&mut stream).await else {
                    return;
                };
                requests.lock().expect("lock").push(request.clone());
                let idx = {
                    let mut l = logs.lock().expect("lock");
                    l.push(ConnLog {
                        path: request.target.clone(),
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
                    path: request.target.clone(),
                    request,
                    idx,
                    logs: Arc::clone(&logs),
                    chunked: false,
                };
                script(conn).await;
                logs.lock().expect("lock")[idx].done = true;
            });
        }
    });
    (addr, logs, requests, task)
}

/// An upstream whose connections run a closure over [`UpConn`]; stops accepting when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    logs: Logs,
    requests: Requests,
    /// The accept loop, aborted on drop (`None`: left running).
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Upstream {
    /// `script` runs once per connection (it can branch on `conn.path`).
    pub async fn start<F, Fut>(script: F) -> Upstream
    where
        F: Fn(UpConn) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self::listen(Arc::new(move |c| Box::pin(script(c)))).await
    }

    async fn listen(script: Script) -> Upstream {
        let (addr, logs, requests, task) = listen(script).await;
        Upstream {
            addr,
            logs,
            requests,
            task: Some(task),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn logs(&self) -> Vec<ConnLog> {
        self.logs.lock().expect("lock").clone()
    }

    pub fn recorded(&self) -> Vec<Recorded> {
        self.requests.lock().expect("lock").clone()
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
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The upstream's side of one connection, after the request was read.
pub struct UpConn {
    stream: Option<TcpStream>,
    pub path: String,
    pub request: Recorded,
    idx: usize,
    logs: Logs,
    chunked: bool,
}

/// The gateway closed the connection (or the write failed).
#[derive(Debug)]
pub struct Closed;

/// How [`UpConn::script`] ends a connection whose script ran to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// [`UpConn::reset`].
    Reset,
    /// [`UpConn::close`].
    Close,
}

impl UpConn {
    fn mark_closed(&self) {
        let mut l = self.logs.lock().expect("lock");
        let c = &mut l[self.idx];
        c.write_started = None;
        if c.closed.is_none() {
            c.closed = Some(Instant::now());
        }
    }

    /// Status line and headers, then `Connection: close`; `chunked` frames the body, else it is close-delimited
    /// unless the headers carry a Content-Length.
    pub async fn head(&mut self, status: u16, headers: &[(String, String)], chunked: bool) -> Result<(), Closed> {
        self.chunked = chunked;
        let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if chunked {
            head.push_str("Transfer-Encoding: chunked\r\n");
        }
        head.push_str("Connection: close\r\n\r\n");
        self.raw(head.as_bytes()).await
    }

    /// A `200 text/event-stream` head; `chunked` frames the body, else it is close-delimited.
    pub async fn sse_head(&mut self, chunked: bool) -> Result<(), Closed> {
        let headers = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache")];
        self.head(200, &headers.map(|(k, v)| (k.to_owned(), v.to_owned())), chunked)
            .await
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

    /// Body bytes, as one chunk when the body is chunked (so an empty piece is the last chunk).
    async fn body(&mut self, bytes: &[u8]) -> Result<(), Closed> {
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

    /// Body bytes, in one chunk when the body is chunked; nothing for no bytes.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), Closed> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.body(bytes).await
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

    /// Reads until the gateway closes the connection (EOF or error), however long that takes.
    pub async fn await_close(&mut self) {
        if let Some(s) = self.stream.as_mut() {
            let mut buf = [0u8; 1024];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        }
        self.mark_closed();
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

    /// Runs `script` (its writes stop at the first [`Closed`]); if it ran to its end, ends the connection as
    /// `ending` says, else leaves it to the gateway that went away.
    pub async fn script(mut self, ending: Ending, script: impl AsyncFnOnce(&mut UpConn) -> Result<(), Closed>) {
        if script(&mut self).await.is_ok() {
            match ending {
                Ending::Reset => self.reset(),
                Ending::Close => self.close().await,
            }
        }
    }

    /// Runs a [`Step`] script; see [`Emulator`].
    async fn run(
        mut self,
        steps: Vec<Step>,
        seed: u64,
        closed: mpsc::UnboundedSender<Instant>,
        flooded: Arc<AtomicU64>,
    ) {
        let mut rng = fastrand::Rng::with_seed(seed);
        for step in steps {
            let done = match step {
                Step::Head {
                    status,
                    headers,
                    chunked,
                } => self.head(status, &headers, chunked).await,
                Step::Write(bytes) => {
                    let mut rest = &bytes[..];
                    let mut r = Ok(());
                    while !rest.is_empty() && r.is_ok() {
                        let n = rng.usize(1..=rest.len().min(97));
                        r = self.body(&rest[..n]).await;
                        rest = &rest[n..];
                        if rng.u8(..) < 16 {
                            tokio::time::sleep(Duration::from_millis(rng.u64(0..3))).await;
                        }
                    }
                    r
                }
                Step::WriteAll(bytes) => self.body(&bytes).await,
                Step::Pause(d) => {
                    tokio::time::sleep(d).await;
                    Ok(())
                }
                Step::Flood { total } => {
                    let event = format!("data: {}\n\n", "x".repeat(1000));
                    let batch = event.repeat(64).into_bytes();
                    let mut sent = 0u64;
                    let mut r = Ok(());
                    while sent < total && r.is_ok() {
                        r = self.body(&batch).await;
                        sent += batch.len() as u64;
                        flooded.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    }
                    r
                }
                Step::EndChunks => self.end_chunks().await,
                Step::Reset => return self.reset(),
                Step::Hang => std::future::pending().await,
                Step::AwaitClose => {
                    self.await_close().await;
                    let _ = closed.send(Instant::now());
                    return;
                }
            };
            if done.is_err() {
                return;
            }
        }
        if let Some(s) = self.stream.as_mut() {
            let _ = s.shutdown().await;
        }
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

/// One thing the [`Emulator`] does on a connection, in order.
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
    /// A `WriteAll` of `bytes`.
    pub fn write_all(bytes: &[u8]) -> Self {
        Step::WriteAll(bytes.to_vec())
    }

    /// A whole answer: a `status` head carrying `headers` (not chunked), then `body`.
    pub fn answer(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Vec<Step> {
        vec![Step::head(status, headers, false), Step::write_all(body)]
    }

    /// A `Head` from string pairs.
    pub fn head(status: u16, headers: &[(&str, &str)], chunked: bool) -> Self {
        Step::Head {
            status,
            headers: headers.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect(),
            chunked,
        }
    }
}

/// An SSE response head.
pub fn sse_head() -> Step {
    Step::head(200, &[("Content-Type", "text/event-stream")], true)
}

/// A paced SSE answer: the head, each event written alone and followed by `gap`, then the body's end.
pub fn paced(events: impl IntoIterator<Item = Vec<u8>>, gap: Duration) -> Vec<Step> {
    let mut steps = vec![sse_head()];
    for e in events {
        steps.extend([Step::WriteAll(e), Step::Pause(gap)]);
    }
    steps.push(Step::EndChunks);
    steps
}

/// The upstream with a [`Step`] script per connection: answers each request with the handler's steps, then
/// closes. Keeps accepting for the rest of the test, even once dropped. Derefs to its [`Upstream`].
pub struct Emulator {
    upstream: Upstream,
    /// When an `AwaitClose` step saw the gateway close the connection.
    pub closed: mpsc::UnboundedReceiver<Instant>,
    /// Bytes written so far by `Flood` steps.
    pub flooded: Arc<AtomicU64>,
}

impl Emulator {
    pub async fn start(handler: impl Fn(&Recorded) -> Vec<Step> + Send + Sync + 'static) -> Emulator {
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let flooded = Arc::new(AtomicU64::new(0));
        let fl = Arc::clone(&flooded);
        let mut upstream = Upstream::listen(Arc::new(move |conn: UpConn| {
            let steps = handler(&conn.request);
            // Each connection writes its pieces with its own jitter, reproducible by its number.
            let seed = conn.idx as u64 + 2;
            Box::pin(conn.run(steps, seed, closed_tx.clone(), Arc::clone(&fl)))
        }))
        .await;
        upstream.task = None;
        Emulator {
            upstream,
            closed,
            flooded,
        }
    }

    /// Answers every request with an SSE head, an open text block with one delta, then waits for the gateway to
    /// close the connection (reported on `closed`).
    pub async fn open_until_closed() -> Emulator {
        Emulator::sse(vec![
            Step::write_all(b"data: <content-block-text>\n\ndata: hi\n\n"),
            Step::AwaitClose,
        ])
        .await
    }

    /// Answers every request with an SSE head ([`sse_head`]), then `steps`.
    pub async fn sse(steps: Vec<Step>) -> Emulator {
        Emulator::always([vec![sse_head()], steps].concat()).await
    }

    /// Answers every request with `steps`.
    pub async fn always(steps: Vec<Step>) -> Emulator {
        Emulator::start(move |_| steps.clone()).await
    }
}

impl std::ops::Deref for Emulator {
    type Target = Upstream;

    fn deref(&self) -> &Upstream {
        &self.upstream
    }
}

/// Reads one HTTP/1.1 request (Content-Length or chunked body, at most 1 MiB of head).
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Recorded> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(p) = find(&buf, b"\r\n\r\n") {
            break p;
        }
        if read_more(stream, &mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if buf.len() > 1 << 20 {
            return Err(std::io::Error::other("request head too large"));
        }
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
            if read_more(stream, &mut rest).await? == 0 {
                break;
            }
        }
        rec.body = rest;
    } else if rec
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        let eof = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(p) = find(&rest, b"\r\n") {
                    break p;
                }
                if read_more(stream, &mut rest).await? == 0 {
                    return Err(eof());
                }
            };
            let size_str = String::from_utf8_lossy(&rest[..line_end]).into_owned();
            let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| std::io::Error::other("bad chunk size"))?;
            while rest.len() < line_end + 2 + size + 2 {
                if read_more(stream, &mut rest).await? == 0 {
                    return Err(eof());
                }
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

/// Reads what the socket has into `buf`; returns how many bytes (0 at EOF).
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut tmp = [0u8; 8192];
    let n = stream.read(&mut tmp).await?;
    buf.extend_from_slice(&tmp[..n]);
    Ok(n)
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

impl Emulator {
    /// An emulator that answers every request with a `status` head carrying `headers` (not chunked), then `body`.
    pub async fn answering(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Emulator {
        Emulator::always(Step::answer(status, headers, body)).await
    }
}
