//! Scenario corpus: legacy streams written by the test emitter (DESIGN 3),
//! run through the translator whole and split at random points, compared
//! block by block with the emitter's expectation (DESIGN 4, CONTRACT).

mod harness;

use serde_json::{json, Value};
use sse_gateway::envelope::EnvelopeKind;
use sse_gateway::translate::Options;

use harness::core::emitter::{
    emit, Args, Attr, Citation, ClientContent, EmitOpts, Emitted, Format, Image, Item, MetaInit, ServerContent,
};
use harness::core::envelopes::{check, run, run_bytewise, Out, FALLBACK};
use harness::core::gen;
use harness::rng::Rng;

/// Inputs up to this size are also fed one byte at a time.
const BYTEWISE_MAX: usize = 24 * 1024;

fn save(name: &str, what: &str, bytes: &[u8]) -> String {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.{what}"));
    let _ = std::fs::write(&path, bytes);
    path.display().to_string()
}

/// Emits `items`, translates, and checks: expectation, budget, counters,
/// and identical output for random splits and byte-at-a-time feeding.
fn run_scenario(name: &str, items: &[Item], eo: &EmitOpts, opts: &Options, seed: u64) -> Emitted {
    let em = emit(items, eo, FALLBACK, seed);
    let (whole, stats) = run(opts, &em.sse, &[]);
    let outs = match check(&em.expected, &whole, opts.budget) {
        Ok(outs) => outs,
        Err(e) => {
            let i = save(name, "sse", &em.sse);
            let o = save(name, "out", &whole);
            panic!("{name}: {e}\n  input: {i}\n  output: {o}");
        }
    };

    // Counters agree with what was written (DESIGN 6, issue 2 item 8).
    assert_eq!(
        stats.total_parse_errors(),
        0,
        "{name}: parse errors {:?}",
        stats.parse_errors
    );
    assert_eq!(stats.scope_conflicts, 0, "{name}: scope conflicts");
    let mut per_kind = [0u64; 13];
    let mut over = 0;
    for o in &outs {
        if let Out::Env(e) = o {
            if let Some(k) = EnvelopeKind::parse(&e.kind) {
                per_kind[k as usize] += 1;
            }
            over += u64::from(e.len > opts.budget);
        }
    }
    assert_eq!(stats.envelopes, per_kind, "{name}: envelope counters");
    assert_eq!(stats.oversize, over, "{name}: oversize counter");
    // XML items split over events or lines are fragmentation (DESIGN 3.1);
    // the exact count, deltas included, is pinned by the tests below.
    assert!(
        stats.fragmented_items >= em.fragmented_xml as u64,
        "{name}: fragmented items counter {} < {} fragmented XML items",
        stats.fragmented_items,
        em.fragmented_xml
    );

    // Any split gives the same bytes.
    let mut rng = Rng::new(seed ^ 0x5EED_5EED);
    for n in [1, 7, 64] {
        let cuts = rng.cuts(em.sse.len(), n);
        let (out, _) = run(opts, &em.sse, &cuts);
        if out != whole {
            let i = save(name, "sse", &em.sse);
            panic!("{name}: output differs when the input is cut at {cuts:?}\n  input: {i}");
        }
    }
    if em.sse.len() <= BYTEWISE_MAX {
        assert!(
            run_bytewise(opts, &em.sse) == whole,
            "{name}: byte-at-a-time output differs"
        );
    }
    em
}

fn xml_opts() -> EmitOpts {
    EmitOpts::default()
}

fn fragmenting() -> EmitOpts {
    EmitOpts {
        fragment: 0.5,
        max_pieces: 5,
        ..EmitOpts::default()
    }
}

fn budget(b: usize) -> Options {
    Options {
        budget: b,
        ..Options::default()
    }
}

fn top(format: Format) -> Item {
    Item::MetaInit(MetaInit {
        agent: "agent-top".into(),
        parent: None,
        format,
        user_query: "q".into(),
        model: "claude-x".into(),
        history: None,
    })
}

fn text(deltas: &[&str]) -> Item {
    Item::Text {
        deltas: deltas.iter().map(|s| s.to_string()).collect(),
        close: true,
        one_event: false,
        citations: vec![],
    }
}

