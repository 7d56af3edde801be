//! The raw dialect (DESIGN 3.4): model stream events as JSON, translated as
//! the backend's native JSON formatter would.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::fast::DeltaKind;
use super::report;
use super::scope::Scopes;
use crate::envelope::chunker::Sink;
use crate::envelope::{pyjson, BlockHeader, EnvelopeKind, Extras, PyStyle};
use crate::pipeline::{Observer, ParseErrorKind};

/// The outcome of reading one JSON event.
#[derive(Debug)]
pub enum JsonEvent {
    Done,
    /// The JSON ends early: it may continue in the next SSE event.
    Incomplete,
    Invalid(String),
}

#[derive(Deserialize)]
pub(super) struct RawEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    pub(super) ty: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) index: Option<u64>,
    #[serde(borrow, default)]
    pub(super) delta: Option<RawDelta<'a>>,
    #[serde(default)]
    pub(super) content_block: Option<Map<String, Value>>,
    #[serde(default)]
    pub(super) error: Option<Value>,
    /// `message_start`'s message (its id tells the Agent SDK's later copy of the same message).
    #[serde(borrow, default)]
    pub(super) message: Option<MessageRef<'a>>,
}

#[derive(Deserialize)]
pub(super) struct MessageRef<'a> {
    #[serde(borrow, default)]
    pub(super) id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(super) struct RawDelta<'a> {
    #[serde(rename = "type", borrow, default)]
    pub(super) ty: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) partial_json: Option<Cow<'a, str>>,
    #[serde(default)]
    pub(super) citation: Option<Map<String, Value>>,
}

#[derive(Debug)]
pub(super) enum RawBlock {
    Streamed {
        header: BlockHeader,
        chunks: u32,
        citations: Vec<(Extras, String)>,
        /// Bytes `citations` hold, against `max_item_bytes`.
        cited_bytes: usize,
    },
    Tool {
        header: BlockHeader,
        id: String,
        input: String,
    },
    Ignored,
}

/// Open raw-dialect content blocks by index.
#[derive(Debug, Default)]
pub struct RawBlocks {
    pub(super) open: Vec<(u64, RawBlock)>,
}

impl RawBlocks {
    pub fn buffered(&self) -> usize {
        self.open
            .iter()
            .map(|(_, b)| match b {
                RawBlock::Tool { input, .. } => input.capacity(),
                RawBlock::Streamed { citations, .. } => citations.iter().map(|(_, t)| t.capacity()).sum(),
                RawBlock::Ignored => 0,
            })
            .sum()
    }

    pub(super) fn take(&mut self, index: u64) -> Option<RawBlock> {
        let at = self.open.iter().position(|(i, _)| *i == index)?;
        Some(self.open.remove(at).1)
    }

    pub(super) fn get_mut(&mut self, index: u64) -> Option<&mut RawBlock> {
        self.open.iter_mut().find(|(i, _)| *i == index).map(|(_, b)| b)
    }

