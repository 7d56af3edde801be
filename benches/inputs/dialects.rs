//! One synthetic conversation written in each upstream dialect, for the `dialects` bench group: the same user
//! query, thinking and text (the same 5–40 byte deltas, one per event), tool calls with the same arguments (split
//! into the same pieces where the dialect streams them) and the same tool results, so that events/s compare the
//! dialects' parsers on equal content.
//!
//! - `xml`: the legacy backend's items (DESIGN 3), as `small_deltas` writes them;
//! - `raw`: the model's own streaming events as the legacy backend forwards them (`json.dumps`, DESIGN 3.4), with
//!   `meta_init`, tool results and `meta_final` as XML items;
//! - `cogency`: cogency 3.3's event JSON as a backend sends it (`json.dumps(event)`), in the package's order per
//!   iteration: `think`/`respond` pieces, `call`, `execute`, `metric`, the batch `result` (a JSON array), `metric`;
//!   `end` and the late `metric` last (tests/fixtures/dialects/cogency_*.sse);
//! - `agent_sdk`: Claude Agent SDK messages with partial messages on, compact as the CLI writes them: `system`
//!   init, `stream_event`s (message and block start/delta/stop) with the CLI's `assistant` message for each block
//!   after its stop, the `user` tool result, `result` (tests/fixtures/dialects/agent_sdk_partial_on.sse).

use serde_json::{json, Value};
use sse_gateway::translate::Dialect;

use super::escape::{formatter_escape, html_escape};
use super::rng::Rng;
use super::{client_result_escape, delta, json_ascii, meta_init_json, tool_result_text, Input};

const SESSION: &str = "5f1c2e4a-7b3d-4c8e-9a10-2b3c4d5e6f70";
const MODEL: &str = "claude-sonnet-4-5-20250929";
const TOOL: &str = "search_logs";
const SIGNATURE: &str = "EqQBCkYIBxgCKkB0c2lnbmF0dXJl";

/// One tool call and its result.
pub struct Call {
    pub id: String,
    pub args: Value,
    /// The arguments' JSON text as the model streams it, in pieces of 5–40 bytes.
    pub args_pieces: Vec<String>,
    pub result: String,
}

/// One model turn: a thinking block, a text block, a tool call; then the tool's result.
pub struct Round {
    pub thinking: Vec<String>,
    pub text: Vec<String>,
    pub call: Call,
}

/// The content every dialect's stream carries.
pub struct Conversation {
    pub query: String,
    pub rounds: Vec<Round>,
}

impl Conversation {
    /// `rounds` turns, each of 20–80 thinking deltas, 150–450 text deltas and one call (as `small_deltas`).
    pub fn new(rounds: usize) -> Self {
        let mut rng = Rng::from_state(0x5EED_0010);
        let rounds = (0..rounds)
            .map(|i| {
                let n = rng.range(20, 80);
                let thinking = (0..n).map(|_| delta(&mut rng)).collect();
                let n = rng.range(150, 450);
                let text = (0..n).map(|_| delta(&mut rng)).collect();
                let args = json!({"query": format!("errors in shard {i} — «warn»"), "limit": 20,
                                  "filters": {"level": "warn", "path": "C:\\logs\\app.log"}});
                let args_pieces = pieces(&mut rng, &args.to_string());
                // No CR: the legacy backend normalises CRLF to LF in client results (DESIGN 3.3), the other
                // dialects keep it, and the content is to be the same in all four.
                let lines = rng.range(3, 30);
                let result = tool_result_text(&mut rng, lines).replace('\r', "");
                Round {
                    thinking,
                    text,
                    call: Call {
                        id: format!("toolu_{i:04}"),
                        args,
                        args_pieces,
                        result,
                    },
                }
            })
            .collect();
        Self {
            query: "Summarise the logs and chart the errors — «quickly»".into(),
            rounds,
        }
    }
}

/// `s` cut into pieces of 5–40 bytes on character boundaries.
fn pieces(rng: &mut Rng, s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut cut = rng.range(5, 40).min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        out.push(rest[..cut].to_string());
        rest = &rest[cut..];
    }
    out
}

/// A stream being written: its bytes and its number of SSE events.
#[derive(Default)]
struct Stream {
    out: Vec<u8>,
    events: u64,
}

impl Stream {
    fn event(&mut self, data: &str) {
        super::event(&mut self.out, data);
        self.events += 1;
    }

    fn json(&mut self, v: &Value) {
        self.event(&v.to_string());
    }

    fn py(&mut self, v: &Value) {
        self.event(&py_dumps(v));
    }

    fn input(self, name: &'static str) -> Input {
        // The same reads for every dialect: 1–4 KiB, as the proxy sees a streaming upstream.
        Input::new(
            name,
            self.out,
            self.events,
            &mut Rng::from_state(0x5EED_0011),
            1024,
            4096,
        )
    }
}

/// `json.dumps(v)` as Python writes it: `", "` and `": "`, non-ASCII (and DEL) as `\uXXXX`.
pub fn py_dumps(v: &Value) -> String {
    let mut out = String::new();
    py_write(&mut out, v);
    out
}

