//! The simplest correct alternative, for comparison: collect each SSE event's data whole, collect each
//! legacy item whole, parse it with a `quick_xml::Reader`, build envelopes as `serde_json` maps.
//!
//! It handles the XML dialect's items of DESIGN 3.2 with the escapes of 3.3 and the traps of 3.6 that the
//! bench inputs exercise (tags inside text, `]]>` in server results, structured client results, empty tool
//! input, backend failure JSON). Not covered: the raw dialect, subagent scopes, multimodal results' images
//! inside a fragmented item, old-dialect framing, item size limits. It is a yardstick, not a product.

mod items;

use serde_json::{Map, Value};

/// Settings the naive translator honours (the rest are the core's defaults).
#[derive(Clone, Copy)]
pub struct NaiveOptions {
    pub budget: usize,
    pub rewrite_format: bool,
}

impl Default for NaiveOptions {
    fn default() -> Self {
        Self {
            budget: 2048,
            rewrite_format: true,
        }
    }
}

/// One stream's naive translator, with the same feed/finish shape as the core.
pub struct Naive {
    opts: NaiveOptions,
    agent: String,
    /// Upstream bytes not yet split into lines, and how far we already looked for a line end.
    pending: Vec<u8>,
    scanned: usize,
    /// The current event's data, collected whole.
    data: Vec<u8>,
    has_data: bool,
    /// An item spread over several events, collected whole.
    item: String,
    /// The open streamed block (text or thinking), if any.
    open: Option<&'static str>,
}