    /// One raw model event (DESIGN 3.4): a block opens, takes a delta or stops; `max` bounds what one block
    /// buffers (`max_item_bytes`).
    pub fn event(&mut self, event: RawEvent<'_>, scopes: &mut Scopes, max: usize, sink: &mut Sink<impl Observer>) {
        let index = event.index.unwrap_or(0);
        match event.ty.as_deref().unwrap_or("") {
            "content_block_start" => {
                let cb = event.content_block.unwrap_or_default();
                self.start(index, cb, scopes, sink);
            }
            "content_block_delta" => {
                let Some(delta) = event.delta else {
                    return;
                };
                let ty = delta.ty.as_deref().unwrap_or("");
                let Some(block) = self.get_mut(index) else {
                    report::parse_error(
                        scopes,
                        ParseErrorKind::Unexpected,
                        "delta for a block that is not open",
                        sink,
                    );
                    return;
                };
                if let Some(kind) = DeltaKind::of(ty) {
                    let text = match kind {
                        DeltaKind::InputJson => delta.partial_json,
                        _ => delta.text.or(delta.thinking),
                    };
                    self.piece(index, kind, &text.unwrap_or_default(), scopes, max, sink);
                    return;
                }
                // Signatures emit nothing; other pairs are ignored.
                let RawBlock::Streamed {
                    citations, cited_bytes, ..
                } = block
                else {
                    return;
                };
                if ty != "citations_delta" {
                    return;
                }
                if *cited_bytes > max {
                    report::parse_error(
                        scopes,
                        ParseErrorKind::ItemTooLarge,
                        "citations larger than max_item_bytes",
                        sink,
                    );
                } else if let Some(c) = delta.citation {
                    let (extras, text) = citation(c);
                    *cited_bytes += extras.held_bytes() + text.len();
                    citations.push((extras, text));
                }
            }
            "content_block_stop" => {
                if let Some(block) = self.take(index) {
                    stop(block, scopes, sink);
                }
            }
            "message_start" | "message_delta" | "message_stop" | "ping" => {}
            "error" => {
                let error = event.error.unwrap_or(Value::Null);
                let style = EnvelopeKind::Error.json_text().unwrap_or(PyStyle::Ascii);
                report::error_envelope(scopes, &pyjson::to_string(&error, style), sink);
            }
            other => {
                let msg = format!("unknown raw event type {other:?}");
                report::parse_error(scopes, ParseErrorKind::Unexpected, &msg, sink);
            }
        }
    }

    /// A text, thinking or tool-input delta for the block at `index`; `false` if no block is open there. A delta
    /// of another block's kind is ignored, as natively.
    pub fn piece(
        &mut self,
        index: u64,
        kind: DeltaKind,
        text: &str,
        scopes: &Scopes,
        max: usize,
        sink: &mut Sink<impl Observer>,
    ) -> bool {
        let Some(block) = self.get_mut(index) else {
            return false;
        };
        match (kind, block) {
            (DeltaKind::Text | DeltaKind::Thinking, RawBlock::Streamed { header, chunks, .. }) => {
                *chunks += sink.streamed_delta(header, text);
            }
            (DeltaKind::InputJson, RawBlock::Tool { input, .. }) => {
                if input.len() + text.len() > max {
                    report::parse_error(
                        scopes,
                        ParseErrorKind::ItemTooLarge,
                        "tool input larger than max_item_bytes",
                        sink,
                    );
                } else {
                    input.push_str(text);
                }
            }
            _ => {}
        }
        true
    }

