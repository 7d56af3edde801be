//! AG-UI 1.0 (DESIGN 5.3's second table): what `@ag-ui/client`'s `HttpAgent` reads, its `verifyEvents` rules kept
//! (`RUN_STARTED` first; nothing after `RUN_ERROR`; no `RUN_FINISHED` while a message, a tool call or a subagent is
//! open). Message ids start with the turn's prefix, made from the run, so they are unique across the thread; a
//! subagent is a `SUBAGENT_STARTED` lane whose blocks carry its `subagentRunId`; the gateway's extras go in
//! `metadata` (the client strips unknown fields). No `[DONE]`: the run ends with `RUN_FINISHED` or `RUN_ERROR`.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::blocks::{error_piece, Kept, Open, Seen, Settled, Writer};
use super::envelope::{json_or_text, string, Envelope, Streamed};
use super::turn::{write_event, Turn};
use crate::protocol::EnvelopeKind;

/// `metadata` naming the event's agent.
#[derive(Serialize)]
struct AgentOf<'a> {
    agent: &'a str,
}

/// A finished run's outcome.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Outcome<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pending_tool_call_ids: Option<&'a [String]>,
}

/// An event in its lane: a subagent's carries its `subagentRunId` (last), the root's none.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InLane<'a> {
    #[serde(flatten)]
    event: Event<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    subagent_run_id: Option<&'a str>,
}

/// Writes `event` in `lane`.
fn emit(out: &mut Vec<u8>, lane: Option<&str>, event: Event<'_>) {
    write_event(
        out,
        &InLane {
            event,
            subagent_run_id: lane,
        },
    );
}

/// An event about one message.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageOf<'a> {
    message_id: &'a str,
}

/// A message's content.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MessageDelta<'a> {
    message_id: &'a str,
    delta: &'a str,
}

