//! The envelope sink: the stages above hand it typed pieces (a block's header,
//! delta text, whether it is final) and it owns the budget, the splitting and
//! the counting. Streamed blocks send each delta at once; buffered blocks send
//! full chunks as content arrives and keep the last one back so that it can
//! carry `final:true`. The types frontends read whole are cut where the native
//! formatter cuts them ([`Split::Native`]), and their JSON payloads may be
//! written again in the native text first.

use super::budget::{fitting_prefix, incomplete_utf8_tail, measure, MAX_CHAR_ESCAPED};
use super::{pyjson, BlockHeader, PyStyle, Split};
use crate::pipeline::Observer;
use crate::sse::encoder;

/// Where envelopes go: the output, the observer that counts them, and the
/// budget. Made per `feed` call; `obs` is open so that the stages above can
/// count what is theirs (items, parse errors, unknown tags).
pub struct Sink<'a, O: Observer> {
    out: &'a mut Vec<u8>,
    pub obs: &'a mut O,
    budget: usize,
}

impl<'a, O: Observer> Sink<'a, O> {
    pub fn new(out: &'a mut Vec<u8>, obs: &'a mut O, budget: usize) -> Self {
        Self { out, obs, budget }
    }

    /// Passes the stream's `[DONE]` on.
    pub fn done(&mut self) {
        self.out.extend_from_slice(encoder::DONE);
    }

    /// Writes one envelope, counting it (and counting it oversize if it is).
    pub fn envelope(&mut self, header: &BlockHeader, is_final: bool, delta: &str) {
        let start = self.out.len();
        let n = header.write_event(self.out, is_final, delta);
        self.obs.envelope(header.kind, n);
        self.obs.written(header.kind, &self.out[start..]);
        if n > self.budget {
            self.obs.oversize(header.kind);
        }
    }

    /// Writes one `final:false` envelope with as much of `text` as fits `room`
    /// (at least one character: DESIGN 4's oversize exception); returns the
    /// bytes taken. `guess`: the likely cut, e.g. the previous chunk's length.
    fn envelope_fitting(&mut self, header: &BlockHeader, text: &str, room: usize, guess: usize) -> usize {
        let start = self.out.len();
        let (n, taken) = header.write_event_fitting(self.out, text, room, guess);
        if taken == 0 {
            let one = at_least_one_char(text, 0);
            self.envelope(header, false, &text[..one]);
            return one;
        }
        self.obs.envelope(header.kind, n);
        self.obs.written(header.kind, &self.out[start..]);
        taken
    }

    /// Writes `delta` as as many `final:false` envelopes as the budget needs;
    /// returns how many were written.
    pub fn streamed_delta(&mut self, header: &BlockHeader, mut delta: &str) -> u32 {
        let Some(room) = room(header, self.budget) else {
            self.envelope(header, false, delta);
            return 1;
        };
        let mut n = 0;
        while !delta.is_empty() {
            let at = self.envelope_fitting(header, delta, room, room);
            delta = &delta[at..];
            n += 1;
        }
        n
    }

    /// Writes a complete payload as one buffered block.
    pub fn whole(&mut self, header: BlockHeader, content: &str) {
        let mut c = Chunked::new(header);
        c.write_last(content, self);
        self.obs.block_closed(c.header.kind, c.chunks);
    }

    /// Ends a streamed block (text, thinking) with its empty `final:true` marker, counting the block closed after
    /// the `chunks` deltas before it.
    pub fn end_block(&mut self, header: &BlockHeader, chunks: u32) {
        self.envelope(header, true, "");
        self.obs.block_closed(header.kind, chunks + 1);
    }

    /// Writes a block of one envelope (a citation, an image, a final marker) and counts it closed.
    pub fn single(&mut self, header: &BlockHeader, is_final: bool, delta: &str) {
        self.envelope(header, is_final, delta);
        self.obs.block_closed(header.kind, 1);
    }
}

/// Room for the escaped delta in one envelope of `header`, or `None` when
/// the fixed fields alone fill the budget (sent whole, DESIGN 4).
fn room(header: &BlockHeader, budget: usize) -> Option<usize> {
    budget.checked_sub(header.overhead()).filter(|&r| r > 0)
}

