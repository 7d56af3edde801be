//! The parser's handling of the backend's failure (DESIGN 3.1): held inside open text, said at the end.

use crate::envelope::chunker::Sink;
use crate::legacy::failure::failure_shape;
use crate::legacy::Parser;
use crate::pipeline::{Observer, StreamEnd};

impl Parser {
    /// Holds `buf[from..]`, an event shaped like the failure inside an open text block, until the next event.
    pub(in crate::legacy) fn hold_failure(&mut self, from: usize) {
        self.pending_failure = Some(self.buf[from..].to_vec());
    }

    /// Another event came, or the upstream broke off: the held event was model text after all.
    pub(in crate::legacy) fn release_held_failure(&mut self, sink: &mut Sink<impl Observer>) {
        if let Some(held) = self.pending_failure.take() {
            self.emit_text_bytes(&held, sink);
        }
    }

    /// A JSON event of the failure's shape between items (either dialect): everything open is closed, then the
    /// failure is said. Returns false for any other event.
    pub(in crate::legacy) fn failure_event(&mut self, ev: &[u8], sink: &mut Sink<impl Observer>) -> bool {
        if failure_shape(ev).is_none() {
            return false;
        }
        self.close_streamed(sink);
        self.raw.close_all(&mut self.scopes, sink);
        self.backend_failure(ev, sink);
        true
    }

    /// The backend failed (DESIGN 3.1): an `error` envelope with its JSON.
    pub(in crate::legacy) fn backend_failure(&mut self, raw: &[u8], sink: &mut Sink<impl Observer>) {
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
