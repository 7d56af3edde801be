//! The store's settings ([`RedisOptions`]): their defaults, their checks, and the durations derived from them.

use std::time::Duration;

use super::error::StoreError;

/// The longest block of a follower's `XREAD`: a reader that starts waiting while one is blocked is in the next,
/// so its first live event may wait this long (later ones wake it at once).
pub const FOLLOW_BLOCK: Duration = Duration::from_millis(250);
/// Liveness keys (owner, primary cursor) expire after this many heartbeats without a refresh.
pub const LIVENESS_HEARTBEATS: u32 = 3;

/// Default of [`RedisOptions::write_linger`].
pub const WRITE_LINGER: Duration = Duration::from_millis(crate::config::DEFAULT_REDIS_WRITE_LINGER_MS);
/// Ceiling of [`RedisOptions::write_linger`] (`resume.redis_write_linger_ms`).
pub const MAX_WRITE_LINGER: Duration = Duration::from_millis(crate::config::MAX_REDIS_WRITE_LINGER_MS);

/// A stream's events in Redis may exceed `buffer_bytes` (and `max_events`, up to [`MAX_EVENTS_SLACK`]) by this
/// fraction of it (`1/16`) before they are trimmed.
pub const TRIM_SLACK_FRACTION: usize = 16;
/// The most events past `max_events` a stream may hold before it is trimmed.
pub const MAX_EVENTS_SLACK: usize = 100;
/// The most events one Stream entry holds (also at most half the stream's events slack).
pub const ENTRY_EVENTS_MAX: usize = 16;
/// The most event bytes one Stream entry holds (also at most half the stream's bytes slack; one larger event is an
/// entry alone).
pub const ENTRY_BYTES_MAX: usize = 16 << 10;

/// Settings of the Redis store.
#[derive(Clone, Debug)]
pub struct RedisOptions {
    /// Prefix of every key; default `"sse-gateway:"`.
    pub key_prefix: String,
    /// Events kept per stream (trimmed beside `buffer_bytes`, [`Self::events_slack`] past it at most); default
    /// 100,000.
    pub max_events: usize,
    /// Event bytes kept per stream in Redis (plus its newest frame): `resume.buffer_bytes`; default 1 MiB.
    pub buffer_bytes: usize,
    /// Event bytes this instance keeps in Redis over all its streams, finished ones included until their keys
    /// expire: `resume.max_total_bytes`; default 256 MiB.
    pub max_total_bytes: usize,
    /// Expiry of a stream's keys, refreshed every heartbeat and set again at its end: grace + retention; default 330 s.
    pub ttl: Duration,
    /// How often the owner refreshes its liveness keys; they expire after 3 of these; default 1 s.
    pub heartbeat: Duration,
    /// Events queued and not yet written before a stream is dropped from the store; default 4096.
    pub queue: usize,
    /// Time limit of each Redis round trip (connecting included); default 1 s.
    pub op_timeout: Duration,
    /// How long Redis may fail to answer before the writer gives up the streams of the round it retries and a
    /// reader ends with an error: `resume.redis_stall_secs`; default 5 s.
    pub stall: Duration,
    /// Readers of streams owned elsewhere open at once on this instance: `resume.max_remote_readers`; default
    /// 1024.
    pub max_readers: usize,
    /// Connections (each with one follower task) that block in `XREAD` for this instance's remote readers:
    /// `resume.redis_follow_connections`; default 1.
    pub follow_connections: usize,
    /// How long the writer, woken by a first event, waits for more before it writes them all in one round trip
    /// (not when it is behind): `resume.redis_write_linger_ms`; default 5 ms, at most 100 ms. Events reach other
    /// instances this much later; the owner's own readers do not wait for it.
    pub write_linger: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            key_prefix: "sse-gateway:".to_owned(),
            max_events: 100_000,
            buffer_bytes: 1 << 20,
            max_total_bytes: 256 << 20,
            ttl: Duration::from_secs(30 + 300),
            heartbeat: Duration::from_secs(1),
            queue: 4096,
            op_timeout: Duration::from_secs(1),
            stall: Duration::from_secs(5),
            max_readers: 1024,
            follow_connections: 1,
            write_linger: WRITE_LINGER,
        }
    }
}

/// Most follower connections per instance (the ceiling of `resume.redis_follow_connections`).
pub use crate::config::MAX_FOLLOW_CONNECTIONS;

