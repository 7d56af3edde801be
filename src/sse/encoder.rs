//! SSE framing of our output: every envelope is one `data: <json>\n\n` event.

use crate::envelope::{chunker, BlockHeader};

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

/// Writes one `final:false` envelope carrying the longest prefix of `text`
/// whose escaped size is at most `room` (a chunk that is not a block's last);
/// returns the JSON object's size and that prefix's length (0 when not even
/// one character fits: nothing is written then). `guess` is where to try the
/// cut first (see `chunker::write_escaped_fitting`).
pub fn write_chunk_fitting(
    out: &mut Vec<u8>,
    header: &BlockHeader,
    text: &str,
    room: usize,
    guess: usize,
) -> (usize, usize) {
    let start = out.len();
    out.extend_from_slice(b"data: ");
    let (n, taken) = header.write_json_with(out, false, |out| chunker::write_escaped_fitting(out, text, room, guess));
    if taken == 0 && !text.is_empty() {
        out.truncate(start);
        return (0, 0);
    }
    out.extend_from_slice(b"\n\n");
    (n, taken)
}
