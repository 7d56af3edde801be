//! Upstream response bodies, and the dedicated connection that an event stream's body drives itself.
//!
//! hyper's pooled client runs each connection in a task of its own and hands the response body one chunk at a
//! time through a channel, waking the connection task for the next. A legacy backend writes one chunk per
//! event, so a pooled stream costs a task wake-up and a client write per event, however many events one
//! socket read brought. On a dedicated connection the body polls the connection itself: every chunk already
//! read is decoded in the same poll, and the body adapter sends them to the client as one frame.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use atomic_waker::AtomicWaker;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use super::request_body::ClientBody;

type Conn = http1::Connection<TokioIo<TcpStream>, ClientBody>;

/// Sends `req` over `io`, a connection of its own, driving the connection until the response head arrives.
pub async fn send(io: TokioIo<TcpStream>, req: Request<ClientBody>) -> hyper::Result<Response<UpstreamIncoming>> {
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
    Ok(head.map(|body| UpstreamIncoming::dedicated(body, conn)))
}

/// Polls the connection; once it is done it is dropped (how it ended reaches the response or its body).
fn poll_conn(conn: &mut Option<Conn>, cx: &mut Context<'_>) {
    if conn.as_mut().is_some_and(|c| Pin::new(c).poll(cx).is_ready()) {
        *conn = None;
    }
}

/// Passes wake-ups on to the task, except those that come while the task itself is polling the connection and
/// its body. The two hand each chunk over through a channel, and each hand-over wakes the other side, which here
/// is the running task: woken while running, it would be polled once more for nothing, and tokio queues such a
/// task for the other worker thread to steal.
struct Gate {
    state: AtomicU8,
    task: AtomicWaker,
    /// A wake-up came since the connection was last polled. Without one, polling it again can only return
    /// `Pending`: skipping that poll saves a pass through hyper's dispatcher on most body polls.
    stirred: AtomicBool,
}

const IDLE: u8 = 0;
const POLLING: u8 = 1;
/// Woken while polling: the poll goes round once more before it may return `Pending`.
const WOKEN: u8 = 2;

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Before the state: a poller that sees the state it set learns of the wake-up from `stirred`.
        self.stirred.store(true, Ordering::Release);
        match self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
        {
            // The poller sees it when it leaves (its swap comes after this).
            Ok(_) | Err(WOKEN) => {}
            Err(_) => self.task.wake(),
        }
    }
}

/// A dedicated connection and the waker its polls use.
struct Driven {
    conn: Option<Conn>,
    gate: Arc<Gate>,
    waker: Waker,
}

/// Rounds of one poll that a wake-up during the poll may cause; past them the wake-up goes to the task (tokio's
/// cooperative budget, once spent, wakes the task at every poll until it yields).
const MAX_ROUNDS: usize = 3;

/// An upstream response body: from the pool, or driving its dedicated connection.
pub struct UpstreamIncoming {
    body: Incoming,
    /// `None` for a pooled response.
    driven: Option<Driven>,
    /// One of `upstream.max_connections`, released when the body (and so its connection) is dropped.
    _slot: Option<OwnedSemaphorePermit>,
}

impl UpstreamIncoming {
    pub fn pooled(body: Incoming) -> Self {
        Self {
            body,
            driven: None,
            _slot: None,
        }
    }

    /// Holds `slot` for as long as the body lives.
    pub fn holding(mut self, slot: OwnedSemaphorePermit) -> Self {
        self._slot = Some(slot);
        self
    }

    fn dedicated(body: Incoming, conn: Option<Conn>) -> Self {
        let gate = Arc::new(Gate {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
            // The connection's wakers so far were the task's own (while the head was awaited): the first poll
            // must poll it, so it registers the gate's.
            stirred: AtomicBool::new(true),
        });
        let waker = Waker::from(Arc::clone(&gate));
        Self {
            body,
            driven: Some(Driven { conn, gate, waker }),
            _slot: None,
        }
    }
}

/// One round: the body, else the connection (which reads the socket and queues the next chunk) and the body
/// again. The connection is polled only when something woke the task since its last poll.
fn poll_round(
    body: &mut Incoming,
    conn: &mut Option<Conn>,
    gate: &Gate,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
    if let Poll::Ready(frame) = Pin::new(&mut *body).poll_frame(cx) {
        return Poll::Ready(frame);
    }
    if conn.is_none() || !gate.stirred.swap(false, Ordering::AcqRel) {
        return Poll::Pending;
    }
    poll_conn(conn, cx);
    Pin::new(body).poll_frame(cx)
}

impl Body for UpstreamIncoming {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let Some(d) = this.driven.as_mut() else {
            return Pin::new(&mut this.body).poll_frame(cx);
        };
        d.gate.task.register(cx.waker());
        let mut gated = Context::from_waker(&d.waker);
        for _ in 0..MAX_ROUNDS {
            d.gate.state.store(POLLING, Ordering::Release);
            let polled = poll_round(&mut this.body, &mut d.conn, &d.gate, &mut gated);
            let woken = d.gate.state.swap(IDLE, Ordering::AcqRel) == WOKEN;
            // A frame: the caller polls again for the next one, which also serves whatever woke us.
            if polled.is_ready() || !woken {
                return polled;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    body_hints_from!(body);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn the_gate_holds_back_wakes_during_a_poll_and_passes_the_others() {
        let task = Arc::new(Count(AtomicUsize::new(0)));
        let task_waker = Waker::from(Arc::clone(&task));
        let gate = Arc::new(Gate {
            state: AtomicU8::new(IDLE),
            task: AtomicWaker::new(),
            stirred: AtomicBool::new(false),
        });
        gate.task.register(&task_waker);
        let waker = Waker::from(Arc::clone(&gate));
        waker.wake_by_ref();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "idle: passed on");
        assert!(
            gate.stirred.swap(false, Ordering::AcqRel),
            "the connection is polled next"
        );
        // The task's next poll registers again, then polls with the gate's waker.
        gate.task.register(&task_waker);
        gate.state.store(POLLING, Ordering::Release);
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "polling: held back");
        assert!(
            gate.stirred.load(Ordering::Acquire),
            "a held-back wake-up still marks the connection"
        );
        assert_eq!(
            gate.state.swap(IDLE, Ordering::AcqRel),
            WOKEN,
            "the poller learns it was woken"
        );
        waker.wake_by_ref();
        assert_eq!(task.0.load(Ordering::Relaxed), 2, "idle again: passed on");
    }
}
