//! Unit tests of the encoders: hand-written envelope streams for each rule of DESIGN 5.3, and every golden fixture's
//! envelope stream (tests/fixtures/*.jsonl) checked against the order each client enforces.

use serde_json::{json, Value};

use super::{Encoder, Protocol, Turn};

fn turn() -> Turn {
    Turn {
        message_id: "msg-1".into(),
        thread_id: "th-1".into(),
        run_id: "run-1".into(),
        prefix: "p".into(),
        ..Turn::default()
    }
}

/// Encodes `events` (envelope JSON texts or `[DONE]`), then the stream's end; returns the chunks.
fn encode(protocol: Protocol, turn: Turn, events: &[String]) -> Vec<Value> {
    let mut e = Encoder::new(protocol, turn);
    let mut out = Vec::new();
    for ev in events {
        e.event(ev.as_bytes(), &mut out);
    }
    e.finish(&mut out);
    let text = String::from_utf8(out).expect("UTF-8");
    text.split("\n\n")
        .filter(|s| !s.is_empty())
        .map(|s| {
            let data = s.strip_prefix("data: ").expect("one data line per event");
            assert!(!data.contains('\n'), "one line: {data}");
            if data == "[DONE]" {
                Value::from("[DONE]")
            } else {
                serde_json::from_str(data).expect("JSON chunk")
            }
        })
        .collect()
}

fn env(kind: &str, agent: &str, last: bool, delta: &str) -> String {
    json!({"type": kind, "agent": agent, "final": last, "delta": delta}).to_string()
}

fn tool(kind: &str, agent: &str, last: bool, delta: &str, id: &str, name: &str) -> String {
    json!({"type": kind, "agent": agent, "final": last, "delta": delta, "id": id, "name": name}).to_string()
}

fn init(agent: &str, parent: Option<&str>) -> String {
    let delta = json!({"format": "json", "user_query": "q", "agent_uuid": agent, "parent_agent_uuid": parent});
    env("meta_init", agent, true, &delta.to_string())
}

fn types(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .map(|c| {
            c["type"]
                .as_str()
                .map_or_else(|| c.as_str().unwrap_or("?").to_owned(), str::to_owned)
        })
        .collect()
}

