//! The demo's Agent SDK run (`--demo-dialect agent_sdk`): `SDKMessage`s as the Claude Agent SDK's CLI writes them
//! in `stream-json` with partial messages on (compact JSON, raw UTF-8), one SSE event each
//! (tests/fixtures/dialects/agent_sdk_partial_on.sse is the recorded shape).
//!
//! `system` init; the model's first message streamed as `stream_event`s (thinking with its signature, text, a
//! `WebSearch` tool use, a `Task` tool use), each block followed by the CLI's `assistant` message repeating it;
//! the tool results as `user` messages; the `Task` subagent's own streamed answer under its `parent_tool_use_id`;
//! the final answer; `result` with usage and cost.

use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-4-5-20250929";
const SEARCH_ID: &str = "toolu_demo_01";
const TASK_ID: &str = "toolu_demo_02";

/// What one streamed content block is.
enum Block<'a> {
    Thinking(&'a [&'a str]),
    Text(&'a [&'a str]),
    /// Name, then the input's JSON text in pieces.
    ToolUse(&'a str, &'a str, &'a [&'a str]),
}

/// The messages of one session, with what every message repeats.
struct Session {
    id: String,
    seq: u32,
    out: Vec<String>,
}

impl Session {
    /// Adds one message, with its `session_id` and a fresh `uuid` (and `parent_tool_use_id` unless it is `system`).
    fn send(&mut self, mut m: Value, parent: Option<&str>) {
        self.seq += 1;
        if let Some(o) = m.as_object_mut() {
            if o.get("type").and_then(Value::as_str) != Some("system") {
                o.insert("parent_tool_use_id".into(), json!(parent));
            }
            o.insert("session_id".into(), json!(self.id));
            o.insert(
                "uuid".into(),
                json!(format!("0d000000-0000-4000-8000-{:012}", self.seq)),
            );
        }
        self.out.push(format!("data: {m}\n\n"));
    }

    fn event(&mut self, event: Value, parent: Option<&str>) {
        self.send(json!({"type": "stream_event", "event": event}), parent);
    }

    /// One model message streamed: `message_start`, each block (start, deltas, stop, then its `assistant`
    /// message), `message_delta` with `stop_reason`, `message_stop`.
    fn message(&mut self, id: &str, blocks: &[Block], stop_reason: &str, parent: Option<&str>) {
        let message = |content: Value| {
            json!({"id": id, "type": "message", "role": "assistant", "model": MODEL, "content": content,
                   "stop_reason": null, "stop_sequence": null,
                   "usage": {"input_tokens": 420, "output_tokens": 1, "service_tier": "standard"}})
        };
        self.event(json!({"type": "message_start", "message": message(json!([]))}), parent);
        for (index, block) in blocks.iter().enumerate() {
            let (start, deltas, whole) = match block {
                Block::Thinking(parts) => (
                    json!({"type": "thinking", "thinking": "", "signature": ""}),
                    parts
                        .iter()
                        .map(|p| json!({"type": "thinking_delta", "thinking": p}))
                        .chain([json!({"type": "signature_delta", "signature": "EqQBCkYIBxgCKkBkZW1v"})])
                        .collect::<Vec<_>>(),
                    json!({"type": "thinking", "thinking": parts.concat(), "signature": "EqQBCkYIBxgCKkBkZW1v"}),
                ),
                Block::Text(parts) => (
                    json!({"type": "text", "text": ""}),
                    parts.iter().map(|p| json!({"type": "text_delta", "text": p})).collect(),
                    json!({"type": "text", "text": parts.concat()}),
                ),
                Block::ToolUse(tool_id, name, parts) => {
                    let input: Value = serde_json::from_str(&parts.concat()).unwrap_or_default();
                    (
                        json!({"type": "tool_use", "id": tool_id, "name": name, "input": {}}),
                        parts
                            .iter()
                            .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                            .collect(),
                        json!({"type": "tool_use", "id": tool_id, "name": name, "input": input}),
                    )
                }
            };
            self.event(
                json!({"type": "content_block_start", "index": index, "content_block": start}),
                parent,
            );
            for delta in deltas {
                self.event(
                    json!({"type": "content_block_delta", "index": index, "delta": delta}),
                    parent,
                );
            }
            self.event(json!({"type": "content_block_stop", "index": index}), parent);
            self.send(json!({"type": "assistant", "message": message(json!([whole]))}), parent);
        }
        self.event(
            json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                   "usage": {"output_tokens": 60}}),
            parent,
        );
        self.event(json!({"type": "message_stop"}), parent);
    }

    /// A tool's result, as the `user` message the CLI sends.
    fn tool_result(&mut self, tool_use_id: &str, content: Value, parent: Option<&str>) {
        let block = json!({"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": false});
        self.send(
            json!({"type": "user", "message": {"role": "user", "content": [block]}}),
            parent,
        );
    }
}

