//! The cogency dialect (DESIGN 3.7; docs/TRANSLATION.md has the table): one JSON event per SSE event, as
//! cogency's agent yields them (`cogency.core.protocols`, 3.0's `metrics` and 3.3's `metric` alike). Consecutive
//! `think` / `respond` events stream as one block; a `call` is a whole `tool_call` with an id the gateway assigns;
//! a `result` answers the batch of calls made since the last one (its `content`, or the seed's `payload`); the run's
//! end is `end` (3.3), `[DONE]`, an error the backend reports, or the stream ending after 3.0's `metrics`, and only
//! then, once the stream ends, come `meta_final` and `[DONE]`.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::fast;
use super::report::{self, Fault};
use super::scope::Scopes;
use crate::envelope::chunker::Sink;
use crate::envelope::{pyjson, BlockHeader, EnvelopeKind, Extras, PyStyle};
use crate::pipeline::{Observer, Options, ParseErrorKind, StreamEnd};

/// Calls remembered while they wait for their result; a batch larger than this is answered by its first call all
/// the same (only the oldest are forgotten).
pub const MAX_PENDING_CALLS: usize = 1024;

/// One cogency event; only the keys the translation reads.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    ty: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    total: Option<&'a RawValue>,
    /// A `result`'s payload: 3.3's counts, or the seed's `{outcome, content, error}`.
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
}

/// A JSON string that borrows from the input when it has no escapes.
#[derive(Deserialize)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

/// A call's content: `{"name", "args"}` as cogency dumps it.
#[derive(Deserialize)]
struct Call<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    args: Option<Value>,
}

/// An open `thinking` or `text` block.
#[derive(Debug)]
struct Open {
    header: BlockHeader,
    chunks: u32,
}

/// How the run stands: what its end will be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Run {
    #[default]
    Going,
    /// Its last event was 3.0's `metrics`, which ends a run only if nothing but `metric` / `execute` follows.
    MetricsLast,
    /// `end` or the backend's `[DONE]`: whatever follows, `meta_final` and `[DONE]` come when the stream ends.
    Ended,
    /// An `error`, `interrupt` or `cancelled` ended it: nothing after is translated, and the run ends as a
    /// finished one (`meta_final`, `[DONE]`).
    Over,
}

impl Run {
    /// Content arrived: only 3.0's tentative end is undone by it.
    fn content(&mut self) {
        if *self == Run::MetricsLast {
            *self = Run::Going;
        }
    }

    /// The backend said the run is complete (`end`, `[DONE]`).
    fn end(&mut self) {
        if *self != Run::Over {
            *self = Run::Ended;
        }
    }
}

/// One cogency stream's state.
#[derive(Debug)]
pub struct Cogency {
    open: Option<Open>,
    /// Calls so far; the next id is `call_<calls + 1>`.
    calls: u64,
    /// `(id, name)` of the calls since the last result: the batch the next result answers.
    pending: Vec<(String, String)>,
    /// The last `total` of a `metric(s)` event, for `meta_final`.
    total: Option<Box<RawValue>>,
    user_seen: bool,
    started: bool,
    run: Run,
    /// Where an event's escaped text is decoded, kept from event to event.
    scratch: String,
}

impl Default for Cogency {
    fn default() -> Self {
        Self::new()
    }
}

impl Cogency {
    pub fn new() -> Self {
        Self {
            open: None,
            calls: 0,
            pending: Vec::new(),
            total: None,
            user_seen: false,
            started: false,
            run: Run::Going,
            scratch: String::new(),
        }
    }

    /// Whether `ty` is a type cogency's protocol declares (3.0 or 3.3).
    pub fn knows(ty: &str) -> bool {
        matches!(
            ty,
            "user"
                | "think"
                | "call"
                | "execute"
                | "result"
                | "respond"
                | "chunk"
                | "end"
                | "metric"
                | "metrics"
                | "error"
                | "interrupt"
                | "cancelled"
        )
    }

    pub fn buffered(&self) -> usize {
        self.pending
            .iter()
            .map(|(i, n)| i.capacity() + n.capacity())
            .sum::<usize>()
            + self.total.as_ref().map_or(0, |t| t.get().len())
            + self.scratch.capacity()
    }