fn done_final() -> [Item; 2] {
    [
        Item::MetaFinal(json!({"stop_reason": "end_turn", "total_steps": 1})),
        Item::Done,
    ]
}

// ------------------------------------------------------------ random corpus

fn random(seed: u64, raw: bool) {
    let mut rng = Rng::new(seed);
    let items = gen::scenario(&mut rng, raw);
    let eo = EmitOpts {
        fragment: if seed % 3 == 0 { 0.0 } else { 0.35 },
        numeric_refs: seed % 4 == 1,
        ascii_json: seed % 5 != 2,
        ..EmitOpts::default()
    };
    let opts = if seed % 4 == 3 { budget(256) } else { Options::default() };
    let name = format!("random_{}_{seed}", if raw { "raw" } else { "xml" });
    run_scenario(&name, &items, &eo, &opts, seed);
}

macro_rules! random_scenarios {
    ($($name:ident: $seed:expr, $raw:expr;)*) => {$(
        #[test]
        fn $name() {
            random($seed, $raw);
        }
    )*};
}

random_scenarios! {
    random_xml_00: 100, false; random_xml_01: 101, false; random_xml_02: 102, false; random_xml_03: 103, false;
    random_xml_04: 104, false; random_xml_05: 105, false; random_xml_06: 106, false; random_xml_07: 107, false;
    random_xml_08: 108, false; random_xml_09: 109, false; random_xml_10: 110, false; random_xml_11: 111, false;
    random_xml_12: 112, false; random_xml_13: 113, false; random_xml_14: 114, false; random_xml_15: 115, false;
    random_xml_16: 116, false; random_xml_17: 117, false; random_xml_18: 118, false; random_xml_19: 119, false;
    random_xml_20: 120, false; random_xml_21: 121, false; random_xml_22: 122, false; random_xml_23: 123, false;
    random_xml_24: 124, false; random_xml_25: 125, false; random_xml_26: 126, false; random_xml_27: 127, false;
    random_raw_00: 200, true; random_raw_01: 201, true; random_raw_02: 202, true; random_raw_03: 203, true;
    random_raw_04: 204, true; random_raw_05: 205, true; random_raw_06: 206, true; random_raw_07: 207, true;
    random_raw_08: 208, true; random_raw_09: 209, true; random_raw_10: 210, true; random_raw_11: 211, true;
    random_raw_12: 212, true; random_raw_13: 213, true; random_raw_14: 214, true; random_raw_15: 215, true;
    random_raw_16: 216, true; random_raw_17: 217, true; random_raw_18: 218, true; random_raw_19: 219, true;
}

// ---------------------------------------------------------- named scenarios

fn history_200kb(seed: u64) -> Value {
    let mut rng = Rng::new(seed);
    let mut msgs = Vec::new();
    let mut size = 0;
    while size < 200 * 1024 {
        let content = gen::text(&mut rng, 40);
        size += content.len() + 40;
        msgs.push(json!({"role": if msgs.len() % 2 == 0 { "user" } else { "assistant" }, "content": content}));
    }
    Value::Array(msgs)
}

#[test]
fn meta_init_with_200kb_history_xml_fragmented() {
    let items = vec![
        Item::MetaInit(MetaInit {
            agent: "agent-big".into(),
            parent: None,
            format: Format::Xml,
            user_query: "summarise <all> & \"everything\"".into(),
            model: "claude-x".into(),
            history: Some(history_200kb(1)),
        }),
        text(&["ok"]),
        Item::Done,
    ];
    let eo = EmitOpts {
        fragment: 1.0,
        max_pieces: 40,
        ..EmitOpts::default()
    };
    run_scenario("meta_init_200kb_xml", &items, &eo, &Options::default(), 1);
}

#[test]
fn meta_init_with_200kb_history_raw_non_ascii_json() {
    let items = vec![
        Item::MetaInit(MetaInit {
            agent: "agent-big-raw".into(),
            parent: None,
            format: Format::Raw,
            user_query: "漢字 😀".into(),
            model: "claude-x".into(),
            history: Some(history_200kb(2)),
        }),
        text(&["ok"]),
        Item::Done,
    ];
    let eo = EmitOpts {
        fragment: 1.0,
        max_pieces: 10,
        ascii_json: false,
        ..EmitOpts::default()
    };
    run_scenario("meta_init_200kb_raw", &items, &eo, &budget(256), 2);
}

