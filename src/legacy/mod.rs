//! Legacy items: the second stage of the pipeline. It receives SSE event
//! data pieces and turns the legacy item stream into envelopes.
//!
//! Items are read as a character stream across events (DESIGN 3.1), while
//! event boundaries still decide the traps of DESIGN 3.6: a text block's
//! close tag counts only where it ends its event; an event that is exactly
//! one complete item is that item even inside an open text block; the
//! backend failure JSON is recognised as the stream's last event.
//!
//! ```text
//!            ┌──────── `<content-block-text>` ───────▶ Text ── close tag at event end ──┐
//!  Idle ─────┼── `<content-block-*_result …>` etc. ──▶ Body (CDATA) ── `]]></…>` ───────┤
//!   ▲  ▲     ├── `<meta_init …>`, tool calls ────────▶ ExpectClose ── `</…>` ─────────────┤
//!   │  │     ├── `<citations>` / client tool_result ─▶ Citations / ToolResult ──────────┤
//!   │  │     └── event not starting with `<` ────────▶ EventItem ([DONE], JSON) ─────────┤
//!   │  └──────────────────────────────────────────────────────────────────────────────────┘
//!   └── SkipEvent (after bad input, to the end of the event)
//! ```
//!
//! The JSON dialects of DESIGN 3.7 (`cogency`, `agent_sdk`) take the `EventItem` path: each whole event goes to
//! the dialect's module (`states/dialects.rs`), chosen by the options or, under `auto`, by the first event
//! (`sniff`).
//!
//! Files run one way: the item types and their own methods (`body`, `text`, `raw`, `failure`, `tag`, `escape`,
//! `kinds`, `scope`, `bytes`, `report`, and the dialects `cogency`, `agent_sdk`, `sniff`) know nothing of the
//! parser; this file holds the `Parser` and its loop; `states/` holds the parser's methods for each family of
//! states, which name both and are named by neither.

mod agent_sdk;
mod body;
mod bytes;
mod cogency;
mod escape;
mod failure;
mod fast;
mod kinds;
mod raw;
mod report;
mod scope;
mod sniff;
mod states;
mod tag;
mod text;

use crate::envelope::chunker::Sink;
use crate::pipeline::{DataJoin, Dialect, Observer, Options, ParseErrorKind, StreamEnd};
use crate::sse::SseEvent;

use agent_sdk::AgentSdk;
use body::{Body, CitationsCtx, Shown, ToolResultCtx};
use cogency::Cogency;
use escape::Escape;
use kinds::ItemKind;
use raw::RawBlocks;
use scope::Scopes;
use tag::{ReadTag, Tag, TagKind, TagScan};
use text::Streamed;

/// Whether a state step made progress or needs more input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Wait,
}

#[derive(Debug)]
enum State {
    /// Between items.
    Idle,
    /// An event that does not start with `<` (`[DONE]`, JSON): judged whole
    /// when the event ends.
    EventItem,
    /// Inside a text or thinking block (the top of `streamed`).
    Text,
    /// An item whose content is in its attributes: waiting for `</name>`.
    ExpectClose(&'static str),
    /// The body of a buffered item.
    Body(Box<Body>),
    /// Inside a client tool result, between its children.
    ToolResult(Box<ToolResultCtx>),
    /// Inside `<citations>`.
    Citations(Box<CitationsCtx>),
    /// After bad input: the rest of the event is dropped.
    SkipEvent,
}

/// The dialect the stream speaks (DESIGN 3.7), once known.
#[derive(Debug)]
enum Active {
    /// `auto`, before the first event.
    Undecided,
    /// Legacy XML items, with raw-dialect JSON events.
    Legacy,
    Cogency(Box<Cogency>),
    AgentSdk(Box<AgentSdk>),
    /// `auto` found no dialect in the first event (JSON none of them sends): the rest is not read.
    Refused,
}

impl Active {
    fn of(dialect: Dialect) -> Self {
        match dialect {
            Dialect::Auto => Active::Undecided,
            Dialect::Xml | Dialect::Raw => Active::Legacy,
            Dialect::Cogency => Active::Cogency(Box::default()),
            Dialect::AgentSdk => Active::AgentSdk(Box::default()),
        }
    }

