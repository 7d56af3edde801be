//! End-to-end checks of the pipeline on small hand-written streams; the
//! generated scenarios and fixtures live in `tests/`.

use serde_json::{json, Value};

use super::*;
use crate::envelope::EnvelopeKind;
use crate::sse::Framing;

fn run(opts: Options, input: &str) -> Vec<Value> {
    let (out, _) = translate_all(opts, "fallback", input.as_bytes());
    parse(&out)
}

pub(crate) fn parse(out: &[u8]) -> Vec<Value> {
    let s = std::str::from_utf8(out).expect("output is UTF-8");
    s.split_terminator("\n\n")
        .map(|ev| {
            let data = ev.strip_prefix("data: ").expect("every event is one data line");
            assert!(!data.contains('\n'));
            if data == "[DONE]" {
                json!("[DONE]")
            } else {
                serde_json::from_str(data).expect("every envelope is JSON")
            }
        })
        .collect()
}

/// Blocks as (type, agent, joined delta, finals), merging consecutive
/// envelopes of the same type and agent up to a final one.
fn blocks(envs: &[Value]) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = Vec::new();
    let mut open = false;
    for e in envs {
        if e == "[DONE]" {
            out.push(("[DONE]".into(), String::new(), String::new()));
            open = false;
            continue;
        }
        let (t, a, d) = (
            e["type"].as_str().unwrap().to_owned(),
            e["agent"].as_str().unwrap().to_owned(),
            e["delta"].as_str().unwrap().to_owned(),
        );
        match out.last_mut() {
            Some(last) if open && last.0 == t && last.1 == a => last.2.push_str(&d),
            _ => out.push((t, a, d)),
        }
        open = e["final"] == false;
    }
    out
}

fn b(t: &str, a: &str, d: &str) -> (String, String, String) {
    (t.into(), a.into(), d.into())
}

/// Translates at every split point and checks the output never changes.
fn split_invariant(input: &str) -> Vec<u8> {
    let bytes = input.as_bytes();
    let (whole, _) = translate_all(Options::default(), "fallback", bytes);
    for i in 0..=bytes.len() {
        let mut t = Translator::new(Options::default(), "fallback");
        let mut out = Vec::new();
        t.feed(&bytes[..i], &mut out);
        t.feed(&bytes[i..], &mut out);
        t.finish(&mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&whole),
            "split at {i}"
        );
    }
    whole
}

/// The envelopes of `input` translated with the default options, checked the same at every split point.
fn run_split(input: &str) -> Vec<Value> {
    parse(&split_invariant(input))
}

/// Each field of `want` (a JSON object) has that value in the envelope `env`.
fn assert_fields(env: &Value, want: Value) {
    for (k, v) in want.as_object().expect("an object of fields") {
        assert_eq!(&env[k], v, "{k} of {env}");
    }
}

/// Each envelope's type, with `field` of it.
fn types_with<'a, T>(envs: &'a [Value], field: impl Fn(&'a Value) -> T) -> Vec<(&'a str, T)> {
    envs.iter().map(|e| (e["type"].as_str().unwrap(), field(e))).collect()
}

const META: &str = r#"data: <meta_init data="{&quot;format&quot;: &quot;xml&quot;, &quot;agent_uuid&quot;: &quot;A&quot;, &quot;parent_agent_uuid&quot;: null}"></meta_init>"#;

#[test]
fn a_text_block_streams_its_deltas_and_closes_with_an_empty_final() {
    let input = format!(
        "{META}\n\ndata: <content-block-text>\n\ndata: Hel\n\ndata: lo\\nworld \\\\n\n\ndata: </content-block-text>\n\ndata: [DONE]\n\n"
    );
    let envs = run_split(&input);
    assert_fields(&envs[0], json!({"type": "meta_init", "agent": "A"}));
    let meta: Value = serde_json::from_str(envs[0]["delta"].as_str().unwrap()).unwrap();
    assert_eq!(meta["format"], "json");
    assert_eq!(envs[1], json!({"type":"text","agent":"A","final":false,"delta":"Hel"}));
    assert_eq!(envs[2]["delta"], "lo\nworld \\n");
    assert_eq!(envs[3], json!({"type":"text","agent":"A","final":true,"delta":""}));
    assert_eq!(envs[4], "[DONE]");
}

