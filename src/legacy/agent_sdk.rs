//! The Agent SDK dialect (DESIGN 3.7; docs/TRANSLATION.md has the table): one `SDKMessage` per SSE event, as the
//! Claude Agent SDK's `stream-json` writes them, and the simplified shapes of seed 004. A `stream_event` carries a
//! raw model event, translated by the raw dialect's rules (`raw::RawBlocks`); an `assistant` message's blocks go
//! out whole unless they already streamed; tool results, `result` and errors map to their envelopes. Every message
//! names its agent: `parent_tool_use_id` is a subagent's, absent or null the root's (`system` init's session).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::body::ToolResultCtx;
use super::fast;
use super::raw::{stop, str_field, RawBlocks, RawEvent};
use super::report::{self, Fault};
use super::scope::Scopes;
use crate::envelope::chunker::{Chunked, Sink};
use crate::envelope::{ids, pyjson, BlockHeader, EnvelopeKind, Extras, PyStyle};
use crate::pipeline::{Observer, Options, ParseErrorKind, StreamEnd};

/// Message ids remembered as streamed, and tool calls remembered as sent (their names answer results).
pub const MAX_REMEMBERED: usize = 1024;
/// Agents with open blocks at once; a message of one more closes the oldest's blocks.
pub const MAX_AGENTS: usize = 64;
/// The index an `assistant` message's whole block is opened and stopped at, clear of any streamed index.
const WHOLE: u64 = u64::MAX;

/// One message; only the keys the translation reads.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(rename = "type", borrow)]
    ty: Cow<'a, str>,
    #[serde(borrow, default)]
    subtype: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    parent_tool_use_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    session_id: Option<Cow<'a, str>>,
    /// `stream_event`'s raw model event.
    #[serde(borrow, default)]
    event: Option<RawEvent<'a>>,
    /// `assistant` / `user` (the API message); seed `assistant_message`. Read further only where needed: most
    /// `assistant` messages repeat a message that streamed.
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
    /// `result`: the final text (SDK) or an object (seed 004).
    #[serde(default)]
    result: Option<Value>,
    /// Seed 004's `tool_use` and `tool_result` messages.
    #[serde(default)]
    tool_use: Option<Map<String, Value>>,
    #[serde(default)]
    tool_result: Option<Map<String, Value>>,
    /// Seed 004's `error`.
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    model: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    stop_reason: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    num_turns: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    total_cost_usd: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    usage: Option<Value>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(default)]
    errors: Option<Vec<Value>>,
}

/// An API message's parts, its content left unread.
#[derive(Deserialize)]
struct ApiMessage<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

impl<'a> ApiMessage<'a> {
    /// `message` if it is an object, else an empty one.
    fn of(message: &'a RawValue) -> Self {
        serde_json::from_str(message.get()).unwrap_or(ApiMessage {
            id: None,
            content: None,
        })
    }

    /// Its content blocks (objects only).
    fn blocks(&self) -> Vec<Map<String, Value>> {
        let blocks = self
            .content
            .and_then(|c| serde_json::from_str::<Vec<Value>>(c.get()).ok());
        blocks
            .unwrap_or_default()
            .into_iter()
            .filter_map(|b| match b {
                Value::Object(m) => Some(m),
                _ => None,
            })
            .collect()
    }
}

/// A key that is present, `null` included (`Option<Value>` alone reads `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// One agent's open raw blocks.
#[derive(Debug)]
struct Agent {
    /// `parent_tool_use_id`, or "" for the root.
    key: String,
    raw: RawBlocks,
    /// Deltas streamed since this agent's last `assistant` message (seed 004 sends them without message ids).
    streamed_since_message: bool,
}

/// One Agent SDK stream's state.
#[derive(Debug, Default)]
pub struct AgentSdk {
    agents: Vec<Agent>,
    /// Ids of messages whose blocks streamed (`message_start` seen).
    streamed: Remembered,
    /// Tool calls sent: their ids, with their names.
    calls: Remembered,
    init_sent: bool,
    started: bool,
    /// The last message was a `result`: the stream may end cleanly here.
    ended: bool,
    /// A seed `error` ended the run: nothing after it is translated; it ends as a finished run.
    over: bool,
    /// The `error` message's `session_id`, for the run's `meta_final`.
    over_session: Option<String>,
    /// Where a delta's escaped text is decoded, kept from message to message.
    scratch: String,
}

