//! Shared by the upstream and the client: clocks, the delta stamp format, small parsers.

use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock nanoseconds since the Unix epoch: the upstream (its own process) and the client share it.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Appends the text delta for event `seq` sent at `ns`: `t=<ns>;s=<seq>;` padded with `x` to 28..=40 bytes.
/// Plain ASCII with no backslash or newline, so the legacy double escape (DESIGN 3.3) leaves it as it is.
pub fn write_delta(out: &mut Vec<u8>, ns: u64, seq: u64) {
    let start = out.len();
    out.extend_from_slice(b"t=");
    push_u64(out, ns);
    out.extend_from_slice(b";s=");
    push_u64(out, seq);
    out.push(b';');
    let want = 28 + (seq.wrapping_mul(7) % 13) as usize;
    while out.len() - start < want {
        out.push(b'x');
    }
}

pub fn push_u64(out: &mut Vec<u8>, v: u64) {
    // Writing to a Vec cannot fail; std's integer formatting does not allocate.
    let _ = write!(out, "{v}");
}

/// Leading ASCII digits of `s` as a number, and how many bytes they took.
pub fn parse_digits(s: &[u8]) -> Option<(u64, usize)> {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if n == 0 || n > 19 {
        return None;
    }
    let v = s[..n].iter().fold(0u64, |a, b| a * 10 + u64::from(b - b'0'));
    Some((v, n))
}

/// An SSE event without its `id:` and `retry:` lines, before or after its data (a resumable translated stream
/// gives every event an id, and its first a `retry:`; docs/RESUME.md; `5dc7fbe` wrote them before the data
/// line, later builds after it), so the rest reads as before.
pub fn event_body(mut ev: &[u8]) -> &[u8] {
    let field = |l: &[u8]| l.starts_with(b"id:") || l.starts_with(b"retry:");
    while field(ev) {
        match memchr::memchr(b'\n', ev) {
            Some(i) => ev = &ev[i + 1..],
            None => return &ev[ev.len()..],
        }
    }
    while let Some(i) = memchr::memrchr(b'\n', ev) {
        if !field(&ev[i + 1..]) {
            break;
        }
        ev = &ev[..i];
    }
    ev
}

/// The value of an event's `id:` line, wherever it is.
pub fn event_id(ev: &[u8]) -> Option<&[u8]> {
    ev.split(|b| *b == b'\n')
        .find_map(|l| l.strip_prefix(b"id:"))
        .map(|v| v.strip_prefix(b" ").unwrap_or(v))
}

/// The stamp in one SSE event (legacy `data: t=…` or a JSON envelope's delta): `(send ns, seq)`.
pub fn find_stamp(event: &[u8]) -> Option<(u64, u64)> {
    let mut from = 0;
    while let Some(p) = memchr::memmem::find(&event[from..], b"t=") {
        let at = from + p + 2;
        if let Some((ns, n)) = parse_digits(&event[at..]) {
            let rest = &event[at + n..];
            if let Some(r) = rest.strip_prefix(b";s=") {
                if let Some((seq, _)) = parse_digits(r) {
                    return Some((ns, seq));
                }
            }
        }
        from = at;
    }
    None
}

/// The number after `key` (skipping up to 16 bytes of quotes, `&quot;`, colons and backslashes).
pub fn find_number_after(event: &[u8], key: &[u8]) -> Option<u64> {
    let p = memchr::memmem::find(event, key)? + key.len();
    let rest = &event[p..];
    let skip = rest.iter().take(16).take_while(|b| !b.is_ascii_digit()).count();
    parse_digits(&rest[skip..]).map(|(v, _)| v)
}

/// Decoded length of the JSON string starting right after its opening quote in `s`, and the index of its
/// closing quote. Only the escapes the harness's payloads produce matter (`\n`, `\\`, `\"`, `\uXXXX`).
pub fn json_string_len(s: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    let mut len = 0;
    while i < s.len() {
        match s[i] {
            b'"' => return Some((len, i)),
            b'\\' => {
                if s.get(i + 1) == Some(&b'u') {
                    i += 6;
                } else {
                    i += 2;
                }
                len += 1;
            }
            _ => {
                i += 1;
                len += 1;
            }
        }
    }
    None
}
