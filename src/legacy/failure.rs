//! The backend's failure (DESIGN 3.1, 3.6), in one place: when the model stream fails, the backend sends one
//! plain JSON event `{"error", "message", "traceback"}` and ends. Inside an open text block that event looks like
//! a text delta, so it is held until the next event shows whether it was the last: if another follows, it was
//! model text; if the stream ends, the block closes and an `error` envelope carries it (traceback dropped unless
//! `include_traceback`).

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

/// The failure's keys, and no other: read first so that any other JSON event (a raw model event starts with
/// `"type"`) is turned away at its first key instead of being built into a map.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Keys<'a> {
    #[serde(borrow)]
    #[allow(dead_code)]
    error: Cow<'a, str>,
    #[allow(dead_code)]
    message: IgnoredAny,
    #[serde(default)]
    #[allow(dead_code)]
    traceback: Option<IgnoredAny>,
}

/// Whether `ev` is the backend failure JSON `{"error","message"[,"traceback"]}`.
pub fn failure_shape(ev: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    let t = ev.trim_ascii();
    if t.first() != Some(&b'{') || t.last() != Some(&b'}') {
        return None;
    }
    serde_json::from_slice::<Keys<'_>>(t).ok()?;
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(t).ok()?;
    let shaped = map.get("error").is_some_and(|e| e.is_string())
        && map.contains_key("message")
        && map
            .keys()
            .all(|k| matches!(k.as_str(), "error" | "message" | "traceback"));
    shaped.then_some(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_failure_shape_counts() {
        assert!(failure_shape(br#"{"error":"ValueError","message":"m","traceback":"t"}"#).is_some());
        assert!(failure_shape(br#"{"error":"E","message":"m"}"#).is_some());
        assert!(failure_shape(br#"{"error":"E"}"#).is_none());
        assert!(failure_shape(br#"{"error":"E","message":"m","x":1}"#).is_none());
        assert!(failure_shape(b"{not json}").is_none());
    }
}
