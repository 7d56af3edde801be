//! A translated run's spans: the `invoke_agent` CLIENT span (the backend is a remote agent), made before the
//! upstream request so the request carries it, then a tap on the stream that times the first upstream event and
//! the first envelope, opens an INTERNAL `invoke_agent` child per subagent scope, and writes tool calls and results
//! as span events. Only the rare envelopes (meta, tools, errors) are parsed; a text delta costs a count.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use serde_json::Value;

use super::Traces;
use crate::envelope::{agent_of, EnvelopeKind};
use crate::frontend::envelope::Envelope;
use crate::proxy::metrics::tap::{RunEnd, Tap};
use crate::sse::encoder;
use crate::sse::SseEvent;
use crate::translate::{Dialect, ParseErrorKind};

/// Content kept per attribute at most, when content is captured.
const MAX_CONTENT: usize = 16 << 10;
/// Subagent scopes open at once at most; deeper or wider ones are counted on the run's span only.
const MAX_CHILDREN: usize = 64;
/// Tool calls whose streamed arguments are gathered at once (content capture only).
const MAX_GATHERED: usize = 64;

/// The run's span, before its response is known.
pub struct RunSpan {
    cx: Context,
    /// The stream's agent until a root `meta_init` names it (`gen_ai.agent.id` is set once, at the end: the SDK
    /// appends a set attribute rather than replacing it).
    agent: String,
}

impl Traces {
    /// Starts the `invoke_agent` span of a run for `agent`, under the request's span; `conversation`: the chat
    /// or thread a frontend's turn named.
    pub fn run_span(&self, parent: &Context, agent: &str, conversation: Option<&str>) -> RunSpan {
        let mut attrs = vec![KeyValue::new("gen_ai.operation.name", "invoke_agent")];
        if let Some(c) = conversation {
            attrs.push(KeyValue::new("gen_ai.conversation.id", c.to_owned()));
        }
        if let Some(p) = &self.settings.provider_name {
            attrs.push(KeyValue::new("gen_ai.provider.name", p.clone()));
        }
        let span = self
            .tracer
            .span_builder("invoke_agent")
            .with_kind(SpanKind::Client)
            .with_attributes(attrs)
            .start_with_context(&self.tracer, parent);
        RunSpan {
            cx: parent.with_span(span),
            agent: agent.to_owned(),
        }
    }
}

impl RunSpan {
    pub fn context(&self) -> &Context {
        &self.cx
    }

    /// The run failed before a stream (no answer, or an error status): ended with `error.type`.
    pub fn failed(self, error_type: &'static str) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new("gen_ai.agent.id", self.agent));
        span.set_attribute(KeyValue::new("error.type", error_type));
        span.set_status(Status::error(""));
        span.end();
    }

    /// The run's stream is translated: the tap that follows it. `sent`: when the upstream request was sent.
    pub fn follow(self, traces: &Arc<Traces>, sent: Instant) -> RunTrace {
        RunTrace {
            capture: traces.settings.capture_content,
            tracer_of: Arc::clone(traces),
            provider_named: traces.settings.provider_name.is_some(),
            cx: self.cx,
            sent,
            seen_event: false,
            seen_envelope: false,
            root: None,
            agent: self.agent,
            children: Vec::new(),
            counts: [0; EnvelopeKind::ALL.len()],
            parse_errors: 0,
            backend_error: None,
            gathered: Vec::new(),
        }
    }
}

/// The tap of a translated run.
pub struct RunTrace {
    tracer_of: Arc<Traces>,
    cx: Context,
    sent: Instant,
    capture: bool,
    provider_named: bool,
    seen_event: bool,
    seen_envelope: bool,
    /// The root agent, once a root `meta_init` named it.
    root: Option<String>,
    /// The stream's agent before that.
    agent: String,
    children: Vec<Child>,
    counts: [u32; EnvelopeKind::ALL.len()],
    parse_errors: u32,
    /// The `type` of the backend's last error, for `error.type`.
    backend_error: Option<String>,
    /// Streamed tool arguments, by call id (content capture only).
    gathered: Vec<(String, String)>,
}

/// One open subagent scope.
struct Child {
    agent: String,
    cx: Context,
    last: SystemTime,
}

impl RunTrace {
    /// The context of the span `agent`'s envelopes belong to (its scope's, else the run's).
    fn scope(&self, agent: &str) -> &Context {
        self.children
            .iter()
            .find(|c| c.agent == agent)
            .map_or(&self.cx, |c| &c.cx)
    }