/// The native formatter's room for a delta's unescaped UTF-8 bytes: the budget
/// minus the empty envelope, or the whole budget when that leaves less than
/// [`NATIVE_MIN_ROOM`] (its "degenerate case").
fn native_room(header: &BlockHeader, budget: usize) -> usize {
    match budget.saturating_sub(header.overhead()) {
        r if r < NATIVE_MIN_ROOM => budget,
        r => r,
    }
}

/// Below this room the native formatter gives a delta the whole budget.
const NATIVE_MIN_ROOM: usize = 64;

/// The end of the native formatter's next cut of `text` at `room` bytes,
/// backed off to a character boundary (never to 0: `room` is at least 64).
fn native_cut(text: &str, room: usize) -> usize {
    let mut cut = room.min(text.len());
    while cut > 0 && !text.is_char_boundary(cut) {
        cut -= 1;
    }
    cut.max(text.chars().next().map_or(0, char::len_utf8).min(text.len()))
}

/// A buffered block being written: content in, full chunks out.
#[derive(Debug)]
pub struct Chunked {
    pub header: BlockHeader,
    /// Content not yet written; each byte is validated once, on arrival.
    pending: String,
    /// An incomplete last character (at most 3 bytes) waiting for the rest.
    tail: Vec<u8>,
    /// How much of `pending` is already measured, and its escaped size, so
    /// content arriving in small pieces is measured once, not once per piece.
    measured: usize,
    measured_len: usize,
    /// Length of the last full chunk: where the next one likely ends.
    last_cut: usize,
    chunks: u32,
    /// Bytes that were not UTF-8 were replaced.
    pub invalid_utf8: bool,
    /// Every chunk is `final:false` (a multimodal result's text part).
    never_final: bool,
    /// A JSON payload is written again in this style at the end, if it was
    /// held whole (a native-split type's body).
    reformat: Option<PyStyle>,
    /// Native-split content held whole up to this size, so that it can be
    /// reformatted; past it, chunks go out as they fill.
    hold: usize,
    /// A native-split block has started sending chunks (no reformat then).
    streaming: bool,
}

impl Chunked {
    pub fn new(header: BlockHeader) -> Self {
        Self {
            header,
            pending: String::new(),
            tail: Vec::new(),
            measured: 0,
            measured_len: 0,
            last_cut: usize::MAX,
            chunks: 0,
            invalid_utf8: false,
            never_final: false,
            reformat: None,
            hold: 0,
            streaming: false,
        }
    }

    pub fn never_final(mut self) -> Self {
        self.never_final = true;
        self
    }

    /// Holds the content whole (up to `hold` bytes) and, if it is a JSON
    /// object or array, writes it again as `style` before the native split.
    pub fn reformat_json(mut self, style: PyStyle, hold: usize) -> Self {
        self.reformat = Some(style);
        self.hold = hold;
        self
    }

    pub fn buffered(&self) -> usize {
        self.pending.capacity() + self.tail.capacity()
    }

    /// Appends bytes to `pending`, keeping an incomplete last character in
    /// `tail`. Invalid bytes become U+FFFD exactly as if the content had
    /// arrived in one piece.
    fn append(&mut self, mut input: &[u8]) {
        if !self.tail.is_empty() {
            let mut char_buf = [0u8; 4];
            let have = self.tail.len();
            let want = utf8_len(self.tail[0]).max(have + 1);
            let take = (want - have).min(input.len());
            char_buf[..have].copy_from_slice(&self.tail);
            char_buf[have..have + take].copy_from_slice(&input[..take]);
            match std::str::from_utf8(&char_buf[..have + take]) {
                Ok(c) => {
                    self.pending.push_str(c);
                    self.tail.clear();
                    input = &input[take..];
                }
                Err(e) if e.error_len().is_none() => {
                    // Still incomplete, and `input` is used up.
                    self.tail.extend_from_slice(&input[..take]);
                    return;
                }
                Err(_) => {
                    // Invalid: replace as a whole-input decode would.
                    let mut all = std::mem::take(&mut self.tail);
                    all.extend_from_slice(input);
                    self.append_lossy(&all);
                    return;
                }
            }
        }
        match std::str::from_utf8(input) {
            Ok(s) => self.pending.push_str(s),
            Err(e) if e.error_len().is_none() => {
                let (valid, rest) = input.split_at(e.valid_up_to());
                self.pending.push_str(std::str::from_utf8(valid).unwrap_or_default());
                self.tail.extend_from_slice(rest);
            }
            Err(_) => self.append_lossy(input),
        }
    }

