//! Plain HTTP/1.1 requests served on the client's socket without hyper's per-connection buffers.
//!
//! hyper's HTTP/1 server holds an 8 KiB read buffer and an 8 KiB header buffer for a connection's whole life,
//! so every open event stream over HTTP/1.1 paid for both while it waited for events (most of its memory). The
//! plain requests that start event streams (HTTP/1.1; no `Transfer-Encoding`, `Expect`, `Upgrade` or `TE`; no
//! body, or a `Content-Length` body that follows its head within `BODY_GRACE` and fits `server.max_header_bytes`
//! with it; not `HEAD` or `CONNECT`) are read, answered and written here instead: the head into a small buffer
//! dropped once parsed, the response head written once, the body as chunks straight from its frames. Any other
//! request goes to hyper with every byte read so far (`Outcome::HandOff`), and hyper serves the rest of that
//! connection, so what hyper checks and answers (400, 431, `Expect`, chunked uploads, a body that lags or breaks
//! off, HTTP/1.0, `HEAD`) is unchanged. The response head follows hyper's rules (`encode_head`), so a client sees
//! the same bytes from either path.
//!
//! ```text
//! read head ──plain──▶ service ──▶ write head ─▶ write frames ─▶ end ──keep-alive──▶ read head
//!     │ not plain                                     │ body failed, length broken, close asked
//!     ▼                                               ▼
//! HandOff(bytes read) ─▶ hyper                     Closed
//! ```

use std::future::{poll_fn, Future};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::proxy::accept::conn::{self, Tracked};

use crate::proxy::base::flushes::Flushes;
use crate::proxy::request::body::UpstreamBody;
use crate::proxy::request::headers;

/// The first read's buffer: a request head of a few hundred bytes fits; it doubles up to `max_head`.
const FIRST_READ: usize = 1024;

/// Header fields a request may have, as hyper's default.
const MAX_HEADERS: usize = 100;

/// How long a plain request's body may take to follow its head before the request goes to hyper.
const BODY_GRACE: Duration = Duration::from_millis(50);

/// Body frames gathered into one write.
const BATCH: usize = 8;

/// How a connection left this path.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Closed here (the client left or asked to, the drain, a broken response).
    Closed,
    /// A request this path does not serve: hyper serves the connection from these bytes on.
    HandOff(Bytes),
}

/// Bounds on reading request heads.
#[derive(Clone, Copy)]
pub struct Limits {
    /// `server.max_header_bytes`: a longer head goes to hyper, which answers 431.
    pub max_head: usize,
    /// `server.header_read_timeout_secs`, from a later request's first byte (the first request is bounded by
    /// the caller's guard).
    pub header_read: Duration,
}

/// The request service, as both paths call it.
pub trait Service {
    fn call(&self, req: Request<UpstreamBody>) -> Pin<Box<dyn Future<Output = Response<Tracked>> + Send>>;
}

/// Serves the connection's plain requests until it closes or a request is not plain.
pub async fn serve(
    stream: &TcpStream,
    flushes: &Flushes,
    limits: Limits,
    drain: &mut watch::Receiver<bool>,
    service: &impl Service,
) -> Outcome {
    let mut buf = BytesMut::new();
    let mut first = true;
    loop {
        // Between requests the drain closes the connection; a request begun is read, answered and then closed.
        if !first && buf.is_empty() {
            let more = tokio::select! {
                // However long the client waits (the idle timeout bounds that).
                more = fill(stream, &mut buf, limits.max_head) => more,
                _ = drain.wait_for(|d| *d) => false,
            };
            if !more {
                return Outcome::Closed;
            }
        }
        let head = if first {
            read_head(stream, &mut buf, limits.max_head).await
        } else {
            tokio::time::timeout(limits.header_read, read_head(stream, &mut buf, limits.max_head))
                .await
                .unwrap_or(Head::Closed)
        };
        first = false;
        let plain = match head {
            Head::Plain(p) => p,
            Head::Closed => return Outcome::Closed,
            Head::Other => return Outcome::HandOff(buf.freeze()),
        };
        buf.advance(plain.head_len);
        let body = buf.split_to(plain.body_len).freeze();
        if buf.is_empty() {
            // Nothing pipelined: the buffer's memory goes with the request body.
            buf = BytesMut::new();
        }
        let req = plain
            .request
            .map(|()| Full::new(body).map_err(|never| match never {}).boxed());
        let resp = service.call(req).await;
        let close = plain.close || *drain.borrow();
        if !respond(stream, flushes, resp, close).await || *drain.borrow() {
            return Outcome::Closed;
        }
    }
}

/// A request head read from the socket.
enum Head {
    Plain(Box<Plain>),
    /// Not for this path (or not parseable): hyper reads it again.
    Other,
    /// The client closed, the socket failed, or a later head stalled.
    Closed,
}

/// A plain request, parsed.
struct Plain {
    request: Request<()>,
    head_len: usize,
    body_len: usize,
    /// The client asked to close after this response.
    close: bool,
}