#[test]
fn the_meta_init_rewrite_changes_only_the_top_level_format_and_writes_native_json() {
    let input = r#"data: <meta_init data="{ &quot;agent_uuid&quot;:&quot;A&quot;,  &quot;format&quot; : &quot;xml&quot; , &quot;h&quot;:[1, {&quot;format&quot;:&quot;xml&quot;}] }"></meta_init>

"#;
    let envs = run(Options::default(), input);
    // Written as `json.dumps(v, ensure_ascii=False)` (DESIGN 4): Python's separators, key order kept.
    assert_eq!(
        envs[0]["delta"],
        r#"{"agent_uuid": "A", "format": "json", "h": [1, {"format": "xml"}]}"#
    );
    let kept = run(
        Options {
            rewrite_format: false,
            ..Options::default()
        },
        input,
    );
    assert_eq!(
        kept[0]["delta"],
        r#"{"agent_uuid": "A", "format": "xml", "h": [1, {"format": "xml"}]}"#
    );
}

#[test]
fn a_text_delta_goes_out_when_its_event_completes() {
    let mut t = Translator::new(Options::default(), "f");
    let mut out = Vec::new();
    t.feed(b"data: <content-block-text>\n\ndata: <chart>a < b & c\n", &mut out);
    assert!(parse(&out).is_empty());
    t.feed(b"\n", &mut out);
    assert_eq!(parse(&out)[0]["delta"], "<chart>a < b & c");
}

#[test]
fn a_close_tag_counts_only_where_it_ends_its_event() {
    let input = "data: <content-block-text>\n\ndata: say </content-block-text> now\n\ndata: </content-block-text>\n\n";
    let envs = run(Options::default(), input);
    assert_eq!(blocks(&envs), [b("text", "fallback", "say </content-block-text> now")]);
    // Split across events, the close tag still closes.
    let input = "data: <content-block-text>x</conte\n\ndata: nt-block-text>\n\n";
    assert_eq!(blocks(&run_split(input)), [b("text", "fallback", "x")]);
}

#[test]
fn tool_calls_unescape_arguments_and_empty_input_becomes_an_object() {
    let input = r#"data: <content-block-tool_call id="t1" name="search" arguments="{&quot;q&quot;: &quot;a\\nb&quot;}"></content-block-tool_call>

data: <content-block-tool_call id="t2" name="now" arguments="&quot;&quot;"></content-block-tool_call>

"#;
    let envs = run_split(input);
    assert_eq!(
        envs[0],
        json!({"type":"tool_call","agent":"fallback","final":true,"delta":"{\"q\": \"a\\nb\"}","id":"t1","name":"search"})
    );
    assert_eq!(envs[1]["delta"], "{}");
}

#[test]
fn client_tool_results_join_cdata_sections_and_unescape_newlines_only() {
    let input = "data: <content-block-tool_result id=\"t1\" name=\"f\"><![CDATA[a]]]]><![CDATA[>b\\nC:\\dir]]></content-block-tool_result>\n\n";
    let envs = run_split(input);
    assert_eq!(blocks(&envs), [b("tool_result", "fallback", "a]]>b\nC:\\dir")]);
    assert_fields(&envs[0], json!({"final": true, "id": "t1"}));
    // Structured results keep their JSON escapes.
    let input = "data: <content-block-tool_result id=\"t\" name=\"f\"><![CDATA[{\"a\": \"x\\ny\"}]]></content-block-tool_result>\n\n";
    assert_eq!(run(Options::default(), input)[0]["delta"], "{\"a\": \"x\\ny\"}");
}

