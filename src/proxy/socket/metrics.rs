//! The WebSocket output's metric families: sockets open by kind, messages and batches out, messages in, closes
//! by code, handshakes refused by why, and the bounds that closed a socket.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use super::serve::Closing;
use crate::telemetry::{counter, counters, name, register};

label_enum! {
    /// What a socket reads; the `kind` label of `websocket_sockets`.
    pub enum SocketKind {
        Stream = "stream",
        Session = "session",
    }
}

label_enum! {
    /// Why a handshake was refused (`websocket_refused_total{reason}`).
    pub enum Refused {
        /// An `Origin` neither the operator nor the backend allowed (403).
        Origin = "origin",
        /// `websocket.max_sockets` are open (503).
        Sockets = "sockets",
        /// Not a valid WebSocket handshake, or only subprotocols the gateway does not speak (400/426).
        Handshake = "handshake",
        /// A session asked without bound values (403).
        NoBinding = "no_binding",
    }
}

pub struct SocketMetrics {
    pub sockets: [IntGauge; SocketKind::ALL.len()],
    /// Messages written (a batch counts once).
    pub messages: IntCounter,
    /// Messages that carried more than one queued message.
    pub batches: IntCounter,
    /// Messages carried inside batches.
    pub batched: IntCounter,
    pub received: IntCounter,
    closes: IntCounterVec,
    pub refused: [IntCounter; Refused::ALL.len()],
    pub write_timeouts: IntCounter,
    pub queue_full: IntCounter,
    pub pong_timeouts: IntCounter,
    pub auth_timeouts: IntCounter,
    pub too_big: IntCounter,
    pub session_full: IntCounter,
}

/// Counts a socket open until dropped.
pub struct OpenGuard(IntGauge);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl SocketMetrics {
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        let sockets = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    name("websocket_sockets"),
                    "WebSocket connections open, by what they read.",
                ),
                &["kind"],
            )?,
        )?;
        let limited = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("websocket_limited_total"),
                    "Sockets closed by a bound of docs/WEBSOCKET.md, by bound.",
                ),
                &["limit"],
            )?,
        )?;
        let limit = |l: &str| limited.with_label_values(&[l]);
        let closes = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("websocket_closes_total"),
                    "WebSocket connections closed, by close code.",
                ),
                &["code"],
            )?,
        )?;
        // Each code's series from the start (at zero), so a dashboard or a rule naming it has data before the first
        // close.
        for c in Closing::ALL {
            closes.with_label_values(&[&c.code().to_string()]);
        }
        Ok(Self {
            sockets: SocketKind::ALL.map(|k| sockets.with_label_values(&[k.as_str()])),
            messages: counter(r, "websocket_messages_total", "WebSocket messages written to clients.")?,
            batches: counter(
                r,
                "websocket_batches_total",
                "WebSocket messages that carried several queued messages (written while a write was pending).",
            )?,
            batched: counter(
                r,
                "websocket_batched_messages_total",
                "Messages carried inside batches.",
            )?,
            received: counter(
                r,
                "websocket_received_total",
                "WebSocket messages received from clients.",
            )?,
            closes,
            refused: counters(
                r,
                "websocket_refused_total",
                "WebSocket handshakes refused, by why.",
                "reason",
                Refused::ALL.map(Refused::as_str),
            )?,
            write_timeouts: limit("write_timeout"),
            queue_full: limit("queue_full"),
            pong_timeouts: limit("pong_timeout"),
            auth_timeouts: limit("auth_timeout"),
            too_big: limit("message_size"),
            session_full: limit("session_streams"),
        })
    }

    pub fn opened(&self, kind: SocketKind) -> OpenGuard {
        let g = self.sockets[kind as usize].clone();
        g.inc();
        OpenGuard(g)
    }

    pub fn open_now(&self) -> i64 {
        self.sockets.iter().map(IntGauge::get).sum()
    }

    pub fn closed(&self, code: u16) {
        // Codes come from a small fixed set (`serve::Closing`), so the label's values stay few.
        self.closes.with_label_values(&[&code.to_string()]).inc();
    }

    /// One message written, carrying `count` queued messages.
    pub fn sent(&self, count: usize) {
        self.messages.inc();
        if count > 1 {
            self.batches.inc();
            self.batched.inc_by(count as u64);
        }
    }

    pub fn refuse(&self, why: Refused) {
        self.refused[why as usize].inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_close_code_is_exposed_from_the_start() {
        // Exhaustive, so a new `Closing` stops this compiling: list it here and in `Closing::ALL`.
        let position = |c: Closing| match c {
            Closing::Normal => 0,
            Closing::GoingAway => 1,
            Closing::Protocol => 2,
            Closing::Unsupported => 3,
            Closing::Gone => 4,
            Closing::InvalidData => 5,
            Closing::Policy => 6,
            Closing::TooBig => 7,
            Closing::Error => 8,
            Closing::Gap => 9,
            Closing::Unknown => 10,
            Closing::Cancelled => 11,
            Closing::Behind => 12,
            Closing::Busy => 13,
            Closing::Store => 14,
        };
        for (i, c) in Closing::ALL.into_iter().enumerate() {
            assert_eq!(position(c), i, "{c:?}");
        }
        let r = Registry::new();
        SocketMetrics::register(&r).unwrap();
        let closes = r
            .gather()
            .into_iter()
            .find(|f| f.get_name() == name("websocket_closes_total"))
            .expect("websocket_closes_total exposed before any close");
        let mut codes: Vec<String> = closes
            .get_metric()
            .iter()
            .map(|m| m.get_label()[0].get_value().to_owned())
            .collect();
        codes.sort();
        let mut want: Vec<String> = Closing::ALL.map(|c| c.code().to_string()).into();
        want.sort();
        assert_eq!(codes, want);
    }
}
