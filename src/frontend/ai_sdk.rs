//! The Vercel AI SDK's UI Message Stream protocol v1 (DESIGN 5.3's first table): what `useChat`'s
//! `DefaultChatTransport` and `readUIMessageStream` read. One assistant message per response (a continuation's is the
//! message it continues); a step per model turn, so `lastAssistantMessageIsCompleteWithToolCalls` sees only the
//! page's own calls; every tool `dynamic` (the page did not declare the backend's tools); only documented fields,
//! the gateway's extras under `providerMetadata.gateway` and `messageMetadata`; `data: [DONE]` last.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::blocks::{error_piece, HeldError, Kept, Open, Settled, Writer};
use super::envelope::{empty_object, json_or_text, string, Envelope, Streamed};
use super::turn::{write_event, Turn};
use crate::protocol::EnvelopeKind;
use crate::sse::encoder::DONE;

/// `providerMetadata` naming the part's agent.
#[derive(Serialize)]
struct Meta<'a> {
    gateway: AgentOf<'a>,
}

#[derive(Serialize)]
struct AgentOf<'a> {
    agent: &'a str,
}

fn meta(agent: &str) -> Meta<'_> {
    Meta {
        gateway: AgentOf { agent },
    }
}

/// A text or reasoning part's start.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PartStart<'a> {
    id: &'a str,
    provider_metadata: Meta<'a>,
}

/// A text or reasoning part's delta.
#[derive(Serialize)]
struct PartDelta<'a> {
    id: &'a str,
    delta: &'a str,
}

/// A text or reasoning part's end.
#[derive(Serialize)]
struct PartEnd<'a> {
    id: &'a str,
}

/// A tool call's whole input, as `tool-input-available` and `tool-input-error` carry it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Call<'a> {
    tool_call_id: &'a str,
    tool_name: &'a str,
    input: &'a RawValue,
    dynamic: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    provider_executed: bool,
}

impl<'a> Call<'a> {
    fn new(tool_call_id: &'a str, tool_name: &'a str, input: &'a RawValue, provider_executed: bool) -> Self {
        Self {
            tool_call_id,
            tool_name,
            input,
            dynamic: true,
            provider_executed,
        }
    }
}