#[test]
fn tool_result_of_50kb_text_with_crlf_backslash_n_and_cdata_ends() {
    let mut rng = Rng::new(3);
    let mut s = String::from("Result: ");
    while s.len() < 50 * 1024 {
        s.push_str(&gen::text(&mut rng, 8));
        s.push_str("]]>\r\n\\n\r");
    }
    let items = vec![
        top(Format::Xml),
        Item::ToolCall {
            server: false,
            id: "toolu_big".into(),
            name: "cat".into(),
            args: Args::Json(json!({"path": "big.txt"})),
        },
        Item::ToolResult {
            id: "toolu_big".into(),
            name: "cat".into(),
            content: ClientContent::Text(s),
        },
        Item::Done,
    ];
    run_scenario("tool_result_50kb_text", &items, &fragmenting(), &Options::default(), 3);
}

#[test]
fn tool_result_of_50kb_structured_json_keeps_its_escapes() {
    let mut rng = Rng::new(4);
    let rows: Vec<Value> = (0..400)
        .map(|i| json!({"i": i, "line": gen::text(&mut rng, 5), "path": "C:\\new\\x"}))
        .collect();
    let items = vec![
        top(Format::Xml),
        Item::ToolCall {
            server: false,
            id: "toolu_rows".into(),
            name: "query".into(),
            args: Args::Empty,
        },
        Item::ToolResult {
            id: "toolu_rows".into(),
            name: "query".into(),
            content: ClientContent::Structured(json!({"rows": rows})),
        },
        Item::Done,
    ];
    run_scenario("tool_result_50kb_json", &items, &fragmenting(), &Options::default(), 4);
}

#[test]
fn multimodal_tool_results_text_then_images_then_final_marker() {
    let items = vec![
        top(Format::Xml),
        Item::ToolCall {
            server: false,
            id: "toolu_shot".into(),
            name: "screenshot".into(),
            args: Args::Empty,
        },
        Item::ToolResult {
            id: "toolu_shot".into(),
            name: "screenshot".into(),
            content: ClientContent::Multimodal {
                text: "Captured 2 images:\nfirst & second <ok> ]]> done\r\n".into(),
                images: vec![
                    Image {
                        src: "https://img.example.com/a.png?x=1&y=\"2\"".into(),
                        media_type: "image/png".into(),
                    },
                    Image {
                        src: "data:image/jpeg;base64,/9j/4AAQSkZJRg==".into(),
                        media_type: "image/jpeg".into(),
                    },
                ],
            },
        },
        Item::Done,
    ];
    run_scenario("multimodal", &items, &fragmenting(), &Options::default(), 5);
    run_scenario("multimodal_256", &items, &fragmenting(), &budget(256), 6);
}

fn all_citations(raw: bool) -> Vec<Citation> {
    let mut rng = Rng::new(7);
    let mut v: Vec<Citation> = (0..3).map(|k| gen::citation(&mut rng, k, raw)).collect();
    // One with an empty optional attribute (omitted) and a long cited text
    // over the budget (sent whole, counted oversize).
    v.push(Citation {
        citation_type: "char_location".into(),
        attrs: vec![
            ("document_index".into(), Attr::Num(1)),
            ("document_title".into(), Attr::Str(String::new())),
            ("start_char_index".into(), Attr::Num(0)),
            ("end_char_index".into(), Attr::Num(3000)),
        ],
        cited: "long \"quoted\" \\ cited text ".repeat(100),
    });
    v
}

#[test]
fn citations_of_all_three_kinds_xml() {
    let items = vec![
        top(Format::Xml),
        Item::Text {
            deltas: vec!["According to the docs, ".into(), "it works.".into()],
            close: true,
            one_event: false,
            citations: all_citations(false),
        },
        Item::Done,
    ];
    run_scenario("citations_xml", &items, &fragmenting(), &Options::default(), 8);
}