    /// `[DONE]` from the backend: the run is complete (the gateway writes its own after `meta_final`).
    pub fn done(&mut self) {
        self.run.end();
    }

    /// One complete event.
    pub fn event(
        &mut self,
        ev: &[u8],
        scopes: &mut Scopes,
        opts: &Options,
        sink: &mut Sink<impl Observer>,
    ) -> Result<StreamEnd, Fault> {
        let first = !std::mem::replace(&mut self.started, true);
        // The most frequent events, read without serde (`fast`); the same steps as below.
        let mut scratch = std::mem::take(&mut self.scratch);
        let hot = fast::cogency_stream(ev, &mut scratch);
        if let Some((think, text)) = hot {
            let end = if self.run == Run::Over {
                StreamEnd::Failed
            } else {
                let kind = if think {
                    EnvelopeKind::Thinking
                } else {
                    EnvelopeKind::Text
                };
                self.stream(kind, text, scopes, sink);
                self.run.content();
                StreamEnd::Cut
            };
            self.keep(scratch);
            return Ok(end);
        }
        self.keep(scratch);
        let event: Event<'_> = serde_json::from_slice(ev).map_err(|e| Fault::of_json(&e, "a cogency event"))?;
        if !Self::knows(&event.ty) {
            if first {
                // Said once, for a misconfigured dialect; later unknown types are the protocol growing.
                let message = format!("not a cogency event: the stream's first event has type {:?}", event.ty);
                return Err(Fault::new(ParseErrorKind::Unexpected, message));
            }
            sink.obs.unknown_tag();
            return Ok(StreamEnd::Cut);
        }
        if self.run == Run::Over {
            return Ok(StreamEnd::Failed);
        }
        let content = || text(event.content);
        match &*event.ty {
            "think" => self.stream(EnvelopeKind::Thinking, &content(), scopes, sink),
            "respond" | "chunk" => self.stream(EnvelopeKind::Text, &content(), scopes, sink),
            "user" => self.user(&content(), scopes, opts, sink),
            "call" => {
                self.close(sink);
                self.call(&content(), scopes, sink);
            }
            "result" => {
                self.close(sink);
                self.result(event.content, event.payload, scopes, sink);
            }
            "metric" | "metrics" => {
                if let Some(total) = event.total {
                    self.total = Some(total.to_owned());
                }
                // cogency 3.0 sends no `end`: its last `metrics` is the run's end, if nothing but metrics follows.
                if event.ty == "metrics" && self.run == Run::Going {
                    self.run = Run::MetricsLast;
                }
                return Ok(StreamEnd::Cut);
            }
            "end" => {
                self.run.end();
                return Ok(StreamEnd::Cut);
            }
            "execute" => return Ok(StreamEnd::Cut),
            "error" | "interrupt" | "cancelled" => {
                self.close(sink);
                let delta = if event.ty == "error" {
                    content()
                } else {
                    Cow::Borrowed(r#"{"type": "cancelled"}"#)
                };
                report::error_envelope(scopes, &delta, sink);
                self.run = Run::Over;
                return Ok(StreamEnd::Failed);
            }
            _ => {}
        }
        self.run.content();
        Ok(StreamEnd::Cut)
    }

    /// The first `user` event: `meta_init` with its query; later ones say nothing.
    fn user(&mut self, query: &str, scopes: &Scopes, opts: &Options, sink: &mut Sink<impl Observer>) {
        if std::mem::replace(&mut self.user_seen, true) {
            return;
        }
        self.close(sink);
        let format = if opts.rewrite_format { "json" } else { "cogency" };
        let init = serde_json::json!({"format": format, "user_query": query});
        let header = BlockHeader::new(EnvelopeKind::MetaInit, scopes.agent(), Extras::new());
        sink.whole(header, &pyjson::to_string(&init, PyStyle::Unicode));
    }

    /// Puts the decoding buffer back, unless one large event grew it past `fast::SCRATCH_KEEP`.
    fn keep(&mut self, scratch: String) {
        if scratch.capacity() <= fast::SCRATCH_KEEP {
            self.scratch = scratch;
        }
    }

    /// A `think` or `respond` event: a delta of the open block of its kind.
    fn stream(&mut self, kind: EnvelopeKind, text: &str, scopes: &Scopes, sink: &mut Sink<impl Observer>) {
        if self.open.as_ref().is_some_and(|o| o.header.kind != kind) {
            self.close(sink);
        }
        let open = self.open.get_or_insert_with(|| Open {
            header: BlockHeader::new(kind, scopes.agent(), Extras::new()),
            chunks: 0,
        });
        open.chunks += sink.streamed_delta(&open.header, text);
    }

    /// A `call`: a `tool_call` if its content is a call, else text (the seed's rule 3).
    fn call(&mut self, content: &str, scopes: &Scopes, sink: &mut Sink<impl Observer>) {
        let Ok(call) = serde_json::from_str::<Call<'_>>(content) else {
            let header = BlockHeader::new(EnvelopeKind::Text, scopes.agent(), Extras::new());
            let chunks = sink.streamed_delta(&header, content);
            sink.end_block(&header, chunks);
            return;
        };
        self.calls += 1;
        let id = format!("call_{}", self.calls);
        let name = report::safe_id(scopes, &call.name, "tool name", sink).to_owned();
        let args = match call.args {
            None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
            Some(v) => v,
        };
        let style = EnvelopeKind::ToolCall.json_text().unwrap_or(PyStyle::Unicode);
        let extras = Extras::new().str("id", &id).str("name", &name);
        sink.whole(
            BlockHeader::new(EnvelopeKind::ToolCall, scopes.agent(), extras),
            &pyjson::to_string(&args, style),
        );
        if self.pending.len() == MAX_PENDING_CALLS {
            self.pending.remove(1);
        }
        self.pending.push((id, name));
    }

