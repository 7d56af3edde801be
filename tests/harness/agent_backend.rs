//! A legacy agent backend for the frontend tests (DESIGN §5.3, issue 35): `POST /agent/run` and
//! `POST /agent/tool_results` answered with the legacy XML-in-SSE stream (DESIGN 3), rendered by the core emitter
//! ([`emit`]: every item escaped as the backend escapes it), on the one emulator ([`Emulator`]).
//!
//! A test scripts the backend with [`Run`]s, each chosen by the `user_prompt` it answers, made of [`Beat`]s (the
//! agent's doings: thinking, text, tools, a subagent, frontend tools awaited, a failure…). The backend:
//!
//! - gives each new conversation (a run without `agent_uuid`) a fresh root agent, and checks continuity: a run
//!   with `agent_uuid` must name an agent it gave out, a `tool_results` must name the agent that awaited frontend
//!   tools and answer exactly the awaited calls (string `content`, boolean `is_error`): anything else is recorded in
//!   [`AgentBackend::problems`];
//! - records every request and what each answered run sent, as the [`Part`]s a frontend should show
//!   ([`AgentBackend::expected`]): every text and thinking block's text, every tool call with its input and output
//!   (a frontend tool's output is the answer the client will give), every source, every subagent, in order, with
//!   their agents;
//! - answers preflights and adds CORS headers as the app's backend does, when given a [`Cors`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::core::emitter::{emit, Args, Citation, ClientContent, EmitOpts, Format, Item, MetaInit};
use super::cors::Cors;
use super::upstream::{sse_head, Emulator, Recorded, Step};

/// The backend's paths, as the gateway's `[[frontend]]` routes name them.
pub const RUN: &str = "/agent/run";
pub const TOOL_RESULTS: &str = "/agent/tool_results";
/// The gateway's `[[frontend]]` routes before this backend: `/api/chat` (ai-sdk) and `/agui` (ag-ui), both to
/// [`RUN`] and [`TOOL_RESULTS`].
pub const GATEWAY_CONFIG: &str = r#"
[[frontend]]
path = "/api/chat"
protocol = "ai-sdk"
run = "/agent/run"
tool_results = "/agent/tool_results"

[[frontend]]
path = "/agui"
protocol = "ag-ui"
run = "/agent/run"
tool_results = "/agent/tool_results"
"#;

/// Whose block a beat is: the run's root agent, or the subagent it spawned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    Root,
    Child,
}

/// One thing the agent does, as the legacy stream carries it.
#[derive(Debug, Clone)]
pub enum Beat {
    Thinking(Lane, Vec<String>),
    /// A text block, its deltas one event each.
    Text(Lane, Vec<String>),
    /// A text block left open (a failure follows).
    OpenText(Lane, Vec<String>),
    /// A text block followed by web citations `(url, title, cited text)`.
    Cited(Lane, Vec<String>, Vec<(String, String, String)>),
    /// A client tool call (`content-block-tool_call`).
    Call {
        lane: Lane,
        id: String,
        name: String,
        input: Value,
    },
    /// A client tool result (`content-block-tool_result`), from the backend.
    Result {
        lane: Lane,
        id: String,
        name: String,
        content: String,
    },
    /// A server tool call and its result (`server_tool_call`, `server_tool_result`), the root's.
    ServerCall {
        id: String,
        name: String,
        input: Value,
    },
    ServerResult {
        id: String,
        name: String,
        content: String,
    },
    /// The child's `meta_init` (its parent the root): the subagent starts.
    Subagent,
    /// `awaiting_frontend_tools` for `calls` (`(tool_use_id, name, input)`), which the client answers with `answer`.
    Awaiting {
        calls: Vec<(String, String, Value)>,
        answer: Value,
    },
    /// The backend's failure JSON (DESIGN 3.1); the stream ends after it.
    Failure {
        error: String,
        message: String,
    },
    /// The root's `meta_final`.
    Final,
    /// `[DONE]`.
    Done,
}

impl Beat {
    pub fn thinking(lane: Lane, deltas: &[&str]) -> Beat {
        Beat::Thinking(lane, strings(deltas))
    }

    pub fn text(lane: Lane, deltas: &[&str]) -> Beat {
        Beat::Text(lane, strings(deltas))
    }

