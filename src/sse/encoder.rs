//! SSE framing of our output: every envelope is one `data: <json>\n\n` event.

use crate::envelope::BlockHeader;

/// The stream terminator passed through from upstream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// A keepalive comment; SSE clients ignore it, idle-timeout proxies do not.
pub const KEEPALIVE: &[u8] = b": keepalive\n\n";

/// Writes one envelope as an SSE event; returns the JSON object's size.
pub fn write_envelope(out: &mut Vec<u8>, header: &BlockHeader, is_final: bool, delta: &str) -> usize {
    out.extend_from_slice(b"data: ");
    let n = header.write_json(out, is_final, delta);
    out.extend_from_slice(b"\n\n");
    n
}
