//! Bodies of buffered items: CDATA (or plain) content streamed out in
//! chunks as it arrives, with the `]]>` rules of DESIGN 3.3 and 3.6, plus the
//! two containers with children (client tool results, citations).

use super::escape::{Escape, Unescaper};
use super::tag::{attr, ReadTag, TagKind};
use super::{find, partial_suffix, Flow, Parser, State, TagFault, CDATA_OPEN};
use crate::envelope::chunker::{Chunked, Sink};
use crate::envelope::{BlockHeader, EnvelopeKind, Extras};
use crate::pipeline::{Observer, Options, ParseErrorKind};

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
enum Phase {
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
    close: Vec<u8>,
    phase: Phase,
    end_rule: EndRule,
    /// `]]><![CDATA[` joins sections (client results split `]]>` so).
    join: bool,
    unescape: Unescaper,
    sink: Dest,
    parent: Parent,
    /// Reused buffer of unescaped content.
    scratch: Vec<u8>,
    /// Content was not UTF-8 (replaced).
    invalid_utf8: bool,
    /// Collected content went over `max_item_bytes` (the rest was dropped).
    overflow: bool,
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
    fn finish(&mut self, sink: &mut Sink<impl Observer>) -> Option<Vec<u8>> {
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

    /// Closes the block: the multimodal final marker, or an empty result.
    fn close(&self, sink: &mut Sink<impl Observer>) {
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

    fn add(&mut self, text: String, sink: &mut Sink<impl Observer>) {
        let extras = self.current.take().unwrap_or_default();
        let header = BlockHeader::new(EnvelopeKind::Citation, &self.agent, extras);
        if let Some((h, t)) = self.held.replace((header, text)) {
            // One citation is one message, never split (DESIGN 4).
            sink.single(&h, false, &t);
        }
    }

    fn flush_final(&mut self, sink: &mut Sink<impl Observer>) {
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

impl Parser {
    /// Moves past what the open body's step consumed; closes the body when it is done.
    pub(super) fn body_stepped(&mut self, b: Box<Body>, step: BodyStep, sink: &mut Sink<impl Observer>) -> Flow {
        let (n, flow) = match step {
            BodyStep::Continue(n) => (n, Flow::Continue),
            BodyStep::Wait(n) => (n, Flow::Wait),
            BodyStep::Done(n) => {
                self.pos += n;
                return self.body_done(b, sink);
            }
        };
        self.pos += n;
        self.state = State::Body(b);
        flow
    }

    fn body_done(&mut self, mut b: Box<Body>, sink: &mut Sink<impl Observer>) -> Flow {
        let collected = b.finish(sink);
        if b.invalid_utf8 {
            self.parse_error(
                ParseErrorKind::InvalidUtf8,
                "content is not UTF-8 (replaced with U+FFFD)",
                sink,
            );
        }
        if b.overflow {
            self.parse_error(
                ParseErrorKind::ItemTooLarge,
                "citation larger than max_item_bytes (cut)",
                sink,
            );
        }
        match b.parent {
            Parent::Top => {
                self.item_done(sink);
                self.state = State::Idle;
            }
            Parent::ToolResult(ctx) => self.state = State::ToolResult(ctx),
            Parent::Citations(mut ctx) => {
                let text = match String::from_utf8(collected.unwrap_or_default()) {
                    Ok(t) => t,
                    Err(e) => {
                        self.parse_error(ParseErrorKind::InvalidUtf8, "citation is not UTF-8", sink);
                        String::from_utf8_lossy(e.as_bytes()).into_owned()
                    }
                };
                ctx.add(text, sink);
                self.state = State::Citations(ctx);
            }
        }
        Flow::Continue
    }

    /// Between the children of a client tool result.
    pub(super) fn tool_result_children(
        &mut self,
        ctx: Box<ToolResultCtx>,
        eof: bool,
        sink: &mut Sink<impl Observer>,
    ) -> Flow {
        self.skip_ws();
        let rest = &self.buf[self.pos..];
        if rest.is_empty() {
            self.state = State::ToolResult(ctx);
            return Flow::Wait;
        }
        if !ctx.multimodal && (rest.starts_with(CDATA_OPEN) || rest[0] != b'<') {
            // A plain result: one CDATA body (or plain text) to the close tag.
            let body = self.client_body(&ctx, "content-block-tool_result", false, Parent::Top);
            self.state = State::Body(Box::new(body));
            return Flow::Continue;
        }
        if CDATA_OPEN.starts_with(rest) && !eof {
            self.state = State::ToolResult(ctx);
            return Flow::Wait;
        }
        // An image's attributes are the client's, with no backslash escape.
        let (ReadTag { kind, name, len, attrs }, mut ctx) =
            match self.child_tag(ctx, State::ToolResult, |_| Escape::None, sink) {
                Ok(read) => read,
                Err(flow) => return flow,
            };
        match (kind, name.as_str()) {
            (TagKind::Close, "content-block-tool_result") => {
                self.pos += len;
                ctx.close(sink);
                self.item_done(sink);
                self.state = State::Idle;
            }
            (TagKind::Open, "text") => {
                self.pos += len;
                ctx.multimodal = true;
                let body = self.client_body(&ctx, "text", true, Parent::Top);
                self.state = State::Body(Box::new(Body {
                    parent: Parent::ToolResult(ctx),
                    ..body
                }));
            }
            (TagKind::Open | TagKind::Empty, "image") => {
                let attrs = match attrs {
                    Ok(a) => a,
                    Err(e) => {
                        self.state = State::ToolResult(ctx);
                        return self.bad_input(ParseErrorKind::Syntax, &e.to_string(), sink);
                    }
                };
                self.pos += len;
                ctx.multimodal = true;
                // The enclosing result's id and name, then the image's own fields.
                let mut extras = Extras::new().str("id", &ctx.id).str("name", &ctx.name);
                for key in ["src", "media_type"] {
                    if let Some(v) = attr(&attrs, key) {
                        extras = extras.str(key, v);
                    }
                }
                let header = BlockHeader::new(EnvelopeKind::ToolResultImage, &ctx.agent, extras);
                sink.envelope(&header, false, "");
                sink.obs.block_closed(EnvelopeKind::ToolResultImage, 1);
                self.state = State::ToolResult(ctx);
            }
            (TagKind::Close, "image") | (TagKind::Close, "text") => {
                self.pos += len;
                self.state = State::ToolResult(ctx);
            }
            (TagKind::Open, _) => {
                // An unknown child: its content is text of the result, or dropped.
                sink.obs.unknown_tag();
                self.pos += len;
                ctx.multimodal = true;
                let keep = self.opts.unknown_tags == crate::pipeline::UnknownTags::Text;
                let mut body = self.client_body(&ctx, &name, true, Parent::Top);
                if !keep {
                    body.sink = Dest::Drop;
                }
                self.state = State::Body(Box::new(Body {
                    parent: Parent::ToolResult(ctx),
                    ..body
                }));
            }
            (TagKind::Empty, _) => {
                sink.obs.unknown_tag();
                self.pos += len;
                self.state = State::ToolResult(ctx);
            }
            (TagKind::Close, other) => {
                let msg = format!("unexpected </{other}> in a tool result");
                self.state = State::ToolResult(ctx);
                return self.bad_input(ParseErrorKind::Syntax, &msg, sink);
            }
        }
        Flow::Continue
    }

    /// A container's next child tag, with the container's context back: while the tag is incomplete, or when it
    /// is bad input, the container's state (`wrap(ctx)`) is put back first, so that waiting keeps it and an error
    /// flushes what it holds.
    fn child_tag<C>(
        &mut self,
        ctx: Box<C>,
        wrap: fn(Box<C>) -> State,
        escape: impl Fn(&str) -> Escape,
        sink: &mut Sink<impl Observer>,
    ) -> Result<(ReadTag, Box<C>), Flow> {
        match self.next_tag(escape) {
            Ok(Some(tag)) => Ok((tag, ctx)),
            Ok(None) => {
                self.state = wrap(ctx);
                Err(Flow::Wait)
            }
            Err(TagFault(kind, message)) => {
                self.state = wrap(ctx);
                Err(self.bad_input(kind, &message, sink))
            }
        }
    }

    /// A body holding client tool result text (DESIGN 3.3, second rule).
    fn client_body(&self, ctx: &ToolResultCtx, close: &str, part: bool, parent: Parent) -> Body {
        let chunked = Chunked::new(ctx.header());
        let chunked = if part { chunked.never_final() } else { chunked };
        Body::new(
            close,
            EndRule::First,
            Escape::Client,
            Dest::Sniff {
                chunked,
                raw: Vec::new(),
            },
            parent,
        )
    }

    /// Between the `<citation>` children of `<citations>`.
    pub(super) fn citations(&mut self, ctx: Box<CitationsCtx>, sink: &mut Sink<impl Observer>) -> Flow {
        // The state stays in place for what follows: waiting, or an error that flushes the held citation.
        self.skip_ws();
        let rest = &self.buf[self.pos..];
        if rest.is_empty() {
            self.state = State::Citations(ctx);
            return Flow::Wait;
        }
        if rest[0] != b'<' {
            self.state = State::Citations(ctx);
            return self.bad_input(ParseErrorKind::Syntax, "text between citations", sink);
        }
        let (ReadTag { kind, name, len, attrs }, mut ctx) =
            match self.child_tag(ctx, State::Citations, |_| Escape::Formatter, sink) {
                Ok(read) => read,
                Err(flow) => return flow,
            };
        let is_citation = name == "citation";
        let closes = kind == TagKind::Close && name == "citations";
        let attrs = if is_citation && kind != TagKind::Close {
            match attrs {
                Ok(a) => Some(a),
                Err(e) => {
                    self.state = State::Citations(ctx);
                    return self.bad_input(ParseErrorKind::Syntax, &e.to_string(), sink);
                }
            }
        } else {
            None
        };
        self.pos += len;
        match (kind, attrs) {
            _ if closes => {
                ctx.flush_final(sink);
                self.item_done(sink);
                self.state = State::Idle;
            }
            (TagKind::Open, Some(attrs)) => {
                ctx.current = Some(citation_extras(&attrs));
                self.state = State::Body(Box::new(Body::new(
                    "citation",
                    EndRule::First,
                    Escape::Formatter,
                    Dest::Collect(Vec::new()),
                    Parent::Citations(ctx),
                )));
            }
            (TagKind::Empty, Some(attrs)) => {
                ctx.current = Some(citation_extras(&attrs));
                ctx.add(String::new(), sink);
                self.state = State::Citations(ctx);
            }
            _ => {
                self.state = State::Citations(ctx);
                return self.bad_input(ParseErrorKind::Syntax, "unexpected tag in citations", sink);
            }
        }
        Flow::Continue
    }
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
