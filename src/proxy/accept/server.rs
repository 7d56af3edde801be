//! Listeners and connections: plain HTTP/1.1 requests on `http1`, the rest (h2c, and HTTP/1.1 from a request that is
//! not plain on) via hyper-util's auto builder; limits, and the graceful drain.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::pin::Pin;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus::{IntCounter, Registry};
use thiserror::Error;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

use crate::proxy::accept::conn::{self, Activity, ClientIo, Tracked};

use crate::admin::{self, Health};
use crate::config::{duration, Settings};
use crate::inspect::serve::Routes;
use crate::proxy::accept::http1::{self, Service as _};
use crate::proxy::accept::workers::Workers;
use crate::proxy::base::drain::DrainSignal;
use crate::proxy::base::flushes::Flushes;
use crate::proxy::base::held::ClientStream;
use crate::proxy::base::quiet::Quiet;
use crate::proxy::decide::answers::Shared;
use crate::proxy::decide::handler::handle;
use crate::proxy::metrics::edge::Metrics;
use crate::proxy::request::body::UpstreamBody;
use crate::resume::metrics::ResumeMetrics;
use crate::resume::Resumer;
use crate::telemetry::counters;

/// Pause after a failed accept (EMFILE and the like) so the loop does not spin: the connection that could not
/// be accepted stays in the backlog, so the listener stays readable and the next accept would fail at once.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// After the drain deadline, how long the responses it ended get to write their last frame (translated streams:
/// the `gateway_draining` envelope) and close, before the process exits anyway. Bounded: a client that does
/// not read must not hold the exit.
const DRAIN_CUT_GRACE: Duration = Duration::from_secs(2);

/// The first bytes of an h2c connection with prior knowledge (RFC 9113, 3.4): what hyper-util's sniffing looks
/// for, and as many bytes as `peek_first` looks at.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

label_enum! {
    /// The `kind` label of `accept_errors_total`: why the public listener failed to accept a connection.
    pub enum AcceptErrorKind {
        /// EMFILE: the process is at its open-file limit (`ulimit -n`, `LimitNOFILE`).
        Emfile = "emfile",
        /// ENFILE: the system-wide open-file table is full.
        Enfile = "enfile",
        /// Anything else (a connection reset before it was accepted, out of memory, ...).
        Other = "other",
    }
}

impl AcceptErrorKind {
    /// Classifies a failed `accept`.
    pub fn of(e: &std::io::Error) -> Self {
        // libc's EMFILE and ENFILE, which have the same values on Linux, the BSDs and macOS (std has no
        // `ErrorKind` for them, and libc is not a direct dependency for two constants).
        const EMFILE: i32 = 24;
        const ENFILE: i32 = 23;
        match e.raw_os_error() {
            Some(EMFILE) if cfg!(unix) => AcceptErrorKind::Emfile,
            Some(ENFILE) if cfg!(unix) => AcceptErrorKind::Enfile,
            _ => AcceptErrorKind::Other,
        }
    }

    /// Out of file descriptors: no connection can be accepted until one is closed.
    pub const fn is_fd_exhaustion(self) -> bool {
        matches!(self, AcceptErrorKind::Emfile | AcceptErrorKind::Enfile)
    }
}

/// `accept_errors_total`, recorded by the accept loop.
pub struct AcceptErrors {
    /// By `AcceptErrorKind`.
    by_kind: [IntCounter; AcceptErrorKind::ALL.len()],
}

impl AcceptErrors {
    /// Creates the accept-error family and registers it on `r`.
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            by_kind: counters(
                r,
                "accept_errors_total",
                "Failed accepts on the public listener, by kind (emfile, enfile: out of file descriptors).",
                "kind",
                AcceptErrorKind::ALL.map(AcceptErrorKind::as_str),
            )?,
        })
    }

    pub fn record(&self, k: AcceptErrorKind) {
        self.by_kind[k as usize].inc();
    }
}

