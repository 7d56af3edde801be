//! What each legacy tag opens (DESIGN 3.2), and the items whose whole
//! content is in their attributes: meta_init, meta_final,
//! awaiting_frontend_tools, tool calls.

use serde_json::Value;

use super::body::{Body, CitationsCtx, Dest, EndRule, Parent, ToolResultCtx};
use super::escape::Escape;
use super::tag::{attr, Tag, TagKind};
use super::text::streamed_kind;
use super::{Parser, State};
use crate::envelope::chunker::{Chunked, Sink};
use crate::envelope::{pyjson, BlockHeader, EnvelopeKind, Extras, PyStyle, Split};
use crate::pipeline::{Observer, ParseErrorKind, UnknownTags};

impl Parser {
    /// A complete tag of `len` bytes at `pos`, seen between items.
    pub(super) fn open_item(&mut self, kind: TagKind, len: usize, sink: &mut Sink<impl Observer>) {
        let (name, attrs) = {
            let Ok(tag) = Tag::parse(&self.buf[self.pos..self.pos + len]) else {
                return;
            };
            let escape = match tag.name {
                "meta_init" | "meta_final" | "awaiting_frontend_tools" | "content-block-tool_result" => Escape::None,
                _ => Escape::Formatter,
            };
            let attrs = if kind == TagKind::Close {
                Ok(Vec::new())
            } else {
                tag.attributes(escape)
            };
            (tag.name.to_owned(), attrs)
        };
        let attrs = match attrs {
            Ok(a) => a,
            Err(e) => {
                let kind = match e {
                    super::tag::TagError::Attribute {
                        source: super::escape::AttrError::Entity(_),
                        ..
                    } => ParseErrorKind::Entity,
                    _ => ParseErrorKind::Syntax,
                };
                self.bad_input(kind, &format!("<{name}>: {e}"), sink);
                return;
            }
        };
        if kind == TagKind::Close {
            self.bad_input(
                ParseErrorKind::Unexpected,
                &format!("</{name}> with nothing open"),
                sink,
            );
            return;
        }
        self.pos += len;
        let empty = kind == TagKind::Empty;
        let agent = self.scopes.agent().to_owned();
        if let Some(k) = streamed_kind(&name) {
            self.item_done(sink);
            self.open_streamed(k, sink);
            self.whole_event = false;
            if empty {
                self.close_streamed(sink);
            }
            return;
        }
        let close_state = if empty {
            State::Idle
        } else {
            State::ExpectClose(name.clone())
        };
        match name.as_str() {
            "meta_init" => {
                self.meta_init(attr(&attrs, "data").unwrap_or(""), sink);
                self.state = close_state;
            }
            "meta_final" | "awaiting_frontend_tools" => {
                let kind = if name == "meta_final" {
                    EnvelopeKind::MetaFinal
                } else {
                    EnvelopeKind::AwaitingFrontendTools
                };
                let data = self.native_json(attr(&attrs, "data").unwrap_or(""), kind, &name, sink);
                sink.whole(BlockHeader::new(kind, &agent, Extras::new()), &data);
                if kind == EnvelopeKind::MetaFinal {
                    self.scopes.meta_final();
                }
                self.state = close_state;
            }
            "content-block-tool_call" | "content-block-server_tool_call" => {
                let kind = if name == "content-block-tool_call" {
                    EnvelopeKind::ToolCall
                } else {
                    EnvelopeKind::ServerToolCall
                };
                let id = self.safe_id(attr(&attrs, "id").unwrap_or(""), "tool call id", sink);
                let tool = self.safe_id(attr(&attrs, "name").unwrap_or(""), "tool name", sink);
                let args = attr(&attrs, "arguments").unwrap_or("").trim();
                // No arguments arrive as the JSON string "" (DESIGN 3.6).
                let args = if args.is_empty() || args == "\"\"" { "{}" } else { args };
                let args = self.native_json(args, kind, &name, sink);
                self.scopes.tool_call(id);
                let extras = Extras::new().str("id", id).str("name", tool);
                sink.whole(BlockHeader::new(kind, &agent, extras), &args);
                self.state = close_state;
            }
            "content-block-tool_result" => {
                let id = self
                    .safe_id(attr(&attrs, "id").unwrap_or(""), "tool result id", sink)
                    .to_owned();
                let tool = self
                    .safe_id(attr(&attrs, "name").unwrap_or(""), "tool name", sink)
                    .to_owned();
                // The parent's call returning closes the child scopes.
                self.scopes.tool_result(&id);
                let ctx = ToolResultCtx {
                    id,
                    name: tool,
                    agent: self.scopes.agent().to_owned(),
                    multimodal: false,
                };
                if empty {
                    let header = BlockHeader::new(
                        EnvelopeKind::ToolResult,
                        &ctx.agent,
                        Extras::new().str("id", &ctx.id).str("name", &ctx.name),
                    );
                    sink.whole(header, "");
                    self.item_done(sink);
                } else {
                    self.state = State::ToolResult(Box::new(ctx));
                }
            }
            "citations" => {
                self.state = if empty {
                    State::Idle
                } else {
                    State::Citations(Box::new(CitationsCtx::new(&agent)))
                };
            }
            _ => {
                let buffered = buffered_kind(&name);
                let (header, escape) = match buffered {
                    Some(EnvelopeKind::ServerToolResult) => {
                        let id = self.safe_id(attr(&attrs, "id").unwrap_or(""), "tool result id", sink);
                        self.scopes.tool_result(id);
                        let stem = name.strip_prefix("content-block-").unwrap_or(&name);
                        let rname = attr(&attrs, "name").filter(|n| !n.is_empty()).unwrap_or(stem);
                        let rname = self.safe_id(rname, "tool result name", sink);
                        let extras = Extras::new().str("id", id).str("name", rname);
                        let agent = self.scopes.agent().to_owned();
                        (
                            BlockHeader::new(EnvelopeKind::ServerToolResult, &agent, extras),
                            Escape::Formatter,
                        )
                    }
                    Some(kind @ EnvelopeKind::MetaFiles) => {
                        (BlockHeader::new(kind, &agent, Extras::new()), Escape::None)
                    }
                    Some(kind) => (BlockHeader::new(kind, &agent, Extras::new()), Escape::Formatter),
                    None => {
                        sink.obs.unknown_tag();
                        let header = BlockHeader::new(EnvelopeKind::Text, &agent, Extras::new());
                        if empty {
                            self.item_done(sink);
                            return;
                        }
                        let sink = match self.opts.unknown_tags {
                            UnknownTags::Text => Dest::Chunked(Chunked::new(header).never_final()),
                            UnknownTags::Drop => Dest::Drop,
                        };
                        let mut body = Body::new(&name, EndRule::First, Escape::Formatter, sink, Parent::Top);
                        body.final_marker = self.opts.unknown_tags == UnknownTags::Text;
                        self.state = State::Body(Box::new(body));
                        return;
                    }
                };
                if empty {
                    sink.whole(header, "");
                    self.item_done(sink);
                    return;
                }
                // Errors and meta_files are read whole: held (bounded) so that their JSON is written natively.
                let chunked = match header.kind.json_text() {
                    Some(style) if header.kind.split() == Split::Native => {
                        Chunked::new(header).reformat_json(style, self.opts.max_item_bytes)
                    }
                    _ => Chunked::new(header),
                };
                let body = Body::new(&name, EndRule::AtEventEnd, escape, Dest::Chunked(chunked), Parent::Top);
                self.state = State::Body(Box::new(body));
            }
        }
        if empty {
            self.item_done(sink);
        }
    }

