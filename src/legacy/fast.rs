//! Hand-written readers for the JSON dialects' most frequent events, which serde_json reads at several times the
//! cost of a whole legacy item (BENCHMARKS.md, issue 29): cogency's `think`/`respond` as `json.dumps` writes them,
//! and the Agent SDK's `stream_event` carrying a `content_block_delta`, compact as the CLI writes it. Each reader
//! takes exactly one byte layout and answers `None` for anything else (another key order, whitespace, an unusual
//! key or value), which then goes to serde. Where a reader answers, serde would have read the same values: the
//! strings are decoded by serde_json itself whenever they hold an escape, and everything skipped is checked to be
//! valid JSON of the expected kind.

/// A delta's kind in a `content_block_delta`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaKind {
    Text,
    Thinking,
    InputJson,
}

impl DeltaKind {
    /// The kind a raw event's `delta.type` names, if it is one of these.
    pub fn of(ty: &str) -> Option<Self> {
        match ty {
            "text_delta" => Some(DeltaKind::Text),
            "thinking_delta" => Some(DeltaKind::Thinking),
            "input_json_delta" => Some(DeltaKind::InputJson),
            _ => None,
        }
    }
}

/// An Agent SDK `stream_event` with a `content_block_delta`.
#[derive(Debug, PartialEq, Eq)]
pub struct SdkDelta<'a> {
    pub index: u64,
    pub kind: DeltaKind,
    pub text: &'a str,
    /// `parent_tool_use_id`, when it is a string.
    pub parent: Option<&'a str>,
}

/// A decoding buffer larger than this after an event is let go rather than kept for the next one.
pub const SCRATCH_KEEP: usize = 64 << 10;

/// A cogency `think` (`true`) or `respond` (`false`) event: `{"type": "think", "content": "…"[, "timestamp": n]}`.
pub fn cogency_stream<'a>(ev: &'a [u8], scratch: &'a mut String) -> Option<(bool, &'a str)> {
    const THINK: &[u8] = br#"{"type": "think", "content": ""#;
    const RESPOND: &[u8] = br#"{"type": "respond", "content": ""#;
    let (think, at) = if ev.starts_with(THINK) {
        (true, THINK.len())
    } else if ev.starts_with(RESPOND) {
        (false, RESPOND.len())
    } else {
        return None;
    };
    let (text, mut at) = string(ev, at - 1, scratch)?;
    if let Some(rest) = ev[at..].strip_prefix(br#", "timestamp": "#) {
        at = ev.len() - rest.len();
        at = number(ev, at)?;
    }
    (&ev[at..] == b"}").then_some((think, text))
}