    fn append_lossy(&mut self, input: &[u8]) {
        self.invalid_utf8 = true;
        let end = input.len() - incomplete_utf8_tail(input);
        self.pending.push_str(&String::from_utf8_lossy(&input[..end]));
        self.tail.extend_from_slice(&input[end..]);
    }

    /// Adds content; writes every chunk that is surely not the last.
    pub fn push(&mut self, bytes: &[u8], sink: &mut Sink<impl Observer>) {
        self.append(bytes);
        if self.header.kind.split() == Split::Native {
            self.push_native(sink);
            return;
        }
        let Some(room) = room(&self.header, sink.budget) else {
            return; // fixed fields fill the budget: the whole block goes in one envelope
        };
        // Cheap test first: content that fits even fully escaped stays.
        if self.pending.len() * MAX_CHAR_ESCAPED <= room {
            return;
        }
        // Taken out while chunks are written from it (put back below).
        let mut pending = std::mem::take(&mut self.pending);
        let mut start = 0;
        loop {
            let text = &pending[start..];
            // More than `room` bytes never fit (each takes at least one); less is measured, resuming where the
            // last push stopped.
            if text.len() <= room {
                let (at, used) = measure(&text[self.measured..], room - self.measured_len);
                if self.measured + at == text.len() {
                    // Keep it back: it may be the final chunk.
                    self.measured += at;
                    self.measured_len += used;
                    break;
                }
            }
            start += self.full_chunk(text, room, sink);
        }
        pending.drain(..start);
        self.pending = pending;
    }

    /// Native split: content is held (to be reformatted, or because it may
    /// all fit one envelope); once over `hold`, every cut that is surely not
    /// the last goes out, so memory stays bounded.
    fn push_native(&mut self, sink: &mut Sink<impl Observer>) {
        let room = native_room(&self.header, sink.budget);
        if !self.streaming && self.pending.len() <= self.hold.max(room) {
            return;
        }
        self.streaming = true;
        let mut start = 0;
        while self.pending.len() - start > room {
            let cut = start + native_cut(&self.pending[start..], room);
            sink.envelope(&self.header, false, &self.pending[start..cut]);
            self.chunks += 1;
            start = cut;
        }
        self.pending.drain(..start);
    }

    /// Writes one full `final:false` chunk from the start of `text`, which
    /// does not fit as the last one; returns the bytes it took.
    fn full_chunk(&mut self, text: &str, room: usize, sink: &mut Sink<impl Observer>) -> usize {
        let taken = sink.envelope_fitting(&self.header, text, room, self.last_cut);
        self.last_cut = taken;
        self.chunks += 1;
        self.measured = 0;
        self.measured_len = 0;
        taken
    }

    /// Writes the rest with `final:true` (or `false` for a never-final
    /// part); returns the number of chunks the block took.
    pub fn finish(mut self, sink: &mut Sink<impl Observer>) -> u32 {
        if !self.tail.is_empty() {
            // Input ended inside a character.
            let tail = std::mem::take(&mut self.tail);
            self.invalid_utf8 = true;
            self.pending.push_str(&String::from_utf8_lossy(&tail));
        }
        let mut text = std::mem::take(&mut self.pending);
        if let (Some(style), false) = (self.reformat, self.streaming) {
            if let Some(native) = reformat_json(&text, style) {
                text = native;
            }
        }
        self.write_last(&text, sink);
        sink.obs.block_closed(self.header.kind, self.chunks);
        self.chunks
    }

