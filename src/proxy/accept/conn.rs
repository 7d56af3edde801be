//! One client connection's socket and state: shared with watchers that hyper does not provide (a client that
//! leaves while hyper is not reading, idleness between requests), and the flushes a failing body waits for.

use crate::proxy::base::flushes::Flushes;
use crate::proxy::base::held;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::proxy::upstream::error::BodyError;

use crate::proxy::base::drain::{self, Deadline, DrainCut, DrainTimeout};
use crate::proxy::base::quiet::Quiet;
use crate::proxy::body::stack::ResponseBody;

/// How often a watcher looks again at a socket that has unread bytes: readiness cannot tell a close behind
/// them apart from more bytes, and hyper will not read them while a response is in flight.
const RECHECK: Duration = Duration::from_millis(200);

/// The accepted socket as hyper's I/O, readable by a watcher too (tokio's readiness calls take `&self`).
pub struct ClientIo {
    stream: Arc<TcpStream>,
    flushes: Arc<Flushes>,
    /// Bytes already read from the socket (by `http1` before it handed the connection over), read first.
    prefix: Bytes,
}

impl ClientIo {
    pub fn new(stream: Arc<TcpStream>, flushes: Arc<Flushes>, prefix: Bytes) -> Self {
        Self {
            stream,
            flushes,
            prefix,
        }
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix.split_to(n));
            if self.prefix.is_empty() {
                // An emptied `Bytes` still holds the buffer it was cut from (the head `http1` read) for the
                // connection's whole life: an upgraded socket or an h2c connection would keep it.
                self.prefix = Bytes::new();
            }
            return Poll::Ready(Ok(()));
        }
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            match read_some(&self.stream, buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r.map(drop)),
            }
        }
    }
}

/// Reads what the socket has into `buf`'s unfilled part as it is: zeroing it first would make every page of
/// hyper's read buffer resident (8–16 KiB per HTTP/1.1 connection, where a request head fills one). A short read
/// emptied the socket, so its readiness is cleared as tokio's own `poll_read` does (a close stays set);
/// `try_read_buf` clears it only on `WouldBlock`, and readiness left set while nobody reads (a response in
/// flight) would make `client_left` look again every `RECHECK` for the whole stream.
pub fn read_some(stream: &TcpStream, buf: &mut impl bytes::BufMut) -> io::Result<usize> {
    let room = buf.remaining_mut();
    let n = stream.try_read_buf(buf)?;
    if n > 0 && n < room {
        let _ = stream.try_io(Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
    }
    Ok(n)
}

impl AsyncWrite for ClientIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        held::poll_write_with(&self.stream, cx, |tcp| tcp.try_write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        held::poll_write_with(&self.stream, cx, |tcp| tcp.try_write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// hyper's HTTP/1 connection calls this once everything it buffered is written (and HTTP/2 after its
    /// frames): the moment a failing response body waits for.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.flushes.flushed();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(held::shutdown_write(&self.stream))
    }
}

/// Requests in flight on one connection, and since when it has had none.
pub struct Activity {
    start: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `start` at which the last request ended.
    idle_since_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
        })
    }

    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Marks a request in flight until the returned guard (kept with its response body) is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }

    /// Resolves once the connection has had no request in flight for `limit`. Checked at most once per
    /// `limit`, so a busy connection costs one timer wake-up per interval.
    pub async fn idle_for(&self, limit: Duration) {
        let mut check_at = self.start + limit;
        loop {
            tokio::time::sleep_until(check_at).await;
            if self.busy() {
                check_at = Instant::now() + limit;
                continue;
            }
            let since = self.start + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
            let due = since + limit;
            if Instant::now() >= due && !self.busy() {
                return;
            }
            check_at = due.max(Instant::now() + Duration::from_millis(1));
        }
    }
}

