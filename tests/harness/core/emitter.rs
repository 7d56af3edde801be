//! A legacy-backend emitter written from DESIGN 3 and CONTRACT: a scenario
//! (content blocks and agent items) becomes the legacy SSE bytes the backend
//! would send, plus the envelopes the gateway must produce, as blocks.
//!
//! The expectation is written independently of the translator: it follows
//! DESIGN 3.3 (per-kind escaping), 3.4 (raw dialect), 3.5 (agents), 3.6
//! (traps) and 4 (envelopes), reading each passage literally.

use serde_json::{json, Map, Value};

use super::super::rng::Rng;

// ---------------------------------------------------------------- scenario

/// `meta_init.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Xml,
    Raw,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Xml => "xml",
            Format::Raw => "raw",
        }
    }
}

#[derive(Debug, Clone)]
pub struct MetaInit {
    pub agent: String,
    pub parent: Option<String>,
    pub format: Format,
    pub user_query: String,
    pub model: String,
    pub history: Option<Value>,
}

/// Tool-call input: a JSON value, or the empty input the backend writes as
/// the JSON string `""` (DESIGN 3.6, "Empty tool input").
#[derive(Debug, Clone)]
pub enum Args {
    Json(Value),
    Empty,
}

/// A citation's attribute value.
#[derive(Debug, Clone)]
pub enum Attr {
    Str(String),
    Num(u64),
}

#[derive(Debug, Clone)]
pub struct Citation {
    /// `char_location`, `page_location`, `web_search_result_location`.
    pub citation_type: String,
    /// Attributes after `type`, in order.
    pub attrs: Vec<(String, Attr)>,
    pub cited: String,
}

#[derive(Debug, Clone)]
pub struct Image {
    pub src: String,
    pub media_type: String,
}

/// A client tool result's content.
#[derive(Debug, Clone)]
pub enum ClientContent {
    /// A string result.
    Text(String),
    /// A dict or list result, JSON-encoded by the backend (DESIGN 3.6).
    Structured(Value),
    /// `<text>` + `<image/>` children.
    Multimodal { text: String, images: Vec<Image> },
}

/// A server tool result's content.
#[derive(Debug, Clone)]
pub enum ServerContent {
    Text(String),
    /// Raw dialect: structured content (emitted as JSON).
    Json(Value),
}

/// One thing the backend sends.
#[derive(Debug, Clone)]
pub enum Item {
    MetaInit(MetaInit),
    /// Streamed thinking; `close: false` leaves the block open (failure).
    Thinking {
        deltas: Vec<String>,
        close: bool,
    },
    /// Streamed text. `one_event`: the whole block in one event (XML only).
    /// Citations follow the close.
    Text {
        deltas: Vec<String>,
        close: bool,
        one_event: bool,
        citations: Vec<Citation>,
    },
    ToolCall {
        server: bool,
        id: String,
        name: String,
        args: Args,
    },
    ToolResult {
        id: String,
        name: String,
        content: ClientContent,
    },
    /// `tag`: `server_tool_result` or a dynamic `XYZ_tool_result`.
    ServerToolResult {
        tag: String,
        id: String,
        name: Option<String>,
        content: ServerContent,
    },
    AwaitingFrontendTools(Value),
    MetaFiles(Value),
    ContentError(String),
    MetaFinal(Value),
    /// The backend failure JSON (DESIGN 3.1).
    Failure {
        error: String,
        message: String,
        traceback: String,
    },
    /// Raw-dialect events that produce no envelope: message_start,
    /// message_delta, message_stop, ping.
    RawNoise,
    Done,
}

/// Short constructors for the items tests write by hand.
impl Item {
    /// A client (`server: false`) or server tool call.
    pub fn call(server: bool, id: &str, name: &str, args: Args) -> Item {
        Item::ToolCall {
            server,
            id: id.into(),
            name: name.into(),
            args,
        }
    }

    /// A client tool result.
    pub fn result(id: &str, name: &str, content: ClientContent) -> Item {
        Item::ToolResult {
            id: id.into(),
            name: name.into(),
            content,
        }
    }

    /// A server tool result; `tag` is `server_tool_result` or a dynamic `XYZ_tool_result`.
    pub fn server_result(tag: &str, id: &str, name: Option<&str>, content: ServerContent) -> Item {
        Item::ServerToolResult {
            tag: tag.into(),
            id: id.into(),
            name: name.map(Into::into),
            content,
        }
    }

    /// A server tool result with text content.
    pub fn server_text(tag: &str, id: &str, name: Option<&str>, text: impl Into<String>) -> Item {
        Item::server_result(tag, id, name, ServerContent::Text(text.into()))
    }

