//! The gateway process's start-up handshake, shared by the test harnesses that run the real binary: it prints
//! its public and admin addresses on stdout once both listeners are bound.

use std::net::SocketAddr;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// Reads the child's stdout lines until both "proxy listening on" and "admin listening on" have appeared;
/// returns (public, admin). Panics if they do not within `patience`.
pub fn addresses(lines: &Receiver<String>, patience: Duration) -> (SocketAddr, SocketAddr) {
    let (mut addr, mut admin) = (None, None);
    let deadline = Instant::now() + patience;
    while addr.is_none() || admin.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).expect("gateway printed its addresses");
        let parse = |l: &str| l.rsplit("http://").next().and_then(|a| a.parse::<SocketAddr>().ok());
        if line.contains("proxy listening on") {
            addr = parse(&line);
        } else if line.contains("admin listening on") {
            admin = parse(&line);
        }
    }
    (addr.expect("addr"), admin.expect("admin"))
}
