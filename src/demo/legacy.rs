//! The demo's legacy run (`--demo-dialect xml`, the default): DESIGN 3 exactly (framing and per-kind escaping):
//! thinking, streamed text, a server tool call and result with citations, a client tool call answered by a
//! subagent (nested `meta_init`, its own tool call and result, closed by the parent's `tool_result`),
//! `meta_final` and `[DONE]`. Also the continuation `POST /agent/tool_results` answers ([`continuation`]).

use serde_json::json;

/// Formatter escape (DESIGN 3.3): `\` doubled, then newlines written as `\n`.
fn fmt_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// HTML escape of an attribute value, as the backend writes it.
fn attr(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&#x27;")
}

/// A client tool result body: newlines as `\n`, backslashes kept, `]]>` split across CDATA sections.
fn client_cdata(s: &str) -> String {
    let s = s.replace("\r\n", "\n").replace('\r', "\n").replace('\n', "\\n");
    format!("<![CDATA[{}]]>", s.replace("]]>", "]]]]><![CDATA[>"))
}

/// The legacy stream's SSE events (`data: …\n\n` each) for one run.
pub fn stream(agent: &str, query: &str) -> Vec<String> {
    let sub = "5f0c9a52-8d1b-4e0f-9a57-2b3c4d5e6f70";
    let meta_init = |agent: &str, parent: Option<&str>, q: &str| {
        let data = json!({
            "format": "xml",
            "user_query": q,
            "agent_uuid": agent,
            "parent_agent_uuid": parent,
            "model": "claude-sonnet-4",
        });
        format!("<meta_init data=\"{}\"></meta_init>", attr(&data.to_string()))
    };
    let mut items: Vec<String> = Vec::new();
    let streamed = |items: &mut Vec<String>, kind: &str, deltas: &[&str]| {
        items.push(format!("<content-block-{kind}>"));
        items.extend(deltas.iter().map(|d| fmt_escape(d)));
        items.push(format!("</content-block-{kind}>"));
    };
    let tool_call = |kind: &str, id: &str, name: &str, args: serde_json::Value| {
        format!(
            "<content-block-{kind} id=\"{id}\" name=\"{name}\" arguments=\"{}\"></content-block-{kind}>",
            attr(&args.to_string())
        )
    };

    items.push(meta_init(agent, None, query));
    streamed(
        &mut items,
        "thinking",
        &[
            "The user asks about the weather.",
            " I should search the web,\nthen ask a helper agent",
            " to convert units.",
        ],
    );
    streamed(&mut items, "text", &["Let me look that up", " for you."]);
    items.push(tool_call(
        "server_tool_call",
        "srvtoolu_01",
        "web_search",
        json!({"query": "weather Paris today"}),
    ));
    let results = json!([
        {"type": "web_search_result", "title": "Paris weather", "url": "https://weather.example/paris",
         "page_age": "1 hour ago"}
    ]);
    items.push(format!(
        "<content-block-web_search_tool_result id=\"srvtoolu_01\" name=\"web_search\">\
         <![CDATA[{}]]></content-block-web_search_tool_result>",
        fmt_escape(&results.to_string())
    ));
    streamed(
        &mut items,
        "text",
        &["It is ", "18 °C and sunny in Paris", " right now."],
    );
    items.push(
        "<citations><citation type=\"web_search_result_location\" url=\"https://weather.example/paris\" \
         title=\"Paris weather\"><![CDATA[Sunny, 18 °C]]></citation><citation type=\"char_location\" \
         document_index=\"0\" document_title=\"notes.txt\" start_char_index=\"0\" end_char_index=\"12\">\
         <![CDATA[Sunny & mild]]></citation></citations>"
            .to_owned(),
    );
    items.push(tool_call(
        "tool_call",
        "toolu_02",
        "spawn_subagent",
        json!({"task": "Convert 18 °C to Fahrenheit"}),
    ));
    // The subagent writes into the parent's stream (DESIGN 3.5).
    items.push(meta_init(sub, Some(agent), "Convert 18 °C to Fahrenheit"));
    streamed(&mut items, "text", &["Computing 18 × 9/5 + 32."]);
    items.push(tool_call(
        "tool_call",
        "toolu_03",
        "calculator",
        json!({"expression": "18*9/5+32"}),
    ));
    items.push(format!(
        "<content-block-tool_result id=\"toolu_03\" name=\"calculator\">{}</content-block-tool_result>",
        client_cdata("64.4")
    ));
    streamed(&mut items, "text", &["18 °C is 64.4 °F."]);
    // The parent's tool_result for the spawn call closes the child scope.
    items.push(format!(
        "<content-block-tool_result id=\"toolu_02\" name=\"spawn_subagent\">{}</content-block-tool_result>",
        client_cdata("18 °C = 64.4 °F\n(subagent finished)")
    ));
    streamed(
        &mut items,
        "text",
        &[
            "Summary:\n",
            "| city | °C | °F |\n|---|---|---|\n| Paris | 18 | 64.4 |\n",
            "Note: 18 < 20, so bring a <jacket> & an umbrella \\ just in case.",
        ],
    );
    finish(items, 3, 0.0123, (1520, 230))
}

/// `items` ended as a run ends (`meta_final` with its `steps`, `cost` and `usage` as input and output tokens, then
/// `[DONE]`), each an SSE event.
fn finish(mut items: Vec<String>, steps: u32, cost: f64, usage: (u32, u32)) -> Vec<String> {
    let final_data = json!({
        "stop_reason": "end_turn",
        "total_steps": steps,
        "generated_files": [],
        "cost": cost,
        "cumulative_usage": {"input_tokens": usage.0, "output_tokens": usage.1},
        "conversation_history": [],
    });
    items.push(format!(
        "<meta_final data=\"{}\"></meta_final>",
        attr(&final_data.to_string())
    ));
    items.push("[DONE]".to_owned());
    items.into_iter().map(|i| format!("data: {i}\n\n")).collect()
}

/// One answered call of a `POST /agent/tool_results` body: `{tool_use_id, content, is_error}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct ToolResult {
    #[serde(default)]
    pub tool_use_id: String,
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub is_error: bool,
}

/// The legacy stream's SSE events for a `tool_results` continuation: as a backend continues a run it paused for
/// the frontend's tools, with no `meta_init` (the agent is the one the request names), a text block
/// acknowledging each result, `meta_final` and `[DONE]`.
pub fn continuation(results: &[ToolResult]) -> Vec<String> {
    let mut items = vec!["<content-block-text>".to_owned()];
    if results.is_empty() {
        items.push(fmt_escape("No tool result came with the continuation."));
    }
    for (i, r) in results.iter().enumerate() {
        let sep = if i == 0 { "" } else { "\n" };
        let said = if r.is_error { "failed with" } else { "returned" };
        // At most 200 characters of it, and never the block's close tag.
        let content: String = r.content.chars().take(200).collect();
        let content = content.replace("</", "< /");
        let line = format!("{sep}Thanks: the tool call {} {said} {content:?}.", r.tool_use_id);
        items.push(fmt_escape(&line));
    }
    items.push("</content-block-text>".to_owned());
    finish(items, 1, 0.001, (80, 20))
}
