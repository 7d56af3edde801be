//! Scenario corpus: legacy streams written by the test emitter (DESIGN 3),
//! run through the translator whole and split at random points, compared
//! block by block with the emitter's expectation (DESIGN 4, CONTRACT).

mod harness;

use serde_json::{json, Value};
use sse_gateway::envelope::EnvelopeKind;
use sse_gateway::translate::Options;

use harness::core::emitter::{
    emit, Args, Attr, Citation, ClientContent, EmitOpts, Emitted, Format, Image, Item, MetaInit,
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
    fragmenting_by(0.5, 5)
}

fn fragmenting_by(fragment: f64, max_pieces: usize) -> EmitOpts {
    EmitOpts {
        fragment,
        max_pieces,
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
    Item::MetaInit(MetaInit::new("agent-top", None, format, "q", None))
}

fn text(deltas: &[&str]) -> Item {
    Item::text(deltas.iter().copied(), true, vec![])
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

/// One test a name, in order: the first runs seed `$seed`, each next one the seed after.
macro_rules! random_scenarios {
    ($raw:expr, $seed:expr;) => {};
    ($raw:expr, $seed:expr; $name:ident $($rest:ident)*) => {
        #[test]
        fn $name() {
            random($seed, $raw);
        }
        random_scenarios!($raw, $seed + 1; $($rest)*);
    };
}

random_scenarios! { false, 100;
    random_xml_00 random_xml_01 random_xml_02 random_xml_03 random_xml_04 random_xml_05 random_xml_06
    random_xml_07 random_xml_08 random_xml_09 random_xml_10 random_xml_11 random_xml_12 random_xml_13
    random_xml_14 random_xml_15 random_xml_16 random_xml_17 random_xml_18 random_xml_19 random_xml_20
    random_xml_21 random_xml_22 random_xml_23 random_xml_24 random_xml_25 random_xml_26 random_xml_27
}

random_scenarios! { true, 200;
    random_raw_00 random_raw_01 random_raw_02 random_raw_03 random_raw_04 random_raw_05 random_raw_06
    random_raw_07 random_raw_08 random_raw_09 random_raw_10 random_raw_11 random_raw_12 random_raw_13
    random_raw_14 random_raw_15 random_raw_16 random_raw_17 random_raw_18 random_raw_19
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

/// A run whose `meta_init` carries a 200 KB history (from `seed`), every item fragmented.
fn meta_init_200kb(name: &str, agent: &str, format: Format, query: &str, eo: EmitOpts, opts: &Options, seed: u64) {
    let meta = MetaInit::new(agent, None, format, query, Some(history_200kb(seed)));
    let items = [Item::MetaInit(meta), text(&["ok"]), Item::Done];
    run_scenario(name, &items, &eo, opts, seed);
}

#[test]
fn meta_init_with_200kb_history_xml_fragmented() {
    let (eo, opts) = (fragmenting_by(1.0, 40), Options::default());
    meta_init_200kb(
        "meta_init_200kb_xml",
        "agent-big",
        Format::Xml,
        "summarise <all> & \"everything\"",
        eo,
        &opts,
        1,
    );
}

#[test]
fn meta_init_with_200kb_history_raw_non_ascii_json() {
    let eo = EmitOpts {
        ascii_json: false,
        ..fragmenting_by(1.0, 10)
    };
    meta_init_200kb(
        "meta_init_200kb_raw",
        "agent-big-raw",
        Format::Raw,
        "漢字 😀",
        eo,
        &budget(256),
        2,
    );
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
        Item::call(false, "toolu_big", "cat", Args::Json(json!({"path": "big.txt"}))),
        Item::result("toolu_big", "cat", ClientContent::Text(s)),
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
        Item::call(false, "toolu_rows", "query", Args::Empty),
        Item::result("toolu_rows", "query", ClientContent::Structured(json!({"rows": rows}))),
        Item::Done,
    ];
    run_scenario("tool_result_50kb_json", &items, &fragmenting(), &Options::default(), 4);
}

/// A run of one client tool call with no input, its result `text` and `images`.
fn multimodal_result(id: &str, name: &str, text: &str, images: Vec<Image>) -> Vec<Item> {
    let content = ClientContent::multimodal(text, images);
    vec![
        top(Format::Xml),
        Item::call(false, id, name, Args::Empty),
        Item::result(id, name, content),
        Item::Done,
    ]
}

#[test]
fn multimodal_tool_results_text_then_images_then_final_marker() {
    let images = vec![
        Image::new("https://img.example.com/a.png?x=1&y=\"2\"", "image/png"),
        Image::new("data:image/jpeg;base64,/9j/4AAQSkZJRg==", "image/jpeg"),
    ];
    let text = "Captured 2 images:\nfirst & second <ok> ]]> done\r\n";
    let items = multimodal_result("toolu_shot", "screenshot", text, images);
    run_scenario("multimodal", &items, &fragmenting(), &Options::default(), 5);
    run_scenario("multimodal_256", &items, &fragmenting(), &budget(256), 6);
}

fn all_citations(raw: bool) -> Vec<Citation> {
    let mut rng = Rng::new(7);
    let mut v: Vec<Citation> = (0..3).map(|k| gen::citation(&mut rng, k, raw)).collect();
    // One with an empty optional attribute (omitted) and a long cited text
    // over the budget (sent whole, counted oversize).
    let cited = "long \"quoted\" \\ cited text ".repeat(100);
    v.push(Citation::char_location(
        Attr::Num(1),
        "",
        Attr::Num(0),
        Attr::Num(3000),
        cited,
    ));
    v
}

/// A text block followed by [`all_citations`] in `format`.
fn citations(name: &str, format: Format, eo: &EmitOpts, seed: u64) {
    let cited = Item::text(
        ["According to the docs, ", "it works."],
        true,
        all_citations(format == Format::Raw),
    );
    run_scenario(name, &[top(format), cited, Item::Done], eo, &Options::default(), seed);
}

#[test]
fn citations_of_all_three_kinds_xml() {
    citations("citations_xml", Format::Xml, &fragmenting(), 8);
}

#[test]
fn citations_of_all_three_kinds_raw_follow_the_final_marker() {
    citations("citations_raw", Format::Raw, &xml_opts(), 9);
}

fn spawn(id: &str) -> Item {
    Item::call(false, id, "spawn_subagent", Args::Json(json!({"task": "look it up"})))
}

fn child(agent: &str, parent: &str) -> Item {
    Item::MetaInit(MetaInit::new(agent, Some(parent), Format::Xml, "look it up", None))
}

/// The result of a [`spawn`] call: the subagent's scope ends.
fn spawn_result(id: &str, s: &str) -> Item {
    result(id, "spawn_subagent", s)
}

/// The [`spawn`] call `id` returns `s`, the parent says `parent_text`, the run ends.
fn spawn_returns(id: &str, s: &str, parent_text: &str) -> [Item; 3] {
    [spawn_result(id, s), text(&[parent_text]), Item::Done]
}

fn result(id: &str, name: &str, s: &str) -> Item {
    Item::result(id, name, ClientContent::Text(s.into()))
}

/// The top agent's call `spawn_id` opens the scope of `agent-child`.
fn top_spawns_child(spawn_id: &str) -> Vec<Item> {
    vec![top(Format::Xml), spawn(spawn_id), child("agent-child", "agent-top")]
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
        spawn_result("toolu_spawn1", "child said hi"),
        done_final()[0].clone(),
        Item::Done,
    ];
    run_scenario("subagent_meta_final", &items, &fragmenting(), &Options::default(), 10);
}

#[test]
fn nested_subagents_closed_by_the_parents_tool_result() {
    let mut items = top_spawns_child("toolu_spawn1");
    items.extend([
        Item::thinking(["hmm"], true),
        // A call and result inside the child: the child's own, no close.
        Item::call(false, "toolu_c1", "search", Args::Json(json!({"q": "x"}))),
        result("toolu_c1", "search", "found"),
        text(&["still child"]),
        spawn("toolu_spawn2"),
        child("agent-grandchild", "agent-child"),
        text(&["grandchild"]),
    ]);
    // The top agent's spawn call returns: closes grandchild and child.
    items.extend(spawn_returns("toolu_spawn1", "all done", "top again"));
    run_scenario("subagents_tool_result", &items, &fragmenting(), &Options::default(), 11);
}

#[test]
fn structured_client_tool_results_keep_json_escapes() {
    let items = vec![
        top(Format::Xml),
        Item::call(false, "t1", "run", Args::Json(json!({"cmd": "ls"}))),
        Item::result(
            "t1",
            "run",
            ClientContent::Structured(json!({"stdout": "a\nb\r\nc", "path": "C:\\new", "x": "]]>"})),
        ),
        Item::call(false, "t2", "run", Args::Json(json!({"cmd": "ls"}))),
        Item::result(
            "t2",
            "run",
            ClientContent::Structured(json!(["line1\nline2", {"k": "😀"}])),
        ),
        // A plain string result: `\n` becomes a newline, lossy for a
        // literal backslash-n (DESIGN 3.3).
        Item::call(false, "t3", "run", Args::Json(json!({"cmd": "echo"}))),
        result("t3", "run", "plain\nline and literal \\n and C:\\new\r\nend"),
        Item::Done,
    ];
    run_scenario("structured_results", &items, &fragmenting(), &Options::default(), 12);
}

fn failure() -> Item {
    Item::failure(
        "APIStatusError",
        "overloaded \"529\"",
        "Traceback (most recent call last):\n  File \"agent.py\", line 1",
    )
}

/// The failure JSON while `open`, a block left open, streams.
fn failure_inside(name: &str, format: Format, open: Item, seed: u64) {
    let items = [top(format), open, failure()];
    run_scenario(name, &items, &xml_opts(), &Options::default(), seed);
}

#[test]
fn failure_inside_an_open_text_block_xml() {
    failure_inside(
        "failure_open_text_xml",
        Format::Xml,
        Item::text(["partial ", "answer"], false, vec![]),
        13,
    );
}

#[test]
fn failure_inside_an_open_thinking_block_raw() {
    failure_inside(
        "failure_open_thinking_raw",
        Format::Raw,
        Item::thinking(["let me ", "think"], false),
        14,
    );
}

#[test]
fn failure_inside_an_open_text_block_raw() {
    failure_inside(
        "failure_open_text_raw",
        Format::Raw,
        Item::text(["partial ", "answer"], false, vec![]),
        15,
    );
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
        Item::thinking(["</content-block-text> in thinking", "<", "/"], true),
        Item::Done,
    ];
    run_scenario("tags_in_text", &items, &xml_opts(), &Options::default(), 17);
}