/// A run with a backend tool between two model turns, a subagent and the run's end.
fn run() -> Vec<String> {
    vec![
        init("a1", None),
        env("thinking", "a1", false, "plan"),
        env("thinking", "a1", true, ""),
        tool("tool_call", "a1", true, r#"{"path": "."}"#, "t1", "ls"),
        tool("tool_result", "a1", true, "a.py", "t1", "ls"),
        tool("tool_call", "a1", true, r#"{"task": "x"}"#, "t2", "spawn_subagent"),
        init("a2", Some("a1")),
        env("text", "a2", false, "child"),
        env("text", "a2", true, ""),
        tool("tool_result", "a1", true, "done", "t2", "spawn_subagent"),
        env("text", "a1", false, "Hello "),
        env("text", "a1", false, "world"),
        env("text", "a1", true, ""),
        env("meta_final", "a1", true, r#"{"stop_reason": "end_turn"}"#),
        "[DONE]".to_owned(),
    ]
}

#[test]
fn ai_sdk_a_run_is_one_message_with_a_step_per_model_turn() {
    let chunks = encode(Protocol::AiSdk, turn(), &run());
    assert_eq!(
        types(&chunks),
        [
            "start",
            "start-step",
            "reasoning-start",
            "reasoning-delta",
            "reasoning-end",
            "tool-input-start",
            "tool-input-delta",
            "tool-input-available",
            "tool-output-available",
            "finish-step",
            "start-step",
            "tool-input-start",
            "tool-input-delta",
            "tool-input-available",
            "data-agent",
            "text-start",
            "text-delta",
            "text-end",
            "tool-output-available",
            "finish-step",
            "start-step",
            "text-start",
            "text-delta",
            "text-delta",
            "text-end",
            "finish-step",
            "finish",
            "[DONE]",
        ]
    );
    assert_eq!(chunks[0]["messageId"], "msg-1");
    assert_eq!(chunks[0]["messageMetadata"]["agent"], "a1");
    assert_eq!(chunks[7]["input"], json!({"path": "."}));
    assert_eq!(chunks[7]["dynamic"], true);
    assert_eq!(chunks[8]["output"], "a.py");
    assert_eq!(chunks[14]["data"]["parent"], "a1");
    assert_eq!(chunks[15]["providerMetadata"]["gateway"]["agent"], "a2");
    assert_eq!(chunks[26]["finishReason"], "stop");
    assert_eq!(chunks[26]["messageMetadata"]["meta_final"]["stop_reason"], "end_turn");
    ai_sdk_order(&chunks).unwrap();
}

#[test]
fn ai_sdk_a_run_ending_on_the_backends_tool_results_ends_with_an_empty_step() {
    let events = vec![
        init("a1", None),
        tool("tool_call", "a1", true, "{}", "t1", "ls"),
        tool("tool_result", "a1", true, "x", "t1", "ls"),
        env("meta_final", "a1", true, "{}"),
        "[DONE]".to_owned(),
    ];
    let chunks = encode(Protocol::AiSdk, turn(), &events);
    let t = types(&chunks);
    assert_eq!(
        t[t.len() - 5..],
        ["finish-step", "start-step", "finish-step", "finish", "[DONE]"]
    );
}

#[test]
fn ai_sdk_awaited_frontend_tools_end_the_turn_with_tool_calls_and_a_continuation_keeps_the_message() {
    let awaited = json!([{"tool_use_id": "f1", "name": "get_location", "input": {"q": 1}}]).to_string();
    let events = vec![
        init("a1", None),
        tool("tool_call", "a1", true, r#"{"q": 1}"#, "f1", "get_location"),
        env("awaiting_frontend_tools", "a1", true, &awaited),
        "[DONE]".to_owned(),
    ];
    let chunks = encode(Protocol::AiSdk, turn(), &events);
    let t = types(&chunks);
    assert_eq!(
        t[t.len() - 4..],
        ["data-awaiting-frontend-tools", "finish-step", "finish", "[DONE]"]
    );
    assert_eq!(chunks[chunks.len() - 2]["finishReason"], "tool-calls");
    assert_eq!(
        t.iter().filter(|t| *t == "tool-input-start").count(),
        1,
        "announced once"
    );
    // The continuation: no meta_init; the same message; the known call is not announced again.
    let cont = Turn {
        message_id: "msg-1".into(),
        known_tools: vec!["f1".into()],
        agent: Some("a1".into()),
        prefix: "q".into(),
        ..turn()
    };
    let events = vec![
        tool("tool_result", "a1", true, r#"{"city": "Paris"}"#, "f1", "get_location"),
        env("text", "a1", true, "It is Paris."),
        env("meta_final", "a1", true, "{}"),
        "[DONE]".to_owned(),
    ];
    let chunks = encode(Protocol::AiSdk, cont, &events);
    assert_eq!(chunks[0]["messageId"], "msg-1");
    assert!(!types(&chunks).contains(&"tool-input-start".to_owned()), "{chunks:#?}");
}

#[test]
fn ai_sdk_an_error_followed_by_content_is_data_and_one_at_the_end_ends_the_run() {
    let events = vec![
        init("a1", None),
        env("error", "a1", true, r#"{"type": "overloaded_error"}"#),
        env("text", "a1", true, "went on"),
        env("error", "a1", true, "HTTP error: boom"),
        env("meta_final", "a1", true, "{}"),
        "[DONE]".to_owned(),
    ];
    let chunks = encode(Protocol::AiSdk, turn(), &events);
    let t = types(&chunks);
    assert!(t.contains(&"data-error".to_owned()), "{t:?}");
    let last_two = &t[t.len() - 2..];
    assert_eq!(last_two, ["error", "[DONE]"]);
    assert_eq!(chunks[chunks.len() - 2]["errorText"], "HTTP error: boom");
    assert!(!t.contains(&"finish".to_owned()));
}

#[test]
fn ai_sdk_a_stream_cut_short_ends_with_an_error_and_done() {
    let events = vec![init("a1", None), env("text", "a1", false, "par")];
    let t = types(&encode(Protocol::AiSdk, turn(), &events));
    assert_eq!(t[t.len() - 2..], ["error", "[DONE]"]);
}

#[test]
fn ag_ui_a_run_keeps_verify_events_rules_and_a_subagent_is_a_lane() {
    let chunks = encode(Protocol::AgUi, turn(), &run());
    ag_ui_order(&chunks).unwrap();
    let t = types(&chunks);
    assert_eq!(t[0], "RUN_STARTED");
    assert_eq!(t.last().map(String::as_str), Some("RUN_FINISHED"));
    let started = chunks.iter().find(|c| c["type"] == "SUBAGENT_STARTED").expect("a lane");
    let lane = started["subagentRunId"].as_str().unwrap();
    assert_eq!(started["name"], "a2");
    let child_text = chunks.iter().find(|c| c["type"] == "TEXT_MESSAGE_CONTENT").unwrap();
    assert_eq!(child_text["subagentRunId"], lane);
    let finished = t.iter().position(|t| t == "SUBAGENT_FINISHED").unwrap();
    let result = t.iter().rposition(|t| t == "TOOL_CALL_RESULT").unwrap();
    assert!(
        finished < result,
        "the parent's next envelope finishes the child: {t:?}"
    );
    assert!(chunks.iter().all(|c| c != "[DONE]"), "no [DONE] in AG-UI");
}

#[test]
fn ag_ui_awaited_tools_finish_the_run_with_their_ids_and_a_sent_result_is_not_echoed() {
    let awaited = json!([{"tool_use_id": "f1", "name": "get_location", "input": {}}]).to_string();
    let events = vec![
        init("a1", None),
        env("text", "a1", false, "Let me ask"),
        env("awaiting_frontend_tools", "a1", true, &awaited),
    ];
    let chunks = encode(Protocol::AgUi, turn(), &events);
    ag_ui_order(&chunks).unwrap();
    let last = chunks.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED");
    assert_eq!(last["outcome"]["pendingToolCallIds"], json!(["f1"]));
    let cont = Turn {
        known_tools: vec!["f1".into()],
        known_results: vec!["f1".into()],
        agent: Some("a1".into()),
        run_id: "run-2".into(),
        prefix: "run-2".into(),
        ..turn()
    };
    let events = vec![
        tool("tool_result", "a1", true, "Paris", "f1", "get_location"),
        env("text", "a1", true, "Paris it is."),
        env("meta_final", "a1", true, "{}"),
    ];
    let chunks = encode(Protocol::AgUi, cont, &events);
    ag_ui_order(&chunks).unwrap();
    assert!(!types(&chunks).contains(&"TOOL_CALL_RESULT".to_owned()), "{chunks:#?}");
}

#[test]
fn ag_ui_a_terminal_error_is_run_error_and_nothing_follows() {
    let events = vec![
        init("a1", None),
        env("text", "a1", false, "par"),
        env("error", "a1", true, r#"{"type": "upstream_error", "message": "reset"}"#),
    ];
    let chunks = encode(Protocol::AgUi, turn(), &events);
    ag_ui_order(&chunks).unwrap();
    let last = chunks.last().unwrap();
    assert_eq!(last["type"], "RUN_ERROR");
    assert_eq!(last["code"], "upstream_error");
}

/// Every golden fixture's envelope stream, encoded by both protocols, keeps each client's order rules, and the AI SDK
/// message carries every text delta of the envelopes.
#[test]
fn every_fixture_stream_encodes_in_the_order_each_client_enforces() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("fixtures") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("fixture");
        let events: Vec<String> = text.lines().map(str::to_owned).collect();
        let name = path.display();
        let chunks = encode(Protocol::AiSdk, turn(), &events);
        ai_sdk_order(&chunks).unwrap_or_else(|e| panic!("{name} (ai-sdk): {e}"));
        let want: String = events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter(|e| e["type"] == "text")
            .map(|e| e["delta"].as_str().unwrap_or("").to_owned())
            .collect();
        let got: String = chunks
            .iter()
            .filter(|c| c["type"] == "text-delta")
            .map(|c| c["delta"].as_str().unwrap_or("").to_owned())
            .collect();
        assert_eq!(got, want, "{name}: the text");
        let chunks = encode(Protocol::AgUi, turn(), &events);
        ag_ui_order(&chunks).unwrap_or_else(|e| panic!("{name} (ag-ui): {e}"));
        seen += 1;
    }
    assert!(seen > 20, "{seen} fixtures");
}

/// A chunk's type, checked against the type a stream starts with and against the run's end.
fn chunk_type<'c>(c: &'c Value, i: usize, first: &str, ended: bool) -> Result<&'c str, String> {
    let t = c["type"].as_str().ok_or("no type")?;
    if i == 0 && t != first {
        return Err(format!("first chunk {t}"));
    }
    if ended {
        return Err(format!("{t} after the run ended"));
    }
    Ok(t)
}

/// A string field of a chunk ("" when absent).
fn field(c: &Value, k: &str) -> String {
    c[k].as_str().unwrap_or("").to_owned()
}

/// The order `processUIMessageStream` enforces: a delta or end needs its start, a tool output its input, `start`
/// first, nothing after `[DONE]`, nothing but `[DONE]` after `finish` or `error`.
fn ai_sdk_order(chunks: &[Value]) -> Result<(), String> {
    let mut open = std::collections::HashSet::new();
    let mut tools = std::collections::HashSet::new();
    let mut ended = false;
    for (i, c) in chunks.iter().enumerate() {
        if c == "[DONE]" {
            if i + 1 != chunks.len() {
                return Err("chunks after [DONE]".into());
            }
            continue;
        }
        let t = chunk_type(c, i, "start", ended)?;
        let id = |k: &str| field(c, k);
        match t {
            "text-start" | "reasoning-start" => {
                open.insert(id("id"));
            }
            "text-delta" | "reasoning-delta" if !open.contains(&id("id")) => return Err(format!("{t} without start")),
            "text-end" | "reasoning-end" if !open.remove(&id("id")) => return Err(format!("{t} without start")),
            "tool-input-available" => {
                tools.insert(id("toolCallId"));
            }
            "tool-output-available" | "tool-output-error" if !tools.contains(&id("toolCallId")) => {
                return Err(format!("{t} for {} without its input", id("toolCallId")))
            }
            "finish" | "error" => ended = true,
            _ => {}
        }
    }
    if !chunks.last().is_some_and(|c| c == "[DONE]") {
        return Err("no [DONE] last".into());
    }
    Ok(())
}

/// `verifyEvents`' rules: `RUN_STARTED` first; content needs its start; no `RUN_FINISHED` while a message, tool call
/// or subagent is open; nothing after `RUN_ERROR` or `RUN_FINISHED`; exactly one of them last.
fn ag_ui_order(chunks: &[Value]) -> Result<(), String> {
    let mut messages = std::collections::HashSet::new();
    let mut calls = std::collections::HashSet::new();
    let mut lanes = std::collections::HashSet::new();
    let mut ids = std::collections::HashSet::new();
    let mut ended = false;
    for (i, c) in chunks.iter().enumerate() {
        let t = chunk_type(c, i, "RUN_STARTED", ended)?;
        let id = |k: &str| field(c, k);
        match t {
            "TEXT_MESSAGE_START" | "REASONING_MESSAGE_START" => {
                if !ids.insert(id("messageId")) {
                    return Err(format!("message id {} reused", id("messageId")));
                }
                messages.insert(id("messageId"));
            }
            "TEXT_MESSAGE_CONTENT" | "REASONING_MESSAGE_CONTENT" if !messages.contains(&id("messageId")) => {
                return Err(format!("{t} without start"))
            }
            "TEXT_MESSAGE_END" | "REASONING_MESSAGE_END" if !messages.remove(&id("messageId")) => {
                return Err(format!("{t} without start"))
            }
            "TOOL_CALL_START" => {
                calls.insert(id("toolCallId"));
            }
            "TOOL_CALL_ARGS" if !calls.contains(&id("toolCallId")) => return Err(format!("{t} without start")),
            "TOOL_CALL_END" if !calls.remove(&id("toolCallId")) => return Err(format!("{t} without start")),
            "SUBAGENT_STARTED" => {
                lanes.insert(id("subagentRunId"));
            }
            "SUBAGENT_FINISHED" | "SUBAGENT_ERROR" if !lanes.remove(&id("subagentRunId")) => {
                return Err(format!("{t} of no open lane"))
            }
            "RUN_FINISHED" => {
                if !messages.is_empty() || !calls.is_empty() || !lanes.is_empty() {
                    return Err(format!("RUN_FINISHED with {messages:?} {calls:?} {lanes:?} open"));
                }
                ended = true;
            }
            "RUN_ERROR" => ended = true,
            _ => {}
        }
    }
    if !ended {
        return Err("the run never ended".into());
    }
    Ok(())
}

/// Held frames carry ids, retry lines and comments, and an event may end in the next frame: the encoder reads
/// every event's data once, whatever the cut.
#[test]
fn held_frames_cut_anywhere_encode_as_the_whole_stream() {
    let mut text = String::from("retry: 1000\n: keepalive\n\n");
    for (n, ev) in run().iter().enumerate() {
        text.push_str(&format!("id: sg1-t-{n}\ndata: {ev}\n\n"));
    }
    let bytes = text.as_bytes();
    let whole = {
        let mut e = Encoder::new(Protocol::AiSdk, turn());
        let mut out = Vec::new();
        e.frame(bytes, &mut out);
        e.finish(&mut out);
        out
    };
    let direct = {
        let mut e = Encoder::new(Protocol::AiSdk, turn());
        let mut out = Vec::new();
        for ev in run() {
            e.event(ev.as_bytes(), &mut out);
        }
        e.finish(&mut out);
        out
    };
    assert_eq!(whole, direct);
    for step in [1, 7, 64, 333] {
        let mut e = Encoder::new(Protocol::AiSdk, turn());
        let mut out = Vec::new();
        for piece in bytes.chunks(step) {
            e.frame(piece, &mut out);
        }
        e.finish(&mut out);
        assert!(out == whole, "cut every {step} bytes");
    }
}
