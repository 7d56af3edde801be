//! The WebSocket output's metric families: sockets open by kind, messages and batches out, messages in, closes
//! by code, handshakes refused by why, and the bounds that closed a socket.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

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

    /// Messages written, each on its own.
    pub fn sent_apart(&self, messages: usize) {
        self.messages.inc_by(messages as u64);
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

/// How a socket closes: its close code (docs/WEBSOCKET.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    Normal,
    GoingAway,
    /// The client broke RFC 6455's framing: unmasked, reserved bits or opcodes, a control frame over 125 bytes or
    /// fragmented, a stray continuation, an invalid close frame.
    Protocol,
    Unsupported,
    /// The connection ended without a close frame (the client went, or reset it): nothing is written, the code
    /// (RFC 6455's "abnormal closure", never sent) only counts it.
    Gone,
    /// A text message that is not UTF-8.
    InvalidData,
    Policy,
    TooBig,
    Error,
    Gap,
    Unknown,
    Cancelled,
    Behind,
    Busy,
    Store,
}

impl Closing {
    /// Every close, in declaration order: `websocket_closes_total` starts each code's series at zero
    /// (`metrics::tests::every_close_code_is_exposed_from_the_start` lists them exhaustively).
    pub const ALL: [Closing; 15] = [
        Closing::Normal,
        Closing::GoingAway,
        Closing::Protocol,
        Closing::Unsupported,
        Closing::Gone,
        Closing::InvalidData,
        Closing::Policy,
        Closing::TooBig,
        Closing::Error,
        Closing::Gap,
        Closing::Unknown,
        Closing::Cancelled,
        Closing::Behind,
        Closing::Busy,
        Closing::Store,
    ];

    pub fn code(self) -> u16 {
        self.parts().0
    }

    pub fn reason(self) -> &'static str {
        self.parts().1
    }

    /// The close code and its reason.
    pub fn parts(self) -> (u16, &'static str) {
        match self {
            Closing::Normal => (1000, "the stream ended"),
            Closing::GoingAway => (1001, "the gateway is draining"),
            Closing::Protocol => (1002, "protocol error"),
            Closing::Unsupported => (1003, "unsupported message"),
            Closing::Gone => (1006, "closed without a close frame"),
            Closing::InvalidData => (1007, "invalid UTF-8"),
            Closing::Policy => (1008, "policy"),
            Closing::TooBig => (1009, "message too big"),
            Closing::Error => (1011, "error"),
            Closing::Gap => (4000, "gap: the position is no longer held"),
            Closing::Unknown => (4001, "unknown stream"),
            Closing::Cancelled => (4002, "cancelled"),
            Closing::Behind => (4003, "behind"),
            Closing::Busy => (4004, "busy"),
            Closing::Store => (4005, "the shared store is unavailable"),
        }
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
