//! Bodies of buffered items: CDATA (or plain) content streamed out in
//! chunks as it arrives, with the `]]>` rules of DESIGN 3.3 and 3.6, plus the
//! two containers with children (client tool results, citations).

use super::bytes::{find, partial_suffix, CDATA_OPEN};
use super::escape::{Escape, Unescaper};
use super::tag::attr;
use crate::envelope::chunker::{Chunked, Sink};
use crate::envelope::{BlockHeader, EnvelopeKind, Extras};
use crate::pipeline::{Observer, Options};

const CDATA_CLOSE: &[u8] = b"]]>";

/// Size of the pieces a held prefix is handed to the chunker in.
const FLUSH_PIECE: usize = 4096;

/// Whether `prefix` can start a JSON value: it parses as JSON up to its
/// end. (`[INFO] …` or `{not json` are text; a complete value with more
/// content after it is not one JSON value either.)
fn json_prefix(prefix: &[u8]) -> bool {
    match serde_json::from_slice::<serde::de::IgnoredAny>(prefix) {
        Err(e) => e.is_eof() && !prefix.trim_ascii().is_empty(),
        Ok(_) => false,
    }
}

/// Where a body's CDATA section ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndRule {
    /// At the first `]]></name>`.
    First,
    /// At the `]]></name>` that ends its event: the content may itself hold
    /// `]]>` (server results, errors, meta_files; DESIGN 3.6).
    AtEventEnd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Before the content: whitespace, then `<![CDATA[`, the close tag, or text.
    Start,
    Cdata,
    /// Content without CDATA, up to the close tag.
    Text,
}

/// Where a body's content goes.
#[derive(Debug)]
pub enum Dest {
    Chunked(Chunked),
    /// A client tool result: JSON kept as it stands, text unescaped
    /// (DESIGN 3.6). Raw bytes wait here until the choice is made.
    Sniff {
        chunked: Chunked,
        raw: Vec<u8>,
    },
    /// Collected whole (a citation's text).
    Collect(Vec<u8>),
    Drop,
}

/// The input a body's reader is shown: the unread bytes, whether the current event is complete (`at_end`), and
/// whether no input follows at all (`eof`).
#[derive(Debug, Clone, Copy)]
pub struct Shown<'a> {
    pub rest: &'a [u8],
    pub at_end: bool,
    pub eof: bool,
}

/// What one step of a body's reader did with the input it was shown: how many bytes it consumed, and whether
/// to run again, wait for more input, or close the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStep {
    Continue(usize),
    Wait(usize),
    Done(usize),
}

/// Where to go when the body ends.
#[derive(Debug)]
pub enum Parent {
    Top,
    ToolResult(Box<ToolResultCtx>),
    Citations(Box<CitationsCtx>),
}

#[derive(Debug)]
pub struct Body {
    pub(super) close: Vec<u8>,
    pub(super) phase: Phase,
    pub(super) end_rule: EndRule,
    /// `]]><![CDATA[` joins sections (client results split `]]>` so).
    pub(super) join: bool,
    pub(super) unescape: Unescaper,
    pub(super) sink: Dest,
    pub(super) parent: Parent,
    /// Reused buffer of unescaped content.
    pub(super) scratch: Vec<u8>,
    /// Content was not UTF-8 (replaced).
    pub(super) invalid_utf8: bool,
    /// Collected content went over `max_item_bytes` (the rest was dropped).
    pub(super) overflow: bool,
    /// Close with an empty `final:true` envelope (an unknown tag's content
    /// sent as a text block of its own).
    pub final_marker: bool,
}

impl Body {
    pub fn new(name: &str, end_rule: EndRule, escape: Escape, sink: Dest, parent: Parent) -> Self {
        let mut close = Vec::with_capacity(name.len() + 3);
        close.extend_from_slice(b"</");
        close.extend_from_slice(name.as_bytes());
        close.push(b'>');
        Self {
            close,
            phase: Phase::Start,
            end_rule,
            join: escape == Escape::Client,
            unescape: Unescaper::new(escape),
            sink,
            parent,
            scratch: Vec::new(),
            invalid_utf8: false,
            overflow: false,
            final_marker: false,
        }
    }

    pub fn buffered(&self) -> usize {
        let sink = match &self.sink {
            Dest::Chunked(c) => c.buffered(),
            Dest::Sniff { chunked, raw } => chunked.buffered() + raw.capacity(),
            Dest::Collect(v) => v.capacity(),
            Dest::Drop => 0,
        };
        sink + self.scratch.capacity()
            + match &self.parent {
                Parent::Citations(c) => c.buffered(),
                _ => 0,
            }
    }

