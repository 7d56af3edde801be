//! The dedicated connection of an event stream: one request written, one response read, no task of its own.
//!
//! hyper's client runs each connection in a task and hands the response body over one chunk at a time through a
//! channel, holding a read buffer, a write buffer and a request channel per connection (~26 KiB) for as long
//! as the stream is open. An event stream is one request and one long response, so here the response body *is*
//! the connection: a poll writes on the request body while it lasts, reads the socket, and decodes every chunk
//! the read brought (`framing`). A read lands in a buffer on the stack and only its data is kept (one allocation
//! of its exact size), so a stream waiting for its next event holds no buffer at all.

use crate::proxy::upstream::dedicated::error::{Error, MAX_HEAD};
use crate::proxy::upstream::dedicated::head;

use std::future::poll_fn;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::proxy::request::body::ClientBody;
use crate::proxy::upstream::dedicated::framing::Framing;
use crate::proxy::upstream::dedicated::head::BodyFraming;

/// Bytes one socket read takes (on the stack).
const READ_SIZE: usize = 16 << 10;
/// Request body bytes gathered into one socket write.
const WRITE_BATCH: usize = 64 << 10;

/// Sends `req` (origin-form target) over `io`, a connection of its own, and reads until the response head.
pub async fn send(mut io: TcpStream, req: Request<ClientBody>) -> Result<Response<Connection>, Error> {
    let (mut parts, body) = req.into_parts();
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let (exact, empty) = (body.size_hint().exact(), body.is_end_stream());
    let mut out = Vec::new();
    let framing = head::encode_request(&parts.method, target, &mut parts.headers, exact, empty, &mut out);
    let mut writer = Some(Writer {
        out,
        at: 0,
        body: (!empty).then_some(body),
        framing,
    });
    let mut buf = Vec::new();
    // The request is written (and its body streamed) while the head is awaited: an upstream may answer first.
    let mut write_failed = None;
    let (resp, len, mut framing) = poll_fn(|cx| {
        if let Some(e) = write_on(&mut writer, &mut io, cx)? {
            write_failed = Some(e);
        }
        loop {
            if let Some(parsed) = head::parse_response(&parts.method, &buf)? {
                return Poll::Ready(Ok(parsed));
            }
            if buf.len() >= MAX_HEAD {
                return Poll::Ready(Err(Error::HeadTooLarge));
            }
            let got = ready!(read(&mut io, cx, |b| {
                buf.extend_from_slice(b);
                b.len()
            }))?;
            if got == 0 {
                return Poll::Ready(Err(write_failed.take().unwrap_or(Error::Incomplete)));
            }
        }
    })
    .await?;
    let mut rest = buf.split_off(len);
    let n = framing.decode(&mut rest)?;
    rest.truncate(n);
    Ok(resp.map(|()| Connection {
        io,
        writer,
        framing,
        first: Bytes::from(rest),
    }))
}

/// One socket read into a stack buffer, handed to `take` (empty at the end of the stream).
fn read<T>(io: &mut TcpStream, cx: &mut Context<'_>, take: impl FnOnce(&mut [u8]) -> T) -> Poll<io::Result<T>> {
    let mut storage = [MaybeUninit::<u8>::uninit(); READ_SIZE];
    let mut buf = ReadBuf::uninit(&mut storage);
    ready!(Pin::new(io).poll_read(cx, &mut buf))?;
    Poll::Ready(Ok(take(buf.filled_mut())))
}

/// Drives the request's writer, if one is left: it is dropped once the request is out, or when the upstream
/// stopped reading (that error is returned: the response, if any, says how the exchange went). A failing
/// client body is the error.
fn write_on(writer: &mut Option<Writer>, io: &mut TcpStream, cx: &mut Context<'_>) -> Result<Option<Error>, Error> {
    let Some(w) = writer.as_mut() else {
        return Ok(None);
    };
    match w.poll(io, cx) {
        Poll::Pending => Ok(None),
        Poll::Ready(Err(e @ Error::ClientBody(_))) => Err(e),
        Poll::Ready(done) => {
            *writer = None;
            Ok(done.err())
        }
    }
}

