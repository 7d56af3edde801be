//! `Quiet`: a future polled only when it has been woken, for the side futures of a busy task.
//!
//! A connection's task is woken for every event it streams, and each wake-up polled all its side futures too (the
//! timers, the drain signal, the client-left watch), each of which re-registers its waker: about a fifth of the
//! gateway's instructions per event. Behind `Quiet` such a future registers a waker of its own once; until that
//! waker fires, polling it costs one atomic swap.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use atomic_waker::AtomicWaker;

struct Flag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// `F`, polled only after its own waker fired (and once at first).
pub struct Quiet<F> {
    inner: F,
    flag: Arc<Flag>,
    waker: Waker,
}

impl<F> Quiet<F> {
    pub fn new(inner: F) -> Self {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Self {
            inner,
            waker: Waker::from(Arc::clone(&flag)),
            flag,
        }
    }

    /// The future, to change it; the next poll polls it.
    pub fn get_mut(&mut self) -> &mut F {
        self.flag.woken.store(true, Ordering::Release);
        &mut self.inner
    }
}

impl<F: Future + Unpin> Future for Quiet<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.flag.task.register(cx.waker());
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    /// Counts its polls; ready once `ready` is set, waking the waker it was last polled with when set.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: Mutex<Option<Waker>>,
    }

    impl Future for &Probe {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.ready.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn polls_the_future_only_after_its_waker_fired_and_passes_the_wake_on() {
        let probe = Probe::default();
        let task = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        let mut q = Quiet::new(&probe);
        for _ in 0..5 {
            assert!(Pin::new(&mut q).poll(&mut cx).is_pending());
        }
        assert_eq!(probe.polls.load(Ordering::Relaxed), 1, "polled once, at first");
        probe.ready.store(true, Ordering::Release);
        probe.waker.lock().unwrap().take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "the task is woken");
        assert!(Pin::new(&mut q).poll(&mut cx).is_ready());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_changed_future_is_polled_again() {
        let probe = Probe::default();
        let waker = Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        let mut q = Quiet::new(&probe);
        assert!(Pin::new(&mut q).poll(&mut cx).is_pending());
        q.get_mut();
        assert!(Pin::new(&mut q).poll(&mut cx).is_pending());
        assert_eq!(probe.polls.load(Ordering::Relaxed), 2);
    }
}
