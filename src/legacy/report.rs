//! The parser's own `error` envelopes, shared by every dialect: bad input (`parse_error`, and a JSON dialect's
//! `Fault` for the parser to report) and identifiers that every envelope would repeat (`safe_id`). They are written
//! in the current scope's agent.

use super::scope::Scopes;
use crate::envelope::chunker::Sink;
use crate::envelope::{ids, BlockHeader, EnvelopeKind, Extras};
use crate::pipeline::{Observer, ParseErrorKind};

/// Writes an `error` envelope with `delta` in the current agent.
pub fn error_envelope(scopes: &Scopes, delta: &str, sink: &mut Sink<impl Observer>) {
    let header = BlockHeader::new(EnvelopeKind::Error, scopes.agent(), Extras::new());
    sink.whole(header, delta);
}

/// Writes an `error` envelope `{"type":"parse_error","kind","message"}` and counts it.
pub fn parse_error(scopes: &Scopes, kind: ParseErrorKind, message: &str, sink: &mut Sink<impl Observer>) {
    sink.obs.parse_error(kind);
    let delta = serde_json::json!({"type": "parse_error", "kind": kind.as_str(), "message": message});
    error_envelope(scopes, &delta.to_string(), sink);
}

/// `id` if every envelope may repeat it (`envelope::ids`), else `""` after an `error` envelope: a long or
/// unsafe identifier would multiply the output by its length (issue 13). `what` names it in the message.
pub fn safe_id<'a>(scopes: &Scopes, id: &'a str, what: &str, sink: &mut Sink<impl Observer>) -> &'a str {
    if ids::is_valid(id) {
        return id;
    }
    let message = format!(
        "{what} of {} bytes is not an identifier (at most {} bytes, no control characters); replaced by \"\"",
        id.len(),
        ids::MAX_ID_BYTES
    );
    parse_error(scopes, ParseErrorKind::InvalidId, &message, sink);
    ""
}

/// Bad input in one event, for the parser to report as one counted `error` envelope; the run goes on.
#[derive(Debug)]
pub struct Fault {
    pub kind: ParseErrorKind,
    pub message: String,
}

impl Fault {
    /// An event that does not read as `what`: JSON that does not parse is `invalid_json`, JSON of another shape
    /// `unexpected`.
    pub fn of_json(e: &serde_json::Error, what: &str) -> Self {
        let kind = match e.classify() {
            serde_json::error::Category::Data => ParseErrorKind::Unexpected,
            _ => ParseErrorKind::InvalidJson,
        };
        Self::new(kind, format!("not {what}: {e}"))
    }

    pub fn new(kind: ParseErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}