#[test]
fn server_results_end_at_the_cdata_end_that_ends_the_event() {
    let input = "data: <content-block-server_tool_result id=\"s\" name=\"web\"><![CDATA[x]]></content-block-server_tool_result>y\\\\]]></content-block-server_tool_result>\n\n";
    assert_eq!(
        blocks(&run_split(input)),
        [b(
            "server_tool_result",
            "fallback",
            "x]]></content-block-server_tool_result>y\\"
        )]
    );
    let input = "data: <content-block-code_execution_tool_result id=\"c\"><![CDATA[ok]]></content-block-code_execution_tool_result>\n\n";
    let envs = run(Options::default(), input);
    assert_eq!(envs[0]["name"], "code_execution_tool_result");
}

#[test]
fn multimodal_results_send_text_images_and_a_final_marker() {
    let input = "data: <content-block-tool_result id=\"t\" name=\"shot\"><text><![CDATA[see\\n]]></text><image src=\"data:image/png;base64,AA==\" media_type=\"image/png\" /></content-block-tool_result>\n\n";
    let envs = run_split(input);
    let kinds = types_with(&envs, |e| e["final"].as_bool().unwrap());
    assert_eq!(
        kinds,
        [
            ("tool_result", false),
            ("tool_result_image", false),
            ("tool_result", true)
        ]
    );
    assert_eq!(envs[0]["delta"], "see\n");
    assert_eq!(envs[1]["src"], "data:image/png;base64,AA==");
    assert_eq!(envs[2]["delta"], "");
}

#[test]
fn citations_become_one_envelope_each_with_numbers_and_the_last_final() {
    let input = "data: <citations><citation type=\"char_location\" document_index=\"0\" document_title=\"\" start_char_index=\"3\" end_char_index=\"9\"><![CDATA[cited]]></citation><citation type=\"web_search_result_location\" url=\"https://x\" title=\"T\"><![CDATA[w]]></citation></citations>\n\n";
    let envs = run_split(input);
    assert_eq!(
        envs[0],
        json!({"type":"citation","agent":"fallback","final":false,"delta":"cited","citation_type":"char_location","document_index":0,"start_char_index":3,"end_char_index":9})
    );
    assert_fields(&envs[1], json!({"final": true, "url": "https://x"}));
}

