//! Sessions: what a session socket needs of the held streams, every stream of one binding. A session lists the
//! streams held when it opens (`Resumer::session`), then is told of each new one as it starts: on this instance
//! by `Hub::create*`, and with `resume.store = "redis"` from the other instances through `announce`.
//!
//! Each session has a queue of starts not taken yet, at most `resume.session_queue`: past it the oldest is
//! dropped (counted), so a session that does not read costs a bounded amount. A start is told to a session once,
//! whichever ways it arrives (listed, announced here, announced through Redis, a publish sent twice).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;

use super::announce::{Listener, Subscriber, WeakSubscriber};
use super::id::Token;
use super::metrics::{Announcement, ResumeMetrics};
use super::redis::{RedisStore, StoreError};

/// A stream of the binding held when the session opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    pub token: Token,
    /// Its run is over (its events may still be read until they expire).
    pub ended: bool,
}

/// The bounds of `Resumer::session`, set by the WebSocket output (`websocket.*`).
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// Sessions open at once on this instance; one more is refused with [`SessionError::Full`].
    pub max_sessions: usize,
    /// Streams listed when a session opens at most: the newest of the binding.
    pub max_listed: usize,
}

/// Why a session could not open.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// This instance has `max_sessions` open.
    #[error("too many sessions on this instance")]
    Full,
    /// The shared store did not answer the listing or the subscription.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One session's queue of starts not taken yet.
struct Mailbox {
    queue: Mutex<VecDeque<Token>>,
    notify: Notify,
    /// The resumer shut down.
    closed: AtomicBool,
}

impl Mailbox {
    fn queue(&self) -> MutexGuard<'_, VecDeque<Token>> {
        // Every critical section is one push or pop: a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The sessions of this instance, by binding.
struct Registry {
    by_binding: Mutex<HashMap<[u8; 32], Vec<Arc<Mailbox>>>>,
    /// Sessions open (also what `announce` looks at first, so a stream created with no session costs no lock).
    open: AtomicUsize,
    /// `resume.session_queue`.
    queue: usize,
    metrics: Arc<ResumeMetrics>,
}

impl Registry {
    fn bindings(&self) -> MutexGuard<'_, HashMap<[u8; 32], Vec<Arc<Mailbox>>>> {
        self.by_binding.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn announce(&self, binding: [u8; 32], token: Token) {
        if self.open.load(Ordering::Acquire) == 0 {
            return;
        }
        let bindings = self.bindings();
        for mailbox in bindings.get(&binding).into_iter().flatten() {
            {
                let mut q = mailbox.queue();
                if q.len() >= self.queue {
                    q.pop_front();
                    self.metrics.announcement(Announcement::Dropped);
                }
                q.push_back(token);
            }
            mailbox.notify.notify_one();
        }
    }