impl AgentSdk {
    /// Whether `ty` is an `SDKMessage` type (or a seed 004 one).
    pub fn knows(ty: &str) -> bool {
        matches!(
            ty,
            "system"
                | "stream_event"
                | "assistant"
                | "user"
                | "result"
                | "tool_progress"
                | "auth_status"
                | "rate_limit_event"
                | "tool_use_summary"
                | "prompt_suggestion"
                | "assistant_message"
                | "tool_use"
                | "tool_result"
                | "error"
        )
    }

    pub fn buffered(&self) -> usize {
        self.agents.iter().map(|a| a.raw.buffered()).sum::<usize>()
            + self.streamed.bytes
            + self.calls.bytes
            + self.scratch.capacity()
            + self.over_session.as_ref().map_or(0, String::capacity)
    }

    /// One complete message.
    pub fn event(
        &mut self,
        ev: &[u8],
        scopes: &mut Scopes,
        opts: &Options,
        sink: &mut Sink<impl Observer>,
    ) -> Result<StreamEnd, Fault> {
        let first = !std::mem::replace(&mut self.started, true);
        if self.fast_delta(ev, scopes, opts, sink) {
            return Ok(StreamEnd::Cut);
        }
        let msg: Message<'_> = serde_json::from_slice(ev).map_err(|e| Fault::of_json(&e, "an Agent SDK message"))?;
        if !Self::knows(&msg.ty) {
            if first {
                // Said once, for a misconfigured dialect; later unknown types are the SDK growing.
                let message = format!(
                    "not an Agent SDK message: the stream's first message has type {:?}",
                    msg.ty
                );
                return Err(Fault::new(ParseErrorKind::Unexpected, message));
            }
            // The union grows with every SDK release: a type we do not know is skipped, not an error.
            sink.obs.unknown_tag();
            return Ok(StreamEnd::Cut);
        }
        if self.over {
            return Ok(StreamEnd::Failed);
        }
        let agent = msg.parent_tool_use_id.as_deref().filter(|a| !a.is_empty());
        let agent = agent.map(|a| report::safe_id(scopes, a, "parent_tool_use_id", sink));
        scopes.enter(agent.filter(|a| !a.is_empty()));
        let key = agent.unwrap_or("");
        match &*msg.ty {
            "system" => {
                if msg.subtype.as_deref() == Some("init") && !std::mem::replace(&mut self.init_sent, true) {
                    self.init(&msg, scopes, opts, sink);
                }
                return Ok(StreamEnd::Cut);
            }
            "stream_event" => {
                if let Some(event) = msg.event {
                    self.stream_event(key, event, scopes, opts, sink);
                }
            }
            "assistant" | "assistant_message" => {
                if let Some(message) = msg.message {
                    self.assistant(key, ApiMessage::of(message), scopes, sink);
                }
            }
            "tool_use" => {
                if let Some(mut block) = msg.tool_use {
                    block.insert("type".into(), Value::from("tool_use"));
                    self.whole_block(key, block, scopes, sink);
                }
            }
            "user" => {
                let blocks = msg.message.map(|m| ApiMessage::of(m).blocks()).unwrap_or_default();
                for block in blocks {
                    if block.get("type").and_then(Value::as_str) == Some("tool_result") {
                        self.tool_result(block, scopes, sink);
                    }
                }
            }
            "tool_result" => {
                if let Some(block) = msg.tool_result {
                    self.tool_result(block, scopes, sink);
                }
            }
            "result" => {
                scopes.enter(None);
                self.result(&msg, scopes, sink);
                self.ended = true;
                return Ok(StreamEnd::Cut);
            }
            "error" => {
                scopes.enter(None);
                self.close_all(scopes, sink);
                let error = msg.error.unwrap_or(Value::Null);
                let field = |k: &str| error.get(k).cloned().unwrap_or(Value::Null);
                let delta = serde_json::json!({"error": field("type"), "message": field("message")});
                let style = EnvelopeKind::Error.json_text().unwrap_or(PyStyle::Ascii);
                report::error_envelope(scopes, &pyjson::to_string(&delta, style), sink);
                self.over = true;
                self.over_session = msg.session_id.map(Cow::into_owned);
                return Ok(StreamEnd::Failed);
            }
            // Progress, status and rate-limit notices carry nothing the envelopes have.
            _ => return Ok(StreamEnd::Cut),
        }
        self.ended = false;
        Ok(StreamEnd::Cut)
    }

