//! Incremental SSE decoder following the WHATWG "event stream interpretation"
//! (HTML §9.2.6), with two extensions for legacy upstreams: lone CR as
//! content, and recovery of the old dialect's unprefixed lines.
//!
//! `data:` values are not collected: they are handed on as slices of the
//! input as they arrive (`SseEvent::Data`), so an event of any size costs no
//! memory here. Only short field names and `event`/`id`/`retry` values are
//! buffered, each bounded by [`MAX_FIELD_VALUE`].
//!
//! ```text
//!  Start ──name byte──▶ Name ──':'──▶ Colon ──▶ Data | Value | Skip ──EOL──▶ Start
//!    │ ':'                 └─EOL (field, empty value)──────────────────────▶ Start
//!    └────────▶ Skip (comment)          blank line at Start: dispatch
//! ```

use memchr::memchr2;
use serde::{Deserialize, Serialize};

/// Longest `event`, `id` or `retry` value kept; a longer one is ignored.
pub const MAX_FIELD_VALUE: usize = 4096;

/// Longest field name we need to recognise (`retry`); longer names are
/// unknown fields, skipped without buffering.
const MAX_NAME: usize = 5;

const BOM: &[u8; 3] = b"\xEF\xBB\xBF";

/// Which bytes end a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineEnds {
    /// LF and CRLF; a lone CR is content (the legacy backend frames with LF
    /// and leaves raw CRs from model text in its items, DESIGN 3.6).
    #[default]
    Legacy,
    /// WHATWG: CRLF, LF and lone CR all end a line.
    Strict,
}

/// How event boundaries are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Framing {
    /// The current dialect: a blank line ends the event.
    #[default]
    Current,
    /// The old dialect wrote raw newlines inside items: an event runs from
    /// `data:` up to the next blank line that is followed by `data:` (or end
    /// of input), and unprefixed lines in between are content (DESIGN 3.1).
    /// Dispatch waits for the next `data:` line.
    UnescapedNewlines,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecoderOptions {
    pub line_ends: LineEnds,
    pub framing: Framing,
}

/// What the decoder reports, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SseEvent<'a> {
    /// A piece of the current event's data (one leading space after `data:`
    /// already stripped). Pieces of one line arrive in order.
    Data(&'a [u8]),
    /// A further `data:` line starts in the same event (WHATWG joins lines
    /// with LF; the legacy translator joins them with nothing).
    DataLine,
    /// The event is complete.
    Dispatch {
        event_type: &'a [u8],
        last_event_id: &'a [u8],
    },
    /// End of input inside an event: its data pieces must be dropped.
    Discard,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Data,
    Event,
    Id,
    Retry,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the first byte of a line.
    Start,
    /// Reading a field name (kept in `name`).
    Name,
    /// Just after the colon: one space may follow and is dropped.
    Colon(Field),
    /// Streaming a `data` value.
    Data,
    /// Buffering an `event`, `id` or `retry` value.
    Value(Field),
    /// A comment, an unknown field or an oversized value: skip to EOL.
    Skip,
    /// Old dialect: an unprefixed line that continues the current item.
    Continuation,
}

/// The decoder; feed it bytes split anywhere.
#[derive(Debug)]
pub struct Decoder {
    opts: DecoderOptions,
    /// BOM bytes matched so far at stream start; `None` once decided.
    bom: Option<usize>,
    state: State,
    /// Legacy line ends: a CR ended the last input; a following LF makes it
    /// a line end, anything else makes it content.
    pending_cr: bool,
    /// Strict line ends: the last line ended at a CR; skip one LF.
    skip_lf: bool,
    /// Legacy line ends: whether the upstream frames with CRLF, decided by
    /// its first line end. An LF-framed upstream's CR before LF is content
    /// (a delta that ended in CR), so nothing is lost.
    crlf_framed: Option<bool>,
    name: [u8; MAX_NAME],
    name_len: usize,
    value: Vec<u8>,
    value_overflow: bool,
    /// The current event has had a `data` field.
    has_data: bool,
    /// Old dialect: blank lines seen since the last content line.
    pending_blanks: usize,
    event_type: Vec<u8>,
    last_event_id: Vec<u8>,
    retry: Option<u64>,
}