#[test]
fn citations_of_all_three_kinds_raw_follow_the_final_marker() {
    let items = vec![
        top(Format::Raw),
        Item::Text {
            deltas: vec!["According to the docs, ".into(), "it works.".into()],
            close: true,
            one_event: false,
            citations: all_citations(true),
        },
        Item::Done,
    ];
    run_scenario("citations_raw", &items, &xml_opts(), &Options::default(), 9);
}

fn spawn(id: &str) -> Item {
    Item::ToolCall {
        server: false,
        id: id.into(),
        name: "spawn_subagent".into(),
        args: Args::Json(json!({"task": "look it up"})),
    }
}

fn child(agent: &str, parent: &str) -> Item {
    Item::MetaInit(MetaInit {
        agent: agent.into(),
        parent: Some(parent.into()),
        format: Format::Xml,
        user_query: "look it up".into(),
        model: "claude-x".into(),
        history: None,
    })
}

fn result(id: &str, name: &str, s: &str) -> Item {
    Item::ToolResult {
        id: id.into(),
        name: name.into(),
        content: ClientContent::Text(s.into()),
    }
}

#[test]
fn nested_subagent_scope_closed_by_its_meta_final() {
    let items = vec![
        top(Format::Xml),
        text(&["spawning"]),
        spawn("toolu_spawn1"),
        child("agent-child", "agent-top"),
        text(&["child ", "speaks"]),
        Item::MetaFinal(json!({"stop_reason": "end_turn"})),
        // After the child's meta_final, the parent's agent again.
        text(&["parent again"]),
        result("toolu_spawn1", "spawn_subagent", "child said hi"),
        done_final()[0].clone(),
        Item::Done,
    ];
    run_scenario("subagent_meta_final", &items, &fragmenting(), &Options::default(), 10);
}

#[test]
fn nested_subagents_closed_by_the_parents_tool_result() {
    let items = vec![
        top(Format::Xml),
        spawn("toolu_spawn1"),
        child("agent-child", "agent-top"),
        Item::Thinking {
            deltas: vec!["hmm".into()],
            close: true,
        },
        // A call and result inside the child: the child's own, no close.
        Item::ToolCall {
            server: false,
            id: "toolu_c1".into(),
            name: "search".into(),
            args: Args::Json(json!({"q": "x"})),
        },
        result("toolu_c1", "search", "found"),
        text(&["still child"]),
        spawn("toolu_spawn2"),
        child("agent-grandchild", "agent-child"),
        text(&["grandchild"]),
        // The top agent's spawn call returns: closes grandchild and child.
        result("toolu_spawn1", "spawn_subagent", "all done"),
        text(&["top again"]),
        Item::Done,
    ];
    run_scenario("subagents_tool_result", &items, &fragmenting(), &Options::default(), 11);
}

#[test]
fn structured_client_tool_results_keep_json_escapes() {
    let items = vec![
        top(Format::Xml),
        Item::ToolCall {
            server: false,
            id: "t1".into(),
            name: "run".into(),
            args: Args::Json(json!({"cmd": "ls"})),
        },
        Item::ToolResult {
            id: "t1".into(),
            name: "run".into(),
            content: ClientContent::Structured(json!({"stdout": "a\nb\r\nc", "path": "C:\\new", "x": "]]>"})),
        },
        Item::ToolCall {
            server: false,
            id: "t2".into(),
            name: "run".into(),
            args: Args::Json(json!({"cmd": "ls"})),
        },
        Item::ToolResult {
            id: "t2".into(),
            name: "run".into(),
            content: ClientContent::Structured(json!(["line1\nline2", {"k": "😀"}])),
        },
        // A plain string result: `\n` becomes a newline, lossy for a
        // literal backslash-n (DESIGN 3.3).
        Item::ToolCall {
            server: false,
            id: "t3".into(),
            name: "run".into(),
            args: Args::Json(json!({"cmd": "echo"})),
        },
        result("t3", "run", "plain\nline and literal \\n and C:\\new\r\nend"),
        Item::Done,
    ];
    run_scenario("structured_results", &items, &fragmenting(), &Options::default(), 12);
}

fn failure() -> Item {
    Item::Failure {
        error: "APIStatusError".into(),
        message: "overloaded \"529\"".into(),
        traceback: "Traceback (most recent call last):\n  File \"agent.py\", line 1".into(),
    }
}

