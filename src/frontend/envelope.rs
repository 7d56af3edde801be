//! A held envelope read back: its JSON text (as `envelope::BlockHeader` wrote it) as a typed view that borrows from
//! the text where it has no escapes. The fields are DESIGN 4's; a citation's own fields are read only for a
//! citation.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::protocol::EnvelopeKind;

/// One envelope.
#[derive(Debug)]
pub struct Envelope<'a> {
    pub kind: EnvelopeKind,
    pub agent: Cow<'a, str>,
    /// `final`: the block's last envelope.
    pub last: bool,
    pub delta: Cow<'a, str>,
    /// `id`, `name`, `src`, `media_type` where the type has them, else "".
    pub id: Cow<'a, str>,
    pub name: Cow<'a, str>,
    pub src: Cow<'a, str>,
    pub media_type: Cow<'a, str>,
    /// The whole JSON text, for a citation's fields.
    text: &'a str,
}

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    agent: Cow<'a, str>,
    #[serde(rename = "final")]
    last: bool,
    #[serde(borrow)]
    delta: Cow<'a, str>,
    #[serde(borrow, default)]
    id: Cow<'a, str>,
    #[serde(borrow, default)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    src: Cow<'a, str>,
    #[serde(borrow, default)]
    media_type: Cow<'a, str>,
}

impl<'a> Envelope<'a> {
    /// The envelope whose JSON text is `data`; `None` for anything else (`[DONE]` is the caller's).
    pub fn parse(data: &'a [u8]) -> Option<Self> {
        let text = std::str::from_utf8(data).ok()?;
        let w: Wire<'a> = serde_json::from_str(text).ok()?;
        Some(Envelope {
            kind: EnvelopeKind::parse(&w.kind)?,
            agent: w.agent,
            last: w.last,
            delta: w.delta,
            id: w.id,
            name: w.name,
            src: w.src,
            media_type: w.media_type,
            text,
        })
    }

    /// A citation's fields after `delta` (DESIGN 4: `citation_type`, the indexes, `url`, `title`, …).
    pub fn citation_fields(&self) -> Map<String, Value> {
        let mut all: Map<String, Value> = serde_json::from_str(self.text).unwrap_or_default();
        for k in ["type", "agent", "final", "delta"] {
            all.remove(k);
        }
        all
    }
}

/// `text` as a JSON value when it is one (a JSON payload's delta), else as a string.
pub fn json_or_text(text: &str) -> Box<RawValue> {
    match serde_json::from_str::<&RawValue>(text) {
        Ok(raw) => raw.to_owned(),
        Err(_) => string(text),
    }
}

/// `text` as a JSON string.
pub fn string(text: &str) -> Box<RawValue> {
    let quoted = serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned());
    RawValue::from_string(quoted).unwrap_or_else(|_| empty_object())
}

/// `{}`.
pub fn empty_object() -> Box<RawValue> {
    RawValue::from_string("{}".to_owned()).expect("{} is JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_reads_back_with_its_fields_and_anything_else_is_none() {
        let e = Envelope::parse(
            br#"{"type":"tool_call","agent":"a-1","final":true,"delta":"{\"x\": 1}","id":"t1","name":"f"}"#,
        )
        .expect("an envelope");
        assert_eq!(
            (e.kind, &*e.agent, e.last, &*e.delta),
            (EnvelopeKind::ToolCall, "a-1", true, r#"{"x": 1}"#)
        );
        assert_eq!((&*e.id, &*e.name), ("t1", "f"));
        assert!(Envelope::parse(b"[DONE]").is_none());
        assert!(Envelope::parse(br#"{"type":"nope","agent":"a","final":true,"delta":""}"#).is_none());
    }

    #[test]
    fn a_citation_keeps_its_own_fields() {
        let e = Envelope::parse(
            br#"{"type":"citation","agent":"a","final":true,"delta":"cited","citation_type":"web_search_result_location","url":"https://e.x","title":"T"}"#,
        )
        .unwrap();
        let f = e.citation_fields();
        assert_eq!(f["url"], "https://e.x");
        assert_eq!(f["citation_type"], "web_search_result_location");
        assert!(!f.contains_key("delta"));
    }

    #[test]
    fn a_json_delta_stays_json_and_text_becomes_a_string() {
        assert_eq!(json_or_text(r#"{"a": [1]}"#).get(), r#"{"a": [1]}"#);
        assert_eq!(json_or_text("plain \"text\"").get(), r#""plain \"text\"""#);
    }
}