    pub fn call(lane: Lane, id: &str, name: &str, input: Value) -> Beat {
        Beat::Call {
            lane,
            id: id.into(),
            name: name.into(),
            input,
        }
    }

    pub fn result(lane: Lane, id: &str, name: &str, content: &str) -> Beat {
        Beat::Result {
            lane,
            id: id.into(),
            name: name.into(),
            content: content.into(),
        }
    }
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| (*s).to_owned()).collect()
}

/// One scripted run: the `prompt` it answers, its beats, the continuation a `tool_results` for its awaited calls
/// gets, and the pause after each event (`None`: written at once, in random pieces).
#[derive(Debug, Clone)]
pub struct Run {
    pub prompt: String,
    pub beats: Vec<Beat>,
    pub continuation: Vec<Beat>,
    pub pace: Option<Duration>,
}

impl Run {
    pub fn new(prompt: &str, beats: Vec<Beat>) -> Run {
        Run {
            prompt: prompt.into(),
            beats,
            continuation: Vec::new(),
            pace: None,
        }
    }

    pub fn then(mut self, continuation: Vec<Beat>) -> Run {
        self.continuation = continuation;
        self
    }

    pub fn paced(mut self, gap: Duration) -> Run {
        self.pace = Some(gap);
        self
    }
}

/// What a frontend should show of a run, block by block (tool calls with their outputs).
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Thinking {
        agent: String,
        text: String,
    },
    Text {
        agent: String,
        text: String,
    },
    Tool {
        agent: String,
        id: String,
        name: String,
        input: Value,
        /// `None` while unanswered.
        output: Option<Value>,
        server: bool,
    },
    Source {
        agent: String,
        url: String,
        title: String,
    },
    Subagent {
        agent: String,
        parent: String,
    },
}

/// A request the backend answered with a stream.
#[derive(Debug, Clone)]
pub struct Served {
    /// [`RUN`] or [`TOOL_RESULTS`].
    pub path: String,
    /// The request's JSON body.
    pub body: Value,
    /// The run's root agent (and its subagent's id, used if it spawns one).
    pub agent: String,
    pub child: String,
    /// What the answer carried, as a frontend should show it.
    pub parts: Vec<Part>,
}

#[derive(Default)]
struct State {
    runs: HashMap<String, Run>,
    /// Root agents given out.
    agents: Vec<String>,
    /// Per agent: the calls its last run awaited, the continuation, and the answer expected.
    awaiting: HashMap<String, (Vec<String>, Vec<Beat>)>,
    served: Vec<Served>,
    problems: Vec<String>,
    next: u64,
}

/// The backend: the emulator, and what it saw and sent.
pub struct AgentBackend {
    pub emulator: Emulator,
    state: Arc<Mutex<State>>,
}

impl std::ops::Deref for AgentBackend {
    type Target = Emulator;

    fn deref(&self) -> &Emulator {
        &self.emulator
    }
}

impl AgentBackend {
    /// Starts the backend with its scripted `runs`, behind `cors` when given (Starlette's middleware).
    pub async fn start(runs: Vec<Run>, cors: Option<Cors>) -> AgentBackend {
        let state = Arc::new(Mutex::new(State {
            runs: runs.into_iter().map(|r| (r.prompt.clone(), r)).collect(),
            ..State::default()
        }));
        let s = Arc::clone(&state);
        let emulator = Emulator::start(move |req: &Recorded| {
            let answer = || answer(&s, req);
            match &cors {
                Some(c) => c.apply(req, answer),
                None => answer(),
            }
        })
        .await;
        AgentBackend { emulator, state }
    }

    /// The requests answered with a stream, in order.
    pub fn served(&self) -> Vec<Served> {
        self.state.lock().expect("lock").served.clone()
    }

    /// Continuity and request-shape violations seen so far.
    pub fn problems(&self) -> Vec<String> {
        self.state.lock().expect("lock").problems.clone()
    }

    /// What a frontend should show of the whole conversation: the parts of every answer, in order, a frontend
    /// tool's output being the answer the client gives.
    pub fn expected(&self) -> Vec<Part> {
        self.served().into_iter().flat_map(|s| s.parts).collect()
    }