    /// Writes `text` as the block's last chunks, the very last one final.
    fn write_last(&mut self, text: &str, sink: &mut Sink<impl Observer>) {
        let is_final = !self.never_final;
        if self.header.kind.split() == Split::Native {
            let room = native_room(&self.header, sink.budget);
            let mut rest = text;
            while rest.len() > room {
                let cut = native_cut(rest, room);
                sink.envelope(&self.header, false, &rest[..cut]);
                self.chunks += 1;
                rest = &rest[cut..];
            }
            sink.envelope(&self.header, is_final, rest);
            self.chunks += 1;
            return;
        }
        let Some(room) = room(&self.header, sink.budget) else {
            sink.envelope(&self.header, is_final, text);
            self.chunks += 1;
            return;
        };
        // The final envelope has one byte more room (`true` is shorter than `false`).
        let last_room = if is_final { room + 1 } else { room };
        let mut rest = text;
        loop {
            if rest.len() <= last_room && fitting_prefix(rest, last_room) == rest.len() {
                sink.envelope(&self.header, is_final, rest);
                self.chunks += 1;
                return;
            }
            // Not the last: it gets the `false` envelope's room.
            rest = &rest[self.full_chunk(rest, room, sink)..];
        }
    }
}

/// A cut that makes progress: an envelope whose fixed fields leave no room
/// for even one character carries one anyway (oversize, DESIGN 4).
fn at_least_one_char(s: &str, at: usize) -> usize {
    match at {
        0 => s.chars().next().map_or(0, char::len_utf8),
        n => n,
    }
}

/// Length of the UTF-8 sequence a lead byte starts (1 for anything else).
fn utf8_len(lead: u8) -> usize {
    match lead {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

/// A JSON object or array written again in `style`; `None` for anything else
/// (plain error text, or JSON that does not parse), which stays as it is.
pub fn reformat_json(text: &str, style: PyStyle) -> Option<String> {
    let first = text.trim_start().bytes().next()?;
    if first != b'{' && first != b'[' {
        return None;
    }
    pyjson::reformat(text, style)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{EnvelopeKind, Extras};
    use crate::pipeline::Stats;

    fn lines(out: &[u8]) -> Vec<serde_json::Value> {
        std::str::from_utf8(out)
            .unwrap()
            .split("\n\n")
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn buffered_content_is_chunked_within_budget_and_final_on_the_last() {
        let budget = 256;
        let content: String = "ab\"\\\u{1}é😀\n".repeat(200);
        let bytes = content.as_bytes();
        let mut out = Vec::new();
        let mut stats = Stats::default();
        let mut c = Chunked::new(BlockHeader::new(
            EnvelopeKind::ToolResult,
            "a",
            Extras::new().str("id", "1"),
        ));
        // Feed in odd-sized pieces that split characters.
        let mut sink = Sink::new(&mut out, &mut stats, budget);
        for piece in bytes.chunks(7) {
            c.push(piece, &mut sink);
        }
        let chunks = c.finish(&mut sink);
        let got = lines(&out);
        assert_eq!(got.len() as u32, chunks);
        assert!(chunks > 10);
        for (i, v) in got.iter().enumerate() {
            assert_eq!(v["final"], i + 1 == got.len());
            assert!(!v["delta"].as_str().unwrap().is_empty());
        }
        for l in std::str::from_utf8(&out)
            .unwrap()
            .split("\n\n")
            .filter(|l| !l.is_empty())
        {
            assert!(l.len() - "data: ".len() <= budget, "{}", l.len());
        }
        let joined: String = got.iter().map(|v| v["delta"].as_str().unwrap()).collect();
        assert_eq!(joined, content);
        assert_eq!(stats.oversize, 0);
    }

    #[test]
    fn fixed_fields_over_budget_send_the_block_whole_and_count_it() {
        let mut out = Vec::new();
        let mut stats = Stats::default();
        let src = "x".repeat(400);
        let header = BlockHeader::new(EnvelopeKind::ToolResultImage, "a", Extras::new().str("src", &src));
        Sink::new(&mut out, &mut stats, 256).whole(header, "");
        assert_eq!(lines(&out).len(), 1);
        assert_eq!(stats.oversize, 1);
    }
}
