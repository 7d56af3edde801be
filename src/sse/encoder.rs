//! SSE framing of our output: every event is one `data: <line>\n\n`, plus the fixed lines we send.

/// The stream terminator passed through from upstream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// A keepalive comment; SSE clients ignore it, idle-timeout proxies do not.
pub const KEEPALIVE: &[u8] = b": keepalive\n\n";

/// Writes one event whose single `data:` line `line` writes (it must write no line break); returns what `line`
/// returned.
pub fn event<R>(out: &mut Vec<u8>, line: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    out.extend_from_slice(b"data: ");
    let r = line(out);
    out.extend_from_slice(b"\n\n");
    r
}

/// The data line of an event [`event`] wrote (what `line` wrote).
pub fn data_of(event: &[u8]) -> &[u8] {
    let e = event.strip_prefix(b"data: ").unwrap_or(event);
    e.strip_suffix(b"\n\n").unwrap_or(e)
}
