//! What each legacy tag opens (DESIGN 3.2), and the items whose whole
//! content is in their attributes: meta_init, meta_final,
//! awaiting_frontend_tools, tool calls.

use serde_json::Value;

use crate::envelope::chunker::{Chunked, Sink};
use crate::envelope::{pyjson, BlockHeader, EnvelopeKind, Extras, PyStyle, Split};
use crate::legacy::body::{Body, CitationsCtx, Dest, EndRule, Parent, ToolResultCtx};
use crate::legacy::kinds::ItemKind;
use crate::legacy::tag::{Element, ReadTag, TagKind};
use crate::legacy::{Parser, State};
use crate::pipeline::{Observer, ParseErrorKind, UnknownTags};

impl Parser {
    /// A complete tag at `pos`, seen between items.
    pub(in crate::legacy) fn open_item(&mut self, tag: ReadTag, sink: &mut Sink<impl Observer>) {
        let ReadTag { kind, name, len, attrs } = tag;
        let attrs = match attrs {
            Ok(a) => a,
            Err(e) => {
                let kind = match e {
                    crate::legacy::tag::TagError::Attribute {
                        source: crate::legacy::escape::AttrError::Entity(_),
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
        let item = ItemKind::of(&name);
        let el = Element { name, attrs };
        // Items whose content is in their attributes wait for their close tag (unless `<…/>`).
        let expect_close = match item.attribute_item_name() {
            Some(name) if !empty => State::ExpectClose(name),
            _ => State::Idle,
        };
        match item {
            ItemKind::Streamed(k) => {
                self.item_done(sink);
                self.open_streamed(k, sink);
                self.whole_event = false;
                if empty {
                    self.close_streamed(sink);
                }
                return;
            }
            ItemKind::MetaInit => {
                self.meta_init(el.attr("data").unwrap_or(""), sink);
                self.state = expect_close;
            }
            ItemKind::DataAttribute(k) => {
                let data = self.native_json(el.attr("data").unwrap_or(""), k, &el.name, sink);
                sink.whole(BlockHeader::new(k, self.scopes.agent(), Extras::new()), &data);
                if k == EnvelopeKind::MetaFinal {
                    self.scopes.meta_final();
                }
                self.state = expect_close;
            }
            ItemKind::ToolCall(k) => {
                self.tool_call(k, &el, sink);
                self.state = expect_close;
            }
            ItemKind::ClientToolResult => {
                let ctx = self.client_tool_result(&el, sink);
                if empty {
                    sink.whole(ctx.header(), "");
                } else {
                    self.state = State::ToolResult(Box::new(ctx));
                    return;
                }
            }
            ItemKind::Citations if !empty => {
                self.state = State::Citations(Box::new(CitationsCtx::new(self.scopes.agent())));
            }
            ItemKind::Citations => {}
            ItemKind::ServerToolResult | ItemKind::Body(_) => {
                let header = self.body_header(item, &el, sink);
                if empty {
                    sink.whole(header, "");
                } else {
                    self.state = State::Body(Box::new(self.item_body(item, &el.name, header)));
                    return;
                }
            }
            ItemKind::Unknown => {
                sink.obs.unknown_tag();
                if !empty {
                    self.state = State::Body(Box::new(self.unknown_body(&el.name)));
                    return;
                }
            }
        }
        if empty {
            self.item_done(sink);
        }
    }

    /// A tool call: its arguments as the native formatter writes them (`""` is no input: `{}`, DESIGN 3.6).
    fn tool_call(&mut self, kind: EnvelopeKind, el: &Element, sink: &mut Sink<impl Observer>) {
        let id = self.safe_id(el.attr("id").unwrap_or(""), "tool call id", sink);
        let tool = self.safe_id(el.attr("name").unwrap_or(""), "tool name", sink);
        let args = el.attr("arguments").unwrap_or("").trim();
        let args = if args.is_empty() || args == "\"\"" { "{}" } else { args };
        let args = self.native_json(args, kind, &el.name, sink);
        self.scopes.tool_call(id);
        let extras = Extras::new().str("id", id).str("name", tool);
        sink.whole(BlockHeader::new(kind, self.scopes.agent(), extras), &args);
    }

    /// A client tool result's context; the parent's call returning closes the child scopes (DESIGN 3.5).
    fn client_tool_result(&mut self, el: &Element, sink: &mut Sink<impl Observer>) -> ToolResultCtx {
        let id = self
            .safe_id(el.attr("id").unwrap_or(""), "tool result id", sink)
            .to_owned();
        let name = self
            .safe_id(el.attr("name").unwrap_or(""), "tool name", sink)
            .to_owned();
        self.scopes.tool_result(&id);
        ToolResultCtx {
            id,
            name,
            agent: self.scopes.agent().to_owned(),
            multimodal: false,
        }
    }

    /// The header of a buffered item read as a body: a server tool result's id and name (the attribute, else the
    /// tag's stem, e.g. `web_search_tool_result`), or an error's or meta_files' bare header.
    fn body_header(&mut self, item: ItemKind, el: &Element, sink: &mut Sink<impl Observer>) -> BlockHeader {
        let ItemKind::Body(kind) = item else {
            let id = self.safe_id(el.attr("id").unwrap_or(""), "tool result id", sink);
            self.scopes.tool_result(id);
            let stem = el.name.strip_prefix("content-block-").unwrap_or(&el.name);
            let rname = el.attr("name").filter(|n| !n.is_empty()).unwrap_or(stem);
            let rname = self.safe_id(rname, "tool result name", sink);
            let extras = Extras::new().str("id", id).str("name", rname);
            return BlockHeader::new(EnvelopeKind::ServerToolResult, self.scopes.agent(), extras);
        };
        BlockHeader::new(kind, self.scopes.agent(), Extras::new())
    }

    /// The body of a buffered item. Errors and meta_files are read whole: held (bounded) so that their JSON is
    /// written natively; a server result's CDATA may hold `]]>` (it ends at the one that ends its event).
    fn item_body(&self, item: ItemKind, name: &str, header: BlockHeader) -> Body {
        let chunked = match header.kind.json_text() {
            Some(style) if header.kind.split() == Split::Native => {
                Chunked::new(header).reformat_json(style, self.opts.max_item_bytes)
            }
            _ => Chunked::new(header),
        };
        Body::new(
            name,
            EndRule::AtEventEnd,
            item.body_escape(),
            Dest::Chunked(chunked),
            Parent::Top,
        )
    }

    /// An unknown tag's content: a text block of its own, or dropped (DESIGN 3.2; counted either way).
    fn unknown_body(&self, name: &str) -> Body {
        let header = BlockHeader::new(EnvelopeKind::Text, self.scopes.agent(), Extras::new());
        let dest = match self.opts.unknown_tags {
            UnknownTags::Text => Dest::Chunked(Chunked::new(header).never_final()),
            UnknownTags::Drop => Dest::Drop,
        };
        let mut body = Body::new(name, EndRule::First, ItemKind::Unknown.body_escape(), dest, Parent::Top);
        body.final_marker = self.opts.unknown_tags == UnknownTags::Text;
        body
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
                if self.scopes.meta_init(agent.as_deref(), parent.as_deref()) == crate::legacy::scope::Opened::Conflict
                {
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
