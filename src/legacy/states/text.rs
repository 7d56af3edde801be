//! The parser's text state (DESIGN 3.6): what a text event is, and the open blocks' deltas and ends.

use crate::envelope::chunker::Sink;
use crate::envelope::{BlockHeader, EnvelopeKind, Extras};
use crate::legacy::bytes::partial_suffix;
use crate::legacy::escape::{unescape_all, Escape, Unescaper};
use crate::legacy::failure::failure_shape;
use crate::legacy::text::{
    emit_delta, is_complete_item, split_hold, Streamed, STREAM_CUT, TEXT_OPEN, THINKING_CLOSE, THINKING_OPEN,
};
use crate::legacy::{Flow, Parser, State};
use crate::pipeline::{Observer, ParseErrorKind};
use memchr::{memchr, memrchr};

impl Parser {
    pub(in crate::legacy) fn open_streamed(&mut self, kind: EnvelopeKind, sink: &mut Sink<impl Observer>) {
        if !self.streamed.is_empty() {
            // Parallel subagents: another block is open (DESIGN 3.5).
            sink.obs.scope_conflict();
        }
        self.streamed.push(Streamed {
            header: BlockHeader::new(kind, self.scopes.agent(), Extras::new()),
            chunks: 0,
            invalid_utf8: false,
        });
        self.state = State::Text;
    }

    pub(in crate::legacy) fn text(&mut self, at_end: bool, sink: &mut Sink<impl Observer>) -> Flow {
        let len = self.buf.len();
        if !at_end {
            // Too large to hold until the event ends: stream it in cuts of
            // `STREAM_CUT` bytes from the read cursor, so where the reads
            // split the input never changes the output. A close tag's length
            // stays back, so a close tag ending the event is still seen whole.
            let max = self.opts.max_text_event_bytes.max(1);
            let step = max.min(STREAM_CUT);
            while self.buf.len() - self.pos > max + THINKING_CLOSE.len() {
                let from = self.pos;
                let to = from + step - split_hold(&self.buf[from..from + step]);
                self.whole_event = false;
                self.event_streamed = true;
                self.emit_text_range(from, to, sink);
                self.pos = to;
            }
            return Flow::Wait;
        }
        // Each text event is one item (a delta, or the close tag).
        sink.obs.item(1, self.event_lines());
        // 1. The block's close tag ends the event (with held bytes before).
        let region = &self.buf[self.pos..];
        if let Some(i) = self.streamed.iter().rposition(|s| region.ends_with(s.close_tag())) {
            let to = len - self.streamed[i].close_tag().len();
            let from = self.pos;
            self.emit_text_range_to(i, from, to, sink);
            self.pos = len;
            let block = self.streamed.remove(i);
            self.close_block(block, sink);
            self.state = State::Idle;
            return Flow::Continue;
        }
        let ev_from = self.event_from();
        if self.whole_event {
            let ev = &self.buf[ev_from..];
            // 2. An item sent whole while the block is open (an error).
            if is_complete_item(ev) {
                let from = self.pos;
                self.emit_text_range(from, ev_from, sink);
                self.pos = ev_from;
                self.interrupting = true;
                self.state = State::Idle;
                return Flow::Continue;
            }
            // 3. Another block opened while this one is open.
            let sibling = if ev == TEXT_OPEN {
                Some(EnvelopeKind::Text)
            } else if ev == THINKING_OPEN {
                Some(EnvelopeKind::Thinking)
            } else {
                None
            };
            if let Some(kind) = sibling {
                let from = self.pos;
                self.emit_text_range(from, ev_from, sink);
                self.pos = len;
                self.open_streamed(kind, sink);
                return Flow::Wait;
            }
            // 4. Perhaps the backend's failure, if nothing follows it.
            if failure_shape(ev).is_some() {
                let from = self.pos;
                self.emit_text_range(from, ev_from, sink);
                self.hold_failure(ev_from);
                self.pos = len;
                return Flow::Wait;
            }
        }
        // 5. Plain text: everything but a possible start of a close tag.
        let to = len - self.hold_back(self.pos, len);
        let from = self.pos;
        self.emit_text_range(from, to, sink);
        self.pos = to;
        Flow::Wait
    }

    /// How many trailing bytes of `buf[from..to]` must wait for more input:
    /// a possible start of an open block's close tag, an unpaired `\`, or an
    /// incomplete UTF-8 character.
    fn hold_back(&self, from: usize, to: usize) -> usize {
        let region = &self.buf[from..to];
        // A close tag's prefix starts at the last `<` near the end.
        let window = region.len().saturating_sub(THINKING_CLOSE.len());
        if let Some(lt) = memrchr(b'<', &region[window..]).map(|i| window + i) {
            let tail = &region[lt..];
            if self
                .streamed
                .iter()
                .any(|s| partial_suffix(tail, s.close_tag()) == tail.len())
            {
                return region.len() - lt;
            }
        }
        split_hold(region)
    }

    /// Emits `buf[from..to]` as text of the top block.
    pub(in crate::legacy) fn emit_text_range(&mut self, from: usize, to: usize, sink: &mut Sink<impl Observer>) {
        if let Some(top) = self.streamed.len().checked_sub(1) {
            self.emit_text_range_to(top, from, to, sink);
        }
    }

    fn emit_text_range_to(&mut self, block: usize, from: usize, to: usize, sink: &mut Sink<impl Observer>) {
        if from >= to {
            return;
        }
        let raw = &self.buf[from..to];
        let block = &mut self.streamed[block];
        if memchr(b'\\', raw).is_none() {
            // Nothing to unescape: straight from the input buffer.
            emit_delta(block, raw, sink);
            return;
        }
        self.scratch.clear();
        let mut u = Unescaper::new(Escape::Formatter);
        u.push(raw, &mut self.scratch);
        u.finish(&mut self.scratch);
        emit_delta(block, &self.scratch, sink);
    }

    /// Emits held raw bytes (not in `buf`) as text of the top block.
    pub(in crate::legacy) fn emit_text_bytes(&mut self, raw: &[u8], sink: &mut Sink<impl Observer>) {
        if let Some(top) = self.streamed.last_mut() {
            let text = unescape_all(Escape::Formatter, raw);
            emit_delta(top, &text, sink);
        }
    }

    fn close_block(&mut self, block: Streamed, sink: &mut Sink<impl Observer>) {
        sink.end_block(&block.header, block.chunks);
        if block.invalid_utf8 {
            self.parse_error(
                ParseErrorKind::InvalidUtf8,
                "block text is not UTF-8 (replaced with U+FFFD)",
                sink,
            );
        }
        if !self.streamed.is_empty() {
            self.state = State::Text;
        }
    }

    /// Closes every open streamed block, innermost first.
    pub(in crate::legacy) fn close_streamed(&mut self, sink: &mut Sink<impl Observer>) {
        while let Some(block) = self.streamed.pop() {
            self.close_block(block, sink);
        }
        if matches!(self.state, State::Text) {
            self.state = State::Idle;
        }
    }
}