    fn meta_init(&mut self, env: &Envelope<'_>) {
        let meta: Value = serde_json::from_str(&env.delta).unwrap_or(Value::Null);
        let parent = meta
            .get("parent_agent_uuid")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty());
        let model = meta.get("model").and_then(Value::as_str).filter(|m| !m.is_empty());
        let is_child = parent.is_some() || self.root.as_deref().is_some_and(|r| r != env.agent);
        if !is_child {
            if self.root.is_some() {
                return;
            }
            let span = self.cx.span();
            if let Some(m) = model {
                span.set_attribute(KeyValue::new("gen_ai.request.model", bounded(m)));
            }
            if self.capture {
                if let Some(q) = meta.get("user_query").and_then(Value::as_str) {
                    span.set_attribute(KeyValue::new("gen_ai.input.messages", user_message(q)));
                }
            }
            self.root = Some(env.agent.to_string());
            return;
        }
        if self.children.len() >= MAX_CHILDREN || self.children.iter().any(|c| c.agent == env.agent) {
            return;
        }
        let parent_cx = parent.map_or(&self.cx, |p| self.scope(p)).clone();
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "invoke_agent"),
            KeyValue::new("gen_ai.agent.id", env.agent.to_string()),
        ];
        if let Some(m) = model {
            attrs.push(KeyValue::new("gen_ai.request.model", bounded(m)));
        }
        let tracer = self.tracer_of.tracer();
        let span = tracer
            .span_builder("invoke_agent")
            .with_kind(SpanKind::Internal)
            .with_attributes(attrs)
            .start_with_context(tracer, &parent_cx);
        self.children.push(Child {
            agent: env.agent.to_string(),
            cx: parent_cx.with_span(span),
            last: SystemTime::now(),
        });
    }

    fn tool(&mut self, env: &Envelope<'_>, call: bool) {
        if self.capture && call {
            gather(&mut self.gathered, &env.id, &env.delta);
        }
        if !env.last {
            return;
        }
        let mut attrs = vec![
            KeyValue::new("gen_ai.tool.call.id", env.id.to_string()),
            KeyValue::new("gen_ai.tool.name", env.name.to_string()),
        ];
        if self.capture {
            if call {
                let args = take_gathered(&mut self.gathered, &env.id);
                attrs.push(KeyValue::new("gen_ai.tool.call.arguments", args));
            } else {
                attrs.push(KeyValue::new("gen_ai.tool.call.result", bounded(&env.delta)));
            }
        }
        let name = if call { "gen_ai.tool.call" } else { "gen_ai.tool.result" };
        self.scope(&env.agent).span().add_event(name, attrs);
    }

    fn error(&mut self, env: &Envelope<'_>) {
        let Ok(v) = serde_json::from_str::<Value>(&env.delta) else {
            return;
        };
        let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
        // The gateway's own error envelopes (bad input, its end of a failed or cut stream) are not the backend's.
        if matches!(kind, "parse_error" | "upstream_error" | "gateway_draining") {
            return;
        }
        // The backend's name for its failure: `{"error": "RateLimitError"}`, `{"error": {"type": …}}`, or its type.
        let named = v
            .get("error")
            .and_then(|e| e.as_str().or_else(|| e.get("type").and_then(Value::as_str)))
            .or(Some(kind).filter(|k| !k.is_empty() && *k != "error"));
        self.backend_error = Some(match named {
            Some(k) if is_label(k) => k.to_owned(),
            _ => "backend_error".into(),
        });
    }

    fn meta_final(&mut self, agent: &str) {
        if let Some(at) = self.children.iter().position(|c| c.agent == agent) {
            let child = self.children.remove(at);
            child.cx.span().end();
        }
    }
}

impl Tap for RunTrace {
    fn sse(&mut self, ev: &SseEvent<'_>) -> bool {
        // The first report of the first event (its first data, or its dispatch): a streamed item's envelopes
        // start before its event is complete. Nothing later is wanted (another tap may still call: timed once).
        if self.seen_event || matches!(ev, SseEvent::Discard) {
            return !self.seen_event;
        }
        self.seen_event = true;
        let secs = self.sent.elapsed().as_secs_f64();
        self.cx
            .span()
            .set_attribute(KeyValue::new("gen_ai.response.time_to_first_chunk", secs));
        false
    }