    /// A streamed text block, its deltas one event each.
    pub fn text<S: Into<String>>(deltas: impl IntoIterator<Item = S>, close: bool, citations: Vec<Citation>) -> Item {
        Item::Text {
            deltas: deltas.into_iter().map(Into::into).collect(),
            close,
            one_event: false,
            citations,
        }
    }

    /// A closed text block written whole in one event (XML only).
    pub fn one_event_text<S: Into<String>>(deltas: impl IntoIterator<Item = S>) -> Item {
        Item::Text {
            deltas: deltas.into_iter().map(Into::into).collect(),
            close: true,
            one_event: true,
            citations: vec![],
        }
    }

    /// A streamed thinking block.
    pub fn thinking<S: Into<String>>(deltas: impl IntoIterator<Item = S>, close: bool) -> Item {
        Item::Thinking {
            deltas: deltas.into_iter().map(Into::into).collect(),
            close,
        }
    }

    /// The backend failure JSON.
    pub fn failure(error: &str, message: &str, traceback: &str) -> Item {
        Item::Failure {
            error: error.into(),
            message: message.into(),
            traceback: traceback.into(),
        }
    }
}

impl MetaInit {
    /// An agent's `meta_init` with the model `claude-x`.
    pub fn new(
        agent: &str,
        parent: Option<&str>,
        format: Format,
        user_query: &str,
        history: Option<Value>,
    ) -> MetaInit {
        MetaInit {
            agent: agent.into(),
            parent: parent.map(Into::into),
            format,
            user_query: user_query.into(),
            model: "claude-x".into(),
            history,
        }
    }
}

impl Citation {
    pub fn new(citation_type: &str, attrs: Vec<(&str, Attr)>, cited: impl Into<String>) -> Citation {
        Citation {
            citation_type: citation_type.into(),
            attrs: attrs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            cited: cited.into(),
        }
    }

    /// A `char_location` citation: document index and title, character range.
    pub fn char_location(index: Attr, title: &str, start: Attr, end: Attr, cited: impl Into<String>) -> Citation {
        let attrs = vec![("document_index", index), ("document_title", Attr::Str(title.into()))];
        Citation::new("char_location", attrs, cited).with(&["start_char_index", "end_char_index"], [start, end])
    }

    /// A `page_location` citation: document index and title, page range.
    pub fn page_location(index: Attr, title: &str, start: Attr, end: Attr, cited: impl Into<String>) -> Citation {
        let attrs = vec![("document_index", index), ("document_title", Attr::Str(title.into()))];
        Citation::new("page_location", attrs, cited).with(&["start_page_number", "end_page_number"], [start, end])
    }

    /// A `web_search_result_location` citation.
    pub fn web_location(url: &str, title: &str, encrypted_index: &str, cited: impl Into<String>) -> Citation {
        let attrs = [("url", url), ("title", title), ("encrypted_index", encrypted_index)];
        let attrs = attrs.into_iter().map(|(k, v)| (k, Attr::Str(v.into()))).collect();
        Citation::new("web_search_result_location", attrs, cited)
    }

    fn with<const N: usize>(mut self, keys: &[&str; N], values: [Attr; N]) -> Citation {
        self.attrs.extend(keys.iter().map(|k| k.to_string()).zip(values));
        self
    }
}

impl ClientContent {
    /// `<text>` + `<image/>` children.
    pub fn multimodal(text: impl Into<String>, images: Vec<Image>) -> ClientContent {
        ClientContent::Multimodal {
            text: text.into(),
            images,
        }
    }
}

impl Image {
    pub fn new(src: impl Into<String>, media_type: &str) -> Image {
        Image {
            src: src.into(),
            media_type: media_type.into(),
        }
    }
}

/// How the emitter frames items.
#[derive(Debug, Clone)]
pub struct EmitOpts {
    /// Probability that an item is fragmented.
    pub fragment: f64,
    /// Most pieces a fragmented item is cut into.
    pub max_pieces: usize,
    /// Fragments may be separate SSE events (else only `data:` lines).
    pub across_events: bool,
    /// Quotes in attributes as `&#34;`/`&#39;` instead of `&quot;`/`&#x27;`.
    pub numeric_refs: bool,
    /// JSON written with non-ASCII as `\uXXXX` (Python's default).
    pub ascii_json: bool,
    /// Expect `meta_init.format` rewritten to `json` (the default).
    pub rewrite_format: bool,
}

impl Default for EmitOpts {
    fn default() -> Self {
        Self {
            fragment: 0.0,
            max_pieces: 4,
            across_events: true,
            numeric_refs: false,
            ascii_json: true,
            rewrite_format: true,
        }
    }
}

// ------------------------------------------------------------- expectation

