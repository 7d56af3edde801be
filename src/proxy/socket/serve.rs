//! One socket, from its upgrade to its close: the streams it reads (one, or a session's), their events written at
//! once while the socket keeps up and queued into one batch while a write is pending, the client's messages,
//! pings, and the close code that says how it ended.

use std::collections::HashMap;
use std::future::poll_fn;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use futures_util::{SinkExt, StreamExt};
use http::HeaderMap;
use http_body::Body;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::error::ProtocolError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::proxy::body::follow::{Follow, RemoteFollow};
use crate::proxy::socket::cap::Reserved;
use crate::proxy::socket::messages::{self, Encoder, Event, FromClient, Outcome, Queue, Subprotocol};
use crate::proxy::socket::metrics::{SocketKind, SocketMetrics};
use crate::proxy::socket::wire::{Conn, Upgrading, Wire, MAX_FRAMES};
use crate::resume::id::Token;
use crate::resume::metrics::Resumption;
use crate::resume::sessions::{SessionError, SessionLimits};
use crate::resume::{Opened, Refusal, Resumer};

/// How long a closing socket is given to take its close frame and answer it: past this (or
/// `websocket.write_timeout_secs`, if shorter) the connection is dropped. A socket that fell behind has this long
/// to read what came before its 4003.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// What a socket reads at once from the connection: what clients send is small (pongs, a cancel, the credential),
/// and an idle socket holds this buffer. A larger message is read in several reads.
const READ_BUFFER: usize = 128;

/// A socket's bounds (`websocket.*`, docs/WEBSOCKET.md).
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_message_bytes: usize,
    pub auth_timeout: Duration,
    pub ping_interval: Duration,
    pub pong_timeout: Duration,
    pub write_timeout: Duration,
    pub max_queued_bytes: usize,
    pub max_streams_per_session: usize,
    /// Session sockets at once on this instance (`websocket.max_sockets`: every session is a socket).
    pub max_sessions: usize,
}

/// What every socket shares.
pub struct Shared {
    pub resumer: Arc<Resumer>,
    pub metrics: Arc<SocketMetrics>,
    pub limits: Limits,
}

/// What the socket reads.
#[derive(Debug)]
pub enum Target {
    /// One stream, after a position (0: from the start).
    Stream(Token, u64),
    /// Every stream of the binding; the positions given for some of them.
    Session(HashMap<Token, u64>),
}

/// The binding the socket reads as: known from the handshake, or waiting for the credential message.
pub enum Binding {
    Known([u8; 32]),
    /// The handshake's headers, completed by the first message's `authorization`.
    AwaitAuth(Box<HeaderMap>),
}

/// How a socket closes (kept with the metrics that count each code).
pub use crate::proxy::socket::metrics::Closing;

/// How a socket refused a stream closes.
fn closing_of_refusal(r: &Refusal) -> Closing {
    match r {
        Refusal::Counted(Resumption::Gap) => Closing::Gap,
        Refusal::Counted(Resumption::WatchersFull) | Refusal::Busy => Closing::Busy,
        Refusal::Store(_) => Closing::Store,
        Refusal::Counted(_) => Closing::Unknown,
    }
}

/// How a socket whose read failed closes.
fn closing_of_error(e: &WsError) -> Closing {
    match e {
        WsError::Capacity(_) => Closing::TooBig,
        WsError::Utf8(_) => Closing::InvalidData,
        WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => Closing::Gone,
        WsError::Protocol(_) => Closing::Protocol,
        WsError::ConnectionClosed | WsError::AlreadyClosed | WsError::Io(_) => Closing::Gone,
        _ => Closing::Error,
    }
}

/// How a socket whose stream ended closes.
fn closing_of_outcome(o: Outcome) -> Closing {
    match o {
        Outcome::Cancelled => Closing::Cancelled,
        Outcome::Behind => Closing::Behind,
        Outcome::Completed | Outcome::Abandoned | Outcome::Failed => Closing::Normal,
    }
}

/// A held stream read for the socket.
enum Reader {
    Local(Follow),
    Remote(RemoteFollow),
}

