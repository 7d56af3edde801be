//! One Redis round trip, timed and bounded: [`round_trip`] runs it within a limit and tells the
//! [`StoreObserver`] (the metrics) how it went.

use std::future::Future;
use std::time::{Duration, Instant};

use redis::RedisError;

use super::error::StoreError;
use crate::resume::metrics::{Bound, StoreOp};

/// Pause between two tries of a round trip that failed as a whole.
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Told of every Redis round trip and of every stream that stops being resumable (for the metrics).
pub trait StoreObserver: Send + Sync {
    /// One round trip: its operation, whether it succeeded, and how long it took (a `follow` includes its block).
    fn op(&self, op: StoreOp, ok: bool, seconds: f64);
    /// A stream was marked not resumable through the store (queue overflow, refused or failed write, store
    /// lost); once per stream.
    fn unresumable(&self);
    /// Event bytes removed from Redis to keep a bound.
    fn evicted(&self, bound: Bound, bytes: u64);
    /// A stream's meta hash vanished from Redis without a failed write (a flush, a failover to an empty
    /// replica): counted once per stream, which is then also [`StoreObserver::unresumable`].
    fn store_lost(&self);
}

/// Runs one round trip within `limit` and tells the observer.
pub(crate) async fn round_trip<T>(
    observer: &dyn StoreObserver,
    op: StoreOp,
    limit: Duration,
    fut: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, StoreError> {
    let started = Instant::now();
    let result = match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(StoreError::Redis {
            op: op.as_str(),
            source,
        }),
        Err(_) => Err(StoreError::Timeout {
            op: op.as_str(),
            after: limit,
        }),
    };
    observer.op(op, result.is_ok(), started.elapsed().as_secs_f64());
    result
}
