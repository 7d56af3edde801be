//! Deterministic legacy streams for the benches, written the way the legacy backend writes them (DESIGN 3).

use serde_json::{json, Value};

pub mod dialects;
#[path = "../../tests/harness/escape.rs"]
pub mod escape;
#[path = "../../tests/harness/rng.rs"]
mod rng;

use escape::{cdata_split, client_escape, formatter_escape, html_escape};
use rng::Rng;

/// One legacy stream and how it is cut into reads.
pub struct Input {
    pub name: &'static str,
    pub bytes: Vec<u8>,
    /// Upstream SSE events in `bytes`.
    pub events: u64,
    /// Lengths of the successive reads the stream is fed in.
    pub reads: Vec<usize>,
}

impl Input {
    fn new(name: &'static str, bytes: Vec<u8>, events: u64, rng: &mut Rng, read_lo: usize, read_hi: usize) -> Self {
        let mut reads = Vec::new();
        let mut left = bytes.len();
        while left > 0 {
            let n = rng.range(read_lo, read_hi).min(left);
            reads.push(n);
            left -= n;
        }
        Self {
            name,
            bytes,
            events,
            reads,
        }
    }

    /// The stream as a sequence of reads.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        let mut at = 0;
        self.reads.iter().map(move |&n| {
            let piece = &self.bytes[at..at + n];
            at += n;
            piece
        })
    }
}

/// The client tool result escape (DESIGN 3.3): CRLF/CR → LF, LF → `\n`, `]]>` split across CDATA sections.
pub fn client_result_escape(s: &str) -> String {
    cdata_split(&client_escape(s))
}

/// `json.dumps` with its default `ensure_ascii=True`: non-ASCII as `\uXXXX` escapes.
pub fn json_ascii(v: &Value) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len());
    let mut units = [0u16; 2];
    for c in s.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

fn event(out: &mut Vec<u8>, data: &str) {
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.as_bytes());
    out.extend_from_slice(b"\n\n");
}

const WORDS: &[&str] = &[
    "the", "a", "model", "stream", "token", "gateway", "of", "and", "to", "in", "is", "that", "for", "with", "request",
    "response", "agent", "tool", "result", "value", "error", "function", "return", "data", "we", "can", "this", "it",
];
const ODD: &[&str] = &[
    "\n",
    "\n\n",
    "\\",
    "\"quoted\"",
    "a < b",
    "x && y",
    "<chart>",
    "é",
    "—",
    "你好",
    "😀",
    "C:\\path",
    "`code`",
    "\\n",
];

/// One model delta of 5–40 bytes, mostly words, sometimes a newline, quote, backslash, `<`, `&` or non-ASCII.
fn delta(rng: &mut Rng) -> String {
    let target = rng.range(5, 40);
    let mut s = String::new();
    while s.len() < target {
        if rng.one_in(1, 12) {
            s.push_str(rng.pick::<&str>(ODD));
        } else {
            s.push(' ');
            s.push_str(rng.pick::<&str>(WORDS));
        }
        if rng.one_in(1, 10) {
            s.push(*rng.pick(&['.', ',', ':', '!']));
        }
    }
    // Keep to 40 bytes on a character boundary.
    let mut cut = s.len().min(40);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s
}

fn meta_init_json(history: Value) -> Value {
    let mut v = json!({
        "format": "xml",
        "user_query": "Summarise the logs and chart the errors — «quickly»",
        "agent_uuid": "8c1f0d0e-0d6a-4a53-9a55-3f0a5e2b7c11",
        "parent_agent_uuid": null,
        "model": "claude-sonnet-4",
    });
    if !history.is_null() {
        v["message_history"] = history;
    }
    v
}

fn meta_init_event(out: &mut Vec<u8>, history: Value) {
    let attr = html_escape(&json_ascii(&meta_init_json(history)), false);
    event(out, &format!("<meta_init data=\"{attr}\"></meta_init>"));
}

fn streamed_block(out: &mut Vec<u8>, rng: &mut Rng, tag: &str, deltas: usize) -> u64 {
    event(out, &format!("<{tag}>"));
    for _ in 0..deltas {
        event(out, &formatter_escape(&delta(rng)));
    }
    event(out, &format!("</{tag}>"));
    deltas as u64 + 2
}