    fn push(&mut self, content: &[u8], sink: &mut Sink<impl Observer>, opts: &Options) {
        if content.is_empty() {
            return;
        }
        match &mut self.sink {
            Dest::Sniff { raw, .. } => {
                let room = opts.json_sniff_bytes.saturating_sub(raw.len());
                if content.len() <= room {
                    raw.extend_from_slice(content);
                    return;
                }
                // Too large to hold whole: judge by exactly the first
                // `json_sniff_bytes` (however the reads split them), send
                // them, and hold nothing more.
                let (head, rest) = content.split_at(room);
                raw.extend_from_slice(head);
                let held = std::mem::take(raw);
                self.choose(json_prefix(&held), &held, sink);
                drop(held);
                self.push(rest, sink, opts);
            }
            Dest::Chunked(c) => {
                if self.unescape.is_identity(content) {
                    c.push(content, sink);
                } else {
                    self.scratch.clear();
                    self.unescape.push(content, &mut self.scratch);
                    c.push(&self.scratch, sink);
                }
            }
            Dest::Collect(v) => {
                // Cut at exactly the limit, however the content arrives.
                if !self.overflow {
                    self.unescape.push(content, v);
                    if v.len() > opts.max_item_bytes {
                        v.truncate(opts.max_item_bytes);
                        self.overflow = true;
                    }
                }
            }
            Dest::Drop => {}
        }
    }

    /// Ends sniffing: `json` keeps the escaped text as it stands.
    fn choose(&mut self, json: bool, raw: &[u8], sink: &mut Sink<impl Observer>) {
        let Dest::Sniff { chunked, .. } = std::mem::replace(&mut self.sink, Dest::Drop) else {
            return;
        };
        let mut chunked = chunked;
        if json {
            self.unescape = Unescaper::new(Escape::None);
        }
        // In small pieces, so that the held prefix is not copied whole again.
        for piece in raw.chunks(FLUSH_PIECE) {
            self.scratch.clear();
            self.unescape.push(piece, &mut self.scratch);
            chunked.push(&self.scratch, sink);
        }
        self.sink = Dest::Chunked(chunked);
    }

    /// Content complete: flushes the sink. Returns collected text, if any.
    pub(super) fn finish(&mut self, sink: &mut Sink<impl Observer>) -> Option<Vec<u8>> {
        if let Dest::Sniff { raw, .. } = &mut self.sink {
            let raw = std::mem::take(raw);
            let json = serde_json::from_slice::<serde::de::IgnoredAny>(&raw).is_ok();
            self.choose(json, &raw, sink);
        }
        match std::mem::replace(&mut self.sink, Dest::Drop) {
            Dest::Chunked(mut c) => {
                self.scratch.clear();
                self.unescape.finish(&mut self.scratch);
                c.push(&self.scratch, sink);
                self.invalid_utf8 |= c.invalid_utf8;
                let header = self.final_marker.then(|| c.header.clone());
                c.finish(sink);
                if let Some(h) = header {
                    sink.envelope(&h, true, "");
                }
                None
            }
            Dest::Collect(mut v) => {
                if !self.overflow {
                    self.unescape.finish(&mut v);
                }
                Some(v)
            }
            _ => None,
        }
    }

    /// Reads what it can of `rest`, the unread input (DESIGN 3.3 and 3.6 for where CDATA ends): content goes to
    /// the destination as it arrives, holding back only bytes that may begin the end of the section.
    pub fn step(&mut self, input: Shown<'_>, opts: &Options, sink: &mut Sink<impl Observer>) -> BodyStep {
        match self.phase {
            Phase::Start => self.start(input),
            Phase::Cdata => self.cdata(input, opts, sink),
            Phase::Text => self.text(input, opts, sink),
        }
    }

    /// Before the content: whitespace, then a CDATA section, the close tag, or plain text.
    fn start(&mut self, Shown { rest, eof, .. }: Shown<'_>) -> BodyStep {
        let ws = rest.iter().take_while(|b| b.is_ascii_whitespace()).count();
        let rest = &rest[ws..];
        if rest.is_empty() {
            return BodyStep::Wait(ws);
        }
        if rest.starts_with(CDATA_OPEN) {
            self.phase = Phase::Cdata;
            return BodyStep::Continue(ws + CDATA_OPEN.len());
        }
        if rest.starts_with(&self.close) {
            return BodyStep::Done(ws + self.close.len());
        }
        if (CDATA_OPEN.starts_with(rest) || self.close.starts_with(rest)) && !eof {
            return BodyStep::Wait(ws);
        }
        self.phase = Phase::Text;
        BodyStep::Continue(ws)
    }

