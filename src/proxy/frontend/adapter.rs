//! The request adapter (DESIGN 5.3, "The request"): a frontend's request body — the AI SDK's `{id, messages,
//! trigger, messageId?}` or AG-UI's `RunAgentInput` — read as the legacy backend's run or tool-results request.
//! Pure: the body and what the chat store remembers in, the backend's path and body and the encoder's `Turn` out;
//! anything it cannot map is a `BadBody` naming the field.

use serde_json::{json, Map, Value};

use crate::config::Frontend;
use crate::frontend::{Protocol, Turn};
use crate::protocol::ids;

/// The legacy request a frontend's request became.
#[derive(Debug)]
pub struct Adapted {
    /// The backend path: the route's `run` or `tool_results`.
    pub path: String,
    /// The legacy JSON body.
    pub body: Vec<u8>,
    pub turn: Turn,
    /// The chat (AI SDK `id`) or thread (AG-UI `threadId`).
    pub chat: String,
    /// A `tool_results` continuation (else a new run).
    pub continuation: bool,
}

/// A body the adapter cannot map: the 400's `field` and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBody {
    pub field: String,
    pub message: String,
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> BadBody {
    BadBody {
        field: field.into(),
        message: message.into(),
    }
}

/// What the chat store remembers of a chat, for its next turn.
#[derive(Debug, Clone, Default)]
pub struct Remembered {
    pub agent: Option<String>,
    pub awaited: Vec<String>,
}

/// A request body as the adapter reads it: one JSON object.
pub type Body = Map<String, Value>;

/// Reads a request body, once: the chat store is looked up by its conversation id before it is adapted.
pub fn parse(body: &[u8]) -> Result<Body, BadBody> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(obj)) => Ok(obj),
        Ok(_) => Err(bad("body", "not a JSON object")),
        Err(e) => Err(bad("body", format!("not JSON: {e}"))),
    }
}

/// The conversation a body names (AI SDK `id`, AG-UI `threadId`), if it names one validly.
pub fn conversation(obj: &Body, protocol: Protocol) -> Option<String> {
    conversation_id(obj, id_key(protocol)).ok()
}

fn id_key(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::AiSdk => "id",
        Protocol::AgUi => "threadId",
    }
}

/// Maps one request body. `fresh` makes ids (a new message id, a response prefix).
pub fn adapt(
    route: &Frontend,
    protocol: Protocol,
    obj: &Body,
    remembered: Option<&Remembered>,
    fresh: &mut dyn FnMut() -> String,
) -> Result<Adapted, BadBody> {
    match protocol {
        Protocol::AiSdk => ai_sdk(route, obj, fresh),
        Protocol::AgUi => ag_ui(route, obj, remembered, fresh),
    }
}

/// A chat or thread id: what the client names its conversation by (bounded, printable).
fn conversation_id(obj: &Map<String, Value>, key: &str) -> Result<String, BadBody> {
    match obj.get(key).and_then(Value::as_str) {
        Some(id) if ids::is_valid(id) && !id.is_empty() => Ok(id.to_owned()),
        Some(_) => Err(bad(key, "must be 1 to 256 bytes without control characters")),
        None => Err(bad(key, "missing, or not a string")),
    }
}

fn messages(obj: &Map<String, Value>) -> Result<&[Value], BadBody> {
    match obj.get("messages").and_then(Value::as_array) {
        Some(m) if !m.is_empty() => Ok(m),
        Some(_) => Err(bad("messages", "empty")),
        None => Err(bad("messages", "missing, or not an array")),
    }
}

/// `agent_type`: the request's, else the route's default.
fn agent_type(given: Option<&Value>, route: &Frontend, field: &str) -> Result<Option<String>, BadBody> {
    match given {
        None | Some(Value::Null) => Ok(route.agent_type.clone()),
        Some(Value::String(t)) if !t.is_empty() && t.len() <= 256 => Ok(Some(t.clone())),
        Some(_) => Err(bad(field, "must be a string of 1 to 256 bytes")),
    }
}

