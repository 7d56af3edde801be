//! The names the store writes under: each stream's keys, its entries' ids, a binding's index and announcement
//! channel, and the fields of the meta hash and of an entry.

use crate::resume::id::Decimal;
use std::fmt::Write as _;

/// The field of a stream's meta hash that holds its CORS answer (`cors::Grant` as JSON).
pub(super) const CORS_FIELD: &str = "cors";
/// The field of a Stream entry of one event that holds the event's bytes.
pub(super) const EVENT_FIELD: &str = "e";
/// The field of each event of a Stream entry of several, in order. Not `e`: a gateway from before entries held
/// several events finds no `e` in one and fails the read, where it would take one event of it and skip the rest.
pub(super) const EVENTS_FIELD: &str = "es";
/// Streams kept in a binding's index (`<prefix>bind:<binding>`), the newest: no listing asks for more (the
/// ceiling of `websocket.max_streams_per_session`).
pub const BINDING_INDEX_MAX: usize = 1024;

/// The sorted set of a binding's streams.
pub(crate) fn binding_index(prefix: &str, binding: &[u8; 32]) -> String {
    format!("{prefix}bind:{}", hex(binding))
}

/// The channel a binding's new streams are announced on.
pub(crate) fn start_channel(prefix: &str, binding: &[u8; 32]) -> String {
    format!("{prefix}started:{}", hex(binding))
}

/// Microseconds since the Unix epoch (a binding index's scores: exact in a double until the year 2255).
pub(crate) fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The keys of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Keys {
    pub(super) events: String,
    pub(super) meta: String,
    pub(super) owner: String,
    pub(super) primary: String,
    pub(super) cancel: String,
}

impl Keys {
    pub(super) fn new(prefix: &str, token: &str) -> Self {
        let key = |what: &str| format!("{prefix}{{{token}}}:{what}");
        Self {
            events: key("events"),
            meta: key("meta"),
            owner: key("owner"),
            primary: key("primary"),
            cancel: key("cancel"),
        }
    }
}

/// The Stream entry ID of event `seq`, `0-<seq>` (one per event written: built on the stack).
pub(super) struct EntryId {
    bytes: [u8; 22],
    len: usize,
}

impl EntryId {
    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl redis::ToRedisArgs for EntryId {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        out.write_arg(self.as_bytes());
    }
}

/// The Stream entry ID of event `seq`.
pub(super) fn entry_id(seq: u64) -> EntryId {
    let digits = Decimal::new(seq);
    let digits = digits.as_bytes();
    let mut bytes = [0u8; 22];
    bytes[..2].copy_from_slice(b"0-");
    bytes[2..2 + digits.len()].copy_from_slice(digits);
    EntryId {
        bytes,
        len: 2 + digits.len(),
    }
}

/// The seq of a Stream entry ID written by [`entry_id`].
pub(super) fn parse_entry_id(id: &[u8]) -> Option<u64> {
    std::str::from_utf8(id.strip_prefix(b"0-")?).ok()?.parse().ok()
}

/// Lowercase hex of a binding, as stored in the meta hash.
pub(super) fn hex(binding: &[u8; 32]) -> String {
    let mut s = String::with_capacity(64);
    for b in binding {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Compares two byte strings in time that depends on their length only.
pub(super) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_token_as_hash_tag() {
        let k = Keys::new("sse-gateway:", "00ff");
        assert_eq!(k.events, "sse-gateway:{00ff}:events");
        assert_eq!(k.meta, "sse-gateway:{00ff}:meta");
        assert_eq!(k.owner, "sse-gateway:{00ff}:owner");
        assert_eq!(k.primary, "sse-gateway:{00ff}:primary");
        assert_eq!(k.cancel, "sse-gateway:{00ff}:cancel");
    }

    #[test]
    fn entry_ids_round_trip() {
        for seq in [0, 1, 42, u64::MAX] {
            assert_eq!(parse_entry_id(entry_id(seq).as_bytes()), Some(seq));
        }
        assert_eq!(parse_entry_id(b"1-5"), None);
        assert_eq!(parse_entry_id(b"0-x"), None);
        assert_eq!(parse_entry_id(b"5"), None);
    }

    #[test]
    fn binding_hex_is_lowercase_and_64_digits() {
        let mut b = [0u8; 32];
        b[0] = 0xAB;
        b[31] = 0x01;
        let h = hex(&b);
        assert_eq!(h.len(), 64);
        assert!(h.starts_with("ab00"));
        assert!(h.ends_with("0001"));
    }

    #[test]
    fn same_compares_whole_strings() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(same(b"", b""));
    }
}