#[test]
fn a_failure_inside_an_open_block_closes_it_and_becomes_an_error() {
    let input = "data: <content-block-text>\n\ndata: partial\n\ndata: {\"error\": \"RuntimeError\", \"message\": \"boom\", \"traceback\": \"tb\"}\n\n";
    assert_eq!(
        blocks(&run_split(input)),
        [
            b("text", "fallback", "partial"),
            b("error", "fallback", r#"{"error":"RuntimeError","message":"boom"}"#)
        ]
    );
    // The same shape followed by more text was text.
    let input = "data: <content-block-text>\n\ndata: {\"error\": \"E\", \"message\": \"m\"}\n\ndata: !\n\ndata: </content-block-text>\n\n";
    assert_eq!(
        blocks(&run(Options::default(), input)),
        [b("text", "fallback", "{\"error\": \"E\", \"message\": \"m\"}!")]
    );
}

#[test]
fn an_error_item_inside_an_open_block_is_an_error_and_done_is_text() {
    let envs = run_split("data: <content-block-text>\n\ndata: a\n\ndata: <content-block-error><![CDATA[bad\\nthing]]></content-block-error>\n\ndata: [DONE]\n\ndata: </content-block-text>\n\n");
    assert_eq!(
        envs[1],
        json!({"type":"error","agent":"fallback","final":true,"delta":"bad\nthing"})
    );
    assert_eq!(envs[2]["delta"], "[DONE]");
    assert_eq!(envs[3]["final"], true);
}

#[test]
fn subagents_get_their_own_agent_until_the_parent_call_returns() {
    let input = format!(
        "{META}\n\n\
data: <content-block-tool_call id=\"spawn\" name=\"spawn_subagent\" arguments=\"{{}}\"></content-block-tool_call>\n\n\
data: <meta_init data=\"{{&quot;agent_uuid&quot;: &quot;B&quot;, &quot;parent_agent_uuid&quot;: &quot;A&quot;}}\"></meta_init>\n\n\
data: <content-block-text>hi</content-block-text>\n\n\
data: <content-block-tool_result id=\"spawn\" name=\"spawn_subagent\"><![CDATA[done]]></content-block-tool_result>\n\n"
    );
    let envs = run(Options::default(), &input);
    let agents = types_with(&envs, |e| e["agent"].as_str().unwrap());
    assert_eq!(
        agents,
        [
            ("meta_init", "A"),
            ("tool_call", "A"),
            ("meta_init", "B"),
            ("text", "B"),
            ("text", "B"),
            ("tool_result", "A")
        ]
    );
}

#[test]
fn raw_dialect_events_translate_like_the_json_formatter() {
    let input = r#"data: <meta_init data="{&quot;format&quot;: &quot;raw&quot;, &quot;agent_uuid&quot;: &quot;A&quot;}"></meta_init>

data: {"type":"message_start","message":{}}

data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi\n"}}

data: {"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{"type":"page_location","cited_text":"c","document_index":1,"start_page_number":2,"end_page_number":3,"document_title":null}}}

data: {"type":"content_block_stop","index":0}

data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}

data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}

data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}

data: {"type":"content_block_stop","index":1}

data: {"type":"content_block_start","index":2,"content_block":{"type":"web_search_tool_result","tool_use_id":"s","content":[{"url":"u"}]}}

data: {"type":"content_block_stop","index":2}

data: {"type":"message_stop"}

data: [DONE]

"#;
    let envs = run_split(input);
    let got: Vec<_> = envs.iter().skip(1).cloned().collect();
    assert_eq!(got[0], json!({"type":"text","agent":"A","final":false,"delta":"Hi\n"}));
    assert_eq!(got[1]["final"], true);
    assert_eq!(
        got[2],
        json!({"type":"citation","agent":"A","final":true,"delta":"c","citation_type":"page_location","document_index":1,"start_page_number":2,"end_page_number":3})
    );
    assert_eq!(
        got[3],
        json!({"type":"tool_call","agent":"A","final":true,"delta":"{\"a\": 1}","id":"t","name":"f"})
    );
    assert_fields(
        &got[4],
        json!({"type": "server_tool_result", "delta": "[{\"url\": \"u\"}]", "name": "web_search_tool_result"}),
    );
    assert_eq!(got[5], "[DONE]");
}

#[test]
fn bad_input_yields_error_envelopes_and_the_stream_goes_on() {
    let input = "data: <!DOCTYPE x [<!ENTITY e \"boom\">]>\n\ndata: <meta_final data=\"&e;\"></meta_final>\n\ndata: hello\n\ndata: <content-block-text>ok</content-block-text>\n\n";
    let (out, stats) = translate_all(Options::default(), "f", input.as_bytes());
    let envs = parse(&out);
    let kinds: Vec<_> = envs
        .iter()
        .map(|e| {
            if e["type"] == "error" {
                let d: Value = serde_json::from_str(e["delta"].as_str().unwrap()).unwrap();
                format!("error:{}", d["kind"].as_str().unwrap())
            } else {
                e["type"].as_str().unwrap().to_owned()
            }
        })
        .collect();
    assert_eq!(
        kinds,
        ["error:entity", "error:entity", "error:unexpected", "text", "text"]
    );
    assert_eq!(stats.total_parse_errors(), 3);
}