    /// The most frequent message, a `stream_event` delta for an open block, read without serde (`fast`): the same
    /// steps as `event` and `stream_event`. `false`: not that message, or not for an open block, nothing done.
    fn fast_delta(&mut self, ev: &[u8], scopes: &mut Scopes, opts: &Options, sink: &mut Sink<impl Observer>) -> bool {
        let mut scratch = std::mem::take(&mut self.scratch);
        let taken = match fast::sdk_delta(ev, &mut scratch) {
            Some(delta) => self.fast_piece(delta, scopes, opts, sink),
            None => false,
        };
        self.keep(scratch);
        taken
    }

    /// Puts the decoding buffer back, unless one large event grew it past `fast::SCRATCH_KEEP`.
    fn keep(&mut self, scratch: String) {
        if scratch.capacity() <= fast::SCRATCH_KEEP {
            self.scratch = scratch;
        }
    }

    /// `fast_delta`'s steps once the message is read.
    fn fast_piece(
        &mut self,
        delta: fast::SdkDelta<'_>,
        scopes: &mut Scopes,
        opts: &Options,
        sink: &mut Sink<impl Observer>,
    ) -> bool {
        if self.over {
            return false;
        }
        let parent = delta.parent.filter(|p| !p.is_empty());
        if parent.is_some_and(|p| !ids::is_valid(p)) {
            // Its error envelope is the slow path's to write.
            return false;
        }
        let key = parent.unwrap_or("");
        let Some(at) = self.agents.iter().position(|a| a.key == key) else {
            return false;
        };
        if self.agents[at].raw.get_mut(delta.index).is_none() {
            return false;
        }
        scopes.enter(parent);
        let agent = &mut self.agents[at];
        agent.streamed_since_message = true;
        agent
            .raw
            .piece(delta.index, delta.kind, delta.text, scopes, opts.max_item_bytes, sink);
        self.ended = false;
        true
    }

    /// `system` init: the root agent is the session, and `meta_init` says so.
    fn init(&mut self, msg: &Message<'_>, scopes: &mut Scopes, opts: &Options, sink: &mut Sink<impl Observer>) {
        let session = msg.session_id.as_deref().unwrap_or("");
        let session = report::safe_id(scopes, session, "session_id", sink);
        scopes.enter(None);
        if !session.is_empty() {
            scopes.meta_init(Some(session), None);
        }
        let format = if opts.rewrite_format { "json" } else { "agent_sdk" };
        let mut init = Map::new();
        init.insert("format".into(), Value::from(format));
        init.insert("agent_uuid".into(), Value::from(session));
        init.insert("parent_agent_uuid".into(), Value::Null);
        if let Some(model) = &msg.model {
            init.insert("model".into(), model.clone());
        }
        let header = BlockHeader::new(EnvelopeKind::MetaInit, scopes.agent(), Extras::new());
        sink.whole(header, &pyjson::to_string(&Value::Object(init), PyStyle::Unicode));
    }

    /// The open blocks of agent `key`, made room for.
    fn agent(&mut self, key: &str, scopes: &mut Scopes, sink: &mut Sink<impl Observer>) -> &mut Agent {
        let at = match self.agents.iter().position(|a| a.key == key) {
            Some(at) => at,
            None => {
                if self.agents.len() == MAX_AGENTS {
                    let mut oldest = self.agents.remove(0);
                    sink.obs.scope_conflict();
                    oldest.raw.close_all(scopes, sink);
                }
                self.agents.push(Agent {
                    key: key.to_owned(),
                    raw: RawBlocks::default(),
                    streamed_since_message: false,
                });
                self.agents.len() - 1
            }
        };
        &mut self.agents[at]
    }