impl Naive {
    pub fn new(opts: NaiveOptions, fallback_agent: &str) -> Self {
        Self {
            opts,
            agent: fallback_agent.to_string(),
            pending: Vec::new(),
            scanned: 0,
            data: Vec::new(),
            has_data: false,
            item: String::new(),
            open: None,
        }
    }

    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(input);
        let mut start = 0;
        // Search only the new bytes: a multi-MB line must not be rescanned on every read.
        let mut from = self.scanned;
        while let Some(i) = memchr::memchr(b'\n', &buf[from..]) {
            let end = from + i;
            let line = &buf[start..end];
            self.on_line(line.strip_suffix(b"\r").unwrap_or(line), out);
            start = end + 1;
            from = start;
        }
        buf.drain(..start);
        self.scanned = buf.len();
        self.pending = buf;
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.item.is_empty() {
            self.parse_error("truncated", "end of input inside an item", out);
            self.item.clear();
        }
        if let Some(kind) = self.open.take() {
            self.envelope(out, kind, true, "", &[]);
        }
    }

    /// WHATWG line handling, legacy flavour: `data:` lines joined with nothing, a blank line dispatches,
    /// comments and other fields ignored.
    fn on_line(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if line.is_empty() {
            if std::mem::take(&mut self.has_data) {
                let data = std::mem::take(&mut self.data);
                match String::from_utf8(data) {
                    Ok(s) => self.on_event(&s, out),
                    Err(_) => self.parse_error("invalid_utf8", "event data is not UTF-8", out),
                }
            }
        } else if let Some(v) = line.strip_prefix(b"data") {
            let v = match v.first() {
                None => v,
                Some(b':') => v[1..].strip_prefix(b" ").unwrap_or(&v[1..]),
                Some(_) => return,
            };
            self.data.extend_from_slice(v);
            self.has_data = true;
        }
    }

    fn on_event(&mut self, data: &str, out: &mut Vec<u8>) {
        if !self.item.is_empty() {
            self.item.push_str(data);
            if items::is_complete(&self.item) {
                let item = std::mem::take(&mut self.item);
                self.on_item(&item, out);
            }
            return;
        }
        if let Some(kind) = self.open {
            let close = if kind == "text" {
                "</content-block-text>"
            } else {
                "</content-block-thinking>"
            };
            if let Some(text) = data.strip_suffix(close) {
                self.delta(out, kind, text);
                self.open = None;
                self.envelope(out, kind, true, "", &[]);
            } else if data.starts_with("<content-block-")
                && items::is_complete(data)
                && items::opens_block(data).is_none()
            {
                self.on_item(data, out);
            } else {
                self.delta(out, kind, data);
            }
            return;
        }
        if data == "[DONE]" {
            out.extend_from_slice(b"data: [DONE]\n\n");
        } else if data.starts_with('{') {
            self.failure(data, out);
        } else if data.starts_with('<') {
            if let Some(kind) = items::opens_block(data) {
                self.open = Some(kind);
            } else if items::is_complete(data) {
                self.on_item(data, out);
            } else {
                self.item.push_str(data);
            }
        } else {
            self.parse_error("unexpected", "text outside any block", out);
        }
    }

    fn delta(&mut self, out: &mut Vec<u8>, kind: &'static str, escaped: &str) {
        if !escaped.is_empty() {
            let text = items::formatter_unescape(escaped);
            self.chunks(out, kind, true, &text, &[]);
        }
    }

    /// The backend failure JSON: an `error` envelope without the traceback.
    fn failure(&mut self, data: &str, out: &mut Vec<u8>) {
        match serde_json::from_str::<Map<String, Value>>(data) {
            Ok(mut m) if m.contains_key("error") => {
                m.remove("traceback");
                if let Some(kind) = self.open.take() {
                    self.envelope(out, kind, true, "", &[]);
                }
                let delta = Value::Object(m).to_string();
                self.envelope(out, "error", true, &delta, &[]);
            }
            _ => self.parse_error("invalid_json", "unexpected JSON event", out),
        }
    }

    fn parse_error(&mut self, kind: &str, message: &str, out: &mut Vec<u8>) {
        let delta = serde_json::json!({"type": "parse_error", "kind": kind, "message": message}).to_string();
        self.envelope(out, "error", true, &delta, &[]);
    }

    /// Writes one envelope: a `serde_json` map with the keys in protocol order.
    fn envelope(&self, out: &mut Vec<u8>, kind: &str, is_final: bool, delta: &str, extras: &[(&str, Value)]) {
        let mut m = Map::new();
        m.insert("type".into(), kind.into());
        m.insert("agent".into(), self.agent.as_str().into());
        m.insert("final".into(), is_final.into());
        m.insert("delta".into(), delta.into());
        for (k, v) in extras {
            m.insert((*k).into(), v.clone());
        }
        out.extend_from_slice(b"data: ");
        // Writing JSON into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, &m);
        out.extend_from_slice(b"\n\n");
    }

    /// Splits `content` into envelopes within the budget. Streamed blocks send every chunk `final:false`
    /// (the close sends the marker); buffered blocks mark the last chunk final.
    fn chunks(&self, out: &mut Vec<u8>, kind: &str, streamed: bool, content: &str, extras: &[(&str, Value)]) {
        // The common case: the whole content fits in one envelope.
        let start = out.len();
        self.envelope(out, kind, !streamed, content, extras);
        if out.len() - start - FRAMING <= self.opts.budget {
            return;
        }
        out.truncate(start);
        let mut probe = Vec::new();
        self.envelope(&mut probe, kind, false, "", extras);
        let overhead = probe.len() - FRAMING;
        // Fixed fields over budget: one envelope, whole (counted oversize by the core).
        let room = self.opts.budget.saturating_sub(overhead).max(6);
        let mut start = 0;
        let mut used = 0;
        for (i, c) in content.char_indices() {
            let n = escaped_len(c);
            if used + n > room {
                self.envelope(out, kind, false, &content[start..i], extras);
                start = i;
                used = 0;
            }
            used += n;
        }
        self.envelope(out, kind, !streamed, &content[start..], extras);
    }
}

/// `data: ` and the blank line around each envelope's JSON.
const FRAMING: usize = b"data: \n\n".len();

/// Bytes `c` takes in a JSON string as serde_json writes it.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{8}' | '\t' | '\n' | '\u{c}' | '\r' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}