/// A request in flight; dropped with its response body (or with the request when it is cancelled).
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        let ms = u64::try_from(a.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Before the count: a watcher that sees no request in flight sees when the last one ended.
        a.idle_since_ms.store(ms, Ordering::Release);
        a.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds its request's `InFlight` until it ends, and ends it at the drain deadline.
pub struct Tracked {
    body: ResponseBody,
    _in_flight: InFlight,
    /// Only for upstream bodies (the gateway's own small bodies end by themselves); taken once reached.
    deadline: Option<Quiet<Deadline>>,
}

impl Tracked {
    /// `cut` turns true at the drain deadline.
    pub fn new(body: ResponseBody, in_flight: InFlight, cut: &watch::Receiver<bool>) -> Self {
        let deadline = body.is_upstream().then(|| Quiet::new(drain::deadline(cut.clone())));
        Self {
            body,
            _in_flight: in_flight,
            deadline,
        }
    }
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        // Polled before the body, so a stream the upstream keeps busy is cut as surely as an idle one.
        if let Some(deadline) = this.deadline.as_mut() {
            if Pin::new(deadline).poll(cx).is_ready() {
                this.deadline = None;
                match this.body.cut_for_drain() {
                    DrainCut::Final(last) => return Poll::Ready(Some(Ok(Frame::data(last)))),
                    DrainCut::Abort => return Poll::Ready(Some(Err(Box::new(DrainTimeout)))),
                    DrainCut::Nothing => {}
                }
            }
        }
        Pin::new(&mut this.body).poll_frame(cx)
    }

    body_hints_from!(body);
}

/// Resolves when the client has closed (or reset) its side while a request is in flight. hyper notices that
/// itself only while it reads; its HTTP/1 server stops reading while a response is in flight and a pipelined
/// request waits in its buffer, and would then hold the upstream until it next writes.
pub async fn client_left(stream: &TcpStream, activity: &Activity) {
    loop {
        let Ok(ready) = stream.ready(Interest::READABLE).await else {
            return;
        };
        if (ready.is_read_closed() || ready.is_error()) && activity.busy() {
            return;
        }
        // Readable: bytes for hyper to read (readiness stays set until it does), or a close hyper will see
        // when it reads, or one to look at again once a request is in flight.
        tokio::time::sleep(RECHECK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_for_waits_while_a_request_is_in_flight() {
        let a = Activity::new();
        let guard = a.begin();
        let idle = tokio::time::timeout(Duration::from_secs(30), a.idle_for(Duration::from_secs(1))).await;
        assert!(idle.is_err(), "idle while a request was in flight");
        drop(guard);
        let idle = tokio::time::timeout(Duration::from_secs(3), a.idle_for(Duration::from_secs(1))).await;
        assert!(idle.is_ok(), "not idle after the request ended");
    }

    /// A connected pair: the accepted side as `ClientIo`, and its client.
    async fn pair() -> (ClientIo, Arc<TcpStream>, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let server = Arc::new(listener.accept().await.unwrap().0);
        (
            ClientIo::new(Arc::clone(&server), Arc::default(), Bytes::new()),
            server,
            client,
        )
    }

    /// Whether the socket reports readable within a moment (readiness set, or bytes or a close arriving).
    async fn readable_soon(stream: &TcpStream) -> bool {
        tokio::time::timeout(Duration::from_millis(100), stream.ready(Interest::READABLE))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_short_read_leaves_the_socket_unreadable_until_more_comes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut io, server, mut client) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 1024];
        let n = io.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n\r\n");
        // What `client_left` waits on: no longer ready once the bytes were read.
        assert!(
            !readable_soon(&server).await,
            "readiness stayed set after a short read emptied the socket"
        );
        client.write_all(b"x").await.unwrap();
        assert!(
            readable_soon(&server).await,
            "new bytes did not make the socket readable"
        );
        let (mut io2, server2, mut client2) = pair().await;
        client2.write_all(b"bye").await.unwrap();
        client2.shutdown().await.unwrap();
        let n = io2.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], b"bye");
        // A close that came with the bytes is still seen.
        let ready = tokio::time::timeout(Duration::from_secs(5), server2.ready(Interest::READABLE))
            .await
            .expect("the close was lost")
            .unwrap();
        assert!(ready.is_read_closed());
    }
}
