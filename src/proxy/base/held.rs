//! What an upgraded connection takes past its response: the client's TCP stream (`ClientStream`, written by
//! hyper's I/O and then the socket alike through `poll_write_with`), and its place on the count of open
//! connections of the worker it runs on (`Open`), by which new connections are spread.

use std::cell::OnceCell;
use std::io;
use std::net::Shutdown;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll};

use tokio::net::TcpStream;

/// The client's TCP connection, in a request's extensions for what writes to it after an upgrade (a socket's
/// frames go to it straight, not through hyper's upgraded I/O and the layers under it). Weak: whatever keeps a
/// request's extensions does not keep the connection open.
#[derive(Clone)]
pub struct ClientStream(pub Weak<TcpStream>);

/// Runs `write` on a TCP stream shared by `&` (the client's, by hyper's I/O and by an upgraded socket): tried
/// first, the readiness asked only when it would block.
pub fn poll_write_with(
    tcp: &TcpStream,
    cx: &mut Context<'_>,
    write: impl Fn(&TcpStream) -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        match write(tcp) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(tcp.poll_write_ready(cx))?,
            r => return Poll::Ready(r),
        }
    }
}

/// Shuts the stream's writing half (a shared stream cannot be shut by its owner's `poll_shutdown`).
pub fn shutdown_write(tcp: &TcpStream) -> io::Result<()> {
    socket2::SockRef::from(tcp).shutdown(Shutdown::Write)
}

thread_local! {
    /// The open connections of the worker this thread is (unset off the workers).
    static COUNT: OnceCell<Arc<AtomicUsize>> = const { OnceCell::new() };
}

/// Makes `count` the count `Open::here` adds to on this thread (a worker's, once, as it starts).
pub fn count_here(count: &Arc<AtomicUsize>) {
    COUNT.with(|c| {
        c.get_or_init(|| Arc::clone(count));
    });
}

/// One open connection on a worker, uncounted when dropped.
pub struct Open(Arc<AtomicUsize>);

impl Open {
    /// Counts one on `count`.
    pub fn on(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Open(Arc::clone(count))
    }

    /// Counts a connection that outlives the job it came in on (an upgraded WebSocket, whose task the job spawns
    /// on its worker) as open on the worker this runs on, until dropped: uncounted, every socket would look like
    /// no load and go to the first worker. None off the workers.
    pub fn here() -> Option<Open> {
        COUNT.with(|c| c.get().map(Open::on))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