fn py_write(out: &mut String, v: &Value) {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => out.push_str(&v.to_string()),
        Value::String(s) => py_str(out, s),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_write(out, x);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_str(out, k);
                out.push_str(": ");
                py_write(out, x);
            }
            out.push('}');
        }
    }
}

fn py_str(out: &mut String, s: &str) {
    // serde_json escapes quotes, backslashes and control characters as Python does; only non-ASCII differs.
    let mut units = [0u16; 2];
    for c in Value::from(s).to_string().chars() {
        if (c as u32) < 0x7f {
            out.push(c);
        } else {
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
}

fn meta_final_item(s: &mut Stream, rounds: usize) {
    let fin = json!({"conversation_history": [], "stop_reason": "end_turn", "total_steps": rounds,
                     "generated_files": [], "cost": 0.42,
                     "cumulative_usage": {"input_tokens": 51234, "output_tokens": 9876}});
    s.event(&format!(
        "<meta_final data=\"{}\"></meta_final>",
        html_escape(&json_ascii(&fin), false)
    ));
}

fn meta_init_item(s: &mut Stream, format: &str, query: &str) {
    let mut v = meta_init_json(Value::Null);
    v["format"] = json!(format);
    v["user_query"] = json!(query);
    s.event(&format!(
        "<meta_init data=\"{}\"></meta_init>",
        html_escape(&json_ascii(&v), false)
    ));
}

fn tool_result_item(s: &mut Stream, call: &Call) {
    s.event(&format!(
        "<content-block-tool_result id=\"{}\" name=\"{TOOL}\"><![CDATA[{}]]></content-block-tool_result>",
        call.id,
        client_result_escape(&call.result)
    ));
}

/// The legacy XML dialect.
pub fn xml(c: &Conversation) -> Input {
    let mut s = Stream::default();
    meta_init_item(&mut s, "xml", &c.query);
    for r in &c.rounds {
        for (tag, deltas) in [("content-block-thinking", &r.thinking), ("content-block-text", &r.text)] {
            s.event(&format!("<{tag}>"));
            for d in deltas {
                s.event(&formatter_escape(d));
            }
            s.event(&format!("</{tag}>"));
        }
        let args = html_escape(&formatter_escape(&json_ascii(&r.call.args)), false);
        s.event(&format!(
            "<content-block-tool_call id=\"{}\" name=\"{TOOL}\" arguments=\"{args}\"></content-block-tool_call>",
            r.call.id
        ));
        tool_result_item(&mut s, &r.call);
    }
    meta_final_item(&mut s, c.rounds.len());
    s.event("[DONE]");
    s.input("dialect_xml")
}

/// The model's message events of one round (DESIGN 3.4's raw events), in order.
fn model_events(i: usize, r: &Round) -> Vec<Value> {
    let mut v = vec![json!({"type": "message_start", "message": {
        "id": format!("msg_{i:024}"), "type": "message", "role": "assistant", "model": MODEL, "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 1}}})];
    v.push(json!({"type": "content_block_start", "index": 0,
                  "content_block": {"type": "thinking", "thinking": "", "signature": ""}}));
    for d in &r.thinking {
        v.push(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": d}}));
    }
    v.push(json!({"type": "content_block_delta", "index": 0,
                  "delta": {"type": "signature_delta", "signature": SIGNATURE}}));
    v.push(json!({"type": "content_block_stop", "index": 0}));
    v.push(json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}));
    for d in &r.text {
        v.push(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": d}}));
    }
    v.push(json!({"type": "content_block_stop", "index": 1}));
    v.push(json!({"type": "content_block_start", "index": 2,
                  "content_block": {"type": "tool_use", "id": r.call.id, "name": TOOL, "input": {}}}));
    for p in &r.call.args_pieces {
        v.push(json!({"type": "content_block_delta", "index": 2,
                      "delta": {"type": "input_json_delta", "partial_json": p}}));
    }
    v.push(json!({"type": "content_block_stop", "index": 2}));
    v.push(
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                  "usage": {"output_tokens": 40}}),
    );
    v.push(json!({"type": "message_stop"}));
    v
}

/// The raw dialect: model events as `json.dumps` writes them, between XML items.
pub fn raw(c: &Conversation) -> Input {
    let mut s = Stream::default();
    meta_init_item(&mut s, "raw", &c.query);
    for (i, r) in c.rounds.iter().enumerate() {
        for ev in model_events(i, r) {
            s.py(&ev);
        }
        tool_result_item(&mut s, &r.call);
    }
    meta_final_item(&mut s, c.rounds.len());
    s.event("[DONE]");
    s.input("dialect_raw")
}

/// cogency 3.3's events, as a backend writes them with `json.dumps(event)`.
pub fn cogency(c: &Conversation) -> Input {
    let mut s = Stream::default();
    // cogency's clock, in steps a float prints exactly.
    let mut clock = 1_750_000_000.0f64;
    let mut now = move || {
        clock += 0.125;
        clock
    };
    let (mut input, mut output) = (0u64, 0u64);
    let mut metric = |s: &mut Stream, now: f64, step: (u64, u64)| {
        input += step.0;
        output += step.1;
        s.py(
            &json!({"type": "metric", "step": {"input": step.0, "output": step.1, "duration": 1.0},
                     "total": {"input": input, "output": output, "duration": 2.5}, "timestamp": now}),
        );
    };
    s.py(&json!({"type": "user", "content": c.query, "timestamp": now()}));
    for r in &c.rounds {
        for d in &r.thinking {
            s.py(&json!({"type": "think", "content": d, "timestamp": now()}));
        }
        for d in &r.text {
            s.py(&json!({"type": "respond", "content": d, "timestamp": now()}));
        }
        let call = py_dumps(&json!({"name": TOOL, "args": r.call.args}));
        s.py(&json!({"type": "call", "content": call, "timestamp": now()}));
        s.py(&json!({"type": "execute", "timestamp": now()}));
        metric(&mut s, now(), (300, 40));
        let content = py_dumps(&json!([{"tool": TOOL, "status": "success", "content": r.call.result}]));
        s.py(&json!({"type": "result",
                     "payload": {"tools_executed": 1, "success_count": 1, "failure_count": 0},
                     "content": content, "timestamp": now()}));
        metric(&mut s, now(), (0, 0));
    }
    s.py(&json!({"type": "end", "timestamp": now()}));
    metric(&mut s, now(), (300, 6));
    s.input("dialect_cogency")
}

/// Claude Agent SDK messages with partial messages on, compact as the CLI writes them.
pub fn agent_sdk(c: &Conversation) -> Input {
    let mut s = Stream::default();
    let mut n = 0u64;
    let mut uuid = move || {
        n += 1;
        format!("0d000000-0000-4000-8000-{n:012}")
    };
    s.json(
        &json!({"type": "system", "subtype": "init", "cwd": "/workspace", "session_id": SESSION,
                   "tools": ["Task", "Bash", "Read", TOOL], "mcp_servers": [], "model": MODEL,
                   "permissionMode": "default", "slash_commands": ["compact", "context"],
                   "apiKeySource": "ANTHROPIC_API_KEY", "claude_code_version": "2.1.327",
                   "output_style": "default", "agents": ["general-purpose"], "skills": [], "plugins": [],
                   "uuid": uuid()}),
    );
    for (i, r) in c.rounds.iter().enumerate() {
        let id = format!("msg_{i:024}");
        // The CLI's `assistant` message for a block, right after the block's stop.
        let assistant = |block: Value, uuid: String| {
            json!({"type": "assistant", "message": {"id": id, "type": "message", "role": "assistant",
                   "model": MODEL, "content": [block], "stop_reason": null, "stop_sequence": null,
                   "usage": {"input_tokens": 100, "output_tokens": 1}},
                   "parent_tool_use_id": null, "session_id": SESSION, "uuid": uuid})
        };
        for ev in model_events(i, r) {
            let stop = ev["type"] == "content_block_stop";
            let index = ev["index"].as_u64();
            s.json(&json!({"type": "stream_event", "event": ev, "session_id": SESSION,
                           "parent_tool_use_id": null, "uuid": uuid()}));
            if !stop {
                continue;
            }
            let block = match index {
                Some(0) => json!({"type": "thinking", "thinking": r.thinking.concat(), "signature": SIGNATURE}),
                Some(1) => json!({"type": "text", "text": r.text.concat()}),
                _ => json!({"type": "tool_use", "id": r.call.id, "name": TOOL, "input": r.call.args}),
            };
            s.json(&assistant(block, uuid()));
        }
        s.json(&json!({"type": "user", "message": {"role": "user", "content": [
                           {"type": "tool_result", "tool_use_id": r.call.id, "content": r.call.result,
                            "is_error": false}]},
                       "parent_tool_use_id": null, "session_id": SESSION, "uuid": uuid()}));
    }
    s.json(
        &json!({"type": "result", "subtype": "success", "is_error": false, "duration_ms": 12345,
                   "duration_api_ms": 11000, "num_turns": c.rounds.len(), "result": "Done.",
                   "stop_reason": "end_turn", "session_id": SESSION, "total_cost_usd": 0.42,
                   "usage": {"input_tokens": 51234, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0, "output_tokens": 9876, "service_tier": "standard"},
                   "permission_denials": [], "uuid": uuid()}),
    );
    s.input("dialect_agent_sdk")
}

/// The conversation of `rounds` turns in every dialect, xml first.
pub fn all(rounds: usize) -> Vec<(Dialect, Input)> {
    let c = Conversation::new(rounds);
    vec![
        (Dialect::Xml, xml(&c)),
        (Dialect::Raw, raw(&c)),
        (Dialect::Cogency, cogency(&c)),
        (Dialect::AgentSdk, agent_sdk(&c)),
    ]
}
