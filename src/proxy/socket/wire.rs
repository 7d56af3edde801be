//! The connection under a socket, with one outgoing byte queue for the socket's data frames and tungstenite's own
//! (pongs, pings, the close frame), so no frame is ever written into the middle of another. A data frame goes
//! straight to the connection, its header and payload in one vectored write (no lock), while nothing waits; what
//! the connection does not take waits here, and so does whatever tungstenite writes after it. A paced event's
//! message comes in parts, joined with its header in a buffer on the stack (one slice for the kernel to walk).
//! tungstenite keeps reading the connection and writing its control frames; it does not frame the data.
//!
//! The connection (`Conn`) is read through hyper's upgraded I/O and written straight to the client's TCP stream.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf, BytesMut};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;

use crate::proxy::base::held;
use crate::proxy::socket::messages::PARTS;

/// A server's frame header: two bytes, and eight more for the longest length (never masked).
const MAX_HEADER: usize = 10;

/// Room for a frame's header and the parts of its message joined to it (`Wire::send_text_parts`): the socket's
/// JSON before a held envelope (~200 bytes with the gateway's own ids), and a short envelope with it.
const JOINED: usize = 512;

/// The most messages one write carries (a burst read at once from the streams goes out in few writes).
pub const MAX_FRAMES: usize = 8;

/// A connection being upgraded: hyper's upgrade, and the client's TCP stream under it.
pub struct Upgrading {
    pub on: OnUpgrade,
    pub tcp: Arc<TcpStream>,
}

/// The upgraded connection: read through hyper's upgraded I/O (which holds what hyper read past the handshake),
/// written straight to the TCP stream (hyper wrote its answer to the handshake whole before the upgrade and
/// writes nothing after it): a write is one `writev`, not a call through the upgraded I/O's box and the layers
/// under it.
pub struct Conn<R = TokioIo<Upgraded>> {
    read: R,
    tcp: Arc<TcpStream>,
}

impl<R> Conn<R> {
    pub fn new(read: R, tcp: Arc<TcpStream>) -> Self {
        Self { read, tcp }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Conn<R> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
    }
}

impl<R: Unpin> AsyncWrite for Conn<R> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        held::poll_write_with(&self.tcp, cx, |tcp| tcp.try_write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        held::poll_write_with(&self.tcp, cx, |tcp| tcp.try_write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// A TCP stream keeps nothing to flush.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(held::shutdown_write(&self.tcp))
    }
}

/// The upgraded connection and what it has not taken yet.
pub struct Wire<I = Conn> {
    io: I,
    /// Bytes written to the socket and not yet to the connection, in order: empty (and holding no buffer) while
    /// the socket keeps up.
    out: BytesMut,
}

impl<I: AsyncWrite + Unpin> Wire<I> {
    pub fn new(io: I) -> Self {
        Self {
            io,
            out: BytesMut::new(),
        }
    }

    /// Whether bytes wait for the connection.
    pub fn pending(&self) -> bool {
        !self.out.is_empty()
    }

    /// Writes text messages, each its own frame: straight to the connection, `MAX_FRAMES` to a vectored write,
    /// when nothing waits before them, what it does not take (or all of it) queued. True when the connection took all of it.
    ///
    /// The messages are UTF-8 (a text frame carries nothing else, RFC 6455 §5.6) without a check here: they are
    /// the socket's own JSON around held events, and the held events are the translator's text (a store's are
    /// checked as they are read, `ReadError::NotText`).
    pub fn send_texts(&mut self, texts: &[&[u8]]) -> io::Result<bool> {
        for chunk in texts.chunks(MAX_FRAMES) {
            self.send_chunk(chunk)?;
        }
        Ok(!self.pending())
    }

    /// Writes at most `MAX_FRAMES` messages in one vectored write if nothing waits; queues the rest.
    fn send_chunk(&mut self, texts: &[&[u8]]) -> io::Result<()> {
        let mut heads = [[0u8; MAX_HEADER]; MAX_FRAMES];
        let mut parts = [IoSlice::new(&[]); 2 * MAX_FRAMES];
        let mut total = 0;
        for ((head, text), pair) in heads.iter_mut().zip(texts).zip(parts.chunks_exact_mut(2)) {
            debug_assert!(std::str::from_utf8(text).is_ok(), "a text message that is not UTF-8");
            let n = header(text.len(), head);
            pair[0] = IoSlice::new(&head[..n]);
            pair[1] = IoSlice::new(text);
            total += n + text.len();
        }
        self.write_or_queue(&parts[..2 * texts.len()], total)
    }