impl Reader {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let polled = match self {
            Reader::Local(f) => std::pin::Pin::new(f).poll_frame(cx),
            Reader::Remote(f) => std::pin::Pin::new(f).poll_frame(cx),
        };
        polled.map(|o| match o {
            Some(Ok(frame)) => Some(frame.into_data().unwrap_or_default()),
            // The readers write their failure as their last envelope; an error here ends the stream.
            Some(Err(_)) | None => None,
        })
    }
}

/// One stream the socket carries.
struct Open {
    token: Token,
    reader: Reader,
    encoder: Encoder,
    outcome: Outcome,
}

/// What the socket's streams gave in one poll.
enum Polled {
    Frame(usize, Bytes),
    Ended(usize),
}

fn poll_streams(open: &mut [Open], next: &mut usize, cx: &mut Context<'_>) -> Poll<Polled> {
    let n = open.len();
    for k in 0..n {
        // Round robin: a busy stream does not starve the others of a session.
        let i = (*next + k) % n;
        if let Poll::Ready(r) = open[i].reader.poll_frame(cx) {
            *next = (i + 1) % n;
            return Poll::Ready(match r {
                Some(frame) => Polled::Frame(i, frame),
                None => Polled::Ended(i),
            });
        }
    }
    Poll::Pending
}

/// Serves one connection from its upgrade to its close. The task's future is what an idle socket holds, sized by
/// its largest state: every rare await (opening, cancelling, the close handshake) is boxed, and the socket's
/// bounds are read from `shared`, not copied into it.
pub async fn serve(
    upgrade: Upgrading,
    // Held to the socket's end: its place under `websocket.max_sockets`.
    _reserved: Reserved,
    shared: Arc<Shared>,
    proto: Subprotocol,
    target: Target,
    binding: Binding,
    mut drain: watch::Receiver<bool>,
) {
    let io = match upgrade.on.await {
        Ok(io) => io,
        Err(e) => {
            tracing::debug!(error = %e, "the WebSocket upgrade did not complete");
            return;
        }
    };
    let kind = match target {
        Target::Stream(..) => SocketKind::Stream,
        Target::Session(_) => SocketKind::Session,
    };
    let max_message = shared.limits.max_message_bytes;
    let config = WebSocketConfig::default()
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message))
        .read_buffer_size(READ_BUFFER)
        // Written through to the wire at once (only control frames go through tungstenite): a buffer kept per
        // socket would cost every idle socket its capacity.
        .write_buffer_size(0);
    let conn = Conn::new(TokioIo::new(io), upgrade.tcp);
    let ws = WebSocketStream::from_raw_socket(Wire::new(conn), Role::Server, Some(config)).await;
    let _open = shared.metrics.opened(kind);
    let mut socket = Socket {
        ws: Box::new(Mutex::new(ws)),
        shared: Arc::clone(&shared),
        proto,
        queue: Queue::new(proto),
        behind: false,
        queued_behind: 0,
        session_id: String::new(),
        pending_since: None,
        awaiting_pong: None,
        last_heard: Instant::now(),
        peer_closed: false,
    };
    let closing = match Box::pin(socket.start(target, binding)).await {
        Ok(mut reading) => socket.run(&mut reading, &mut drain).await,
        Err(c) => c,
    };
    shared.metrics.closed(closing.code());
    let grace = shared.limits.write_timeout.min(CLOSE_GRACE);
    Box::pin(socket.close(closing, grace)).await;
}

struct Socket {
    /// tungstenite reads the connection and writes the control frames; the socket writes its messages to the
    /// wire under it (`Wire::send_texts`). Locked only where two branches of one `select!` poll it (a pending
    /// write's drain, the client's messages: both rare, never at once); elsewhere reached through `&mut`.
    /// Boxed: an idle socket's task holds the box, not the stream's room.
    ws: Box<Mutex<WebSocketStream<Wire>>>,
    shared: Arc<Shared>,
    proto: Subprotocol,
    queue: Queue,
    /// The queue filled behind a pending write: it goes out as one batch.
    behind: bool,
    /// Bytes queued since the pending write began: what `websocket.max_queued_bytes` bounds (a replay that
    /// arrived while the socket kept up is not the client falling behind).
    queued_behind: usize,
    /// seed 004's `sessionId` of a batch: the stream's token (a session's batches mix streams: empty).
    session_id: String,
    /// A write is pending since then (the socket has not flushed).
    pending_since: Option<Instant>,
    /// A ping went out then and no frame came back since.
    awaiting_pong: Option<Instant>,
    last_heard: Instant,
    /// The client sent its close frame: tungstenite queued the answer.
    peer_closed: bool,
}