    /// One JSON event per SSE event, never an XML item.
    fn is_json(&self) -> bool {
        matches!(self, Active::Cogency(_) | Active::AgentSdk(_) | Active::Refused)
    }
}

/// Where a stream position is, for fragmentation counts.
#[derive(Debug, Clone, Copy, Default)]
struct Mark {
    events: u64,
    lines: u64,
}

pub struct Parser {
    opts: Options,
    /// Unconsumed input, `pos` onwards; compacted once per piece.
    buf: Vec<u8>,
    pos: usize,
    state: State,
    /// The next data piece starts a new event.
    event_fresh: bool,
    /// Where the current event's data starts in `buf`.
    event_start: Option<usize>,
    /// The current event began inside an open text block (so it may be an
    /// item in its own right, DESIGN 3.6).
    whole_event: bool,
    /// Part of the current (text) event went out before the event ended; if
    /// it never ends, the rest goes out too rather than being dropped.
    event_streamed: bool,
    /// Events and lines seen so far, and where the current item began.
    seen: Mark,
    item_start: Option<Mark>,
    /// Where the current event began.
    event_mark: Mark,
    tag_scan: TagScan,
    /// Open text/thinking blocks; more than one only after a conflict.
    streamed: Vec<Streamed>,
    /// The current event is an item that interrupted an open text block;
    /// it must end with its event.
    interrupting: bool,
    /// A text event shaped like the backend failure JSON, held to see
    /// whether it is the last event.
    pending_failure: Option<Vec<u8>>,
    /// After an item was abandoned: skip continuation events until one
    /// starts like an item, or one ends like an item (with `>`).
    resync: bool,
    /// The last byte of event data seen.
    last_byte: u8,
    scopes: Scopes,
    raw: RawBlocks,
    /// Reused scratch for unescaped text.
    scratch: Vec<u8>,
    /// The last stream-ending item seen (`[DONE]`, a backend failure).
    end: StreamEnd,
    active: Active,
    /// A JSON dialect's unfinished last event (or, under `auto`, the first) was dropped at the end of input.
    cut_event: bool,
    /// The observer was told the dialect.
    told: bool,
}

/// Tells the observer the dialect `active` reads, once (`told`); `options` tells a fixed `raw` from `xml`.
fn tell_dialect(told: &mut bool, active: &Active, options: Dialect, sink: &mut Sink<impl Observer>) {
    if *told {
        return;
    }
    let dialect = match active {
        Active::Legacy if options == Dialect::Raw => Dialect::Raw,
        Active::Legacy => Dialect::Xml,
        Active::Cogency(_) => Dialect::Cogency,
        Active::AgentSdk(_) => Dialect::AgentSdk,
        Active::Undecided | Active::Refused => return,
    };
    *told = true;
    sink.obs.dialect(dialect);
}

/// Bad input found while reading a tag, reported by the caller.
struct TagFault(ParseErrorKind, String);

impl Parser {
    pub fn new(opts: Options, fallback_agent: &str) -> Self {
        let opts_dialect = opts.dialect;
        Self {
            opts,
            buf: Vec::new(),
            pos: 0,
            state: State::Idle,
            event_fresh: true,
            event_start: Some(0),
            whole_event: false,
            event_streamed: false,
            seen: Mark::default(),
            item_start: None,
            event_mark: Mark::default(),
            tag_scan: TagScan::default(),
            streamed: Vec::new(),
            interrupting: false,
            pending_failure: None,
            resync: false,
            last_byte: 0,
            scopes: Scopes::new(fallback_agent),
            raw: RawBlocks::default(),
            scratch: Vec::new(),
            end: StreamEnd::Cut,
            active: Active::of(opts_dialect),
            cut_event: false,
            told: false,
        }
    }

    pub fn end(&self) -> StreamEnd {
        self.end
    }

    pub fn agent(&self) -> &str {
        self.scopes.agent()
    }

    pub fn root_agent(&self) -> Option<&str> {
        self.scopes.root_agent()
    }