fn run_body(prompt: Value, agent: Option<&str>, agent_type: Option<String>) -> Vec<u8> {
    let mut body = Map::new();
    body.insert("user_prompt".into(), prompt);
    if let Some(a) = agent {
        body.insert("agent_uuid".into(), Value::from(a));
    }
    if let Some(t) = agent_type {
        body.insert("agent_type".into(), Value::from(t));
    }
    Value::Object(body).to_string().into_bytes()
}

fn tool_results_body(agent: &str, results: Vec<Value>) -> Vec<u8> {
    json!({"agent_uuid": agent, "tool_results": results})
        .to_string()
        .into_bytes()
}

/// A legacy content block for a file given as a data URL or a URL.
fn file_block(url: &str, media_type: &str) -> Value {
    let kind = if media_type.starts_with("image/") {
        "image"
    } else {
        "document"
    };
    match url.strip_prefix("data:").and_then(|r| r.split_once(";base64,")) {
        Some((mime, data)) => {
            let mime = if media_type.is_empty() { mime } else { media_type };
            json!({"type": kind, "source": {"type": "base64", "media_type": mime, "data": data}})
        }
        None => json!({"type": kind, "source": {"type": "url", "url": url}}),
    }
}

/// The prompt: the text alone, or the legacy content blocks when there are files.
fn prompt(text: Vec<&str>, files: Vec<Value>) -> Option<Value> {
    let joined = text.join("\n");
    if files.is_empty() {
        return (!joined.is_empty()).then(|| Value::from(joined));
    }
    let mut blocks = Vec::new();
    if !joined.is_empty() {
        blocks.push(json!({"type": "text", "text": joined}));
    }
    blocks.extend(files);
    Some(Value::Array(blocks))
}

