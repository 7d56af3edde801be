//! The raw dialect (DESIGN 3.4): model stream events as JSON, translated as
//! the backend's native JSON formatter would.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::scope::Scopes;
use crate::envelope::chunker::Sink;
use crate::envelope::{pyjson, BlockHeader, EnvelopeKind, Extras, PyStyle};
use crate::pipeline::Observer;

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
            sink.envelope(&header, true, "");
            sink.obs.block_closed(header.kind, chunks + 1);
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
