//! Clients of the gateway: hyper's (whole responses: [`send`], [`get`]), raw bytes on a fresh connection
//! ([`raw`], [`read_to_eof`]), and a raw HTTP/1.1 [`Client`] that decodes a chunked body as it arrives, for the
//! tests that read a stream part by part or misbehave as a client.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::upstream::{find, Emulator};
use super::PATIENCE;

pub type HttpClient = HyperClient<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    HyperClient::builder(TokioExecutor::new()).build_http()
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

/// Opens a run on `POST /agent/run` (body `{}`) with `headers`: the streaming body, and the bytes of its first frame.
pub async fn open_run(addr: SocketAddr, headers: &[(&str, &str)]) -> (hyper::body::Incoming, Vec<u8>) {
    let mut req = http::Request::post(format!("http://{addr}/agent/run"));
    for &(k, v) in headers {
        req = req.header(k, v);
    }
    let req = req.body(Full::new(Bytes::from_static(b"{}"))).expect("request");
    let resp = tokio::time::timeout(PATIENCE, client().request(req))
        .await
        .expect("a response in time")
        .expect("a response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(PATIENCE, body.frame())
        .await
        .expect("a first frame in time")
        .expect("a first frame")
        .expect("data");
    (body, first.into_data().unwrap_or_default().to_vec())
}

/// Reads a streaming body to its end into `got`: `true` when it ended cleanly, `false` when it was cut.
pub async fn read_rest(body: &mut hyper::body::Incoming, got: &mut Vec<u8>) -> bool {
    while let Some(frame) = tokio::time::timeout(PATIENCE, body.frame())
        .await
        .expect("the body ends in time")
    {
        match frame {
            Ok(f) => got.extend_from_slice(&f.into_data().unwrap_or_default()),
            Err(_) => return false,
        }
    }
    true
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
        Client::write(addr, &request(path)).await
    }

    /// Connects and writes `request` as given.
    pub async fn write(addr: SocketAddr, request: &[u8]) -> std::io::Result<Client> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        stream.write_all(request).await?;
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
        self.read_until(|body| body.len() >= n, within)
            .await
            .map_err(|e| e.unwrap_or_else(|| format!("fewer than {n} body bytes within {within:?}")))
    }

    /// Reads until the body contains `needle` (or it ends).
    pub async fn read_until_contains(&mut self, needle: &[u8], within: Duration) -> Result<(), String> {
        self.read_until(|body| find(body, needle).is_some(), within)
            .await
            .map_err(|e| {
                e.unwrap_or_else(|| format!("{:?} not seen within {within:?}", String::from_utf8_lossy(needle)))
            })
    }

    /// Reads until `done(body)` holds or the body ends; `Err(None)` on timeout.
    async fn read_until(&mut self, done: impl Fn(&[u8]) -> bool, within: Duration) -> Result<(), Option<String>> {
        let fut = async {
            while !done(&self.body) && !self.ended {
                self.decode().map_err(|e| e.to_string())?;
                if done(&self.body) || self.ended {
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
        match tokio::time::timeout(within, fut).await {
            Ok(r) => r.map_err(Some),
            Err(_) => Err(None),
        }
    }

    /// Closes abruptly: a reset (SO_LINGER 0) when `rst`, else a FIN.
    pub fn disconnect(self, rst: bool) {
        if rst {
            let _ = self.stream.set_zero_linger();
        }
        drop(self.stream);
    }
}

/// A client that leaves mid-stream: writes `request` to the gateway at `addr`, reads the response head (the gateway
/// must not close first; `head_ok` checks it), then hangs up; the upstream connection, an
/// [`open_until_closed`] emulator's, must close within `within` (`who` names the client in the failure).
pub async fn assert_leaving_closes_upstream(
    up: &mut Emulator,
    addr: SocketAddr,
    request: &[u8],
    head_ok: impl FnOnce(&Client),
    within: Duration,
    who: &str,
) {
    let mut c = Client::write(addr, request).await.expect("connect and write");
    let head = tokio::time::timeout(PATIENCE, c.read_head())
        .await
        .expect("a response head");
    head.expect("gateway closed early");
    head_ok(&c);
    drop(c);
    let closed = tokio::time::timeout(within, up.closed.recv()).await;
    assert!(
        closed.is_ok(),
        "upstream connection still open {within:?} after {who} left"
    );
}

/// GET `path` on `addr` (Connection: close); returns status and decoded body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    let fut = async {
        let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        let mut c = Client::write(addr, req.as_bytes()).await.expect("connect and write");
        c.read_head().await.expect("response head");
        c.read_to_end(PATIENCE).await.expect("response body");
        (c.status, c.body)
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .expect("admin answered in time")
}

/// The value of header `name` (any case) in a raw response head, if any.
pub fn header_value<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// Asserts that a (large) body is `want`, saying only the lengths where it is not: `what` names the comparison.
pub fn assert_same_bytes(got: &[u8], want: &[u8], what: &str) {
    assert!(got == want, "{what} differs ({} vs {} bytes)", got.len(), want.len());
}
