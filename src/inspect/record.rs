//! The inspector's records as JSON lines (DESIGN 6.2): `raw` per upstream SSE event, `envelope` per envelope
//! written, `gap` where a reader lost records. Content (`data`) only when the inspector captures it.

use std::io::Write;

use bytes::Bytes;

/// One upstream SSE event, as the decoder assembled it.
pub struct Raw<'a> {
    pub seq: u64,
    pub t_ms: u64,
    /// Its `event:` type (`message` when it gave none).
    pub event: &'a [u8],
    /// Its data's length in bytes.
    pub bytes: usize,
    /// Its data (`None` without `capture_content`); `truncated` when longer than the inspector keeps.
    pub data: Option<&'a [u8]>,
    pub truncated: bool,
}

/// One envelope as written to the client.
pub struct Envelope<'a> {
    pub seq: u64,
    pub t_ms: u64,
    /// The raw event being read when it was written; `None` for the gateway's own (end of input, abort, drain).
    pub raw_seq: Option<u64>,
    /// Its type (not content).
    pub kind: &'a str,
    /// The envelope's JSON object's length in bytes.
    pub bytes: usize,
    /// The envelope's JSON object (`None` without `capture_content`).
    pub data: Option<&'a [u8]>,
}

/// A JSON string of `bytes` (invalid UTF-8 replaced).
fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    let s = String::from_utf8_lossy(bytes);
    // Writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s.as_ref());
}

impl Raw<'_> {
    pub fn line(&self) -> Bytes {
        let mut out = Vec::with_capacity(96 + self.data.map_or(0, <[u8]>::len));
        let _ = write!(
            out,
            r#"{{"side":"raw","seq":{},"t_ms":{},"event":"#,
            self.seq, self.t_ms
        );
        string(&mut out, if self.event.is_empty() { b"message" } else { self.event });
        let _ = write!(out, r#","bytes":{}"#, self.bytes);
        if let Some(d) = self.data {
            out.extend_from_slice(br#","data":"#);
            string(&mut out, d);
            if self.truncated {
                out.extend_from_slice(br#","truncated":true"#);
            }
        }
        out.push(b'}');
        Bytes::from(out)
    }
}

impl Envelope<'_> {
    pub fn line(&self) -> Bytes {
        let mut out = Vec::with_capacity(112 + self.data.map_or(0, <[u8]>::len));
        let _ = write!(
            out,
            r#"{{"side":"envelope","seq":{},"t_ms":{},"raw_seq":"#,
            self.seq, self.t_ms
        );
        match self.raw_seq {
            Some(n) => {
                let _ = write!(out, "{n}");
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(br#","type":"#);
        string(&mut out, self.kind.as_bytes());
        let _ = write!(out, r#","bytes":{}"#, self.bytes);
        if let Some(d) = self.data {
            // The translator's own JSON object, written as is.
            out.extend_from_slice(br#","data":"#);
            out.extend_from_slice(d);
        }
        out.push(b'}');
        Bytes::from(out)
    }
}

/// Where a reader lost `dropped` records (the ring moved past them).
pub fn gap(dropped: u64) -> Bytes {
    Bytes::from(format!(r#"{{"side":"gap","dropped":{dropped}}}"#))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parse(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn a_raw_record_carries_data_only_when_captured() {
        let mut r = Raw {
            seq: 3,
            t_ms: 12,
            event: b"",
            bytes: 5,
            data: None,
            truncated: false,
        };
        assert_eq!(
            parse(&r.line()),
            json!({"side":"raw","seq":3,"t_ms":12,"event":"message","bytes":5})
        );
        r.data = Some(b"<a\"\xff");
        let v = parse(&r.line());
        assert_eq!(v["data"], "<a\"\u{fffd}");
    }

    #[test]
    fn an_envelope_record_embeds_the_object_and_links_its_event() {
        let ev = b"data: {\"type\":\"text\",\"agent\":\"a\",\"final\":false,\"delta\":\"hi\"}\n\n";
        let data = Some(crate::sse::encoder::data_of(ev));
        let e = Envelope {
            seq: 0,
            t_ms: 1,
            raw_seq: None,
            kind: "text",
            bytes: data.map_or(0, <[u8]>::len),
            data,
        };
        let v = parse(&e.line());
        assert_eq!(v["raw_seq"], Value::Null);
        assert_eq!(v["data"]["delta"], "hi");
        let e = Envelope {
            raw_seq: Some(7),
            data: None,
            ..e
        };
        let v = parse(&e.line());
        assert_eq!(v["raw_seq"], 7);
        assert!(v.get("data").is_none());
    }

    #[test]
    fn a_gap_says_how_many() {
        assert_eq!(parse(&gap(9)), json!({"side":"gap","dropped":9}));
    }
}
