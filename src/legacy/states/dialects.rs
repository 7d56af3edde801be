//! The parser's JSON dialects (DESIGN 3.7): each whole event goes to the dialect's own module (`cogency`,
//! `agent_sdk`), which writes through the same sink; bad input is reported here, once per event.

use crate::envelope::chunker::Sink;
use crate::legacy::report::Fault;
use crate::legacy::{Active, Flow, Parser, State};
use crate::pipeline::{Observer, ParseErrorKind, StreamEnd};

impl Parser {
    /// One complete event, `buf[start..end]`, of a JSON dialect.
    pub(in crate::legacy) fn dialect_event(
        &mut self,
        start: usize,
        end: usize,
        sink: &mut Sink<impl Observer>,
    ) -> Flow {
        let ev = self.buf[start..end].trim_ascii();
        let result = match &mut self.active {
            Active::Refused => Ok(StreamEnd::Cut),
            _ if ev == b"[DONE]" => {
                match &mut self.active {
                    Active::Cogency(c) => c.done(),
                    Active::AgentSdk(a) => a.done(),
                    _ => {}
                }
                Ok(StreamEnd::Cut)
            }
            Active::Cogency(c) => c.event(ev, &mut self.scopes, &self.opts, sink),
            Active::AgentSdk(a) => a.event(ev, &mut self.scopes, &self.opts, sink),
            Active::Undecided | Active::Legacy => Ok(StreamEnd::Cut),
        };
        self.pos = end;
        // A fixed dialect is the stream's from its first event, read or not.
        self.tell_dialect(sink);
        match result {
            Ok(end) => {
                if end == StreamEnd::Failed {
                    self.end = StreamEnd::Failed;
                }
                self.item_done(sink);
                self.state = State::Idle;
                Flow::Continue
            }
            // One counted `error` for the event, wherever it stands; the run goes on.
            Err(Fault { kind, message }) => self.bad_input(kind, &message, sink),
        }
    }

    /// Closes what the dialect holds open (the upstream failed).
    pub(in crate::legacy) fn close_dialect(&mut self, sink: &mut Sink<impl Observer>) {
        match &mut self.active {
            Active::Cogency(c) => c.close(sink),
            Active::AgentSdk(a) => a.close_all(&mut self.scopes, sink),
            _ => {}
        }
    }

    /// End of input in a JSON dialect: the dialect's own end, then what was cut off.
    pub(in crate::legacy) fn finish_dialect(&mut self, sink: &mut Sink<impl Observer>) -> StreamEnd {
        let cut = self.cut_event || !self.rest().trim_ascii().is_empty();
        // What is open closes, and the cut is said, before the dialect's end: `meta_final` and `[DONE]` come last.
        self.close_dialect(sink);
        if cut {
            self.parse_error(ParseErrorKind::Truncated, "input ended inside an event", sink);
        }
        let end = match &mut self.active {
            Active::Cogency(c) => c.finish(cut, &self.scopes, sink),
            Active::AgentSdk(a) => a.finish(cut, &mut self.scopes, sink),
            // `auto` found no dialect: its one `error` said why nothing was read; the stream is not cut.
            Active::Refused => StreamEnd::Failed,
            Active::Undecided | Active::Legacy => StreamEnd::Cut,
        };
        if self.end != StreamEnd::Failed {
            self.end = end;
        }
        self.end_of_input(sink)
    }
}