    pub(super) fn start(
        &mut self,
        index: u64,
        mut cb: Map<String, Value>,
        scopes: &mut Scopes,
        sink: &mut Sink<impl Observer>,
    ) {
        let agent = scopes.agent().to_owned();
        let ty = str_field(&cb, "type").to_owned();
        let block = match ty.as_str() {
            "text" | "thinking" => {
                let kind = if ty == "text" {
                    EnvelopeKind::Text
                } else {
                    EnvelopeKind::Thinking
                };
                let header = BlockHeader::new(kind, &agent, Extras::new());
                let initial = str_field(&cb, &ty);
                let chunks = sink.streamed_delta(&header, initial);
                RawBlock::Streamed {
                    header,
                    chunks,
                    citations: Vec::new(),
                    cited_bytes: 0,
                }
            }
            "tool_use" | "server_tool_use" | "mcp_tool_use" => {
                let kind = if ty == "tool_use" {
                    EnvelopeKind::ToolCall
                } else {
                    EnvelopeKind::ServerToolCall
                };
                let id = report::safe_id(scopes, str_field(&cb, "id"), "tool call id", sink).to_owned();
                let tool = report::safe_id(scopes, str_field(&cb, "name"), "tool name", sink);
                let extras = Extras::new().str("id", &id).str("name", tool);
                // Input usually streams as input_json_delta; a non-empty
                // initial input is the whole of it.
                let input = match cb.get("input") {
                    Some(Value::Object(m)) if !m.is_empty() => Value::Object(m.clone()).to_string(),
                    _ => String::new(),
                };
                RawBlock::Tool {
                    header: BlockHeader::new(kind, &agent, extras),
                    id,
                    input,
                }
            }
            t if t.ends_with("_tool_result") => {
                let id = cb
                    .get("tool_use_id")
                    .or_else(|| cb.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let id = report::safe_id(scopes, &id, "tool result id", sink).to_owned();
                let name = cb.get("name").and_then(Value::as_str).unwrap_or(t).to_owned();
                let name = report::safe_id(scopes, &name, "tool result name", sink).to_owned();
                // Structured content stays structured JSON (DESIGN 3.6), in the native text.
                let style = EnvelopeKind::ServerToolResult.json_text().unwrap_or(PyStyle::Ascii);
                let content = match cb.remove("content") {
                    Some(Value::String(s)) => s,
                    Some(Value::Null) | None => String::new(),
                    Some(v) => pyjson::to_string(&v, style),
                };
                let extras = Extras::new().str("id", &id).str("name", &name);
                let header = BlockHeader::new(EnvelopeKind::ServerToolResult, &agent, extras);
                sink.whole(header, &content);
                RawBlock::Ignored
            }
            "redacted_thinking" => RawBlock::Ignored,
            _ => {
                sink.obs.unknown_tag();
                RawBlock::Ignored
            }
        };
        if let Some(old) = self.take(index) {
            sink.obs.scope_conflict();
            stop(old, scopes, sink);
        }
        self.open.push((index, block));
    }

    /// End of stream: streamed blocks get their final marker; tool input
    /// received so far is sent.
    pub fn close_all(&mut self, scopes: &mut Scopes, sink: &mut Sink<impl Observer>) {
        for (_, block) in std::mem::take(&mut self.open) {
            stop(block, scopes, sink);
        }
    }
}

/// `content_block_stop`: close a block (DESIGN 3.4).
pub(super) fn stop(block: RawBlock, scopes: &mut Scopes, sink: &mut Sink<impl Observer>) {
    match block {
        RawBlock::Streamed {
            header,
            chunks,
            citations,
            ..
        } => {
            sink.end_block(&header, chunks);
            // Citations on a stopped text block follow its final marker.
            let n = citations.len();
            for (i, (extras, text)) in citations.into_iter().enumerate() {
                let h = BlockHeader::new(EnvelopeKind::Citation, scopes.agent(), extras);
                sink.envelope(&h, i + 1 == n, &text);
                sink.obs.block_closed(EnvelopeKind::Citation, 1);
            }
        }
        RawBlock::Tool { header, id, input } => {
            // Natively: `json.loads(input) if input else {}`, an input that does not parse dumped as a JSON string.
            let value = match input.trim() {
                "" => Value::Object(Map::new()),
                text => serde_json::from_str(text).unwrap_or(Value::String(input)),
            };
            let style = header.kind.json_text().unwrap_or(PyStyle::Unicode);
            scopes.tool_call(&id);
            sink.whole(header, &pyjson::to_string(&value, style));
        }
        RawBlock::Ignored => {}
    }
}

pub(super) fn str_field<'m>(m: &'m Map<String, Value>, k: &str) -> &'m str {
    m.get(k).and_then(Value::as_str).unwrap_or("")
}

/// Envelope extras of a raw `citations_delta` citation; returns them with the cited text. The header keeps the
/// protocol's fields only (`encrypted_index`, `file_id`, … are dropped) and omits nulls; an empty string is a value,
/// as natively.
pub(super) fn citation(mut c: Map<String, Value>) -> (Extras, String) {
    let text = match c.shift_remove("cited_text") {
        Some(Value::String(s)) => s,
        _ => String::new(),
    };
    let mut extras = Extras::new();
    // Natively `cit.get("type", "unknown")`.
    let ty = c.shift_remove("type").unwrap_or_else(|| Value::from("unknown"));
    extras = extras.value("citation_type", &ty);
    for (k, v) in &c {
        extras = extras.value(k, v);
    }
    (extras, text)
}