    fn written(&mut self, kind: EnvelopeKind, event: &[u8]) {
        self.counts[kind as usize] += 1;
        if !self.seen_envelope {
            self.seen_envelope = true;
            let secs = self.sent.elapsed().as_secs_f64();
            self.cx
                .span()
                .set_attribute(KeyValue::new("sse_gateway.time_to_first_envelope", secs));
        }
        let json = encoder::data_of(event);
        if !self.children.is_empty() {
            if let Some(agent) = agent_of(json) {
                if let Some(c) = self.children.iter_mut().find(|c| c.agent == agent) {
                    c.last = SystemTime::now();
                }
            }
        }
        let parsed = matches!(
            kind,
            EnvelopeKind::MetaInit
                | EnvelopeKind::MetaFinal
                | EnvelopeKind::ToolCall
                | EnvelopeKind::ServerToolCall
                | EnvelopeKind::ToolResult
                | EnvelopeKind::ToolResultImage
                | EnvelopeKind::ServerToolResult
                | EnvelopeKind::Error
        );
        if !parsed {
            return;
        }
        let Some(env) = Envelope::parse(json) else { return };
        match kind {
            EnvelopeKind::MetaInit => self.meta_init(&env),
            EnvelopeKind::MetaFinal => self.meta_final(&env.agent),
            EnvelopeKind::ToolCall | EnvelopeKind::ServerToolCall => self.tool(&env, true),
            EnvelopeKind::Error => self.error(&env),
            _ => self.tool(&env, false),
        }
    }

    fn dialect(&mut self, dialect: Dialect) {
        if !self.provider_named {
            self.cx
                .span()
                .set_attribute(KeyValue::new("gen_ai.provider.name", provider_of(dialect)));
        }
    }

    fn parse_error(&mut self, _kind: ParseErrorKind) {
        self.parse_errors += 1;
    }

    fn ended(&mut self, end: RunEnd) {
        let span = self.cx.span();
        let agent = self.root.take().unwrap_or_else(|| std::mem::take(&mut self.agent));
        span.set_attribute(KeyValue::new("gen_ai.agent.id", agent));
        for (kind, n) in EnvelopeKind::ALL.iter().zip(self.counts) {
            if n > 0 {
                span.set_attribute(KeyValue::new(
                    format!("sse_gateway.envelopes.{}", kind.as_str()),
                    i64::from(n),
                ));
            }
        }
        if self.parse_errors > 0 {
            span.set_attribute(KeyValue::new("sse_gateway.parse_errors", i64::from(self.parse_errors)));
        }
        let error_type: Option<String> = match end {
            RunEnd::Done => None,
            RunEnd::BackendError => Some(self.backend_error.take().unwrap_or_else(|| "backend_error".into())),
            RunEnd::Cut => Some("stream_cut".into()),
            RunEnd::UpstreamFailed { kind } => {
                span.set_attribute(KeyValue::new("sse_gateway.upstream.failure", kind));
                Some("upstream_error".into())
            }
            RunEnd::Drained => Some("gateway_draining".into()),
            RunEnd::Cancelled => Some("stream_cancelled".into()),
        };
        if let Some(t) = error_type {
            span.set_attribute(KeyValue::new("error.type", t));
            span.set_status(Status::error(""));
        }
        for child in self.children.drain(..) {
            child.cx.span().end_with_timestamp(child.last);
        }
        span.end();
    }
}

/// `gen_ai.provider.name` by dialect (docs/OBSERVABILITY.md): the legacy backends and the Agent SDK speak to
/// Anthropic's models; cogency names no single provider.
fn provider_of(d: Dialect) -> &'static str {
    match d {
        Dialect::Cogency => "cogency",
        _ => "anthropic",
    }
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn bounded(s: &str) -> String {
    if s.len() <= MAX_CONTENT {
        return s.to_owned();
    }
    let mut cut = MAX_CONTENT;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s[..cut].to_owned()
}

/// `gen_ai.input.messages` of the user's query (the GenAI conventions' message shape).
fn user_message(q: &str) -> String {
    serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": bounded(q)}]}]).to_string()
}

fn gather(gathered: &mut Vec<(String, String)>, id: &str, delta: &str) {
    if let Some((_, buf)) = gathered.iter_mut().find(|(i, _)| i == id) {
        if buf.len() < MAX_CONTENT {
            buf.push_str(delta);
        }
        return;
    }
    if gathered.len() < MAX_GATHERED {
        gathered.push((id.to_owned(), delta.to_owned()));
    }
}

fn take_gathered(gathered: &mut Vec<(String, String)>, id: &str) -> String {
    match gathered.iter().position(|(i, _)| i == id) {
        Some(at) => bounded(&gathered.swap_remove(at).1),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_short_and_plain() {
        assert!(is_label("RateLimitError"));
        assert!(!is_label("two words"));
        assert!(!is_label(&"x".repeat(65)));
    }
}
