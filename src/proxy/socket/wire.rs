//! The connection under a socket, with one outgoing byte queue for the socket's data frames and tungstenite's own
//! (pongs, pings, the close frame), so no frame is ever written into the middle of another. A data frame goes
//! straight to the connection, its header and payload in one vectored write (no copy, no lock), while nothing
//! waits; what the connection does not take waits here, and so does whatever tungstenite writes after it.
//! tungstenite keeps reading the connection and writing its control frames; it does not frame the data.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf, BytesMut};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::FrameHeader;

/// A server's frame header: two bytes, and eight more for the longest length (never masked).
const MAX_HEADER: usize = 10;

/// The upgraded connection and what it has not taken yet.
pub struct Wire<I = TokioIo<Upgraded>> {
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

    /// Writes one text message: straight to the connection when nothing waits before it, the rest (or all of it)
    /// queued. True when the connection took all of it.
    ///
    /// `text` is UTF-8 (a text frame carries nothing else, RFC 6455 §5.6) without a check here: the socket's
    /// messages are its own JSON around held events, and the held events are the translator's text (a store's
    /// are checked as they are read, `ReadError::NotText`).
    pub fn send_text(&mut self, text: &[u8]) -> io::Result<bool> {
        debug_assert!(std::str::from_utf8(text).is_ok(), "a text message that is not UTF-8");
        let mut head = [0u8; MAX_HEADER];
        let head = header(text.len(), &mut head);
        if self.pending() {
            self.queue(head, text, 0);
            return Ok(false);
        }
        // Not woken by this write: a socket left pending is polled with its task's waker (`poll_drain`).
        let mut cx = Context::from_waker(Waker::noop());
        let parts = [IoSlice::new(head), IoSlice::new(text)];
        let written = match Pin::new(&mut self.io).poll_write_vectored(&mut cx, &parts) {
            Poll::Ready(Ok(n)) => n,
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => 0,
        };
        if written == head.len() + text.len() {
            return Ok(true);
        }
        self.queue(head, text, written);
        Ok(false)
    }

    /// Queues the frame `head` + `text` past its first `written` bytes.
    fn queue(&mut self, head: &[u8], text: &[u8], written: usize) {
        self.out.reserve(head.len() + text.len() - written);
        if written < head.len() {
            self.out.extend_from_slice(&head[written..]);
            self.out.extend_from_slice(text);
        } else {
            self.out.extend_from_slice(&text[written - head.len()..]);
        }
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

/// A final text frame's header for a payload of `len` bytes, written into `buf`.
fn header(len: usize, buf: &mut [u8; MAX_HEADER]) -> &[u8] {
    let head = FrameHeader {
        opcode: OpCode::Data(Data::Text),
        ..FrameHeader::default()
    };
    let mut rest = &mut buf[..];
    // Ten bytes hold any unmasked header: writing into them cannot fail.
    let _ = head.format(len as u64, &mut rest);
    let n = MAX_HEADER - rest.len();
    &buf[..n]
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
            let ours = header(len, &mut buf).to_vec();
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

    /// A connection that takes a few bytes at a time: a data frame it does not take whole waits, later frames and
    /// tungstenite's own writes queue behind it, and the connection gets every frame whole, in order.
    #[tokio::test]
    async fn frames_the_connection_does_not_take_go_out_whole_and_in_order() {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(8);
        let mut wire = Wire::new(near);
        let (first, second, pong) = (vec![b'x'; 300], b"{\"b\":2}".to_vec(), [0x8a_u8, 0]);
        assert!(
            !wire.send_text(&first).expect("the duplex is open"),
            "8 bytes of room cannot take 304"
        );
        assert!(wire.pending());
        // Queued behind the first, not written into its middle.
        assert!(!wire.send_text(&second).expect("the duplex is open"));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(
            Pin::new(&mut wire).poll_write(&mut cx, &pong),
            Poll::Ready(Ok(2))
        ));
        let want = [text_frame(&first), text_frame(&second), pong.to_vec()].concat();
        let reading = tokio::spawn(async move {
            let mut got = vec![0u8; want.len()];
            far.read_exact(&mut got).await.expect("every byte arrives");
            (got, want)
        });
        std::future::poll_fn(|cx| wire.poll_drain(cx))
            .await
            .expect("the duplex takes the rest");
        assert!(!wire.pending());
        assert_eq!(wire.out.capacity(), 0, "a drained wire holds no buffer");
        let (got, want) = reading.await.expect("the reader ends");
        assert_eq!(got, want);
    }

    /// While nothing waits and the connection has room, a frame is written at once, whole.
    #[tokio::test]
    async fn a_frame_the_connection_takes_is_written_at_once() {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(4096);
        let mut wire = Wire::new(near);
        assert!(
            wire.send_text(b"hello").expect("the duplex is open"),
            "header and text in one write"
        );
        assert!(!wire.pending());
        assert_eq!(wire.out.capacity(), 0, "nothing was queued");
        let frame = text_frame(b"hello");
        let mut got = vec![0u8; frame.len()];
        far.read_exact(&mut got).await.expect("the frame arrives");
        assert_eq!(got, frame);
    }
}
