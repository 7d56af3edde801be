//! `Flushes`: the client connection's word to the bodies it carries: when what they handed out has been flushed,
//! and a request to drop the connection (a watcher stalled past its write timeout).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// Counts the connection's flushes and wakes the bodies waiting for the next one; and lets a response body ask
/// for the connection to be dropped (a watcher whose client reads nothing: its body is not polled then, so it
/// cannot end the response itself).
#[derive(Default)]
pub struct Flushes {
    epoch: AtomicU64,
    waiting: AtomicBool,
    wakers: Mutex<Vec<Waker>>,
    dropped: AtomicBool,
    drop_waker: atomic_waker::AtomicWaker,
}

impl Flushes {
    /// Asks the connection's task to drop the connection (with the responses in flight).
    pub fn drop_connection(&self) {
        self.dropped.store(true, Ordering::Release);
        self.drop_waker.wake();
    }

    /// Resolves once a response body asked for the connection to be dropped.
    pub async fn drop_asked(&self) {
        std::future::poll_fn(|cx| {
            self.drop_waker.register(cx.waker());
            if self.dropped.load(Ordering::Acquire) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn flushed(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        if self.waiting.swap(false, Ordering::AcqRel) {
            let wakers = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|p| p.into_inner()));
            wakers.into_iter().for_each(Waker::wake);
        }
    }

    /// Ready once a flush completed after `epoch` was read.
    pub fn poll_flushed_since(&self, epoch: u64, cx: &mut Context<'_>) -> Poll<()> {
        if self.epoch() > epoch {
            return Poll::Ready(());
        }
        {
            let mut wakers = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
            if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
                wakers.push(cx.waker().clone());
            }
            self.waiting.store(true, Ordering::Release);
        }
        // A flush between the first look and the registration would not have woken us.
        if self.epoch() > epoch {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::{Context, Waker};

    use super::*;

    #[test]
    fn a_flush_after_the_epoch_wakes_the_waiter() {
        let f = Flushes::default();
        let e = f.epoch();
        struct Noop;
        impl std::task::Wake for Noop {
            fn wake(self: Arc<Self>) {}
        }
        let waker = Waker::from(Arc::new(Noop));
        let mut cx = Context::from_waker(&waker);
        assert!(f.poll_flushed_since(e, &mut cx).is_pending());
        f.flushed();
        assert!(f.poll_flushed_since(e, &mut cx).is_ready());
    }
}
