//! The envelope stage: how one block's envelopes are written as compact JSON with `type, agent, final, delta`
//! first (`BlockHeader`), measured against the budget (`budget`), cut into chunks (`chunker`), with JSON payloads
//! in the native formatter's text (`pyjson`).

pub mod budget;
pub mod chunker;
pub mod pyjson;

pub use crate::protocol::{ids, EnvelopeKind, Field, PyStyle, Split};

use crate::sse::encoder;

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

/// Writes an `error` envelope event made by the gateway itself (draining, a run stopped, a stream lost): the
/// shape of the translator's `upstream_error` envelopes, `final: true`, its delta compact JSON with `type` first.
/// Returns the size of its JSON object.
pub fn write_gateway_error(out: &mut Vec<u8>, agent: &str, kind: &str, message: &str) -> usize {
    let delta = serde_json::json!({"type": kind, "message": message});
    BlockHeader::new(EnvelopeKind::Error, agent, Extras::new()).write_event(out, true, &delta.to_string())
}

/// The agent of an envelope's JSON as [`BlockHeader`] writes it: ids carry no escapes (`ids::is_valid`), so the
/// agent ends at the next quote.
pub fn agent_of(json: &[u8]) -> Option<&str> {
    const KEY: &[u8] = b"\"agent\":\"";
    let at = memchr::memmem::find(json, KEY)? + KEY.len();
    let len = memchr::memchr(b'"', &json[at..])?;
    std::str::from_utf8(&json[at..at + len]).ok()
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
    /// length. `delta` is escaped exactly as `budget::escaped_len` counts.
    pub fn write_json(&self, out: &mut Vec<u8>, is_final: bool, delta: &str) -> usize {
        self.write_json_with(out, is_final, |out| budget::write_escaped(out, delta))
            .0
    }

    /// Writes one envelope as an SSE event; returns the JSON object's size.
    pub fn write_event(&self, out: &mut Vec<u8>, is_final: bool, delta: &str) -> usize {
        encoder::event(out, |out| self.write_json(out, is_final, delta))
    }

    /// Writes one `final:false` envelope event carrying the longest prefix of `text` whose escaped size is at
    /// most `room` (a chunk that is not a block's last); returns the JSON object's size and that prefix's length
    /// (0 when not even one character fits: nothing is written then). `guess` is where to try the cut first
    /// (see `budget::write_escaped_fitting`).
    pub fn write_event_fitting(&self, out: &mut Vec<u8>, text: &str, room: usize, guess: usize) -> (usize, usize) {
        let start = out.len();
        let (n, taken) = encoder::event(out, |out| {
            self.write_json_with(out, false, |out| budget::write_escaped_fitting(out, text, room, guess))
        });
        if taken == 0 && !text.is_empty() {
            out.truncate(start);
            return (0, 0);
        }
        (n, taken)
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
    #[test]
    fn the_agent_is_read_back_from_what_the_header_wrote() {
        let mut out = Vec::new();
        let h = super::BlockHeader::new(super::EnvelopeKind::ToolCall, "a-1", super::Extras::new());
        h.write_event(&mut out, false, "{\"agent\":\"not this\"}");
        let json = crate::sse::encoder::data_of(&out);
        assert!(json.starts_with(b"{") && json.ends_with(b"}"), "{json:?}");
        assert_eq!(super::agent_of(json), Some("a-1"));
        assert_eq!(super::agent_of(b"{\"type\":\"text\"}"), None);
    }

    use super::*;

    fn ids(id: &str, name: &str) -> Extras {
        Extras::new().str("id", id).str("name", name)
    }

    #[test]
    fn envelope_fields_come_in_protocol_order() {
        let h = BlockHeader::new(EnvelopeKind::ToolCall, "a\"b", ids("t1", "search"));
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
