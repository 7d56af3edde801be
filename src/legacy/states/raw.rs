//! The parser's JSON events (DESIGN 3.4): a raw model event opens, feeds or stops a block.

use crate::envelope::chunker::Sink;
use crate::envelope::{pyjson, BlockHeader, EnvelopeKind, Extras, PyStyle};
use crate::legacy::raw::{citation, stop, str_field, JsonEvent, RawBlock, RawEvent};
use crate::legacy::Parser;
use crate::pipeline::{Dialect, Observer, ParseErrorKind};
use serde_json::{Map, Value};

impl Parser {
    /// One complete event of JSON: the failure object or a raw model event.
    pub(in crate::legacy) fn json_event(&mut self, ev: &[u8], sink: &mut Sink<impl Observer>) -> JsonEvent {
        if self.failure_event(ev, sink) {
            return JsonEvent::Done;
        }
        let event: RawEvent<'_> = match serde_json::from_slice(ev) {
            Ok(e) => e,
            Err(e) if e.is_eof() => return JsonEvent::Incomplete,
            Err(e) => return JsonEvent::Invalid(e.to_string()),
        };
        if self.opts.dialect == Dialect::Xml {
            self.parse_error(ParseErrorKind::Unexpected, "raw-dialect event in an xml stream", sink);
            return JsonEvent::Done;
        }
        let index = event.index.unwrap_or(0);
        match event.ty.as_deref().unwrap_or("") {
            "content_block_start" => {
                let cb = event.content_block.unwrap_or_default();
                self.raw_start(index, cb, sink);
            }
            "content_block_delta" => {
                let Some(delta) = event.delta else {
                    return JsonEvent::Done;
                };
                let max = self.opts.max_item_bytes;
                let Some(block) = self.raw.get_mut(index) else {
                    self.parse_error(ParseErrorKind::Unexpected, "delta for a block that is not open", sink);
                    return JsonEvent::Done;
                };
                match (delta.ty.as_deref().unwrap_or(""), block) {
                    ("text_delta" | "thinking_delta", RawBlock::Streamed { header, chunks, .. }) => {
                        let text = delta.text.or(delta.thinking).unwrap_or_default();
                        *chunks += sink.streamed_delta(header, &text);
                    }
                    ("input_json_delta", RawBlock::Tool { input, .. }) => {
                        let part = delta.partial_json.unwrap_or_default();
                        if input.len() + part.len() > max {
                            self.parse_error(
                                ParseErrorKind::ItemTooLarge,
                                "tool input larger than max_item_bytes",
                                sink,
                            );
                        } else {
                            input.push_str(&part);
                        }
                    }
                    (
                        "citations_delta",
                        RawBlock::Streamed {
                            citations, cited_bytes, ..
                        },
                    ) => {
                        if *cited_bytes > max {
                            self.parse_error(
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
                    // Signatures emit nothing; other pairs are ignored.
                    _ => {}
                }
            }
            "content_block_stop" => {
                if let Some(block) = self.raw.take(index) {
                    stop(block, &mut self.scopes, sink);
                }
            }
            "message_start" | "message_delta" | "message_stop" | "ping" => {}
            "error" => {
                let error = event.error.unwrap_or(Value::Null);
                let style = EnvelopeKind::Error.json_text().unwrap_or(PyStyle::Ascii);
                self.error_envelope(&pyjson::to_string(&error, style), sink);
            }
            other => {
                let msg = format!("unknown raw event type {other:?}");
                self.parse_error(ParseErrorKind::Unexpected, &msg, sink);
            }
        }
        JsonEvent::Done
    }

    fn raw_start(&mut self, index: u64, mut cb: Map<String, Value>, sink: &mut Sink<impl Observer>) {
        let agent = self.scopes.agent().to_owned();
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
                let id = self.safe_id(str_field(&cb, "id"), "tool call id", sink).to_owned();
                let tool = self.safe_id(str_field(&cb, "name"), "tool name", sink);
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
                let id = self.safe_id(&id, "tool result id", sink).to_owned();
                let name = cb.get("name").and_then(Value::as_str).unwrap_or(t).to_owned();
                let name = self.safe_id(&name, "tool result name", sink).to_owned();
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
        if let Some(old) = self.raw.take(index) {
            sink.obs.scope_conflict();
            stop(old, &mut self.scopes, sink);
        }
        self.raw.open.push((index, block));
    }
}
