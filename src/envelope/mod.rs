//! The JSON envelope protocol: the 13 envelope types and how one envelope is
//! written as compact JSON with `type, agent, final, delta` first.

pub mod chunker;
pub mod ids;
pub mod pyjson;

use std::fmt;

pub use pyjson::PyStyle;

/// The 13 envelope types of the JSON protocol (DESIGN 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EnvelopeKind {
    MetaInit,
    Thinking,
    Text,
    Citation,
    ToolCall,
    ServerToolCall,
    ToolResult,
    ToolResultImage,
    ServerToolResult,
    AwaitingFrontendTools,
    MetaFiles,
    Error,
    MetaFinal,
}

impl EnvelopeKind {
    /// Every kind, in protocol order; `kind as usize` indexes this array.
    pub const ALL: [EnvelopeKind; 13] = [
        EnvelopeKind::MetaInit,
        EnvelopeKind::Thinking,
        EnvelopeKind::Text,
        EnvelopeKind::Citation,
        EnvelopeKind::ToolCall,
        EnvelopeKind::ServerToolCall,
        EnvelopeKind::ToolResult,
        EnvelopeKind::ToolResultImage,
        EnvelopeKind::ServerToolResult,
        EnvelopeKind::AwaitingFrontendTools,
        EnvelopeKind::MetaFiles,
        EnvelopeKind::Error,
        EnvelopeKind::MetaFinal,
    ];

    /// The `type` field's value.
    pub const fn as_str(self) -> &'static str {
        match self {
            EnvelopeKind::MetaInit => "meta_init",
            EnvelopeKind::Thinking => "thinking",
            EnvelopeKind::Text => "text",
            EnvelopeKind::Citation => "citation",
            EnvelopeKind::ToolCall => "tool_call",
            EnvelopeKind::ServerToolCall => "server_tool_call",
            EnvelopeKind::ToolResult => "tool_result",
            EnvelopeKind::ToolResultImage => "tool_result_image",
            EnvelopeKind::ServerToolResult => "server_tool_result",
            EnvelopeKind::AwaitingFrontendTools => "awaiting_frontend_tools",
            EnvelopeKind::MetaFiles => "meta_files",
            EnvelopeKind::Error => "error",
            EnvelopeKind::MetaFinal => "meta_final",
        }
    }

    /// Parses a `type` value; `None` for anything that is not one of the 13.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The fields this type carries after `type, agent, final, delta`, in order (DESIGN 4's table). The encoder
    /// writes exactly these, the tests check real output against them, and docs/TRANSLATION.md lists them.
    pub const fn extras(self) -> &'static [Field] {
        match self {
            EnvelopeKind::ToolCall
            | EnvelopeKind::ServerToolCall
            | EnvelopeKind::ToolResult
            | EnvelopeKind::ServerToolResult => &ID_NAME,
            EnvelopeKind::ToolResultImage => &IMAGE,
            EnvelopeKind::Citation => &CITATION,
            _ => &[],
        }
    }

    /// Where a block of this type is cut into envelopes.
    pub const fn split(self) -> Split {
        match self {
            EnvelopeKind::MetaInit
            | EnvelopeKind::AwaitingFrontendTools
            | EnvelopeKind::Error
            | EnvelopeKind::MetaFiles => Split::Native,
            _ => Split::Budget,
        }
    }

    /// How the native formatter writes this type's delta when it is a JSON document (DESIGN 4, "JSON text"):
    /// `None` for types whose delta is text. For `tool_result` it applies to structured content only, for `error`
    /// to a JSON error payload only.
    pub const fn json_text(self) -> Option<PyStyle> {
        match self {
            EnvelopeKind::MetaInit
            | EnvelopeKind::MetaFinal
            | EnvelopeKind::AwaitingFrontendTools
            | EnvelopeKind::ToolCall
            | EnvelopeKind::ServerToolCall => Some(PyStyle::Unicode),
            EnvelopeKind::ToolResult | EnvelopeKind::ServerToolResult | EnvelopeKind::Error => Some(PyStyle::Ascii),
            EnvelopeKind::MetaFiles => Some(PyStyle::CompactAscii),
            EnvelopeKind::Thinking | EnvelopeKind::Text | EnvelopeKind::Citation | EnvelopeKind::ToolResultImage => {
                None
            }
        }
    }
}