impl Decoder {
    pub fn new(opts: DecoderOptions) -> Self {
        Self {
            opts,
            bom: Some(0),
            state: State::Start,
            pending_cr: false,
            skip_lf: false,
            crlf_framed: None,
            name: [0; MAX_NAME],
            name_len: 0,
            value: Vec::new(),
            value_overflow: false,
            has_data: false,
            pending_blanks: 0,
            event_type: Vec::new(),
            last_event_id: Vec::new(),
            retry: None,
        }
    }

    /// The reconnection time from the last valid `retry` field, in ms.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    /// Decodes `input`, reporting to `sink`.
    pub fn feed(&mut self, mut input: &[u8], sink: &mut impl FnMut(SseEvent<'_>)) {
        // "The UTF-8 decode algorithm strips one leading UTF-8 Byte Order
        // Mark (BOM), if any."
        if let Some(matched) = self.bom {
            let mut m = matched;
            while m < BOM.len() {
                match input.first() {
                    None => {
                        self.bom = Some(m);
                        return;
                    }
                    Some(&b) if b == BOM[m] => {
                        m += 1;
                        input = &input[1..];
                    }
                    Some(_) => break,
                }
            }
            self.bom = None;
            if m < BOM.len() {
                // Not a BOM after all: the bytes held are ordinary input.
                self.feed_lines(&BOM[..m], sink);
            }
        }
        self.feed_lines(input, sink);
    }

    /// End of input: "any pending data must be discarded", except that the
    /// old dialect's last item is complete once a blank line followed it.
    pub fn finish(&mut self, sink: &mut impl FnMut(SseEvent<'_>)) {
        if self.has_data {
            if self.pending_blanks > 0 {
                self.dispatch_recovered(sink);
            } else {
                sink(SseEvent::Discard);
            }
        }
        self.has_data = false;
        self.pending_blanks = 0;
        self.state = State::Start;
        self.pending_cr = false;
    }

    fn recovering(&self) -> bool {
        self.opts.framing == Framing::UnescapedNewlines && self.has_data
    }

    fn feed_lines(&mut self, mut input: &[u8], sink: &mut impl FnMut(SseEvent<'_>)) {
        if input.is_empty() {
            return;
        }
        if self.pending_cr {
            self.pending_cr = false;
            if input[0] == b'\n' && self.crlf_is_line_end() {
                input = &input[1..];
                self.end_line(sink);
            } else {
                self.content_bytes(b"\r", sink);
            }
        }
        if self.skip_lf && !input.is_empty() {
            self.skip_lf = false;
            if input[0] == b'\n' {
                input = &input[1..];
            }
        }
        while !input.is_empty() {
            input = match self.state {
                State::Data | State::Continuation | State::Skip => self.run(input, sink),
                _ => self.byte(input, sink),
            };
        }
    }

    /// Streams a data/continuation value or skips a line, up to its EOL.
    fn run<'a>(&mut self, input: &'a [u8], sink: &mut impl FnMut(SseEvent<'_>)) -> &'a [u8] {
        let emit = self.state != State::Skip;
        let mut from = 0;
        loop {
            let Some(off) = memchr2(b'\n', b'\r', &input[from..]) else {
                if emit {
                    sink(SseEvent::Data(input))
                }
                return &[];
            };
            let i = from + off;
            if input[i] == b'\r' && self.opts.line_ends == LineEnds::Legacy {
                match input.get(i + 1) {
                    None => {
                        if emit && i > 0 {
                            sink(SseEvent::Data(&input[..i]));
                        }
                        self.pending_cr = true;
                        return &[];
                    }
                    Some(b'\n') if self.crlf_is_line_end() => {}
                    Some(_) => {
                        // A lone CR is content; keep scanning the same run.
                        from = i + 1;
                        continue;
                    }
                }
            }
            if emit && i > 0 {
                sink(SseEvent::Data(&input[..i]));
            }
            return self.line_end_at(input, i, sink);
        }
    }

    /// Legacy line ends: a CRLF is a line end if the upstream frames so.
    fn crlf_is_line_end(&mut self) -> bool {
        *self.crlf_framed.get_or_insert(true)
    }

    /// Handles the EOL byte at `input[i]`; returns what follows it.
    fn line_end_at<'a>(&mut self, input: &'a [u8], i: usize, sink: &mut impl FnMut(SseEvent<'_>)) -> &'a [u8] {
        let rest = &input[i + 1..];
        let rest = if input[i] == b'\r' {
            match rest.first() {
                Some(b'\n') => &rest[1..],
                None if self.opts.line_ends == LineEnds::Strict => {
                    self.skip_lf = true;
                    rest
                }
                None => {
                    // Legacy: undecided CR at end of input.
                    self.pending_cr = true;
                    return rest;
                }
                Some(_) => rest,
            }
        } else {
            self.crlf_framed.get_or_insert(false);
            rest
        };
        self.end_line(sink);
        rest
    }

    /// One byte of a line's start, name or colon; returns the rest.
    fn byte<'a>(&mut self, input: &'a [u8], sink: &mut impl FnMut(SseEvent<'_>)) -> &'a [u8] {
        let b = input[0];
        if b == b'\n' || b == b'\r' {
            if b == b'\r' && self.opts.line_ends == LineEnds::Legacy {
                match input.get(1) {
                    None => {
                        self.pending_cr = true;
                        return &[];
                    }
                    Some(b'\n') if self.crlf_is_line_end() => {}
                    Some(_) => {
                        self.content_bytes(b"\r", sink);
                        return &input[1..];
                    }
                }
            }
            return self.line_end_at(input, 0, sink);
        }
        match self.state {
            State::Start => {
                if b == b':' {
                    if self.recovering() {
                        self.start_continuation(sink);
                        sink(SseEvent::Data(b":"));
                    } else {
                        self.state = State::Skip;
                    }
                } else {
                    self.name[0] = b;
                    self.name_len = 1;
                    self.state = State::Name;
                }
            }
            State::Name => {
                if b == b':' {
                    let field = self.field();
                    if self.recovering() && field != Field::Data {
                        self.continue_with_name(sink);
                        sink(SseEvent::Data(b":"));
                    } else {
                        self.state = State::Colon(field);
                    }
                } else if self.name_len < MAX_NAME {
                    self.name[self.name_len] = b;
                    self.name_len += 1;
                } else if self.recovering() {
                    self.continue_with_name(sink);
                    return input; // this byte is content too
                } else {
                    self.state = State::Skip;
                }
            }
            State::Colon(field) => {
                self.begin_value(field, sink);
                if b == b' ' {
                    return &input[1..];
                }
                return input;
            }
            State::Value(_) => {
                // Buffer up to the EOL.
                let end = memchr2(b'\n', b'\r', input).unwrap_or(input.len());
                if self.value.len() + end > MAX_FIELD_VALUE {
                    self.value_overflow = true;
                } else {
                    self.value.extend_from_slice(&input[..end]);
                }
                return &input[end..];
            }
            State::Data | State::Continuation | State::Skip => unreachable!("handled by run"),
        }
        &input[1..]
    }

    /// A lone CR under legacy line ends: content of whatever line it is in.
    fn content_bytes(&mut self, bytes: &'static [u8], sink: &mut impl FnMut(SseEvent<'_>)) {
        match self.state {
            State::Data | State::Continuation => sink(SseEvent::Data(bytes)),
            State::Start if self.recovering() => {
                self.start_continuation(sink);
                sink(SseEvent::Data(bytes));
            }
            State::Start | State::Name => {
                // A CR in a field name makes an unknown field.
                if self.recovering() {
                    self.continue_with_name(sink);
                    sink(SseEvent::Data(bytes));
                } else {
                    self.state = State::Skip;
                }
            }
            State::Colon(field) => {
                self.begin_value(field, sink);
                self.content_bytes(bytes, sink);
            }
            State::Value(_) => {
                if self.value.len() < MAX_FIELD_VALUE {
                    self.value.extend_from_slice(bytes);
                } else {
                    self.value_overflow = true;
                }
            }
            State::Skip => {}
        }
    }

    fn field(&self) -> Field {
        match &self.name[..self.name_len] {
            b"data" => Field::Data,
            b"event" => Field::Event,
            b"id" => Field::Id,
            b"retry" => Field::Retry,
            _ => Field::Unknown,
        }
    }

    fn begin_value(&mut self, field: Field, sink: &mut impl FnMut(SseEvent<'_>)) {
        match field {
            Field::Data => {
                self.start_data_line(sink);
                self.state = State::Data;
            }
            Field::Unknown => self.state = State::Skip,
            f => {
                self.value.clear();
                self.value_overflow = false;
                self.state = State::Value(f);
            }
        }
    }

    fn start_data_line(&mut self, sink: &mut impl FnMut(SseEvent<'_>)) {
        if self.has_data && self.pending_blanks > 0 {
            // Old dialect: the blank line before this `data:` ended the item.
            self.dispatch_recovered(sink);
        }
        if self.has_data {
            sink(SseEvent::DataLine);
        }
        self.has_data = true;
    }

    /// Old dialect: an unprefixed line inside an item; the newlines that
    /// broke the framing are content.
    fn start_continuation(&mut self, sink: &mut impl FnMut(SseEvent<'_>)) {
        for _ in 0..=self.pending_blanks {
            sink(SseEvent::Data(b"\n"));
        }
        self.pending_blanks = 0;
        self.state = State::Continuation;
    }

    fn continue_with_name(&mut self, sink: &mut impl FnMut(SseEvent<'_>)) {
        let (name, len) = (self.name, self.name_len);
        self.start_continuation(sink);
        sink(SseEvent::Data(&name[..len]));
    }

    fn dispatch_recovered(&mut self, sink: &mut impl FnMut(SseEvent<'_>)) {
        // The last blank line is the terminator; any before it are content.
        for _ in 1..self.pending_blanks {
            sink(SseEvent::Data(b"\n"));
        }
        self.pending_blanks = 0;
        self.dispatch(sink);
    }

    fn dispatch(&mut self, sink: &mut impl FnMut(SseEvent<'_>)) {
        if self.has_data {
            sink(SseEvent::Dispatch {
                event_type: &self.event_type,
                last_event_id: &self.last_event_id,
            });
        }
        self.has_data = false;
        self.event_type.clear();
    }

    fn end_line(&mut self, sink: &mut impl FnMut(SseEvent<'_>)) {
        match self.state {
            State::Start => {
                if self.opts.framing == Framing::UnescapedNewlines && self.has_data {
                    self.pending_blanks += 1;
                } else {
                    self.dispatch(sink);
                }
            }
            State::Name => {
                // "If the line is not empty but does not contain a colon":
                // the whole line is the field name, the value is empty.
                let field = self.field();
                if self.recovering() && field != Field::Data {
                    self.continue_with_name(sink);
                } else {
                    self.begin_value(field, sink);
                    self.apply_value();
                }
            }
            State::Colon(field) => {
                self.begin_value(field, sink);
                self.apply_value();
            }
            State::Value(_) => self.apply_value(),
            State::Data | State::Skip | State::Continuation => {}
        }
        self.state = State::Start;
    }

    fn apply_value(&mut self) {
        let State::Value(field) = self.state else {
            return;
        };
        if self.value_overflow {
            return;
        }
        match field {
            Field::Event => std::mem::swap(&mut self.event_type, &mut self.value),
            // "If the field value does not contain U+0000 NULL, then set the
            // last event ID buffer to the field value."
            Field::Id if !self.value.contains(&0) => std::mem::swap(&mut self.last_event_id, &mut self.value),
            // "If the field value consists of only ASCII digits, then
            // interpret the field value as an integer in base ten."
            Field::Retry if !self.value.is_empty() && self.value.iter().all(u8::is_ascii_digit) => {
                self.retry = std::str::from_utf8(&self.value).ok().and_then(|s| s.parse().ok());
            }
            _ => {}
        }
        self.value.clear();
    }
}

/// A whole body decoded WHATWG-style (data lines joined with LF), for tools and tests that want events rather than
/// pieces: each dispatched event's `(type, data, last event id)`, lossily UTF-8; how many events were discarded
/// (the body ended inside one); the last `retry`. The streaming path never collects like this.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Collected {
    pub events: Vec<(String, String, String)>,
    pub discards: usize,
    pub retry: Option<u64>,
}

/// Decodes `chunks` (one `feed` each), then `finish`es.
pub fn collect(opts: DecoderOptions, chunks: &[&[u8]]) -> Collected {
    let mut d = Decoder::new(opts);
    let mut out = Collected::default();
    let mut data = Vec::new();
    let mut sink = |ev: SseEvent<'_>| match ev {
        SseEvent::Data(b) => data.extend_from_slice(b),
        SseEvent::DataLine => data.push(b'\n'),
        SseEvent::Dispatch {
            event_type,
            last_event_id,
        } => out.events.push((
            String::from_utf8_lossy(event_type).into_owned(),
            String::from_utf8_lossy(&std::mem::take(&mut data)).into_owned(),
            String::from_utf8_lossy(last_event_id).into_owned(),
        )),
        SseEvent::Discard => {
            data.clear();
            out.discards += 1;
        }
    };
    for c in chunks {
        d.feed(c, &mut sink);
    }
    d.finish(&mut sink);
    out.retry = d.retry();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Collects events WHATWG-style: data lines joined with LF.
    pub(crate) fn decode(opts: DecoderOptions, chunks: &[&[u8]]) -> Vec<(String, String, String)> {
        collect(opts, chunks).events
    }

    fn datas(opts: DecoderOptions, input: &[u8]) -> Vec<String> {
        decode(opts, &[input]).into_iter().map(|e| e.1).collect()
    }

    const STRICT: DecoderOptions = DecoderOptions {
        line_ends: LineEnds::Strict,
        framing: Framing::Current,
    };
    const LEGACY: DecoderOptions = DecoderOptions {
        line_ends: LineEnds::Legacy,
        framing: Framing::Current,
    };
    const OLD: DecoderOptions = DecoderOptions {
        line_ends: LineEnds::Legacy,
        framing: Framing::UnescapedNewlines,
    };

    #[test]
    fn every_split_of_a_stream_decodes_alike() {
        let input: &[u8] = b"\xEF\xBB\xBFdata: a\r\n\r\n: c\rdata:b\r\rid: 7\nevent: x\ndata\n\ndata: tail";
        for opts in [STRICT, LEGACY] {
            let whole = decode(opts, &[input]);
            for i in 0..=input.len() {
                for j in i..=input.len() {
                    let got = decode(opts, &[&input[..i], &input[i..j], &input[j..]]);
                    assert_eq!(got, whole, "split at {i},{j} ({opts:?})");
                }
            }
        }
    }

    #[test]
    fn legacy_line_ends_keep_a_lone_cr_as_content() {
        assert_eq!(datas(LEGACY, b"data: a\rb\n\n"), ["a\rb"]);
        assert_eq!(datas(STRICT, b"data: a\rb\n\n"), ["a"]);
        assert_eq!(datas(LEGACY, b"data: a\r\n\r\n"), ["a"]);
        let split = decode(LEGACY, &[b"data: a\r", b"b\r", b"\n\r", b"\n"]);
        assert_eq!(split[0].1, "a\rb");
    }

    #[test]
    fn an_lf_framed_stream_keeps_a_cr_before_lf_as_content() {
        // A delta ending in CR, from an upstream that frames with LF.
        assert_eq!(datas(LEGACY, b"data: a\n\ndata: b\r\n\n"), ["a", "b\r"]);
        // A CRLF-framed upstream: CRLF is its line end throughout.
        assert_eq!(datas(LEGACY, b"data: a\r\n\r\ndata: b\r\n\r\n"), ["a", "b"]);
        let split = decode(LEGACY, &[b"data: a\n\ndata: b\r", b"\n\n"]);
        assert_eq!(split[1].1, "b\r");
    }

    #[test]
    fn old_dialect_recovers_unprefixed_lines() {
        let input = b"data: <x>one\ntwo\n\nthree\n\ndata: [DONE]\n\n";
        assert_eq!(datas(OLD, input), ["<x>one\ntwo\n\nthree", "[DONE]"]);
        // A trailing newline in the item: two blank lines before `data:`.
        assert_eq!(datas(OLD, b"data: a\n\n\ndata: b\n\n"), ["a\n", "b"]);
        // Lines that look like fields or comments are content too.
        assert_eq!(datas(OLD, b"data: a\nid: 3\n:)\n\n"), ["a\nid: 3\n:)"]);
        // Split anywhere, same result.
        let whole = datas(OLD, input);
        for i in 0..input.len() {
            let got: Vec<_> = decode(OLD, &[&input[..i], &input[i..]])
                .into_iter()
                .map(|e| e.1)
                .collect();
            assert_eq!(got, whole, "split at {i}");
        }
    }

    #[test]
    fn an_unfinished_event_is_discarded() {
        assert_eq!(datas(LEGACY, b"data: a\n\ndata: b\n"), ["a"]);
        assert_eq!(datas(OLD, b"data: a\n\ndata: b\n"), ["a"]);
    }

    #[test]
    fn a_long_field_value_is_ignored_not_buffered() {
        let mut input = b"id: ".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_FIELD_VALUE + 1));
        input.extend_from_slice(b"\ndata: d\n\n");
        assert_eq!(decode(STRICT, &[&input]), [("".into(), "d".into(), "".into())]);
    }
}