fn tool_result_text(rng: &mut Rng, lines: usize) -> String {
    let mut s = String::new();
    for i in 0..lines {
        match rng.range(0, 5) {
            0 => s.push_str(&format!(
                "{i:5}: let total = items.iter().map(|x| x.cost).sum::<u64>();\n"
            )),
            1 => s.push_str(&format!("{i:5}: println!(\"done: {{}}\", path.display()); // é\n")),
            2 => s.push_str(&format!("{i:5}: <div class=\"row\">&nbsp;{i}</div>\r\n")),
            3 => s.push_str(&format!("{i:5}: if a[i]]> 0 {{ return Err(\"C:\\\\tmp\"); }}\n")),
            _ => s.push_str(&format!(
                "{i:5}: 2024-05-01T12:00:{:02}Z INFO request served in {} ms\n",
                i % 60,
                i % 97
            )),
        }
    }
    s
}

/// (a) A typical agent turn: meta_init, thinking and text blocks of many 5–40 byte deltas, tool calls and
/// results and citations between them, meta_final, `[DONE]`. Fed in 1–4 KiB reads.
pub fn small_deltas() -> Input {
    let mut rng = Rng::from_state(0x5EED_0001);
    let mut out = Vec::new();
    let mut events = 1u64;
    meta_init_event(&mut out, Value::Null);
    for round in 0..120 {
        let n = rng.range(20, 80);
        events += streamed_block(&mut out, &mut rng, "content-block-thinking", n);
        let n = rng.range(150, 450);
        events += streamed_block(&mut out, &mut rng, "content-block-text", n);
        if round % 3 == 0 {
            let cited = formatter_escape("the gateway \"streams\" text\nwith no added wait");
            event(
                &mut out,
                &format!(
                    "<citations><citation type=\"char_location\" cited_text=\"\" document_index=\"0\" \
                     document_title=\"Design &amp; notes\" start_char_index=\"12\" end_char_index=\"58\">\
                     <![CDATA[{cited}]]></citation><citation type=\"page_location\" document_index=\"1\" \
                     document_title=\"Spec.pdf\" start_page_number=\"3\" end_page_number=\"4\">\
                     <![CDATA[pages 3-4]]></citation></citations>"
                ),
            );
            events += 1;
        }
        let id = format!("toolu_{round:04}");
        let args = json!({"query": format!("errors in shard {round}"), "limit": 20, "filters": {"level": "warn"}});
        let args = html_escape(&formatter_escape(&json_ascii(&args)), false);
        event(
            &mut out,
            &format!("<content-block-tool_call id=\"{id}\" name=\"search_logs\" arguments=\"{args}\"></content-block-tool_call>"),
        );
        let lines = rng.range(3, 30);
        let content = client_result_escape(&tool_result_text(&mut rng, lines));
        event(
            &mut out,
            &format!(
                "<content-block-tool_result id=\"{id}\" name=\"search_logs\"><![CDATA[{content}]]></content-block-tool_result>"
            ),
        );
        events += 2;
    }
    let fin = json!({"conversation_history": [], "stop_reason": "end_turn", "total_steps": 120,
                     "generated_files": [], "cost": 0.42, "cumulative_usage": {"input_tokens": 51234, "output_tokens": 9876}});
    event(
        &mut out,
        &format!(
            "<meta_final data=\"{}\"></meta_final>",
            html_escape(&json_ascii(&fin), false)
        ),
    );
    event(&mut out, "[DONE]");
    events += 2;
    Input::new("small_deltas", out, events, &mut rng, 1024, 4096)
}

/// Read size for the large inputs: a proxy reading a fast local upstream sees reads of this order.
const LARGE_READ: (usize, usize) = (16 << 10, 16 << 10);

fn around(item: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    meta_init_event(&mut out, Value::Null);
    item(&mut out);
    event(&mut out, "[DONE]");
    out
}

/// About `mib` MiB of tool result text, each chunk of 1000 lines passed through `escape`.
fn escaped_text(rng: &mut Rng, mib: usize, escape: fn(&str) -> String) -> String {
    let mut content = String::new();
    while content.len() < mib << 20 {
        content.push_str(&escape(&tool_result_text(rng, 1000)));
    }
    content
}

