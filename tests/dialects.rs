//! The dialects `cogency` and `agent_sdk` (DESIGN 3.7, issue 29) through the translator: every fixture recorded
//! from the real packages translates to its expected blocks, under `auto` and under its own dialect, at any split
//! of its bytes and any budget, with every line within budget; an event that is not the dialect's gets one counted
//! `error` envelope wherever it stands and the run goes on; `auto` refuses a stream whose first event is JSON no
//! dialect sends.

mod harness;

use harness::blocks::{compare, ends_done, expected, input, names, reassemble};
use harness::core::envelopes::{check_budget, parse, run, Out, FALLBACK};
use proptest::prelude::*;
use serde_json::Value;
use sse_gateway::translate::{translate_all, Dialect, Options, ParseErrorKind, StreamEnd, Translator};

fn opts(dialect: Dialect) -> Options {
    Options {
        dialect,
        ..Options::default()
    }
}

/// The dialects a fixture is read under: `fixed_<dialect>_` fixtures under that dialect alone, the dialects' own
/// under `auto` and their dialect, the streams of no dialect under `auto`.
fn readings(name: &str) -> Vec<Dialect> {
    if name.starts_with("fixed_cogency_") {
        vec![Dialect::Cogency]
    } else if name.starts_with("fixed_agent_sdk_") {
        vec![Dialect::AgentSdk]
    } else if name.starts_with("cogency") || name == "other_truncated_cogency" {
        vec![Dialect::Auto, Dialect::Cogency]
    } else if name.starts_with("agent_sdk") || name == "other_truncated_agent_sdk" {
        vec![Dialect::Auto, Dialect::AgentSdk]
    } else {
        vec![Dialect::Auto]
    }
}

/// Envelopes of a translated stream, `[DONE]` as the string.
fn envelopes(outs: &[Out]) -> Vec<Value> {
    outs.iter()
        .map(|o| match o {
            Out::Done => Value::from("[DONE]"),
            Out::Env(e) => serde_json::from_str(&e.json).expect("envelope JSON"),
        })
        .collect()
}

/// Checks one translation of fixture `name` against `want`: blocks, `[DONE]` exactly when the run ended, budget.
fn check(name: &str, input: &[u8], out: &[u8], want: &[Value], budget: usize) -> Result<(), String> {
    let outs = parse(out).map_err(|e| format!("{name}: {e}"))?;
    check_budget(&outs, budget).map_err(|e| format!("{name}: {e}"))?;
    let envs = envelopes(&outs);
    let (got, done) = reassemble(&envs);
    let root = got
        .first()
        .and_then(|g| g["agent"].as_str())
        .unwrap_or(FALLBACK)
        .to_owned();
    compare(name, &got, want, &root)?;
    // A run ends as its dialect ends one, or with the backend's own `[DONE]`.
    let want_done = ends_done(want) || input.ends_with(b"data: [DONE]\n\n");
    if done != want_done {
        return Err(format!("{name}: [DONE] last: {done}, expected {want_done}"));
    }
    Ok(())
}

#[test]
fn every_fixture_translates_to_its_expected_blocks() {
    for name in names() {
        let input = input(&name);
        let want = expected(&name);
        for dialect in readings(&name) {
            let (out, _) = translate_all(opts(dialect), FALLBACK, &input);
            if let Err(e) = check(&name, &input, &out, &want, opts(dialect).budget) {
                panic!("under {}: {e}", dialect.as_str());
            }
        }
    }
}

#[test]
fn every_fixture_translates_the_same_fed_byte_by_byte() {
    for name in names() {
        let input = input(&name);
        for dialect in readings(&name) {
            let whole = translate_all(opts(dialect), FALLBACK, &input).0;
            let bytewise = harness::core::envelopes::run_bytewise(&opts(dialect), &input);
            assert!(
                whole == bytewise,
                "{name} under {}: byte-by-byte output differs",
                dialect.as_str()
            );
        }
    }
}

