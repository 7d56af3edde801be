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
/// object with string `type`, string `agent`, boolean `final` and string `delta`; ids, when the stream has them,
/// are one stream's `sg1-<token>-<seq>` with seq 1, 2, 3… and only the first event has `retry:`. Returns the
/// events in order.
pub fn parse_stream(bytes: &[u8]) -> Result<Vec<Out>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("output is not UTF-8: {e}"))?;
    let mut out = Vec::new();
    let mut ids = Ids::default();
    for event in events(text) {
        for line in event?.split('\n') {
            if let Some(id) = line.strip_prefix("id: ") {
                ids.next(id)?;
            } else if let Some(ms) = line.strip_prefix("retry: ") {
                if ids.seq != 1 || ms.parse::<u64>().is_err() {
                    return Err(format!("retry: {ms:?} not on the first event"));
                }
            } else if let Some(c) = line.strip_prefix(':') {
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

/// The ids of one translated stream: one token, consecutive positions from 1.
#[derive(Default)]
pub struct Ids {
    pub token: Option<String>,
    pub seq: u64,
}

impl Ids {
    /// Checks the next id.
    pub fn next(&mut self, id: &str) -> Result<(), String> {
        let (token, seq) = split_id(id).ok_or_else(|| format!("id {id:?} is not sg1-<32 hex>-<seq>"))?;
        if self.token.get_or_insert_with(|| token.to_owned()) != token {
            return Err(format!("id {id:?} names another stream"));
        }
        if seq != self.seq + 1 {
            return Err(format!("id {id:?} after position {}", self.seq));
        }
        self.seq = seq;
        Ok(())
    }
}

/// An id of ours as (token, seq).
pub fn split_id(id: &str) -> Option<(&str, u64)> {
    let (token, seq) = id.strip_prefix("sg1-")?.split_once('-')?;
    let hex = token.len() == 32 && token.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    hex.then_some(())?;
    Some((token, seq.parse().ok()?))
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

/// A translated stream with its resume lines (`id:`, `retry:`) taken out, after checking them as
/// [`parse_stream`] does: what the translator itself wrote, byte for byte.
pub fn without_ids(bytes: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(bytes);
    let mut ids = Ids::default();
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if let Some(id) = line.strip_prefix("id: ") {
            ids.next(id.trim_end()).unwrap_or_else(|e| panic!("{e}"));
        } else if line.starts_with("retry: ") {
            assert_eq!(ids.seq, 1, "retry: only on the first event");
        } else {
            out.push_str(line);
        }
    }
    out.into_bytes()
}