#[test]
fn empty_tool_input_becomes_an_empty_object() {
    for (format, seed) in [(Format::Xml, 18), (Format::Raw, 19)] {
        let items = vec![
            top(format),
            Item::call(false, "toolu_e", "now", Args::Empty),
            result("toolu_e", "now", "12:00"),
            Item::call(true, "srvtoolu_e", "web_search", Args::Empty),
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
    let items = multimodal_result("toolu_img", "render", "here", vec![Image::new(src, "image/png")]);
    run_scenario("huge_image_src", &items, &fragmenting(), &Options::default(), 20);
}

#[test]
fn resumed_run_without_meta_init_uses_the_fallback_agent() {
    let items = vec![
        text(&["resumed"]),
        Item::call(false, "t", "x", Args::Empty),
        result("t", "x", "y"),
        Item::Done,
    ];
    run_scenario("fallback_agent", &items, &xml_opts(), &Options::default(), 21);
}

#[test]
fn resumed_run_subagent_names_the_fallback_agent_as_parent() {
    // DESIGN 3.5/3.6 read together: a meta_init whose parent is the current
    // (fallback) agent opens a child scope even though it is the first.
    let mut items = vec![spawn("toolu_s"), child("agent-child", FALLBACK), text(&["child"])];
    items.extend(spawn_returns("toolu_s", "ok", "parent"));
    run_scenario("fallback_subagent", &items, &xml_opts(), &Options::default(), 22);
}

#[test]
fn every_kind_chunked_at_the_smallest_budget() {
    let mut rng = Rng::new(23);
    let long = |rng: &mut Rng| gen::text(rng, 120);
    let items = vec![
        Item::MetaInit(MetaInit::new(
            "agent-top",
            None,
            Format::Xml,
            &long(&mut rng),
            Some(json!([{"role": "user", "content": long(&mut rng)}])),
        )),
        Item::thinking(
            gen::deltas(&mut rng, 3, "thinking", false)
                .into_iter()
                .map(|d| d.repeat(40))
                .filter(|d| gen::xml_delta_ok(d, "thinking")),
            true,
        ),
        Item::text(vec!["\"\\\u{1}".repeat(200), "😀漢".repeat(100)], true, vec![]),
        Item::call(false, "toolu_1", "search", Args::Json(json!({"q": long(&mut rng)}))),
        result("toolu_1", "search", &gen::client_text(&mut rng, 120)),
        Item::server_text(
            "web_search_tool_result",
            "srvtoolu_1",
            None,
            gen::cdata_text(&mut rng, 120, "</content-block-web_search_tool_result>"),
        ),
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
        Item::server_text("server_tool_result", "s1", None, "a]]>b]]"),
        Item::server_text("web_fetch_tool_result", "s2", None, "<html>&amp; \\n\n</html>]]>"),
        Item::server_text(
            "code_execution_tool_result",
            "s3",
            Some("python"),
            r#"{"stdout": "1\n"}"#,
        ),
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
        Item::thinking(vec![all_no_cr_end.clone()], true),
        Item::text(
            gen::NASTY
                .iter()
                .map(|s| format!("«{s}»"))
                .filter(|d| gen::xml_delta_ok(d, "text")),
            true,
            vec![Citation::page_location(
                Attr::Str("0".into()),
                &attr_all,
                Attr::Str("1".into()),
                Attr::Str("2".into()),
                all_before("</citation>"),
            )],
        ),
        Item::call(false, "toolu_all", &name_all, Args::Json(json!({"all": all}))),
        Item::result("toolu_all", "x", ClientContent::Text(format!("out {all}"))),
        Item::server_text(
            "server_tool_result",
            "s",
            Some(&name_all),
            all_before("</content-block-server_tool_result>"),
        ),
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
        Item::one_event_text(["Hi </content-block-text> there\n\\n"]),
        Item::one_event_text([""; 0]),
        Item::thinking([""; 0], true),
        Item::Done,
    ];
    run_scenario("one_event_text", &items, &xml_opts(), &Options::default(), 27);
}

// ------------------------------------------------------ fragmentation count

fn fragmented(input: &[u8]) -> u64 {
    run(&Options::default(), input, &[]).1.fragmented_items
}

/// `input` translates to a delta `delta` and counts one fragmented item.
fn assert_one_fragmented_item(input: &[u8], delta: &str) {
    let (out, stats) = run(&Options::default(), input, &[]);
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.contains(&format!(r#""delta":"{delta}""#)),
        "no delta {delta:?} in {out}"
    );
    assert_eq!(stats.fragmented_items, 1);
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
    assert_one_fragmented_item(input, "hello");
}

#[test]
fn a_raw_json_event_over_two_data_lines_is_a_fragmented_item() {
    let input = b"data: {\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": \"text\", \"text\": \"\"}}\n\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \ndata: \"delta\": {\"type\": \"text_delta\", \"text\": \"hi\"}}\n\ndata: {\"type\": \"content_block_stop\", \"index\": 0}\n\n";
    assert_one_fragmented_item(input, "hi");
}

// ------------------------------------------------- traps pinned by hand

fn translate(input: &[u8]) -> Vec<harness::core::envelopes::GotItem> {
    let (out, _) = run(&Options::default(), input, &[]);
    harness::core::envelopes::group(&harness::core::envelopes::parse(&out).expect("well-formed output"))
}

/// `input` translates to blocks of these (kind, content, closed).
fn assert_blocks(input: &[u8], expected: &[(&str, &str, bool)]) {
    let expected: Vec<(String, String, bool)> = expected
        .iter()
        .map(|&(k, c, closed)| (k.to_owned(), c.to_owned(), closed))
        .collect();
    assert_eq!(contents(&translate(input)), expected);
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
    assert_blocks(input, &[("text", "see </content-block-thinking>", true)]);
}

#[test]
fn a_lone_cr_inside_a_delta_is_content() {
    // DESIGN 3.6 "Raw CR": the double escape leaves a raw CR in the item.
    let input = b"data: <content-block-text>\n\ndata: a\rb\\r\\n\rc\n\ndata: </content-block-text>\n\n";
    assert_blocks(input, &[("text", "a\rb\\r\n\rc", true)]);
}

#[test]
fn a_delta_ending_in_cr_keeps_its_cr_on_an_lf_framed_stream() {
    // The backend frames with LF, so `x\r\n\n` is the delta `x\r` (DESIGN 4,
    // lossless). The decoder learns the framing from the first line end; a
    // CRLF-framed upstream still has CRLF as its line end.
    let input = b"data: <content-block-text>\n\ndata: x\r\n\ndata: y\n\ndata: </content-block-text>\n\n";
    assert_blocks(input, &[("text", "x\ry", true)]);
    let crlf = b"data: <content-block-text>\r\n\r\ndata: x\r\n\r\ndata: </content-block-text>\r\n\r\n";
    assert_blocks(crlf, &[("text", "x", true)]);
}

#[test]
fn an_error_item_inside_an_open_text_block_is_an_error_envelope() {
    // DESIGN 3.6: an event that is exactly one complete item is that item
    // even while a text block is open. The block is not closed by it
    // (DESIGN names only the failure JSON as closing an open block).
    let input = b"data: <content-block-text>\n\ndata: a\n\ndata: <content-block-error><![CDATA[boom]]></content-block-error>\n\ndata: b\n\ndata: </content-block-text>\n\n";
    assert_blocks(
        input,
        &[("text", "a", false), ("error", "boom", true), ("text", "b", true)],
    );
}

#[test]
fn a_client_tool_result_answering_a_call_in_the_same_scope_keeps_the_child_open() {
    let mut items = top_spawns_child("toolu_spawn");
    items.extend([
        Item::call(false, "toolu_own", "search", Args::Empty),
        result("toolu_own", "search", "r"),
        text(&["still the child"]),
        Item::Done,
    ]);
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
