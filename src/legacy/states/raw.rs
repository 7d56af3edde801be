//! The parser's JSON events between legacy items (DESIGN 3.1, 3.4): the backend's failure, or a raw model event.

use crate::envelope::chunker::Sink;
use crate::legacy::raw::{JsonEvent, RawEvent};
use crate::legacy::Parser;
use crate::pipeline::{Dialect, Observer, ParseErrorKind};

impl Parser {
    /// One complete event of JSON: the failure object or a raw model event.
    pub(in crate::legacy) fn json_event(&mut self, ev: &[u8], sink: &mut Sink<impl Observer>) -> JsonEvent {
        if self.failure_event(ev, sink) {
            return JsonEvent::Done;
        }
        let event: RawEvent<'_> = match serde_json::from_slice(ev) {
            Ok(e) => e,
            Err(e) if e.is_eof() => return JsonEvent::Incomplete,
            Err(e) => return JsonEvent::Invalid(e.to_string()),
        };
        if self.opts.dialect == Dialect::Xml {
            self.parse_error(ParseErrorKind::Unexpected, "raw-dialect event in an xml stream", sink);
            return JsonEvent::Done;
        }
        self.raw.event(event, &mut self.scopes, self.opts.max_item_bytes, sink);
        JsonEvent::Done
    }
}
