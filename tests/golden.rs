//! Golden fixtures: `tests/fixtures/<name>.sse` (a legacy stream) and
//! `<name>.jsonl` (the expected output, one line per envelope). The
//! translator's output is compared line by line, byte for byte (JSON
//! payloads in the native formatter's text, DESIGN 4). A `budget<N>_` name
//! prefix sets the budget; otherwise the default (2048) applies.
//!
//! `REGENERATE_FIXTURES=1 cargo test --test golden` rewrites both files of
//! every fixture from the emitter's expectation (review each by eye).

mod harness;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sse_gateway::translate::{translate_all, Options, DEFAULT_BUDGET};

use harness::core::emitter::{
    emit, is_native_split, native_split, Args, Attr, Block, Citation, ClientContent, EmitOpts, Expect, Format, Image,
    Item, MetaInit, ServerContent,
};
use harness::core::envelopes::FALLBACK;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn budget_of(name: &str) -> usize {
    name.strip_prefix("budget")
        .and_then(|r| r.split('_').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_BUDGET)
}

// ------------------------------------------------------------ expectations

/// Bytes of `s` inside a JSON string literal, as serde_json writes it.
fn escaped_len(s: &str) -> usize {
    serde_json::to_string(s).map(|j| j.len() - 2).unwrap_or(0)
}

/// Greedy chunks: each the longest prefix (on a char boundary) whose
/// escaped size fits `room`.
fn chunks(s: &str, room: usize) -> Vec<String> {
    let mut v = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut end = 0;
        let mut used = 0;
        for (i, c) in rest.char_indices() {
            let n = escaped_len(c.encode_utf8(&mut [0; 4]));
            if used + n > room {
                break;
            }
            used += n;
            end = i + c.len_utf8();
        }
        assert!(end > 0, "budget too small for fixed fields");
        v.push(rest[..end].to_owned());
        rest = &rest[end..];
    }
    if v.is_empty() {
        v.push(String::new());
    }
    v
}

fn envelope(b: &Block, fin: bool, delta: &str) -> Value {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), b.kind.clone().into());
    m.insert("agent".into(), b.agent.clone().into());
    m.insert("final".into(), fin.into());
    m.insert("delta".into(), delta.into());
    for (k, v) in &b.extras {
        m.insert(k.clone(), v.clone());
    }
    Value::Object(m)
}

/// The expected output lines of an emitter expectation at `budget`.
fn jsonl(expected: &[Expect], budget: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for e in expected {
        let b = match e {
            Expect::Done => {
                lines.push("[DONE]".to_owned());
                continue;
            }
            Expect::Block(b) => b,
        };
        let room = budget - envelope(b, false, "").to_string().len();
        let streamed = b.kind == "text" || b.kind == "thinking";
        let mut envs: Vec<(bool, String)> = Vec::new();
        if b.kind == "citation" {
            envs.push((b.closed, b.content.clone()));
        } else if streamed {
            for p in &b.pieces {
                envs.extend(chunks(p, room).into_iter().map(|c| (false, c)));
            }
            envs.push((true, String::new()));
        } else if is_native_split(&b.kind) {
            // Cut where the native formatter cuts (DESIGN 4, third exception).
            let fixed = envelope(b, false, "").to_string().len();
            let cs = native_split(&b.content, fixed, budget);
            let n = cs.len();
            envs.extend(cs.into_iter().enumerate().map(|(j, c)| (b.closed && j + 1 == n, c)));
        } else {
            let content = b.pieces.clone();
            for (i, p) in content.iter().enumerate() {
                let last = i + 1 == content.len();
                let cs = if p.is_empty() {
                    vec![String::new()]
                } else {
                    chunks(p, room)
                };
                let n = cs.len();
                envs.extend(
                    cs.into_iter()
                        .enumerate()
                        .map(|(j, c)| (last && b.closed && j + 1 == n, c)),
                );
            }
        }
        lines.extend(envs.into_iter().map(|(f, d)| envelope(b, f, &d).to_string()));
    }
    lines
}

// ---------------------------------------------------------------- fixtures