    fn stream_event(
        &mut self,
        key: &str,
        event: RawEvent<'_>,
        scopes: &mut Scopes,
        opts: &Options,
        sink: &mut Sink<impl Observer>,
    ) {
        let ty = event.ty.as_deref().unwrap_or("");
        if ty == "message_start" {
            if let Some(id) = event.message.as_ref().and_then(|m| m.id.as_deref()) {
                self.streamed.insert(id, "");
            }
            return;
        }
        let index = event.index.unwrap_or(0);
        if ty == "content_block_start" {
            if let Some(id) = event.content_block.as_ref().and_then(tool_id) {
                let name = event.content_block.as_ref().map_or("", |b| str_field(b, "name"));
                self.calls.insert(id, name);
            }
        }
        let agent = self.agent(key, scopes, sink);
        agent.streamed_since_message = true;
        if ty == "content_block_delta" && agent.raw.get_mut(index).is_none() {
            // Seed 004's text deltas come with no block start: the first opens a block.
            let kind = match event.delta.as_ref().and_then(|d| d.ty.as_deref()) {
                Some("thinking_delta") => "thinking",
                Some("text_delta") => "text",
                _ => "",
            };
            if !kind.is_empty() {
                let mut block = Map::new();
                block.insert("type".into(), Value::from(kind));
                agent.raw.start(index, block, scopes, sink);
            }
        }
        agent.raw.event(event, scopes, opts.max_item_bytes, sink);
    }

    /// An `assistant` message: its blocks that did not stream, whole.
    fn assistant(&mut self, key: &str, message: ApiMessage<'_>, scopes: &mut Scopes, sink: &mut Sink<impl Observer>) {
        let id = message.id.as_deref();
        let streamed = id.is_some_and(|id| self.streamed.get(id).is_some());
        let mut skip_text = streamed;
        if id.is_none() {
            // Seed 004: the text streamed since the last message is this message's text.
            let agent = self.agent(key, scopes, sink);
            agent.raw.close_all(scopes, sink);
            skip_text = std::mem::replace(&mut agent.streamed_since_message, false);
        }
        if streamed {
            return;
        }
        for block in message.blocks() {
            let text = matches!(str_field(&block, "type"), "text" | "thinking");
            if !(text && skip_text) {
                self.whole_block(key, block, scopes, sink);
            }
        }
    }

    /// One content block sent whole: opened and stopped at once by the raw rules; a tool call sent before is not
    /// sent again.
    fn whole_block(
        &mut self,
        key: &str,
        block: Map<String, Value>,
        scopes: &mut Scopes,
        sink: &mut Sink<impl Observer>,
    ) {
        if let Some(id) = tool_id(&block) {
            if self.calls.get(id).is_some() {
                return;
            }
            self.calls.insert(id, str_field(&block, "name"));
        }
        let agent = self.agent(key, scopes, sink);
        agent.raw.start(WHOLE, block, scopes, sink);
        if let Some(b) = agent.raw.take(WHOLE) {
            stop(b, scopes, sink);
        }
    }

    /// A tool result block (`user` message content or seed 004's `tool_result`): text and images as DESIGN 3.2's
    /// multimodal client result. The result of a subagent's call closes that subagent's blocks.
    fn tool_result(&mut self, mut block: Map<String, Value>, scopes: &mut Scopes, sink: &mut Sink<impl Observer>) {
        let id = report::safe_id(scopes, str_field(&block, "tool_use_id"), "tool result id", sink).to_owned();
        let name = self.calls.get(&id).unwrap_or("").to_owned();
        if let Some(at) = self.agents.iter().position(|a| !id.is_empty() && a.key == id) {
            let mut sub = self.agents.remove(at);
            sub.raw.close_all(scopes, sink);
        }
        let result = ToolResultCtx {
            id,
            name,
            agent: scopes.agent().to_owned(),
            multimodal: false,
        };
        match block.remove("content") {
            Some(Value::String(s)) => sink.whole(result.header(), &s),
            None | Some(Value::Null) => result.close(sink),
            Some(Value::Array(parts)) => multimodal(result, parts, sink),
            Some(other) => {
                let style = EnvelopeKind::ToolResult.json_text().unwrap_or(PyStyle::Ascii);
                sink.whole(result.header(), &pyjson::to_string(&other, style));
            }
        }
    }