/// The run's SSE events, in session `session` (the SDK's messages do not repeat the prompt).
pub fn stream(session: &str) -> Vec<String> {
    let mut s = Session {
        id: session.to_owned(),
        seq: 0,
        out: Vec::new(),
    };
    s.send(
        json!({"type": "system", "subtype": "init", "cwd": "/workspace",
               "tools": ["Task", "Bash", "Read", "WebSearch"], "mcp_servers": [], "model": MODEL,
               "permissionMode": "default", "slash_commands": ["compact"], "apiKeySource": "ANTHROPIC_API_KEY",
               "claude_code_version": "2.1.327", "output_style": "default", "agents": ["general-purpose"],
               "skills": [], "plugins": []}),
        None,
    );
    s.message(
        "msg_demo_01",
        &[
            Block::Thinking(&[
                "The user asks about the weather.",
                " I should search the web,\nthen ask a helper",
                " to convert units.",
            ]),
            Block::Text(&["Let me look that up", " for you."]),
            Block::ToolUse(SEARCH_ID, "WebSearch", &["{\"query\": \"weat", "her Paris today\"}"]),
            Block::ToolUse(
                TASK_ID,
                "Task",
                &[
                    "{\"description\": \"Convert units\", \"subagent_type\": \"general-purpose\", ",
                    "\"prompt\": \"Convert 18 \u{b0}C to Fahrenheit\"}",
                ],
            ),
        ],
        "tool_use",
        None,
    );
    s.tool_result(
        SEARCH_ID,
        json!("Paris weather (weather.example, 1 hour ago): 18 \u{b0}C, sunny, light wind."),
        None,
    );
    // The subagent: its prompt, then its own streamed answer, all under the Task call's id.
    s.send(
        json!({"type": "user", "message": {"role": "user", "content": [
            {"type": "text", "text": "Convert 18 \u{b0}C to Fahrenheit"}]}}),
        Some(TASK_ID),
    );
    s.message(
        "msg_demo_02",
        &[Block::Text(&["18 \u{b0}C \u{d7} 9/5 + 32 ", "= 64.4 \u{b0}F."])],
        "end_turn",
        Some(TASK_ID),
    );
    s.tool_result(
        TASK_ID,
        json!([{"type": "text", "text": "18 \u{b0}C = 64.4 \u{b0}F"}]),
        None,
    );
    s.message(
        "msg_demo_03",
        &[Block::Text(&[
            "It is 18 \u{b0}C (64.4 \u{b0}F) ",
            "and sunny in Paris",
            " right now.\n\n| city | \u{b0}C | \u{b0}F |\n|---|---|---|\n| Paris | 18 | 64.4 |",
        ])],
        "end_turn",
        None,
    );
    s.send(
        json!({"type": "result", "subtype": "success", "is_error": false, "duration_ms": 4210,
               "duration_api_ms": 3900, "num_turns": 3,
               "result": "It is 18 \u{b0}C (64.4 \u{b0}F) and sunny in Paris right now.",
               "stop_reason": "end_turn", "total_cost_usd": 0.0123,
               "usage": {"input_tokens": 1520, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                         "output_tokens": 230, "service_tier": "standard",
                         "server_tool_use": {"web_search_requests": 0}},
               "modelUsage": {MODEL: {"inputTokens": 1520, "outputTokens": 230, "cacheReadInputTokens": 0,
                                      "cacheCreationInputTokens": 0, "webSearchRequests": 0,
                                      "costUSD": 0.0123, "contextWindow": 200000}},
               "permission_denials": []}),
        None,
    );
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_compact_sdk_messages_of_one_session_and_streamed_blocks_repeat_whole() {
        let events = stream("sess-1");
        let msgs: Vec<Value> = events
            .iter()
            .map(|e| {
                let body = e.strip_prefix("data: ").and_then(|e| e.strip_suffix("\n\n")).unwrap();
                let v: Value = serde_json::from_str(body).unwrap();
                assert_eq!(v.to_string(), body, "compact, keys in order, raw UTF-8");
                v
            })
            .collect();
        assert_eq!(msgs[0]["subtype"], "init");
        assert_eq!(msgs.last().unwrap()["type"], "result");
        assert!(msgs.iter().all(|m| m["session_id"] == "sess-1"));
        // Every streamed block's deltas add up to the block the assistant message repeats.
        let mut streamed = String::new();
        for m in &msgs {
            let e = &m["event"];
            match e["delta"]["type"].as_str() {
                Some("text_delta") => streamed.push_str(e["delta"]["text"].as_str().unwrap()),
                Some("input_json_delta") => streamed.push_str(e["delta"]["partial_json"].as_str().unwrap()),
                _ => {}
            }
            if m["type"] == "assistant" {
                let block = &m["message"]["content"][0];
                match block["type"].as_str().unwrap() {
                    "text" => assert_eq!(block["text"], streamed.as_str()),
                    "tool_use" => {
                        assert_eq!(block["input"], serde_json::from_str::<Value>(&streamed).unwrap());
                    }
                    _ => {}
                }
                streamed.clear();
            }
        }
        let sub: Vec<&Value> = msgs.iter().filter(|m| m["parent_tool_use_id"] == TASK_ID).collect();
        assert!(sub.len() > 5, "the subagent's messages carry the Task call's id");
    }
}