    /// Inside a CDATA section: up to a `]]>` that ends it (followed by the close tag, where the end rule says),
    /// or that joins the next section (client results); any other `]]>` is content.
    fn cdata(&mut self, input: Shown<'_>, opts: &Options, sink: &mut Sink<impl Observer>) -> BodyStep {
        let Shown { rest, at_end, eof } = input;
        let Some(i) = find(rest, CDATA_CLOSE) else {
            // Hold a trailing `]` or `]]`: it may start the section's end.
            let hold = if eof { 0 } else { partial_suffix(rest, CDATA_CLOSE) };
            let n = rest.len() - hold;
            self.push(&rest[..n], sink, opts);
            return BodyStep::Wait(n);
        };
        self.push(&rest[..i], sink, opts);
        let after = &rest[i + CDATA_CLOSE.len()..];
        let close_len = self.close.len();
        if self.join && after.starts_with(CDATA_OPEN) {
            return BodyStep::Continue(i + CDATA_CLOSE.len() + CDATA_OPEN.len());
        }
        if after.starts_with(&self.close) {
            let whole_rest = after.len() == close_len;
            if self.end_rule == EndRule::First || (whole_rest && (at_end || eof)) {
                return BodyStep::Done(i + CDATA_CLOSE.len() + close_len);
            }
            if whole_rest {
                // Only the event's end can tell whether this closes the item.
                return BodyStep::Wait(i);
            }
        } else if !eof && ((self.join && CDATA_OPEN.starts_with(after)) || self.close.starts_with(after)) {
            // Too few bytes after `]]>` to decide.
            return BodyStep::Wait(i);
        }
        // The `]]>` is content.
        self.push(CDATA_CLOSE, sink, opts);
        BodyStep::Continue(i + CDATA_CLOSE.len())
    }

    /// Content without CDATA, up to the close tag.
    fn text(&mut self, Shown { rest, eof, .. }: Shown<'_>, opts: &Options, sink: &mut Sink<impl Observer>) -> BodyStep {
        if let Some(i) = find(rest, &self.close) {
            self.push(&rest[..i], sink, opts);
            return BodyStep::Done(i + self.close.len());
        }
        let hold = if eof { 0 } else { partial_suffix(rest, &self.close) };
        let n = rest.len() - hold;
        self.push(&rest[..n], sink, opts);
        BodyStep::Wait(n)
    }

    /// Flushes what arrived and returns the parent, for an item cut short.
    pub fn abandon(mut self, sink: &mut Sink<impl Observer>) -> Option<Box<ToolResultCtx>> {
        self.finish(sink);
        match self.parent {
            Parent::ToolResult(ctx) => Some(ctx),
            Parent::Citations(mut c) => {
                c.flush_final(sink);
                None
            }
            Parent::Top => None,
        }
    }
}

/// A client tool result between its children.
#[derive(Debug)]
pub struct ToolResultCtx {
    pub id: String,
    pub name: String,
    pub agent: String,
    /// A `<text>` or `<image>` child was seen.
    pub multimodal: bool,
}

impl ToolResultCtx {
    pub fn header(&self) -> BlockHeader {
        BlockHeader::new(
            EnvelopeKind::ToolResult,
            &self.agent,
            Extras::new().str("id", &self.id).str("name", &self.name),
        )
    }

    /// One image of a multimodal result (DESIGN 3.2): its own `tool_result_image` envelope with the result's id and
    /// name, always `final:false` (the result's final marker closes the whole).
    pub fn image(&self, src: Option<&str>, media_type: Option<&str>, sink: &mut Sink<impl Observer>) {
        let mut extras = Extras::new().str("id", &self.id).str("name", &self.name);
        for (key, value) in [("src", src), ("media_type", media_type)] {
            if let Some(v) = value {
                extras = extras.str(key, v);
            }
        }
        let header = BlockHeader::new(EnvelopeKind::ToolResultImage, &self.agent, extras);
        sink.single(&header, false, "");
    }

    /// Closes the block: the multimodal final marker, or an empty result.
    pub(super) fn close(&self, sink: &mut Sink<impl Observer>) {
        sink.whole(self.header(), "");
    }

    pub fn abandon(&self, sink: &mut Sink<impl Observer>) {
        self.close(sink);
    }
}

/// Inside `<citations>`: the last citation is held so it can be final.
#[derive(Debug)]
pub struct CitationsCtx {
    pub agent: String,
    /// The citation whose text is being read.
    pub current: Option<Extras>,
    held: Option<(BlockHeader, String)>,
}

impl CitationsCtx {
    pub fn new(agent: &str) -> Self {
        Self {
            agent: agent.to_owned(),
            current: None,
            held: None,
        }
    }

    pub fn buffered(&self) -> usize {
        self.held.as_ref().map_or(0, |(_, t)| t.capacity())
    }