    /// A `result`: answers the pending batch, whole, in its first call's name; none pending: `id` and `name` are
    /// empty, counted as a conflict. The result is its `content`; without one, a `payload` that holds it (the seed's
    /// `{outcome, content, error}`), as `json.dumps` writes it; 3.3's counts are not a result.
    fn result(
        &mut self,
        content: Option<&RawValue>,
        payload: Option<&RawValue>,
        scopes: &Scopes,
        sink: &mut Sink<impl Observer>,
    ) {
        let (id, name) = match self.pending.first() {
            Some((id, name)) => (id.as_str(), name.as_str()),
            None => {
                sink.obs.scope_conflict();
                ("", "")
            }
        };
        let extras = Extras::new().str("id", id).str("name", name);
        let header = BlockHeader::new(EnvelopeKind::ToolResult, scopes.agent(), extras);
        let content = content.filter(|c| c.get() != "null");
        let structured = match content {
            // A string is the result's text; structured content (never sent by cogency itself) stays structured.
            Some(raw) if raw.get().starts_with('"') => None,
            Some(raw) => Some(raw),
            None => payload.filter(|p| !is_counts(p)),
        };
        match structured {
            Some(raw) => {
                let value: Value = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
                let style = EnvelopeKind::ToolResult.json_text().unwrap_or(PyStyle::Ascii);
                sink.whole(header, &pyjson::to_string(&value, style));
            }
            None => sink.whole(header, &text(content)),
        }
        self.pending.clear();
    }

    /// Closes the open block.
    pub fn close(&mut self, sink: &mut Sink<impl Observer>) {
        if let Some(open) = self.open.take() {
            sink.end_block(&open.header, open.chunks);
        }
    }

    /// End of input: `meta_final` and `[DONE]` if the run ended, by `end`, `[DONE]`, an error the backend reported, or
    /// 3.0's last `metrics` with nothing cut off after it.
    pub fn finish(&mut self, cut: bool, scopes: &Scopes, sink: &mut Sink<impl Observer>) -> StreamEnd {
        self.close(sink);
        let end = match self.run {
            Run::Over => StreamEnd::Failed,
            Run::Ended => StreamEnd::Done,
            Run::MetricsLast if !cut => StreamEnd::Done,
            Run::MetricsLast | Run::Going => return StreamEnd::Cut,
        };
        let total = self
            .total
            .as_ref()
            .and_then(|t| serde_json::from_str::<Value>(t.get()).ok());
        let fin = match total {
            Some(t) => serde_json::json!({ "cumulative_usage": t }),
            None => serde_json::json!({}),
        };
        let header = BlockHeader::new(EnvelopeKind::MetaFinal, scopes.agent(), Extras::new());
        sink.whole(header, &pyjson::to_string(&fin, PyStyle::Unicode));
        sink.done();
        end
    }
}