/// What a client's frame asks.
enum Heard {
    Nothing,
    Cancel(Option<String>),
    Close(Closing),
}

/// What a socket reads once started: its streams, and a session's positions and binding for streams to come.
struct Reading {
    open: Vec<Open>,
    after: HashMap<Token, u64>,
    session: Option<Box<crate::resume::sessions::Session>>,
    binding: [u8; 32],
}

impl Socket {
    /// The connection, from a branch of the loop's `select!`.
    fn locked(&self) -> MutexGuard<'_, WebSocketStream<Wire>> {
        // A panic under the lock ended the task that held it: this socket's own, which is gone with it.
        self.ws.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection, held by `&mut`: no lock taken.
    fn conn(&mut self) -> &mut WebSocketStream<Wire> {
        self.ws.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// The binding (waiting for the credential message if it is not known) and the streams the socket starts
    /// with. Rare and large: its caller boxes it.
    async fn start(&mut self, target: Target, binding: Binding) -> Result<Reading, Closing> {
        let shared = Arc::clone(&self.shared);
        let limits = &shared.limits;
        let binding = match binding {
            Binding::Known(b) => b,
            Binding::AwaitAuth(headers) => self.auth(*headers, limits.auth_timeout).await?,
        };
        let r = &shared.resumer;
        let mut reading = Reading {
            // A stream's socket holds one (a first push would make room for four of these 264-byte entries).
            open: Vec::with_capacity(usize::from(matches!(target, Target::Stream(..)))),
            after: HashMap::new(),
            session: None,
            binding,
        };
        match target {
            Target::Stream(token, at) => {
                self.session_id = token.hex();
                reading.open.push(self.open(r, token, binding, at).await?);
            }
            Target::Session(positions) => {
                reading.after = positions;
                let bounds = SessionLimits {
                    max_sessions: limits.max_sessions,
                    max_listed: limits.max_streams_per_session,
                };
                let s = match r.session(binding, bounds).await {
                    Ok(s) => s,
                    Err(SessionError::Full) => return Err(Closing::Busy),
                    Err(SessionError::Store(_)) => return Err(Closing::Store),
                };
                let listed: Vec<_> = s.listed().iter().map(|l| (l.token, l.ended)).collect();
                for (token, ended) in listed {
                    // An ended stream is read again only where the client asks to go on after a position.
                    if ended && !reading.after.contains_key(&token) {
                        continue;
                    }
                    if reading.open.len() >= limits.max_streams_per_session {
                        self.shared.metrics.session_full.inc();
                        break;
                    }
                    let at = reading.after.remove(&token).unwrap_or(0);
                    if let Ok(o) = self.open(r, token, binding, at).await {
                        self.announce(&o.token);
                        reading.open.push(o);
                    }
                }
                // Boxed: a stream's socket (the common one) holds no room for it.
                reading.session = Some(Box::new(s));
            }
        }
        Ok(reading)
    }

    /// The socket's life once started: what its streams send, what the client says, pings, until it closes.
    async fn run(&mut self, reading: &mut Reading, drain: &mut watch::Receiver<bool>) -> Closing {
        // By reference: an async fn's arguments are kept beside what it makes of them.
        let Reading {
            open,
            after,
            session,
            binding,
        } = reading;
        let binding = *binding;
        let shared = Arc::clone(&self.shared);
        let (limits, r) = (&shared.limits, &shared.resumer);
        let mut next = 0;
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + limits.ping_interval, limits.ping_interval);
        ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Made once: a wait made anew each turn of the loop (each event) would lock the watch and register its
        // waker again (about 1,200 instructions an event); boxed, so the socket's task does not hold its room.
        let mut drained = Box::pin(draining(drain));
        // Frames taken from the streams since the rest was last polled first (see `FAIR_TURN`).
        let mut streak = 0;
        // The drain, the client's messages and the ping timer wake the task through `rare`, and are polled only
        // after one of them did (or after one of them was ready: it may be again at once).
        let rare = Arc::new(Rare::default());
        let rare_waker = Waker::from(Arc::clone(&rare));
        loop {
            if let Some(c) = self.flush_queue() {
                return c;
            }
            let pending = self.pending_since;
            let write_deadline = pending.map(|p| tokio::time::Instant::from_std(p + limits.write_timeout));
            // The bound is on what queues behind a pending write; while the socket keeps up, nothing waits.
            let room = pending.is_none() || self.queued_behind < limits.max_queued_bytes;
            let rare_due = rare.due();
            let streams = room && !open.is_empty() && streak < FAIR_TURN;
            // A quiet turn (a stream's socket, no write pending, nothing rare due): only the stream can be ready
            // and only `rare` wakes the task for the rest, so nothing else is polled. The `select!` makes and drops
            // every branch's future each turn, disabled ones too: at the wall-clock load that was a fifth of the
            // socket's own time (BENCHMARKS.md, 2026-11-29 tenth session).
            let polled = if streams && pending.is_none() && !rare_due && session.is_none() {
                poll_fn(|cx| match poll_streams(open, &mut next, cx) {
                    Poll::Ready(polled) => Poll::Ready(Some(polled)),
                    Poll::Pending => rare.poll_woke(cx).map(|()| None),
                })
                .await
            } else {
                tokio::select! {
                    biased;
                    flushed = poll_fn(|cx| self.locked().poll_flush_unpin(cx)), if pending.is_some() => {
                        if flushed.is_err() {
                            return Closing::Error;
                        }
                        self.pending_since = None;
                        self.queued_behind = 0;
                        None
                    }
                    () = passed(write_deadline), if write_deadline.is_some() => {
                        self.shared.metrics.write_timeouts.inc();
                        return Closing::Behind;
                    }
                    polled = poll_fn(|cx| poll_streams(open, &mut next, cx)), if streams => Some(polled),
                    // The first of the rare sources' branches arms `rare` for all of them.
                    () = poll_fn(|cx| {
                        rare.arm(cx);
                        drained.as_mut().poll(&mut Context::from_waker(&rare_waker))
                    }), if rare_due => return Closing::GoingAway,
                    heard = poll_fn(|_| self.locked().poll_next_unpin(&mut Context::from_waker(&rare_waker))), if rare_due => {
                        // More may be read already.
                        rare.again();
                        match self.heard(heard) {
                            Heard::Nothing => {}
                            Heard::Close(c) => return c,
                            Heard::Cancel(which) => {
                                let token = match (&which, open.first()) {
                                    (Some(hex), _) => Token::parse(hex),
                                    (None, Some(o)) if session.is_none() => Some(o.token),
                                    _ => None,
                                };
                                if let Some(token) = token {
                                    // The stream's own end (`stream_cancelled`) tells the socket, as any reader.
                                    let _ = Box::pin(r.cancel(&token, binding)).await;
                                }
                            }
                        }
                        None
                    }
                    started = next_start(session), if session.is_some() => {
                        match started {
                            // Told twice (a listing racing an announcement): already carried.
                            Some(token) if open.iter().any(|o| o.token == token) => {}
                            Some(token) if open.len() < limits.max_streams_per_session => {
                                let at = after.remove(&token).unwrap_or(0);
                                if let Ok(o) = self.open(r, token, binding, at).await {
                                    self.announce(&o.token);
                                    open.push(o);
                                }
                            }
                            Some(_) => self.shared.metrics.session_full.inc(),
                            None => return Closing::GoingAway,
                        }
                        None
                    }
                    _ = poll_fn(|_| ping.poll_tick(&mut Context::from_waker(&rare_waker))), if rare_due => {
                        // The next tick is armed by the next poll.
                        rare.again();
                        if let Some(since) = self.awaiting_pong {
                            if since.elapsed() >= limits.pong_timeout {
                                self.shared.metrics.pong_timeouts.inc();
                                return Closing::Policy;
                            }
                        } else if self.last_heard.elapsed() >= limits.ping_interval && self.pending_since.is_none() {
                            self.awaiting_pong = Some(Instant::now());
                            if self.conn().feed(Message::Ping(Bytes::new())).await.is_err() {
                                return Closing::Error;
                            }
                            self.pending_since = Some(Instant::now());
                        }
                        None
                    }
                    // Every `FAIR_TURN` frames, the rest is polled first even when the streams have more (their
                    // wakers registered, a drain or a cancel seen), and this ends the turn if none of it is ready.
                    () = std::future::ready(()), if streak >= FAIR_TURN => {
                        streak = 0;
                        None
                    }
                    // Nothing rare is due: this ends the turn when one of them wakes the task.
                    () = poll_fn(|cx| rare.poll_woke(cx)), if !rare_due => None,
                }
            };
            let Some(polled) = polled else {
                continue;
            };
            streak += 1;
            match polled {
                Polled::Frame(i, frame) => {
                    let before = self.queue.len_bytes();
                    if let Err(c) = self.frame(&mut open[i], &frame) {
                        return c;
                    }
                    if self.pending_since.is_some() {
                        self.queued_behind += self.queue.len_bytes().saturating_sub(before);
                    }
                }
                Polled::Ended(i) => {
                    let ended = open.swap_remove(i);
                    let outcome = self.ended(ended, session.is_some());
                    if session.is_none() {
                        // The last messages go out before the close.
                        if let Err(c) = self.finish_writes(limits.write_timeout).await {
                            return c;
                        }
                        return closing_of_outcome(outcome);
                    }
                }
            }
            if self.queued_behind >= limits.max_queued_bytes {
                self.shared.metrics.queue_full.inc();
                return Closing::Behind;
            }
        }
    }