#[test]
fn an_unterminated_cdata_at_end_of_input_is_flushed_then_reported() {
    let input = "data: <content-block-server_tool_result id=\"s\"><![CDATA[abc\n\n";
    let envs = run(Options::default(), input);
    assert_eq!(envs[0]["delta"], "abc");
    assert_eq!(envs[1]["type"], "error");
    assert!(envs[1]["delta"].as_str().unwrap().contains("truncated"));
}

#[test]
fn every_line_stays_within_the_budget() {
    let delta = "\"\\\u{1}😀".repeat(500);
    let escaped = delta.replace('\\', "\\\\");
    let input = format!("data: <content-block-text>\n\ndata: {escaped}\n\ndata: </content-block-text>\n\n");
    let opts = Options {
        budget: 256,
        ..Options::default()
    };
    let (out, stats) = translate_all(opts, "f", input.as_bytes());
    for line in std::str::from_utf8(&out).unwrap().split_terminator("\n\n") {
        assert!(line.len() - 6 <= 256, "{}", line.len());
    }
    assert_eq!(blocks(&parse(&out)), [b("text", "f", &delta)]);
    assert_eq!(stats.oversize, 0);
    assert!(stats.envelopes_of(EnvelopeKind::Text) > 10);
}

#[test]
fn a_client_result_too_large_to_sniff_is_judged_by_its_prefix() {
    let opts = Options {
        json_sniff_bytes: 64,
        ..Options::default()
    };
    // Starts like JSON: kept as it stands, `\n` escapes included.
    let json = format!("{{\"k\": \"{}\\n\"}}", "x".repeat(200));
    let input = format!(
        "data: <content-block-tool_result id=\"t\" name=\"f\"><![CDATA[{json}]]></content-block-tool_result>\n\n"
    );
    assert_eq!(
        blocks(&run(opts.clone(), &input)),
        [b("tool_result", "fallback", &json)]
    );
    // Starts like text: `\n` becomes a newline throughout.
    let text = format!("{}\\nend", "y".repeat(200));
    let input = format!(
        "data: <content-block-tool_result id=\"t\" name=\"f\"><![CDATA[{text}]]></content-block-tool_result>\n\n"
    );
    let want = format!("{}\nend", "y".repeat(200));
    assert_eq!(blocks(&run(opts, &input)), [b("tool_result", "fallback", &want)]);
}

#[test]
fn multimodal_text_that_is_json_keeps_its_escapes() {
    let input = "data: <content-block-tool_result id=\"t\" name=\"f\"><text><![CDATA[[\"a\\nb\"]]]></text></content-block-tool_result>\n\n";
    let envs = run(Options::default(), input);
    assert_eq!(envs[0]["delta"], "[\"a\\nb\"]");
    assert_eq!(
        envs[1],
        json!({"type":"tool_result","agent":"fallback","final":true,"delta":"","id":"t","name":"f"})
    );
}

#[test]
fn the_old_dialect_recovers_raw_newlines_in_deltas() {
    let opts = Options {
        framing: Framing::UnescapedNewlines,
        ..Options::default()
    };
    let input = "data: <content-block-text>\n\ndata: one\ntwo\n\n\nthree\n\ndata: </content-block-text>\n\n";
    assert_eq!(
        blocks(&run(opts, input)),
        [b("text", "fallback", "one\ntwo\n\n\nthree")]
    );
    // The default dialect ignores the unprefixed lines, as any SSE parser would.
    assert_eq!(blocks(&run(Options::default(), input)), [b("text", "fallback", "one")]);
}

#[test]
fn data_lines_join_with_nothing_by_default_and_lf_when_configured() {
    let input = "data: <content-block-text>\n\ndata: ab\ndata: cd\n\ndata: </content-block-text>\n\n";
    assert_eq!(blocks(&run(Options::default(), input)), [b("text", "fallback", "abcd")]);
    let opts = Options {
        data_join: DataJoin::Newline,
        ..Options::default()
    };
    assert_eq!(blocks(&run(opts, input)), [b("text", "fallback", "ab\ncd")]);
}