    /// Writes one text message given in parts (the socket's JSON around a held envelope, not joined in a queue
    /// first) as one frame, as `send_texts` writes a message. True when the connection took all of it.
    ///
    /// The parts that fit go into one buffer with the frame's header, the rest as they are: each slice of a
    /// vectored write is walked on its own by the kernel, which costs more than copying a short one.
    pub fn send_text_parts(&mut self, text: &[&[u8]; PARTS]) -> io::Result<bool> {
        let len = text.iter().map(|p| p.len()).sum();
        let mut joined = [0u8; JOINED];
        let n = header(len, &mut joined);
        let mut at = n;
        let mut rest = &text[..];
        while let Some((part, after)) = rest.split_first() {
            let Some(room) = joined.get_mut(at..at + part.len()) else {
                break;
            };
            room.copy_from_slice(part);
            at += part.len();
            rest = after;
        }
        let mut parts = [IoSlice::new(&joined[..at]); PARTS + 1];
        for (slot, part) in parts[1..].iter_mut().zip(rest) {
            *slot = IoSlice::new(part);
        }
        debug_assert!(
            std::str::from_utf8(&text.concat()).is_ok(),
            "a text message that is not UTF-8"
        );
        self.write_or_queue(&parts[..1 + rest.len()], n + len)?;
        Ok(!self.pending())
    }

    /// Writes `parts` (`total` bytes) in one vectored write if nothing waits; queues what the connection does not
    /// take, or all of it.
    fn write_or_queue(&mut self, parts: &[IoSlice<'_>], total: usize) -> io::Result<()> {
        let mut written = 0;
        if !self.pending() {
            // Not woken by this write: a socket left pending is polled with its task's waker (`poll_drain`).
            let mut cx = Context::from_waker(Waker::noop());
            match Pin::new(&mut self.io).poll_write_vectored(&mut cx, parts) {
                Poll::Ready(Ok(n)) => written = n,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => {}
            }
        }
        if written == total {
            return Ok(());
        }
        // The rest, in order, past what the connection took.
        self.out.reserve(total - written);
        let mut skip = written;
        for part in parts {
            if skip >= part.len() {
                skip -= part.len();
                continue;
            }
            self.out.extend_from_slice(&part[skip..]);
            skip = 0;
        }
        Ok(())
    }

    /// Writes what waits; ready once the connection took all of it.
    pub fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.out.is_empty() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.out))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.out.advance(n);
        }
        if self.out.capacity() > 0 {
            // An idle socket holds no buffer (a burst's would be kept by every socket that once fell behind).
            self.out = BytesMut::new();
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }
}

/// Writes a final text frame's header for a payload of `len` bytes at the start of `buf` (at least `MAX_HEADER`
/// bytes); its length.
fn header(len: usize, buf: &mut [u8]) -> usize {
    let head = FrameHeader {
        opcode: OpCode::Data(Data::Text),
        ..FrameHeader::default()
    };
    let room = buf.len();
    let mut rest = &mut buf[..];
    // Ten bytes hold any unmasked header: writing into them cannot fail.
    let _ = head.format(len as u64, &mut rest);
    room - rest.len()
}

impl<I: AsyncRead + Unpin> AsyncRead for Wire<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