    /// The root agent of the first run.
    pub fn first_agent(&self) -> Option<String> {
        self.served().first().map(|s| s.agent.clone())
    }
}

fn json_answer(status: u16, body: Value) -> Vec<Step> {
    let body = body.to_string();
    let len = body.len().to_string();
    Step::answer(
        status,
        &[("Content-Type", "application/json"), ("Content-Length", &len)],
        body.as_bytes(),
    )
}

/// The backend's answer to `req`.
fn answer(state: &Arc<Mutex<State>>, req: &Recorded) -> Vec<Step> {
    let path = req.target.split('?').next().unwrap_or("").to_owned();
    if req.method != "POST" || (path != RUN && path != TOOL_RESULTS) {
        return json_answer(404, json!({"detail": "Not Found"}));
    }
    let mut st = state.lock().expect("lock");
    let body: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => {
            st.problems.push(format!(
                "POST {path}: the body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&req.body)
            ));
            return json_answer(422, json!({"detail": "body is not JSON"}));
        }
    };
    let n = st.next;
    st.next += 1;
    let child = format!("0c0c0c0c-0000-4000-8000-{n:012x}");
    let (agent, beats, run_prompt, pace) = if path == RUN {
        let prompt = match &body["user_prompt"] {
            Value::String(s) => s.clone(),
            // Content blocks (a message with files): its text blocks.
            Value::Array(blocks) => blocks
                .iter()
                .filter(|b| b["type"] == "text")
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            other => {
                st.problems.push(format!(
                    "POST {RUN}: user_prompt is {other}, not a string or blocks: {body}"
                ));
                return json_answer(422, json!({"detail": "user_prompt"}));
            }
        };
        let agent = match body.get("agent_uuid") {
            None | Some(Value::Null) => {
                let a = format!("0a0a0a0a-0000-4000-8000-{n:012x}");
                st.agents.push(a.clone());
                a
            }
            Some(Value::String(a)) => {
                if !st.agents.contains(a) {
                    let given = format!("{:?}", st.agents);
                    st.problems.push(format!(
                        "POST {RUN} continues agent {a}, which the backend never gave out (it gave {given})"
                    ));
                }
                a.clone()
            }
            Some(other) => {
                st.problems
                    .push(format!("POST {RUN}: agent_uuid is {other}, not a string"));
                return json_answer(422, json!({"detail": "agent_uuid"}));
            }
        };
        let Some(run) = st.runs.get(&prompt).cloned() else {
            st.problems
                .push(format!("POST {RUN}: no scripted run for the prompt {prompt:?}: {body}"));
            return json_answer(500, json!({"detail": "unscripted prompt"}));
        };
        if let Some(awaited) = run.beats.iter().find_map(|b| match b {
            Beat::Awaiting { calls, .. } => Some(calls.iter().map(|c| c.0.clone()).collect::<Vec<_>>()),
            _ => None,
        }) {
            st.awaiting.insert(agent.clone(), (awaited, run.continuation.clone()));
        }
        (agent, run.beats, Some(prompt), run.pace)
    } else {
        let Some(agent) = body["agent_uuid"].as_str().map(str::to_owned) else {
            st.problems
                .push(format!("POST {TOOL_RESULTS} without a string agent_uuid: {body}"));
            return json_answer(422, json!({"detail": "agent_uuid"}));
        };
        let Some((awaited, continuation)) = st.awaiting.remove(&agent) else {
            st.problems.push(format!(
                "POST {TOOL_RESULTS} for agent {agent}, which awaits no frontend tool: {body}"
            ));
            return json_answer(409, json!({"detail": "nothing awaited"}));
        };
        let results = body["tool_results"].as_array().cloned().unwrap_or_default();
        let mut ids: Vec<String> = Vec::new();
        for r in &results {
            let id = r["tool_use_id"].as_str().unwrap_or("<no tool_use_id>").to_owned();
            if !r["content"].is_string() {
                st.problems.push(format!(
                    "tool_results: {id}'s content is {}, not a string",
                    r["content"]
                ));
            }
            if !r["is_error"].is_boolean() {
                st.problems.push(format!(
                    "tool_results: {id}'s is_error is {}, not a boolean",
                    r["is_error"]
                ));
            }
            ids.push(id);
        }
        let (mut got, mut want) = (ids.clone(), awaited.clone());
        got.sort();
        want.sort();
        if got != want {
            st.problems.push(format!(
                "tool_results answers {ids:?}, the backend awaited exactly {awaited:?}: {body}"
            ));
        }
        (agent, continuation, None, None)
    };
    let (items, parts) = render(&beats, &agent, &child, run_prompt.as_deref());
    let sse = emit(&items, &EmitOpts::default(), &agent, n + 1).sse;
    st.served.push(Served {
        path: path.clone(),
        body,
        agent,
        child,
        parts,
    });
    drop(st);
    match pace {
        None => vec![sse_head(), Step::Write(sse), Step::EndChunks],
        Some(gap) => super::upstream::paced(events(&sse), gap),
    }
}