/// One expected (or received) block.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub kind: String,
    pub agent: String,
    /// Extras after `delta`, in order.
    pub extras: Vec<(String, Value)>,
    /// The concatenated deltas, byte for byte (JSON payloads in the native
    /// formatter's text, DESIGN 4).
    pub content: String,
    /// The block ends with a `final:true` envelope.
    pub closed: bool,
    /// For a closed block: whether its final envelope's delta is empty
    /// (streamed close markers and the multimodal marker: yes; buffered
    /// blocks: only when the content is empty).
    pub final_delta_empty: Option<bool>,
    /// The deltas as the upstream sent them (streamed blocks: one per model
    /// delta; others: the whole content); used to write golden files.
    pub pieces: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expect {
    Block(Block),
    Done,
}

/// A text delta's checkpoint: once the input up to `offset` (the end of the
/// delta's event) is fed, output block `block` must already start with
/// `prefix`.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub offset: usize,
    pub block: usize,
    pub kind: &'static str,
    pub prefix: String,
}

#[derive(Debug, Clone, Default)]
pub struct Emitted {
    pub sse: Vec<u8>,
    pub expected: Vec<Expect>,
    pub checkpoints: Vec<Checkpoint>,
    /// Items that went out in more than one event or line: XML items,
    /// streamed-block events (tags, deltas), raw-dialect/failure JSON.
    pub fragmented_xml: usize,
    pub fragmented_streamed: usize,
    pub fragmented_json: usize,
}

/// A citation envelope's optional fields after `citation_type`, in order
/// (DESIGN 4's table); no other field is sent.
pub const CITATION_FIELDS: [&str; 8] = [
    "document_index",
    "document_title",
    "start_char_index",
    "end_char_index",
    "start_page_number",
    "end_page_number",
    "url",
    "title",
];

/// Citation attributes that are JSON numbers in envelopes (DESIGN 3.3).
pub const NUMERIC_ATTRS: [&str; 5] = [
    "document_index",
    "start_char_index",
    "end_char_index",
    "start_page_number",
    "end_page_number",
];

/// Kinds whose delta is a JSON payload.
pub fn is_json_kind(kind: &str) -> bool {
    matches!(
        kind,
        "meta_init" | "tool_call" | "server_tool_call" | "awaiting_frontend_tools" | "meta_files" | "meta_final"
    )
}

/// Kinds the frontends read whole, cut where the native formatter cuts
/// (DESIGN 4, third exception).
pub fn is_native_split(kind: &str) -> bool {
    matches!(kind, "meta_init" | "awaiting_frontend_tools" | "error" | "meta_files")
}

/// The native formatter's `_chunk_and_emit` cut, written from its rule: the
/// delta's UTF-8 bytes before escaping against the budget minus the empty
/// envelope (`fixed`), the whole budget if that leaves under 64; one
/// envelope if it fits, else cuts at that many bytes backed off to a
/// character boundary.
pub fn native_split(payload: &str, fixed: usize, budget: usize) -> Vec<String> {
    let room = match budget.saturating_sub(fixed) {
        r if r < 64 => budget,
        r => r,
    };
    if payload.len() <= room {
        return vec![payload.to_owned()];
    }
    let b = payload.as_bytes();
    let mut chunks = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let mut end = (at + room).min(b.len());
        if end < b.len() {
            while end > at && b[end] & 0xC0 == 0x80 {
                end -= 1;
            }
        }
        chunks.push(payload[at..end].to_owned());
        at = end;
    }
    chunks
}

/// The text the native formatter sends for a model error's content: a JSON
/// object or array as `json.dumps` writes it, anything else as it is.
pub fn native_error_text(text: &str) -> String {
    let t = text.trim_start();
    if t.starts_with('{') || t.starts_with('[') {
        if let Ok(v) = serde_json::from_str::<Value>(text) {
            return py_dumps(&v, true);
        }
    }
    text.to_owned()
}

// ---------------------------------------------------------------- escapes

pub use super::super::escape::{cdata_split, client_escape, formatter_escape, html_escape};

/// What the gateway recovers from a client tool result (DESIGN 3.3 + 3.6):
/// the escaped content as it stands if it parses as JSON, else with every
/// `\n` turned into a newline (lossy where the original held a literal
/// backslash-n, as the legacy frontend is).
pub fn client_expected(original: &str) -> String {
    let escaped = client_escape(original);
    if serde_json::from_str::<Value>(&escaped).is_ok() {
        escaped
    } else {
        escaped.replace("\\n", "\n")
    }
}

/// `json.dumps(v)` as Python writes it: `", "` and `": "` separators,
/// `ensure_ascii` writing non-ASCII (and DEL) as `\uXXXX`. (Numbers: the
/// generated values hold integers only, which Python writes as they are.)
pub fn py_dumps(v: &Value, ascii: bool) -> String {
    py_dumps_sep(v, ascii, (", ", ": "))
}

