//! Upstream response bodies, and the dedicated connection that an event stream's body drives itself.
//!
//! hyper's pooled client runs each connection in a task of its own and hands the response body one chunk at a
//! time through a channel, waking the connection task for the next. A legacy backend writes one chunk per
//! event, so a pooled stream costs a task wake-up and a client write per event, however many events one
//! socket read brought. On a dedicated connection the body polls the connection itself: every chunk already
//! read is decoded in the same poll, and the body adapter sends them to the client as one frame.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::forward::UpstreamBody;

type Conn = http1::Connection<TokioIo<TcpStream>, UpstreamBody>;

/// Sends `req` over `io`, a connection of its own, driving the connection until the response head arrives.
pub async fn send(io: TokioIo<TcpStream>, req: Request<UpstreamBody>) -> hyper::Result<Response<UpstreamIncoming>> {
    let (mut sender, conn) = http1::Builder::new().handshake(io).await?;
    let mut conn = Some(conn);
    let mut response = std::pin::pin!(sender.send_request(req));
    // The connection writes the request (and streams its body) while the head is awaited.
    let head = std::future::poll_fn(|cx| {
        poll_conn(&mut conn, cx);
        response.as_mut().poll(cx)
    })
    .await?;
    // No second request goes on this connection: without a sender it closes when this response ends.
    drop(sender);
    Ok(head.map(|body| UpstreamIncoming { body, conn }))
}

/// Polls the connection; once it is done it is dropped (how it ended reaches the response or its body).
fn poll_conn(conn: &mut Option<Conn>, cx: &mut Context<'_>) {
    if let Some(c) = conn {
        if Pin::new(c).poll(cx).is_ready() {
            *conn = None;
        }
    }
}

/// An upstream response body: from the pool, or driving its dedicated connection.
pub struct UpstreamIncoming {
    body: Incoming,
    /// The dedicated connection, until it is done; `None` for a pooled response.
    conn: Option<Conn>,
}

impl UpstreamIncoming {
    pub fn pooled(body: Incoming) -> Self {
        Self { body, conn: None }
    }
}

impl Body for UpstreamIncoming {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if this.conn.is_none() {
            return Poll::Pending;
        }
        // The connection reads the socket and queues the next chunk into the body: take it in this poll.
        poll_conn(&mut this.conn, cx);
        Pin::new(&mut this.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