#[test]
fn failure_inside_an_open_text_block_xml() {
    let items = vec![
        top(Format::Xml),
        Item::Text {
            deltas: vec!["partial ".into(), "answer".into()],
            close: false,
            one_event: false,
            citations: vec![],
        },
        failure(),
    ];
    run_scenario("failure_open_text_xml", &items, &xml_opts(), &Options::default(), 13);
}

#[test]
fn failure_inside_an_open_thinking_block_raw() {
    let items = vec![
        top(Format::Raw),
        Item::Thinking {
            deltas: vec!["let me ".into(), "think".into()],
            close: false,
        },
        failure(),
    ];
    run_scenario(
        "failure_open_thinking_raw",
        &items,
        &xml_opts(),
        &Options::default(),
        14,
    );
}

#[test]
fn failure_inside_an_open_text_block_raw() {
    let items = vec![
        top(Format::Raw),
        Item::Text {
            deltas: vec!["partial ".into(), "answer".into()],
            close: false,
            one_event: false,
            citations: vec![],
        },
        failure(),
    ];
    run_scenario("failure_open_text_raw", &items, &xml_opts(), &Options::default(), 15);
}

#[test]
fn done_inside_text_is_text() {
    let items = vec![top(Format::Xml), text(&["before ", "[DONE]", " after"]), Item::Done];
    run_scenario("done_in_text", &items, &xml_opts(), &Options::default(), 16);
}

#[test]
fn closing_tags_and_items_inside_model_text_are_text() {
    let items = vec![
        top(Format::Xml),
        text(&[
            "I will write </content-block-text> here",
            "<content-block-text>nested?",
            " and <content-block-error><![CDATA[x]]></content-block-error> quoted",
            "</content-block-thinking>",
            "<chart>",
            "<table><tr><td>1</td></tr></table>",
            "a < b & c",
            "tail <",
            "/content-block-text",
        ]),
        Item::Thinking {
            deltas: vec!["</content-block-text> in thinking".into(), "<".into(), "/".into()],
            close: true,
        },
        Item::Done,
    ];
    run_scenario("tags_in_text", &items, &xml_opts(), &Options::default(), 17);
}

#[test]
fn empty_tool_input_becomes_an_empty_object() {
    for (format, seed) in [(Format::Xml, 18), (Format::Raw, 19)] {
        let items = vec![
            top(format),
            Item::ToolCall {
                server: false,
                id: "toolu_e".into(),
                name: "now".into(),
                args: Args::Empty,
            },
            result("toolu_e", "now", "12:00"),
            Item::ToolCall {
                server: true,
                id: "srvtoolu_e".into(),
                name: "web_search".into(),
                args: Args::Empty,
            },
            Item::Done,
        ];
        run_scenario(
            &format!("empty_input_{}", format.as_str()),
            &items,
            &xml_opts(),
            &Options::default(),
            seed,
        );
    }
}

#[test]
fn image_src_over_the_budget_is_sent_whole() {
    let src = format!("data:image/png;base64,{}", "iVBORw0KGgo".repeat(300));
    let items = vec![
        top(Format::Xml),
        Item::ToolCall {
            server: false,
            id: "toolu_img".into(),
            name: "render".into(),
            args: Args::Empty,
        },
        Item::ToolResult {
            id: "toolu_img".into(),
            name: "render".into(),
            content: ClientContent::Multimodal {
                text: "here".into(),
                images: vec![Image {
                    src,
                    media_type: "image/png".into(),
                }],
            },
        },
        Item::Done,
    ];
    run_scenario("huge_image_src", &items, &fragmenting(), &Options::default(), 20);
}

#[test]
fn resumed_run_without_meta_init_uses_the_fallback_agent() {
    let items = vec![
        text(&["resumed"]),
        Item::ToolCall {
            server: false,
            id: "t".into(),
            name: "x".into(),
            args: Args::Empty,
        },
        result("t", "x", "y"),
        Item::Done,
    ];
    run_scenario("fallback_agent", &items, &xml_opts(), &Options::default(), 21);
}

