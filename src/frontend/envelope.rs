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

/// A streamed block's envelope as the gateway's own encoder writes it (`{"type":"text","agent":"…","final":…,
/// "delta":"…"}`, the fields in that order), read without serde: the most frequent envelope, whose delta goes on
/// to the client's chunk as the JSON string literal it already is. Anything else is `None` (serde's to read).
#[derive(Debug, PartialEq, Eq)]
pub struct Streamed<'a> {
    pub kind: EnvelopeKind,
    /// The agent as written: only an agent with no escape is read here, so it is the agent itself.
    pub agent: &'a str,
    pub last: bool,
    /// The delta's JSON string literal, quotes included.
    pub delta: &'a [u8],
}

impl<'a> Streamed<'a> {
    pub fn read(data: &'a [u8]) -> Option<Self> {
        let (kind, rest) = if let Some(r) = data.strip_prefix(b"{\"type\":\"text\",\"agent\":\"") {
            (EnvelopeKind::Text, r)
        } else if let Some(r) = data.strip_prefix(b"{\"type\":\"thinking\",\"agent\":\"") {
            (EnvelopeKind::Thinking, r)
        } else {
            return None;
        };
        let end = memchr::memchr2(b'"', b'\\', rest)?;
        if rest[end] != b'"' {
            return None;
        }
        let agent = std::str::from_utf8(&rest[..end]).ok()?;
        let rest = &rest[end..];
        let (last, rest) = if let Some(r) = rest.strip_prefix(b"\",\"final\":false,\"delta\":") {
            (false, r)
        } else {
            (true, rest.strip_prefix(b"\",\"final\":true,\"delta\":")?)
        };
        let delta = rest.strip_suffix(b"}")?;
        // The literal is the rest up to the closing brace: one string, closed by its last quote and by no escape.
        let closed = delta.len() >= 2 && delta[0] == b'"' && delta[delta.len() - 1] == b'"';
        if !closed || ends_escaped(&delta[1..delta.len() - 1]) || has_bare_quote(&delta[1..delta.len() - 1]) {
            return None;
        }
        Some(Streamed {
            kind,
            agent,
            last,
            delta,
        })
    }

    /// Whether the delta is `""`.
    pub fn is_empty(&self) -> bool {
        self.delta.len() == 2
    }
}

/// Whether the string body ends in an odd run of backslashes (its closing quote would be escaped).
fn ends_escaped(body: &[u8]) -> bool {
    body.iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// Whether the string body holds a quote no backslash escapes (then it is not one string).
fn has_bare_quote(body: &[u8]) -> bool {
    let mut at = 0;
    while let Some(q) = memchr::memchr(b'"', &body[at..]) {
        let q = at + q;
        if body[..q].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 0 {
            return true;
        }
        at = q + 1;
    }
    false
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
    fn the_fast_reader_answers_only_where_serde_agrees() {
        let cases: [&[u8]; 9] = [
            br#"{"type":"text","agent":"a-1","final":false,"delta":"He said \"hi\"\n"}"#,
            br#"{"type":"thinking","agent":"a","final":true,"delta":""}"#,
            br#"{"type":"text","agent":"a","final":false,"delta":"ends in a backslash \\"}"#,
            br#"{"type":"text","agent":"a\"b","final":false,"delta":"x"}"#,
            br#"{"type":"text","agent":"a","final":false,"delta":"x","id":"y"}"#,
            br#"{"type":"text","agent":"a","final":false,"delta":"x" }"#,
            br#"{"type":"tool_call","agent":"a","final":true,"delta":"{}","id":"t","name":"n"}"#,
            br#"{"type":"text","agent":"a","final":false,"delta":"a"b"}"#,
            br#"{"type":"text","agent":"a","final":false,"delta":"\"}"#,
        ];
        for data in cases {
            if let Some(fast) = Streamed::read(data) {
                let slow = Envelope::parse(data).expect("serde reads what the fast reader reads");
                assert_eq!((fast.kind, fast.agent, fast.last), (slow.kind, &*slow.agent, slow.last));
                let delta: String = serde_json::from_slice(fast.delta).expect("a string literal");
                assert_eq!(delta, slow.delta);
            }
        }
        assert!(Streamed::read(cases[0]).is_some() && Streamed::read(cases[1]).is_some());
        assert!(Streamed::read(cases[2]).is_some());
        for refused in &cases[3..] {
            assert!(
                Streamed::read(refused).is_none(),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn a_json_delta_stays_json_and_text_becomes_a_string() {
        assert_eq!(json_or_text(r#"{"a": [1]}"#).get(), r#"{"a": [1]}"#);
        assert_eq!(json_or_text("plain \"text\"").get(), r#""plain \"text\"""#);
    }
}