    pub fn buffered_bytes(&self) -> usize {
        let state = match &self.state {
            State::Body(b) => b.buffered(),
            State::Citations(c) => c.buffered(),
            _ => 0,
        };
        let dialect = match &self.active {
            Active::Cogency(c) => c.buffered(),
            Active::AgentSdk(a) => a.buffered(),
            _ => 0,
        };
        self.buf.capacity()
            + self.scratch.capacity()
            + self.pending_failure.as_ref().map_or(0, Vec::capacity)
            + self.raw.buffered()
            + state
            + dialect
    }

    /// One decoder event.
    pub fn on_sse(&mut self, ev: SseEvent<'_>, sink: &mut Sink<impl Observer>) {
        match ev {
            SseEvent::Data(bytes) => {
                if self.event_fresh {
                    self.begin_event(sink);
                }
                self.buf.extend_from_slice(bytes);
                self.last_byte = bytes.last().copied().unwrap_or(self.last_byte);
                self.run(false, false, sink);
                self.compact();
            }
            SseEvent::DataLine => {
                self.seen.lines += 1;
                if self.opts.data_join == DataJoin::Newline {
                    self.buf.push(b'\n');
                }
            }
            SseEvent::Dispatch { .. } => {
                if self.event_fresh {
                    // An event with empty data: nothing to place, but it
                    // still ends whatever was waiting for an event end.
                    self.begin_event(sink);
                }
                self.run(true, false, sink);
                self.end_event(sink);
                self.compact();
            }
            SseEvent::Discard => {
                // "An unfinished event at EOF is dropped": only bytes not
                // yet acted on can be.
                let streamed = self.event_streamed && matches!(self.state, State::Text);
                if !streamed && matches!(self.state, State::Text | State::EventItem | State::Idle) {
                    let keep = self.event_from().min(self.buf.len());
                    let json = self.active.is_json() || matches!(self.active, Active::Undecided);
                    self.cut_event |= json && !self.buf[keep..].trim_ascii().is_empty();
                    self.buf.truncate(keep);
                    // A tag being scanned may have lost its tail.
                    self.tag_scan = TagScan::default();
                }
                self.event_fresh = true;
            }
        }
    }

    fn begin_event(&mut self, sink: &mut Sink<impl Observer>) {
        self.event_fresh = false;
        self.seen.events += 1;
        self.seen.lines += 1;
        self.event_mark = self.seen;
        self.release_held_failure(sink);
        self.event_start = Some(self.buf.len());
        self.whole_event = matches!(self.state, State::Text);
        self.event_streamed = false;
    }

    /// Where the current event's unread bytes begin (`pos` if its start was
    /// already consumed).
    fn event_from(&self) -> usize {
        self.event_start.map_or(self.pos, |s| s.max(self.pos))
    }

    fn end_event(&mut self, sink: &mut Sink<impl Observer>) {
        self.event_fresh = true;
        if std::mem::take(&mut self.interrupting) {
            let unfinished = !matches!(self.state, State::Idle | State::SkipEvent) || self.pos < self.buf.len();
            if unfinished {
                // It looked like one whole item but did not end with its
                // event: bad input, and the text block goes on.
                self.bad_input(
                    ParseErrorKind::Syntax,
                    "an item inside a text block did not end with its event",
                    sink,
                );
                self.pos = self.buf.len();
                self.resync = false;
            }
        }
        if self.resync && self.last_byte == b'>' {
            // The broken item's last fragment has passed.
            self.resync = false;
        }
        if matches!(self.state, State::SkipEvent) {
            self.state = State::Idle;
        }
        if matches!(self.state, State::Idle) && !self.streamed.is_empty() {
            // An item that interrupted a text block is done: back to text.
            self.state = State::Text;
        }
    }

    fn compact(&mut self) {
        if self.pos == 0 {
            return;
        }
        if self.pos >= self.buf.len() {
            self.buf.clear();
        } else {
            self.buf.drain(..self.pos);
        }
        // An event start behind the read position is gone for good: later
        // pieces of the same event must not look like a new event.
        self.event_start = self.event_start.and_then(|s| s.checked_sub(self.pos));
        self.pos = 0;
    }

