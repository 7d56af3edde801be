//! What the gateway remembers of a frontend's chat or thread between its turns: the backend agent it continues,
//! the calls its last run awaited (AG-UI keeps neither in-band), and its running stream (the AI SDK's resume
//! route). Keyed by a hash of the client's bound headers, the route and the conversation id, so one client cannot
//! read or continue another's. Bounded (`MAX_CHATS`, the oldest forgotten) and with a lifetime (`CHAT_TTL`, from the
//! last turn). One instance's memory; with `resume.store = "redis"` the record is also kept in Redis
//! (`resume::Resumer::chat_*`) so the next turn may reach any instance.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::frontend::Turn;
use crate::resume::redis::RedisStore;

/// Chats remembered at once.
pub const MAX_CHATS: usize = 100_000;
/// How long a chat is remembered after its last turn.
pub const CHAT_TTL: Duration = Duration::from_secs(24 * 3600);

/// One chat's record; only this room reads or writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chat {
    /// The backend agent its runs continue.
    pub(super) agent: Option<String>,
    /// The calls its last run ended awaiting.
    pub(super) awaited: Vec<String>,
    /// Its last run's held stream (its URL path), and the encoder's turn for reading it again.
    pub(super) stream: Option<String>,
    pub(super) turn: Option<Turn>,
}

/// The records, by key; mirrored in Redis with the `redis` store.
#[derive(Debug, Default)]
pub struct Chats {
    inner: Mutex<Inner>,
    mirror: Option<RedisStore>,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<[u8; 32], (Chat, Instant)>,
    /// Keys in the order they were last written (stale entries skipped when popped).
    order: VecDeque<([u8; 32], Instant)>,
}

fn hex(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key of a conversation: its bound headers' hash, the route and its id.
pub fn key(binding: &[u8; 32], route: &str, id: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"sse-gateway chat\0");
    h.update(binding);
    h.update(route.as_bytes());
    h.update(b"\0");
    h.update(id.as_bytes());
    *h.finalize().as_bytes()
}

impl Chats {
    /// Kept in this instance's memory, and in `mirror` when given (`resume.store = "redis"`).
    pub fn new(mirror: Option<RedisStore>) -> Self {
        Self {
            inner: Mutex::default(),
            mirror,
        }
    }

    /// A chat's record: this instance's, else the shared store's (a turn that reached another instance before).
    /// A store that fails is a chat not found (logged): the turn goes on as a new one.
    pub async fn find(&self, key: &[u8; 32]) -> Option<Chat> {
        if let Some(chat) = self.get(key) {
            return Some(chat);
        }
        let mirror = self.mirror.as_ref()?;
        let stored = match mirror.chat_get(&hex(key)).await {
            Ok(stored) => stored?,
            Err(e) => {
                tracing::warn!(error = %e, "redis store: a frontend chat could not be read");
                return None;
            }
        };
        let chat: Chat = serde_json::from_str(&stored).ok()?;
        let copy = chat.clone();
        self.update(*key, move |c| *c = copy);
        Some(chat)
    }

    pub fn get(&self, key: &[u8; 32]) -> Option<Chat> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .map
            .get(key)
            .filter(|(_, at)| at.elapsed() < CHAT_TTL)
            .map(|(c, _)| c.clone())
    }

    /// Changes a chat's record (a new one starts empty).
    pub fn update(&self, key: [u8; 32], change: impl FnOnce(&mut Chat)) -> Chat {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let entry = inner.map.entry(key).or_insert_with(|| (Chat::default(), now));
        if entry.1.elapsed() >= CHAT_TTL {
            entry.0 = Chat::default();
        }
        let before = entry.0.clone();
        change(&mut entry.0);
        entry.1 = now;
        let chat = entry.0.clone();
        inner.order.push_back((key, now));
        inner.evict(now);
        drop(inner);
        if let (Some(mirror), true) = (&self.mirror, chat != before) {
            self.store(mirror.clone(), key, &chat);
        }
        chat
    }

    /// Writes a changed record to the shared store, off the caller's path (it runs inside a body's poll).
    fn store(&self, mirror: RedisStore, key: [u8; 32], chat: &Chat) {
        let Ok(record) = serde_json::to_string(chat) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            if let Err(e) = mirror.chat_set(&hex(&key), &record, CHAT_TTL).await {
                tracing::warn!(error = %e, "redis store: a frontend chat could not be written");
            }
        });
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    /// Forgets expired chats, and the least recently written past `MAX_CHATS`.
    fn evict(&mut self, now: Instant) {
        while let Some(&(key, at)) = self.order.front() {
            let current = self.map.get(&key).is_some_and(|(_, last)| *last == at);
            let over = self.map.len() > MAX_CHATS;
            let expired = now.duration_since(at) >= CHAT_TTL;
            if current && !over && !expired {
                break;
            }
            self.order.pop_front();
            if current {
                self.map.remove(&key);
            }
        }
        // Writes of one chat repeat its key: keep the queue within a few times the map.
        if self.order.len() > 4 * MAX_CHATS.max(self.map.len()) {
            let map = &self.map;
            self.order
                .retain(|(k, at)| map.get(k).is_some_and(|(_, last)| last == at));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_is_found_by_its_bound_key_only_and_updates_merge() {
        let chats = Chats::default();
        let k = key(&[1; 32], "/api/chat", "c1");
        chats.update(k, |c| c.agent = Some("a".into()));
        chats.update(k, |c| c.awaited = vec!["f1".into()]);
        let got = chats.get(&k).unwrap();
        assert_eq!(got.agent.as_deref(), Some("a"));
        assert_eq!(got.awaited, ["f1"]);
        assert!(
            chats.get(&key(&[2; 32], "/api/chat", "c1")).is_none(),
            "another client's headers"
        );
        assert!(chats.get(&key(&[1; 32], "/agui", "c1")).is_none(), "another route");
    }

    #[test]
    fn repeated_writes_of_one_chat_keep_one_record() {
        let chats = Chats::default();
        let k = key(&[0; 32], "/r", "c");
        for n in 0..1000 {
            chats.update(k, |c| c.awaited = vec![n.to_string()]);
        }
        assert_eq!(chats.len(), 1);
        assert!(chats.inner.lock().unwrap().order.len() <= 4 * MAX_CHATS);
    }
}