/// Connections the kernel queues before they are accepted (capped by `net.core.somaxconn`). The default of
/// std and tokio, 128, overflows when a load balancer restart sends every resumable stream's reconnect at once:
/// the overflowing clients then wait out a one-second SYN retransmission.
pub const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` with `LISTEN_BACKLOG`.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

#[derive(Debug, Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("upstream: {0}")]
    Upstream(String),
    #[error("resume: {0}")]
    Resume(String),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot start the worker threads: {0}")]
    Workers(#[source] std::io::Error),
}

/// A gateway with both listeners bound, not yet serving.
pub struct Gateway {
    listener: TcpListener,
    admin_listener: TcpListener,
    shared: Arc<Shared>,
    health: Arc<Health>,
    accept_errors: AcceptErrors,
    registry: Registry,
    workers: Workers,
    settings: Settings,
}

impl Gateway {
    /// Binds the public and admin listeners. `settings.upstream.url` must be set (main starts the demo backend
    /// first when it is not).
    pub async fn bind(settings: Settings, registry: Registry) -> Result<Self, ServeError> {
        let metrics = Arc::new(Metrics::register(&registry)?);
        let resumer = if settings.resume.enabled {
            let m = Arc::new(ResumeMetrics::register(&registry)?);
            Some(Resumer::start(&settings.resume, m).await.map_err(ServeError::Resume)?)
        } else {
            None
        };
        let bind = |addr| async move { listen(addr).map_err(|source| ServeError::Bind { addr, source }) };
        Ok(Self {
            health: Arc::new(Health::register(&registry)?),
            accept_errors: AcceptErrors::register(&registry)?,
            shared: Arc::new(Shared::new(&settings, metrics, resumer, &registry).map_err(ServeError::Upstream)?),
            listener: bind(settings.listen_addr()).await?,
            admin_listener: bind(settings.admin_addr()).await?,
            workers: Workers::start(settings.server.worker_threads()).map_err(ServeError::Workers)?,
            registry,
            settings,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or_else(|_| self.settings.listen_addr())
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .unwrap_or_else(|_| self.settings.admin_addr())
    }

    /// Serves until `shutdown` resolves, then drains: readiness off at once, no new connections, open streams
    /// run to their end for up to the drain timeout.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let (health, settings) = (self.health, self.settings);
        let inspector = self.shared.inspector.clone().map(|i| Arc::new(Routes::new(i)));
        let admin_task = tokio::spawn(admin::serve(
            self.admin_listener,
            self.registry,
            Arc::clone(&health),
            inspector,
        ));
        let builders = Arc::new(Builders::new(&settings));
        let limits = ConnLimits {
            first_request: duration(settings.server.header_read_timeout_secs),
            idle: duration(settings.server.idle_timeout_secs),
            http1: http1::Limits {
                max_head: settings.server.max_header_bytes,
                header_read: duration(settings.server.header_read_timeout_secs),
            },
        };
        // Every connection task holds a receiver: the drain signals through it and waits for them all to go.
        let (drain_tx, drain_rx) = watch::channel(false);
        // Turns true at the drain deadline: every response body still open watches it (`conn::Tracked`).
        let (cut_tx, cut_rx) = watch::channel(false);
        health.set_accepting(true);
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => {
                        if health.set_accepting(true) {
                            tracing::info!("accepting connections again: ready");
                        }
                        a
                    }
                    Err(e) => {
                        accept_failed(&e, &health, &self.accept_errors);
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                },
            };
            // Latency over throughput: each envelope is its own small write.
            let _ = stream.set_nodelay(true);
            let (builders, shared) = (Arc::clone(&builders), Arc::clone(&self.shared));
            let (drain_rx, cut_rx) = (drain_rx.clone(), cut_rx.clone());
            self.workers.serve(stream, move |stream| {
                serve_connection(builders, stream, peer, shared, limits, drain_rx, cut_rx)
            });
        }
        health.set_draining(true);
        drop(self.listener);
        let drain = duration(settings.server.drain_timeout_secs);
        tracing::info!(
            drain_timeout_secs = drain.as_secs_f64(),
            "shutting down: draining open streams"
        );
        drop(drain_rx);
        let _ = drain_tx.send(true);
        tokio::select! {
            () = drain_tx.closed() => tracing::info!("drained"),
            () = tokio::time::sleep(drain) => {
                tracing::warn!("drain timeout reached: ending translated streams with gateway_draining, cutting the rest");
                let _ = cut_tx.send(true);
                if tokio::time::timeout(DRAIN_CUT_GRACE, drain_tx.closed()).await.is_err() {
                    tracing::warn!("connections still open after the drain deadline: closed at exit");
                }
            }
        }
        admin_task.abort();
        // Stops the worker threads: what is still open there is dropped, as at exit.
        drop(self.workers);
    }
}

/// A failed accept on the public listener: counted; out of file descriptors, readiness is off until the next
/// accepted connection (a load balancer should stop sending connections this instance cannot take). Logged
/// when readiness changes, not per attempt: the loop retries every `ACCEPT_BACKOFF` while it lasts.
fn accept_failed(e: &std::io::Error, health: &Health, errors: &AcceptErrors) {
    let kind = AcceptErrorKind::of(e);
    errors.record(kind);
    if !kind.is_fd_exhaustion() {
        tracing::warn!(error = %e, "accept failed");
    } else if health.set_accepting(false) {
        tracing::warn!(error = %e, "accept failed: out of file descriptors; not ready until a connection is accepted");
    } else {
        tracing::debug!(error = %e, "accept failed: still out of file descriptors");
    }
}

/// Time limits of one client connection.
#[derive(Clone, Copy)]
struct ConnLimits {
    /// `server.header_read_timeout_secs`, for the first request.
    first_request: Duration,
    /// `server.idle_timeout_secs`.
    idle: Duration,
    http1: http1::Limits,
}

/// Serves one client connection to its end. Besides hyper's own work it closes the connection when it idles
/// (no request in flight for the idle timeout: HTTP/1.1 closes, HTTP/2 sends GOAWAY) or the drain starts, and
/// drops it (with the responses in flight, so their upstreams) as soon as the client leaves.
async fn serve_connection(
    builders: Arc<Builders>,
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    limits: ConnLimits,
    mut drain: watch::Receiver<bool>,
    cut: watch::Receiver<bool>,
) {
    let stream = Arc::new(stream);
    let activity = Activity::new();
    let flushes = Arc::new(Flushes::default());
    let seen_request = Arc::new(AtomicBool::new(false));
    let call = Call {
        stream: Arc::clone(&stream),
        activity: Arc::clone(&activity),
        flushes: Arc::clone(&flushes),
        seen_request: Arc::clone(&seen_request),
        shared,
        peer,
        cut,
        drain: drain.clone(),
    };
    let mut guard = std::pin::pin!(first_request_guard(seen_request, limits.first_request));
    // Before anything reads a byte: whether the connection may be h2c (see `Builders`).
    let may_be_h2 = tokio::select! {
        first = may_be_h2(&stream) => match first {
            Some(may_be_h2) => may_be_h2,
            None => return,
        },
        () = guard.as_mut() => return no_request(peer),
        () = activity.idle_for(limits.idle) => return,
        _ = drain.wait_for(|d| *d) => return,
    };
    // HTTP/1.1: plain requests are served without hyper's connection buffers, until one is not plain.
    let prefix = if may_be_h2 {
        Bytes::new()
    } else {
        let plain = http1::serve(&stream, &flushes, limits.http1, &mut drain, &call);
        let watches = std::pin::pin!(async {
            tokio::select! {
                () = guard.as_mut() => Closing::NoRequest,
                () = conn::client_left(&stream, &activity) => Closing::Left,
                () = flushes.drop_asked() => Closing::Dropped,
                // Only while no request is in flight: the connection closes as hyper's would.
                () = activity.idle_for(limits.idle) => Closing::Gracefully("idle timeout"),
            }
        });
        let outcome = tokio::select! {
            o = plain => o,
            c = Quiet::new(watches) => match c {
                Closing::NoRequest => return no_request(peer),
                Closing::Left => return left(peer),
                Closing::Dropped => return dropped(peer),
                Closing::Gracefully(why) => return tracing::debug!(%peer, why, "closing the connection"),
            },
        };
        match outcome {
            http1::Outcome::Closed => return,
            http1::Outcome::HandOff(prefix) => prefix,
        }
    };
    // Boxed: only connections hyper serves (h2c, or a request the plain path handed over) pay for its state.
    let hyper = serve_with_hyper(
        builders.pick(may_be_h2),
        &stream,
        prefix,
        call,
        guard,
        limits.idle,
        &mut drain,
    );
    Box::pin(hyper).await;
}

/// hyper serves the connection from `prefix` on, until it ends or the watches end it.
async fn serve_with_hyper(
    builder: &auto::Builder<TokioExecutor>,
    stream: &Arc<TcpStream>,
    prefix: Bytes,
    call: Call,
    mut guard: Pin<&mut impl Future<Output = ()>>,
    idle: Duration,
    drain: &mut watch::Receiver<bool>,
) {
    let (activity, peer) = (Arc::clone(&call.activity), call.peer);
    let flushes = Arc::clone(&call.flushes);
    let io = ClientIo::new(Arc::clone(stream), Arc::clone(&call.flushes), prefix);
    let service = service_fn(move |req: Request<Incoming>| {
        let resp = call.call(req.map(BodyExt::boxed));
        async move { Ok::<_, Infallible>(resp.await) }
    });
    let conn = builder
        .serve_connection_with_upgrades(TokioIo::new(io), service)
        .into_owned();
    let mut conn = std::pin::pin!(conn);
    // The watches wake rarely, the connection for every event: behind `Quiet`, the connection's wake-ups do
    // not poll them.
    let watches = std::pin::pin!(async {
        tokio::select! {
            () = guard.as_mut() => Closing::NoRequest,
            () = conn::client_left(stream, &activity) => Closing::Left,
            () = flushes.drop_asked() => Closing::Dropped,
            () = activity.idle_for(idle) => Closing::Gracefully("idle timeout"),
            _ = drain.wait_for(|d| *d) => Closing::Gracefully("draining"),
        }
    });
    let closing = tokio::select! {
        r = conn.as_mut() => return log_end(r, peer),
        c = Quiet::new(watches) => c,
    };
    let why = match closing {
        Closing::NoRequest => return no_request(peer),
        Closing::Left => return left(peer),
        Closing::Dropped => return dropped(peer),
        Closing::Gracefully(why) => why,
    };
    tracing::debug!(%peer, why, "closing the connection gracefully");
    conn.as_mut().graceful_shutdown();
    let left_meanwhile = std::pin::pin!(conn::client_left(stream, &activity));
    tokio::select! {
        r = conn.as_mut() => log_end(r, peer),
        () = Quiet::new(left_meanwhile) => left(peer),
    }
}

/// The request service of one connection, for hyper and for `http1` alike.
struct Call {
    /// Given to what writes to the connection after its response (an upgraded socket).
    stream: Arc<TcpStream>,
    activity: Arc<Activity>,
    flushes: Arc<Flushes>,
    seen_request: Arc<AtomicBool>,
    shared: Arc<Shared>,
    peer: SocketAddr,
    cut: watch::Receiver<bool>,
    /// Given to what outlives its response (an upgraded socket), so the drain waits for it and tells it.
    drain: watch::Receiver<bool>,
}

impl http1::Service for Call {
    fn call(&self, mut req: Request<UpstreamBody>) -> Pin<Box<dyn Future<Output = Response<Tracked>> + Send>> {
        self.seen_request.store(true, Ordering::Relaxed);
        let in_flight = self.activity.begin();
        req.extensions_mut().insert(Arc::clone(&self.flushes));
        req.extensions_mut().insert(DrainSignal(self.drain.clone()));
        req.extensions_mut().insert(ClientStream(Arc::downgrade(&self.stream)));
        let (shared, peer, cut) = (Arc::clone(&self.shared), self.peer, self.cut.clone());
        let flushes = Arc::clone(&self.flushes);
        // Boxed: an HTTP/2 stream's task holds its service future inline for as long as the stream lasts, so an
        // unboxed (large) future would cost every idle stream its size.
        Box::pin(async move {
            let resp = handle(req, peer, shared).await;
            resp.map(|mut body| {
                body.watch_connection(&flushes);
                Tracked::new(body, in_flight, &cut)
            })
        })
    }
}

/// Why a connection's watches ended it.
enum Closing {
    NoRequest,
    Left,
    /// A response body asked for it (`Flushes::drop_connection`).
    Dropped,
    Gracefully(&'static str),
}

fn log_end(r: Result<(), Box<dyn std::error::Error + Send + Sync>>, peer: SocketAddr) {
    if let Err(e) = r {
        tracing::debug!(error = %e, %peer, "connection ended with an error");
    }
}

fn no_request(peer: SocketAddr) {
    tracing::debug!(%peer, "no request within the header read timeout: closed");
}

fn dropped(peer: SocketAddr) {
    tracing::debug!(%peer, "a response asked for its connection to be dropped (its client reads nothing): dropped");
}

fn left(peer: SocketAddr) {
    tracing::debug!(%peer, "client closed its connection with a request in flight: dropped");
}

/// hyper's header read timeout starts once it knows the protocol; a client that stalls before that (inside
/// hyper-util's protocol sniffing, or before its first byte) is covered here: no request within the timeout
/// closes the connection. Later requests on a kept-alive connection are covered by hyper's own timer.
async fn first_request_guard(seen: Arc<AtomicBool>, timeout: Duration) {
    tokio::time::sleep(timeout).await;
    if seen.load(Ordering::Relaxed) {
        std::future::pending::<()>().await;
    }
}

/// Waits for the connection's first bytes and peeks at them (up to the preface's length), leaving them for hyper:
/// whether they may begin the h2 preface; `None` when the client closed (or the socket failed) before sending one.
async fn may_be_h2(stream: &TcpStream) -> Option<bool> {
    let mut first = [0u8; H2_PREFACE.len()];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(H2_PREFACE.starts_with(&first[..n])),
    }
}

/// The client connection builders. hyper-util's auto builder tells HTTP/1.1 from h2c by reading the first bytes
/// itself and handing them to hyper's HTTP/1 connection as a prefix; its first read then returns only that
/// prefix, and the second grows the read buffer from 8 to 16 KiB for the connection's life (4–5 KiB more
/// resident per idle HTTP/1.1 stream). When the first bytes, peeked without consuming them, already rule the h2
/// preface out, the HTTP/1-only builder serves the connection with no prefix.
struct Builders {
    /// Sniffs the protocol (or only HTTP/1.1 when `server.http2` is off).
    sniffing: auto::Builder<TokioExecutor>,
    /// The same settings, HTTP/1.1 only.
    h1: auto::Builder<TokioExecutor>,
}

impl Builders {
    fn new(settings: &Settings) -> Self {
        let sniffing = connection_builder(settings);
        Self {
            h1: sniffing.clone().http1_only(),
            sniffing,
        }
    }

    /// The builder for a connection whose first bytes `may_be_h2`.
    fn pick(&self, may_be_h2: bool) -> &auto::Builder<TokioExecutor> {
        if may_be_h2 {
            &self.sniffing
        } else {
            &self.h1
        }
    }
}

fn connection_builder(settings: &Settings) -> auto::Builder<TokioExecutor> {
    let s = &settings.server;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        // hyper enforces header_read_timeout only with a timer.
        .timer(TokioTimer::new())
        .header_read_timeout(duration(s.header_read_timeout_secs))
        .max_buf_size(s.max_header_bytes.max(8192))
        // Otherwise hyper reads while a response is in flight only to see the client leave, and holds an 8 KiB
        // read buffer per open stream for it; `conn::client_left` watches for that without a buffer.
        .half_close(true)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(s.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(Duration::from_secs(30)));
    if s.http2 {
        builder
    } else {
        builder.http1_only()
    }
}

/// Addresses a running gateway listens on (printed at start).
pub fn banner(public: SocketAddr, admin: SocketAddr) -> String {
    format!("sse-gateway: proxy listening on http://{public}\nsse-gateway: admin listening on http://{admin}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_errors_family_is_registered() {
        let r = prometheus::Registry::new();
        AcceptErrors::register(&r).unwrap();
        let names: Vec<String> = r.gather().iter().map(|f| f.get_name().to_owned()).collect();
        assert!(names.iter().any(|n| n.ends_with("accept_errors_total")), "{names:?}");
    }

    /// The first bytes decide the builder only when they rule h2c out; a request line never looks like the
    /// preface, even cut short after one byte of `PUT` or `POST` (which the sniffing builder then serves).
    #[tokio::test]
    async fn peeked_first_bytes_choose_the_builder_and_stay_for_hyper() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        for (sent, h2) in [
            (&b"GET /stream HTTP/1.1\r\n"[..], Some(false)),
            (b"POST /v1 HTTP/1.1\r\n", Some(false)),
            (b"P", Some(true)),
            (b"PRI * HTTP/2.0\r\n", Some(true)),
            (H2_PREFACE, Some(true)),
            (b"", None),
        ] {
            let mut client = TcpStream::connect(addr).await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            client.write_all(sent).await.unwrap();
            if sent.is_empty() {
                client.shutdown().await.unwrap();
            }
            assert_eq!(may_be_h2(&server).await, h2, "{sent:?}");
            let mut server = server;
            let mut read = vec![0u8; sent.len()];
            server.read_exact(&mut read).await.unwrap();
            assert_eq!(read, sent, "peeked bytes are still there to read");
        }
    }

    #[test]
    fn accept_errors_out_of_descriptors_are_told_apart() {
        let of = |code| AcceptErrorKind::of(&std::io::Error::from_raw_os_error(code));
        if cfg!(unix) {
            assert_eq!(of(24), AcceptErrorKind::Emfile);
            assert_eq!(of(23), AcceptErrorKind::Enfile);
            assert!(of(24).is_fd_exhaustion() && of(23).is_fd_exhaustion());
        }
        let reset = AcceptErrorKind::of(&std::io::ErrorKind::ConnectionAborted.into());
        assert_eq!(reset, AcceptErrorKind::Other);
        assert!(!reset.is_fd_exhaustion());
    }
}