    /// Runs states until one needs more input. `at_end`: the current event
    /// is complete; `eof`: no more input at all.
    fn run(&mut self, at_end: bool, eof: bool, sink: &mut Sink<impl Observer>) {
        loop {
            // Each state's data goes to its handler, which puts the state back (or moves on).
            let flow = match std::mem::replace(&mut self.state, State::Idle) {
                State::Idle => self.idle(at_end, sink),
                State::EventItem => {
                    self.state = State::EventItem;
                    self.event_item(at_end, eof, sink)
                }
                State::Text => {
                    self.state = State::Text;
                    self.text(at_end, sink)
                }
                State::ExpectClose(name) => {
                    self.state = State::ExpectClose(name);
                    self.expect_close(name, sink)
                }
                State::Body(mut b) => {
                    let shown = Shown {
                        rest: &self.buf[self.pos..],
                        at_end,
                        eof,
                    };
                    let step = b.step(shown, &self.opts, sink);
                    self.body_stepped(b, step, sink)
                }
                State::ToolResult(ctx) => self.tool_result_children(ctx, eof, sink),
                State::Citations(ctx) => self.citations(ctx, sink),
                State::SkipEvent => {
                    self.state = State::SkipEvent;
                    self.pos = self.buf.len();
                    Flow::Wait
                }
            };
            if flow == Flow::Wait {
                return;
            }
        }
    }