    fn unregister(&self, binding: &[u8; 32], mailbox: &Arc<Mailbox>) {
        let mut bindings = self.bindings();
        if let Some(list) = bindings.get_mut(binding) {
            list.retain(|m| !Arc::ptr_eq(m, mailbox));
            if list.is_empty() {
                bindings.remove(binding);
            }
        }
        drop(bindings);
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Listener for Registry {
    fn announced(&self, binding: [u8; 32], token: Token) {
        self.announce(binding, token);
    }
}

/// The sessions of this instance, and with the Redis store its one pub/sub connection. Owned by the hub; when it
/// goes (the resumer shuts down), every session's `next_start` ends.
pub struct Sessions {
    registry: Arc<Registry>,
    subscriber: Option<Subscriber>,
}

impl Sessions {
    /// With a store, starts the announcements' task (it connects on the first session): needs a tokio runtime.
    pub fn new(queue: usize, metrics: Arc<ResumeMetrics>, store: Option<&RedisStore>) -> Self {
        let registry = Arc::new(Registry {
            by_binding: Mutex::new(HashMap::new()),
            open: AtomicUsize::new(0),
            queue: queue.max(1),
            metrics,
        });
        let listener: Weak<dyn Listener> = Arc::downgrade(&registry) as Weak<Registry>;
        let subscriber = store.map(|s| Subscriber::spawn(s, listener));
        Self { registry, subscriber }
    }

    /// A stream of `binding` started on this instance: told to its sessions here.
    pub fn announce(&self, binding: [u8; 32], token: Token) {
        self.registry.announce(binding, token);
    }

    /// Registers a session of `binding` (with the store, subscribed to other instances' announcements once
    /// Redis confirmed it), to be told of every stream started from now on; its listing is set by the caller.
    pub async fn open(&self, binding: [u8; 32], limits: SessionLimits) -> Result<Session, SessionError> {
        let reg = &self.registry;
        if reg
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limits.max_sessions).then_some(n + 1)
            })
            .is_err()
        {
            reg.metrics.sessions_refused.inc();
            return Err(SessionError::Full);
        }
        reg.metrics.sessions.inc();
        let mailbox = Arc::new(Mailbox {
            queue: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            closed: AtomicBool::new(false),
        });
        reg.bindings().entry(binding).or_default().push(Arc::clone(&mailbox));
        let mut session = Session {
            listed: Vec::new(),
            binding,
            mailbox,
            registry: Arc::downgrade(reg),
            joined: None,
            metrics: Arc::clone(&reg.metrics),
            told: Told::new(limits.max_listed.saturating_add(2 * reg.queue)),
        };
        if let Some(sub) = &self.subscriber {
            // Dropped on an error: the session unregisters.
            sub.join(binding).await?;
            session.joined = Some(sub.downgrade());
        }
        Ok(session)
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        for mailbox in self.registry.bindings().values().flatten() {
            mailbox.closed.store(true, Ordering::Release);
            mailbox.notify.notify_one();
        }
    }
}

/// Tokens told lately, for the once-only rule: a repeat can only come soon after the first telling (a listed
/// stream announced as the session opened, a publish sent again), so the last `cap` are enough.
struct Told {
    set: HashSet<Token>,
    order: VecDeque<Token>,
    cap: usize,
}