    /// Waits for the credential message of a stream bound to `Authorization` and makes the binding with it.
    async fn auth(&mut self, mut headers: HeaderMap, timeout: Duration) -> Result<[u8; 32], Closing> {
        let deadline = tokio::time::Instant::now() + timeout;
        let text = loop {
            let Ok(heard) = tokio::time::timeout_at(deadline, self.conn().next()).await else {
                self.shared.metrics.auth_timeouts.inc();
                return Err(Closing::Policy);
            };
            match heard {
                Some(Ok(Message::Text(t))) => break t,
                // A protocol ping is not the first message: its pong (queued by tungstenite) is written now, within
                // the same deadline, so a client that pings and reads nothing gains neither time nor memory.
                Some(Ok(Message::Ping(_))) => match tokio::time::timeout_at(deadline, self.conn().flush()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return Err(Closing::Gone),
                    Err(_) => {
                        self.shared.metrics.auth_timeouts.inc();
                        return Err(Closing::Policy);
                    }
                },
                Some(Ok(Message::Pong(_))) => {}
                Some(Ok(Message::Close(frame))) => return Err(self.peer_closed(frame.as_ref())),
                Some(Ok(_)) => return Err(Closing::Policy),
                Some(Err(e)) => return Err(self.failed(&e)),
                None => return Err(Closing::Gone),
            }
        };
        let Some(FromClient::Auth(credential)) = messages::from_client(text.as_str()) else {
            return Err(Closing::Policy);
        };
        let Ok(value) = http::HeaderValue::from_str(&credential) else {
            return Err(Closing::Policy);
        };
        self.last_heard = Instant::now();
        headers.insert(http::header::AUTHORIZATION, value);
        Ok(self.shared.resumer.binding(&headers))
    }