/// `json.dumps(v, separators=(",", ":"))`: compact, non-ASCII as `\uXXXX`.
pub fn py_dumps_compact(v: &Value) -> String {
    py_dumps_sep(v, true, (",", ":"))
}

fn py_dumps_sep(v: &Value, ascii: bool, sep: (&str, &str)) -> String {
    let mut out = String::new();
    py_write(&mut out, v, ascii, sep);
    out
}

fn py_write(out: &mut String, v: &Value, ascii: bool, sep: (&str, &str)) {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => out.push_str(&v.to_string()),
        Value::String(s) => py_str(out, s, ascii),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep.0);
                }
                py_write(out, x, ascii, sep);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep.0);
                }
                py_str(out, k, ascii);
                out.push_str(sep.1);
                py_write(out, x, ascii, sep);
            }
            out.push('}');
        }
    }
}

fn py_str(out: &mut String, s: &str, ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ascii && (c as u32) >= 0x7f => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ----------------------------------------------------------------- emitter

struct Scope {
    agent: String,
    /// Client tool calls made in this scope.
    calls: Vec<String>,
}

/// How an item may be fragmented.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Frag {
    /// Never (`[DONE]`, events whose meaning depends on being one event).
    None,
    /// Only across `data:` lines of one event: text deltas and tags.
    Lines,
    /// Only across `data:` lines: raw JSON events, the failure JSON.
    JsonLines,
    /// Across lines and events: XML items (DESIGN 3.1, "Fragmentation").
    Any,
}

pub struct Emitter {
    opts: EmitOpts,
    rng: Rng,
    out: Emitted,
    scopes: Vec<Scope>,
    seen_meta_init: bool,
    raw: bool,
    raw_index: u64,
}

/// Emits a scenario; `seed` drives fragmentation only.
pub fn emit(items: &[Item], opts: &EmitOpts, fallback_agent: &str, seed: u64) -> Emitted {
    let mut e = Emitter {
        opts: opts.clone(),
        rng: Rng::new(seed),
        out: Emitted::default(),
        scopes: vec![Scope {
            agent: fallback_agent.to_owned(),
            calls: Vec::new(),
        }],
        seen_meta_init: false,
        raw: false,
        raw_index: 0,
    };
    for item in items {
        e.item(item);
    }
    e.out
}

impl Emitter {
    fn agent(&self) -> String {
        self.scopes.last().map(|s| s.agent.clone()).unwrap_or_default()
    }

    fn h(&self, s: &str) -> String {
        html_escape(s, self.opts.numeric_refs)
    }

    fn dumps(&self, v: &Value) -> String {
        py_dumps(v, self.opts.ascii_json)
    }

    /// Writes one item as one SSE event, or fragmented.
    fn event(&mut self, data: &[u8], frag: Frag) {
        let cuts = if frag != Frag::None && data.len() >= 2 && self.rng.chance(self.opts.fragment) {
            let n = self.rng.range(1, self.opts.max_pieces.max(2) - 1);
            // A piece must not end in CR: the line's LF would make it a CRLF
            // line end and eat the CR.
            self.rng
                .cuts(data.len(), n)
                .into_iter()
                .filter(|&c| data[c - 1] != b'\r')
                .collect()
        } else {
            Vec::new()
        };
        if !cuts.is_empty() {
            match frag {
                Frag::Any => self.out.fragmented_xml += 1,
                Frag::Lines => self.out.fragmented_streamed += 1,
                _ => self.out.fragmented_json += 1,
            }
        }
        let sse = &mut self.out.sse;
        sse.extend_from_slice(b"data: ");
        let mut from = 0;
        for c in cuts {
            sse.extend_from_slice(&data[from..c]);
            let new_event = frag == Frag::Any && self.opts.across_events && self.rng.chance(0.5);
            sse.extend_from_slice(if new_event { b"\n\ndata: " } else { b"\ndata: " });
            from = c;
        }
        sse.extend_from_slice(&data[from..]);
        sse.extend_from_slice(b"\n\n");
    }

    fn push(&mut self, b: Block) -> usize {
        self.out.expected.push(Expect::Block(b));
        self.out.expected.len() - 1
    }

    fn block(&mut self, kind: &str, extras: Vec<(String, Value)>, content: String) -> usize {
        let agent = self.agent();
        let empty = content.is_empty();
        self.push(Block {
            kind: kind.to_owned(),
            agent,
            extras,
            pieces: vec![content.clone()],
            content,
            closed: true,
            final_delta_empty: Some(empty),
        })
    }

