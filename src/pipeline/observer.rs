//! Plain counters the translator reports into; the proxy turns them into
//! Prometheus metrics. No prometheus types here.

use super::options::Dialect;
use crate::protocol::EnvelopeKind;
use crate::sse::SseEvent;

/// Why an input was rejected. Each is answered by one `error` envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParseErrorKind {
    /// A tag, attribute or CDATA section is malformed.
    Syntax,
    /// An entity other than the XML ones and numeric references, or a DTD.
    Entity,
    /// Bytes that are not UTF-8.
    InvalidUtf8,
    /// An item larger than `max_item_bytes`.
    ItemTooLarge,
    /// End of input inside an item.
    Truncated,
    /// A JSON payload (attribute or raw-dialect event) that does not parse.
    InvalidJson,
    /// Text outside any block, or an event we cannot place.
    Unexpected,
    /// An agent id, tool id or tool name over `envelope::ids::MAX_ID_BYTES` or outside the character set every
    /// envelope repeats safely.
    InvalidId,
}

impl ParseErrorKind {
    pub const ALL: [ParseErrorKind; 8] = [
        ParseErrorKind::Syntax,
        ParseErrorKind::Entity,
        ParseErrorKind::InvalidUtf8,
        ParseErrorKind::ItemTooLarge,
        ParseErrorKind::Truncated,
        ParseErrorKind::InvalidJson,
        ParseErrorKind::Unexpected,
        ParseErrorKind::InvalidId,
    ];

    /// Metric label and the `kind` field of the error envelope.
    pub const fn as_str(self) -> &'static str {
        match self {
            ParseErrorKind::Syntax => "syntax",
            ParseErrorKind::Entity => "entity",
            ParseErrorKind::InvalidUtf8 => "invalid_utf8",
            ParseErrorKind::ItemTooLarge => "item_too_large",
            ParseErrorKind::Truncated => "truncated",
            ParseErrorKind::InvalidJson => "invalid_json",
            ParseErrorKind::Unexpected => "unexpected",
            ParseErrorKind::InvalidId => "invalid_id",
        }
    }
}

/// Hooks the translator calls as it works. Every method has an empty
/// default, so an observer implements only what it records.
pub trait Observer {
    /// One envelope written; `json_bytes` is the size of its JSON object.
    fn envelope(&mut self, _kind: EnvelopeKind, _json_bytes: usize) {}
    /// An envelope sent over budget (a citation, or fixed fields too large).
    fn oversize(&mut self, _kind: EnvelopeKind) {}
    /// A block finished after `chunks` envelopes.
    fn block_closed(&mut self, _kind: EnvelopeKind, _chunks: u32) {}
    /// A legacy item finished; it spanned `events` upstream events and
    /// `lines` `data:` lines (more than one of either is fragmentation).
    fn item(&mut self, _events: u32, _lines: u32) {}
    /// Bad input answered by an `error` envelope.
    fn parse_error(&mut self, _kind: ParseErrorKind) {}
    /// A tag we do not know (logged once per stream by the caller).
    fn unknown_tag(&mut self) {}
    /// A block opened while another was open, or a sibling subagent started
    /// inside a child scope.
    fn scope_conflict(&mut self) {}
    /// The stream's dialect, once its first event settled it (`auto` never: it is told as what it found; a
    /// legacy stream is `xml` unless the options fixed `raw`).
    fn dialect(&mut self, _dialect: Dialect) {}
    /// Each report of the SSE decoder, before the parser reads it: what a trace times and an inspector records.
    fn sse(&mut self, _ev: &SseEvent<'_>) {}
    /// One envelope's SSE event as it was written (`data: {…}\n\n`), right after `envelope` counted it.
    fn written(&mut self, _kind: EnvelopeKind, _event: &[u8]) {}
}

/// Counters for one stream (or summed over many).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Envelopes written, indexed by `EnvelopeKind as usize`.
    pub envelopes: [u64; EnvelopeKind::ALL.len()],
    pub envelope_bytes: u64,
    pub oversize: u64,
    pub blocks: u64,
    pub chunks: u64,
    /// Blocks that needed more than one envelope.
    pub chunked_blocks: u64,
    pub items: u64,
    /// Items that spanned more than one upstream event or `data:` line.
    pub fragmented_items: u64,
    /// Parse errors, indexed like `ParseErrorKind::ALL`.
    pub parse_errors: [u64; ParseErrorKind::ALL.len()],
    pub unknown_tags: u64,
    pub scope_conflicts: u64,
    /// The dialect the stream was read as, once told.
    pub dialect: Option<Dialect>,
}

impl Stats {
    pub fn envelopes_of(&self, kind: EnvelopeKind) -> u64 {
        self.envelopes[kind as usize]
    }

    pub fn parse_errors_of(&self, kind: ParseErrorKind) -> u64 {
        self.parse_errors[kind as usize]
    }

    pub fn total_parse_errors(&self) -> u64 {
        self.parse_errors.iter().sum()
    }
}

impl Observer for Stats {
    fn envelope(&mut self, kind: EnvelopeKind, json_bytes: usize) {
        self.envelopes[kind as usize] += 1;
        self.envelope_bytes += json_bytes as u64;
    }
    fn oversize(&mut self, _kind: EnvelopeKind) {
        self.oversize += 1;
    }
    fn block_closed(&mut self, _kind: EnvelopeKind, chunks: u32) {
        self.blocks += 1;
        self.chunks += u64::from(chunks);
        if chunks > 1 {
            self.chunked_blocks += 1;
        }
    }
    fn item(&mut self, events: u32, lines: u32) {
        self.items += 1;
        if events > 1 || lines > 1 {
            self.fragmented_items += 1;
        }
    }
    fn parse_error(&mut self, kind: ParseErrorKind) {
        self.parse_errors[kind as usize] += 1;
    }
    fn unknown_tag(&mut self) {
        self.unknown_tags += 1;
    }
    fn scope_conflict(&mut self) {
        self.scope_conflicts += 1;
    }
    fn dialect(&mut self, dialect: Dialect) {
        self.dialect = Some(dialect);
    }
}

/// Forwarding through `&mut` lets a caller keep ownership of its observer.
impl<O: Observer + ?Sized> Observer for &mut O {
    fn envelope(&mut self, kind: EnvelopeKind, json_bytes: usize) {
        (**self).envelope(kind, json_bytes)
    }
    fn oversize(&mut self, kind: EnvelopeKind) {
        (**self).oversize(kind)
    }
    fn block_closed(&mut self, kind: EnvelopeKind, chunks: u32) {
        (**self).block_closed(kind, chunks)
    }
    fn item(&mut self, events: u32, lines: u32) {
        (**self).item(events, lines)
    }
    fn parse_error(&mut self, kind: ParseErrorKind) {
        (**self).parse_error(kind)
    }
    fn unknown_tag(&mut self) {
        (**self).unknown_tag()
    }
    fn scope_conflict(&mut self) {
        (**self).scope_conflict()
    }
    fn dialect(&mut self, dialect: Dialect) {
        (**self).dialect(dialect)
    }
    fn sse(&mut self, ev: &SseEvent<'_>) {
        (**self).sse(ev)
    }
    fn written(&mut self, kind: EnvelopeKind, event: &[u8]) {
        (**self).written(kind, event)
    }
}