    /// Opens `token` for this socket (a watcher's cursor, so the run is never held back by it).
    async fn open(&mut self, r: &Resumer, token: Token, binding: [u8; 32], after: u64) -> Result<Open, Closing> {
        let metrics = Arc::clone(&r.metrics);
        let reader = match Box::pin(r.open(&token, binding, after, false)).await {
            Ok(Opened::Local(stream, cursor)) => Reader::Local(Follow::new(stream, cursor, metrics, Instant::now())),
            Ok(Opened::Remote(reader)) => Reader::Remote(RemoteFollow::new(*reader, after, metrics, Instant::now())),
            Err(refusal) => {
                if let Refusal::Counted(why) = &refusal {
                    r.metrics.resumption(*why);
                }
                return Err(closing_of_refusal(&refusal));
            }
        };
        r.metrics.resumption(Resumption::Replayed);
        let hex = token.hex();
        Ok(Open {
            token,
            reader,
            encoder: Encoder::new(self.proto, &hex, self.shared.limits.max_queued_bytes),
            outcome: Outcome::Completed,
        })
    }

    /// A session's word that it carries `token` from now on.
    fn announce(&mut self, token: &Token) {
        let (proto, hex) = (self.proto, token.hex());
        let url = self.shared.resumer.url(token);
        self.queue.push(|out| messages::stream_start(proto, &hex, &url, out));
    }

