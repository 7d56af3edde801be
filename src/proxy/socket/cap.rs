//! The socket cap: sockets reserved or open against `websocket.max_sockets`, each place held by its socket's task
//! from the handshake to the close (with its place on its worker's count of open connections).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::proxy::base::held::Open;

/// Sockets reserved or open, against `websocket.max_sockets`.
pub struct Sockets {
    open: AtomicUsize,
    max: usize,
}

/// One reserved socket, counted as an open connection of the worker it is reserved on; released when its task
/// ends.
pub struct Reserved {
    sockets: Arc<Sockets>,
    _worker: Option<Open>,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        self.sockets.open.fetch_sub(1, Ordering::AcqRel);
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
            .map(|_| Reserved {
                sockets: Arc::clone(self),
                _worker: Open::here(),
            })
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
