//! The parser's buffered-item states: a body's steps, its end, and a client tool result's children.

use crate::envelope::chunker::{Chunked, Sink};
use crate::legacy::body::{citation_extras, Body, BodyStep, CitationsCtx, Dest, EndRule, Parent, ToolResultCtx};
use crate::legacy::bytes::CDATA_OPEN;
use crate::legacy::escape::Escape;
use crate::legacy::tag::{attr, ReadTag, TagKind};
use crate::legacy::{Flow, Parser, State, TagFault};
use crate::pipeline::{Observer, ParseErrorKind};

impl Parser {
    /// Moves past what the open body's step consumed; closes the body when it is done.
    pub(in crate::legacy) fn body_stepped(
        &mut self,
        b: Box<Body>,
        step: BodyStep,
        sink: &mut Sink<impl Observer>,
    ) -> Flow {
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
    pub(in crate::legacy) fn tool_result_children(
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
                ctx.image(attr(&attrs, "src"), attr(&attrs, "media_type"), sink);
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
    pub(in crate::legacy) fn citations(&mut self, ctx: Box<CitationsCtx>, sink: &mut Sink<impl Observer>) -> Flow {
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