    /// A frame's messages: one event alone while nothing is queued or pending (the paced stream) written straight
    /// to the wire, the held envelope not copied to join the message around it; otherwise queued (a burst goes out
    /// `MAX_FRAMES` to a write, or as a batch behind a pending write).
    fn frame(&mut self, open: &mut Open, frame: &[u8]) -> Result<(), Closing> {
        let mut events = messages::events(frame).peekable();
        while let Some(ev) = events.next() {
            if let Some(o) = Outcome::of_error(ev.data) {
                open.outcome = o;
            }
            if self.pending_since.is_none() && self.queue.is_empty() && events.peek().is_none() {
                if let Some(parts) = open.encoder.event_parts(&ev) {
                    self.shared.metrics.sent_apart(1);
                    let sent = self.conn().get_mut().send_text_parts(&parts);
                    self.wrote(sent)?;
                    continue;
                }
            }
            self.event(open, &ev);
        }
        Ok(())
    }

    /// After a write: the rest of one the connection did not take whole is pending, and what comes meanwhile
    /// queues and goes out as one batch after it; a write taken whole leaves nothing to batch.
    fn wrote(&mut self, sent: std::io::Result<bool>) -> Result<(), Closing> {
        let whole = sent.map_err(|_| Closing::Error)?;
        self.behind = !whole;
        if !whole {
            self.pending_since = Some(Instant::now());
        }
        Ok(())
    }

    fn event(&mut self, open: &mut Open, ev: &Event<'_>) {
        let encoder = &mut open.encoder;
        self.queue.push(|out| encoder.event(ev, out));
    }

    /// A stream ended: its last words (agent-sdk's `agent:complete`, a session's `stream_end`).
    fn ended(&mut self, mut open: Open, session: bool) -> Outcome {
        let outcome = open.outcome;
        if outcome == Outcome::Completed {
            let encoder = &mut open.encoder;
            self.queue.push(|out| encoder.completed(out));
        }
        if session {
            let (proto, hex) = (self.proto, open.token.hex());
            self.queue.push(|out| messages::stream_end(proto, &hex, outcome, out));
        }
        outcome
    }

    /// Writes what queued while no write is pending: each message on its own while the connection takes them
    /// (up to `MAX_FRAMES` in one write), what queued behind a pending write as one batch once it is written.
    fn flush_queue(&mut self) -> Option<Closing> {
        while self.pending_since.is_none() && !self.queue.is_empty() {
            let batch = if std::mem::take(&mut self.behind) {
                self.queue.take_batch(&self.session_id)
            } else {
                None
            };
            let mut texts: [&[u8]; MAX_FRAMES] = [&[]; MAX_FRAMES];
            let count = match &batch {
                Some((b, n)) => {
                    self.shared.metrics.sent(*n);
                    texts[0] = b;
                    1
                }
                None => {
                    let n = texts.iter_mut().zip(self.queue.messages()).map(|(t, m)| *t = m).count();
                    self.shared.metrics.sent_apart(n);
                    n
                }
            };
            // The queue's messages are lent to the write: the connection reached by its field, not `conn()`.
            let sent = self
                .ws
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut()
                .send_texts(&texts[..count]);
            if let Err(c) = self.wrote(sent) {
                return Some(c);
            }
            if batch.is_none() {
                self.queue.pop(count);
            }
        }
        None
    }