/// The SSE events of `sse` (each ends with a blank line; the emitter writes one `data:` line per event).
fn events(sse: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = sse;
    while let Some(p) = super::upstream::find(rest, b"\n\n") {
        out.push(rest[..p + 2].to_vec());
        rest = &rest[p + 2..];
    }
    if !rest.is_empty() {
        out.push(rest.to_vec());
    }
    out
}

/// The legacy items of `beats` (a run's: with the root's `meta_init` first when `prompt` is given; a continuation
/// has none), and the parts a frontend should show of them.
fn render(beats: &[Beat], root: &str, child: &str, prompt: Option<&str>) -> (Vec<Item>, Vec<Part>) {
    let agent = |l: Lane| match l {
        Lane::Root => root.to_owned(),
        Lane::Child => child.to_owned(),
    };
    let mut items = Vec::new();
    let mut parts: Vec<Part> = Vec::new();
    if let Some(p) = prompt {
        items.push(Item::MetaInit(MetaInit::new(root, None, Format::Xml, p, None)));
    }
    let set_output = |parts: &mut Vec<Part>, id: &str, value: Value| {
        for p in parts.iter_mut() {
            if let Part::Tool { id: pid, output, .. } = p {
                if pid == id {
                    *output = Some(value);
                    return true;
                }
            }
        }
        false
    };
    for beat in beats {
        match beat {
            Beat::Thinking(l, d) => {
                items.push(Item::thinking(d.clone(), true));
                parts.push(Part::Thinking {
                    agent: agent(*l),
                    text: d.concat(),
                });
            }
            Beat::Text(l, d) | Beat::OpenText(l, d) => {
                items.push(Item::text(d.clone(), matches!(beat, Beat::Text(..)), vec![]));
                parts.push(Part::Text {
                    agent: agent(*l),
                    text: d.concat(),
                });
            }
            Beat::Cited(l, d, cites) => {
                let citations = cites
                    .iter()
                    .enumerate()
                    .map(|(i, (url, title, cited))| {
                        Citation::web_location(url, title, &format!("enc{i}"), cited.clone())
                    })
                    .collect();
                items.push(Item::text(d.clone(), true, citations));
                parts.push(Part::Text {
                    agent: agent(*l),
                    text: d.concat(),
                });
                for (url, title, _) in cites {
                    parts.push(Part::Source {
                        agent: agent(*l),
                        url: url.clone(),
                        title: title.clone(),
                    });
                }
            }
            Beat::Call { lane, id, name, input } => {
                items.push(Item::call(false, id, name, Args::Json(input.clone())));
                parts.push(Part::Tool {
                    agent: agent(*lane),
                    id: id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                    output: None,
                    server: false,
                });
            }
            Beat::Result { id, name, content, .. } => {
                items.push(Item::result(id, name, ClientContent::Text(content.clone())));
                set_output(&mut parts, id, Value::String(content.clone()));
            }
            Beat::ServerCall { id, name, input } => {
                items.push(Item::call(true, id, name, Args::Json(input.clone())));
                parts.push(Part::Tool {
                    agent: root.to_owned(),
                    id: id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                    output: None,
                    server: true,
                });
            }
            Beat::ServerResult { id, name, content } => {
                items.push(Item::server_text("server_tool_result", id, Some(name), content.clone()));
                let v = serde_json::from_str(content).unwrap_or_else(|_| Value::String(content.clone()));
                set_output(&mut parts, id, v);
            }
            Beat::Subagent => {
                items.push(Item::MetaInit(MetaInit::new(
                    child,
                    Some(root),
                    Format::Xml,
                    "subtask",
                    None,
                )));
                parts.push(Part::Subagent {
                    agent: child.to_owned(),
                    parent: root.to_owned(),
                });
            }
            Beat::Awaiting { calls, answer } => {
                let v: Vec<Value> = calls
                    .iter()
                    .map(|(id, name, input)| json!({"tool_use_id": id, "name": name, "input": input}))
                    .collect();
                items.push(Item::AwaitingFrontendTools(Value::Array(v)));
                for (id, name, input) in calls {
                    if !set_output(&mut parts, id, answer.clone()) {
                        parts.push(Part::Tool {
                            agent: root.to_owned(),
                            id: id.clone(),
                            name: name.clone(),
                            input: input.clone(),
                            output: Some(answer.clone()),
                            server: false,
                        });
                    }
                }
            }
            Beat::Failure { error, message } => items.push(Item::failure(
                error,
                message,
                "Traceback (most recent call last):\n  File \"agent.py\", line 1",
            )),
            Beat::Final => items.push(Item::MetaFinal(json!({
                "stop_reason": "end_turn", "total_steps": 1, "cost": 0.01, "generated_files": [],
                "conversation_history": []
            }))),
            Beat::Done => items.push(Item::Done),
        }
    }
    (items, parts)
}