    /// `result`: what is open closes; an error result says so; `meta_final` with the run's figures.
    fn result(&mut self, msg: &Message<'_>, scopes: &mut Scopes, sink: &mut Sink<impl Observer>) {
        self.close_all(scopes, sink);
        let seed = msg.result.as_ref().filter(|r| r.is_object());
        let subtype = msg.subtype.as_deref().unwrap_or("success");
        let failed = subtype != "success" || msg.is_error == Some(true);
        if failed && seed.is_none() {
            let message = match &msg.errors {
                Some(errors) if !errors.is_empty() => errors
                    .iter()
                    .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
                    .collect::<Vec<_>>()
                    .join("; "),
                _ => msg.result.as_ref().and_then(Value::as_str).unwrap_or("").to_owned(),
            };
            let error = if subtype == "success" { "error_result" } else { subtype };
            let delta = serde_json::json!({"error": error, "message": message});
            let style = EnvelopeKind::Error.json_text().unwrap_or(PyStyle::Ascii);
            report::error_envelope(scopes, &pyjson::to_string(&delta, style), sink);
        }
        let mut fin = Map::new();
        let mut put = |k: &str, v: Option<&Value>| {
            if let Some(v) = v {
                fin.insert(k.into(), v.clone());
            }
        };
        match seed {
            Some(r) => {
                put("stop_reason", r.get("stop_reason"));
                put("cumulative_usage", r.get("usage"));
            }
            None => {
                put("stop_reason", msg.stop_reason.as_ref());
                put("total_steps", msg.num_turns.as_ref());
                put("cost", msg.total_cost_usd.as_ref());
                put("cumulative_usage", msg.usage.as_ref());
            }
        }
        if let Some(s) = &msg.session_id {
            fin.insert("session_id".into(), Value::from(s.as_ref()));
        }
        let header = BlockHeader::new(EnvelopeKind::MetaFinal, scopes.agent(), Extras::new());
        sink.whole(header, &pyjson::to_string(&Value::Object(fin), PyStyle::Unicode));
    }

    /// Closes every agent's open blocks (end of input, an error, the upstream failing).
    pub fn close_all(&mut self, scopes: &mut Scopes, sink: &mut Sink<impl Observer>) {
        for mut agent in std::mem::take(&mut self.agents) {
            scopes.enter(Some(agent.key.as_str()));
            agent.raw.close_all(scopes, sink);
        }
        scopes.enter(None);
    }

    /// End of input: `[DONE]` if the last message was a `result` (and nothing was cut off after it); after an `error`,
    /// the run's `meta_final` (it had no `result`) and `[DONE]`.
    pub fn finish(&mut self, cut: bool, scopes: &mut Scopes, sink: &mut Sink<impl Observer>) -> StreamEnd {
        self.close_all(scopes, sink);
        if self.over {
            let mut fin = Map::new();
            if let Some(s) = self.over_session.take() {
                fin.insert("session_id".into(), Value::from(s));
            }
            let header = BlockHeader::new(EnvelopeKind::MetaFinal, scopes.agent(), Extras::new());
            sink.whole(header, &pyjson::to_string(&Value::Object(fin), PyStyle::Unicode));
            sink.done();
            StreamEnd::Failed
        } else if self.ended && !cut {
            sink.done();
            StreamEnd::Done
        } else {
            StreamEnd::Cut
        }
    }

    /// `[DONE]` from the backend: the run is complete.
    pub fn done(&mut self) {
        self.ended = true;
    }
}

