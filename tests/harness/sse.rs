//! The gateway's SSE output, read back: one event splitter under a lenient reader (`data:` payloads, comments
//! skipped: [`sse_data`], [`envelopes`]) and a strict one (every line a comment or `data: `, every envelope with
//! its four fields: [`parse_stream`]); the core level's byte-exact parser splits with [`events`] too. Then
//! accessors of an envelope's fields, and [`blocks`] to compare streams however their content was chunked.

use serde_json::Value;

/// The events of a stream that must end every event with a blank line: `Err` on an unterminated last event.
pub fn events(text: &str) -> impl Iterator<Item = Result<&str, String>> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let Some(end) = rest.find("\n\n") else {
            let tail = std::mem::take(&mut rest);
            return Some(Err(format!("unterminated event at the end: {:?}", clip(tail, 160))));
        };
        let event = &rest[..end];
        rest = &rest[end + 2..];
        Some(Ok(event))
    })
}

/// The `data:` payloads of an SSE byte stream, comments (keepalives) skipped.
pub fn sse_data(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut out = Vec::new();
    for event in text.split("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if !data.is_empty() {
            out.push(data.join("\n"));
        }
    }
    out
}

/// The envelopes of a translated stream (`[DONE]` kept as a string value).
pub fn envelopes(bytes: &[u8]) -> Vec<Value> {
    sse_data(bytes)
        .into_iter()
        .map(|d| {
            if d == "[DONE]" {
                Value::String(d)
            } else {
                serde_json::from_str(&d).unwrap_or_else(|e| panic!("envelope is not JSON ({e}): {d}"))
            }
        })
        .collect()
}

/// One SSE event of the gateway's output.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    Envelope(Value),
    Done,
    /// A `:` comment line (keepalive).
    Comment(String),
}

/// Parses a translated stream strictly: events end with a blank line, every `data:` line is `[DONE]` or a JSON
/// object with string `type`, string `agent`, boolean `final` and string `delta`. Returns the events in order.
pub fn parse_stream(bytes: &[u8]) -> Result<Vec<Out>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("output is not UTF-8: {e}"))?;
    let mut out = Vec::new();
    for event in events(text) {
        for line in event?.split('\n') {
            if let Some(c) = line.strip_prefix(':') {
                out.push(Out::Comment(c.trim().to_owned()));
            } else if let Some(d) = line.strip_prefix("data: ") {
                if d == "[DONE]" {
                    out.push(Out::Done);
                    continue;
                }
                let v: Value =
                    serde_json::from_str(d).map_err(|e| format!("data line is not JSON ({e}): {}", clip(d, 300)))?;
                let ok = v.get("type").is_some_and(Value::is_string)
                    && v.get("agent").is_some_and(Value::is_string)
                    && v.get("final").is_some_and(Value::is_boolean)
                    && v.get("delta").is_some_and(Value::is_string);
                if !ok {
                    return Err(format!("envelope lacks type/agent/final/delta: {}", clip(d, 300)));
                }
                out.push(Out::Envelope(v));
            } else {
                return Err(format!("unexpected line in output: {:?}", clip(line, 300)));
            }
        }
    }
    Ok(out)
}

/// `s` cut to at most `max` bytes (at a character boundary), with its length when cut.
pub fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// The envelopes only (keepalives and `[DONE]` dropped).
pub fn envelope_values(events: &[Out]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| match e {
            Out::Envelope(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

pub fn kind(v: &Value) -> &str {
    v["type"].as_str().unwrap_or("")
}

pub fn delta(v: &Value) -> &str {
    v["delta"].as_str().unwrap_or("")
}

pub fn is_final(v: &Value) -> bool {
    v["final"].as_bool().unwrap_or(false)
}

/// The `type` field of an `error` envelope's delta when it is JSON (`upstream_error`, `parse_error`), else "".
pub fn error_type(v: &Value) -> String {
    serde_json::from_str::<Value>(delta(v))
        .ok()
        .and_then(|d| d.get("type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_default()
}

/// A translated stream as blocks: (type, agent, concatenated deltas) per block, a block ending at `final:true`.
/// Makes comparisons independent of how content was chunked.
pub fn blocks(envs: &[Value]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    let mut open: Option<(String, String, String)> = None;
    for v in envs {
        let (k, a, d) = (
            kind(v).to_owned(),
            v["agent"].as_str().unwrap_or("").to_owned(),
            delta(v),
        );
        match &mut open {
            Some((ok, oa, od)) if *ok == k && *oa == a => od.push_str(d),
            _ => {
                out.extend(open.take());
                open = Some((k, a, d.to_owned()));
            }
        }
        if is_final(v) {
            out.extend(open.take());
        }
    }
    out.extend(open);
    out
}
