//! `auto` (DESIGN 3.7): which dialect a stream speaks, told from its first event. An XML item, `[DONE]`, the
//! backend's failure and raw model events are the legacy backend's; a JSON event of cogency's types is cogency's;
//! an `SDKMessage` is the Agent SDK's. The types both use (`user`, `result`, `error`, `tool_result`) are told
//! apart by their keys. A first JSON event none of them sends is no dialect's: the stream is refused.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::agent_sdk::AgentSdk;
use super::cogency::Cogency;
use super::failure::failure_shape;

/// What the first event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sniffed {
    Legacy,
    Cogency,
    AgentSdk,
    /// JSON that no dialect sends first.
    Unknown,
}

/// The raw model stream's event types (DESIGN 3.4).
fn raw_type(ty: &str) -> bool {
    matches!(
        ty,
        "message_start"
            | "message_delta"
            | "message_stop"
            | "content_block_start"
            | "content_block_delta"
            | "content_block_stop"
            | "ping"
            | "error"
    )
}

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(rename = "type", borrow, default)]
    ty: Option<Cow<'a, str>>,
    // Agent SDK keys.
    #[serde(default)]
    session_id: Option<IgnoredAny>,
    #[serde(default)]
    message: Option<IgnoredAny>,
    #[serde(default)]
    subtype: Option<IgnoredAny>,
    #[serde(default)]
    parent_tool_use_id: Option<IgnoredAny>,
    #[serde(default)]
    uuid: Option<IgnoredAny>,
    #[serde(default)]
    tool_result: Option<IgnoredAny>,
    #[serde(default)]
    result: Option<IgnoredAny>,
    // cogency keys.
    #[serde(default)]
    content: Option<IgnoredAny>,
    #[serde(default)]
    timestamp: Option<IgnoredAny>,
    #[serde(default)]
    payload: Option<IgnoredAny>,
}

/// The dialect of a stream whose first event is `ev` (trimmed, not empty).
pub fn sniff(ev: &[u8]) -> Sniffed {
    if ev.first() != Some(&b'{') {
        return Sniffed::Legacy;
    }
    if failure_shape(ev).is_some() {
        return Sniffed::Legacy;
    }
    let Ok(probe) = serde_json::from_slice::<Probe<'_>>(ev) else {
        // Not JSON, or cut short: the legacy reader says what is wrong with it.
        return Sniffed::Legacy;
    };
    let Some(ty) = probe.ty.as_deref() else {
        return Sniffed::Unknown;
    };
    let sdk_keys = probe.session_id.is_some()
        || probe.message.is_some()
        || probe.subtype.is_some()
        || probe.parent_tool_use_id.is_some()
        || probe.uuid.is_some()
        || probe.tool_result.is_some()
        || probe.result.is_some();
    let cogency_keys = probe.content.is_some() || probe.timestamp.is_some() || probe.payload.is_some();
    match (Cogency::knows(ty), AgentSdk::knows(ty)) {
        (true, true) if sdk_keys => Sniffed::AgentSdk,
        (true, true) if cogency_keys => Sniffed::Cogency,
        // Both know it, no key tells: a raw model `error` event (`{"type":"error","error":{…}}`) is the legacy's.
        (true, true) => Sniffed::Legacy,
        (true, false) => Sniffed::Cogency,
        (false, true) => Sniffed::AgentSdk,
        (false, false) if raw_type(ty) => Sniffed::Legacy,
        (false, false) => Sniffed::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_event_tells_the_dialect() {
        let cases: [(&str, Sniffed); 14] = [
            (
                r#"{"event": "token", "data": {"text": "hi"}, "seq": 1}"#,
                Sniffed::Unknown,
            ),
            (r#"{"type": "token", "text": "hi"}"#, Sniffed::Unknown),
            (
                r#"{"type": "user", "content": "hi", "timestamp": 1.5}"#,
                Sniffed::Cogency,
            ),
            (r#"{"type": "think", "content": " Let me"}"#, Sniffed::Cogency),
            (
                r#"{"type": "result", "payload": null, "content": "x", "timestamp": 1}"#,
                Sniffed::Cogency,
            ),
            (
                r#"{"type": "error", "content": "boom", "timestamp": 1}"#,
                Sniffed::Cogency,
            ),
            (
                r#"{"type":"system","subtype":"init","session_id":"s"}"#,
                Sniffed::AgentSdk,
            ),
            (
                r#"{"type":"stream_event","event":{"type":"content_block_delta"}}"#,
                Sniffed::AgentSdk,
            ),
            (
                r#"{"type":"user","message":{"role":"user","content":[]},"session_id":"s"}"#,
                Sniffed::AgentSdk,
            ),
            (
                r#"{"type":"result","result":{"stop_reason":"end_turn"},"session_id":"s"}"#,
                Sniffed::AgentSdk,
            ),
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"m"}}"#,
                Sniffed::Legacy,
            ),
            (
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text"}}"#,
                Sniffed::Legacy,
            ),
            (r#"{"error":"ValueError","message":"m"}"#, Sniffed::Legacy),
            ("<content-block-text>", Sniffed::Legacy),
        ];
        for (ev, want) in cases {
            assert_eq!(sniff(ev.as_bytes()), want, "{ev}");
        }
    }
}