    fn meta_init(&mut self, data: &str, sink: &mut Sink<impl Observer>) {
        let delta = match serde_json::from_str::<Value>(data) {
            Err(e) => {
                self.parse_error(ParseErrorKind::InvalidJson, &format!("meta_init data: {e}"), sink);
                data.to_owned()
            }
            Ok(mut v) => {
                let get = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
                let (agent, parent, format) = (get("agent_uuid"), get("parent_agent_uuid"), get("format"));
                // An agent id every envelope would repeat must be one (issue 13); a bad one names no scope.
                let agent = agent.filter(|a| self.safe_id(a, "meta_init agent_uuid", sink) == a);
                if self.scopes.meta_init(agent.as_deref(), parent.as_deref()) == super::scope::Opened::Conflict {
                    sink.obs.scope_conflict();
                }
                if self.opts.rewrite_format && matches!(format.as_deref(), Some("xml" | "raw")) {
                    v["format"] = Value::from("json");
                }
                pyjson::to_string(&v, PyStyle::Unicode)
            }
        };
        let header = BlockHeader::new(EnvelopeKind::MetaInit, self.scopes.agent(), Extras::new());
        sink.whole(header, &delta);
    }

    /// A JSON payload of `kind` in the native formatter's text (DESIGN 4); one
    /// that does not parse is reported and sent as it came.
    fn native_json(&mut self, json: &str, kind: EnvelopeKind, what: &str, sink: &mut Sink<impl Observer>) -> String {
        let style = kind.json_text().unwrap_or(PyStyle::Unicode);
        match serde_json::from_str::<Value>(json) {
            Ok(v) => pyjson::to_string(&v, style),
            Err(e) => {
                self.parse_error(ParseErrorKind::InvalidJson, &format!("{what}: {e}"), sink);
                json.to_owned()
            }
        }
    }
}

/// Items read as a body (CDATA), by tag name.
fn buffered_kind(name: &str) -> Option<EnvelopeKind> {
    match name {
        "content-block-error" => Some(EnvelopeKind::Error),
        "content-block-meta_files" => Some(EnvelopeKind::MetaFiles),
        n if n.starts_with("content-block-") && n.ends_with("_tool_result") => Some(EnvelopeKind::ServerToolResult),
        _ => None,
    }
}