/// The AI SDK's request (`DefaultChatTransport`): the last message says what the turn is.
fn ai_sdk(route: &Frontend, obj: &Map<String, Value>, fresh: &mut dyn FnMut() -> String) -> Result<Adapted, BadBody> {
    let chat = conversation_id(obj, id_key(Protocol::AiSdk))?;
    let messages = messages(obj)?;
    let at = messages.len() - 1;
    let last = &messages[at];
    let field = |rest: &str| format!("messages[{at}]{rest}");
    let parts = last
        .get("parts")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(field(".parts"), "missing, or not an array"))?;
    // The agent a chat continues: in-band, as the assistant message's metadata (`start`'s `messageMetadata`).
    let agent_of = |m: &Value| {
        m.get("metadata")
            .and_then(|md| md.get("agent"))
            .and_then(Value::as_str)
            .filter(|a| ids::is_valid(a) && !a.is_empty())
            .map(str::to_owned)
    };
    let agent = messages
        .iter()
        .rev()
        .filter(|m| m["role"] == "assistant")
        .find_map(agent_of);
    let kind = agent_type(obj.get("agent_type"), route, "agent_type")?;
    let prefix = fresh();
    match last.get("role").and_then(Value::as_str) {
        Some("user") => {
            let mut text = Vec::new();
            let mut files = Vec::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => text.push(p.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some("file") => {
                        let url = p.get("url").and_then(Value::as_str).unwrap_or("");
                        let media = p.get("mediaType").and_then(Value::as_str).unwrap_or("");
                        if !url.is_empty() {
                            files.push(file_block(url, media));
                        }
                    }
                    _ => {}
                }
            }
            let prompt = prompt(text, files).ok_or_else(|| bad(field(".parts"), "no text and no file"))?;
            let message_id = match obj.get("messageId").and_then(Value::as_str) {
                Some(id) if ids::is_valid(id) && !id.is_empty() => id.to_owned(),
                _ => fresh(),
            };
            Ok(Adapted {
                path: route.run.clone(),
                body: run_body(prompt, agent.as_deref(), kind),
                turn: Turn {
                    message_id,
                    prefix,
                    ..Turn::default()
                },
                chat,
                continuation: false,
            })
        }
        Some("assistant") => {
            // The page answered the calls the backend awaited: the last `data-awaiting-frontend-tools` names them.
            let awaited: Vec<&str> = parts
                .iter()
                .rev()
                .find(|p| p["type"] == "data-awaiting-frontend-tools")
                .and_then(|p| p.get("data").and_then(Value::as_array))
                .map(|calls| {
                    calls
                        .iter()
                        .filter_map(|c| c.get("tool_use_id").and_then(Value::as_str))
                        .collect()
                })
                .unwrap_or_default();
            let mut known = Vec::new();
            let mut results = Vec::new();
            for p in parts {
                let is_tool = p["type"] == "dynamic-tool" || p["type"].as_str().is_some_and(|t| t.starts_with("tool-"));
                let Some(id) = p.get("toolCallId").and_then(Value::as_str).filter(|_| is_tool) else {
                    continue;
                };
                known.push(id.to_owned());
                if !awaited.contains(&id) {
                    // A backend-run tool: its result is the backend's own, never sent back.
                    continue;
                }
                match p.get("state").and_then(Value::as_str) {
                    Some("output-available") => {
                        let content = match p.get("output") {
                            Some(Value::String(s)) => s.clone(),
                            Some(v) => v.to_string(),
                            None => String::new(),
                        };
                        results.push(json!({"tool_use_id": id, "content": content, "is_error": false}));
                    }
                    Some("output-error") => {
                        let text = p.get("errorText").and_then(Value::as_str).unwrap_or("");
                        results.push(json!({"tool_use_id": id, "content": text, "is_error": true}));
                    }
                    _ => {}
                }
            }
            if results.is_empty() {
                return Err(bad(field(".parts"), "answers none of the calls the backend awaited"));
            }
            let agent = agent_of(last)
                .or(agent)
                .ok_or_else(|| bad(field(".metadata.agent"), "missing: the turn's agent is not known"))?;
            let message_id = last
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| ids::is_valid(id) && !id.is_empty())
                .ok_or_else(|| bad(field(".id"), "missing, or not an id"))?
                .to_owned();
            Ok(Adapted {
                path: route.tool_results.clone(),
                body: tool_results_body(&agent, results),
                turn: Turn {
                    message_id,
                    prefix,
                    known_tools: known,
                    agent: Some(agent),
                    ..Turn::default()
                },
                chat,
                continuation: true,
            })
        }
        _ => Err(bad(field(".role"), "must be \"user\" or \"assistant\"")),
    }
}

