//! The socket cap: sockets reserved or open against `websocket.max_sockets`, each place held by its socket's task
//! from the handshake to the close.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Sockets reserved or open, against `websocket.max_sockets`.
pub struct Sockets {
    open: AtomicUsize,
    max: usize,
}

/// One reserved socket; released when its task ends.
pub struct Reserved(Arc<Sockets>);

impl Drop for Reserved {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Sockets {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            open: AtomicUsize::new(0),
            max,
        })
    }

    pub fn reserve(self: &Arc<Self>) -> Option<Reserved> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max).then_some(n + 1))
            .ok()
            .map(|_| Reserved(Arc::clone(self)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_cap_holds_and_frees() {
        let s = Sockets::new(1);
        let a = s.reserve();
        assert!(a.is_some());
        assert!(s.reserve().is_none());
        drop(a);
        assert!(s.reserve().is_some());
    }
}