impl RedisOptions {
    /// Checks the settings, before anything connects.
    pub fn validate(&self) -> Result<(), StoreError> {
        let problem = if self.max_events == 0 {
            "max_events must be at least 1"
        } else if self.queue == 0 {
            "queue must be at least 1"
        } else if self.buffer_bytes == 0 {
            "buffer_bytes must be at least 1"
        } else if self.max_total_bytes < self.buffer_bytes {
            "max_total_bytes must be at least buffer_bytes"
        } else if self.max_readers == 0 {
            "max_readers must be at least 1"
        } else if !(1..=MAX_FOLLOW_CONNECTIONS).contains(&self.follow_connections) {
            "follow_connections must be between 1 and 16"
        } else if self.write_linger > MAX_WRITE_LINGER {
            "write_linger must be at most 100 ms"
        } else if self.heartbeat < Duration::from_millis(10) {
            "heartbeat must be at least 10 ms"
        } else if self.op_timeout < Duration::from_millis(1) {
            "op_timeout must be at least 1 ms"
        } else if self.op_timeout.saturating_mul(2) > self.liveness() {
            // A refresh comes at most a heartbeat plus one round trip after the last one; the key lives 3.
            "op_timeout must be at most 1.5 heartbeats, or a slow round trip lets the owner key expire"
        } else if self.stall < self.op_timeout {
            "stall must be at least op_timeout"
        } else if self.ttl < self.liveness() {
            "ttl must be at least 3 heartbeats"
        } else {
            return Ok(());
        };
        Err(StoreError::Options(problem))
    }

    /// How far past `buffer_bytes` a stream's events may grow before the writer trims them back to it (one
    /// `XTRIM` for this many bytes of events, not one per write round): a sixteenth of the bound.
    pub fn trim_slack(&self) -> usize {
        self.buffer_bytes / TRIM_SLACK_FRACTION
    }

    /// How many events past `max_events` a stream may hold before the writer trims it back: a sixteenth of the
    /// bound, and at most [`MAX_EVENTS_SLACK`] (what `XADD MAXLEN ~` allowed, a Stream node's default entries).
    pub fn events_slack(&self) -> usize {
        (self.max_events / TRIM_SLACK_FRACTION).min(MAX_EVENTS_SLACK)
    }

    /// The events and event bytes one Stream entry holds at most (an event larger than that is an entry alone):
    /// within half the slacks, so a trim, which takes whole entries, still brings a stream back under its
    /// bounds plus half a slack (the next trim is a slack away), and a reader's `XRANGE` stays bounded.
    pub fn entry_bounds(&self) -> (usize, usize) {
        (
            (self.events_slack() / 2).clamp(1, ENTRY_EVENTS_MAX),
            (self.trim_slack() / 2).clamp(1, ENTRY_BYTES_MAX),
        )
    }

    /// How long a liveness key (owner, primary cursor) lives without a refresh.
    pub(super) fn liveness(&self) -> Duration {
        self.heartbeat.saturating_mul(LIVENESS_HEARTBEATS)
    }

    /// The longest block of a follower's `XREAD`, and the longest a waiting reader waits before it looks at the
    /// owner's liveness again.
    pub(super) fn follow_block(&self) -> Duration {
        self.heartbeat.min(FOLLOW_BLOCK)
    }
}

/// Milliseconds of a duration, for `PX` and `PEXPIRE` (at least 1: 0 is not a valid expiry).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_events_slack_is_a_sixteenth_and_at_most_a_node() {
        let slack = |max_events| {
            RedisOptions {
                max_events,
                ..RedisOptions::default()
            }
            .events_slack()
        };
        assert_eq!(slack(64), 4);
        assert_eq!(slack(10), 0);
        assert_eq!(slack(1_600), MAX_EVENTS_SLACK);
        assert_eq!(slack(100_000), MAX_EVENTS_SLACK);
    }

    #[test]
    fn options_are_checked() {
        assert!(RedisOptions::default().validate().is_ok());
        // Each a default with one thing out of range (or two that contradict each other).
        let bad: [fn(&mut RedisOptions); 11] = [
            |o| o.max_events = 0,
            |o| o.queue = 0,
            |o| o.heartbeat = Duration::ZERO,
            |o| o.op_timeout = Duration::ZERO,
            |o| o.ttl = Duration::from_secs(2),
            |o| o.op_timeout = Duration::from_secs(2),
            |o| {
                o.max_total_bytes = 10;
                o.buffer_bytes = 11;
            },
            |o| o.max_readers = 0,
            |o| o.follow_connections = 0,
            |o| o.stall = Duration::from_millis(10),
            |o| o.write_linger = Duration::from_millis(101),
        ];
        for change in bad {
            let mut o = RedisOptions::default();
            change(&mut o);
            assert!(matches!(o.validate(), Err(StoreError::Options(_))), "{o:?}");
        }
    }

    #[test]
    fn millis_is_never_zero() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }
}