    fn rest(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    fn skip_ws(&mut self) {
        let n = self.rest().iter().take_while(|b| b.is_ascii_whitespace()).count();
        self.pos += n;
    }

    fn idle(&mut self, at_end: bool, sink: &mut Sink<impl Observer>) -> Flow {
        if self.pos >= self.buf.len() {
            return Flow::Wait;
        }
        if self.event_start == Some(self.pos) && (self.buf[self.pos] != b'<' || self.active.is_json()) {
            if self.resync {
                self.state = State::SkipEvent;
                return Flow::Continue;
            }
            self.item_start.get_or_insert(self.seen);
            self.state = State::EventItem;
            return Flow::Continue;
        }
        self.skip_ws();
        let Some(&first) = self.rest().first() else {
            return Flow::Wait;
        };
        if first != b'<' {
            return self.bad_input(ParseErrorKind::Unexpected, "text outside any block", sink);
        }
        self.resync = false;
        self.item_start.get_or_insert(self.seen);
        if matches!(self.active, Active::Undecided) {
            self.active = Active::Legacy;
        }
        self.tell_dialect(sink);
        let _ = at_end;
        match self.next_tag(|name| ItemKind::of(name).attribute_escape()) {
            Err(TagFault(kind, message)) => self.bad_input(kind, &message, sink),
            Ok(None) => Flow::Wait,
            Ok(Some(tag)) => {
                self.open_item(tag, sink);
                Flow::Continue
            }
        }
    }

    /// Reads the tag at `pos` (which is `<`), once: `Ok(None)`: incomplete;
    /// `Ok(Some(tag))`: complete, `buf[pos..pos + tag.len]`, not consumed,
    /// its attributes decoded with `escape(name)` (DESIGN 3.3); `Err`: bad
    /// input, for the caller to report once its state is back in place.
    fn next_tag(&mut self, escape: impl Fn(&str) -> Escape) -> Result<Option<ReadTag>, TagFault> {
        let end = self.tag_scan.end(&self.buf[self.pos..]);
        // The limit holds however the tag arrives (whole or in pieces).
        let seen = end.unwrap_or(self.buf.len() - self.pos);
        if seen > self.opts.max_item_bytes {
            self.tag_scan = TagScan::default();
            return Err(TagFault(
                ParseErrorKind::ItemTooLarge,
                "tag larger than max_item_bytes".into(),
            ));
        }
        let Some(len) = end else {
            return Ok(None);
        };
        self.tag_scan = TagScan::default();
        match Tag::parse(&self.buf[self.pos..self.pos + len]) {
            Ok(tag) => Ok(Some(ReadTag {
                kind: tag.kind,
                name: tag.name.to_owned(),
                len,
                attrs: match tag.kind {
                    TagKind::Close => Ok(Vec::new()),
                    _ => tag.attributes(escape(tag.name)),
                },
            })),
            Err(e) => {
                let kind = match e {
                    tag::TagError::Declaration => ParseErrorKind::Entity,
                    tag::TagError::Utf8 => ParseErrorKind::InvalidUtf8,
                    _ => ParseErrorKind::Syntax,
                };
                Err(TagFault(kind, e.to_string()))
            }
        }
    }

    fn event_item(&mut self, at_end: bool, eof: bool, sink: &mut Sink<impl Observer>) -> Flow {
        if self.buf.len() - self.pos > self.opts.max_item_bytes {
            return self.bad_input(ParseErrorKind::ItemTooLarge, "event larger than max_item_bytes", sink);
        }
        if !at_end {
            return Flow::Wait;
        }
        let (start, end) = (self.pos, self.buf.len());
        let trimmed = self.buf[start..end].trim_ascii();
        if trimmed.is_empty() {
            self.pos = end;
            self.item_start = None;
            self.state = State::Idle;
            return Flow::Continue;
        }
        if matches!(self.active, Active::Undecided) {
            self.active = match sniff::sniff(trimmed) {
                sniff::Sniffed::Legacy => Active::Legacy,
                sniff::Sniffed::Cogency => Active::Cogency(Box::default()),
                sniff::Sniffed::AgentSdk => Active::AgentSdk(Box::default()),
                sniff::Sniffed::Unknown => {
                    self.active = Active::Refused;
                    let message = "not a stream of any dialect: its first event is JSON none of them sends";
                    return self.bad_input(ParseErrorKind::Unexpected, message, sink);
                }
            };
        }
        if self.active.is_json() {
            return self.dialect_event(start, end, sink);
        }
        tell_dialect(&mut self.told, &self.active, self.opts.dialect, sink);
        if trimmed == b"[DONE]" {
            sink.done();
            self.end = StreamEnd::Done;
            self.pos = end;
            self.item_done(sink);
            self.state = State::Idle;
            return Flow::Continue;
        }
        if trimmed[0] == b'{' {
            let json = std::mem::take(&mut self.buf);
            let result = self.json_event(&json[start..end], sink);
            self.buf = json;
            match result {
                raw::JsonEvent::Incomplete if !eof => {
                    // A JSON event split across SSE events: keep reading.
                    return Flow::Wait;
                }
                raw::JsonEvent::Incomplete | raw::JsonEvent::Invalid(_) => {
                    let msg = match result {
                        raw::JsonEvent::Invalid(m) => m,
                        _ => "JSON event cut short".to_owned(),
                    };
                    return self.bad_input(ParseErrorKind::InvalidJson, &msg, sink);
                }
                raw::JsonEvent::Done => {}
            }
            self.pos = end;
            self.item_done(sink);
            self.state = State::Idle;
            return Flow::Continue;
        }
        self.bad_input(ParseErrorKind::Unexpected, "text outside any block", sink)
    }

    /// After an item whose content was in its attributes: only `</name>` may follow.
    fn expect_close(&mut self, name: &str, sink: &mut Sink<impl Observer>) -> Flow {
        self.skip_ws();
        if self.rest().is_empty() {
            return Flow::Wait;
        }
        if self.rest()[0] != b'<' {
            return self.bad_input(ParseErrorKind::Syntax, "content where a closing tag was expected", sink);
        }
        match self.next_tag(|_| Escape::None) {
            Err(TagFault(kind, message)) => self.bad_input(kind, &message, sink),
            Ok(None) => Flow::Wait,
            Ok(Some(tag)) => {
                if tag.kind == TagKind::Close && tag.name == name {
                    self.pos += tag.len;
                    self.item_done(sink);
                    self.state = State::Idle;
                    Flow::Continue
                } else {
                    let msg = format!("expected </{name}>");
                    self.bad_input(ParseErrorKind::Syntax, &msg, sink)
                }
            }
        }
    }

    /// Tells the observer the dialect once the first event has settled it.
    pub(in crate::legacy) fn tell_dialect(&mut self, sink: &mut Sink<impl Observer>) {
        tell_dialect(&mut self.told, &self.active, self.opts.dialect, sink);
    }

    /// `data:` lines of the current event so far.
    fn event_lines(&self) -> u32 {
        (self.seen.lines - self.event_mark.lines + 1) as u32
    }

    /// The current item is complete.
    fn item_done(&mut self, sink: &mut Sink<impl Observer>) {
        if let Some(start) = self.item_start.take() {
            let events = (self.seen.events - start.events + 1) as u32;
            let lines = (self.seen.lines - start.lines + 1) as u32;
            sink.obs.item(events, lines);
        }
    }

    /// Reports bad input, drops the rest of the event and resynchronises.
    fn bad_input(&mut self, kind: ParseErrorKind, message: &str, sink: &mut Sink<impl Observer>) -> Flow {
        self.tag_scan = TagScan::default();
        self.abandon_item(sink);
        self.parse_error(kind, message, sink);
        self.item_start = None;
        // A JSON dialect's next event is read afresh; a broken XML item's continuation events are skipped.
        self.resync = !self.active.is_json();
        self.state = State::SkipEvent;
        Flow::Continue
    }

    /// Flushes what an unfinished item holds so that nothing is lost.
    fn abandon_item(&mut self, sink: &mut Sink<impl Observer>) {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Body(b) => {
                let parent = b.abandon(sink);
                if let Some(ctx) = parent {
                    ctx.abandon(sink);
                }
            }
            State::ToolResult(ctx) => ctx.abandon(sink),
            State::Citations(mut ctx) => ctx.abandon(sink),
            _ => {}
        }
    }

