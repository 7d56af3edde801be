//! Following: a subscriber's stream read from the hub — a reconnection (the original's primary again) or a
//! watcher — replaying what it missed, then the events as the writer holds them, then the stream's end; and
//! `RemoteFollow`, the same read from the shared store on an instance that does not hold the stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::proxy::base::drain::{write_draining_envelope, DrainCut, DRAINING_MESSAGE};
use crate::proxy::base::flushes::Flushes;
use crate::proxy::body::layer::{Drain, Ending, Layer, Polled};
use crate::resume::hub::{gateway_error, Cursor, Read, Stream, BEHIND};
use crate::resume::metrics::{End, Limit, ResumeMetrics};
use crate::resume::redis::{ReadError, RemoteReader};

/// What both kinds of subscriber count: events and bytes replayed, and the time to the first replayed byte.
struct Replay {
    metrics: Arc<ResumeMetrics>,
    /// When the request came, until its first byte is sent.
    asked: Option<Instant>,
}

impl Replay {
    /// Counts `events` sent in `bytes`; `replayed`: held before the subscriber came.
    fn sent(&mut self, bytes: usize, events: u64, replayed: bool) {
        if !replayed {
            // Nothing to replay: the first byte waited for the run, which is not what the latency measures.
            self.asked = None;
            return;
        }
        self.metrics.replayed_events.inc_by(events);
        self.metrics.replayed_bytes.inc_by(bytes as u64);
        if let Some(asked) = self.asked.take() {
            self.metrics.first_replayed_byte.observe(asked.elapsed().as_secs_f64());
        }
    }
}

/// The stream's last frame at the drain deadline: a `gateway_draining` envelope without an id, so the client
/// resumes from its last event elsewhere.
fn draining(agent: &str) -> DrainCut {
    let mut out = Vec::new();
    write_draining_envelope(&mut out, agent, DRAINING_MESSAGE);
    DrainCut::Final(Bytes::from(out))
}

/// One subscriber of a held stream.
pub struct Follow {
    stream: Arc<Stream>,
    cursor: Cursor,
    replay: Replay,
    done: bool,
    /// A watcher's write watch and its connection's flushes, once it has its connection.
    stall: Option<(Arc<Stall>, Arc<Flushes>)>,
}

/// Whether a watcher's client reads. The connection polls a body only when it has written what it was given
/// (or has room for more), and says when all of it is written (`Flushes`): frames handed out, no flush since,
/// and no poll for `resume.watcher_write_timeout_secs` means the client has left them unread that long. The body
/// cannot act then (it is not polled): a small task per watcher (`watchdog`) looks when the timeout would pass
/// and asks the connection to be dropped.
struct Stall {
    since: Instant,
    /// The last poll: milliseconds after `since`.
    polled: AtomicU64,
    /// The connection's flush count at the last poll.
    epoch: AtomicU64,
    /// Frames were handed out since that flush count was seen.
    unflushed: AtomicBool,
}

