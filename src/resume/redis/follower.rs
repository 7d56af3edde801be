//! The followers: a few tasks per instance, each blocking in one `XREAD` over every waiting reader's stream on
//! its own connection, and waking the readers whose streams got events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};
use tokio::sync::{oneshot, Notify};

use super::keys::entry_id;
use super::options::{millis, RedisOptions};
use super::reply::xread_keys;
use super::trip::{round_trip, StoreObserver, RETRY_PAUSE};
use crate::resume::metrics::StoreOp;

/// Which follower a stream's readers wait on.
pub(super) fn follower_of(key: &str, n: usize) -> usize {
    // FNV-1a: stable, and spreads tokens (random hex) evenly.
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    (h % n.max(1) as u64) as usize
}

/// A reader waiting for events of a stream after a seq.
pub(super) struct Waiter {
    pub(super) events: String,
    pub(super) after: u64,
    pub(super) wake: oneshot::Sender<()>,
}

/// One follower connection's readers waiting for events: its task blocks in one `XREAD` over all their
/// streams and wakes those whose streams got events, so Redis sees a fixed number of connections however many
/// readers follow.
#[derive(Default)]
pub(super) struct Follower {
    pub(super) waiting: Mutex<Vec<Waiter>>,
    pub(super) joined: Notify,
}

impl Follower {
    pub(super) fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<Waiter>> {
        // Every critical section is one push, retain or drain: a poisoned list is still consistent.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resolves when `events` may have an entry after `after` (or never, if the follower is gone: callers wait
    /// with a timeout).
    pub(super) fn wait(&self, events: &str, after: u64) -> oneshot::Receiver<()> {
        let (wake, woken) = oneshot::channel();
        self.waiting().push(Waiter {
            events: events.to_owned(),
            after,
            wake,
        });
        self.joined.notify_one();
        woken
    }

    pub(super) async fn run(me: Weak<Self>, client: Client, opts: RedisOptions, observer: Arc<dyn StoreObserver>) {
        let block = opts.follow_block();
        let limit = block.saturating_add(opts.op_timeout);
        let mut conn: Option<MultiplexedConnection> = None;
        loop {
            let Some(f) = me.upgrade() else { return };
            // Each stream once, from the lowest position any of its readers waits after.
            let mut streams: HashMap<String, u64> = HashMap::new();
            {
                let mut waiting = f.waiting();
                waiting.retain(|w| !w.wake.is_closed());
                for w in waiting.iter() {
                    let after = streams.entry(w.events.clone()).or_insert(w.after);
                    *after = (*after).min(w.after);
                }
            }
            let streams: Vec<(String, u64)> = streams.into_iter().collect();
            if streams.is_empty() {
                // Woken by a reader that joins; the timeout lets the task end once the store is gone.
                let _ = tokio::time::timeout(Duration::from_secs(1), f.joined.notified()).await;
                continue;
            }
            drop(f);
            if conn.is_none() {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(opts.op_timeout)
                    .set_response_timeout(limit);
                let connecting = client.get_multiplexed_async_connection_with_config(&config);
                match round_trip(observer.as_ref(), StoreOp::Connect, opts.op_timeout, connecting).await {
                    Ok(c) => conn = Some(c),
                    Err(_) => {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue;
                    }
                }
            }
            let Some(c) = conn.as_mut() else { continue };
            let mut xread = redis::cmd("XREAD");
            xread.arg("COUNT").arg(1).arg("BLOCK").arg(millis(block)).arg("STREAMS");
            for (k, _) in &streams {
                xread.arg(k);
            }
            for (_, after) in &streams {
                xread.arg(entry_id(*after));
            }
            match round_trip(observer.as_ref(), StoreOp::Follow, limit, xread.query_async::<Value>(c)).await {
                Ok(reply) => {
                    let ready: std::collections::HashSet<Vec<u8>> = xread_keys(reply).into_iter().collect();
                    if ready.is_empty() {
                        continue;
                    }
                    let Some(f) = me.upgrade() else { return };
                    let mut waiting = f.waiting();
                    let (wake, keep): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut *waiting)
                        .into_iter()
                        .partition(|w| ready.contains(w.events.as_bytes()));
                    *waiting = keep;
                    drop(waiting);
                    for w in wake {
                        let _ = w.wake.send(());
                    }
                }
                Err(_) => {
                    // The connection may still be blocked in the XREAD: start afresh. Waiting readers look at
                    // the stream themselves when their wait times out.
                    conn = None;
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followers_are_chosen_by_key_within_range() {
        for n in 1..=4 {
            assert!(follower_of("sse-gateway:{00ff}:events", n) < n);
        }
        assert_eq!(follower_of("a", 3), follower_of("a", 3));
    }
}