#[test]
fn an_item_split_over_events_and_lines_is_counted_as_fragmented() {
    let input = "data: <content-block-tool_result id=\"t\" na\ndata: me=\"f\"><![CDATA[ab\n\ndata: c]]></content-block-tool_result>\n\ndata: <content-block-error><![CDATA[e]]></content-block-error>\n\n";
    let (out, stats) = translate_all(Options::default(), "f", input.as_bytes());
    assert_eq!(blocks(&parse(&out))[0], b("tool_result", "f", "abc"));
    assert_eq!((stats.items, stats.fragmented_items), (2, 1));
}

#[test]
fn a_never_closing_tag_is_bounded_and_reported_once() {
    let opts = Options {
        max_item_bytes: 4096,
        ..Options::default()
    };
    let mut t = Translator::new(opts, "f");
    let mut out = Vec::new();
    t.feed(b"data: <meta_init data=\"", &mut out);
    let chunk = vec![b'x'; 1024];
    for _ in 0..1024 {
        t.feed(&chunk, &mut out);
        assert!(t.buffered_bytes() < 64 << 10, "{}", t.buffered_bytes());
    }
    t.feed(b"\n\ndata: <content-block-text>ok</content-block-text>\n\n", &mut out);
    t.finish(&mut out);
    let envs = parse(&out);
    assert_eq!(envs.len(), 3, "{envs:?}");
    assert!(envs[0]["delta"].as_str().unwrap().contains("item_too_large"));
    assert_eq!(blocks(&envs[1..]), [b("text", "f", "ok")]);
}

/// Found by fuzzing: the old dialect discards an unfinished event under a
/// partly scanned tag.
#[test]
fn fuzz_regression_discarded_event_under_a_partial_tag() {
    let opts = Options {
        framing: Framing::UnescapedNewlines,
        ..Options::default()
    };
    let input = b"data:<\n\ndata:u";
    for i in 0..=input.len() {
        let mut t = Translator::new(opts.clone(), "f");
        let mut out = Vec::new();
        t.feed(&input[..i], &mut out);
        t.feed(&input[i..], &mut out);
        t.finish(&mut out);
        let envs = parse(&out);
        assert_eq!(envs.len(), 1, "{envs:?}");
        assert!(envs[0]["delta"].as_str().unwrap().contains("truncated"));
    }
}

/// Found by fuzzing: an event inside a text block that looks like one whole
/// item but does not parse to its end must not leave a partial tag behind.
#[test]
fn fuzz_regression_an_unfinished_interrupting_item_is_reported_and_the_block_goes_on() {
    let input = "data: <content-block-text>\n\ndata: a\n\ndata: <meta_init data=x}\"></meta_init>\n\ndata: b\n\ndata: <content-block-tool_result id=\"t\" name=\"n\"><![CDATA[r]]></content-block-tool_result>\n\ndata: </content-block-text>\n\n";
    let envs = run_split(input);
    let kinds: Vec<_> = envs.iter().map(|e| e["type"].as_str().unwrap().to_owned()).collect();
    assert_eq!(kinds, ["text", "error", "text", "tool_result", "text"], "{envs:?}");
    assert!(envs[1]["delta"]
        .as_str()
        .unwrap()
        .contains("did not end with its event"));
    assert_eq!(envs[3]["name"], "n");
}

