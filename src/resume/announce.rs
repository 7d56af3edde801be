//! Session announcements across instances (`resume.store = "redis"`): the owner of a new stream publishes it on
//! its binding's channel (`redis`); here, ONE pub/sub connection per instance is subscribed to the channels of
//! the bindings that have sessions on this instance (on the first session, off after the last) and hands what
//! other instances announce to a [`Listener`] (the sessions).
//!
//! The connection speaks RESP3 (Redis 6 or later, Valkey), whose pushes the redis crate delivers on a tokio
//! channel. When it drops, it is made again with a backoff ([`RECONNECT_FIRST`] doubling up to
//! [`RECONNECT_MAX`]) and subscribed again to every channel still wanted: what was announced meanwhile is not
//! told to the sessions open then (they list only once, when they open).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot};

use super::id::Token;
use super::redis::{round_trip, start_channel, RedisOptions, RedisStore, StoreError, StoreObserver, StoreOp};

/// The first pause before a dropped pub/sub connection is made again.
pub const RECONNECT_FIRST: Duration = Duration::from_millis(100);
/// The longest pause between two tries.
pub const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Told of every stream another instance announces on a binding that has sessions here.
pub trait Listener: Send + Sync {
    fn announced(&self, binding: [u8; 32], token: Token);
}

enum Cmd {
    /// One more session of `binding`: answered once Redis confirmed the subscription.
    Join {
        binding: [u8; 32],
        done: oneshot::Sender<Result<(), StoreError>>,
    },
    /// One session of `binding` fewer.
    Leave { binding: [u8; 32] },
}

/// The handle of the pub/sub task; the task ends when every handle is gone or the listener is.
#[derive(Clone)]
pub struct Subscriber {
    tx: mpsc::UnboundedSender<Cmd>,
}

/// A handle that does not keep the task alive (a session's, to leave when it is dropped).
#[derive(Clone)]
pub struct WeakSubscriber {
    tx: mpsc::WeakUnboundedSender<Cmd>,
}

impl Subscriber {
    /// Starts the task (it connects on the first session). Needs a tokio runtime.
    pub fn spawn(store: &RedisStore, listener: Weak<dyn Listener>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut info = store.client().get_connection_info().clone();
        info.redis.protocol = ProtocolVersion::RESP3;
        let task = Task {
            client: Client::open(info).ok(),
            opts: store.options().clone(),
            observer: Arc::clone(store.observer()),
            instance: store.instance().to_owned(),
            listener,
            wanted: HashMap::new(),
            conn: None,
            pushes: None,
            backoff: RECONNECT_FIRST,
            retry_at: None,
        };
        tokio::spawn(task.run(rx));
        Self { tx }
    }