#[test]
fn small_budgets_cut_the_blocks_but_not_their_content() {
    for budget in [256, 300, 512] {
        for name in names() {
            let input = input(&name);
            let dialect = readings(&name)[0];
            let want = expected(&name);
            let o = Options {
                budget,
                ..opts(dialect)
            };
            let (out, _) = translate_all(o, FALLBACK, &input);
            if let Err(e) = check(&name, &input, &out, &want, budget) {
                panic!("budget {budget}: {e}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// DESIGN 2 for the dialects: any split of the input gives the same output.
    #[test]
    fn any_split_gives_the_same_output(pick in any::<prop::sample::Index>(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12)) {
        let names = names();
        let name = &names[pick.index(names.len())];
        let input = input(name);
        for dialect in readings(name) {
            let whole = translate_all(opts(dialect), FALLBACK, &input).0;
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
            at.sort_unstable();
            let (split, _) = run(&opts(dialect), &input, &at);
            prop_assert!(whole == split, "{} under {} cut at {:?}", name, dialect.as_str(), at);
        }
    }
}

/// Counts of a translation's parse errors, with the output.
fn translate(dialect: Dialect, input: &[u8]) -> (Vec<Value>, sse_gateway::translate::Stats, StreamEnd) {
    let mut t = Translator::new(opts(dialect), FALLBACK);
    let mut out = Vec::new();
    t.feed(input, &mut out);
    let end = t.finish(&mut out);
    let envs = envelopes(&parse(&out).expect("output parses"));
    (envs, t.observer().clone(), end)
}

fn errors(envs: &[Value]) -> Vec<&Value> {
    envs.iter().filter(|e| e["type"] == "error").collect()
}

#[test]
fn a_json_line_of_another_shape_mid_stream_is_skipped_and_the_run_goes_on() {
    let input = concat!(
        "data: {\"type\": \"user\", \"content\": \"hi\", \"timestamp\": 1}\n\n",
        "data: {\"type\": \"respond\", \"content\": \"a\", \"timestamp\": 2}\n\n",
        "data: {\"kind\": \"no type\"}\n\n",
        "data: [1, 2]\n\n",
        "data: {\"type\": \"respond\", \"content\": \"cut\n\n",
        "data: {\"type\": \"respond\", \"content\": \"b\", \"timestamp\": 3}\n\n",
        "data: {\"type\": \"end\", \"timestamp\": 4}\n\n",
    );
    let (envs, stats, end) = translate(Dialect::Cogency, input.as_bytes());
    assert_eq!(errors(&envs).len(), 3, "{envs:#?}");
    assert_eq!(stats.parse_errors_of(ParseErrorKind::InvalidJson), 1);
    assert_eq!(stats.parse_errors_of(ParseErrorKind::Unexpected), 2);
    let text: String = envs
        .iter()
        .filter(|e| e["type"] == "text")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "ab");
    assert_eq!(end, StreamEnd::Done);
    assert_eq!(envs.last(), Some(&Value::from("[DONE]")));
}

#[test]
fn an_event_over_max_item_bytes_is_one_counted_error_and_the_stream_ends_cleanly() {
    for dialect in [Dialect::Cogency, Dialect::AgentSdk, Dialect::Auto] {
        let o = Options {
            max_item_bytes: 1 << 20,
            ..opts(dialect)
        };
        let mut t = Translator::new(o, FALLBACK);
        let mut out = Vec::new();
        let first = match dialect {
            Dialect::AgentSdk => "data: {\"type\":\"system\",\"subtype\":\"init\",\"session_id\":\"s-1\"}\n\n",
            _ => "data: {\"type\": \"user\", \"content\": \"hi\", \"timestamp\": 1}\n\n",
        };
        t.feed(first.as_bytes(), &mut out);
        t.feed(b"data: {\"type\": \"respond\", \"content\": \"", &mut out);
        // 100 MB in 1 MiB pieces: the translator holds at most about max_item_bytes of it.
        let piece = vec![b'x'; 1 << 20];
        let mut held = 0;
        for _ in 0..100 {
            t.feed(&piece, &mut out);
            held = held.max(t.buffered_bytes());
        }
        t.feed(b"\"}\n\n", &mut out);
        t.finish(&mut out);
        assert!(held < 3 << 20, "{}: held {held} bytes", dialect.as_str());
        let envs = envelopes(&parse(&out).expect("output parses"));
        assert_eq!(errors(&envs).len(), 1, "{}: {envs:#?}", dialect.as_str());
        assert_eq!(t.observer().parse_errors_of(ParseErrorKind::ItemTooLarge), 1);
        assert!(out.len() < 4096, "{}: {} bytes out", dialect.as_str(), out.len());
    }
}

#[test]
fn a_stream_cut_before_its_end_gets_no_meta_final_and_no_done() {
    let input = concat!(
        "data: {\"type\": \"user\", \"content\": \"hi\", \"timestamp\": 1}\n\n",
        "data: {\"type\": \"respond\", \"content\": \"a\", \"timestamp\": 2}\n\n",
    );
    let (envs, _, end) = translate(Dialect::Auto, input.as_bytes());
    assert_eq!(end, StreamEnd::Cut);
    assert!(
        !envs.iter().any(|e| e["type"] == "meta_final" || e == "[DONE]"),
        "{envs:#?}"
    );
    // The daemon requires an end: the cut is said.
    let o = Options {
        require_done: true,
        ..opts(Dialect::Auto)
    };
    let (out, _) = translate_all(o, FALLBACK, input.as_bytes());
    let envs = envelopes(&parse(&out).unwrap());
    let last = envs.last().unwrap();
    assert_eq!(last["type"], "error");
    assert!(last["delta"].as_str().unwrap().contains("upstream_error"), "{last}");
}

#[test]
fn an_upstream_failure_closes_the_open_block_before_its_error() {
    for (dialect, input) in [
        (Dialect::Cogency, "data: {\"type\": \"respond\", \"content\": \"par\", \"timestamp\": 2}\n\n"),
        (
            Dialect::AgentSdk,
            "data: {\"type\":\"stream_event\",\"event\":{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"par\"}}}\n\n",
        ),
    ] {
        let mut t = Translator::new(opts(dialect), FALLBACK);
        let mut out = Vec::new();
        t.feed(input.as_bytes(), &mut out);
        t.abort("upstream reset", &mut out);
        let envs = envelopes(&parse(&out).unwrap());
        let kinds: Vec<(&str, bool)> = envs
            .iter()
            .map(|e| (e["type"].as_str().unwrap(), e["final"].as_bool().unwrap()))
            .collect();
        assert_eq!(kinds, [("text", false), ("text", true), ("error", true)], "{}", dialect.as_str());
    }
}

#[test]
fn a_subagents_messages_carry_its_agent_until_its_call_returns() {
    let (envs, _, _) = translate(Dialect::AgentSdk, &input("agent_sdk_partial_on"));
    let root = envs[0]["agent"].as_str().unwrap().to_owned();
    assert_eq!(root, "5f1c2e4a-7b3d-4c8e-9a10-2b3c4d5e6f70");
    let sub: Vec<&str> = envs
        .iter()
        .filter(|e| e["agent"] == "toolu_01C")
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(sub.contains(&"tool_call") && sub.contains(&"text"), "{sub:?}");
    // The Task call's own result is the root's, and nothing after it is the subagent's.
    let returned = envs
        .iter()
        .position(|e| e["type"] == "tool_result" && e["id"] == "toolu_01C")
        .unwrap();
    assert_eq!(envs[returned]["agent"], root.as_str());
    let first_sub = envs.iter().position(|e| e["agent"] == "toolu_01C").unwrap();
    assert!(first_sub < returned);
    let after: Vec<&Value> = envs[returned..].iter().filter(|e| e.is_object()).collect();
    assert!(after.len() > 2, "the root goes on after the subagent: {after:#?}");
    assert!(after.iter().all(|e| e["agent"] == root.as_str()), "{after:#?}");
}

#[test]
fn the_observer_is_told_the_dialect_the_first_event_settled() {
    let cases = [
        ("cogency_respond", Dialect::Auto, Some(Dialect::Cogency)),
        ("cogency30_long_respond", Dialect::Auto, Some(Dialect::Cogency)),
        ("agent_sdk_seed004", Dialect::Auto, Some(Dialect::AgentSdk)),
        ("agent_sdk_partial_on", Dialect::AgentSdk, Some(Dialect::AgentSdk)),
        ("other_legacy_xml", Dialect::Auto, Some(Dialect::Xml)),
        ("other_legacy_xml", Dialect::Cogency, Some(Dialect::Cogency)),
        (
            "fixed_agent_sdk_bad_events_null",
            Dialect::AgentSdk,
            Some(Dialect::AgentSdk),
        ),
        ("other_json_shape", Dialect::Auto, None),
    ];
    for (name, dialect, want) in cases {
        let (_, stats) = translate_all(opts(dialect), FALLBACK, &input(name));
        assert_eq!(stats.dialect, want, "{name} under {}", dialect.as_str());
    }
}

#[test]
fn auto_refuses_a_first_event_of_no_dialect_with_one_error_even_where_an_end_is_required() {
    let o = Options {
        require_done: true,
        ..opts(Dialect::Auto)
    };
    let mut t = Translator::new(o, FALLBACK);
    let mut out = Vec::new();
    t.feed(&input("other_json_shape"), &mut out);
    let end = t.finish(&mut out);
    let envs = envelopes(&parse(&out).unwrap());
    assert_eq!(envs.len(), 1, "{envs:#?}");
    assert!(envs[0]["delta"].as_str().unwrap().contains("parse_error"));
    assert_eq!(end, StreamEnd::Failed);
}

#[test]
fn under_a_fixed_dialect_a_bad_first_event_is_one_error_and_every_later_event_is_read() {
    let run = concat!(
        "data: {\"type\": \"user\", \"content\": \"hi\"}\n\n",
        "data: {\"type\": \"respond\", \"content\": \"Hello\"}\n\n",
        "data: {\"type\": \"end\"}\n\n",
    );
    for first in ["{}", "null", "[1]", "{\"type\": \"message_start\"}", "{\"type\": \"us"] {
        let input = format!("data: {first}\n\n{run}");
        let (envs, stats, end) = translate(Dialect::Cogency, input.as_bytes());
        let kinds: Vec<&str> = envs.iter().map(|e| e["type"].as_str().unwrap_or("[DONE]")).collect();
        assert_eq!(
            kinds,
            ["error", "meta_init", "text", "text", "meta_final", "[DONE]"],
            "first {first}: {envs:#?}"
        );
        assert_eq!(stats.total_parse_errors(), 1, "first {first}");
        assert_eq!(end, StreamEnd::Done, "first {first}");
    }
}

#[test]
fn an_error_the_backend_reports_ends_the_run_with_meta_final_and_exactly_one_done() {
    let sdk_error = r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#;
    for (dialect, error) in [
        (Dialect::Cogency, r#"{"type": "error", "content": "boom"}"#),
        (Dialect::Cogency, r#"{"type": "cancelled"}"#),
        (Dialect::Cogency, r#"{"type": "interrupt"}"#),
        (Dialect::AgentSdk, sdk_error),
    ] {
        let text = match dialect {
            Dialect::AgentSdk => {
                r#"{"type":"stream_event","event":{"type":"content_block_delta","delta":{"type":"text_delta","text":"par"}}}"#
            }
            _ => r#"{"type": "respond", "content": "par"}"#,
        };
        for backend_done in [false, true] {
            let mut input = format!("data: {text}\n\ndata: {error}\n\n");
            if backend_done {
                input.push_str("data: [DONE]\n\n");
            }
            let (envs, stats, _) = translate(dialect, input.as_bytes());
            let kinds: Vec<&str> = envs.iter().map(|e| e["type"].as_str().unwrap_or("[DONE]")).collect();
            assert_eq!(
                kinds,
                ["text", "text", "error", "meta_final", "[DONE]"],
                "{error} (backend [DONE]: {backend_done})"
            );
            assert_eq!(stats.total_parse_errors(), 0);
            // Nothing more is owed: the daemon's missing-[DONE] error does not follow.
            let o = Options {
                require_done: true,
                ..opts(dialect)
            };
            let (out, _) = translate_all(o, FALLBACK, input.as_bytes());
            let envs = envelopes(&parse(&out).unwrap());
            assert_eq!(envs.last(), Some(&Value::from("[DONE]")), "{error}: {envs:#?}");
        }
    }
}

#[test]
fn a_run_that_said_end_gets_meta_final_and_done_whatever_closing_events_follow() {
    let head = concat!(
        "data: {\"type\": \"respond\", \"content\": \"a\"}\n\n",
        "data: {\"type\": \"end\"}\n\n",
    );
    for tail in [
        "data: {\"type\": \"metrics\", \"total\": {\"input\": 9}}\n\n",
        "data: {\"type\": \"metric\", \"total\": {\"input\": 9}}\n\ndata: {\"type\": \"metrics\", \"total\": {\"input\": 9}}\n\n",
        "data: {\"type\": \"metrics\", \"total\": {\"input\": 9}}\n\ndata: [DONE]\n\n",
        "data: {\"type\": \"execute\"}\n\ndata: {\"type\": \"metrics\", \"total\": {\"input\": 9}}\n\n",
    ] {
        let (envs, _, end) = translate(Dialect::Cogency, format!("{head}{tail}").as_bytes());
        let kinds: Vec<&str> = envs.iter().map(|e| e["type"].as_str().unwrap_or("[DONE]")).collect();
        assert_eq!(kinds, ["text", "text", "meta_final", "[DONE]"], "{tail}");
        assert_eq!(envs[2]["delta"], r#"{"cumulative_usage": {"input": 9}}"#, "{tail}");
        assert_eq!(end, StreamEnd::Done);
    }
}

#[test]
fn a_result_with_only_a_payload_carries_the_payload_and_three_point_three_counts_are_dropped() {
    let call = r#"data: {"type": "call", "content": "{\"name\": \"f\", \"args\": {}}"}"#;
    let cases = [
        (
            r#"{"type": "result", "payload": {"outcome": "Found file", "content": "...", "error": false}}"#,
            r#"{"outcome": "Found file", "content": "...", "error": false}"#,
        ),
        (
            r#"{"type": "result", "payload": {"outcome": "Gr\u00fc\u00df"}, "content": null}"#,
            r#"{"outcome": "Gr\u00fc\u00df"}"#,
        ),
        (
            r#"{"type": "result", "payload": {"tools_executed": 1, "success_count": 1, "failure_count": 0}}"#,
            "",
        ),
        (
            r#"{"type": "result", "payload": {"tools_executed": 1}, "content": "out"}"#,
            "out",
        ),
        (r#"{"type": "result", "payload": null}"#, ""),
    ];
    for (result, want) in cases {
        let input = format!("{call}\n\ndata: {result}\n\n");
        let (envs, _, _) = translate(Dialect::Cogency, input.as_bytes());
        let got: String = envs
            .iter()
            .filter(|e| e["type"] == "tool_result")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(got, want, "{result}");
    }
}