#[test]
fn resumed_run_subagent_names_the_fallback_agent_as_parent() {
    // DESIGN 3.5/3.6 read together: a meta_init whose parent is the current
    // (fallback) agent opens a child scope even though it is the first.
    let items = vec![
        spawn("toolu_s"),
        child("agent-child", FALLBACK),
        text(&["child"]),
        result("toolu_s", "spawn_subagent", "ok"),
        text(&["parent"]),
        Item::Done,
    ];
    run_scenario("fallback_subagent", &items, &xml_opts(), &Options::default(), 22);
}

#[test]
fn every_kind_chunked_at_the_smallest_budget() {
    let mut rng = Rng::new(23);
    let long = |rng: &mut Rng| gen::text(rng, 120);
    let items = vec![
        Item::MetaInit(MetaInit {
            agent: "agent-top".into(),
            parent: None,
            format: Format::Xml,
            user_query: long(&mut rng),
            model: "claude-x".into(),
            history: Some(json!([{"role": "user", "content": long(&mut rng)}])),
        }),
        Item::Thinking {
            deltas: gen::deltas(&mut rng, 3, "thinking", false)
                .into_iter()
                .map(|d| d.repeat(40))
                .filter(|d| gen::xml_delta_ok(d, "thinking"))
                .collect(),
            close: true,
        },
        Item::Text {
            deltas: vec!["\"\\\u{1}".repeat(200), "😀漢".repeat(100)],
            close: true,
            one_event: false,
            citations: vec![],
        },
        Item::ToolCall {
            server: false,
            id: "toolu_1".into(),
            name: "search".into(),
            args: Args::Json(json!({"q": long(&mut rng)})),
        },
        result("toolu_1", "search", &gen::client_text(&mut rng, 120)),
        Item::ServerToolResult {
            tag: "web_search_tool_result".into(),
            id: "srvtoolu_1".into(),
            name: None,
            content: ServerContent::Text(gen::cdata_text(
                &mut rng,
                120,
                "</content-block-web_search_tool_result>",
            )),
        },
        Item::AwaitingFrontendTools(
            json!([{"tool_use_id": "toolu_fe", "name": "ask", "input": {"q": long(&mut rng)}}]),
        ),
        Item::MetaFiles(json!({"files": [{"name": long(&mut rng)}]})),
        Item::ContentError(gen::cdata_text(&mut rng, 120, "</content-block-error>")),
        Item::MetaFinal(json!({"conversation_history": [long(&mut rng)], "stop_reason": "end_turn"})),
        Item::Done,
    ];
    run_scenario("budget_256_all_kinds", &items, &fragmenting(), &budget(256), 23);
}

#[test]
fn server_tool_results_plain_and_dynamic_with_and_without_name() {
    let items = vec![
        top(Format::Xml),
        Item::ServerToolResult {
            tag: "server_tool_result".into(),
            id: "s1".into(),
            name: None,
            content: ServerContent::Text("a]]>b]]".into()),
        },
        Item::ServerToolResult {
            tag: "web_fetch_tool_result".into(),
            id: "s2".into(),
            name: None,
            content: ServerContent::Text("<html>&amp; \\n\n</html>]]>".into()),
        },
        Item::ServerToolResult {
            tag: "code_execution_tool_result".into(),
            id: "s3".into(),
            name: Some("python".into()),
            content: ServerContent::Text("{\"stdout\": \"1\\n\"}".into()),
        },
        Item::ContentError("bad ]]> thing\\n\nend]".into()),
        Item::MetaFiles(json!({"files": [{"name": "x]]>y", "url": "https://e.com/?a&b"}]})),
        Item::Done,
    ];
    run_scenario("server_results", &items, &fragmenting(), &Options::default(), 24);
}