impl Told {
    fn new(cap: usize) -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// False if `token` was told already.
    fn insert(&mut self, token: Token) -> bool {
        if !self.set.insert(token) {
            return false;
        }
        self.order.push_back(token);
        if self.order.len() > self.cap {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

/// Every stream of one binding, for one session socket; dropping it unregisters it.
pub struct Session {
    listed: Vec<Listed>,
    binding: [u8; 32],
    mailbox: Arc<Mailbox>,
    registry: Weak<Registry>,
    /// Subscribed to other instances' announcements: left when dropped.
    joined: Option<WeakSubscriber>,
    metrics: Arc<ResumeMetrics>,
    told: Told,
}

impl Session {
    /// The streams of the binding held when the session opened (this instance's hub, and with Redis those other
    /// instances announced and still hold), oldest first, at most `max_listed` (the newest).
    pub fn listed(&self) -> &[Listed] {
        &self.listed
    }

    /// Sets the listing (oldest first); each listed stream counts as told.
    pub(crate) fn set_listed(&mut self, listed: Vec<Listed>) {
        for l in &listed {
            self.told.insert(l.token);
        }
        self.listed = listed;
    }

    /// The next stream of the binding started after the session opened, on any instance; `None` only when the
    /// resumer shuts down. Cancel-safe: what is not returned stays queued. A stream is told once.
    pub async fn next_start(&mut self) -> Option<Token> {
        loop {
            let next = self.mailbox.queue().pop_front();
            match next {
                Some(token) if self.told.insert(token) => {
                    self.metrics.announcement(Announcement::Delivered);
                    return Some(token);
                }
                Some(_) => continue,
                None if self.mailbox.closed.load(Ordering::Acquire) => return None,
                // A start pushed after the pop left a permit: this returns at once.
                None => self.mailbox.notify.notified().await,
            }
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.metrics.sessions.dec();
        if let Some(reg) = self.registry.upgrade() {
            reg.unregister(&self.binding, &self.mailbox);
        }
        if let Some(sub) = &self.joined {
            sub.leave(self.binding);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(queue: usize) -> Sessions {
        let metrics = Arc::new(ResumeMetrics::register(&prometheus::Registry::new()).unwrap());
        Sessions::new(queue, metrics, None)
    }

    const LIMITS: SessionLimits = SessionLimits {
        max_sessions: 2,
        max_listed: 8,
    };

    fn token() -> Token {
        Token::random().unwrap()
    }

    /// Fails the test rather than hang.
    async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(5), fut)
            .await
            .expect("not within 5 s")
    }

    /// The next start if one is queued now.
    async fn now(s: &mut Session) -> Option<Token> {
        tokio::time::timeout(std::time::Duration::from_millis(20), s.next_start())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn a_session_is_told_its_bindings_starts_once_each_and_no_other() {
        let all = sessions(64);
        let mut s = all.open([1; 32], LIMITS).await.unwrap();
        let (a, b, listed) = (token(), token(), token());
        s.set_listed(vec![Listed {
            token: listed,
            ended: false,
        }]);
        all.announce([2; 32], token());
        all.announce([1; 32], listed);
        all.announce([1; 32], a);
        all.announce([1; 32], a);
        all.announce([1; 32], b);
        assert_eq!(
            now(&mut s).await,
            Some(a),
            "another binding's and the listed one are not told"
        );
        assert_eq!(now(&mut s).await, Some(b), "told once");
        assert_eq!(now(&mut s).await, None);
        assert_eq!(
            all.registry.metrics.announcements[Announcement::Delivered as usize].get(),
            2
        );
    }

    #[tokio::test]
    async fn a_session_waiting_is_woken_and_a_cancelled_wait_loses_nothing() {
        let all = sessions(64);
        let mut s = all.open([1; 32], LIMITS).await.unwrap();
        assert_eq!(now(&mut s).await, None, "a cancelled wait");
        let t = token();
        all.announce([1; 32], t);
        assert_eq!(now(&mut s).await, Some(t));
        let registry = Arc::clone(&all.registry);
        let later = token();
        let waiting = tokio::spawn(async move { s.next_start().await });
        tokio::task::yield_now().await;
        registry.announce([1; 32], later);
        assert_eq!(within(waiting).await.unwrap(), Some(later));
    }

    #[tokio::test]
    async fn a_session_that_does_not_read_keeps_the_newest_and_the_drops_are_counted() {
        let all = sessions(4);
        let mut s = all.open([1; 32], LIMITS).await.unwrap();
        let tokens: Vec<Token> = (0..10).map(|_| token()).collect();
        for t in &tokens {
            all.announce([1; 32], *t);
        }
        let mut got = Vec::new();
        while let Some(t) = now(&mut s).await {
            got.push(t);
        }
        assert_eq!(got, tokens[6..]);
        assert_eq!(
            all.registry.metrics.announcements[Announcement::Dropped as usize].get(),
            6
        );
    }

    #[tokio::test]
    async fn sessions_past_the_bound_are_refused_and_a_dropped_one_unregisters() {
        let all = sessions(64);
        let one = all.open([1; 32], LIMITS).await.unwrap();
        let two = all.open([1; 32], LIMITS).await.unwrap();
        assert!(matches!(all.open([2; 32], LIMITS).await, Err(SessionError::Full)));
        assert_eq!(all.registry.metrics.sessions_refused.get(), 1);
        assert_eq!(all.registry.metrics.sessions.get(), 2);
        drop(one);
        assert_eq!(all.registry.bindings()[&[1; 32]].len(), 1);
        drop(two);
        assert!(
            all.registry.bindings().is_empty(),
            "an empty binding's entry is removed"
        );
        assert_eq!(all.registry.metrics.sessions.get(), 0);
        assert!(all.open([2; 32], LIMITS).await.is_ok(), "room again");
    }

    #[tokio::test]
    async fn a_session_ends_when_the_resumer_shuts_down() {
        let all = sessions(64);
        let mut s = all.open([1; 32], LIMITS).await.unwrap();
        let waiting = tokio::spawn(async move { s.next_start().await });
        tokio::task::yield_now().await;
        drop(all);
        assert_eq!(within(waiting).await.unwrap(), None);
    }
}