    pub(super) fn add(&mut self, text: String, sink: &mut Sink<impl Observer>) {
        let extras = self.current.take().unwrap_or_default();
        let header = BlockHeader::new(EnvelopeKind::Citation, &self.agent, extras);
        if let Some((h, t)) = self.held.replace((header, text)) {
            // One citation is one message, never split (DESIGN 4).
            sink.single(&h, false, &t);
        }
    }

    pub(super) fn flush_final(&mut self, sink: &mut Sink<impl Observer>) {
        if let Some((h, t)) = self.held.take() {
            sink.single(&h, true, &t);
        }
    }

    pub fn abandon(&mut self, sink: &mut Sink<impl Observer>) {
        self.flush_final(sink);
    }
}

/// Envelope extras from a citation's attributes (DESIGN 3.3): the table's numeric fields as numbers, empty
/// attributes omitted (the legacy formatter writes an absent value as `""`).
pub fn citation_extras(attrs: &[(String, String)]) -> Extras {
    let mut extras = Extras::new();
    if let Some(t) = attr(attrs, "type").filter(|t| !t.is_empty()) {
        extras = extras.str("citation_type", t);
    }
    let fields = EnvelopeKind::Citation.extras();
    for (k, v) in attrs {
        let Some(field) = fields.iter().find(|f| f.name == k.as_str()) else {
            continue;
        };
        if v.is_empty() {
            continue;
        }
        let number = field.number.then(|| v.parse::<i64>().ok()).flatten();
        extras = match number {
            Some(n) => extras.value(k, &n.into()),
            None => extras.str(k, v),
        };
    }
    extras
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Stats;

    /// Runs a body over `input` cut at `cut`, the way the parser does (keeping what a step did not consume), with
    /// the whole input as one event; returns the collected content and whether the body closed.
    fn read(body: &mut Body, input: &[u8], cut: usize) -> (bool, usize) {
        let (mut out, mut stats) = (Vec::new(), Stats::default());
        let mut sink = Sink::new(&mut out, &mut stats, 2048);
        let opts = Options::default();
        let (mut buf, mut pos) = (Vec::new(), 0);
        for (piece, last) in [(&input[..cut], false), (&input[cut..], true)] {
            buf.extend_from_slice(piece);
            loop {
                let shown = Shown {
                    rest: &buf[pos..],
                    at_end: last,
                    eof: false,
                };
                match body.step(shown, &opts, &mut sink) {
                    BodyStep::Continue(n) => pos += n,
                    BodyStep::Wait(n) => {
                        pos += n;
                        break;
                    }
                    BodyStep::Done(n) => return (true, pos + n),
                }
            }
        }
        (false, pos)
    }

    fn collecting(name: &str, end_rule: EndRule, escape: Escape) -> Body {
        Body::new(name, end_rule, escape, Dest::Collect(Vec::new()), Parent::Top)
    }

    fn collected(body: &Body) -> &[u8] {
        match &body.sink {
            Dest::Collect(v) => v,
            _ => b"",
        }
    }

    #[test]
    fn a_server_result_ends_at_the_cdata_end_that_ends_its_event_at_every_split() {
        let input = b"<![CDATA[a ]]></content-block-server_tool_result> b]]></content-block-server_tool_result>";
        for cut in 0..=input.len() {
            let mut b = collecting("content-block-server_tool_result", EndRule::AtEventEnd, Escape::None);
            assert_eq!(read(&mut b, input, cut), (true, input.len()), "cut {cut}");
            assert_eq!(
                collected(&b),
                b"a ]]></content-block-server_tool_result> b",
                "cut {cut}"
            );
        }
    }

    #[test]
    fn a_client_result_joins_split_cdata_sections_and_ends_at_the_first_end() {
        let input = b"<![CDATA[x]]]]><![CDATA[>y]]></content-block-tool_result>rest";
        for cut in 0..=input.len() {
            let mut b = collecting("content-block-tool_result", EndRule::First, Escape::Client);
            assert_eq!(read(&mut b, input, cut), (true, input.len() - 4), "cut {cut}");
            assert_eq!(collected(&b), b"x]]>y", "cut {cut}");
        }
    }

    #[test]
    fn plain_content_without_cdata_runs_to_the_close_tag() {
        let input = b"  a < b</x>";
        for cut in 0..=input.len() {
            let mut b = Body::new(
                "x",
                EndRule::First,
                Escape::None,
                Dest::Collect(Vec::new()),
                Parent::Top,
            );
            assert_eq!(read(&mut b, input, cut), (true, input.len()), "cut {cut}");
            assert_eq!(collected(&b), b"a < b", "cut {cut}");
        }
    }
}