fn meta(format: Format) -> Item {
    Item::MetaInit(MetaInit::new("agent-1", None, format, "What's <new> & \"next\"?", None))
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn text(deltas: &[&str], citations: Vec<Citation>) -> Item {
    Item::Text {
        deltas: s(deltas),
        close: true,
        one_event: false,
        citations,
    }
}

fn three_citations() -> Vec<Citation> {
    let ships = "It ships <today>\nwith a \\ backslash.";
    vec![
        Citation::char_location(Attr::Num(0), "Guide & \"FAQ\"", Attr::Num(5), Attr::Num(42), ships),
        Citation::page_location(
            Attr::Num(1),
            "",
            Attr::Num(3),
            Attr::Num(4),
            "Page text ]]> with a CDATA end.",
        ),
        Citation::web_location(
            "https://example.com/?a=1&b=2",
            "Example's page",
            "EqgfCioIARgB",
            "From the web.",
        ),
    ]
}

fn multimodal() -> ClientContent {
    ClientContent::multimodal(
        "Two shots:\r\nsee below",
        vec![
            Image::new("https://img.example.com/a.png?w=1&h=2", "image/png"),
            Image::new("data:image/jpeg;base64,/9j/4AAQ", "image/jpeg"),
        ],
    )
}

fn failure() -> Item {
    Item::failure(
        "APIStatusError",
        "Overloaded",
        "Traceback (most recent call last):\n  File \"run.py\", line 7",
    )
}

fn meta_final() -> Item {
    Item::MetaFinal(json!({
        "conversation_history": [{"role": "assistant", "content": "done\nok"}],
        "stop_reason": "end_turn", "total_steps": 2, "generated_files": [], "cost": 0.5,
        "cumulative_usage": {"input_tokens": 10, "output_tokens": 5}
    }))
}

/// Every fixture: name, items. Names say the dialect and the item kind.
fn fixtures() -> Vec<(String, Vec<Item>)> {
    let mut v: Vec<(String, Vec<Item>)> = Vec::new();
    for (d, f) in [("xml", Format::Xml), ("raw", Format::Raw)] {
        let m = || meta(f);
        let mut add = |name: &str, mut items: Vec<Item>| {
            items.insert(0, m());
            v.push((format!("{d}_{name}"), items));
        };
        add("meta_init", vec![Item::Done]);
        add(
            "thinking",
            vec![
                Item::thinking(["Let me think", " about \"this\"\\n\nfirst."], true),
                Item::Done,
            ],
        );
        add(
            "text",
            vec![
                text(&["Hello", ", <b>world</b> & a < b", "\nnew line, 😀 漢字"], vec![]),
                Item::Done,
            ],
        );
        add(
            "citations",
            vec![text(&["Per the guide, it ships."], three_citations()), Item::Done],
        );
        add(
            "tool_call",
            vec![
                Item::call(
                    false,
                    "toolu_01",
                    "search",
                    Args::Json(json!({"query": "café \"menu\"\n", "n": 3})),
                ),
                Item::Done,
            ],
        );
        add(
            "tool_call_empty_input",
            vec![Item::call(false, "toolu_02", "now", Args::Empty), Item::Done],
        );
        add(
            "server_tool_call",
            vec![
                Item::call(
                    true,
                    "srvtoolu_01",
                    "web_search",
                    Args::Json(json!({"query": "rust & sse"})),
                ),
                Item::Done,
            ],
        );
        add(
            "tool_result",
            vec![
                Item::call(false, "toolu_03", "read", Args::Json(json!({"path": "a.txt"}))),
                Item::result(
                    "toolu_03",
                    "read",
                    ClientContent::Text("line 1\r\nline 2\rline 3 ]]> end".into()),
                ),
                Item::Done,
            ],
        );
        add(
            "tool_result_structured",
            vec![
                Item::call(false, "toolu_04", "query", Args::Json(json!({"sql": "select 1"}))),
                Item::result(
                    "toolu_04",
                    "query",
                    ClientContent::Structured(json!({"rows": [{"a": "x\ny"}], "path": "C:\\new"})),
                ),
                Item::Done,
            ],
        );
        add(
            "tool_result_multimodal",
            vec![
                Item::call(false, "toolu_05", "screenshot", Args::Empty),
                Item::result("toolu_05", "screenshot", multimodal()),
                Item::Done,
            ],
        );
        let server_content = if f == Format::Raw {
            ServerContent::Json(json!([{"type": "web_search_result", "url": "https://e.com/?a&b", "title": "E"}]))
        } else {
            ServerContent::Text("Results: <a href=\"x\">x</a> ]]> done\nnext".into())
        };
        add(
            "server_tool_result",
            vec![
                Item::server_result("server_tool_result", "srvtoolu_02", Some("web_search"), server_content),
                Item::Done,
            ],
        );
        let fetched = Item::server_text(
            "web_fetch_tool_result",
            "srvtoolu_03",
            None,
            "<html>fetched \\ page</html>",
        );
        let run = Item::server_text(
            "code_execution_tool_result",
            "srvtoolu_04",
            Some("python"),
            "stdout: 2\n",
        );
        add("dynamic_tool_result", vec![fetched, run, Item::Done]);
        add(
            "awaiting_frontend_tools",
            vec![
                Item::AwaitingFrontendTools(json!([
                    {"tool_use_id": "toolu_06", "name": "confirm", "input": {"question": "Delete \"a\" & <b>?"}}
                ])),
                Item::Done,
            ],
        );
        add(
            "meta_files",
            vec![
                Item::MetaFiles(
                    json!({"files": [{"name": "report]]>v2.pdf", "url": "https://f.example.com/?id=1&x=2", "size": 1024}]}),
                ),
                Item::Done,
            ],
        );
        add(
            "content_error",
            vec![
                Item::ContentError("Tool failed: <timeout> ]]> after 30s\nretrying".into()),
                Item::Done,
            ],
        );
        add("meta_final", vec![meta_final(), Item::Done]);
        add("failure", vec![failure()]);
        add(
            "failure_in_open_text",
            vec![Item::text(["The answer is"], false, vec![]), failure()],
        );
        add(
            "done_in_text",
            vec![text(&["before ", "[DONE]", " after"], vec![]), Item::Done],
        );
        add(
            "subagent",
            vec![
                Item::call(
                    false,
                    "toolu_spawn",
                    "spawn_subagent",
                    Args::Json(json!({"task": "look"})),
                ),
                Item::MetaInit(MetaInit::new("agent-2", Some("agent-1"), f, "look", None)),
                text(&["child here"], vec![]),
                Item::result("toolu_spawn", "spawn_subagent", ClientContent::Text("looked".into())),
                text(&["parent here"], vec![]),
                Item::Done,
            ],
        );
        if f == Format::Raw {
            add(
                "noise_only",
                vec![Item::RawNoise, Item::RawNoise, text(&["x"], vec![]), Item::Done],
            );
        } else {
            add(
                "text_one_event",
                vec![Item::one_event_text(["Hi </content-block-text> there"]), Item::Done],
            );
        }
    }
    // No meta_init: the fallback agent.
    v.push((
        "xml_fallback_agent".into(),
        vec![text(&["resumed"], vec![]), Item::Done],
    ));
    // Chunked at a small budget.
    let long = "Chunk me: \"quotes\" \\ backslashes \u{1} controls, émoji 😀 and 漢字. ".repeat(12);
    for (d, f) in [("xml", Format::Xml), ("raw", Format::Raw)] {
        v.push((
            format!("budget256_{d}_text_chunked"),
            vec![meta(f), text(&[&long, "short"], vec![]), Item::Done],
        ));
        v.push((
            format!("budget256_{d}_tool_result_chunked"),
            vec![
                meta(f),
                Item::call(false, "toolu_07", "cat", Args::Empty),
                Item::result("toolu_07", "cat", ClientContent::Text(format!("out {long}"))),
                Item::Done,
            ],
        ));
    }
    v.push((
        "budget256_xml_server_tool_result_chunked".into(),
        vec![
            meta(Format::Xml),
            Item::server_text("server_tool_result", "srvtoolu_05", Some("web_search"), long.clone()),
            Item::ContentError(long),
            Item::Done,
        ],
    ));
    v
}

// -------------------------------------------------------------- comparison

fn compare(name: &str, got: &str, want: &str) -> Result<(), String> {
    let got: Vec<&str> = got.lines().collect();
    let want: Vec<&str> = want.lines().collect();
    for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
        if g != w {
            return Err(format!("{name}: line {} differs\n  want: {w}\n  got:  {g}", i + 1));
        }
    }
    if got.len() != want.len() {
        return Err(format!(
            "{name}: {} lines, want {}; first extra: {:?}",
            got.len(),
            want.len(),
            got.get(want.len()).or(want.get(got.len()))
        ));
    }
    Ok(())
}