/// The request on its way out: the encoded bytes not yet written, and the body still to come.
struct Writer {
    out: Vec<u8>,
    at: usize,
    body: Option<ClientBody>,
    framing: BodyFraming,
}

impl Writer {
    /// Writes until the request is out (`Ready(Ok)`), the socket or the body waits, or something fails.
    fn poll(&mut self, io: &mut TcpStream, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        loop {
            while self.at < self.out.len() {
                let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.out[self.at..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::Error::from(io::ErrorKind::WriteZero).into()));
                }
                self.at += n;
            }
            self.out.clear();
            self.at = 0;
            let Some(body) = self.body.as_mut() else {
                return Poll::Ready(Ok(()));
            };
            while self.out.len() < WRITE_BATCH {
                match Pin::new(&mut *body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            put(&mut self.out, &mut self.framing, &data)?;
                        }
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(Error::ClientBody(e))),
                    Poll::Ready(None) => {
                        finish(&mut self.out, self.framing)?;
                        self.body = None;
                        break;
                    }
                    Poll::Pending if self.out.is_empty() => return Poll::Pending,
                    Poll::Pending => break,
                }
            }
        }
    }
}

/// Encodes a piece of the request body into `out`.
fn put(out: &mut Vec<u8>, framing: &mut BodyFraming, data: &[u8]) -> Result<(), Error> {
    match framing {
        BodyFraming::Length(left) => {
            *left = left.checked_sub(data.len() as u64).ok_or(Error::BodyLength)?;
            out.extend_from_slice(data);
        }
        BodyFraming::Chunked if data.is_empty() => {}
        BodyFraming::Chunked => {
            use std::io::Write;
            let _ = write!(out, "{:x}\r\n", data.len());
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        }
    }
    Ok(())
}

/// Ends the request body in `out`.
fn finish(out: &mut Vec<u8>, framing: BodyFraming) -> Result<(), Error> {
    match framing {
        BodyFraming::Length(0) => {}
        BodyFraming::Length(_) => return Err(Error::BodyLength),
        BodyFraming::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
    }
    Ok(())
}

/// The response body of a dedicated exchange, which drives the connection itself.
pub struct Connection {
    io: TcpStream,
    /// The request body still being written (an upstream may answer before it has read it all).
    writer: Option<Writer>,
    framing: Framing,
    /// Data read with the head, not yet handed on.
    first: Bytes,
}

impl Connection {
    fn failed(&mut self, e: Error) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        self.framing = Framing::End;
        self.writer = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl Body for Connection {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        let this = self.get_mut();
        if let Err(e) = write_on(&mut this.writer, &mut this.io, cx) {
            return this.failed(e);
        }
        if !this.first.is_empty() {
            return Poll::Ready(Some(Ok(Frame::data(std::mem::take(&mut this.first)))));
        }
        while !this.framing.is_end() {
            if let Some(e) = this.framing.failure() {
                return this.failed(e);
            }
            let framing = &mut this.framing;
            // One allocation of the data's exact size per read, whatever its chunks; an empty read is the end.
            let decoded = ready!(read(&mut this.io, cx, |read| match read.len() {
                0 => framing.eof().map(|()| None),
                _ => framing
                    .decode(read)
                    .map(|n| (n > 0).then(|| Bytes::copy_from_slice(&read[..n]))),
            }));
            match decoded.map_err(Error::from).and_then(|d| d) {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(None) => {}
                Err(e) => return this.failed(e),
            }
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.framing.is_end() && self.first.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        let first = self.first.len() as u64;
        self.framing
            .remaining()
            .map_or_else(SizeHint::default, |left| SizeHint::with_exact(left + first))
    }
}