    fn safe_id<'a>(&mut self, id: &'a str, what: &str, sink: &mut Sink<impl Observer>) -> &'a str {
        report::safe_id(&self.scopes, id, what, sink)
    }

    fn parse_error(&mut self, kind: ParseErrorKind, message: &str, sink: &mut Sink<impl Observer>) {
        report::parse_error(&self.scopes, kind, message, sink);
    }

    fn error_envelope(&mut self, delta: &str, sink: &mut Sink<impl Observer>) {
        report::error_envelope(&self.scopes, delta, sink);
    }

    /// End of input.
    pub fn finish(&mut self, sink: &mut Sink<impl Observer>) -> StreamEnd {
        if !self.event_fresh {
            // Data without a dispatch never reaches here (the decoder
            // discards it), but be safe.
            self.end_event(sink);
        }
        self.run(true, true, sink);
        if self.active.is_json() || matches!(self.active, Active::Undecided) {
            return self.finish_dialect(sink);
        }
        let failure = self.pending_failure.take();
        let truncated = match &self.state {
            State::Idle | State::Text | State::SkipEvent => !self.rest().trim_ascii().is_empty(),
            _ => true,
        };
        if matches!(self.state, State::Text) {
            // Held bytes (a partial close tag) are text after all.
            let (from, to) = (self.pos, self.buf.len());
            self.emit_text_range(from, to, sink);
            self.pos = to;
        }
        self.abandon_item(sink);
        self.close_streamed(sink);
        self.raw.close_all(&mut self.scopes, sink);
        if let Some(failure) = failure {
            self.backend_failure(&failure, sink);
        }
        if truncated {
            self.parse_error(ParseErrorKind::Truncated, "input ended inside an item", sink);
        }
        self.end_of_input(sink)
    }

    /// The last of `finish`: a stream that did not end as the dialect ends says so, if required.
    fn end_of_input(&mut self, sink: &mut Sink<impl Observer>) -> StreamEnd {
        if self.end == StreamEnd::Cut && self.opts.require_done {
            let delta =
                serde_json::json!({"type": "upstream_error", "message": "upstream ended the stream without [DONE]"});
            self.error_envelope(&delta.to_string(), sink);
        }
        self.buf.clear();
        self.pos = 0;
        self.end
    }

    /// The upstream failed: close what is open and say so.
    pub fn abort(&mut self, message: &str, sink: &mut Sink<impl Observer>) {
        self.release_held_failure(sink);
        self.close_dialect(sink);
        if matches!(self.state, State::Text) {
            // The unfinished event is dropped, unless part of it went out.
            let end = if self.event_streamed {
                self.buf.len()
            } else {
                self.buf.len().min(self.event_from())
            };
            let from = self.pos;
            self.emit_text_range(from, end, sink);
        }
        self.abandon_item(sink);
        self.close_streamed(sink);
        self.raw.close_all(&mut self.scopes, sink);
        let delta = serde_json::json!({"type": "upstream_error", "message": message});
        self.error_envelope(&delta.to_string(), sink);
        self.buf.clear();
        self.pos = 0;
    }
}
