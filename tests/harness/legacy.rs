//! A small legacy-backend emitter for the end-to-end tests: scenarios as blocks, rendered as the backend writes
//! them (DESIGN 3, both dialects), with the blocks the gateway must send back (DESIGN 4).

use serde_json::{json, Value};

/// One block the client should see, reassembled from its envelopes.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub kind: String,
    pub agent: String,
    /// Concatenated deltas; JSON payload kinds are compared as JSON values.
    pub content: String,
    /// Extras (every key but type, agent, final, delta), in order.
    pub extras: Vec<(String, Value)>,
}

/// An envelope's extras: every key but type, agent, final, delta, in order.
pub fn extras(envelope: &serde_json::Map<String, Value>) -> Vec<(String, Value)> {
    envelope
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "type" | "agent" | "final" | "delta"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Kinds whose delta is JSON text (compared as values).
const JSON_KINDS: [&str; 6] = [
    "meta_init",
    "meta_final",
    "tool_call",
    "server_tool_call",
    "awaiting_frontend_tools",
    "meta_files",
];

/// Groups envelopes into blocks: deltas of one block until its `final:true`; a citation or a tool_result_image
/// is a block by itself. `[DONE]` becomes a block of kind "[DONE]".
pub fn blocks(envs: &[Value]) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for e in envs {
        if e.as_str() == Some("[DONE]") {
            out.push(Block {
                kind: "[DONE]".into(),
                agent: String::new(),
                content: String::new(),
                extras: vec![],
            });
            continue;
        }
        let obj = e.as_object().expect("envelope is an object");
        let kind = obj["type"].as_str().expect("type").to_owned();
        let agent = obj["agent"].as_str().expect("agent").to_owned();
        let delta = obj["delta"].as_str().expect("delta is a string");
        let fin = obj["final"].as_bool().expect("final");
        let extras = extras(obj);
        if kind == "citation" || kind == "tool_result_image" {
            out.push(Block {
                kind,
                agent,
                content: delta.to_owned(),
                extras,
            });
            continue;
        }
        match &mut open {
            Some(b) if b.kind == kind && b.agent == agent => b.content.push_str(delta),
            _ => {
                if let Some(b) = open.take() {
                    out.push(b);
                }
                open = Some(Block {
                    kind,
                    agent,
                    content: delta.to_owned(),
                    extras,
                });
            }
        }
        if fin {
            if let Some(b) = open.take() {
                out.push(b);
            }
        }
    }
    out.extend(open);
    out
}

/// Asserts that `got` equals `want` block by block (JSON payloads as values).
pub fn assert_blocks(got: &[Block], want: &[Block]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            (&g.kind, &g.agent),
            (&w.kind, &w.agent),
            "block {i} kind/agent\n got {g:?}\nwant {w:?}"
        );
        if JSON_KINDS.contains(&w.kind.as_str()) {
            let gv: Value = serde_json::from_str(&g.content).unwrap_or_else(|e| panic!("block {i} JSON ({e}): {g:?}"));
            let wv: Value = serde_json::from_str(&w.content).expect("expected JSON");
            assert_eq!(gv, wv, "block {i} ({}) payload", w.kind);
        } else {
            assert_eq!(g.content, w.content, "block {i} ({}) content", w.kind);
        }
        assert_eq!(g.extras, w.extras, "block {i} ({}) extras", w.kind);
    }
    assert_eq!(got.len(), want.len(), "number of blocks\n got {got:#?}\nwant {want:#?}");
}

pub use super::escape::formatter_escape as fmt_escape;

/// Attribute escape.
pub fn attr(s: &str) -> String {
    super::escape::html_escape(s, false)
}

fn block(kind: &str, agent: &str, content: &str, extras: Vec<(&str, Value)>) -> Block {
    Block {
        kind: kind.into(),
        agent: agent.into(),
        content: content.into(),
        extras: extras.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
    }
}

/// A scenario: the legacy stream's events and the blocks expected from the gateway.
pub struct Scenario {
    pub name: String,
    pub stream: Vec<u8>,
    pub expected: Vec<Block>,
}

/// Pushes a `<content-block-{kind} id name{rest}` item (`rest` from its attributes after `name` to its end tag)
/// and the block expected of it (`content`, with `id` and `name` as extras).
fn push_tool(
    to: (&mut Vec<String>, &mut Vec<Block>),
    kind: &str,
    agent: &str,
    tool: (&str, &str),
    rest: &str,
    content: &str,
) {
    let (id, name) = tool;
    to.0.push(format!(
        "<content-block-{kind} id=\"{id}\" name=\"{name}\"{rest}</content-block-{kind}>"
    ));
    to.1.push(block(
        kind,
        agent,
        content,
        vec![("id", json!(id)), ("name", json!(name))],
    ));
}