/// Reads until `buf` holds a whole head (and, for a plain request, its body).
async fn read_head(stream: &TcpStream, buf: &mut BytesMut, max_head: usize) -> Head {
    loop {
        if !buf.is_empty() {
            match parse(buf, max_head) {
                Some(Head::Plain(p)) => return read_body(stream, buf, p, max_head).await,
                Some(head) => return head,
                None => {}
            }
        }
        if buf.len() >= max_head {
            return Head::Other;
        }
        if !fill(stream, buf, max_head).await {
            return Head::Closed;
        }
    }
}

/// Reads the rest of a plain request's body after its head. Clients that write the head and the body apart are
/// waited for up to `BODY_GRACE`; a body that lags, or a client that leaves mid-body, goes to hyper with the bytes
/// read, and hyper's path answers as before (408 on a stall, 400 on a cut body).
async fn read_body(stream: &TcpStream, buf: &mut BytesMut, plain: Box<Plain>, max_head: usize) -> Head {
    let due = tokio::time::Instant::now() + BODY_GRACE;
    while buf.len() < plain.head_len + plain.body_len {
        // The body fits `max_head` with the head (`parse`), so `fill` has room for it.
        if !matches!(
            tokio::time::timeout_at(due, fill(stream, buf, max_head)).await,
            Ok(true)
        ) {
            return Head::Other;
        }
    }
    Head::Plain(plain)
}

/// Waits for the socket's next bytes and reads them into `buf`, which grows from `FIRST_READ` by doubling, up to
/// `max_head` in all; false when the client closed or the socket failed.
async fn fill(stream: &TcpStream, buf: &mut BytesMut, max_head: usize) -> bool {
    if buf.capacity() == buf.len() {
        buf.reserve(buf.capacity().max(FIRST_READ));
    }
    let room = (buf.capacity() - buf.len()).min(max_head.saturating_sub(buf.len()));
    loop {
        if stream.readable().await.is_err() {
            return false;
        }
        match conn::read_some(stream, &mut buf.limit(room)) {
            Ok(n) => return n > 0,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return false,
        }
    }
}

/// Parses the head at the start of `buf` (`None`: not all of it yet); not `Plain` whenever hyper would treat the
/// request any differently. A plain request's body may not all be in `buf` yet; it fits in `max_head` with the
/// head.
fn parse(buf: &[u8], max_head: usize) -> Option<Head> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return None,
        Ok(httparse::Status::Partial) | Err(_) => return Some(Head::Other),
    };
    let other = Some(Head::Other);
    if req.version != Some(1) || head_len > max_head {
        return other;
    }
    let Some(method) = req.method.and_then(|m| Method::from_bytes(m.as_bytes()).ok()) else {
        return other;
    };
    if method == Method::HEAD || method == Method::CONNECT {
        return other;
    }
    let Some(uri) = req.path.and_then(|p| Uri::try_from(p).ok()) else {
        return other;
    };
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    let (mut body_len, mut close) = (None, false);
    for f in req.headers.iter() {
        let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(f.name.as_bytes()),
            HeaderValue::from_bytes(f.value),
        ) else {
            return other;
        };
        match name {
            header::TRANSFER_ENCODING | header::EXPECT | header::UPGRADE | header::TE => return other,
            header::CONNECTION => match value.as_bytes().trim_ascii() {
                v if v.eq_ignore_ascii_case(b"close") => close = true,
                v if v.eq_ignore_ascii_case(b"keep-alive") => {}
                _ => return other,
            },
            header::CONTENT_LENGTH => match (
                body_len,
                headers::decimal(value.as_bytes()).and_then(|n| usize::try_from(n).ok()),
            ) {
                (None, Some(n)) => body_len = Some(n),
                _ => return other,
            },
            _ => {}
        }
        headers.append(name, value);
    }
    let body_len = body_len.unwrap_or(0);
    if head_len + body_len > max_head {
        return other;
    }
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Some(Head::Plain(Box::new(Plain {
        request,
        head_len,
        body_len,
        close,
    })))
}

/// How the response body is framed.
#[derive(Debug, PartialEq, Clone, Copy)]
enum Framing {
    /// No body is sent (204, 304, or an empty body).
    Empty,
    Length(u64),
    Chunked,
}