/// An Agent SDK `stream_event` with a `content_block_delta`:
/// `{"type":"stream_event","event":{"type":"content_block_delta","index":N,"delta":{"type":"…_delta","…":"…"}}`, then
/// only `session_id`, `parent_tool_use_id` and `uuid`, each a string or null, at most once each.
pub fn sdk_delta<'a>(ev: &'a [u8], scratch: &'a mut String) -> Option<SdkDelta<'a>> {
    const HEAD: &[u8] = br#"{"type":"stream_event","event":{"type":"content_block_delta","index":"#;
    let mut at = HEAD.len();
    if !ev.starts_with(HEAD) {
        return None;
    }
    let digits = ev[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    // JSON has no leading zeros; 19 digits always fit a u64.
    if digits == 0 || digits > 19 || (digits > 1 && ev[at] == b'0') {
        return None;
    }
    let index = std::str::from_utf8(&ev[at..at + digits]).ok()?.parse().ok()?;
    at += digits;
    let rest = ev[at..].strip_prefix(br#","delta":{"type":""#)?;
    at = ev.len() - rest.len();
    let (kind, field): (DeltaKind, &[u8]) = if rest.starts_with(br#"text_delta","text":""#) {
        (DeltaKind::Text, br#"text_delta","text":""#)
    } else if rest.starts_with(br#"thinking_delta","thinking":""#) {
        (DeltaKind::Thinking, br#"thinking_delta","thinking":""#)
    } else if rest.starts_with(br#"input_json_delta","partial_json":""#) {
        (DeltaKind::InputJson, br#"input_json_delta","partial_json":""#)
    } else {
        return None;
    };
    let (text, end) = string(ev, at + field.len() - 1, scratch)?;
    at = end;
    if ev.get(at..at + 2)? != b"}}" {
        return None;
    }
    at += 2;
    let mut parent = None;
    let mut seen = [false; 3];
    const KEYS: [&[u8]; 3] = [br#","session_id":"#, br#","parent_tool_use_id":"#, br#","uuid":"#];
    while ev.get(at) == Some(&b',') {
        let slot = KEYS.iter().position(|k| ev[at..].starts_with(k))?;
        if std::mem::replace(&mut seen[slot], true) {
            return None;
        }
        at += KEYS[slot].len();
        if ev[at..].starts_with(b"null") {
            at += 4;
        } else {
            let (value, end) = plain_string(ev, at)?;
            if slot == 1 {
                parent = Some(std::str::from_utf8(value).ok()?);
            } else if !value.is_ascii() {
                std::str::from_utf8(value).ok()?;
            }
            at = end;
        }
    }
    (&ev[at..] == b"}").then_some(SdkDelta {
        index,
        kind,
        text,
        parent,
    })
}

/// The JSON string whose opening quote is at `ev[at]`, and the index after its closing quote. Without escapes it
/// is borrowed from `ev` (after a UTF-8 check); with escapes it is decoded into `scratch`, a buffer the stream keeps,
/// and anything serde_json would refuse (an unknown escape, a lone surrogate) is `None`.
fn string<'a>(ev: &'a [u8], at: usize, scratch: &'a mut String) -> Option<(&'a str, usize)> {
    if ev.get(at) != Some(&b'"') {
        return None;
    }
    let body = &ev[at + 1..];
    let mut i = 0;
    let mut escaped = false;
    loop {
        i += memchr::memchr2(b'"', b'\\', &body[i..])?;
        if body[i] == b'"' {
            break;
        }
        escaped = true;
        // Skip the escaped character (`unescape` checks the escape).
        i += 2;
        if i > body.len() {
            return None;
        }
    }
    let raw = &body[..i];
    if has_control(raw) {
        return None;
    }
    let end = at + 1 + i + 1;
    let text = std::str::from_utf8(raw).ok()?;
    if !escaped {
        return Some((text, end));
    }
    scratch.clear();
    unescape(text, scratch)?;
    Some((scratch.as_str(), end))
}

/// Decodes a JSON string's escapes (RFC 8259 §7) onto `out`; `None` for an escape JSON does not have or a
/// surrogate without its pair, as serde_json refuses them.
fn unescape(mut rest: &str, out: &mut String) -> Option<()> {
    while let Some(p) = rest.find('\\') {
        out.push_str(&rest[..p]);
        let esc = *rest.as_bytes().get(p + 1)?;
        if !esc.is_ascii() {
            return None;
        }
        // The escape's letter is one ASCII byte: `p + 2` is a character boundary.
        rest = &rest[p + 2..];
        let c = match esc {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let (c, used) = unicode(rest)?;
                rest = &rest[used..];
                c
            }
            _ => return None,
        };
        out.push(c);
    }
    out.push_str(rest);
    Some(())
}

/// The character of a `\u` escape whose four hex digits start `rest` (with its low surrogate's escape after a high
/// one), and the bytes it took.
fn unicode(rest: &str) -> Option<(char, usize)> {
    let hex = |s: &str| -> Option<u32> {
        let h = s.get(..4)?;
        h.bytes()
            .all(|b| b.is_ascii_hexdigit())
            .then(|| u32::from_str_radix(h, 16).ok())
            .flatten()
    };
    let u = hex(rest)?;
    match u {
        0xD800..=0xDBFF => {
            let lo = hex(rest.get(4..)?.strip_prefix("\\u")?)?;
            if !(0xDC00..=0xDFFF).contains(&lo) {
                return None;
            }
            Some((char::from_u32(0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00))?, 10))
        }
        0xDC00..=0xDFFF => None,
        _ => Some((char::from_u32(u)?, 4)),
    }
}

/// A JSON string without escapes at `ev[at]`, its bytes (UTF-8 not checked yet), and the index after it.
fn plain_string(ev: &[u8], at: usize) -> Option<(&[u8], usize)> {
    if ev.get(at) != Some(&b'"') {
        return None;
    }
    let len = memchr::memchr2(b'"', b'\\', &ev[at + 1..])?;
    let raw = &ev[at + 1..at + 1 + len];
    // Identifiers (a session, a uuid) are short and printable ASCII: one early-exit pass answers for them.
    let printable = raw.iter().all(|&b| (0x20..0x80).contains(&b));
    if ev[at + 1 + len] != b'"' || (!printable && has_control(raw)) {
        return None;
    }
    Some((raw, at + len + 2))
}

/// Whether `raw` holds a control character, which JSON forbids in a string (read without an early exit, so that
/// it runs on whole vectors).
fn has_control(raw: &[u8]) -> bool {
    raw.iter().fold(0xff, |least: u8, &b| least.min(b)) < 0x20
}

/// The index after the JSON number at `ev[at]` (`-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?`).
fn number(ev: &[u8], mut at: usize) -> Option<usize> {
    let digits = |at: usize| ev[at.min(ev.len())..].iter().take_while(|b| b.is_ascii_digit()).count();
    if ev.get(at) == Some(&b'-') {
        at += 1;
    }
    let n = digits(at);
    if n == 0 || (n > 1 && ev[at] == b'0') {
        return None;
    }
    at += n;
    if ev.get(at) == Some(&b'.') {
        let n = digits(at + 1);
        if n == 0 {
            return None;
        }
        at += 1 + n;
    }
    if matches!(ev.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(ev.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let n = digits(at);
        if n == 0 {
            return None;
        }
        at += n;
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// What serde reads from a cogency event, for the comparison.
    fn serde_cogency(ev: &[u8]) -> Option<(bool, String)> {
        let v: Value = serde_json::from_slice(ev).ok()?;
        let think = match v.get("type")?.as_str()? {
            "think" => true,
            "respond" => false,
            _ => return None,
        };
        Some((think, v.get("content")?.as_str()?.to_owned()))
    }

    /// What serde reads from an Agent SDK delta message.
    fn serde_sdk(ev: &[u8]) -> Option<(u64, DeltaKind, String, Option<String>)> {
        let v: Value = serde_json::from_slice(ev).ok()?;
        let e = v.get("event")?;
        let d = e.get("delta")?;
        let ty = DeltaKind::of(d.get("type")?.as_str()?)?;
        let text = d
            .get("text")
            .or(d.get("thinking"))
            .or(d.get("partial_json"))?
            .as_str()?
            .to_owned();
        let parent = v.get("parent_tool_use_id").and_then(Value::as_str).map(str::to_owned);
        Some((e.get("index")?.as_u64()?, ty, text, parent))
    }

    #[test]
    fn the_hot_shapes_are_read_and_everything_else_is_left_to_serde() {
        let mut scratch = String::new();
        let ev = br#"{"type": "respond", "content": "a \"b\" \u00e9 \ud83c\udf89", "timestamp": 1750000000.125}"#;
        let (t, s) = cogency_stream(ev, &mut scratch).unwrap();
        assert!(!t);
        assert_eq!(s, "a \"b\" \u{e9} \u{1f389}");
        assert!(cogency_stream(br#"{"type": "think", "content": "x"}"#, &mut String::new()).is_some());
        for no in [
            &br#"{"type":"think","content":"x"}"#[..],
            br#"{"type": "think", "content": "x", "timestamp": 01}"#,
            br#"{"type": "think", "content": "x", "timestamp": 1.}"#,
            br#"{"type": "think", "content": "x", "other": 1}"#,
            br#"{"type": "think", "content": "a	b"}"#,
            br#"{"type": "think", "content": "\q"}"#,
            br#"{"type": "think", "content": "x""#,
        ] {
            assert_eq!(
                cogency_stream(no, &mut String::new()),
                None,
                "{}",
                String::from_utf8_lossy(no)
            );
        }
        let d = sdk_delta(br#"{"type":"stream_event","event":{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}},"session_id":"s","parent_tool_use_id":"toolu_1","uuid":"u"}"#, &mut scratch).unwrap();
        assert_eq!(
            (d.index, d.kind, d.text, d.parent),
            (2, DeltaKind::InputJson, "{\"a\"", Some("toolu_1"))
        );
        for no in [
            &br#"{"type":"stream_event","event":{"type":"content_block_delta","index":01,"delta":{"type":"text_delta","text":"x"}}}"#[..],
            br#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}},"type":"user"}"#,
            br#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}},"uuid":"a","uuid":"b"}"#,
            br#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}},"parent_tool_use_id":"a\"b"}"#,
            br#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x","more":1}}}"#,
            br#"{"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}},"ttft_ms":5}"#,
        ] {
            assert_eq!(sdk_delta(no, &mut String::new()), None, "{}", String::from_utf8_lossy(no));
        }
    }

    /// The `data:` values of a recorded fixture.
    fn fixture(name: &str) -> Vec<Vec<u8>> {
        let path = format!("{}/tests/fixtures/dialects/{name}.sse", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read(path).expect("fixture");
        text.split(|&b| b == b'\n')
            .filter_map(|l| l.strip_prefix(b"data: "))
            .map(<[u8]>::to_vec)
            .collect()
    }

    #[test]
    fn the_recorded_hot_events_take_the_fast_readers() {
        for name in ["cogency30_long_respond", "cogency_token_mode", "cogency_utf8_escapes"] {
            for ev in fixture(name) {
                let hot = ev.starts_with(br#"{"type": "think""#) || ev.starts_with(br#"{"type": "respond""#);
                assert_eq!(
                    cogency_stream(&ev, &mut String::new()).is_some(),
                    hot,
                    "{name}: {}",
                    String::from_utf8_lossy(&ev)
                );
            }
        }
        let events = fixture("agent_sdk_partial_on");
        let deltas = events
            .iter()
            .filter(|e| e.windows(21).any(|w| w == b"\"content_block_delta\""))
            .count();
        let fast = events
            .iter()
            .filter(|e| sdk_delta(e, &mut String::new()).is_some())
            .count();
        // Every delta but the signatures'.
        assert!(
            deltas > 20 && fast + 2 >= deltas && fast < deltas + 1,
            "{fast} of {deltas}"
        );
    }

    /// A JSON string body from pieces that stress the reader: escapes, quotes, control characters, non-ASCII.
    fn body() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[a-z <>&]{0,6}",
            Just("\\\"".to_owned()),
            Just("\\\\".to_owned()),
            Just("\\n".to_owned()),
            Just("\\u00e9".to_owned()),
            Just("\\ud83d\\ude00".to_owned()),
            Just("\\ud800".to_owned()),
            Just("\\x".to_owned()),
            Just("\\".to_owned()),
            Just("\"".to_owned()),
            Just("\t".to_owned()),
            Just("é漢🎉".to_owned()),
        ];
        prop::collection::vec(piece, 0..8).prop_map(|p| p.concat())
    }

    proptest! {
        /// Wherever a reader answers, serde reads the same values from the same bytes; and on its own shape a reader
        /// answers wherever serde reads it (so the fast path is taken, not only harmless), except for a
        /// `parent_tool_use_id` with an escape, which is left to serde on purpose.
        #[test]
        fn the_readers_and_serde_read_the_same_events_alike(text in body(), think in any::<bool>(), ts in prop_oneof![Just(String::new()), Just(", \"timestamp\": 1.5".to_owned()), Just(", \"timestamp\": -2e9".to_owned()), Just(", \"timestamp\": 1.".to_owned())], index in 0u64..1000, parent in prop_oneof![Just("null".to_owned()), Just("\"toolu_1\"".to_owned()), Just("\"a\\\"b\"".to_owned())], kind in 0..3usize) {
            let ty = if think { "think" } else { "respond" };
            let ev = format!(r#"{{"type": "{ty}", "content": "{text}"{ts}}}"#);
            let fast = cogency_stream(ev.as_bytes(), &mut String::new()).map(|(t, s)| (t, s.to_owned()));
            prop_assert_eq!(fast, serde_cogency(ev.as_bytes()), "{}", ev);
            let (dt, field) = [("text_delta", "text"), ("thinking_delta", "thinking"), ("input_json_delta", "partial_json")][kind];
            let ev = format!(r#"{{"type":"stream_event","event":{{"type":"content_block_delta","index":{index},"delta":{{"type":"{dt}","{field}":"{text}"}}}},"session_id":"s","parent_tool_use_id":{parent},"uuid":"u"}}"#);
            let fast = sdk_delta(ev.as_bytes(), &mut String::new())
                .map(|d| (d.index, d.kind, d.text.to_owned(), d.parent.map(str::to_owned)));
            if fast.is_some() || !parent.contains('\\') {
                prop_assert_eq!(fast, serde_sdk(ev.as_bytes()), "{}", ev);
            }
        }
    }
}