/// cogency 3.3's `result` payload: the batch's counts, not its result.
fn is_counts(payload: &RawValue) -> bool {
    const COUNTS: [&str; 3] = ["tools_executed", "success_count", "failure_count"];
    match serde_json::from_str::<serde_json::Map<String, Value>>(payload.get()) {
        Ok(map) => !map.is_empty() && map.keys().all(|k| COUNTS.contains(&k.as_str())),
        Err(_) => payload.get() == "null",
    }
}

/// An event's `content` as text: a string's value, any other JSON as written, nothing as "".
fn text(content: Option<&RawValue>) -> Cow<'_, str> {
    match content {
        None => Cow::Borrowed(""),
        Some(raw) => match serde_json::from_str::<Str<'_>>(raw.get()) {
            Ok(Str(s)) => s,
            Err(_) if raw.get() == "null" => Cow::Borrowed(""),
            Err(_) => Cow::Borrowed(raw.get()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Stats;

    /// Runs `events` through one `Cogency`; returns the output and its counters.
    fn run(events: &[&str]) -> (String, Stats) {
        let (mut out, mut stats) = (Vec::new(), Stats::default());
        let mut sink = Sink::new(&mut out, &mut stats, 2048);
        let mut scopes = Scopes::new("a");
        let mut c = Cogency::new();
        for ev in events {
            c.event(ev.as_bytes(), &mut scopes, &Options::default(), &mut sink)
                .expect("an event");
        }
        c.finish(false, &scopes, &mut sink);
        (String::from_utf8(out).expect("UTF-8"), stats)
    }

    #[test]
    fn a_result_answers_the_whole_batch_and_the_next_goes_to_the_next_call() {
        let call = |n: &str| format!(r#"{{"type": "call", "content": "{{\"name\": \"{n}\", \"args\": {{}}}}"}}"#);
        let (out, stats) = run(&[
            &call("a"),
            &call("b"),
            r#"{"type": "result", "content": "[1, 2]"}"#,
            &call("c"),
            r#"{"type": "result", "content": "3"}"#,
            r#"{"type": "result", "content": "orphan"}"#,
        ]);
        let results: Vec<&str> = out.lines().filter(|l| l.contains(r#""type":"tool_result""#)).collect();
        assert_eq!(results.len(), 3, "{out}");
        assert!(
            results[0].ends_with(r#""delta":"[1, 2]","id":"call_1","name":"a"}"#),
            "{}",
            results[0]
        );
        assert!(
            results[1].ends_with(r#""delta":"3","id":"call_3","name":"c"}"#),
            "{}",
            results[1]
        );
        assert!(
            results[2].ends_with(r#""delta":"orphan","id":"","name":""}"#),
            "{}",
            results[2]
        );
        assert_eq!(stats.scope_conflicts, 1);
    }

    #[test]
    fn execute_and_metric_do_not_close_a_streamed_block_and_end_brings_meta_final() {
        let (out, _) = run(&[
            r#"{"type": "respond", "content": "a"}"#,
            r#"{"type": "execute"}"#,
            r#"{"type": "metric", "total": {"input": 1}}"#,
            r#"{"type": "respond", "content": "b"}"#,
            r#"{"type": "end"}"#,
            r#"{"type": "metric", "total": {"input": 7}}"#,
        ]);
        let kinds: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|l| {
                if l == "[DONE]" {
                    l
                } else {
                    &l[9..l[9..].find('"').map_or(0, |i| i + 9)]
                }
            })
            .collect();
        assert_eq!(kinds, ["text", "text", "text", "meta_final", "[DONE]"], "{out}");
        assert!(out.contains(r#"{\"cumulative_usage\": {\"input\": 7}}"#), "{out}");
    }
}