/// AG-UI's `RunAgentInput`: the thread's trailing `tool` messages answer the awaited calls; else its last user
/// message is a new run.
fn ag_ui(
    route: &Frontend,
    obj: &Map<String, Value>,
    remembered: Option<&Remembered>,
    fresh: &mut dyn FnMut() -> String,
) -> Result<Adapted, BadBody> {
    let thread = conversation_id(obj, id_key(Protocol::AgUi))?;
    let run_id = conversation_id(obj, "runId")?;
    let messages = messages(obj)?;
    let kind = agent_type(
        obj.get("forwardedProps").and_then(|p| p.get("agent_type")),
        route,
        "forwardedProps.agent_type",
    )?;
    let known_tools: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .filter_map(|m| m.get("toolCalls").and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c.get("id").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let known_results: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m.get("toolCallId").and_then(Value::as_str).map(str::to_owned))
        .collect();
    // Ids unique across the thread: the run's own id starts them (a short fresh suffix keeps two reads apart).
    let prefix = format!("{}-{}", run_id, fresh());
    let turn = Turn {
        thread_id: thread.clone(),
        run_id: run_id.clone(),
        prefix,
        known_tools,
        known_results,
        agent: remembered.and_then(|r| r.agent.clone()),
        ..Turn::default()
    };
    let trailing = messages.iter().rev().take_while(|m| m["role"] == "tool");
    let awaited = remembered.map(|r| r.awaited.as_slice()).unwrap_or_default();
    let results: Vec<Value> = trailing
        .filter_map(|m| {
            let id = m.get("toolCallId").and_then(Value::as_str)?;
            if !awaited.iter().any(|a| a == id) {
                return None;
            }
            let error = m.get("error").and_then(Value::as_str);
            let content = match (error, m.get("content")) {
                (Some(e), _) => e.to_owned(),
                (None, Some(Value::String(s))) => s.clone(),
                (None, Some(Value::Array(parts))) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                (None, _) => String::new(),
            };
            Some(json!({"tool_use_id": id, "content": content, "is_error": error.is_some()}))
        })
        .collect();
    if !results.is_empty() {
        let agent = turn
            .agent
            .clone()
            .ok_or_else(|| bad("threadId", "the thread's agent is not known here"))?;
        return Ok(Adapted {
            path: route.tool_results.clone(),
            body: tool_results_body(&agent, results),
            turn,
            chat: thread,
            continuation: true,
        });
    }
    let at = messages.len() - 1;
    let last = &messages[at];
    if last["role"] != "user" {
        return Err(bad(
            format!("messages[{at}]"),
            "must be a user message, or tool messages answering the calls the run awaited",
        ));
    }
    let (text, files) = match last.get("content") {
        Some(Value::String(s)) => (vec![s.as_str()], Vec::new()),
        Some(Value::Array(parts)) => {
            let mut text = Vec::new();
            let mut files = Vec::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") => text.push(p.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some("image" | "document") => {
                        let source = &p["source"];
                        let mime = source.get("mimeType").and_then(Value::as_str).unwrap_or("");
                        let value = source.get("value").and_then(Value::as_str).unwrap_or("");
                        let url = match source.get("type").and_then(Value::as_str) {
                            Some("data") => format!("data:{mime};base64,{value}"),
                            _ => value.to_owned(),
                        };
                        let media = if p["type"] == "image" && mime.is_empty() {
                            "image/"
                        } else {
                            mime
                        };
                        files.push(file_block(&url, media));
                    }
                    _ => {}
                }
            }
            (text, files)
        }
        _ => return Err(bad(format!("messages[{at}].content"), "missing")),
    };
    let prompt = prompt(text, files).ok_or_else(|| bad(format!("messages[{at}].content"), "no text and no file"))?;
    Ok(Adapted {
        path: route.run.clone(),
        body: run_body(prompt, turn.agent.as_deref(), kind),
        turn,
        chat: thread,
        continuation: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> Frontend {
        Frontend {
            path: "/api/chat".into(),
            protocol: "ai-sdk".into(),
            run: "/agent/run".into(),
            tool_results: "/agent/tool_results".into(),
            agent_type: Some("default".into()),
        }
    }

    fn ids() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("g{n}")
        }
    }

    fn body(v: Value) -> Body {
        parse(v.to_string().as_bytes()).expect("an object")
    }

    #[test]
    fn ai_sdk_a_users_message_is_a_run_continuing_the_chats_agent() {
        let req = json!({"id": "chat-1", "trigger": "submit-message", "messages": [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]},
            {"id": "a1", "role": "assistant", "metadata": {"agent": "agent-7"}, "parts": []},
            {"id": "u2", "role": "user", "parts": [{"type": "text", "text": "again"},
                {"type": "file", "mediaType": "image/png", "url": "data:image/png;base64,AAAA"}]}
        ]});
        let a = adapt(&route(), Protocol::AiSdk, &body(req), None, &mut ids()).unwrap();
        assert_eq!(a.path, "/agent/run");
        let sent: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(sent["agent_uuid"], "agent-7");
        assert_eq!(sent["agent_type"], "default");
        assert_eq!(sent["user_prompt"][0], json!({"type": "text", "text": "again"}));
        assert_eq!(sent["user_prompt"][1]["source"]["data"], "AAAA");
        assert_eq!(a.chat, "chat-1");
        assert!(!a.continuation);
    }

    #[test]
    fn ai_sdk_answers_go_to_tool_results_for_the_awaited_calls_only() {
        let req = json!({"id": "c", "messages": [
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "where?"}]},
            {"id": "m1", "role": "assistant", "metadata": {"agent": "ag"}, "parts": [
                {"type": "dynamic-tool", "toolName": "ls", "toolCallId": "b1", "state": "output-available", "output": "x"},
                {"type": "dynamic-tool", "toolName": "get_location", "toolCallId": "f1", "state": "output-available", "output": {"city": "Paris"}},
                {"type": "data-awaiting-frontend-tools", "data": [{"tool_use_id": "f1", "name": "get_location"}]}
            ]}
        ]});
        let a = adapt(&route(), Protocol::AiSdk, &body(req), None, &mut ids()).unwrap();
        assert_eq!(a.path, "/agent/tool_results");
        let sent: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(
            sent,
            json!({"agent_uuid": "ag", "tool_results": [{"tool_use_id": "f1", "content": "{\"city\":\"Paris\"}", "is_error": false}]})
        );
        assert_eq!(a.turn.message_id, "m1");
        assert!(a.turn.known_tools.contains(&"b1".to_owned()));
    }

    #[test]
    fn ai_sdk_what_cannot_be_mapped_names_its_field() {
        let cases = [
            (json!({"messages": []}), "id"),
            (json!({"id": "c", "messages": []}), "messages"),
            (
                json!({"id": "c", "messages": [{"role": "user", "parts": []}]}),
                "messages[0].parts",
            ),
            (
                json!({"id": "c", "messages": [{"role": "system", "parts": []}]}),
                "messages[0].role",
            ),
            (
                json!({"id": "c", "messages": [{"id": "m", "role": "assistant", "parts": [{"type": "text", "text": "x"}]}]}),
                "messages[0].parts",
            ),
            (
                json!({"id": "c", "agent_type": 5, "messages": [{"role": "user", "parts": [{"type": "text", "text": "x"}]}]}),
                "agent_type",
            ),
        ];
        for (req, field) in cases {
            let e = adapt(&route(), Protocol::AiSdk, &body(req.clone()), None, &mut ids()).unwrap_err();
            assert_eq!(e.field, field, "{req}");
        }
        for not_an_object in [&b"{nope"[..], b"[1]"] {
            assert_eq!(parse(not_an_object).unwrap_err().field, "body");
        }
    }

    #[test]
    fn ag_ui_trailing_tool_messages_answer_the_remembered_calls_and_a_user_message_runs() {
        let input = json!({"threadId": "t1", "runId": "r2", "messages": [
            {"id": "u", "role": "user", "content": "where am I?"},
            {"id": "a", "role": "assistant", "toolCalls": [{"id": "f1", "type": "function", "function": {"name": "get_location", "arguments": "{}"}}]},
            {"id": "t", "role": "tool", "toolCallId": "f1", "content": "Paris"}
        ], "tools": [], "context": [], "forwardedProps": {}});
        let remembered = Remembered {
            agent: Some("ag".into()),
            awaited: vec!["f1".into()],
        };
        let a = adapt(
            &route(),
            Protocol::AgUi,
            &body(input.clone()),
            Some(&remembered),
            &mut ids(),
        )
        .unwrap();
        assert_eq!(a.path, "/agent/tool_results");
        assert_eq!(a.turn.known_results, ["f1"]);
        assert!(a.turn.prefix.starts_with("r2-"));
        // The same thread unknown here: the answer cannot be sent.
        let none = Remembered::default();
        let e = adapt(&route(), Protocol::AgUi, &body(input), Some(&none), &mut ids()).unwrap_err();
        assert_eq!(e.field, "messages[2]");
        let run =
            json!({"threadId": "t1", "runId": "r3", "messages": [{"id": "u", "role": "user", "content": "hello"}]});
        let a = adapt(&route(), Protocol::AgUi, &body(run), Some(&remembered), &mut ids()).unwrap();
        let sent: Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(
            sent,
            json!({"user_prompt": "hello", "agent_uuid": "ag", "agent_type": "default"})
        );
    }
}