/// Writes the response; whether the connection may serve another request.
async fn respond<B: Body<Data = Bytes>>(stream: &TcpStream, flushes: &Flushes, resp: Response<B>, close: bool) -> bool {
    let (mut parts, body) = resp.into_parts();
    if close {
        add_close(&mut parts.headers);
    }
    let length = if body.is_end_stream() {
        Some(0)
    } else {
        body.size_hint().exact()
    };
    let (head, framing, close_after) = encode_head(parts.status, &parts.headers, length, SystemTime::now());
    let mut out = Out {
        head: Some(head),
        frames: Default::default(),
        n: 0,
        framing,
        last: false,
        written: 0,
    };
    if framing == Framing::Empty {
        drop(body);
        out.last = true;
        return out.write(stream).await.is_ok() && !close_after;
    }
    let mut body = std::pin::pin!(body);
    // What a `Content-Length` body may still send (no bound for a chunked one).
    let mut remaining = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    // The body said `Pending` before the last write, which did not wait: its waker is set and has not fired in
    // between (a wake-up during this poll makes the task run again), so polling it again at once is wasted.
    let mut parked = false;
    loop {
        let step = poll_fn(|cx| loop {
            if std::mem::take(&mut parked) {
                flushes.flushed();
                return Poll::Pending;
            }
            if out.n == BATCH {
                return Poll::Ready(Step::More);
            }
            match body.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are dropped, as hyper does for a client that did not ask for them (`TE` goes to
                    // hyper).
                    if let Ok(mut data) = frame.into_data() {
                        if data.is_empty() {
                            continue;
                        }
                        if data.len() as u64 > remaining {
                            data.truncate(remaining as usize);
                            out.push(data);
                            return Poll::Ready(Step::Broken);
                        }
                        remaining -= data.len() as u64;
                        out.push(data);
                    }
                }
                Poll::Ready(Some(Err(_))) => return Poll::Ready(Step::Broken),
                Poll::Ready(None) => return Poll::Ready(Step::End),
                Poll::Pending if out.n > 0 || out.head.is_some() => return Poll::Ready(Step::Waiting),
                Poll::Pending => {
                    // Everything yielded is written: what a failing body waits for before it aborts.
                    flushes.flushed();
                    return Poll::Pending;
                }
            }
        })
        .await;
        out.last = step == Step::End;
        let Ok(waited) = out.write(stream).await else {
            return false;
        };
        match step {
            Step::More => {}
            // Not after waiting for the socket: a wake-up from the body may have come (and gone) meanwhile.
            Step::Waiting => parked = !waited,
            Step::End => {
                flushes.flushed();
                return !close_after && (framing == Framing::Chunked || remaining == 0);
            }
            Step::Broken => return false,
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Step {
    /// Frames to write, more to come.
    More,
    /// Frames to write, and the body waits.
    Waiting,
    End,
    /// The body failed or overran its length: what was yielded is written, then the connection closes.
    Broken,
}

/// What one write sends: the head (first time), up to `BATCH` frames in the response's framing, and the end.
struct Out {
    head: Option<Vec<u8>>,
    frames: [Bytes; BATCH],
    n: usize,
    framing: Framing,
    /// The body ended: a chunked body's last chunk goes too.
    last: bool,
    /// Bytes of this write already sent.
    written: usize,
}

impl Out {
    fn push(&mut self, data: Bytes) {
        self.frames[self.n] = data;
        self.n += 1;
    }

    /// Writes it all; whether that took waiting for the socket (the task may then have been woken meanwhile).
    async fn write(&mut self, stream: &TcpStream) -> io::Result<bool> {
        let mut waited = false;
        loop {
            match self.try_write(stream) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    waited = true;
                    stream.writable().await?;
                }
                Err(e) => return Err(e),
            }
        }
        self.head = None;
        self.frames[..self.n].iter_mut().for_each(|f| *f = Bytes::new());
        self.n = 0;
        self.written = 0;
        Ok(waited)
    }

    /// One vectored write of what is left; whether all of it is now sent.
    fn try_write(&mut self, stream: &TcpStream) -> io::Result<bool> {
        let chunked = self.framing == Framing::Chunked;
        let mut sizes = [[0u8; 18]; BATCH];
        let mut lens = [0; BATCH];
        if chunked {
            for ((to, len), data) in sizes.iter_mut().zip(&mut lens).zip(&self.frames[..self.n]) {
                *len = chunk_size(to, data.len());
            }
        }
        let mut g = Gather {
            slices: [IoSlice::new(&[]); 2 + 3 * BATCH],
            m: 0,
            skip: self.written,
            total: 0,
        };
        g.add(self.head.as_deref().unwrap_or_default());
        for ((size, len), data) in sizes.iter().zip(lens).zip(&self.frames[..self.n]) {
            if chunked {
                g.add(&size[..len]);
                g.add(data);
                g.add(b"\r\n");
            } else {
                g.add(data);
            }
        }
        if chunked && self.last {
            g.add(b"0\r\n\r\n");
        }
        if g.m == 0 {
            return Ok(true);
        }
        let n = stream.try_write_vectored(&g.slices[..g.m])?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        self.written += n;
        Ok(self.written == g.total)
    }
}

/// The pieces of one write, less the `skip` bytes an earlier partial write sent.
struct Gather<'a> {
    slices: [IoSlice<'a>; 2 + 3 * BATCH],
    m: usize,
    skip: usize,
    total: usize,
}

