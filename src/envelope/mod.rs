//! The JSON envelope protocol: the 13 envelope types and how one envelope is
//! written as compact JSON with `type, agent, final, delta` first.

pub mod chunker;
pub mod ids;
pub mod pyjson;

use std::fmt;

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

    /// Text and thinking stream their deltas and close with an empty final
    /// marker; every other kind puts its content in the final chunk.
    pub const fn is_streamed(self) -> bool {
        matches!(self, EnvelopeKind::Text | EnvelopeKind::Thinking)
    }
}

impl fmt::Display for EnvelopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Extra fields after `delta`, pre-serialised once per block as
/// `,"key":value,...` so that each chunk of the block only copies bytes.
/// Keys are unique and never one of the envelope's own fields: a citation's
/// fields come from upstream input, and a repeated key (first one wins) or
/// one named like a fixed field is dropped, so an envelope never has two
/// `delta`s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    json: String,
    keys: Vec<Box<str>>,
}

/// The fields every envelope has before its extras.
const ENVELOPE_FIELDS: [&str; 4] = ["type", "agent", "final", "delta"];

impl Extras {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a string field.
    pub fn str(mut self, key: &str, value: &str) -> Self {
        self.push(key, &serde_json::Value::from(value));
        self
    }

    /// Adds any JSON value.
    pub fn value(mut self, key: &str, value: &serde_json::Value) -> Self {
        self.push(key, value);
        self
    }

    fn push(&mut self, key: &str, value: &serde_json::Value) {
        if ENVELOPE_FIELDS.contains(&key) || self.keys.iter().any(|k| **k == *key) {
            return;
        }
        self.keys.push(key.into());
        self.json.push(',');
        // Writing JSON into a String cannot fail.
        self.json.push_str(&serde_json::Value::from(key).to_string());
        self.json.push(':');
        self.json.push_str(&value.to_string());
    }

    /// The serialised fields, each preceded by a comma.
    pub fn as_str(&self) -> &str {
        &self.json
    }
}

/// The fixed part of every envelope of one block: kind, agent and extras,
/// with their encoded lengths known up front so the chunker can budget.
#[derive(Debug, Clone)]
pub struct BlockHeader {
    pub kind: EnvelopeKind,
    /// `{"type":"…","agent":"…","final":` with the agent JSON-escaped.
    prefix: String,
    extras: Extras,
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
        Self { kind, prefix, extras }
    }

    /// Encoded size of an envelope of this block whose delta is empty.
    pub fn overhead(&self) -> usize {
        self.prefix.len() + DELTA_FRAME + self.extras.as_str().len()
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
        out.extend_from_slice(self.extras.as_str().as_bytes());
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
    fn extras_never_repeat_a_key_or_shadow_an_envelope_field() {
        let e = Extras::new()
            .str("citation_type", "char_location")
            .value("delta", &2.into())
            .str("type", "x")
            .str("citation_type", "other")
            .value("index", &0.into());
        assert_eq!(e.as_str(), r#","citation_type":"char_location","index":0"#);
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
