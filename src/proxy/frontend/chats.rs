//! What the gateway remembers of a frontend's chat or thread between its turns: the backend agent it continues,
//! the calls its last run awaited (AG-UI keeps neither in-band), and its running stream (the AI SDK's resume
//! route). Keyed by a hash of the client's bound headers, the route and the conversation id, so one client cannot
//! read or continue another's. Bounded (`MAX_CHATS` and `MAX_CHAT_BYTES`, the oldest forgotten; a record's lists
//! at most `MAX_KNOWN` ids) and with a lifetime (`CHAT_TTL`, from the last turn). One instance's memory; with `resume.store = "redis"` the record is also kept in Redis
//! (`resume::Resumer::chat_*`) so the next turn may reach any instance.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::frontend::Turn;
use crate::resume::redis::RedisStore;

/// Chats remembered at once.
pub const MAX_CHATS: usize = 100_000;
/// Bytes of records remembered at once (each record's ids and strings counted).
pub const MAX_CHAT_BYTES: usize = 64 << 20;
/// Ids a record keeps of each list (the newest): the calls awaited, and a turn's known calls and results.
pub const MAX_KNOWN: usize = 256;
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

impl Chat {
    /// Keeps at most `MAX_KNOWN` of each list, the newest: a client's history cannot grow a record without bound.
    fn bound(&mut self) {
        let keep = |v: &mut Vec<String>| {
            let extra = v.len().saturating_sub(MAX_KNOWN);
            v.drain(..extra);
        };
        keep(&mut self.awaited);
        if let Some(t) = self.turn.as_mut() {
            keep(&mut t.known_tools);
            keep(&mut t.known_results);
        }
    }

    /// Bytes it holds, about (its strings and ids).
    fn size(&self) -> usize {
        let ids = |v: &[String]| v.iter().map(|i| i.len() + 24).sum::<usize>();
        let opt = |o: &Option<String>| o.as_ref().map_or(0, String::len);
        let turn = self.turn.as_ref().map_or(0, |t| {
            t.message_id.len()
                + t.thread_id.len()
                + t.run_id.len()
                + t.prefix.len()
                + ids(&t.known_tools)
                + ids(&t.known_results)
                + opt(&t.agent)
        });
        128 + opt(&self.agent) + ids(&self.awaited) + opt(&self.stream) + turn
    }
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
    /// Bytes of the records in `map` (`Chat::size`).
    bytes: usize,
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
        let (counted, entry) = match inner.map.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => {
                let e = e.into_mut();
                (e.0.size(), e)
            }
            std::collections::hash_map::Entry::Vacant(e) => (0, e.insert((Chat::default(), now))),
        };
        if entry.1.elapsed() >= CHAT_TTL {
            entry.0 = Chat::default();
        }
        let before = entry.0.clone();
        change(&mut entry.0);
        entry.0.bound();
        entry.1 = now;
        let chat = entry.0.clone();
        inner.bytes = inner.bytes.saturating_sub(counted) + chat.size();
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
            let over = self.map.len() > MAX_CHATS || self.bytes > MAX_CHAT_BYTES;
            let expired = now.duration_since(at) >= CHAT_TTL;
            if current && !over && !expired {
                break;
            }
            self.order.pop_front();
            if current {
                if let Some((chat, _)) = self.map.remove(&key) {
                    self.bytes = self.bytes.saturating_sub(chat.size());
                }
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
    fn a_records_lists_and_the_records_bytes_are_bounded() {
        let chats = Chats::default();
        let id = "x".repeat(200);
        for n in 0..700u32 {
            let k = key(&[0; 32], "/r", &n.to_string());
            chats.update(k, |c| {
                c.awaited = vec![id.clone(); 2 * MAX_KNOWN];
                c.turn = Some(Turn {
                    known_tools: vec![id.clone(); 4 * MAX_KNOWN],
                    ..Turn::default()
                });
            });
            let got = chats.get(&k).expect("the newest record stays");
            assert_eq!(got.awaited.len(), MAX_KNOWN);
            assert_eq!(got.turn.map(|t| t.known_tools.len()), Some(MAX_KNOWN));
        }
        let inner = chats.inner.lock().unwrap();
        assert!(inner.bytes <= MAX_CHAT_BYTES, "{} bytes", inner.bytes);
        let counted: usize = inner.map.values().map(|(c, _)| c.size()).sum();
        assert_eq!(inner.bytes, counted, "the count follows the records");
        assert!(inner.map.len() < 700, "the oldest were forgotten: {}", inner.map.len());
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