/// What tungstenite writes (its control frames, whole) queues behind the data: the socket bounds it (pongs count
/// against `websocket.max_queued_bytes`), and tungstenite's flush writes the queue.
impl<I: AsyncWrite + Unpin> AsyncWrite for Wire<I> {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.out.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_drain(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;

    /// The header is tungstenite's own for a text frame of that length, at each of the three length formats.
    #[test]
    fn a_header_is_a_final_unmasked_text_frames() {
        for len in [0, 1, 125, 126, 65_535, 65_536, 1 << 20] {
            let mut buf = [0u8; MAX_HEADER];
            let n = header(len, &mut buf);
            let ours = buf[..n].to_vec();
            let mut theirs = Vec::new();
            let frame = Frame::message(vec![b'a'; len], OpCode::Data(Data::Text), true);
            frame.format(&mut theirs).expect("a frame formats");
            assert_eq!(ours, theirs[..theirs.len() - len], "length {len}");
        }
    }

    fn text_frame(text: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let frame = Frame::message(text.to_vec(), OpCode::Data(Data::Text), true);
        frame.format(&mut out).expect("a frame formats");
        out
    }

    /// A connection that takes a few bytes at a time: frames it does not take whole wait, later frames and
    /// tungstenite's own writes queue behind them, and the connection gets every frame whole, in order.
    #[tokio::test]
    async fn frames_the_connection_does_not_take_go_out_whole_and_in_order() {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(8);
        let mut wire = Wire::new(near);
        let (first, second, third) = (vec![b'x'; 300], b"{\"b\":2}".to_vec(), b"{\"c\":3}".to_vec());
        let pong = [0x8a_u8, 0];
        let sent = wire.send_texts(&[&first, &second]).expect("the duplex is open");
        assert!(!sent, "8 bytes of room cannot take 313");
        assert!(wire.pending());
        // The connection has room again, but the third frame is queued behind the first two, not written into
        // their middle.
        let mut head = [0u8; 8];
        far.read_exact(&mut head).await.expect("the first bytes arrive");
        assert!(!wire.send_texts(&[&third]).expect("the duplex is open"));
        let mut cx = Context::from_waker(Waker::noop());
        let queued = Pin::new(&mut wire).poll_write(&mut cx, &pong);
        assert!(matches!(queued, Poll::Ready(Ok(2))));
        let want = [
            text_frame(&first),
            text_frame(&second),
            text_frame(&third),
            pong.to_vec(),
        ]
        .concat();
        let reading = tokio::spawn(async move {
            let mut got = vec![0u8; want.len()];
            got[..8].copy_from_slice(&head);
            far.read_exact(&mut got[8..]).await.expect("every byte arrives");
            (got, want)
        });
        let drained = std::future::poll_fn(|cx| wire.poll_drain(cx)).await;
        drained.expect("the duplex takes the rest");
        assert!(!wire.pending());
        assert_eq!(wire.out.capacity(), 0, "a drained wire holds no buffer");
        let (got, want) = reading.await.expect("the reader ends");
        assert_eq!(got, want);
    }

    /// A TCP pair: the server's end shared as the gateway holds it, and the client's.
    async fn tcp_pair() -> (Arc<TcpStream>, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let client = TcpStream::connect(listener.local_addr().expect("an address"));
        let (client, accepted) = tokio::join!(client, listener.accept());
        (Arc::new(accepted.expect("accepted").0), client.expect("connected"))
    }

    /// The connection reads through its reader (hyper's upgraded I/O in the gateway) and writes to the TCP stream.
    #[tokio::test]
    async fn a_conn_reads_through_its_reader_and_writes_to_the_tcp_stream() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (tcp, mut client) = tcp_pair().await;
        let (read, mut feed) = tokio::io::duplex(64);
        let mut conn = Conn::new(read, tcp);
        feed.write_all(b"read ahead").await.expect("the duplex is open");
        let mut got = [0u8; 10];
        conn.read_exact(&mut got).await.expect("read through the reader");
        assert_eq!(&got, b"read ahead");
        let parts = [IoSlice::new(b"one "), IoSlice::new(b"write")];
        let n = conn.write_vectored(&parts).await.expect("the stream is open");
        conn.write_all(&b"one write"[n..]).await.expect("the stream is open");
        conn.write_all(b", then another").await.expect("the stream is open");
        conn.shutdown().await.expect("the stream shuts down");
        let mut out = String::new();
        client
            .read_to_string(&mut out)
            .await
            .expect("the client reads to the end");
        assert_eq!(out, "one write, then another");
    }