    /// Writes everything still queued, after the pending write if there is one: a queue left behind a pending
    /// write would be lost by the close. Bounded by `websocket.write_timeout_secs` as any write.
    async fn finish_writes(&mut self, timeout: Duration) -> Result<(), Closing> {
        let all = async {
            loop {
                if self.pending_since.is_some() {
                    self.conn().flush().await.map_err(|_| Closing::Error)?;
                    self.pending_since = None;
                }
                if self.queue.is_empty() {
                    return Ok(());
                }
                if let Some(c) = self.flush_queue() {
                    return Err(c);
                }
            }
        };
        match tokio::time::timeout(timeout, all).await {
            Ok(done) => done,
            Err(_) => {
                self.shared.metrics.write_timeouts.inc();
                Err(Closing::Behind)
            }
        }
    }

    /// What a client's frame asks.
    fn heard(&mut self, heard: Option<Result<Message, WsError>>) -> Heard {
        self.last_heard = Instant::now();
        self.awaiting_pong = None;
        let msg = match heard {
            // The connection ended (a close frame comes first as a message).
            None => return Heard::Close(Closing::Gone),
            Some(Err(e)) => return Heard::Close(self.failed(&e)),
            Some(Ok(m)) => m,
        };
        self.shared.metrics.received.inc();
        match msg {
            Message::Text(t) => match messages::from_client(t.as_str()) {
                Some(FromClient::Cancel(which)) => Heard::Cancel(which),
                Some(FromClient::Ping) => {
                    self.queue.push(|out| {
                        out.extend_from_slice(b"{\"type\":\"pong\"}");
                        true
                    });
                    Heard::Nothing
                }
                Some(FromClient::Auth(_)) | None => Heard::Close(Closing::Unsupported),
            },
            Message::Ping(data) => match self.owe_pong(data.len()) {
                Some(c) => Heard::Close(c),
                None => Heard::Nothing,
            },
            // A pong only says the client is there (`last_heard`, above); nothing to write.
            Message::Pong(_) => Heard::Nothing,
            Message::Close(frame) => Heard::Close(self.peer_closed(frame.as_ref())),
            Message::Binary(_) | Message::Frame(_) => Heard::Close(Closing::Unsupported),
        }
    }

    /// How a socket whose read failed closes, counted.
    fn failed(&self, e: &WsError) -> Closing {
        let closing = closing_of_error(e);
        if closing == Closing::TooBig {
            self.shared.metrics.too_big.inc();
        }
        closing
    }

    /// The client's close frame: tungstenite queued the answer (the client's code back, or 1002 for one RFC 6455
    /// does not allow on the wire, such as 1005 or 999), which [`Socket::close`] writes.
    fn peer_closed(&mut self, frame: Option<&CloseFrame>) -> Closing {
        self.peer_closed = true;
        match frame {
            Some(f) if f.code == CloseCode::Protocol => Closing::Protocol,
            _ => Closing::Normal,
        }
    }

    /// Counts the pong owed for a ping with `payload` bytes. tungstenite answers pings itself, writing each pong
    /// with the next flush into the wire's queue, which keeps what the connection does not take: pongs count
    /// against the bound of what queues behind a pending write, as events do, or a client that pings and never
    /// reads would grow that queue by about one byte for each byte it sends.
    fn owe_pong(&mut self, payload: usize) -> Option<Closing> {
        // A control frame's payload is at most 125 bytes: its header is two.
        self.queued_behind += payload + 2;
        if self.queued_behind >= self.shared.limits.max_queued_bytes {
            self.shared.metrics.queue_full.inc();
            return Some(Closing::Behind);
        }
        // The flush that writes it is awaited as any write (`websocket.write_timeout_secs`).
        self.pending_since.get_or_insert_with(Instant::now);
        None
    }