impl<'a> Gather<'a> {
    fn add(&mut self, p: &'a [u8]) {
        self.total += p.len();
        if self.skip >= p.len() {
            self.skip -= p.len();
        } else {
            self.slices[self.m] = IoSlice::new(&p[self.skip..]);
            self.skip = 0;
            self.m += 1;
        }
    }
}

/// Writes a chunk's size line (upper-case hex, as hyper) into `to`; its length.
fn chunk_size(to: &mut [u8; 18], len: usize) -> usize {
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1) as usize;
    for i in 0..digits {
        to[digits - 1 - i] = b"0123456789ABCDEF"[(len >> (4 * i)) & 0xF];
    }
    to[digits] = b'\r';
    to[digits + 1] = b'\n';
    digits + 2
}

/// Says `Connection: close`, as hyper does once keep-alive is off.
fn add_close(headers: &mut HeaderMap) {
    match headers.entry(header::CONNECTION) {
        header::Entry::Occupied(mut e) => {
            if !e.iter().any(|v| has_token(v, "close")) {
                e.append(HeaderValue::from_static("close"));
            }
        }
        header::Entry::Vacant(e) => {
            e.insert(HeaderValue::from_static("close"));
        }
    }
}

/// Whether a comma-separated header value has `token` (case-insensitive).
fn has_token(v: &HeaderValue, token: &str) -> bool {
    v.as_bytes()
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// The response head as hyper's HTTP/1.1 server writes it (`proto::h1::role::Server::encode`, lower-case names):
/// the status line with its canonical reason; each field in the map's order, the values of `Connection`,
/// `Transfer-Encoding` and `Trailer` joined on one line; the body's framing from a `Content-Length` or
/// `Transfer-Encoding` field when there is one, else from the body (`length`: `Some` when known); no body for
/// 204 and 304; `date` last unless the response has one. Also whether the connection closes after it.
fn encode_head(
    status: StatusCode,
    headers: &HeaderMap,
    length: Option<u64>,
    now: SystemTime,
) -> (Vec<u8>, Framing, bool) {
    // hyper answers a 1xx response with a bare 500 and closes (it cannot send a 1xx as the final response).
    if status.is_informational() {
        return (
            encode_head(StatusCode::INTERNAL_SERVER_ERROR, &HeaderMap::new(), Some(0), now).0,
            Framing::Empty,
            true,
        );
    }
    let no_body = matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    let mut out = Vec::with_capacity(64 + headers.len() * 32);
    if status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let (mut framing, mut close, mut dated) = (None, false, false);
    for name in headers.keys() {
        let values = headers.get_all(name);
        let joined = |out: &mut Vec<u8>, suffix: &[u8]| {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                out.extend_from_slice(v.as_bytes());
            }
            out.extend_from_slice(suffix);
            out.extend_from_slice(b"\r\n");
        };
        match *name {
            header::CONTENT_LENGTH => {
                // The first value, trusted as hyper does (a body of unknown length takes it as its length).
                let Some(v) = values.iter().next() else { continue };
                let declared = headers::decimal(v.as_bytes());
                if framing.is_some() || no_body || length == Some(0) {
                    continue;
                }
                let Some(n) = length.or(declared) else { continue };
                out.extend_from_slice(b"content-length: ");
                out.extend_from_slice(v.as_bytes());
                out.extend_from_slice(b"\r\n");
                framing = Some(Framing::Length(n));
            }
            header::TRANSFER_ENCODING => {
                if framing.is_some() || no_body {
                    continue;
                }
                let last_chunked = values.iter().next_back().is_some_and(headers::ends_chunked);
                joined(&mut out, if last_chunked { b"" } else { b", chunked" });
                framing = Some(Framing::Chunked);
            }
            header::CONNECTION => {
                close |= values.iter().any(|v| has_token(v, "close"));
                joined(&mut out, b"");
            }
            header::TRAILER => {
                if !no_body {
                    joined(&mut out, b"");
                }
            }
            _ => {
                dated |= name == header::DATE;
                for v in values {
                    out.extend_from_slice(name.as_str().as_bytes());
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(v.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
            }
        }
    }
    let framing = match (framing, length) {
        _ if no_body => Framing::Empty,
        (Some(f), _) => f,
        (None, None) => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
            Framing::Chunked
        }
        (None, Some(0)) => {
            out.extend_from_slice(b"content-length: 0\r\n");
            Framing::Empty
        }
        (None, Some(n)) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(n.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            Framing::Length(n)
        }
    };
    if !dated {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(httpdate::fmt_http_date(now).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    (out, framing, close)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::task::Context;

    use http_body::{Frame, SizeHint};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::proxy::accept::conn::Activity;
    use crate::proxy::body::stack::ResponseBody;

    fn plain(req: &[u8]) -> Plain {
        match parse(req, 8192) {
            Some(Head::Plain(p)) => *p,
            Some(Head::Other) => panic!("not plain: {:?}", String::from_utf8_lossy(req)),
            Some(Head::Closed) | None => panic!("incomplete: {:?}", String::from_utf8_lossy(req)),
        }
    }

    fn is_other(req: &[u8], max: usize) -> bool {
        matches!(parse(req, max), Some(Head::Other))
    }

    #[test]
    fn plain_requests_are_parsed_with_their_body() {
        let p = plain(
            b"GET /v1/stream?x=1 HTTP/1.1\r\nHost: a\r\nAccept: text/event-stream\r\nX-Two: 1\r\nX-Two: 2\r\n\r\n",
        );
        assert_eq!(p.request.method(), Method::GET);
        assert_eq!(p.request.uri(), "/v1/stream?x=1");
        assert_eq!(p.request.version(), Version::HTTP_11);
        assert_eq!(p.request.headers()["accept"], "text/event-stream");
        assert_eq!(p.request.headers().get_all("x-two").iter().count(), 2);
        assert_eq!((p.body_len, p.close), (0, false));
        let head = b"POST /run HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\n";
        let mut req = head.to_vec();
        req.extend_from_slice(b"{...}GET / HTTP/1.1\r\n");
        let p = plain(&req);
        assert_eq!((p.head_len, p.body_len, p.close), (head.len(), 5, true));
        let p = plain(b"GET / HTTP/1.1\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(!p.close);
    }

    #[test]
    fn a_head_not_yet_whole_waits_for_more() {
        assert!(parse(b"GET / HTTP/1.1\r\nHost: a\r\n", 8192).is_none());
        assert!(parse(b"G", 8192).is_none());
        // Until the bound: then hyper reads it (and answers 431).
        assert!(is_other(b"GET / HTTP/1.1\r\nHost: a\r\n", 20));
    }

    /// Whatever hyper would read differently from a plain request goes to it, byte for byte.
    #[test]
    fn requests_hyper_treats_differently_are_not_plain() {
        for req in [
            &b"GET / HTTP/1.0\r\n\r\n"[..],
            b"HEAD / HTTP/1.1\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\n\r\n",
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
            b"GET / HTTP/1.1\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
            b"GET / HTTP/1.1\r\nTE: trailers\r\n\r\n",
            b"GET / HTTP/1.1\r\nConnection: close, x\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
            b"POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\nx",
            b"POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\nx",
            // Longer than the head's bound with its head.
            b"POST / HTTP/1.1\r\nContent-Length: 8192\r\n\r\nshort",
            b"GET /\x01 HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"garbage\r\n\r\n",
        ] {
            assert!(is_other(req, 8192), "{:?}", String::from_utf8_lossy(req));
        }
    }

    /// Header fields a generated request may carry: plain ones, and every one that makes a request not plain.
    const FIELDS: &[&str] = &[
        "Host: a",
        "Accept: text/event-stream",
        "X-Agent-Id: ag",
        "Connection: keep-alive",
        "connection: CLOSE",
        "Connection: upgrade",
        "Content-Length: 3",
        "content-length: 007",
        "Content-Length: -1",
        "Transfer-Encoding: chunked",
        "Expect: 100-continue",
        "Upgrade: websocket",
        "TE: trailers",
        "Bad Field: x",
        "X-Ctl: a\x01b",
    ];

    proptest::proptest! {
        /// Whatever the client sends: no panic; a plain request is HTTP/1.1 without the fields that make hyper read
        /// it differently, and its body fits the head's bound with it; and no prefix of a head is ever taken as a
        /// whole request. (`read_body` reads the body whole before a plain request is served.)
        #[test]
        fn no_input_is_taken_for_more_than_it_is(
            method in proptest::sample::select(vec!["GET", "POST", "HEAD", "CONNECT", "PUT", "G\u{e9}T"]),
            version in proptest::sample::select(vec!["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1 "]),
            fields in proptest::collection::vec(proptest::sample::select(FIELDS.to_vec()), 0..6),
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..12),
            cut in 0usize..200,
            max in 16usize..400,
        ) {
            let mut req = format!("{method} /p?q=1 {version}\r\n").into_bytes();
            for f in &fields {
                req.extend_from_slice(f.as_bytes());
                req.extend_from_slice(b"\r\n");
            }
            req.extend_from_slice(b"\r\n");
            let head_end = req.len();
            req.extend_from_slice(&body);
            if let Some(Head::Plain(p)) = parse(&req, max) {
                proptest::prop_assert!(p.head_len == head_end && p.head_len <= max);
                proptest::prop_assert!(p.head_len + p.body_len <= max);
                proptest::prop_assert!(p.body_len == 0 || fields.iter().any(|f| f.to_ascii_lowercase().starts_with("content-length")));
                proptest::prop_assert_eq!(p.request.version(), Version::HTTP_11);
                proptest::prop_assert!(p.request.method() != Method::HEAD && p.request.method() != Method::CONNECT);
                let h = p.request.headers();
                for name in [header::TRANSFER_ENCODING, header::EXPECT, header::UPGRADE, header::TE] {
                    proptest::prop_assert!(!h.contains_key(name));
                }
                proptest::prop_assert!(h.get_all(header::CONTENT_LENGTH).iter().count() <= 1);
                proptest::prop_assert_eq!(h.len(), fields.len());
                proptest::prop_assert_eq!(p.close, fields.iter().any(|f| f.eq_ignore_ascii_case("connection: close")));
            }
            let cut = cut.min(head_end - 1);
            proptest::prop_assert!(!matches!(parse(&req[..cut], max), Some(Head::Plain(_))), "a cut head was taken whole");
        }
    }

    #[test]
    fn chunk_sizes_are_upper_case_hex() {
        let mut to = [0u8; 18];
        for (len, want) in [
            (0, "0"),
            (1, "1"),
            (15, "F"),
            (16, "10"),
            (2048, "800"),
            (0xABCDE, "ABCDE"),
        ] {
            let n = chunk_size(&mut to, len);
            assert_eq!(&to[..n], format!("{want}\r\n").as_bytes());
        }
        let n = chunk_size(&mut to, usize::MAX);
        assert_eq!(&to[..n], format!("{:X}\r\n", usize::MAX).as_bytes());
    }

    /// A body of unknown length (or, with `exact`, a known one), one frame.
    struct TestBody(Option<Bytes>, bool);

    impl Body for TestBody {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
        }
        fn is_end_stream(&self) -> bool {
            self.0.is_none()
        }
        fn size_hint(&self) -> SizeHint {
            match (&self.0, self.1) {
                (Some(b), true) => SizeHint::with_exact(b.len() as u64),
                (None, _) => SizeHint::with_exact(0),
                _ => SizeHint::default(),
            }
        }
    }

    /// hyper's HTTP/1.1 server's response to `req`, as bytes.
    async fn hyper_response(
        req: &'static [u8],
        status: u16,
        fields: &'static [(&'static str, &'static str)],
        body: Option<&'static str>,
        exact: bool,
    ) -> Vec<u8> {
        let (client, server) = tokio::io::duplex(1 << 16);
        let service = hyper::service::service_fn(move |_req| async move {
            let mut resp = Response::new(TestBody(body.map(|b: &str| Bytes::from_static(b.as_bytes())), exact));
            *resp.status_mut() = StatusCode::from_u16(status).unwrap();
            for (k, v) in fields {
                resp.headers_mut().append(*k, HeaderValue::from_static(v));
            }
            Ok::<_, Infallible>(resp)
        });
        // As the gateway's builder: the client's FIN (sent here after its request) does not cancel the response.
        let conn = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(hyper_util::rt::TokioIo::new(server), service);
        let served = tokio::spawn(conn);
        let mut client = client;
        client.write_all(req).await.unwrap();
        client.shutdown().await.unwrap();
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        let _ = served.await;
        out
    }

    fn without_date(head: &[u8]) -> String {
        let s = String::from_utf8_lossy(head).into_owned();
        s.split("\r\n")
            .map(|l| if l.starts_with("date: ") { "date: *" } else { l })
            .collect::<Vec<_>>()
            .join("\r\n")
    }

    /// The head written here is the one hyper writes, for every kind of response the gateway makes.
    #[tokio::test]
    async fn response_heads_are_the_ones_hyper_writes() {
        const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        const CLOSE: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
        type Case = (
            &'static [u8],
            u16,
            &'static [(&'static str, &'static str)],
            Option<&'static str>,
            bool,
        );
        let cases: &[Case] = &[
            (
                GET,
                200,
                &[("content-type", "text/event-stream"), ("cache-control", "no-cache")],
                Some("data: x\n\n"),
                false,
            ),
            (GET, 200, &[("content-type", "application/json")], Some("{}"), true),
            (
                GET,
                502,
                &[("content-type", "application/json"), ("x-request-id", "abc")],
                Some("{\"error\":1}"),
                true,
            ),
            (
                GET,
                200,
                &[("x-a", "1"), ("x-b", "2"), ("x-a", "3")],
                Some("body"),
                false,
            ),
            (GET, 200, &[("content-length", "4")], Some("body"), true),
            (GET, 200, &[("content-length", "4")], Some("body"), false),
            (GET, 200, &[("transfer-encoding", "gzip")], Some("body"), false),
            (GET, 200, &[("transfer-encoding", "chunked")], Some("body"), false),
            (GET, 200, &[("connection", "close")], Some("body"), false),
            (GET, 200, &[], None, true),
            (GET, 204, &[("x-a", "1")], None, true),
            (GET, 304, &[("etag", "\"x\""), ("content-length", "9")], None, false),
            (GET, 200, &[("date", "Tue, 24 Nov 2026 00:00:00 GMT")], Some("b"), true),
            (GET, 299, &[], Some("b"), true),
            (GET, 200, &[("trailer", "x-t")], Some("b"), false),
            (
                CLOSE,
                200,
                &[("content-type", "text/event-stream")],
                Some("data: x\n\n"),
                false,
            ),
            (CLOSE, 200, &[("connection", "keep-alive")], Some("b"), true),
        ];
        for &(req, status, fields, body, exact) in cases {
            let theirs = hyper_response(req, status, fields, body, exact).await;
            let end = theirs.windows(4).position(|w| w == b"\r\n\r\n").map(|e| e + 4);
            let end = end.unwrap_or_else(|| panic!("{status} {fields:?}: {}", String::from_utf8_lossy(&theirs)));
            let mut headers = HeaderMap::new();
            for (k, v) in fields {
                headers.append(*k, HeaderValue::from_static(v));
            }
            let close = req == CLOSE;
            if close {
                // What `respond` adds once the client asked to close.
                let mut resp = Response::new(());
                *resp.headers_mut() = headers;
                add_close(resp.headers_mut());
                headers = std::mem::take(resp.headers_mut());
            }
            let length = match body {
                None => Some(0),
                Some(b) => exact.then_some(b.len() as u64),
            };
            let (ours, framing, _) = encode_head(
                StatusCode::from_u16(status).unwrap(),
                &headers,
                length,
                SystemTime::now(),
            );
            let case = format!("{status} {fields:?} {body:?} exact={exact} close={close}");
            assert_eq!(without_date(&ours), without_date(&theirs[..end]), "{case}");
            // The framing is the one hyper chose.
            let rest = &theirs[end..];
            match framing {
                Framing::Empty => assert!(rest.is_empty(), "{case}: {rest:?}"),
                Framing::Length(n) => assert_eq!(rest.len() as u64, n, "{case}"),
                Framing::Chunked => assert!(rest.ends_with(b"0\r\n\r\n"), "{case}: {rest:?}"),
            }
        }
    }

    /// A test service: answers every request with `body` (its path echoed in `x-path`).
    struct Echo {
        activity: Arc<Activity>,
        cut: watch::Receiver<bool>,
    }

    impl Service for Echo {
        fn call(&self, req: Request<UpstreamBody>) -> Pin<Box<dyn Future<Output = Response<Tracked>> + Send>> {
            let in_flight = self.activity.begin();
            let cut = self.cut.clone();
            Box::pin(async move {
                let path = req.uri().path().to_owned();
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let mut resp = Response::new(Tracked::new(ResponseBody::full(body), in_flight, &cut));
                resp.headers_mut().insert("date", HeaderValue::from_static("d"));
                resp.headers_mut()
                    .insert("x-path", HeaderValue::from_str(&path).unwrap());
                resp
            })
        }
    }

    /// A connected pair: the accepted side, and its client.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        (listener.accept().await.unwrap().0, client)
    }

    /// `serve` with the `Echo` service (the drain on from the start when `drain_now`).
    async fn serve_echo(server: &TcpStream, drain_now: bool, header_read: Duration) -> Outcome {
        let (_cut_tx, cut) = watch::channel(false);
        let (_drain_tx, mut drain) = watch::channel(drain_now);
        let echo = Echo {
            activity: Activity::new(),
            cut,
        };
        let limits = Limits {
            max_head: 8192,
            header_read,
        };
        serve(server, &Flushes::default(), limits, &mut drain, &echo).await
    }

    async fn served(sent: &[u8], close_client: bool, drain_now: bool) -> (Outcome, Vec<u8>) {
        let (server, mut client) = pair().await;
        client.write_all(sent).await.unwrap();
        if close_client {
            client.shutdown().await.unwrap();
        }
        let outcome = serve_echo(&server, drain_now, Duration::from_secs(5)).await;
        drop(server);
        let mut out = Vec::new();
        client.read_to_end(&mut out).await.unwrap();
        (outcome, out)
    }

    /// [`served`] where the connection must end closed (not handed to hyper): what the client read, as text.
    async fn served_closed(sent: &[u8], close_client: bool, drain_now: bool) -> String {
        let (outcome, out) = served(sent, close_client, drain_now).await;
        assert_eq!(outcome, Outcome::Closed);
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order_until_the_client_closes() {
        let out = served_closed(
            b"POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\n\r\n",
            true,
            false,
        )
        .await;
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\ndate: d\r\nx-path: /a\r\ncontent-length: 3\r\n\r\nabc\
             HTTP/1.1 200 OK\r\ndate: d\r\nx-path: /b\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn a_request_that_is_not_plain_goes_to_hyper_with_every_byte_read() {
        let sent =
            b"GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        let (outcome, out) = served(sent, true, false).await;
        let rest = b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(outcome, Outcome::HandOff(Bytes::from_static(rest)));
        assert!(String::from_utf8(out).unwrap().contains("x-path: /a"));
    }

    /// A body written apart from its head is waited for briefly; one that lags goes to hyper with the head.
    #[tokio::test]
    async fn a_body_that_follows_its_head_is_read_and_one_that_lags_is_handed_over() {
        for (gap, plain) in [(Duration::from_millis(5), true), (BODY_GRACE * 4, false)] {
            let (server, mut client) = pair().await;
            let head = b"POST /late HTTP/1.1\r\nContent-Length: 4\r\n\r\n";
            let writer = tokio::spawn(async move {
                client.write_all(head).await.unwrap();
                tokio::time::sleep(gap).await;
                client.write_all(b"body").await.unwrap();
                client.shutdown().await.unwrap();
                let mut out = Vec::new();
                let _ = client.read_to_end(&mut out).await;
                out
            });
            let outcome = serve_echo(&server, false, Duration::from_secs(5)).await;
            drop(server);
            let out = String::from_utf8(writer.await.unwrap()).unwrap();
            if plain {
                assert_eq!(outcome, Outcome::Closed);
                assert!(out.ends_with("content-length: 4\r\n\r\nbody"), "{out}");
            } else {
                assert_eq!(outcome, Outcome::HandOff(Bytes::from_static(head)));
                assert!(out.is_empty(), "{out}");
            }
        }
    }

    #[tokio::test]
    async fn asked_to_close_or_draining_the_connection_closes_after_the_response() {
        let out = served_closed(
            b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\n\r\n",
            false,
            false,
        )
        .await;
        assert!(out.contains("connection: close\r\n") && !out.contains("/b"), "{out}");
        // Draining: the request begun is answered, saying it closes, and the next is not read.
        let out = served_closed(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n", false, true).await;
        assert!(
            out.contains("x-path: /a") && out.contains("connection: close\r\n") && !out.contains("/b"),
            "{out}"
        );
    }

    /// `server.header_read_timeout_secs` bounds a later request's head from its first byte, not the wait for it.
    #[tokio::test]
    async fn a_later_head_is_timed_from_its_first_byte() {
        let (server, mut client) = pair().await;
        let serving = tokio::spawn(async move { serve_echo(&server, false, Duration::from_millis(300)).await });
        let mut buf = [0u8; 4096];
        for path in ["/a", "/b"] {
            client
                .write_all(format!("GET {path} HTTP/1.1\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let n = client.read(&mut buf).await.unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).contains(path), "{path} not answered");
            // Idle for twice the header timeout: the connection stays.
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        client.write_all(b"GET /c HTTP/1.1\r\n").await.unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(20), serving).await;
        assert_eq!(
            outcome.expect("a stalled head was not timed out").unwrap(),
            Outcome::Closed
        );
        assert_eq!(client.read(&mut buf).await.unwrap_or(0), 0, "answered a stalled head");
    }

    /// A body of what its channel gets.
    struct Channel(tokio::sync::mpsc::Receiver<Bytes>);

    impl Body for Channel {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            self.0.poll_recv(cx).map(|f| f.map(|b| Ok(Frame::data(b))))
        }
    }

    /// The body wakes the task while a write waits for a slow client: its next frame and its end still go out.
    #[tokio::test]
    async fn a_frame_that_comes_while_a_write_waits_is_written() {
        let (server, mut client) = pair().await;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // More than the sockets hold: the write waits until the client reads.
        tx.send(Bytes::from(vec![b'x'; 8 << 20])).await.unwrap();
        let responding =
            tokio::spawn(async move { respond(&server, &Flushes::default(), Response::new(Channel(rx)), false).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        tx.send(Bytes::from_static(b"last")).await.unwrap();
        drop(tx);
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let read = async {
            while !out.ends_with(b"0\r\n\r\n") {
                let n = client.read(&mut buf).await.unwrap();
                assert!(n > 0, "closed before the end");
                out.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("the frame that came during the write was never written");
        assert!(out.ends_with(b"\r\n4\r\nlast\r\n0\r\n\r\n"));
        assert!(responding.await.unwrap(), "not kept alive after a clean end");
    }

    /// Frames go out in the response's framing whatever the socket takes per write.
    #[tokio::test]
    async fn frames_are_written_chunked_in_order() {
        let (server, mut client) = pair().await;
        let big = Bytes::from(vec![b'x'; 3 << 20]);
        let reader = tokio::spawn(async move {
            let mut out = Vec::new();
            client.read_to_end(&mut out).await.unwrap();
            out
        });
        let mut out = Out {
            head: Some(b"HEAD\r\n\r\n".to_vec()),
            frames: Default::default(),
            n: 0,
            framing: Framing::Chunked,
            last: false,
            written: 0,
        };
        out.push(Bytes::from_static(b"hello"));
        out.push(big.clone());
        out.write(&server).await.unwrap();
        out.push(Bytes::from_static(b"!"));
        out.last = true;
        out.write(&server).await.unwrap();
        drop(server);
        let got = reader.await.unwrap();
        let mut want = b"HEAD\r\n\r\n5\r\nhello\r\n300000\r\n".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"\r\n1\r\n!\r\n0\r\n\r\n");
        assert!(got == want, "{} bytes against {}", got.len(), want.len());
    }
}