impl fmt::Display for EnvelopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a block is cut into envelopes (DESIGN 4, "Size bound").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Every envelope's JSON object within the budget, escapes counted.
    Budget,
    /// Where the native formatter cuts: the delta's UTF-8 bytes *before* escaping against the budget minus the
    /// fixed part (the whole budget if that leaves under 64 bytes). Frontends read these types whole from one
    /// envelope, so their boundaries must match; a line may exceed the budget by its escapes (counted oversize).
    Native,
}

/// One field after `delta`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    /// Omitted when absent (or null, or an empty legacy attribute); a required field absent is written as `""`.
    pub optional: bool,
    /// A JSON number (legacy attributes carry it as text).
    pub number: bool,
}

const fn required(name: &'static str) -> Field {
    Field {
        name,
        optional: false,
        number: false,
    }
}

const fn optional(name: &'static str, number: bool) -> Field {
    Field {
        name,
        optional: true,
        number,
    }
}

const ID_NAME: [Field; 2] = [required("id"), required("name")];
const IMAGE: [Field; 4] = [
    required("id"),
    required("name"),
    required("src"),
    required("media_type"),
];
const CITATION: [Field; 9] = [
    required("citation_type"),
    optional("document_index", true),
    optional("document_title", false),
    optional("start_char_index", true),
    optional("end_char_index", true),
    optional("start_page_number", true),
    optional("end_page_number", true),
    optional("url", false),
    optional("title", false),
];

/// Field values for a block's envelopes, in any order; [`BlockHeader::new`] writes them in the order and subset
/// that [`EnvelopeKind::extras`] gives (the first value of a repeated key wins; keys the type does not have are
/// dropped, so upstream input can never add a field or shadow an envelope field).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extras {
    fields: Vec<(Box<str>, serde_json::Value)>,
}

impl Extras {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a string field.
    pub fn str(self, key: &str, value: &str) -> Self {
        self.value(key, &serde_json::Value::from(value))
    }

    /// Adds any JSON value.
    pub fn value(mut self, key: &str, value: &serde_json::Value) -> Self {
        self.fields.push((key.into(), value.clone()));
        self
    }

    fn get(&self, key: &str) -> Option<&serde_json::Value> {
        self.fields.iter().find(|(k, _)| **k == *key).map(|(_, v)| v)
    }

    /// Bytes the values hold (for memory accounting).
    pub fn held_bytes(&self) -> usize {
        self.fields.iter().map(|(k, v)| k.len() + v.to_string().len()).sum()
    }
}

/// The fixed part of every envelope of one block: kind, agent and extras,
/// with their encoded lengths known up front so the chunker can budget.
#[derive(Debug, Clone)]
pub struct BlockHeader {
    pub kind: EnvelopeKind,
    /// `{"type":"…","agent":"…","final":` with the agent JSON-escaped.
    prefix: String,
    /// `,"key":value` for each field of the kind's table that is written.
    extras: String,
}

/// Bytes of an envelope around its delta's escaped content:
/// `false,"delta":"` + `"` + extras + `}` after the prefix. `false` is used
/// for both values of `final` so the bound holds before we know which.
const DELTA_FRAME: usize = "false,\"delta\":\"".len() + "\"}".len();

impl BlockHeader {
    pub fn new(kind: EnvelopeKind, agent: &str, extras: Extras) -> Self {
        let mut prefix = String::with_capacity(40 + agent.len());
        prefix.push_str("{\"type\":\"");
        prefix.push_str(kind.as_str());
        prefix.push_str("\",\"agent\":");
        prefix.push_str(&serde_json::Value::from(agent).to_string());
        prefix.push_str(",\"final\":");
        let mut json = String::new();
        for field in kind.extras() {
            let value = extras.get(field.name).filter(|v| !v.is_null());
            let value = match value {
                Some(v) => v.clone(),
                None if field.optional => continue,
                None => serde_json::Value::from(""),
            };
            json.push_str(",\"");
            json.push_str(field.name);
            json.push_str("\":");
            json.push_str(&value.to_string());
        }
        Self {
            kind,
            prefix,
            extras: json,
        }
    }