    /// Ends the connection with the close handshake: the socket's close frame (or the answer tungstenite queued
    /// to the client's), then the client's answer, then the TCP close (RFC 6455 §7.1.1: a client whose TCP
    /// connection is dropped first reports 1006). A client that takes nothing has `grace`.
    async fn close(self, closing: Closing, grace: Duration) {
        let peer_closed = self.peer_closed;
        let mut ws = (*self.ws).into_inner().unwrap_or_else(PoisonError::into_inner);
        if closing == Closing::Gone {
            return;
        }
        let handshake = async {
            if !peer_closed {
                let frame = CloseFrame {
                    code: CloseCode::from(closing.code()),
                    reason: closing.reason().into(),
                };
                // Queued at once, behind a pending write (`send` would wait for the socket to take that first): the
                // close frame is the one write allowed past the queue's bound, so a socket that fell behind finds
                // its 4003 after what it had not read.
                if ws.start_send_unpin(Message::Close(Some(frame))).is_err() {
                    return;
                }
            }
            if ws.flush().await.is_err() {
                return;
            }
            // Whatever waits in the wire goes out before the TCP close: tungstenite writes its answer to the
            // client's close frame there and ends without flushing it (a server closes the connection first).
            if poll_fn(|cx| ws.get_mut().poll_drain(cx)).await.is_err() {
                return;
            }
            // The client's close frame (whatever it sent before it is read past), then the connection's end.
            while let Some(Ok(_)) = ws.next().await {}
        };
        let _ = tokio::time::timeout(grace, handshake).await;
    }
}

/// The next stream of a session's binding to start.
/// Ready once `at` has passed (never without one). An async fn, not a `Sleep`: `select!` makes every branch's
/// future each turn, also a disabled one's, and a `Sleep` made and dropped costs a turn (each event) a clock read
/// and a clone of the runtime's handle.
async fn passed(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn next_start(session: &mut Option<Box<crate::resume::sessions::Session>>) -> Option<Token> {
    match session {
        Some(s) => s.next_start().await,
        None => std::future::pending().await,
    }
}

/// The streams' frames are polled before the drain, the client's messages and the timers (only a pending write's
/// flush and deadline come first), so an event wakes the socket to one poll, not to a poll of each of those too;
/// at most this many in a row, then the rest is polled first once, so a stream that always has more cannot
/// starve a drain, a cancel or a pong.
const FAIR_TURN: u32 = 32;

/// Wakes a socket's task for its rare sources (the drain, the client's messages, the ping timer) and marks that
/// one of them did: an event wakes the task through its stream instead, and is then not a reason to poll them
/// (a poll of the client's half of the connection alone is about 2,000 instructions).
struct Rare {
    woke: AtomicBool,
    task: AtomicWaker,
}

impl Default for Rare {
    /// Due at first: the rare sources have not been polled yet.
    fn default() -> Self {
        Self {
            woke: AtomicBool::new(true),
            task: AtomicWaker::new(),
        }
    }
}

impl Rare {
    /// Before the rare sources are polled: the task is to be woken, and what woke it is about to be seen.
    fn arm(&self, cx: &Context<'_>) {
        self.task.register(cx.waker());
        self.woke.store(false, Ordering::Release);
    }

    /// After one of the rare sources was ready: they are polled again next turn.
    fn again(&self) {
        self.woke.store(true, Ordering::Release);
    }

    /// Whether a rare source woke the task (or was ready) since they were last polled.
    fn due(&self) -> bool {
        self.woke.load(Ordering::Acquire)
    }

    /// Ready once a rare source woke the task.
    fn poll_woke(&self, cx: &Context<'_>) -> Poll<()> {
        self.task.register(cx.waker());
        if self.due() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl std::task::Wake for Rare {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woke.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// Until the drain starts (never, if its sender is gone).
async fn draining(drain: &mut watch::Receiver<bool>) {
    if drain.wait_for(|d| *d).await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Args = (
        Upgrading,
        Reserved,
        Arc<Shared>,
        Subprotocol,
        Target,
        Binding,
        watch::Receiver<bool>,
    );

    fn future_size<Fut>(_: impl FnOnce(Args) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// The socket's task is what every idle socket holds (issue 38: 2.8 KiB with its rare awaits inline, the
    /// bounds copied twice and the start's arguments kept beside the loop's state).
    #[test]
    fn a_sockets_task_holds_at_most_1_5_kib() {
        let size = future_size(|(u, r, s, p, t, b, d): Args| serve(u, r, s, p, t, b, d));
        assert!(size <= 1536, "the socket's task future is {size} bytes");
    }
}