    /// A TCP stream that cannot take a frame whole: the rest waits in the wire, the drain is woken when the
    /// stream has room again (tokio's readiness, registered by the would-block write), and the frame arrives whole.
    #[tokio::test]
    async fn a_frame_the_tcp_stream_cannot_take_whole_is_drained_when_it_has_room() {
        use tokio::io::AsyncReadExt;
        let (tcp, mut client) = tcp_pair().await;
        let (read, _feed) = tokio::io::duplex(64);
        let mut wire = Wire::new(Conn::new(read, tcp));
        // Far more than the kernel's buffers take while the client reads nothing.
        let big = vec![b'x'; 32 << 20];
        let sent = wire.send_texts(&[&big, b"{\"after\":1}"]).expect("the stream is open");
        assert!(!sent, "32 MiB went out at once: the test's premise is gone");
        assert!(wire.pending());
        let want = [text_frame(&big), text_frame(b"{\"after\":1}")].concat();
        let reading = tokio::spawn(async move {
            let mut got = vec![0u8; want.len()];
            client.read_exact(&mut got).await.expect("every byte arrives");
            got == want
        });
        let drained = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            std::future::poll_fn(|cx| wire.poll_drain(cx)),
        )
        .await
        .expect("the drain was woken as the client read");
        drained.expect("the stream takes the rest");
        assert!(!wire.pending());
        assert!(
            reading.await.expect("the reader ends"),
            "the frames arrived whole and in order"
        );
    }

    /// A message in parts is one frame of their bytes, joined to the header whole, whole to the last byte of the
    /// room, all but its last part, or in part when it is long: written at once while the connection has room,
    /// queued in order behind what waits when it does not.
    #[tokio::test]
    async fn a_message_in_parts_is_one_frame_of_their_bytes() {
        use tokio::io::AsyncReadExt;
        const BEFORE: &[&[u8]] = &[b"{\"id\":", b"\"", b"sg1-1", b"\",\"e\":"];
        // A 4-byte header (payloads of 126 to 65,535 bytes), the parts before the envelope, and the closing `}`.
        let edge = JOINED - 4 - BEFORE.concat().len() - 1;
        for long in [200, edge, edge + 1, 70_000] {
            let envelope = vec![b'x'; long];
            let parts: [&[u8]; PARTS] = [BEFORE[0], BEFORE[1], BEFORE[2], BEFORE[3], &envelope, b"}"];
            let text = parts.concat();
            let (near, mut far) = tokio::io::duplex(1 << 20);
            let mut wire = Wire::new(near);
            assert!(wire.send_text_parts(&parts).expect("the duplex is open"), "{long}");
            let want = text_frame(&text);
            let mut got = vec![0u8; want.len()];
            far.read_exact(&mut got).await.expect("the frame arrives");
            assert_eq!(got, want, "{long}");
            // Room for 8 bytes: the rest waits, and the next message queues behind it.
            let (near, mut far) = tokio::io::duplex(8);
            let mut wire = Wire::new(near);
            assert!(!wire.send_text_parts(&parts).expect("the duplex is open"));
            assert!(!wire.send_texts(&[b"{}"]).expect("the duplex is open"));
            let want = [text_frame(&text), text_frame(b"{}")].concat();
            let reading = tokio::spawn(async move {
                let mut got = vec![0u8; want.len()];
                far.read_exact(&mut got).await.expect("every byte arrives");
                got == want
            });
            std::future::poll_fn(|cx| wire.poll_drain(cx))
                .await
                .expect("the duplex takes the rest");
            assert!(
                reading.await.expect("the reader ends"),
                "both frames whole and in order ({long})"
            );
        }
    }

    /// While nothing waits and the connection has room, frames are written at once, whole, in one write.
    #[tokio::test]
    async fn frames_the_connection_takes_are_written_at_once() {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(4096);
        let mut wire = Wire::new(near);
        let sent = wire.send_texts(&[b"hello"]).expect("the duplex is open");
        assert!(sent, "header and text in one write");
        assert!(!wire.pending());
        assert_eq!(wire.out.capacity(), 0, "nothing was queued");
        // More than one write carries: each chunk written in turn, in order.
        let many: Vec<Vec<u8>> = (0..2 * MAX_FRAMES + 1)
            .map(|i| format!("{{\"n\":{i}}}").into_bytes())
            .collect();
        let texts: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
        assert!(wire.send_texts(&texts).expect("the duplex is open"));
        assert!(!wire.pending());
        let want = [text_frame(b"hello"), many.iter().flat_map(|t| text_frame(t)).collect()].concat();
        let mut got = vec![0u8; want.len()];
        far.read_exact(&mut got).await.expect("the frames arrive");
        assert_eq!(got, want);
    }
}