/// Pushes `agent`'s `meta_init` item (see `meta_init_item`) and the block expected of it.
fn push_meta_init(to: (&mut Vec<String>, &mut Vec<Block>), format: &str, agent: &str, parent: Option<&str>) {
    let (item, json) = meta_init_item(format, agent, parent);
    to.0.push(item);
    to.1.push(block("meta_init", agent, &json, vec![]));
}

/// The scenario `name`: `items` and `want`, ended by `agent`'s `meta_final` carrying `fin`, then `[DONE]`.
fn finish(name: &str, (mut items, mut want): (Vec<String>, Vec<Block>), agent: &str, fin: Value) -> Scenario {
    items.push(format!("<meta_final data=\"{}\"></meta_final>", attr(&fin.to_string())));
    want.push(block("meta_final", agent, &fin.to_string(), vec![]));
    items.push("[DONE]".into());
    want.push(block("[DONE]", "", "", vec![]));
    Scenario {
        name: name.into(),
        stream: frame(&items),
        expected: want,
    }
}

fn frame(items: &[String]) -> Vec<u8> {
    items
        .iter()
        .flat_map(|i| format!("data: {i}\n\n").into_bytes())
        .collect()
}

fn meta_init_item(format: &str, agent: &str, parent: Option<&str>) -> (String, String) {
    let data = json!({"format": format, "user_query": "q <&> \"x\"", "agent_uuid": agent,
                      "parent_agent_uuid": parent, "model": "m"});
    let mut rewritten = data.clone();
    rewritten["format"] = json!("json");
    (
        format!("<meta_init data=\"{}\"></meta_init>", attr(&data.to_string())),
        rewritten.to_string(),
    )
}

/// Adversarial text pieces: newlines, CRLF, backslashes, a literal backslash-n, quotes, `<`, `&`, `]]>`, emoji,
/// CJK, combining marks, control characters, and a tag name.
pub const NASTY: [&str; 12] = [
    "plain words ",
    "line one\nline two\r\n",
    "back\\slash and \\n literal ",
    "\"quoted\" 'single' ",
    "a < b && c > d ",
    "]]> not the end ",
    "emoji 😀🚀 ",
    "中文字符 ",
    "e\u{301}\u{302} combining ",
    "ctl \u{1}\u{1f}\t tab ",
    "<chart>{\"x\":1}</chart> ",
    "</content-block-thinking> inside text ",
];

/// The XML-dialect scenario with every common kind, a subagent and citations, with text from `pieces`.
pub fn xml_scenario(name: &str, pieces: &[&str]) -> Scenario {
    let a = "agent-main";
    let s = "agent-sub";
    let (mut items, mut want) = (Vec::new(), Vec::new());
    push_meta_init((&mut items, &mut want), "xml", a, None);

    items.push("<content-block-thinking>".into());
    items.extend(pieces.iter().map(|p| fmt_escape(p)));
    items.push("</content-block-thinking>".into());
    want.push(block("thinking", a, &pieces.concat(), vec![]));

    items.push("<content-block-text>".into());
    items.extend(pieces.iter().rev().map(|p| fmt_escape(p)));
    items.push("</content-block-text>".into());
    let rev: String = pieces.iter().rev().copied().collect();
    want.push(block("text", a, &rev, vec![]));

    let cited = "cited \"text\" ]]> with\nnewline";
    items.push(format!(
        "<citations><citation type=\"char_location\" document_index=\"1\" document_title=\"Doc &amp; co\" \
         start_char_index=\"3\" end_char_index=\"9\"><![CDATA[{}]]></citation></citations>",
        fmt_escape(cited)
    ));
    want.push(block(
        "citation",
        a,
        cited,
        vec![
            ("citation_type", json!("char_location")),
            ("document_index", json!(1)),
            ("document_title", json!("Doc & co")),
            ("start_char_index", json!(3)),
            ("end_char_index", json!(9)),
        ],
    ));

    let args = json!({"task": "sub <task> & \"quotes\"", "n": 3});
    let spawn = ("toolu_1", "spawn_subagent");
    let arguments = format!(" arguments=\"{}\">", attr(&args.to_string()));
    push_tool(
        (&mut items, &mut want),
        "tool_call",
        a,
        spawn,
        &arguments,
        &args.to_string(),
    );

    push_meta_init((&mut items, &mut want), "xml", s, Some(a));
    items.push(format!(
        "<content-block-text>{}</content-block-text>",
        fmt_escape(pieces[0])
    ));
    want.push(block("text", s, pieces[0], vec![]));
    let noargs = ("toolu_2", "noargs");
    let sub_result = "sub result\nsecond line ]]> still";
    let cdata = format!(
        "><![CDATA[{}]]>",
        sub_result.replace('\n', "\\n").replace("]]>", "]]]]><![CDATA[>")
    );
    // The parent's result for the spawn call (the last one) closes the child scope.
    for (kind, agent, tool, rest, content) in [
        ("tool_call", s, noargs, " arguments=\"&quot;&quot;\">", "{}"),
        ("tool_result", s, noargs, cdata.as_str(), sub_result),
        ("tool_result", a, spawn, "><![CDATA[done]]>", "done"),
    ] {
        push_tool((&mut items, &mut want), kind, agent, tool, rest, content);
    }

    let err = "tool failed: \\ and \n newline";
    items.push(format!(
        "<content-block-error><![CDATA[{}]]></content-block-error>",
        fmt_escape(err)
    ));
    want.push(block("error", a, err, vec![]));

    let fin = json!({"stop_reason": "end_turn", "total_steps": 2, "cost": 0.5, "generated_files": [],
                     "conversation_history": [{"role": "user", "content": "<hi> & \"bye\""}]});
    finish(name, (items, want), a, fin)
}