/// The events the gateway writes, with their documented fields only.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", rename_all_fields = "camelCase")]
enum Event<'a> {
    RunStarted {
        thread_id: &'a str,
        run_id: &'a str,
    },
    RunFinished {
        thread_id: &'a str,
        run_id: &'a str,
        outcome: Outcome<'a>,
    },
    RunError {
        message: &'a str,
        code: &'a str,
    },
    TextMessageStart {
        message_id: &'a str,
        role: &'static str,
        metadata: AgentOf<'a>,
    },
    TextMessageContent(MessageDelta<'a>),
    TextMessageEnd(MessageOf<'a>),
    ReasoningStart {
        message_id: &'a str,
        metadata: AgentOf<'a>,
    },
    ReasoningMessageStart {
        message_id: &'a str,
        role: &'static str,
    },
    ReasoningMessageContent(MessageDelta<'a>),
    ReasoningMessageEnd(MessageOf<'a>),
    ReasoningEnd(MessageOf<'a>),
    ToolCallStart {
        tool_call_id: &'a str,
        tool_call_name: &'a str,
        metadata: &'a Value,
    },
    ToolCallArgs {
        tool_call_id: &'a str,
        delta: &'a str,
    },
    ToolCallEnd {
        tool_call_id: &'a str,
    },
    ToolCallResult {
        message_id: &'a str,
        tool_call_id: &'a str,
        content: &'a RawValue,
        role: &'static str,
    },
    Custom {
        name: &'a str,
        value: &'a RawValue,
    },
    SubagentStarted {
        subagent_run_id: &'a str,
        name: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        parent_subagent_run_id: Option<&'a str>,
        metadata: AgentOf<'a>,
    },
    SubagentFinished {
        subagent_run_id: &'a str,
    },
    SubagentError {
        subagent_run_id: &'a str,
        message: &'a str,
    },
}

/// An open subagent lane.
#[derive(Debug)]
struct Lane {
    agent: String,
    run_id: String,
    /// `run_id` as a JSON string literal.
    quoted: String,
}

/// One AG-UI read of one stream.
#[derive(Debug)]
pub struct AgUi {
    turn: Turn,
    kept: Kept,
    /// Tool results the client sent.
    answered: Seen,
    started: bool,
    /// Open subagents, outermost first.
    lanes: Vec<Lane>,
}

impl AgUi {
    pub fn new(turn: Turn) -> Self {
        Self {
            kept: Kept::new(&turn),
            answered: Seen::of(&turn.known_results),
            started: false,
            lanes: Vec::new(),
            turn,
        }
    }

    /// The most frequent envelope, a delta of an open text or thinking message in the lane already open, with
    /// nothing held, written without serde: its delta literal goes on as it is. `false`: not that case.
    fn streamed_fast(&mut self, data: &[u8], out: &mut Vec<u8>) -> bool {
        if !self.started || self.kept.reading.held.is_some() {
            return false;
        }
        let (Some(env), Some(root)) = (
            Streamed::read(data).filter(|e| !e.last),
            self.kept.reading.root.as_deref(),
        ) else {
            return false;
        };
        // Its lane must be the one open: the root's with none open, or the innermost subagent's.
        let lane = match self.lanes.last() {
            None if env.agent == root => None,
            Some(l) if l.agent == env.agent => Some(l.quoted.as_bytes()),
            _ => return false,
        };
        let Some(open) = self.kept.blocks.find_streamed(env.kind, env.agent) else {
            return false;
        };
        if !env.is_empty() {
            let head: &[u8] = match env.kind {
                EnvelopeKind::Thinking => b"data: {\"type\":\"REASONING_MESSAGE_CONTENT\",\"messageId\":",
                _ => b"data: {\"type\":\"TEXT_MESSAGE_CONTENT\",\"messageId\":",
            };
            for piece in [head, open.quoted.as_bytes(), b",\"delta\":", env.delta] {
                out.extend_from_slice(piece);
            }
            if let Some(lane) = lane {
                out.extend_from_slice(b",\"subagentRunId\":");
                out.extend_from_slice(lane);
            }
            out.extend_from_slice(b"}\n\n");
        }
        true
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        write_event(
            out,
            &Event::RunStarted {
                thread_id: &self.turn.thread_id,
                run_id: &self.turn.run_id,
            },
        );
    }

    /// The lane an agent's envelope is in: the root's (none), an open subagent's (those opened inside it finish),
    /// or, for an agent no `meta_init` announced (the Agent SDK's subagents), a new lane inside the innermost.
    fn enter(&mut self, agent: &str, root: &str, name: Option<&str>, out: &mut Vec<u8>) -> Option<String> {
        if agent == root {
            self.finish_lanes(0, out);
            return None;
        }
        if let Some(at) = self.lanes.iter().position(|l| l.agent == agent) {
            self.finish_lanes(at + 1, out);
            return Some(self.lanes[at].run_id.clone());
        }
        let run_id = self.kept.blocks.make_id("a");
        let parent = self.lanes.last().map(|l| l.run_id.clone());
        write_event(
            out,
            &Event::SubagentStarted {
                subagent_run_id: &run_id,
                name: name.unwrap_or(agent),
                parent_subagent_run_id: parent.as_deref(),
                metadata: AgentOf { agent },
            },
        );
        self.lanes.push(Lane {
            agent: agent.to_owned(),
            quoted: serde_json::to_string(&run_id).unwrap_or_default(),
            run_id: run_id.clone(),
        });
        Some(run_id)
    }

    fn lane_of(&self, agent: &str) -> Option<String> {
        self.lanes.iter().find(|l| l.agent == agent).map(|l| l.run_id.clone())
    }

    /// Finishes the lanes from `from` inward, innermost first, each after its open blocks.
    fn finish_lanes(&mut self, from: usize, out: &mut Vec<u8>) {
        while self.lanes.len() > from {
            self.end_lane(None, out);
        }
    }

    /// Ends the innermost lane after its open blocks: `SUBAGENT_FINISHED`, or `SUBAGENT_ERROR` with `error`.
    fn end_lane(&mut self, error: Option<&str>, out: &mut Vec<u8>) {
        let Some(lane) = self.lanes.pop() else {
            return;
        };
        for open in self.kept.blocks.take_all(Some(&lane.agent)) {
            self.close(open, Some(&lane.run_id), out);
        }
        let subagent_run_id = &lane.run_id;
        match error {
            None => write_event(out, &Event::SubagentFinished { subagent_run_id }),
            Some(message) => write_event(
                out,
                &Event::SubagentError {
                    subagent_run_id,
                    message,
                },
            ),
        }
    }

    /// Closes every open block and lane (before the run ends).
    fn close_all(&mut self, out: &mut Vec<u8>) {
        self.finish_lanes(0, out);
        for open in self.kept.blocks.take_all(None) {
            self.close(open, None, out);
        }
    }

    fn finish_run(&mut self, pending: Option<&[String]>, out: &mut Vec<u8>) {
        self.close_all(out);
        write_event(
            out,
            &Event::RunFinished {
                thread_id: &self.turn.thread_id,
                run_id: &self.turn.run_id,
                outcome: Outcome {
                    kind: "success",
                    pending_tool_call_ids: pending,
                },
            },
        );
        self.kept.done = true;
    }

    /// An error that ends the run: `SUBAGENT_ERROR` for a subagent's, then `RUN_ERROR`; nothing after.
    fn terminal(&mut self, agent: &str, text: &str, out: &mut Vec<u8>) {
        let code = serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| {
                v.get("type")
                    .or_else(|| v.get("error"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| "error".to_owned());
        if let Some(at) = self.lanes.iter().position(|l| l.agent == agent) {
            self.finish_lanes(at + 1, out);
            self.end_lane(Some(text), out);
        }
        self.close_all(out);
        write_event(
            out,
            &Event::RunError {
                message: text,
                code: &code,
            },
        );
        self.kept.done = true;
    }

    fn custom(&mut self, name: &str, value: &Value, lane: Option<&str>, out: &mut Vec<u8>) {
        let raw = serde_json::value::to_raw_value(value).unwrap_or_else(|_| string(""));
        emit(out, lane, Event::Custom { name, value: &raw });
    }

    /// A `text` or `thinking` envelope: its message's start, content, end.
    fn streamed(&mut self, env: &Envelope<'_>, lane: Option<&str>, out: &mut Vec<u8>) {
        let thinking = env.kind == EnvelopeKind::Thinking;
        let at = match self.kept.blocks.find(env.kind, env) {
            Some(at) => at,
            None => {
                let (at, evicted) = self.kept.blocks.open(env.kind, env, if thinking { "r" } else { "m" });
                self.close_evicted(evicted, out);
                let message_id = &self.kept.blocks.get_mut(at).out;
                let metadata = AgentOf { agent: &env.agent };
                if thinking {
                    emit(out, lane, Event::ReasoningStart { message_id, metadata });
                    emit(
                        out,
                        lane,
                        Event::ReasoningMessageStart {
                            message_id,
                            role: "reasoning",
                        },
                    );
                } else {
                    emit(
                        out,
                        lane,
                        Event::TextMessageStart {
                            message_id,
                            role: "assistant",
                            metadata,
                        },
                    );
                }
                at
            }
        };
        if !env.delta.is_empty() {
            let message_id = &self.kept.blocks.get_mut(at).out;
            let delta = &*env.delta;
            let piece = MessageDelta { message_id, delta };
            let event = if thinking {
                Event::ReasoningMessageContent(piece)
            } else {
                Event::TextMessageContent(piece)
            };
            emit(out, lane, event);
        }
        if env.last {
            let open = self.kept.blocks.take(at);
            self.close(open, lane, out);
        }
    }

    /// A `tool_call` or `server_tool_call` envelope: start, arguments, end.
    fn call(&mut self, env: &Envelope<'_>, lane: Option<&str>, out: &mut Vec<u8>) {
        let at = match self.kept.blocks.find(env.kind, env) {
            Some(at) => at,
            None => {
                let (at, evicted) = self.kept.blocks.open(env.kind, env, "c");
                self.close_evicted(evicted, out);
                let quiet = self.kept.announced.contains(&env.id);
                self.kept.blocks.get_mut(at).quiet = quiet;
                if !quiet {
                    self.kept.announced.insert(&env.id);
                    let server = env.kind == EnvelopeKind::ServerToolCall;
                    let metadata = json!({"agent": &*env.agent, "providerExecuted": server});
                    emit(
                        out,
                        lane,
                        Event::ToolCallStart {
                            tool_call_id: &env.id,
                            tool_call_name: &env.name,
                            metadata: &metadata,
                        },
                    );
                }
                at
            }
        };
        let quiet = self.kept.blocks.get_mut(at).quiet;
        if !quiet && !env.delta.is_empty() {
            emit(
                out,
                lane,
                Event::ToolCallArgs {
                    tool_call_id: &env.id,
                    delta: &env.delta,
                },
            );
        }
        if env.last {
            let open = self.kept.blocks.take(at);
            if !open.quiet {
                self.close(open, lane, out);
            }
        }
    }

    /// Announces a call the client has not seen, whole (a result or an awaited call for it came first).
    fn ensure_call(&mut self, id: &str, name: &str, agent: &str, args: &str, lane: Option<&str>, out: &mut Vec<u8>) {
        if self.kept.announced.contains(id) {
            return;
        }
        self.kept.announced.insert(id);
        let metadata = json!({ "agent": agent });
        emit(
            out,
            lane,
            Event::ToolCallStart {
                tool_call_id: id,
                tool_call_name: name,
                metadata: &metadata,
            },
        );
        emit(
            out,
            lane,
            Event::ToolCallArgs {
                tool_call_id: id,
                delta: args,
            },
        );
        emit(out, lane, Event::ToolCallEnd { tool_call_id: id });
    }

    /// A `tool_result` or `server_tool_result` envelope: kept until whole (with its images), then one
    /// `TOOL_CALL_RESULT`; a result the client sent is not echoed.
    fn result(&mut self, env: &Envelope<'_>, lane: Option<&str>, out: &mut Vec<u8>) {
        let (whole, evicted) = self.kept.blocks.collect(env.kind, env, "o");
        self.close_evicted(evicted, out);
        let Some(open) = whole else {
            return;
        };
        if self.answered.contains(&open.id) {
            return;
        }
        self.ensure_call(&open.id, &open.name, &open.agent, "{}", lane, out);
        let content = if open.images.is_empty() {
            string(&open.text)
        } else {
            let mut parts = vec![json!({"type": "text", "text": open.text})];
            for (src, media_type) in &open.images {
                let source = match src.strip_prefix("data:").and_then(|s| s.split_once(";base64,")) {
                    Some((mime, data)) => json!({"type": "data", "value": data, "mimeType": mime}),
                    None => json!({"type": "url", "value": src, "mimeType": media_type}),
                };
                parts.push(json!({"type": "image", "source": source}));
            }
            serde_json::value::to_raw_value(&parts).unwrap_or_else(|_| string(&open.text))
        };
        let message_id = self.kept.blocks.make_id("o");
        emit(
            out,
            lane,
            Event::ToolCallResult {
                message_id: &message_id,
                tool_call_id: &open.id,
                content: &content,
                role: "tool",
            },
        );
    }

    /// An envelope of a type read whole (`meta_*`, `awaiting_frontend_tools`): its block once complete.
    fn whole(&mut self, env: &Envelope<'_>, out: &mut Vec<u8>) -> Option<Open> {
        let (whole, evicted) = self.kept.blocks.collect(env.kind, env, "w");
        self.close_evicted(evicted, out);
        whole
    }

    fn whole_block(&mut self, open: Open, root: &str, lane: Option<&str>, out: &mut Vec<u8>) {
        let value = json_or_text(&open.text);
        let is_root = open.agent == root;
        match open.kind {
            EnvelopeKind::MetaInit if is_root => self.custom_raw("meta_init", &value, None, out),
            EnvelopeKind::MetaInit => {
                let init: Value = serde_json::from_str(value.get()).unwrap_or(Value::Null);
                let name = ["agent_name", "name", "agent_type"]
                    .iter()
                    .find_map(|k| init.get(k).and_then(Value::as_str))
                    .map(str::to_owned);
                // Its parent's lane holds it: lanes opened inside the parent finish first.
                if let Some(parent) = init.get("parent_agent_uuid").and_then(Value::as_str) {
                    if parent == root {
                        self.finish_lanes(0, out);
                    } else if let Some(at) = self.lanes.iter().position(|l| l.agent == parent) {
                        self.finish_lanes(at + 1, out);
                    }
                }
                let lane = self.enter(&open.agent, root, name.as_deref(), out);
                self.custom_raw("meta_init", &value, lane.as_deref(), out);
            }
            EnvelopeKind::MetaFinal if is_root => {
                self.custom_raw("meta_final", &value, None, out);
                self.finish_run(None, out);
            }
            EnvelopeKind::MetaFinal => {
                // A child's end finishes its lane.
                if let Some(at) = self.lanes.iter().position(|l| l.agent == open.agent) {
                    self.custom_raw("meta_final", &value, lane, out);
                    self.finish_lanes(at, out);
                }
            }
            EnvelopeKind::MetaFiles => self.custom_raw("meta_files", &value, lane, out),
            EnvelopeKind::AwaitingFrontendTools => {
                let awaited: Vec<Value> = serde_json::from_str(value.get()).unwrap_or_default();
                let mut pending = Vec::new();
                for call in &awaited {
                    let Some(id) = call.get("tool_use_id").and_then(Value::as_str) else {
                        continue;
                    };
                    let name = call.get("name").and_then(Value::as_str).unwrap_or("");
                    let args = call.get("input").map_or_else(|| "{}".to_owned(), Value::to_string);
                    self.ensure_call(id, name, &open.agent, &args, lane, out);
                    pending.push(id.to_owned());
                }
                self.finish_run(Some(&pending), out);
                self.kept.reading.awaited = Some(pending);
            }
            _ => {}
        }
    }

    fn custom_raw(&mut self, name: &str, value: &RawValue, lane: Option<&str>, out: &mut Vec<u8>) {
        emit(out, lane, Event::Custom { name, value });
    }

    /// Closes a block the protocol shows as open (a message, a reasoning message, a tool call).
    fn close(&mut self, open: Open, lane: Option<&str>, out: &mut Vec<u8>) {
        let of = || MessageOf { message_id: &open.out };
        match open.kind {
            EnvelopeKind::Text => emit(out, lane, Event::TextMessageEnd(of())),
            EnvelopeKind::Thinking => {
                emit(out, lane, Event::ReasoningMessageEnd(of()));
                emit(out, lane, Event::ReasoningEnd(of()));
            }
            EnvelopeKind::ToolCall | EnvelopeKind::ServerToolCall if !open.quiet => {
                emit(out, lane, Event::ToolCallEnd { tool_call_id: &open.id })
            }
            _ => {}
        }
    }

    fn close_evicted(&mut self, evicted: Option<Open>, out: &mut Vec<u8>) {
        if let Some(open) = evicted {
            let lane = self.lane_of(&open.agent);
            self.close(open, lane.as_deref(), out);
        }
    }
}

impl Writer for AgUi {
    fn event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.kept.done {
            return;
        }
        if data == b"[DONE]" {
            self.start(out);
            match self.kept.reading.held.take() {
                Some(held) => self.terminal(&held.agent, &held.text, out),
                None => self.finish_run(None, out),
            }
            return;
        }
        if self.streamed_fast(data, out) {
            return;
        }
        let Some(env) = Envelope::parse(data) else {
            return;
        };
        self.start(out);
        let root = self.kept.reading.root(&self.turn, &env);
        match self.kept.reading.settle(&env, &root) {
            Settled::Terminal(held) => return self.terminal(&held.agent, &held.text, out),
            Settled::Recoverable(held) => {
                let lane = self.lane_of(&held.agent);
                self.custom("error", &held.value(), lane.as_deref(), out);
            }
            Settled::Nothing => {}
        }
        // A child's `meta_init` opens its lane once whole; any other envelope of an agent is in its lane.
        let lane = if env.kind == EnvelopeKind::MetaInit && env.agent != root {
            None
        } else {
            self.enter(&env.agent, &root, None, out)
        };
        let lane = lane.as_deref();
        match env.kind {
            EnvelopeKind::Text | EnvelopeKind::Thinking => self.streamed(&env, lane, out),
            EnvelopeKind::ToolCall | EnvelopeKind::ServerToolCall => self.call(&env, lane, out),
            EnvelopeKind::ToolResult | EnvelopeKind::ServerToolResult => self.result(&env, lane, out),
            EnvelopeKind::ToolResultImage => {
                if let Some(at) = self.kept.blocks.find(EnvelopeKind::ToolResult, &env) {
                    let image = (env.src.to_string(), env.media_type.to_string());
                    self.kept.blocks.get_mut(at).images.push(image);
                }
            }
            EnvelopeKind::Citation => {
                let mut fields = env.citation_fields();
                fields.insert("agent".into(), Value::from(&*env.agent));
                fields.insert("cited_text".into(), Value::from(&*env.delta));
                self.custom("citation", &Value::Object(fields), lane, out);
            }
            EnvelopeKind::Error => {
                let (held, evicted) = error_piece(&mut self.kept.blocks, &env);
                self.close_evicted(evicted, out);
                self.kept.reading.held = held;
            }
            EnvelopeKind::MetaInit
            | EnvelopeKind::MetaFinal
            | EnvelopeKind::MetaFiles
            | EnvelopeKind::AwaitingFrontendTools => {
                if let Some(open) = self.whole(&env, out) {
                    self.whole_block(open, &root, lane, out);
                }
            }
        }
    }

    /// The held stream ended: a run that did not end ends with `RUN_ERROR`.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if self.kept.done {
            return;
        }
        self.start(out);
        match self.kept.reading.held.take() {
            Some(held) => self.terminal(&held.agent, &held.text, out),
            None => {
                let root = self.kept.reading.root.clone().unwrap_or_default();
                self.terminal(&root, "the stream ended before the run finished", out);
            }
        }
    }

    fn kept(&self) -> &Kept {
        &self.kept
    }
}
