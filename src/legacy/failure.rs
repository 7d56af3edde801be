//! The backend's failure (DESIGN 3.1, 3.6), in one place: when the model stream fails, the backend sends one
//! plain JSON event `{"error", "message", "traceback"}` and ends. Inside an open text block that event looks like
//! a text delta, so it is held until the next event shows whether it was the last: if another follows, it was
//! model text; if the stream ends, the block closes and an `error` envelope carries it (traceback dropped unless
//! `include_traceback`).

use super::Parser;
use crate::envelope::chunker::Sink;
use crate::pipeline::{Observer, StreamEnd};

/// Whether `ev` is the backend failure JSON `{"error","message"[,"traceback"]}`.
pub fn failure_shape(ev: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    let t = ev.trim_ascii();
    if t.first() != Some(&b'{') || t.last() != Some(&b'}') {
        return None;
    }
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(t).ok()?;
    let shaped = map.get("error").is_some_and(|e| e.is_string())
        && map.contains_key("message")
        && map
            .keys()
            .all(|k| matches!(k.as_str(), "error" | "message" | "traceback"));
    shaped.then_some(map)
}

impl Parser {
    /// Holds `buf[from..]`, an event shaped like the failure inside an open text block, until the next event.
    pub(super) fn hold_failure(&mut self, from: usize) {
        self.pending_failure = Some(self.buf[from..].to_vec());
    }

    /// Another event came, or the upstream broke off: the held event was model text after all.
    pub(super) fn release_held_failure(&mut self, sink: &mut Sink<impl Observer>) {
        if let Some(held) = self.pending_failure.take() {
            self.emit_text_bytes(&held, sink);
        }
    }

    /// A JSON event of the failure's shape between items (either dialect): everything open is closed, then the
    /// failure is said. Returns false for any other event.
    pub(super) fn failure_event(&mut self, ev: &[u8], sink: &mut Sink<impl Observer>) -> bool {
        if failure_shape(ev).is_none() {
            return false;
        }
        self.close_streamed(sink);
        self.raw.close_all(&mut self.scopes, sink);
        self.backend_failure(ev, sink);
        true
    }

    /// The backend failed (DESIGN 3.1): an `error` envelope with its JSON.
    pub(super) fn backend_failure(&mut self, raw: &[u8], sink: &mut Sink<impl Observer>) {
        let Some(mut map) = failure_shape(raw) else {
            return;
        };
        if !self.opts.include_traceback {
            map.shift_remove("traceback");
        }
        self.end = StreamEnd::Failed;
        self.error_envelope(&serde_json::Value::Object(map).to_string(), sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_failure_shape_counts() {
        assert!(failure_shape(br#"{"error":"ValueError","message":"m","traceback":"t"}"#).is_some());
        assert!(failure_shape(br#"{"error":"E","message":"m"}"#).is_some());
        assert!(failure_shape(br#"{"error":"E"}"#).is_none());
        assert!(failure_shape(br#"{"error":"E","message":"m","x":1}"#).is_none());
        assert!(failure_shape(b"{not json}").is_none());
    }
}