#[test]
fn bounded_feeding_stops_at_the_limit_and_gives_the_same_output() {
    let mut input = META.to_owned() + "\n\ndata: <content-block-text>\n\n";
    for i in 0..3000 {
        input.push_str(&format!("data: d{i}\n\n"));
    }
    input.push_str("data: </content-block-text>\n\ndata: [DONE]\n\n");
    let (whole, _) = translate_all(Options::default(), "f", input.as_bytes());
    let mut t = Translator::new(Options::default(), "f");
    let (mut out, mut rest, mut rounds) = (Vec::new(), input.as_bytes(), 0);
    let limit = 8 << 10;
    while !rest.is_empty() {
        let mut piece = Vec::new();
        let taken = t.feed_bounded(rest, &mut piece, limit);
        assert!(taken > 0);
        // One step of input past the limit at most: 4 KiB of one-byte deltas is ~500 small envelopes.
        assert!(
            piece.len() < limit + 64 * FEED_STEP,
            "{} bytes for one read",
            piece.len()
        );
        out.extend_from_slice(&piece);
        rest = &rest[taken..];
        rounds += 1;
    }
    t.finish(&mut out);
    assert!(rounds > 3, "the limit never stopped a read");
    assert_eq!(out, whole);
}

#[test]
fn an_upstream_agent_id_that_is_no_identifier_is_reported_and_never_repeated() {
    let huge = "a".repeat(60_000);
    let mut input = format!(
        "data: <meta_init data=\"{{&quot;format&quot;: &quot;xml&quot;, &quot;agent_uuid&quot;: &quot;{huge}&quot;}}\"></meta_init>\n\ndata: <content-block-text>\n\n"
    );
    for _ in 0..2000 {
        input.push_str("data: x\n\n");
    }
    input.push_str("data: </content-block-text>\n\ndata: [DONE]\n\n");
    let (out, stats) = translate_all(Options::default(), "fallback", input.as_bytes());
    let envs = parse(&out);
    assert_eq!(stats.parse_errors[ParseErrorKind::InvalidId as usize], 1);
    let error = envs.iter().find(|e| e["type"] == "error").expect("an error envelope");
    assert!(error["delta"].as_str().unwrap().contains("invalid_id"));
    // Every envelope goes on under the fallback agent; only meta_init's own delta holds the id (cut natively).
    for e in envs.iter().filter(|e| e.is_object()) {
        assert_eq!(e["agent"], "fallback");
    }
    let lines: Vec<&[u8]> = out.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
    let text_lines = lines.iter().filter(|l| l.starts_with(br#"data: {"type":"text""#));
    assert_eq!(text_lines.clone().count(), 2001);
    assert!(text_lines.into_iter().all(|l| l.len() < 100));
    // The id once (in meta_init), not once per envelope (that would be 120 MB).
    assert!(out.len() < 60_000 + 2001 * 100, "output {} bytes", out.len());
}

#[test]
fn long_or_unsafe_tool_ids_and_names_are_reported_and_replaced_by_empty() {
    let long = "t".repeat(ids_max() + 1);
    let input = format!(
        "data: <content-block-tool_call id=\"{long}\" name=\"a\tb\" arguments=\"{{}}\"></content-block-tool_call>\n\n\
         data: <content-block-tool_result id=\"{long}\" name=\"ok\"><![CDATA[r]]></content-block-tool_result>\n\n\
         data: <content-block-{long}_tool_result id=\"s1\"><![CDATA[r]]></content-block-{long}_tool_result>\n\n\
         data: [DONE]\n\n"
    );
    let (out, stats) = translate_all(Options::default(), "f", input.as_bytes());
    let envs = parse(&out);
    assert_eq!(stats.parse_errors[ParseErrorKind::InvalidId as usize], 4);
    let call = envs.iter().find(|e| e["type"] == "tool_call").unwrap();
    assert_eq!((&call["id"], &call["name"]), (&json!(""), &json!("")));
    let result = envs.iter().find(|e| e["type"] == "tool_result").unwrap();
    assert_eq!(
        (&result["id"], &result["name"], &result["delta"]),
        (&json!(""), &json!("ok"), &json!("r"))
    );
    let server = envs.iter().find(|e| e["type"] == "server_tool_result").unwrap();
    assert_eq!((&server["id"], &server["name"]), (&json!("s1"), &json!("")));
}

fn ids_max() -> usize {
    crate::envelope::ids::MAX_ID_BYTES
}