impl Stall {
    fn ms(&self) -> u64 {
        u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Until the watcher ends: drops its connection once frames it handed out stayed unwritten, with no poll, for
/// `timeout`.
async fn watchdog(stall: Weak<Stall>, flushes: Arc<Flushes>, timeout: Duration, metrics: Arc<ResumeMetrics>) {
    let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    loop {
        let Some(s) = stall.upgrade() else { return };
        let now = s.ms();
        let waiting = s.unflushed.load(Ordering::Acquire) && flushes.epoch() == s.epoch.load(Ordering::Acquire);
        let due = s.polled.load(Ordering::Acquire).saturating_add(timeout_ms);
        if waiting && now >= due {
            tracing::debug!("a watcher's client read nothing for resume.watcher_write_timeout_secs: closed");
            metrics.limited(Limit::WatcherStalled);
            flushes.drop_connection();
            return;
        }
        let next = if waiting { due } else { now.saturating_add(timeout_ms) };
        let at = tokio::time::Instant::from_std(s.since) + Duration::from_millis(next.max(now + 10));
        drop(s);
        tokio::time::sleep_until(at).await;
    }
}

impl Follow {
    pub fn new(stream: Arc<Stream>, cursor: Cursor, metrics: Arc<ResumeMetrics>, asked: Instant) -> Self {
        Self {
            stream,
            cursor,
            replay: Replay {
                metrics,
                asked: Some(asked),
            },
            done: false,
            stall: None,
        }
    }

    /// A watcher's connection: dropped when its client leaves frames unread for the stream's
    /// `watcher_write_timeout` (a reconnection is not watched: a primary that reads nothing holds the upstream
    /// back, which is backpressure, not a leak).
    pub fn watch_connection(&mut self, flushes: &Arc<Flushes>) {
        if self.cursor.is_primary() || self.stall.is_some() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let stall = Arc::new(Stall {
            since: Instant::now(),
            polled: AtomicU64::new(0),
            epoch: AtomicU64::new(flushes.epoch()),
            unflushed: AtomicBool::new(false),
        });
        rt.spawn(watchdog(
            Arc::downgrade(&stall),
            Arc::clone(flushes),
            self.stream.limits().watcher_write_timeout,
            Arc::clone(&self.replay.metrics),
        ));
        self.stall = Some((stall, Arc::clone(flushes)));
    }
}

impl Body for Follow {
    type Data = Bytes;
    type Error = crate::proxy::upstream::error::StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // Polled: the connection wrote what it was given, or has room for more.
        if let Some((s, flushes)) = &this.stall {
            s.polled.store(s.ms(), Ordering::Release);
            let epoch = flushes.epoch();
            if s.epoch.swap(epoch, Ordering::AcqRel) != epoch {
                s.unflushed.store(false, Ordering::Release);
            }
        }
        let read = std::task::ready!(this.stream.poll_read(&mut this.cursor, cx));
        let bytes = match read {
            Read::Events(bytes, events, replayed) => {
                this.replay.sent(bytes.len(), events, replayed);
                bytes
            }
            Read::Behind => {
                this.done = true;
                this.replay.metrics.watchers_closed.inc();
                gateway_error(&this.stream.agent(), "watcher_behind", BEHIND)
            }
            Read::End => {
                this.done = true;
                return Poll::Ready(None);
            }
        };
        if let Some((s, _)) = &this.stall {
            s.unflushed.store(true, Ordering::Release);
        }
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drain for Follow {
    fn cut_for_drain(&mut self) -> DrainCut {
        if self.done {
            return DrainCut::Nothing;
        }
        self.done = true;
        draining(&self.stream.agent())
    }
}

impl Layer for Follow {
    fn ending(&mut self) -> Ending {
        Ending::Completed
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.stream.detach(&self.cursor);
    }
}

/// The next read of a remote reader, which gives the reader back with what it read.
type NextRead = Pin<Box<dyn Future<Output = (RemoteReader, Result<Option<(Bytes, u64)>, ReadError>)> + Send>>;

/// A subscriber on an instance that does not hold the stream: its events read from the shared store, the run's
/// loss (its owner died) said by an `error` envelope, never a silent end.
pub struct RemoteFollow {
    next: Option<NextRead>,
    replay: Replay,
    /// The seq of the last event sent (the reader's cursor).
    seq: u64,
    /// The stream's agent as the store holds it, for the envelopes the gateway writes.
    agent: String,
}

impl RemoteFollow {
    /// A reader opened after event `after`.
    pub fn new(reader: RemoteReader, after: u64, metrics: Arc<ResumeMetrics>, asked: Instant) -> Self {
        Self {
            agent: reader.agent().to_owned(),
            next: Some(Self::read(reader)),
            replay: Replay {
                metrics,
                asked: Some(asked),
            },
            seq: after,
        }
    }

    fn read(mut reader: RemoteReader) -> NextRead {
        Box::pin(async move {
            let r = reader.next().await;
            (reader, r)
        })
    }
}

impl Body for RemoteFollow {
    type Data = Bytes;
    type Error = crate::proxy::upstream::error::StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        let Some(next) = this.next.as_mut() else {
            return Poll::Ready(None);
        };
        let (reader, read) = std::task::ready!(next.as_mut().poll(cx));
        this.next = None;
        // The owner may have learnt the run's agent since (its meta_init): each read brings the stored one.
        if reader.agent() != this.agent {
            this.agent = reader.agent().to_owned();
        }
        let bytes = match read {
            Ok(Some((bytes, last_seq))) => {
                this.next = Some(Self::read(reader));
                // Read from the store on another instance: all of it counts as replayed.
                this.replay.sent(bytes.len(), last_seq.saturating_sub(this.seq), true);
                this.seq = last_seq;
                bytes
            }
            Ok(None) => return Poll::Ready(None),
            Err(e) => {
                let (kind, message) = match e {
                    ReadError::Lost => {
                        this.replay.metrics.ended(End::Lost);
                        ("upstream_lost", LOST)
                    }
                    ReadError::Gap { .. } => {
                        this.replay.metrics.watchers_closed.inc();
                        ("watcher_behind", BEHIND)
                    }
                    ReadError::Store(_) | ReadError::NotText { .. } => ("resume_store_failed", STORE_FAILED),
                };
                tracing::warn!(kind, "remote stream read ended");
                gateway_error(&this.agent, kind, message)
            }
        };
        Poll::Ready(Some(Ok(Frame::data(bytes))))
    }

    fn is_end_stream(&self) -> bool {
        self.next.is_none()
    }
}

impl Drain for RemoteFollow {
    fn cut_for_drain(&mut self) -> DrainCut {
        if self.next.take().is_none() {
            return DrainCut::Nothing;
        }
        draining(&self.agent)
    }
}

impl Layer for RemoteFollow {
    fn ending(&mut self) -> Ending {
        Ending::Completed
    }
}

/// The `message` of the envelope that ends a remote read whose run's owner went away.
const LOST: &str = "the gateway instance running this stream went away; its stored events were all sent";
/// The `message` of the envelope that ends a remote read the store failed.
const STORE_FAILED: &str = "the shared stream store failed; reconnect to continue";