/// A raw-dialect scenario (DESIGN 3.4): model events as JSON mixed with XML agent items.
pub fn raw_scenario(name: &str, pieces: &[&str]) -> Scenario {
    let a = "agent-raw";
    let (mut items, mut want) = (Vec::new(), Vec::new());
    push_meta_init((&mut items, &mut want), "raw", a, None);
    let ev = |v: Value| v.to_string();
    items.push(ev(
        json!({"type": "message_start", "message": {"id": "msg_1", "role": "assistant", "content": []}}),
    ));
    items.push(ev(
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
    ));
    for p in pieces {
        items.push(ev(
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": p}}),
        ));
    }
    items.push(ev(
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "c2ln"}}),
    ));
    items.push(ev(json!({"type": "content_block_stop", "index": 0})));
    want.push(block("thinking", a, &pieces.concat(), vec![]));
    items.push(ev(json!({"type": "ping"})));
    items.push(ev(
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
    ));
    for p in pieces.iter().rev() {
        items.push(ev(
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": p}}),
        ));
    }
    items.push(ev(json!({"type": "content_block_stop", "index": 1})));
    want.push(block(
        "text",
        a,
        &pieces.iter().rev().copied().collect::<String>(),
        vec![],
    ));
    items.push(ev(json!({"type": "content_block_start", "index": 2,
        "content_block": {"type": "tool_use", "id": "toolu_r1", "name": "calc", "input": {}}})));
    for part in ["{\"expr\": \"1 + ", "1\", \"note\": \"<&>\"}"] {
        items.push(ev(
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": part}}),
        ));
    }
    items.push(ev(json!({"type": "content_block_stop", "index": 2})));
    want.push(block(
        "tool_call",
        a,
        "{\"expr\": \"1 + 1\", \"note\": \"<&>\"}",
        vec![("id", json!("toolu_r1")), ("name", json!("calc"))],
    ));
    items.push(ev(
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
    ));
    items.push(ev(json!({"type": "message_stop"})));
    let calc = ("toolu_r1", "calc");
    push_tool(
        (&mut items, &mut want),
        "tool_result",
        a,
        calc,
        "><![CDATA[two]]>",
        "two",
    );
    let fin = json!({"stop_reason": "end_turn", "total_steps": 1});
    finish(name, (items, want), a, fin)
}

/// The corpus: both dialects, with plain and adversarial text, and a few random mixes of the nasty pieces.
pub fn corpus() -> Vec<Scenario> {
    let mut v = vec![
        xml_scenario("xml-plain", &["Hello", " world", "."]),
        xml_scenario("xml-nasty", &NASTY),
        raw_scenario("raw-plain", &["Hi", " there"]),
        raw_scenario("raw-nasty", &NASTY),
    ];
    let mut rng = fastrand::Rng::with_seed(7);
    for i in 0..6 {
        let pieces: Vec<&str> = (0..rng.usize(1..8)).map(|_| NASTY[rng.usize(..NASTY.len())]).collect();
        if i % 2 == 0 {
            v.push(xml_scenario(&format!("xml-random-{i}"), &pieces));
        } else {
            v.push(raw_scenario(&format!("raw-random-{i}"), &pieces));
        }
    }
    v
}

/// A legacy stream of one text block, an event a `Vec`: the block's open tag, one event per delta, its close tag,
/// then the `after` events' data (`[DONE]`, a `meta_final`…).
pub fn text_block(deltas: impl IntoIterator<Item = String>, after: &[&str]) -> Vec<Vec<u8>> {
    let mut out = vec![b"data: <content-block-text>\n\n".to_vec()];
    out.extend(deltas.into_iter().map(|d| format!("data: {d}\n\n").into_bytes()));
    out.push(b"data: </content-block-text>\n\n".to_vec());
    out.extend(after.iter().map(|a| format!("data: {a}\n\n").into_bytes()));
    out
}