    /// Subscribes to `binding`'s announcements (or counts one more session there); returns once Redis confirmed
    /// it, so a stream indexed after this is announced here.
    pub async fn join(&self, binding: [u8; 32]) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        let gone = || StoreError::Reply {
            op: "subscribe",
            what: "the announcements task is gone".to_owned(),
        };
        self.tx.send(Cmd::Join { binding, done }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    pub fn downgrade(&self) -> WeakSubscriber {
        WeakSubscriber {
            tx: self.tx.downgrade(),
        }
    }
}

impl WeakSubscriber {
    /// One session of `binding` fewer (after a successful `join`).
    pub fn leave(&self, binding: [u8; 32]) {
        if let Some(tx) = self.tx.upgrade() {
            let _ = tx.send(Cmd::Leave { binding });
        }
    }
}

/// A channel wanted: its binding and how many sessions want it.
struct Wanted {
    binding: [u8; 32],
    sessions: usize,
}

struct Task {
    /// The store's client, speaking RESP3 (`None`: its address did not take RESP3, which never happens).
    client: Option<Client>,
    opts: RedisOptions,
    observer: Arc<dyn StoreObserver>,
    instance: String,
    listener: Weak<dyn Listener>,
    /// By channel name. While `conn` is set, every one of them is subscribed on it.
    wanted: HashMap<String, Wanted>,
    conn: Option<MultiplexedConnection>,
    pushes: Option<mpsc::UnboundedReceiver<PushInfo>>,
    backoff: Duration,
    /// When to make a dropped connection again (while channels are wanted).
    retry_at: Option<tokio::time::Instant>,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Cmd>) {
        loop {
            let retry_at = self.retry_at.filter(|_| self.conn.is_none() && !self.wanted.is_empty());
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Join { binding, done }) => {
                        let result = self.join(binding).await;
                        let _ = done.send(result);
                    }
                    Some(Cmd::Leave { binding }) => self.leave(binding).await,
                    None => return,
                },
                push = recv(&mut self.pushes) => match push {
                    Some(push) => {
                        if !self.deliver(push) {
                            return;
                        }
                    }
                    None => self.dropped(),
                },
                () = sleep_until(retry_at) => {
                    if self.connect().await.is_err() {
                        self.dropped();
                    }
                }
            }
        }
    }

    async fn join(&mut self, binding: [u8; 32]) -> Result<(), StoreError> {
        let channel = start_channel(&self.opts.key_prefix, &binding);
        if let Some(w) = self.wanted.get_mut(&channel) {
            if self.conn.is_some() {
                w.sessions += 1;
                return Ok(());
            }
        }
        let result = match self.conn.is_some() {
            true => self.subscribe(std::slice::from_ref(&channel)).await,
            // Connecting subscribes to every wanted channel, this one too.
            false => {
                self.wanted
                    .entry(channel.clone())
                    .or_insert(Wanted { binding, sessions: 0 });
                self.connect().await
            }
        };
        match result {
            Ok(()) => {
                self.wanted
                    .entry(channel)
                    .or_insert(Wanted { binding, sessions: 0 })
                    .sessions += 1;
                Ok(())
            }
            Err(e) => {
                if self.wanted.get(&channel).is_some_and(|w| w.sessions == 0) {
                    self.wanted.remove(&channel);
                }
                self.dropped();
                Err(e)
            }
        }
    }

    async fn leave(&mut self, binding: [u8; 32]) {
        let channel = start_channel(&self.opts.key_prefix, &binding);
        let Some(w) = self.wanted.get_mut(&channel) else { return };
        w.sessions = w.sessions.saturating_sub(1);
        if w.sessions > 0 {
            return;
        }
        self.wanted.remove(&channel);
        if let Some(conn) = self.conn.as_mut() {
            let mut cmd = redis::cmd("UNSUBSCRIBE");
            cmd.arg(&channel);
            let unsubscribing = cmd.exec_async(conn);
            if round_trip(
                self.observer.as_ref(),
                StoreOp::Subscribe,
                self.opts.op_timeout,
                unsubscribing,
            )
            .await
            .is_err()
            {
                self.dropped();
            }
        }
    }

    /// Makes the connection and subscribes it to every wanted channel.
    async fn connect(&mut self) -> Result<(), StoreError> {
        self.conn = None;
        self.pushes = None;
        let client = self.client.as_ref().ok_or_else(|| StoreError::Reply {
            op: "subscribe",
            what: "no RESP3 client".to_owned(),
        })?;
        let (tx, rx) = mpsc::unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(self.opts.op_timeout)
            .set_response_timeout(self.opts.op_timeout)
            .set_push_sender(tx);
        let connecting = client.get_multiplexed_async_connection_with_config(&config);
        let conn = round_trip(
            self.observer.as_ref(),
            StoreOp::Subscribe,
            self.opts.op_timeout,
            connecting,
        )
        .await?;
        self.conn = Some(conn);
        self.pushes = Some(rx);
        let channels: Vec<String> = self.wanted.keys().cloned().collect();
        self.subscribe(&channels).await?;
        self.backoff = RECONNECT_FIRST;
        self.retry_at = None;
        Ok(())
    }

    async fn subscribe(&mut self, channels: &[String]) -> Result<(), StoreError> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(StoreError::Reply {
                op: "subscribe",
                what: "not connected".to_owned(),
            });
        };
        if channels.is_empty() {
            return Ok(());
        }
        let mut cmd = redis::cmd("SUBSCRIBE");
        cmd.arg(channels);
        round_trip(
            self.observer.as_ref(),
            StoreOp::Subscribe,
            self.opts.op_timeout,
            cmd.exec_async(conn),
        )
        .await
    }

    /// The connection is gone or unusable: made again after the backoff, if channels are still wanted.
    fn dropped(&mut self) {
        if self.conn.take().is_some() || self.retry_at.is_some() {
            tracing::debug!("session announcements: the pub/sub connection dropped; announcements meanwhile are lost");
        }
        self.pushes = None;
        let pause = self.backoff;
        self.backoff = (self.backoff * 2).min(RECONNECT_MAX);
        self.retry_at = Some(tokio::time::Instant::now() + pause);
    }

    /// Hands an announcement of another instance to the listener; false once the listener is gone.
    fn deliver(&mut self, push: PushInfo) -> bool {
        match push.kind {
            PushKind::Message => {}
            PushKind::Disconnection => {
                self.dropped();
                return true;
            }
            _ => return true,
        }
        let text = |v: &Value| match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let (Some(channel), Some(payload)) = (push.data.first().and_then(text), push.data.get(1).and_then(text)) else {
            return true;
        };
        let Some(w) = self.wanted.get(&channel) else {
            return true;
        };
        let Some((instance, token)) = payload.split_once(':') else {
            return true;
        };
        // Its own streams this instance announced itself, as it created them.
        if instance == self.instance {
            return true;
        }
        let Some(token) = Token::parse(token) else { return true };
        let Some(listener) = self.listener.upgrade() else {
            return false;
        };
        listener.announced(w.binding, token);
        true
    }
}

async fn recv(pushes: &mut Option<mpsc::UnboundedReceiver<PushInfo>>) -> Option<PushInfo> {
    match pushes {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