/// The chunks the gateway writes, with their documented fields only.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "kebab-case", rename_all_fields = "camelCase")]
enum Chunk<'a> {
    Start {
        message_id: &'a str,
        message_metadata: &'a Value,
    },
    StartStep,
    FinishStep,
    Finish {
        finish_reason: &'a str,
        message_metadata: &'a Value,
    },
    TextStart(PartStart<'a>),
    TextDelta(PartDelta<'a>),
    TextEnd(PartEnd<'a>),
    ReasoningStart(PartStart<'a>),
    ReasoningDelta(PartDelta<'a>),
    ReasoningEnd(PartEnd<'a>),
    ToolInputStart {
        tool_call_id: &'a str,
        tool_name: &'a str,
        dynamic: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        provider_executed: bool,
    },
    ToolInputDelta {
        tool_call_id: &'a str,
        input_text_delta: &'a str,
    },
    ToolInputAvailable {
        #[serde(flatten)]
        call: Call<'a>,
        provider_metadata: Meta<'a>,
    },
    ToolInputError {
        #[serde(flatten)]
        call: Call<'a>,
        error_text: &'a str,
    },
    ToolOutputAvailable {
        tool_call_id: &'a str,
        output: &'a RawValue,
        dynamic: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        provider_executed: bool,
    },
    ToolOutputError {
        tool_call_id: &'a str,
        error_text: &'a str,
        dynamic: bool,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        provider_executed: bool,
    },
    SourceUrl {
        source_id: &'a str,
        url: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        title: Option<&'a str>,
        provider_metadata: &'a Value,
    },
    SourceDocument {
        source_id: &'a str,
        media_type: &'a str,
        title: &'a str,
        provider_metadata: &'a Value,
    },
    File {
        url: &'a str,
        media_type: &'a str,
        provider_metadata: &'a Value,
    },
    DataAgent {
        id: &'a str,
        data: &'a Value,
    },
    DataAwaitingFrontendTools {
        data: &'a RawValue,
    },
    DataMetaFiles {
        data: &'a RawValue,
    },
    DataError {
        data: &'a Value,
    },
    Error {
        error_text: &'a str,
    },
}

impl<'a> Chunk<'a> {
    /// A reasoning or text part's start.
    fn start(thinking: bool, start: PartStart<'a>) -> Self {
        match thinking {
            true => Chunk::ReasoningStart(start),
            false => Chunk::TextStart(start),
        }
    }

    /// A reasoning or text part's delta.
    fn piece(thinking: bool, piece: PartDelta<'a>) -> Self {
        match thinking {
            true => Chunk::ReasoningDelta(piece),
            false => Chunk::TextDelta(piece),
        }
    }
}

/// Where the run stands for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Going,
    /// `finish` went out: only `[DONE]` follows.
    Finished,
    /// A terminal `error` went out: the client stops reading there.
    Failed,
}

/// One AI SDK read of one stream.
#[derive(Debug)]
pub struct AiSdk {
    turn: Turn,
    kept: Kept,
    started: bool,
    run: Run,
    /// A root tool result went out since the step began: the root's next block is the model's next turn.
    results_in_step: bool,
}

impl AiSdk {
    pub fn new(turn: Turn) -> Self {
        Self {
            kept: Kept::new(&turn),
            started: false,
            run: Run::Going,
            results_in_step: false,
            turn,
        }
    }

    /// The most frequent envelope, a delta of an open text or thinking block with nothing held, written without
    /// serde: its delta literal goes on as it is. `false`: not that case, nothing done.
    fn streamed_fast(&mut self, data: &[u8], out: &mut Vec<u8>) -> bool {
        if self.run != Run::Going || !self.started || self.kept.reading.held.is_some() {
            return false;
        }
        let Some(env) = Streamed::read(data).filter(|e| !e.last) else {
            return false;
        };
        let Some(open) = self.kept.blocks.find_streamed(env.kind, env.agent) else {
            return false;
        };
        if !env.is_empty() {
            let head: &[u8] = match env.kind {
                EnvelopeKind::Thinking => b"data: {\"type\":\"reasoning-delta\",\"id\":",
                _ => b"data: {\"type\":\"text-delta\",\"id\":",
            };
            for piece in [head, open.quoted.as_bytes(), b",\"delta\":", env.delta, b"}\n\n"] {
                out.extend_from_slice(piece);
            }
        }
        true
    }

    /// `[DONE]`: the run ended; a held error ended it.
    fn end(&mut self, out: &mut Vec<u8>) {
        if let Some(held) = self.kept.reading.held.take() {
            self.terminal(&held, out);
        }
        if self.run == Run::Going {
            let root = self.kept.reading.root.clone().unwrap_or_default();
            if !self.started {
                self.start(&root, None, out);
            }
            let metadata = json!({ "agent": root });
            self.finish_run("stop", &metadata, out);
        }
        self.write_done(out);
    }

    fn write_done(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(DONE);
        self.kept.done = true;
    }

    fn start(&mut self, root: &str, meta_init: Option<&RawValue>, out: &mut Vec<u8>) {
        self.started = true;
        let metadata = match meta_init {
            Some(init) => json!({"agent": root, "meta_init": init}),
            None => json!({ "agent": root }),
        };
        write_event(
            out,
            &Chunk::Start {
                message_id: &self.turn.message_id,
                message_metadata: &metadata,
            },
        );
        write_event(out, &Chunk::StartStep);
    }

    /// A root block starts: after the root's tool results it is the model's next turn, a step of its own.
    fn block_starts(&mut self, agent: &str, root: &str, out: &mut Vec<u8>) {
        if agent == root && std::mem::take(&mut self.results_in_step) {
            self.next_step(out);
        }
    }

    /// `finish-step`, `start-step`. The client forgets open text and reasoning parts at `finish-step`: they end
    /// first, and a block that goes on opens a new part in the next step.
    fn next_step(&mut self, out: &mut Vec<u8>) {
        let streamed = |o: &Open| matches!(o.kind, EnvelopeKind::Text | EnvelopeKind::Thinking);
        for open in self.kept.blocks.take_where(streamed) {
            self.close(open, out);
        }
        write_event(out, &Chunk::FinishStep);
        write_event(out, &Chunk::StartStep);
    }

    fn terminal(&mut self, held: &HeldError, out: &mut Vec<u8>) {
        self.terminal_text(&held.text, out);
    }

    fn terminal_text(&mut self, text: &str, out: &mut Vec<u8>) {
        write_event(out, &Chunk::Error { error_text: text });
        self.run = Run::Failed;
    }

    /// `finish-step`, `finish`: what is open closes first, and a step ending on the backend's tool results is
    /// followed by an empty one (else the page would take them for its own and post again).
    fn finish_run(&mut self, reason: &str, metadata: &Value, out: &mut Vec<u8>) {
        for open in self.kept.blocks.take_all(None) {
            self.close(open, out);
        }
        if std::mem::take(&mut self.results_in_step) {
            self.next_step(out);
        }
        write_event(out, &Chunk::FinishStep);
        write_event(
            out,
            &Chunk::Finish {
                finish_reason: reason,
                message_metadata: metadata,
            },
        );
        self.run = Run::Finished;
    }

    /// A `text` or `thinking` envelope: its part's start, delta, end.
    fn streamed(&mut self, env: &Envelope<'_>, root: &str, out: &mut Vec<u8>) {
        let thinking = env.kind == EnvelopeKind::Thinking;
        let tag = if thinking { "r" } else { "t" };
        let at = match self.kept.blocks.find(env.kind, env) {
            Some(at) => at,
            None => {
                self.block_starts(&env.agent, root, out);
                let (at, evicted) = self.kept.blocks.open(env.kind, env, tag);
                self.close_evicted(evicted, out);
                let id = &self.kept.blocks.get_mut(at).out;
                let provider_metadata = meta(&env.agent);
                write_event(out, &Chunk::start(thinking, PartStart { id, provider_metadata }));
                at
            }
        };
        if !env.delta.is_empty() {
            let id = &self.kept.blocks.get_mut(at).out;
            write_event(out, &Chunk::piece(thinking, PartDelta { id, delta: &env.delta }));
        }
        if env.last {
            let open = self.kept.blocks.take(at);
            self.close(open, out);
        }
    }

    /// A `tool_call` or `server_tool_call` envelope: the input streams, then goes out whole.
    fn call(&mut self, env: &Envelope<'_>, root: &str, out: &mut Vec<u8>) {
        let server = env.kind == EnvelopeKind::ServerToolCall;
        let at = match self.kept.blocks.find(env.kind, env) {
            Some(at) => at,
            None => {
                self.block_starts(&env.agent, root, out);
                let (at, evicted) = self.kept.blocks.open(env.kind, env, "c");
                self.close_evicted(evicted, out);
                // A call the message already holds is not announced twice.
                let quiet = self.kept.announced.contains(&env.id);
                self.kept.blocks.get_mut(at).quiet = quiet;
                if !quiet {
                    write_event(
                        out,
                        &Chunk::ToolInputStart {
                            tool_call_id: &env.id,
                            tool_name: &env.name,
                            dynamic: true,
                            provider_executed: server,
                        },
                    );
                }
                at
            }
        };
        let open = self.kept.blocks.get_mut(at);
        if !open.quiet && !env.delta.is_empty() {
            open.push(&env.delta);
            write_event(
                out,
                &Chunk::ToolInputDelta {
                    tool_call_id: &env.id,
                    input_text_delta: &env.delta,
                },
            );
        }
        if env.last {
            let open = self.kept.blocks.take(at);
            if !open.quiet {
                self.input_available(&open, server, out);
            }
        }
    }

    /// The call's whole input (`{}` when it had none).
    fn input_available(&mut self, open: &Open, server: bool, out: &mut Vec<u8>) {
        self.kept.announced.insert(&open.id);
        if open.cut {
            let error_text = format!("tool input over {} bytes", super::blocks::MAX_BUFFER);
            write_event(
                out,
                &Chunk::ToolInputError {
                    call: Call::new(&open.id, &open.name, &string(""), server),
                    error_text: &error_text,
                },
            );
            return;
        }
        let input = if open.text.trim().is_empty() {
            empty_object()
        } else {
            json_or_text(&open.text)
        };
        write_event(
            out,
            &Chunk::ToolInputAvailable {
                call: Call::new(&open.id, &open.name, &input, server),
                provider_metadata: meta(&open.agent),
            },
        );
    }

    /// Announces a call the client has not seen (a result or an awaited call for it came first).
    fn ensure_call(&mut self, id: &str, name: &str, agent: &str, input: &RawValue, server: bool, out: &mut Vec<u8>) {
        if self.kept.announced.contains(id) {
            return;
        }
        self.kept.announced.insert(id);
        write_event(
            out,
            &Chunk::ToolInputStart {
                tool_call_id: id,
                tool_name: name,
                dynamic: true,
                provider_executed: server,
            },
        );
        write_event(
            out,
            &Chunk::ToolInputAvailable {
                call: Call::new(id, name, input, server),
                provider_metadata: meta(agent),
            },
        );
    }

    /// A `tool_result` or `server_tool_result` envelope: kept until whole, then its output.
    fn result(&mut self, env: &Envelope<'_>, root: &str, out: &mut Vec<u8>) {
        let server = env.kind == EnvelopeKind::ServerToolResult;
        let (whole, evicted) = self.kept.blocks.collect(env.kind, env, "o");
        self.close_evicted(evicted, out);
        let Some(open) = whole else {
            return;
        };
        self.ensure_call(&open.id, &open.name, &open.agent, &empty_object(), server, out);
        if open.cut {
            let error_text = format!("tool output over {} bytes", super::blocks::MAX_BUFFER);
            write_event(
                out,
                &Chunk::ToolOutputError {
                    tool_call_id: &open.id,
                    error_text: &error_text,
                    dynamic: true,
                    provider_executed: server,
                },
            );
        } else {
            // A client tool's result is its text (DESIGN 3.2); a server tool's is JSON.
            let output = if server {
                json_or_text(&open.text)
            } else {
                string(&open.text)
            };
            write_event(
                out,
                &Chunk::ToolOutputAvailable {
                    tool_call_id: &open.id,
                    output: &output,
                    dynamic: true,
                    provider_executed: server,
                },
            );
        }
        if !server && open.agent == root {
            self.results_in_step = true;
        }
    }

    /// A `citation`: a source part, its fields under `providerMetadata.gateway`.
    fn citation(&mut self, env: &Envelope<'_>, out: &mut Vec<u8>) {
        let mut fields = env.citation_fields();
        fields.insert("agent".into(), Value::from(&*env.agent));
        fields.insert("cited_text".into(), Value::from(&*env.delta));
        let source_id = self.kept.blocks.make_id("s");
        let url = fields.get("url").and_then(Value::as_str).unwrap_or("").to_owned();
        let title = fields.get("title").and_then(Value::as_str).map(str::to_owned);
        let document_title = fields.get("document_title").and_then(Value::as_str).map(str::to_owned);
        let pm = json!({ "gateway": fields });
        if url.is_empty() {
            write_event(
                out,
                &Chunk::SourceDocument {
                    source_id: &source_id,
                    media_type: "text/plain",
                    title: document_title.as_deref().or(title.as_deref()).unwrap_or(""),
                    provider_metadata: &pm,
                },
            );
        } else {
            write_event(
                out,
                &Chunk::SourceUrl {
                    source_id: &source_id,
                    url: &url,
                    title: title.as_deref(),
                    provider_metadata: &pm,
                },
            );
        }
    }

    /// An envelope of a type read whole (`meta_*`, `awaiting_frontend_tools`): its block once complete.
    fn whole(&mut self, env: &Envelope<'_>, out: &mut Vec<u8>) -> Option<Open> {
        let (whole, evicted) = self.kept.blocks.collect(env.kind, env, "w");
        self.close_evicted(evicted, out);
        whole
    }

    fn whole_block(&mut self, open: Open, root: &str, out: &mut Vec<u8>) {
        let value = json_or_text(&open.text);
        let is_root = open.agent == root;
        match open.kind {
            EnvelopeKind::MetaInit if is_root && !self.started => self.start(root, Some(&value), out),
            EnvelopeKind::MetaInit if !is_root => {
                let parent = serde_json::from_str::<Value>(value.get())
                    .ok()
                    .and_then(|v| v.get("parent_agent_uuid").cloned())
                    .unwrap_or(Value::Null);
                let data = json!({"agent": &open.agent, "parent": parent, "meta_init": &*value});
                write_event(
                    out,
                    &Chunk::DataAgent {
                        id: &open.agent,
                        data: &data,
                    },
                );
            }
            EnvelopeKind::MetaFinal if is_root => {
                let metadata = json!({"agent": root, "meta_final": &*value});
                self.finish_run("stop", &metadata, out);
            }
            EnvelopeKind::MetaFiles => write_event(out, &Chunk::DataMetaFiles { data: &value }),
            EnvelopeKind::AwaitingFrontendTools => {
                // The awaited calls, announced if the stream has not (the page answers them in `onToolCall`).
                let awaited: Vec<Value> = serde_json::from_str(value.get()).unwrap_or_default();
                let ids = awaited
                    .iter()
                    .filter_map(|c| c.get("tool_use_id").and_then(Value::as_str));
                self.kept.reading.awaited = Some(ids.map(str::to_owned).collect());
                for call in &awaited {
                    let id = call.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                    let name = call.get("name").and_then(Value::as_str).unwrap_or("");
                    let input = call
                        .get("input")
                        .map_or_else(empty_object, |i| json_or_text(&i.to_string()));
                    if !id.is_empty() {
                        self.ensure_call(id, name, &open.agent, &input, false, out);
                    }
                }
                write_event(out, &Chunk::DataAwaitingFrontendTools { data: &value });
                // The awaited calls are this step's: no empty step after the backend's results here.
                self.results_in_step = false;
                let metadata = json!({ "agent": root });
                self.finish_run("tool-calls", &metadata, out);
            }
            // A child's `meta_final` finishes nothing.
            _ => {}
        }
    }

    /// Closes a block the protocol shows as open (a text or reasoning part).
    fn close(&mut self, open: Open, out: &mut Vec<u8>) {
        match open.kind {
            EnvelopeKind::Text => write_event(out, &Chunk::TextEnd(PartEnd { id: &open.out })),
            EnvelopeKind::Thinking => write_event(out, &Chunk::ReasoningEnd(PartEnd { id: &open.out })),
            _ => {}
        }
    }

    fn close_evicted(&mut self, evicted: Option<Open>, out: &mut Vec<u8>) {
        if let Some(open) = evicted {
            self.close(open, out);
        }
    }
}

impl Writer for AiSdk {
    fn event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.kept.done {
            return;
        }
        if data == b"[DONE]" {
            self.end(out);
            return;
        }
        if self.streamed_fast(data, out) {
            return;
        }
        let Some(env) = Envelope::parse(data) else {
            return;
        };
        if self.run != Run::Going {
            return;
        }
        let root = self.kept.reading.root(&self.turn, &env);
        let is_root = env.agent == root;
        match self.kept.reading.settle(&env, &root) {
            Settled::Terminal(held) => return self.terminal(&held, out),
            Settled::Recoverable(held) => write_event(out, &Chunk::DataError { data: &held.value() }),
            Settled::Nothing => {}
        }
        let whole_root_init = is_root && env.kind == EnvelopeKind::MetaInit;
        if !self.started && !whole_root_init {
            self.start(&root, None, out);
        }
        match env.kind {
            EnvelopeKind::Text | EnvelopeKind::Thinking => self.streamed(&env, &root, out),
            EnvelopeKind::ToolCall | EnvelopeKind::ServerToolCall => self.call(&env, &root, out),
            EnvelopeKind::ToolResult | EnvelopeKind::ServerToolResult => self.result(&env, &root, out),
            EnvelopeKind::ToolResultImage => {
                let pm = json!({"gateway": {"agent": &*env.agent, "toolCallId": &*env.id}});
                write_event(
                    out,
                    &Chunk::File {
                        url: &env.src,
                        media_type: &env.media_type,
                        provider_metadata: &pm,
                    },
                );
            }
            EnvelopeKind::Citation => self.citation(&env, out),
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
                    self.whole_block(open, &root, out);
                }
            }
        }
    }

    /// The held stream ended: a run that did not end says so, then `[DONE]`.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if self.kept.done {
            return;
        }
        if let Some(held) = self.kept.reading.held.take() {
            self.terminal(&held, out);
        } else if self.run == Run::Going {
            if !self.started {
                let root = self.kept.reading.root.clone().unwrap_or_default();
                self.start(&root, None, out);
            }
            self.terminal_text("the stream ended before the run finished", out);
        }
        self.write_done(out);
    }

    fn kept(&self) -> &Kept {
        &self.kept
    }
}
