//! The fallback agent id a client supplies (DESIGN 3.5, 3.6 "Resumed runs"): `agent_uuid` of a small JSON request
//! body, else the agent header. Pure functions over the request's parts, so the fuzz target checks them as used.
//!
//! Every envelope repeats the agent id, so an id taken from the client is held to `envelope::ids::is_valid` (a
//! length bound and a safe character set); one that fails is ignored and counted, as if it had not been sent.

use http::header::{self, HeaderMap, HeaderName};
use serde::Deserialize;

use crate::envelope::ids;

label_enum! {
    /// Where a client-supplied agent id came from; the `source` label of `rejected_agent_ids_total`.
    pub enum Source {
        /// The configured agent header (`translate.agent_header`).
        Header = "header",
        /// `agent_uuid` of a small JSON request body.
        Body = "body",
    }
}

/// The agent a request names, and which of its candidates were refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Choice {
    /// A valid, non-empty id, or `None`: the stream gets a fresh UUID.
    pub agent: Option<String>,
    /// Candidates that were present but failed `ids::is_valid`, in the order consulted.
    pub rejected: Vec<Source>,
}

/// Whether the body is worth reading for `agent_uuid`: JSON by its Content-Type, with a declared Content-Length of
/// 1..=`max` (a body without one, or a larger one, is streamed untouched).
pub fn body_is_sniffable(headers: &HeaderMap, max: usize) -> bool {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|t| t.trim().to_ascii_lowercase())
        .is_some_and(|t| t == "application/json" || t.ends_with("+json"));
    let len = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    is_json && matches!(len, Some(n) if n > 0 && n <= max)
}

#[derive(Deserialize)]
struct AgentField {
    agent_uuid: Option<String>,
}

/// `agent_uuid` of a JSON object body, unchecked (`choose` checks it); `None` if absent, not a string or not JSON.
pub fn body_agent(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<AgentField>(body)
        .ok()
        .and_then(|f| f.agent_uuid)
}

/// The agent for a stream: the body's candidate if valid, else the header's if valid, else none. An empty
/// candidate counts as absent; a present one that fails `ids::is_valid` is refused and reported.
pub fn choose(body_agent: Option<&str>, headers: &HeaderMap, agent_header: &HeaderName) -> Choice {
    let mut choice = Choice::default();
    let mut consider = |source: Source, id: &[u8]| -> Option<String> {
        if id.is_empty() {
            return None;
        }
        match std::str::from_utf8(id) {
            Ok(s) if ids::is_valid(s) => Some(s.to_owned()),
            _ => {
                choice.rejected.push(source);
                None
            }
        }
    };
    choice.agent = body_agent
        .and_then(|id| consider(Source::Body, id.as_bytes()))
        .or_else(|| {
            headers
                .get(agent_header)
                .and_then(|v| consider(Source::Header, v.as_bytes()))
        });
    choice
}

/// `choose` over a whole request: headers and, when `body_is_sniffable`, its body (the fuzz target's entry point).
pub fn from_request(headers: &HeaderMap, body: &[u8], agent_header: &HeaderName, body_max: usize) -> Choice {
    let from_body = if body_is_sniffable(headers, body_max) && body.len() <= body_max {
        body_agent(body)
    } else {
        None
    };
    choose(from_body.as_deref(), headers, agent_header)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const X_AGENT_ID: HeaderName = HeaderName::from_static("x-agent-id");

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn body_beats_header_and_both_fall_back_to_none() {
        let h = headers(&[("x-agent-id", b"from-header")]);
        assert_eq!(
            choose(Some("from-body"), &h, &X_AGENT_ID).agent.as_deref(),
            Some("from-body")
        );
        assert_eq!(choose(None, &h, &X_AGENT_ID).agent.as_deref(), Some("from-header"));
        assert_eq!(choose(Some(""), &h, &X_AGENT_ID).agent.as_deref(), Some("from-header"));
        assert_eq!(choose(None, &HeaderMap::new(), &X_AGENT_ID), Choice::default());
    }

    #[test]
    fn an_overlong_or_escaping_id_is_refused_and_reported() {
        let long = "a".repeat(ids::MAX_ID_BYTES + 1);
        let h = headers(&[("x-agent-id", long.as_bytes())]);
        let c = choose(Some("a\"b\nc"), &h, &X_AGENT_ID);
        assert_eq!(c.agent, None);
        assert_eq!(c.rejected, [Source::Body, Source::Header]);
        // A valid header still serves when the body's id is refused.
        let h = headers(&[("x-agent-id", b"ok-id")]);
        let c = choose(Some("bad\tid"), &h, &X_AGENT_ID);
        assert_eq!((c.agent.as_deref(), c.rejected), (Some("ok-id"), vec![Source::Body]));
        // Bytes that are no UTF-8 at all (obs-text in a header value).
        let h = headers(&[("x-agent-id", b"\xff\xfe")]);
        assert_eq!(choose(None, &h, &X_AGENT_ID).rejected, [Source::Header]);
    }

    #[test]
    fn only_small_json_bodies_are_read() {
        let json = |len: &str| {
            headers(&[
                ("content-type", b"application/json; charset=utf-8"),
                ("content-length", len.as_bytes()),
            ])
        };
        let body = br#"{"agent_uuid":"resumed-1"}"#;
        let n = body.len().to_string();
        assert_eq!(
            from_request(&json(&n), body, &X_AGENT_ID, 64).agent.as_deref(),
            Some("resumed-1")
        );
        assert_eq!(
            from_request(&json(&n), body, &X_AGENT_ID, 8).agent,
            None,
            "over the bound"
        );
        assert_eq!(
            from_request(&json("0"), body, &X_AGENT_ID, 64).agent,
            None,
            "empty declared"
        );
        let text = headers(&[("content-type", b"text/plain"), ("content-length", n.as_bytes())]);
        assert_eq!(from_request(&text, body, &X_AGENT_ID, 64).agent, None, "not JSON");
        assert!(body_is_sniffable(
            &headers(&[("content-type", b"application/vnd.x+json"), ("content-length", b"5")]),
            64
        ));
        assert_eq!(body_agent(br#"{"agent_uuid":7}"#), None);
        assert_eq!(body_agent(b"[1]"), None);
    }
}