/// The translator's output as lines: the JSON of each `data:` event.
fn output_lines(out: &[u8]) -> String {
    let s = String::from_utf8_lossy(out);
    s.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or(e))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn golden_fixtures_match_line_by_line() {
    if std::env::var_os("REGENERATE_FIXTURES").is_some() {
        for (name, items) in fixtures() {
            let em = emit(&items, &EmitOpts::default(), FALLBACK, 0);
            let lines = jsonl(&em.expected, budget_of(&name));
            std::fs::write(dir().join(format!("{name}.sse")), &em.sse).unwrap();
            std::fs::write(dir().join(format!("{name}.jsonl")), lines.join("\n") + "\n").unwrap();
        }
    }
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .into_string()
                .ok()?
                .strip_suffix(".sse")
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    assert!(names.len() >= 40, "fixtures missing: {}", names.len());
    let mut failures = Vec::new();
    for name in &names {
        let sse = std::fs::read(dir().join(format!("{name}.sse"))).unwrap();
        let want = std::fs::read_to_string(dir().join(format!("{name}.jsonl"))).unwrap();
        let opts = Options {
            budget: budget_of(name),
            ..Options::default()
        };
        let (out, _) = translate_all(opts, FALLBACK, &sse);
        if let Err(e) = compare(name, &output_lines(&out), &want) {
            failures.push(e);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures differ:\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

#[test]
fn every_fixture_has_a_readme_line_and_a_jsonl() {
    let readme = std::fs::read_to_string(dir().join("README.md")).unwrap();
    for (name, _) in fixtures() {
        assert!(dir().join(format!("{name}.jsonl")).exists(), "{name}.jsonl missing");
        assert!(
            readme.contains(&format!("`{name}`")),
            "README.md has no line for {name}"
        );
    }
}

#[test]
fn fixture_inputs_are_what_the_emitter_writes() {
    // Guards against a fixture edited by hand drifting from its scenario.
    for (name, items) in fixtures() {
        let em = emit(&items, &EmitOpts::default(), FALLBACK, 0);
        let on_disk = std::fs::read(dir().join(format!("{name}.sse"))).unwrap();
        assert!(
            on_disk == em.sse,
            "{name}.sse differs from its scenario; regenerate and review"
        );
    }
}