    /// Encoded size of an envelope of this block whose delta is empty.
    pub fn overhead(&self) -> usize {
        self.prefix.len() + DELTA_FRAME + self.extras.len()
    }

    /// Writes one envelope as compact JSON (no SSE framing) and returns its
    /// length. `delta` is escaped exactly as `chunker::escaped_len` counts.
    pub fn write_json(&self, out: &mut Vec<u8>, is_final: bool, delta: &str) -> usize {
        self.write_json_with(out, is_final, |out| chunker::write_escaped(out, delta))
            .0
    }

    /// Like [`Self::write_json`], with the delta's string literal written by
    /// `delta`; returns the envelope's length and what `delta` returned.
    pub fn write_json_with<R>(
        &self,
        out: &mut Vec<u8>,
        is_final: bool,
        delta: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> (usize, R) {
        let start = out.len();
        out.extend_from_slice(self.prefix.as_bytes());
        out.extend_from_slice(if is_final { b"true" } else { b"false" });
        out.extend_from_slice(b",\"delta\":");
        let r = delta(out);
        out.extend_from_slice(self.extras.as_bytes());
        out.push(b'}');
        (out.len() - start, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        for k in EnvelopeKind::ALL {
            assert_eq!(EnvelopeKind::parse(k.as_str()), Some(k));
            assert_eq!(EnvelopeKind::ALL[k as usize], k);
        }
        assert_eq!(EnvelopeKind::parse("upstream_error"), None);
    }

    #[test]
    fn envelope_fields_come_in_protocol_order() {
        let h = BlockHeader::new(
            EnvelopeKind::ToolCall,
            "a\"b",
            Extras::new().str("id", "t1").str("name", "search"),
        );
        let mut out = Vec::new();
        let n = h.write_json(&mut out, true, "{\"q\":1}");
        let s = std::str::from_utf8(&out).unwrap();
        assert_eq!(n, out.len());
        assert_eq!(
            s,
            r#"{"type":"tool_call","agent":"a\"b","final":true,"delta":"{\"q\":1}","id":"t1","name":"search"}"#
        );
        let v: serde_json::Value = serde_json::from_str(s).unwrap();
        assert_eq!(v["delta"], "{\"q\":1}");
    }

    #[test]
    fn extras_follow_the_table_never_repeat_a_key_or_shadow_an_envelope_field() {
        let e = Extras::new()
            .value("end_char_index", &9.into())
            .str("citation_type", "char_location")
            .value("delta", &2.into())
            .str("type", "x")
            .str("citation_type", "other")
            .value("encrypted_index", &"zz".into())
            .value("document_title", &serde_json::Value::Null)
            .value("document_index", &0.into());
        let h = BlockHeader::new(EnvelopeKind::Citation, "a", e);
        assert_eq!(
            h.extras,
            r#","citation_type":"char_location","document_index":0,"end_char_index":9"#
        );
    }

    #[test]
    fn a_required_field_absent_is_written_empty() {
        let h = BlockHeader::new(
            EnvelopeKind::ToolResultImage,
            "a",
            Extras::new().str("src", "s").str("id", "1"),
        );
        assert_eq!(h.extras, r#","id":"1","name":"","src":"s","media_type":"""#);
        assert_eq!(
            BlockHeader::new(EnvelopeKind::Text, "a", Extras::new().str("id", "1")).extras,
            ""
        );
    }

    #[test]
    fn overhead_is_the_size_of_an_empty_non_final_envelope() {
        let h = BlockHeader::new(EnvelopeKind::Text, "agent-1", Extras::new().str("id", "x"));
        let mut out = Vec::new();
        assert_eq!(h.write_json(&mut out, false, ""), h.overhead());
        out.clear();
        assert_eq!(h.write_json(&mut out, true, ""), h.overhead() - 1);
    }
}