/// Values from `next` (given each one's index) until their JSON text adds up to about `mib` MiB.
fn values_of_size(mib: usize, mut next: impl FnMut(usize) -> Value) -> Vec<Value> {
    let mut values = Vec::new();
    let mut size = 0;
    while size < mib << 20 {
        let value = next(values.len());
        size += value.to_string().len();
        values.push(value);
    }
    values
}

/// A large input named `name`: one `<tag id name>` item (`item` = [tag, id, name]) holding CDATA `content`, made
/// with the generator seeded `seed`, in one event between `meta_init` and `[DONE]`.
fn cdata_item(name: &'static str, seed: u64, item: [&str; 3], content: impl FnOnce(&mut Rng) -> String) -> Input {
    let mut rng = Rng::from_state(seed);
    let content = content(&mut rng);
    let [tag, id, tool] = item;
    let item = format!("<{tag} id=\"{id}\" name=\"{tool}\"><![CDATA[{content}]]></{tag}>");
    let bytes = around(|out| event(out, &item));
    Input::new(name, bytes, 3, &mut rng, LARGE_READ.0, LARGE_READ.1)
}

/// (b) A client tool result of about `mib` MiB of text (a file read), one CDATA item in one event.
pub fn large_tool_result(mib: usize) -> Input {
    let item = ["content-block-tool_result", "toolu_big", "read_file"];
    cdata_item("tool_result_text", 0x5EED_0002, item, |rng| {
        escaped_text(rng, mib, client_result_escape)
    })
}

/// (b) A structured client tool result (a JSON list of records, JSON-encoded before the newline escape).
pub fn large_tool_result_json(mib: usize) -> Input {
    let item = ["content-block-tool_result", "toolu_json", "grep"];
    cdata_item("tool_result_json", 0x5EED_0003, item, |rng| {
        let rows = values_of_size(mib, |i| {
            json!({"id": i, "path": format!("src/mod_{i}.rs"),
                   "snippet": tool_result_text(rng, 2), "score": 0.5})
        });
        client_result_escape(&json_ascii(&Value::Array(rows)))
    })
}

/// (b) A server tool result (formatter-escaped CDATA that may contain `]]>`).
pub fn large_server_tool_result(mib: usize) -> Input {
    let item = ["content-block-server_tool_result", "srvtoolu_1", "web_fetch"];
    cdata_item("server_tool_result", 0x5EED_0004, item, |rng| {
        escaped_text(rng, mib, formatter_escape)
    })
}

/// (b) A `meta_init` whose `message_history` attribute is about `mib` MiB of HTML-escaped JSON.
pub fn large_meta_init(mib: usize) -> Input {
    let mut rng = Rng::from_state(0x5EED_0005);
    let history = values_of_size(mib, |i| {
        let text: String = (0..rng.range(20, 200)).map(|_| delta(&mut rng)).collect();
        if i % 2 == 0 {
            json!({"role": "user", "content": text})
        } else {
            json!({"role": "assistant", "content": [{"type": "text", "text": text},
                   {"type": "tool_use", "id": format!("toolu_{i}"), "name": "search", "input": {"q": "x"}}]})
        }
    });
    let mut out = Vec::new();
    meta_init_event(&mut out, Value::Array(history));
    let n = rng.range(10, 20);
    let events = 2 + streamed_block(&mut out, &mut rng, "content-block-text", n);
    event(&mut out, "[DONE]");
    Input::new("meta_init_history", out, events, &mut rng, LARGE_READ.0, LARGE_READ.1)
}

/// The large-payload inputs, each about `mib` MiB.
pub fn large(mib: usize) -> Vec<Input> {
    vec![
        large_tool_result(mib),
        large_tool_result_json(mib),
        large_server_tool_result(mib),
        large_meta_init(mib),
    ]
}

/// One input by its name, generated alone.
pub fn by_name(name: &str, mib: usize) -> Option<Input> {
    Some(match name {
        "small_deltas" => small_deltas(),
        "tool_result_text" => large_tool_result(mib),
        "tool_result_json" => large_tool_result_json(mib),
        "server_tool_result" => large_server_tool_result(mib),
        "meta_init_history" => large_meta_init(mib),
        _ => return None,
    })
}