#[test]
fn adversarial_content_in_every_escaped_kind() {
    let all: String = gen::NASTY.concat();
    let all_no_cr_end = format!("{all}.");
    // Content that must not hold `]]>` right before its own closing tag.
    let all_before = |closing: &str| all.replace(&format!("]]>{closing}"), &format!("]] >{closing}"));
    // Attribute values: no raw control characters other than LF.
    let attr_all: String = all.chars().filter(|&c| c == '\n' || c >= ' ').collect();
    // Tool names are identifiers every envelope repeats: bounded, no control characters (issue 13).
    let name_all: String = attr_all
        .chars()
        .filter(|c| !c.is_control())
        .scan(0, |len, c| {
            *len += c.len_utf8();
            (*len <= sse_gateway::envelope::ids::MAX_ID_BYTES).then_some(c)
        })
        .collect();
    let items = vec![
        top(Format::Xml),
        Item::Thinking {
            deltas: vec![all_no_cr_end.clone()],
            close: true,
        },
        Item::Text {
            deltas: gen::NASTY
                .iter()
                .map(|s| format!("«{s}»"))
                .filter(|d| gen::xml_delta_ok(d, "text"))
                .collect(),
            close: true,
            one_event: false,
            citations: vec![Citation {
                citation_type: "page_location".into(),
                attrs: vec![
                    ("document_index".into(), Attr::Str("0".into())),
                    ("document_title".into(), Attr::Str(attr_all.clone())),
                    ("start_page_number".into(), Attr::Str("1".into())),
                    ("end_page_number".into(), Attr::Str("2".into())),
                ],
                cited: all_before("</citation>"),
            }],
        },
        Item::ToolCall {
            server: false,
            id: "toolu_all".into(),
            name: name_all.clone(),
            args: Args::Json(json!({"all": all})),
        },
        Item::ToolResult {
            id: "toolu_all".into(),
            name: "x".into(),
            content: ClientContent::Text(format!("out {all}")),
        },
        Item::ServerToolResult {
            tag: "server_tool_result".into(),
            id: "s".into(),
            name: Some(name_all.clone()),
            content: ServerContent::Text(all_before("</content-block-server_tool_result>")),
        },
        Item::ContentError(all_before("</content-block-error>")),
        Item::AwaitingFrontendTools(json!([{"tool_use_id": "t", "name": "n", "input": {"all": all}}])),
        Item::MetaFinal(json!({"conversation_history": [all]})),
        Item::Done,
    ];
    run_scenario("adversarial_all", &items, &fragmenting(), &Options::default(), 25);
    run_scenario("adversarial_all_256", &items, &fragmenting(), &budget(256), 26);
}

#[test]
fn one_event_text_blocks() {
    let items = vec![
        top(Format::Xml),
        Item::Text {
            deltas: vec!["Hi </content-block-text> there\n\\n".into()],
            close: true,
            one_event: true,
            citations: vec![],
        },
        Item::Text {
            deltas: vec![],
            close: true,
            one_event: true,
            citations: vec![],
        },
        Item::Thinking {
            deltas: vec![],
            close: true,
        },
        Item::Done,
    ];
    run_scenario("one_event_text", &items, &xml_opts(), &Options::default(), 27);
}

// ------------------------------------------------------ fragmentation count

fn fragmented(input: &[u8]) -> u64 {
    run(&Options::default(), input, &[]).1.fragmented_items
}

#[test]
fn an_xml_item_across_events_and_lines_is_one_fragmented_item() {
    let input = b"data: <meta_init data=\"{&quot;agent_uuid&quot;: \n\ndata: &quot;a&quot;}\"></meta\ndata: _init>\n\ndata: [DONE]\n\n";
    assert_eq!(fragmented(input), 1);
    let whole = b"data: <meta_init data=\"{&quot;agent_uuid&quot;: &quot;a&quot;}\"></meta_init>\n\ndata: [DONE]\n\n";
    assert_eq!(fragmented(whole), 0);
}