// ---------------------------------------------------------------- the scenarios

/// The page's frontend tool, and the answer every client here gives it.
pub const FRONTEND_TOOL: &str = "get_location";

pub fn location() -> Value {
    json!({"city": "Paris"})
}

/// (a) Thinking, then text, with characters every layer must carry: quotes, `<&>`, a newline, emoji, CJK.
pub fn thinking_and_text(prompt: &str) -> Run {
    Run::new(
        prompt,
        vec![
            Beat::thinking(Lane::Root, &["Let me ", "think about \"this\"", "…"]),
            Beat::text(Lane::Root, &["Hello", ", <b>world</b> & co", "\nline two 😀 中文", "."]),
            Beat::Final,
            Beat::Done,
        ],
    )
}

/// (b) Two tools the backend runs itself (call and result in the stream), then the answer.
pub fn backend_tools(prompt: &str) -> Run {
    Run::new(
        prompt,
        vec![
            Beat::text(Lane::Root, &["Searching the docs."]),
            Beat::call(
                Lane::Root,
                "toolu_search",
                "search_docs",
                json!({"query": "gateway <docs> & \"quotes\"", "limit": 3}),
            ),
            Beat::result(Lane::Root, "toolu_search", "search_docs", "3 hits:\n- a\n- \"b\" <c>"),
            Beat::call(Lane::Root, "toolu_read", "read_file", json!({"path": "docs/README.md"})),
            Beat::result(Lane::Root, "toolu_read", "read_file", "# README"),
            Beat::text(Lane::Root, &["Found 3 hits", " and read the README."]),
            Beat::Final,
            Beat::Done,
        ],
    )
}

/// The root says `intro`, and spawns a subagent (`toolu_spawn`) for `task`.
fn spawning(intro: &str, task: &str) -> Vec<Beat> {
    vec![
        Beat::text(Lane::Root, &[intro]),
        Beat::call(Lane::Root, "toolu_spawn", "spawn_subagent", json!({ "task": task })),
        Beat::Subagent,
    ]
}

/// (c) A subagent: the root spawns it, it thinks, writes and runs a tool of its own, the root's tool result for
/// the spawn call closes it, and the root answers.
pub fn subagent(prompt: &str) -> Run {
    let mut beats = spawning("Delegating to a researcher.", "research Paris");
    beats.extend([
        Beat::thinking(Lane::Child, &["The child thinks."]),
        Beat::text(Lane::Child, &["Paris is ", "the capital of France."]),
        Beat::call(Lane::Child, "toolu_lookup", "lookup", json!({"q": "Paris population"})),
        Beat::result(Lane::Child, "toolu_lookup", "lookup", "2.1 million"),
        Beat::result(
            Lane::Root,
            "toolu_spawn",
            "spawn_subagent",
            "Paris is the capital of France.",
        ),
        Beat::text(Lane::Root, &["The researcher says ", "Paris is the capital."]),
    ]);
    Run::new(prompt, finished(beats))
}