/// A result whose content is a list (DESIGN 3.2): its text parts joined into one plain result; with images, the text
/// `final:false`, one `tool_result_image` per image, then the final marker, as a multimodal client result.
fn multimodal(result: ToolResultCtx, parts: Vec<Value>, sink: &mut Sink<impl Observer>) {
    let mut images = Vec::new();
    let mut text = String::new();
    for part in parts {
        match part.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(part.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("image") => images.push(part),
            _ => sink.obs.unknown_tag(),
        }
    }
    if images.is_empty() {
        sink.whole(result.header(), &text);
        return;
    }
    let mut chunked = Chunked::new(result.header()).never_final();
    chunked.push(text.as_bytes(), sink);
    chunked.finish(sink);
    for image in &images {
        let field = |k: &str| image.get("source").and_then(|s| s.get(k)).and_then(Value::as_str);
        let media_type = field("media_type");
        let src = match field("type") {
            Some("base64") => format!(
                "data:{};base64,{}",
                media_type.unwrap_or(""),
                field("data").unwrap_or("")
            ),
            _ => field("url").unwrap_or("").to_owned(),
        };
        result.image(Some(&src), Some(media_type.unwrap_or("")), sink);
    }
    result.close(sink);
}

/// The id of a tool call block (`tool_use`, `server_tool_use`, `mcp_tool_use`).
fn tool_id(block: &Map<String, Value>) -> Option<&str> {
    matches!(
        str_field(block, "type"),
        "tool_use" | "server_tool_use" | "mcp_tool_use"
    )
    .then(|| str_field(block, "id"))
    .filter(|id| !id.is_empty())
}

/// Identifiers seen, each with a name: the newest [`MAX_REMEMBERED`]. Only identifiers (`envelope::ids`) are kept,
/// so what is held stays small however long the backend's strings are.
#[derive(Debug, Default)]
struct Remembered {
    names: HashMap<String, String>,
    order: VecDeque<String>,
    bytes: usize,
}

impl Remembered {
    fn insert(&mut self, id: &str, name: &str) {
        if !ids::is_valid(id) || self.names.contains_key(id) {
            return;
        }
        let name = if ids::is_valid(name) { name } else { "" };
        if self.order.len() == MAX_REMEMBERED {
            if let Some(old) = self.order.pop_front() {
                let gone = self.names.remove(&old).map_or(0, |n| n.len());
                self.bytes -= 2 * old.len() + gone;
            }
        }
        self.bytes += 2 * id.len() + name.len();
        self.order.push_back(id.to_owned());
        self.names.insert(id.to_owned(), name.to_owned());
    }

    fn get(&self, id: &str) -> Option<&str> {
        self.names.get(id).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_identifiers_are_remembered_and_only_the_newest() {
        let mut r = Remembered::default();
        r.insert(&"x".repeat(10_000), "Bash");
        assert!(r.names.is_empty(), "a string too long to be an id is not held");
        r.insert("toolu_1", &"n".repeat(10_000));
        assert_eq!(
            r.get("toolu_1"),
            Some(""),
            "a name that is not an identifier is held as \"\""
        );
        for i in 0..2 * MAX_REMEMBERED {
            r.insert(&format!("id_{i}"), "Read");
        }
        assert_eq!(r.names.len(), MAX_REMEMBERED);
        assert_eq!(r.get("toolu_1"), None);
        assert_eq!(r.get(&format!("id_{}", 2 * MAX_REMEMBERED - 1)), Some("Read"));
        let held: usize = r.names.iter().map(|(k, v)| 2 * k.len() + v.len()).sum();
        assert_eq!(r.bytes, held);
    }

    #[test]
    fn every_message_type_the_sdk_sends_is_known_and_nothing_else() {
        for ty in [
            "system",
            "stream_event",
            "assistant",
            "user",
            "result",
            "rate_limit_event",
        ] {
            assert!(AgentSdk::knows(ty), "{ty}");
        }
        for ty in ["content_block_delta", "think", ""] {
            assert!(!AgentSdk::knows(ty), "{ty}");
        }
    }
}