#[test]
fn a_text_delta_over_two_data_lines_is_a_fragmented_item() {
    // DESIGN 3.1 counts every item that spans more than one line; deltas
    // are formatter items (DESIGN 3.3).
    let input = b"data: <content-block-text>\n\ndata: hel\ndata: lo\n\ndata: </content-block-text>\n\n";
    let (out, stats) = run(&Options::default(), input, &[]);
    assert!(String::from_utf8_lossy(&out).contains(r#""delta":"hello""#));
    assert_eq!(stats.fragmented_items, 1);
}

#[test]
fn a_raw_json_event_over_two_data_lines_is_a_fragmented_item() {
    let input = b"data: {\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": \"text\", \"text\": \"\"}}\n\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \ndata: \"delta\": {\"type\": \"text_delta\", \"text\": \"hi\"}}\n\ndata: {\"type\": \"content_block_stop\", \"index\": 0}\n\n";
    let (out, stats) = run(&Options::default(), input, &[]);
    assert!(String::from_utf8_lossy(&out).contains(r#""delta":"hi""#));
    assert_eq!(stats.fragmented_items, 1);
}

// ------------------------------------------------- traps pinned by hand

fn translate(input: &[u8]) -> Vec<harness::core::envelopes::GotItem> {
    let (out, _) = run(&Options::default(), input, &[]);
    harness::core::envelopes::group(&harness::core::envelopes::parse(&out).expect("well-formed output"))
}

fn contents(got: &[harness::core::envelopes::GotItem]) -> Vec<(String, String, bool)> {
    got.iter()
        .filter_map(|g| match g {
            harness::core::envelopes::GotItem::Block(b) => {
                Some((b.block.kind.clone(), b.block.content.clone(), b.block.closed))
            }
            harness::core::envelopes::GotItem::Done => None,
        })
        .collect()
}

#[test]
fn another_blocks_closing_tag_ending_a_text_event_is_text() {
    // DESIGN 3.6: only the block's own closing tag, where it ends its event,
    // closes the block.
    let input = b"data: <content-block-text>\n\ndata: see </content-block-thinking>\n\ndata: </content-block-text>\n\n";
    assert_eq!(
        contents(&translate(input)),
        [("text".to_owned(), "see </content-block-thinking>".to_owned(), true)]
    );
}

#[test]
fn a_lone_cr_inside_a_delta_is_content() {
    // DESIGN 3.6 "Raw CR": the double escape leaves a raw CR in the item.
    let input = b"data: <content-block-text>\n\ndata: a\rb\\r\\n\rc\n\ndata: </content-block-text>\n\n";
    assert_eq!(
        contents(&translate(input)),
        [("text".to_owned(), "a\rb\\r\n\rc".to_owned(), true)]
    );
}

#[test]
fn a_delta_ending_in_cr_keeps_its_cr_on_an_lf_framed_stream() {
    // The backend frames with LF, so `x\r\n\n` is the delta `x\r` (DESIGN 4,
    // lossless). The decoder learns the framing from the first line end; a
    // CRLF-framed upstream still has CRLF as its line end.
    let input = b"data: <content-block-text>\n\ndata: x\r\n\ndata: y\n\ndata: </content-block-text>\n\n";
    assert_eq!(
        contents(&translate(input)),
        [("text".to_owned(), "x\ry".to_owned(), true)]
    );
    let crlf = b"data: <content-block-text>\r\n\r\ndata: x\r\n\r\ndata: </content-block-text>\r\n\r\n";
    assert_eq!(contents(&translate(crlf)), [("text".to_owned(), "x".to_owned(), true)]);
}

#[test]
fn an_error_item_inside_an_open_text_block_is_an_error_envelope() {
    // DESIGN 3.6: an event that is exactly one complete item is that item
    // even while a text block is open. The block is not closed by it
    // (DESIGN names only the failure JSON as closing an open block).
    let input = b"data: <content-block-text>\n\ndata: a\n\ndata: <content-block-error><![CDATA[boom]]></content-block-error>\n\ndata: b\n\ndata: </content-block-text>\n\n";
    assert_eq!(
        contents(&translate(input)),
        [
            ("text".to_owned(), "a".to_owned(), false),
            ("error".to_owned(), "boom".to_owned(), true),
            ("text".to_owned(), "b".to_owned(), true),
        ]
    );
}

#[test]
fn a_client_tool_result_answering_a_call_in_the_same_scope_keeps_the_child_open() {
    let items = vec![
        top(Format::Xml),
        spawn("toolu_spawn"),
        child("agent-child", "agent-top"),
        Item::ToolCall {
            server: false,
            id: "toolu_own".into(),
            name: "search".into(),
            args: Args::Empty,
        },
        result("toolu_own", "search", "r"),
        text(&["still the child"]),
        Item::Done,
    ];
    let em = run_scenario("same_scope_result", &items, &xml_opts(), &Options::default(), 30);
    let agents: Vec<String> = em
        .expected
        .iter()
        .filter_map(|e| match e {
            harness::core::emitter::Expect::Block(b) => Some(b.agent.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(agents.last().map(String::as_str), Some("agent-child"));
}