pub const SOURCE_URL: &str = "https://en.wikipedia.org/wiki/Paris";

/// (d) A server tool (the model provider's web search) and a text citing its result.
pub fn server_tools(prompt: &str) -> Run {
    Run::new(
        prompt,
        vec![
            Beat::ServerCall {
                id: "srvtoolu_search".into(),
                name: "web_search".into(),
                input: json!({"query": "capital of France"}),
            },
            Beat::ServerResult {
                id: "srvtoolu_search".into(),
                name: "web_search".into(),
                content: json!([{"type": "web_search_result", "url": SOURCE_URL, "title": "Paris - Wikipedia"}])
                    .to_string(),
            },
            Beat::Cited(
                Lane::Root,
                strings(&["Paris is ", "the capital of France."]),
                vec![(
                    SOURCE_URL.into(),
                    "Paris - Wikipedia".into(),
                    "Paris is the capital".into(),
                )],
            ),
            Beat::Final,
            Beat::Done,
        ],
    )
}

/// `beats`, then the run's end: `meta_final` and `[DONE]`.
fn finished(mut beats: Vec<Beat>) -> Vec<Beat> {
    beats.extend([Beat::Final, Beat::Done]);
    beats
}

/// `beats`, then the page's frontend tool called and awaited; the stream ends. The `tool_results` continuation
/// answers with the text `answer` and finishes.
fn awaiting_location(prompt: &str, mut beats: Vec<Beat>, answer: &[&str]) -> Run {
    beats.extend([
        Beat::call(Lane::Root, "toolu_loc", FRONTEND_TOOL, json!({})),
        Beat::Awaiting {
            calls: vec![("toolu_loc".into(), FRONTEND_TOOL.into(), json!({}))],
            answer: location(),
        },
        Beat::Done,
    ]);
    Run::new(prompt, beats).then(finished(vec![Beat::text(Lane::Root, answer)]))
}

/// (e) A backend-run tool, then the page's frontend tool, awaited; the stream ends. The `tool_results`
/// continuation answers in text and finishes.
pub fn frontend_tool(prompt: &str) -> Run {
    let beats = vec![
        Beat::text(Lane::Root, &["Let me check where you are."]),
        Beat::call(Lane::Root, "toolu_search", "search_docs", json!({"query": "weather"})),
        Beat::result(Lane::Root, "toolu_search", "search_docs", "needs a location"),
    ];
    awaiting_location(prompt, beats, &["You are in ", "Paris: it is sunny."])
}

/// (f) The model fails mid-text: the failure JSON while the block is open, and the stream ends.
pub fn failure(prompt: &str) -> Run {
    Run::new(
        prompt,
        vec![
            Beat::OpenText(Lane::Root, strings(&["Working", " on it"])),
            Beat::Failure {
                error: "RateLimitError".into(),
                message: "rate limited by the model provider".into(),
            },
        ],
    )
}

/// (g) A slow run: `pieces` text deltas, `gap` apart.
pub fn slow(prompt: &str, pieces: usize, gap: Duration) -> Run {
    let deltas: Vec<String> = (0..pieces).map(|i| format!("piece{i} ")).collect();
    Run::new(prompt, vec![Beat::Text(Lane::Root, deltas), Beat::Final, Beat::Done]).paced(gap)
}

/// (h) A second turn's answer (the first is any of the above).
pub fn second_turn(prompt: &str) -> Run {
    Run::new(
        prompt,
        finished(vec![Beat::text(Lane::Root, &["Second answer, ", "same agent."])]),
    )
}

/// The browser's run: a subagent, then the page's frontend tool; the continuation's final text.
pub fn subagent_then_frontend_tool(prompt: &str) -> Run {
    let mut beats = spawning("Asking a helper.", "find the weather");
    beats.extend([
        Beat::text(Lane::Child, &["The helper needs ", "your location."]),
        Beat::result(Lane::Root, "toolu_spawn", "spawn_subagent", "needs a location"),
    ]);
    awaiting_location(prompt, beats, &["Sunny in ", "Paris today."])
}