    fn item(&mut self, item: &Item) {
        match item {
            Item::MetaInit(m) => self.meta_init(m),
            Item::Thinking { deltas, close } => {
                if self.raw {
                    self.raw_streamed("thinking", deltas, *close, &[]);
                } else {
                    self.xml_streamed("thinking", deltas, *close, false, &[]);
                }
            }
            Item::Text {
                deltas,
                close,
                one_event,
                citations,
            } => {
                if self.raw {
                    self.raw_streamed("text", deltas, *close, citations);
                } else {
                    self.xml_streamed("text", deltas, *close, *one_event, citations);
                }
            }
            Item::ToolCall { server, id, name, args } => self.tool_call(*server, id, name, args),
            Item::ToolResult { id, name, content } => self.tool_result(id, name, content),
            Item::ServerToolResult { tag, id, name, content } => self.server_tool_result(tag, id, name, content),
            Item::AwaitingFrontendTools(v) => {
                let data = format!(
                    "<awaiting_frontend_tools data=\"{}\"></awaiting_frontend_tools>",
                    self.h(&self.dumps(v))
                );
                self.event(data.as_bytes(), Frag::Any);
                self.block("awaiting_frontend_tools", vec![], py_dumps(v, false));
            }
            Item::MetaFiles(v) => {
                // No escape at all (DESIGN 3.3); raw JSON inside CDATA.
                let data = format!(
                    "<content-block-meta_files><![CDATA[{}]]></content-block-meta_files>",
                    self.dumps(v)
                );
                self.event(data.as_bytes(), Frag::Any);
                self.block("meta_files", vec![], py_dumps_compact(v));
            }
            Item::ContentError(text) => {
                let data = formatter_escape(&format!(
                    "<content-block-error><![CDATA[{text}]]></content-block-error>"
                ));
                self.event(data.as_bytes(), Frag::Any);
                self.block("error", vec![], native_error_text(text));
            }
            Item::MetaFinal(v) => {
                let data = format!("<meta_final data=\"{}\"></meta_final>", self.h(&self.dumps(v)));
                self.event(data.as_bytes(), Frag::Any);
                self.block("meta_final", vec![], py_dumps(v, false));
                // DESIGN 3.5: a child's meta_final closes its scope (the
                // envelope itself belongs to the child).
                if self.scopes.len() > 1 {
                    self.scopes.pop();
                }
            }
            Item::Failure {
                error,
                message,
                traceback,
            } => {
                let v = json!({"error": error, "message": message, "traceback": traceback});
                self.event(self.dumps(&v).as_bytes(), Frag::JsonLines);
                // DESIGN 3.1/4: delta = the JSON minus the traceback (the
                // gateway's own envelope: compact JSON).
                let expected = json!({"error": error, "message": message});
                self.block("error", vec![], expected.to_string());
            }
            Item::RawNoise => {
                let evs = [
                    json!({"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant",
                        "content": [], "model": "claude-x", "stop_reason": null,
                        "usage": {"input_tokens": 12, "output_tokens": 1}}}),
                    json!({"type": "ping"}),
                    json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                        "usage": {"output_tokens": 42}}),
                    json!({"type": "message_stop"}),
                ];
                let ev = self.rng.pick(&evs).clone();
                self.raw_event(&ev);
            }
            Item::Done => {
                self.event(b"[DONE]", Frag::None);
                self.out.expected.push(Expect::Done);
            }
        }
    }

    fn meta_init(&mut self, m: &MetaInit) {
        let mut obj = Map::new();
        obj.insert("format".into(), m.format.as_str().into());
        obj.insert("user_query".into(), m.user_query.clone().into());
        obj.insert("agent_uuid".into(), m.agent.clone().into());
        obj.insert(
            "parent_agent_uuid".into(),
            m.parent.clone().map(Value::from).unwrap_or(Value::Null),
        );
        obj.insert("model".into(), m.model.clone().into());
        if let Some(h) = &m.history {
            obj.insert("message_history".into(), h.clone());
        }
        let v = Value::Object(obj);
        let data = format!("<meta_init data=\"{}\"></meta_init>", self.h(&self.dumps(&v)));
        self.event(data.as_bytes(), Frag::Any);

        // DESIGN 3.5: the first meta_init names the stream's agent; a nested
        // one whose parent is the current agent opens a child scope.
        // A parent naming the current agent (even the fallback id of a
        // resumed run) opens a child scope; else the first one names the
        // stream.
        if m.parent.as_deref() == Some(self.agent().as_str()) {
            self.scopes.push(Scope {
                agent: m.agent.clone(),
                calls: Vec::new(),
            });
        } else if !self.seen_meta_init {
            self.scopes[0].agent = m.agent.clone();
            self.raw = m.format == Format::Raw;
        }
        self.seen_meta_init = true;
        let mut expected = v;
        if self.opts.rewrite_format {
            expected["format"] = "json".into();
        }
        // The meta_init envelope carries its own agent_uuid (CONTRACT).
        let idx = self.block("meta_init", vec![], py_dumps(&expected, false));
        if let Expect::Block(b) = &mut self.out.expected[idx] {
            b.agent = m.agent.clone();
        }
    }

    fn xml_streamed(
        &mut self,
        kind: &'static str,
        deltas: &[String],
        close: bool,
        one_event: bool,
        cites: &[Citation],
    ) {
        let tag = format!("content-block-{kind}");
        let close_tag = format!("</{tag}>");
        let idx = self.streamed_block(kind);
        if one_event && close {
            let all: String = deltas.concat();
            let data = formatter_escape(&format!("<{tag}>{all}{close_tag}"));
            self.event(data.as_bytes(), Frag::Lines);
            self.set_content(idx, all.clone(), if all.is_empty() { vec![] } else { vec![all] });
        } else {
            self.event(format!("<{tag}>").as_bytes(), Frag::Lines);
            let mut content = String::new();
            let mut pieces = Vec::new();
            for d in deltas {
                self.event(formatter_escape(d).as_bytes(), Frag::Lines);
                content.push_str(d);
                pieces.push(d.clone());
                let keep = content.len() - holdback(&content, &close_tag);
                self.out.checkpoints.push(Checkpoint {
                    offset: self.out.sse.len(),
                    block: idx,
                    kind,
                    prefix: content[..keep].to_owned(),
                });
            }
            self.set_content(idx, content, pieces);
            if close {
                self.event(close_tag.as_bytes(), Frag::Lines);
            }
            // Not closed: the failure that follows, or the end of input,
            // closes it with its final marker (DESIGN 3.6, issue 2 item 9).
        }
        if close && !cites.is_empty() {
            let mut data = String::from("<citations>");
            for c in cites {
                data.push_str(&format!("<citation type=\"{}\"", self.h(&c.citation_type)));
                for (k, v) in &c.attrs {
                    let v = match v {
                        Attr::Str(s) => self.h(s),
                        Attr::Num(n) => n.to_string(),
                    };
                    data.push_str(&format!(" {k}=\"{v}\""));
                }
                data.push_str(&format!("><![CDATA[{}]]></citation>", c.cited));
            }
            data.push_str("</citations>");
            self.event(formatter_escape(&data).as_bytes(), Frag::Any);
            self.citation_blocks(cites);
        }
    }

    /// A text or thinking block of the current agent, empty until [`Self::set_content`].
    fn streamed_block(&mut self, kind: &str) -> usize {
        let agent = self.agent();
        self.push(Block {
            kind: kind.to_owned(),
            agent,
            extras: vec![],
            content: String::new(),
            closed: true,
            final_delta_empty: Some(true),
            pieces: vec![],
        })
    }

    fn set_content(&mut self, idx: usize, content: String, pieces: Vec<String>) {
        if let Expect::Block(b) = &mut self.out.expected[idx] {
            b.content = content;
            b.pieces = pieces;
        }
    }

    fn citation_blocks(&mut self, cites: &[Citation]) {
        for (i, c) in cites.iter().enumerate() {
            let mut extras = vec![("citation_type".to_owned(), Value::from(c.citation_type.clone()))];
            for field in CITATION_FIELDS {
                let Some((_, v)) = c.attrs.iter().find(|(k, _)| k == field) else {
                    continue;
                };
                let v = match v {
                    Attr::Num(n) => Value::from(*n),
                    // Raw: the model's values as they are (natively only nulls are left out).
                    Attr::Str(s) if self.raw => Value::from(s.clone()),
                    // XML: an absent value was written as `""`; numbers arrive as text.
                    Attr::Str(s) if s.is_empty() => continue,
                    Attr::Str(s) if NUMERIC_ATTRS.contains(&field) => match s.parse::<u64>() {
                        Ok(n) => Value::from(n),
                        Err(_) => Value::from(s.clone()),
                    },
                    Attr::Str(s) => Value::from(s.clone()),
                };
                extras.push((field.to_owned(), v));
            }
            let last = i + 1 == cites.len();
            let agent = self.agent();
            self.push(Block {
                kind: "citation".into(),
                agent,
                extras,
                content: c.cited.clone(),
                closed: last,
                final_delta_empty: last.then_some(c.cited.is_empty()),
                pieces: vec![c.cited.clone()],
            });
        }
    }

    fn raw_event(&mut self, v: &Value) {
        // The model's own events: JSON, one per event, no further escaping.
        let s = if self.opts.ascii_json {
            py_dumps(v, true)
        } else {
            v.to_string()
        };
        self.event(s.as_bytes(), Frag::JsonLines);
    }

    fn raw_streamed(&mut self, kind: &'static str, deltas: &[String], close: bool, cites: &[Citation]) {
        let index = self.raw_index;
        self.raw_index += 1;
        let (block, delta_type) = if kind == "text" {
            (json!({"type": "text", "text": ""}), "text_delta")
        } else {
            (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                "thinking_delta",
            )
        };
        self.raw_event(&json!({"type": "content_block_start", "index": index, "content_block": block}));
        let idx = self.streamed_block(kind);
        let mut content = String::new();
        let mut pieces = Vec::new();
        let cite_at = if cites.is_empty() {
            usize::MAX
        } else {
            self.rng.below(deltas.len() + 1)
        };
        for (i, d) in deltas.iter().enumerate() {
            if i == cite_at {
                self.raw_citations(index, cites);
            }
            self.raw_event(&json!({"type": "content_block_delta", "index": index,
                "delta": {"type": delta_type, kind: d}}));
            content.push_str(d);
            pieces.push(d.clone());
            // Raw deltas are complete JSON events: nothing to hold back.
            self.out.checkpoints.push(Checkpoint {
                offset: self.out.sse.len(),
                block: idx,
                kind,
                prefix: content.clone(),
            });
        }
        if cite_at == deltas.len() {
            self.raw_citations(index, cites);
        }
        if kind == "thinking" {
            self.raw_event(&json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "signature_delta", "signature": "EqQBCkgIARABGAIiQL+sig/="}}));
        }
        self.set_content(idx, content, pieces);
        if close {
            self.raw_event(&json!({"type": "content_block_stop", "index": index}));
            // DESIGN 3.4: citations on a stopped text block follow its final marker.
            self.citation_blocks(cites);
        }
    }

    fn raw_citations(&mut self, index: u64, cites: &[Citation]) {
        for c in cites {
            let mut obj = Map::new();
            obj.insert("type".into(), c.citation_type.clone().into());
            obj.insert("cited_text".into(), c.cited.clone().into());
            for (k, v) in &c.attrs {
                let v = match v {
                    Attr::Num(n) => Value::from(*n),
                    Attr::Str(s) => Value::from(s.clone()),
                };
                obj.insert(k.clone(), v);
            }
            self.raw_event(&json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "citations_delta", "citation": Value::Object(obj)}}));
        }
    }

    fn tool_call(&mut self, server: bool, id: &str, name: &str, args: &Args) {
        let kind = if server { "server_tool_call" } else { "tool_call" };
        let expected = match args {
            Args::Json(v) => v.clone(),
            // DESIGN 3.6: the JSON formatter sends `{}`.
            Args::Empty => json!({}),
        };
        if self.raw {
            let index = self.raw_index;
            self.raw_index += 1;
            let ty = if server { "server_tool_use" } else { "tool_use" };
            self.raw_event(&json!({"type": "content_block_start", "index": index,
                "content_block": {"type": ty, "id": id, "name": name, "input": {}}}));
            let text = match args {
                Args::Json(v) => v.to_string(),
                Args::Empty => String::new(),
            };
            // input_json_delta pieces cut anywhere (on char boundaries).
            let mut pieces = Vec::new();
            let mut rest = text.as_str();
            while !rest.is_empty() {
                let mut n = self.rng.range(1, rest.len().min(40));
                while !rest.is_char_boundary(n) {
                    n += 1;
                }
                pieces.push(rest[..n].to_owned());
                rest = &rest[n..];
            }
            if pieces.is_empty() {
                pieces.push(String::new());
            }
            for p in pieces {
                self.raw_event(&json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": p}}));
            }
            self.raw_event(&json!({"type": "content_block_stop", "index": index}));
        } else {
            let args_json = match args {
                Args::Json(v) => self.dumps(v),
                Args::Empty => "\"\"".to_owned(),
            };
            let tag = format!("content-block-{kind}");
            let data = formatter_escape(&format!(
                "<{tag} id=\"{}\" name=\"{}\" arguments=\"{}\"></{tag}>",
                self.h(id),
                self.h(name),
                self.h(&args_json)
            ));
            self.event(data.as_bytes(), Frag::Any);
        }
        if !server {
            if let Some(s) = self.scopes.last_mut() {
                s.calls.push(id.to_owned());
            }
        }
        let extras = vec![
            ("id".to_owned(), Value::from(id)),
            ("name".to_owned(), Value::from(name)),
        ];
        self.block(kind, extras, py_dumps(&expected, false));
    }

    fn tool_result(&mut self, id: &str, name: &str, content: &ClientContent) {
        let body = match content {
            ClientContent::Text(s) => format!("<![CDATA[{}]]>", cdata_split(&client_escape(s))),
            ClientContent::Structured(v) => {
                format!("<![CDATA[{}]]>", cdata_split(&client_escape(&self.dumps(v))))
            }
            ClientContent::Multimodal { text, images } => {
                let mut b = format!("<text><![CDATA[{}]]></text>", cdata_split(&client_escape(text)));
                for im in images {
                    b.push_str(&format!(
                        "<image src=\"{}\" media_type=\"{}\" />",
                        self.h(&im.src),
                        self.h(&im.media_type)
                    ));
                }
                b
            }
        };
        let data = format!(
            "<content-block-tool_result id=\"{}\" name=\"{}\">{body}</content-block-tool_result>",
            self.h(id),
            self.h(name)
        );
        self.event(data.as_bytes(), Frag::Any);

        // DESIGN 3.5: a result answering a call of an outer scope closes the
        // scopes above it; the envelope belongs to the scope of the call.
        if let Some(i) = self.scopes.iter().rposition(|s| s.calls.iter().any(|c| c == id)) {
            self.scopes.truncate(i + 1);
        }
        let extras = vec![
            ("id".to_owned(), Value::from(id)),
            ("name".to_owned(), Value::from(name)),
        ];
        match content {
            ClientContent::Text(s) => {
                self.block("tool_result", extras, client_expected(s));
            }
            ClientContent::Structured(v) => {
                // Kept as the backend's JSON text: byte-exact.
                let text = self.dumps(v);
                self.block("tool_result", extras, client_expected(&text));
            }
            ClientContent::Multimodal { text, images } => {
                let agent = self.agent();
                let text = client_expected(text);
                if images.is_empty() {
                    // Text envelopes then the empty final marker: one block.
                    self.push(Block {
                        kind: "tool_result".into(),
                        agent,
                        extras,
                        pieces: vec![text.clone(), String::new()],
                        content: text,
                        closed: true,
                        final_delta_empty: Some(true),
                    });
                    return;
                }
                self.push(Block {
                    kind: "tool_result".into(),
                    agent: agent.clone(),
                    extras: extras.clone(),
                    pieces: vec![text.clone()],
                    content: text,
                    closed: false,
                    final_delta_empty: None,
                });
                for im in images {
                    self.push(Block {
                        kind: "tool_result_image".into(),
                        agent: agent.clone(),
                        extras: vec![
                            ("id".to_owned(), Value::from(id)),
                            ("name".to_owned(), Value::from(name)),
                            ("src".to_owned(), Value::from(im.src.clone())),
                            ("media_type".to_owned(), Value::from(im.media_type.clone())),
                        ],
                        content: String::new(),
                        closed: false,
                        final_delta_empty: None,
                        pieces: vec![String::new()],
                    });
                }
                self.push(Block {
                    kind: "tool_result".into(),
                    agent,
                    extras,
                    content: String::new(),
                    closed: true,
                    final_delta_empty: Some(true),
                    pieces: vec![String::new()],
                });
            }
        }
    }

    fn server_tool_result(&mut self, tag: &str, id: &str, name: &Option<String>, content: &ServerContent) {
        let text = match content {
            ServerContent::Text(s) => s.clone(),
            // Raw dialect: the structured content in `json.dumps`'s text.
            ServerContent::Json(v) => py_dumps(v, true),
        };
        if self.raw {
            let index = self.raw_index;
            self.raw_index += 1;
            let c = match content {
                ServerContent::Text(s) => Value::from(s.clone()),
                ServerContent::Json(v) => v.clone(),
            };
            self.raw_event(&json!({"type": "content_block_start", "index": index,
                "content_block": {"type": tag, "tool_use_id": id, "content": c}}));
            self.raw_event(&json!({"type": "content_block_stop", "index": index}));
        } else {
            let name_attr = name
                .as_ref()
                .map(|n| format!(" name=\"{}\"", self.h(n)))
                .unwrap_or_default();
            let data = formatter_escape(&format!(
                "<content-block-{tag} id=\"{}\"{name_attr}><![CDATA[{text}]]></content-block-{tag}>",
                self.h(id)
            ));
            self.event(data.as_bytes(), Frag::Any);
        }
        // Raw blocks have no name attribute: the block type names them.
        let name = match name {
            Some(n) if !self.raw => n.clone(),
            _ => tag.to_owned(),
        };
        let extras = vec![
            ("id".to_owned(), Value::from(id)),
            ("name".to_owned(), Value::from(name)),
        ];
        // XML content is text as carried; raw structured content is JSON.
        self.block("server_tool_result", extras, text);
    }
}

/// Bytes at the end of `content` that could still begin `close_tag` (and so
/// may be held back until the next event): the longest proper prefix of
/// the tag that `content` ends with.
pub fn holdback(content: &str, close_tag: &str) -> usize {
    (1..close_tag.len())
        .rev()
        .find(|&k| content.ends_with(&close_tag[..k]))
        .unwrap_or(0)
}
