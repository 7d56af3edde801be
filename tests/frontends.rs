//! The AI SDK and AG-UI frontends (DESIGN §5.3, issue 35), judged end to end by the real clients: the `ai`
//! package's own chat state machine and transport (`ai` 5 and 7, tests/external/node/ai-sdk-client.mjs),
//! `@ag-ui/client`'s `HttpAgent` with its `verifyEvents` (ag-ui-client.mjs), and a `useChat` page in headless
//! Chromium on another origin (tests/external/browser/use-chat).
//!
//! Each case starts a scripted legacy agent backend ([`AgentBackend`]: XML-in-SSE runs chosen by the prompt,
//! continuity of agents and of awaited frontend tools checked) and the gateway binary with two `[[frontend]]`
//! routes (`/api/chat` ai-sdk, `/agui` ag-ui, both to `/agent/run` and `/agent/tool_results`), a fresh pair per
//! client. What a client ends with is compared with what the backend sent, part by part: every text and thinking
//! block's text, every tool call's input and output, every source and subagent (AI SDK), in order, with their
//! agents (AG-UI: `metadata.agent`, else the subagent lane a message carries).
//!
//! node with `ai`, `ai5` and `@ag-ui/client`, esbuild and Chromium are installed by `.ci/external-clients.sh`; when
//! missing the tests are skipped with a note, except under `CI=true`, where they fail.

mod harness;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use harness::agent_backend::{
    backend_tools, failure, frontend_tool, location, second_turn, server_tools, slow, subagent,
    subagent_then_frontend_tool, thinking_and_text, AgentBackend, Part, Run, Served, FRONTEND_TOOL, GATEWAY_CONFIG,
    RUN, SOURCE_URL, TOOL_RESULTS,
};
use harness::browser::{available_or_skip, chromium_or_skip, npm_package_installed};
use harness::cors::Cors;
use harness::node::node_with_or_skip;
use harness::pages::await_report;
use harness::prelude::*;
use serde_json::{json, Value};

/// The longest a node client may run (each gives up by itself after 30 s).
const CLIENT_WAIT: Duration = Duration::from_secs(60);

/// One case at a time: two cores, node clients of ~100 MB each, and runs paced in real time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn temp_path(what: &str) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("sse-gw-frontends-{}-{n}-{what}", std::process::id()))
}

/// The backend scripted with `runs` (behind `cors` when given) and the gateway with the frontend routes before it.
struct Setup {
    backend: AgentBackend,
    gw: Process,
    config: PathBuf,
}

impl Setup {
    async fn start(runs: Vec<Run>, cors: Option<Cors>) -> Setup {
        let backend = AgentBackend::start(runs, cors).await;
        let config = temp_path("gateway.toml");
        std::fs::write(&config, GATEWAY_CONFIG).expect("write the gateway config");
        let gw = Process::start(
            &[
                "--config",
                config.to_str().expect("utf-8 path"),
                "--upstream",
                &backend.url(),
            ],
            &[("RUST_LOG", "warn")],
        );
        Setup { backend, gw, config }
    }

    /// For the cases of the gateway's own answers: one at a time ([`ONE_AT_A_TIME`], held by the guard), a backend
    /// with one plain run, behind `cors` when given.
    async fn plain(cors: Option<Cors>) -> (tokio::sync::MutexGuard<'static, ()>, Setup) {
        let one = ONE_AT_A_TIME.lock().await;
        (one, Setup::start(vec![thinking_and_text("hi")], cors).await)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.gw.addr)
    }

    /// The requests that reached the backend, one line each (`METHOD target`, and the body `with_body`).
    fn reached(&self, with_body: bool) -> Vec<String> {
        let mut lines = Vec::new();
        for r in self.backend.recorded() {
            let body = if with_body {
                String::from_utf8_lossy(&r.body)
            } else {
                "".into()
            };
            lines.push(format!("{} {} {body}", r.method, r.target).trim_end().to_owned());
        }
        lines
    }

    /// The backend's requests, its problems and the gateway's log: the evidence a failure message carries.
    fn evidence(&self) -> String {
        let requests = self.reached(true);
        format!(
            "backend requests: {requests:#?}\nbackend problems: {:#?}\ngateway log:\n{}",
            self.backend.problems(),
            self.gw.log_tail()
        )
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

/// The clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Ai5,
    Ai7,
    AgUi,
}

const ALL: [Client; 3] = [Client::Ai5, Client::Ai7, Client::AgUi];
const AI_SDK: [Client; 2] = [Client::Ai5, Client::Ai7];

impl Client {
    /// Its name, the gateway path it talks to, and its node command line.
    fn spec(self) -> (&'static str, &'static str, &'static [&'static str]) {
        const AI_SDK_CLIENT: &str = "tests/external/node/ai-sdk-client.mjs";
        match self {
            Client::Ai5 => ("ai 5", "/api/chat", &[AI_SDK_CLIENT, "--ai", "5"]),
            Client::Ai7 => ("ai 7", "/api/chat", &[AI_SDK_CLIENT, "--ai", "7"]),
            Client::AgUi => ("@ag-ui/client", "/agui", &["tests/external/node/ag-ui-client.mjs"]),
        }
    }

    fn name(self) -> &'static str {
        self.spec().0
    }

    fn path(self) -> &'static str {
        self.spec().1
    }
}

/// node and the clients' npm packages, or a skip (a failure under CI).
fn node_clients_or_skip() -> bool {
    node_with_or_skip("node with ai, ai5 and @ag-ui/client", &["ai", "ai5", "@ag-ui/client"])
}

/// What a node client printed: its JSON line (`Null` when none), whether it exited 0, and its stderr.
struct Ran {
    out: Value,
    ok: bool,
    stderr: String,
}

impl Ran {
    /// The output for a failure message (messages included).
    fn show(&self) -> String {
        format!(
            "exit ok: {}\nstderr: {}\noutput: {}",
            self.ok,
            self.stderr.trim(),
            serde_json::to_string_pretty(&self.out).unwrap_or_default()
        )
    }
}

/// Runs `client` on `script` against the gateway's `url` (bounded by [`CLIENT_WAIT`]).
async fn run_client(client: Client, url: String, script: Value) -> Ran {
    tokio::task::spawn_blocking(move || {
        let file = temp_path("script.json");
        std::fs::write(&file, script.to_string()).expect("write the client script");
        let mut cmd = Command::new("node");
        cmd.args(client.spec().2).args(["--url", &url, "--script"]).arg(&file);
        let ran = harness::node::run(cmd, CLIENT_WAIT);
        let _ = std::fs::remove_file(&file);
        let mut stderr = ran.stderr;
        if ran.status.is_none() {
            stderr.push_str(&format!("\n(killed: still running after {CLIENT_WAIT:?})"));
        }
        let line = ran.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or("null");
        Ran {
            out: serde_json::from_str(line).unwrap_or(Value::Null),
            ok: ran.status.is_some_and(|s| s.success()),
            stderr,
        }
    })
    .await
    .expect("the client's thread")
}

/// A script for `client`: `turns` user messages, the page's frontend tool answered with [`location`].
fn script(client: Client, turns: &[&str], extra: Value) -> Value {
    let mut s = json!({
        "turns": turns.iter().map(|t| json!({"text": t})).collect::<Vec<_>>(),
        "frontendTools": {FRONTEND_TOOL: location()},
    });
    let id = format!("chat-{}", temp_path("id").file_name().unwrap().to_string_lossy());
    if client == Client::AgUi {
        s["threadId"] = json!(format!("thread-{id}"));
    } else {
        s["chatId"] = json!(id);
    }
    if let (Some(s), Some(extra)) = (s.as_object_mut(), extra.as_object()) {
        s.extend(extra.clone());
    }
    s
}

// ---------------------------------------------------------------- what a client ends with, as parts

/// A string holding a JSON object or array is that value (a tool output sent as text, or as the value).
fn norm(v: &Value) -> Value {
    if let Some(s) = v.as_str() {
        if let Ok(parsed @ (Value::Object(_) | Value::Array(_))) = serde_json::from_str::<Value>(s) {
            return parsed;
        }
    }
    v.clone()
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

/// The AI SDK assistant messages' parts, in order (steps and the gateway's own data parts left out).
fn ai_sdk_parts(out: &Value) -> Vec<Part> {
    let mut parts = Vec::new();
    let messages = out["messages"].as_array().cloned().unwrap_or_default();
    for m in messages.iter().filter(|m| m["role"] == "assistant") {
        for p in m["parts"].as_array().into_iter().flatten() {
            let ty = p["type"].as_str().unwrap_or("");
            let agent = str_of(&p["providerMetadata"]["gateway"]["agent"]);
            match ty {
                "reasoning" => parts.push(Part::Thinking {
                    agent,
                    text: str_of(&p["text"]),
                }),
                "text" => parts.push(Part::Text {
                    agent,
                    text: str_of(&p["text"]),
                }),
                "source-url" => parts.push(Part::Source {
                    agent,
                    url: str_of(&p["url"]),
                    title: str_of(&p["title"]),
                }),
                "source-document" => parts.push(Part::Source {
                    agent,
                    url: String::new(),
                    title: str_of(&p["title"]),
                }),
                "data-agent" => parts.push(Part::Subagent {
                    agent: str_of(&p["data"]["agent"]),
                    parent: str_of(&p["data"]["parent"]),
                }),
                t if t == "dynamic-tool" || t.starts_with("tool-") => {
                    let name = if t == "dynamic-tool" {
                        str_of(&p["toolName"])
                    } else {
                        t["tool-".len()..].to_owned()
                    };
                    let pm = if p["callProviderMetadata"].is_object() {
                        &p["callProviderMetadata"]
                    } else {
                        &p["resultProviderMetadata"]
                    };
                    let output = match p["state"].as_str() {
                        Some("output-available") => Some(norm(&p["output"])),
                        Some("output-error") => Some(json!({"error": p["errorText"]})),
                        _ => None,
                    };
                    parts.push(Part::Tool {
                        agent: str_of(&pm["gateway"]["agent"]),
                        id: str_of(&p["toolCallId"]),
                        name,
                        input: p["input"].clone(),
                        output,
                        server: p["providerExecuted"] == json!(true),
                    });
                }
                _ => {}
            }
        }
    }
    parts
}

/// Agents AG-UI messages carry no `metadata.agent` for: told apart by the subagent lane only.
const ROOT_LANE: &str = "(no metadata.agent, no subagentRunId)";
const CHILD_LANE: &str = "(no metadata.agent, in a subagentRunId lane)";

/// The AG-UI thread's parts, in order: reasoning and assistant messages, tool calls with their `tool` message's
/// content as output (server tools are not told apart; sources and subagents are not messages).
fn ag_ui_parts(out: &Value) -> Vec<Part> {
    let messages = out["messages"].as_array().cloned().unwrap_or_default();
    let agent_of = |m: &Value, tc: Option<&Value>| -> String {
        let named = tc
            .and_then(|t| t["metadata"]["agent"].as_str())
            .or_else(|| m["metadata"]["agent"].as_str());
        match named {
            Some(a) => a.to_owned(),
            None if m["subagentRunId"].is_string() => CHILD_LANE.to_owned(),
            None => ROOT_LANE.to_owned(),
        }
    };
    let output_of = |id: &str| {
        messages
            .iter()
            .find(|m| m["role"] == "tool" && m["toolCallId"] == id)
            .map(|m| norm(&m["content"]))
    };
    let mut parts = Vec::new();
    for m in &messages {
        match m["role"].as_str() {
            Some("reasoning") => parts.push(Part::Thinking {
                agent: agent_of(m, None),
                text: str_of(&m["content"]),
            }),
            Some("assistant") => {
                if m["content"].as_str().is_some_and(|c| !c.is_empty()) {
                    parts.push(Part::Text {
                        agent: agent_of(m, None),
                        text: str_of(&m["content"]),
                    });
                }
                for tc in m["toolCalls"].as_array().into_iter().flatten() {
                    let id = str_of(&tc["id"]);
                    let args = str_of(&tc["function"]["arguments"]);
                    parts.push(Part::Tool {
                        agent: agent_of(m, Some(tc)),
                        output: output_of(&id),
                        id,
                        name: str_of(&tc["function"]["name"]),
                        input: serde_json::from_str(&args).unwrap_or(Value::String(args)),
                        server: false,
                    });
                }
            }
            _ => {}
        }
    }
    parts
}

/// What AG-UI can show of `want`: no sources or subagents (events, not messages), server tools as any tool, and
/// where `got` names no agent, the lane of the expected one (`root`'s or a subagent's).
fn ag_ui_view(want: &[Part], got: &[Part], root: &str) -> Vec<Part> {
    let agent = |p: &Part| -> String {
        match p {
            Part::Thinking { agent, .. } | Part::Text { agent, .. } | Part::Tool { agent, .. } => agent.clone(),
            Part::Source { agent, .. } | Part::Subagent { agent, .. } => agent.clone(),
        }
    };
    let mut view: Vec<Part> = want
        .iter()
        .filter(|p| !matches!(p, Part::Source { .. } | Part::Subagent { .. }))
        .cloned()
        .map(|p| output_as_value(p, false))
        .collect();
    for (w, g) in view.iter_mut().zip(got) {
        let lane = match agent(g).as_str() {
            ROOT_LANE if agent(w) == root => Some(ROOT_LANE),
            CHILD_LANE if agent(w) != root => Some(CHILD_LANE),
            _ => None,
        };
        if let Some(lane) = lane {
            match w {
                Part::Thinking { agent, .. } | Part::Text { agent, .. } | Part::Tool { agent, .. } => {
                    *agent = lane.to_owned();
                }
                _ => {}
            }
        }
    }
    view
}

/// `p` with its tool output compared as a value; still marked server-run only with `keep_server` (AG-UI shows
/// server tools as any tool).
fn output_as_value(mut p: Part, keep_server: bool) -> Part {
    if let Part::Tool { output, server, .. } = &mut p {
        *output = output.as_ref().map(norm);
        *server &= keep_server;
    }
    p
}

/// The AI SDK view of `want`: tool outputs compared as values.
fn ai_sdk_view(want: &[Part]) -> Vec<Part> {
    want.iter().cloned().map(|p| output_as_value(p, true)).collect()
}

/// `Err` naming the first part that differs, with both lists, when `got` is not `want`.
fn same_parts(got: &[Part], want: &[Part]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(g, w)| g != w)
        .unwrap_or(got.len().min(want.len()));
    Err(format!(
        "the parts differ from part {first} on ({} got, {} expected)\n got: {got:#?}\nwant: {want:#?}",
        got.len(),
        want.len()
    ))
}

/// Compares what `client` ended with to what the backend sent.
/// `FRONTENDS_DUMP=1`: each client's parts go to stderr (with `--nocapture`).
fn check_content(client: Client, ran: &Ran, setup: &Setup) -> Result<(), String> {
    let want = setup.backend.expected();
    if std::env::var_os("FRONTENDS_DUMP").is_some() {
        let got = match client {
            Client::AgUi => ag_ui_parts(&ran.out),
            _ => ai_sdk_parts(&ran.out),
        };
        eprintln!("{}: {got:#?}\nexpected: {want:#?}", client.name());
    }
    match client {
        Client::AgUi => {
            let got = ag_ui_parts(&ran.out);
            let root = setup.backend.first_agent().unwrap_or_default();
            same_parts(&got, &ag_ui_view(&want, &got, &root))
        }
        _ => same_parts(&ai_sdk_parts(&ran.out), &ai_sdk_view(&want)),
    }
}

/// The assistant messages of an AI SDK output.
fn assistant_messages(out: &Value) -> Vec<Value> {
    out["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "assistant")
        .cloned()
        .collect()
}

/// The checks every run that should succeed shares: the client did not fail, the stream ended well, the backend
/// saw nothing wrong.
fn check_clean(client: Client, ran: &Ran, setup: &Setup) -> Result<(), String> {
    let mut problems = Vec::new();
    if !ran.ok {
        problems.push("the client failed".to_owned());
    }
    let errors = ran.out["errors"].as_array().map_or(0, Vec::len);
    if errors > 0 {
        problems.push(format!("the client reported errors: {}", ran.out["errors"]));
    }
    match client {
        Client::AgUi => {
            if ran.out["runErrors"].as_array().is_some_and(|e| !e.is_empty()) {
                problems.push(format!("RUN_ERROR: {}", ran.out["runErrors"]));
            }
        }
        _ => {
            if ran.out["status"] != "ready" {
                problems.push(format!("status {} (want ready)", ran.out["status"]));
            }
        }
    }
    let backend = setup.backend.problems();
    if !backend.is_empty() {
        problems.push(format!("the backend saw: {backend:?}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// A case each of `clients` runs, each on a fresh backend scripted by `runs()` and a fresh gateway: a conversation
/// of `turns` (with `extra` script keys, see [`script`]), or a `whole_script`.
struct Case {
    clients: &'static [Client],
    runs: fn() -> Vec<Run>,
    turns: &'static [&'static str],
    extra: Value,
    whole_script: Option<Value>,
    /// How many requests the client makes (AI SDK POSTs, AG-UI runs) and the backend serves, checked first.
    posts: Option<u64>,
    /// [`check_clean`] before the case's own checks (off where the run is to end in an error).
    clean: bool,
    /// [`check_content`] after them (off where the client answers with something else than the backend promised).
    content: bool,
}

impl Case {
    fn of(clients: &'static [Client], runs: fn() -> Vec<Run>, turns: &'static [&'static str]) -> Case {
        Case {
            clients,
            runs,
            turns,
            extra: json!({}),
            whole_script: None,
            posts: None,
            clean: true,
            content: true,
        }
    }

    /// `extra` keys in each client's script.
    fn with(self, extra: Value) -> Case {
        Case { extra, ..self }
    }

    /// `script` as each client's script, as it is.
    fn script(self, script: Value) -> Case {
        Case {
            whole_script: Some(script),
            ..self
        }
    }

    /// The client makes `n` requests in all, and the backend serves `n`.
    fn posting(self, n: u64) -> Case {
        Case { posts: Some(n), ..self }
    }

    /// The client gives up at its fourth request: a re-post loop shows, rather than runs on.
    fn bounded(self) -> Case {
        self.with(json!({"maxPosts": 3, "maxRuns": 3}))
    }

    /// The client makes one request, the backend serves one, and the client would give up at its fourth (a re-post
    /// loop).
    fn one_request(self) -> Case {
        self.bounded().posting(1)
    }

    /// The run ends in an error: no [`check_clean`].
    fn failing(self) -> Case {
        Case { clean: false, ..self }
    }

    /// The client's own answer is not the backend's: no [`check_content`].
    fn answered_otherwise(self) -> Case {
        Case { content: false, ..self }
    }

    /// Runs the case for each client with no checks of its own.
    async fn run(self) {
        self.check(|_, _, _, _| Ok(())).await;
    }

    /// Runs the case for each client, one after the other, with `checks` (of the client's output, the setup and the requests
    /// the backend served) between [`check_clean`] and [`check_content`]; fails with every client's failure, its output and the evidence.
    async fn check(self, checks: impl Fn(Client, &Ran, &Setup, &[Served]) -> Result<(), String>) {
        if !node_clients_or_skip() {
            return;
        }
        let _one = ONE_AT_A_TIME.lock().await;
        let mut failures = Vec::new();
        for &client in self.clients {
            let setup = Setup::start((self.runs)(), None).await;
            let s = (self.whole_script.clone()).unwrap_or_else(|| script(client, self.turns, self.extra.clone()));
            let ran = run_client(client, setup.url(client.path()), s).await;
            let result = (|| {
                if let Some(n) = self.posts {
                    let got = posts(client, &ran.out);
                    want(got == n, || format!("{n} requests of the client, got {got}"))?;
                    let served = setup.backend.served();
                    want(served.len() as u64 == n, || {
                        format!("the backend serves {n} requests: {:#?}", served_lines(&served))
                    })?;
                }
                if self.clean {
                    check_clean(client, &ran, &setup)?;
                }
                checks(client, &ran, &setup, &setup.backend.served())?;
                if self.content {
                    check_content(client, &ran, &setup)?;
                }
                Ok::<_, String>(())
            })();
            if let Err(why) = result {
                failures.push(format!(
                    "=== {}: {why}\n{}\n{}",
                    client.name(),
                    ran.show(),
                    setup.evidence()
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {} clients failed:\n{}",
            failures.len(),
            self.clients.len(),
            failures.join("\n\n")
        );
    }
}

fn want(cond: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(why())
    }
}

/// The backend's served requests, one line each, for messages.
fn served_lines(served: &[Served]) -> Vec<String> {
    served.iter().map(|s| format!("{} {}", s.path, s.body)).collect()
}

/// The number of runs the client made: AI SDK POSTs, AG-UI runs.
fn posts(client: Client, out: &Value) -> u64 {
    let key = if client == Client::AgUi { "runs" } else { "posts" };
    out[key].as_u64().unwrap_or(0)
}

// ---------------------------------------------------------------- the cases

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_turn_continues_the_first_turns_agent_with_thinking_and_text_intact() {
    Case::of(
        &ALL,
        || vec![thinking_and_text("first question"), second_turn("second question")],
        &["first question", "second question"],
    )
    .posting(2)
    .check(|client, ran, _, served| {
        want(served.len() == 2 && served.iter().all(|s| s.path == RUN), || {
            format!("the backend should see two runs: {:#?}", served_lines(served))
        })?;
        want(
            served[0].body["user_prompt"] == "first question" && served[1].body["user_prompt"] == "second question",
            || format!("user_prompt is each turn's text: {:#?}", served_lines(served)),
        )?;
        want(served[0].body.get("agent_uuid").is_none_or(Value::is_null), || {
            format!("the first turn names no agent: {}", served[0].body)
        })?;
        want(served[1].body["agent_uuid"] == json!(served[0].agent), || {
            format!(
                "the second turn continues agent {}: {}",
                served[0].agent, served[1].body
            )
        })?;
        if client == Client::AgUi {
            return Ok(());
        }
        let msgs = assistant_messages(&ran.out);
        want(msgs.len() == 2, || {
            format!("two assistant messages, got {}", msgs.len())
        })?;
        want(
            msgs.iter().all(|m| m["metadata"]["agent"] == json!(served[0].agent)),
            || "each assistant message's metadata.agent is the agent".to_owned(),
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_tool_answered_by_the_client_reaches_the_backend_once_with_only_the_awaited_call() {
    Case::of(&ALL, || vec![frontend_tool("where am I")], &["where am I"])
        .posting(2)
        .check(|client, ran, _, served| {
            want(
                served.len() == 2 && served[0].path == RUN && served[1].path == TOOL_RESULTS,
                || format!("one run, then one tool_results: {:#?}", served_lines(served)),
            )?;
            let body = &served[1].body;
            want(body["agent_uuid"] == json!(served[0].agent), || {
                format!("tool_results names the run's agent {}: {body}", served[0].agent)
            })?;
            let results = body["tool_results"].as_array().cloned().unwrap_or_default();
            want(results.len() == 1 && results[0]["tool_use_id"] == "toolu_loc", || {
                format!("exactly the awaited call toolu_loc (not the backend's toolu_search): {body}")
            })?;
            want(
                norm(&results[0]["content"]) == location() && results[0]["is_error"] == false,
                || format!("the page's answer {} as a string, is_error false: {body}", location()),
            )?;
            match client {
                Client::AgUi => want(ran.out["pending"] == json!([["toolu_loc"]]), || {
                    format!("the client answers exactly toolu_loc: pending {}", ran.out["pending"])
                }),
                _ => {
                    let msgs = assistant_messages(&ran.out);
                    want(msgs.len() == 1, || {
                        format!(
                            "the continuation goes on in the same assistant message, got {} messages",
                            msgs.len()
                        )
                    })?;
                    let reasons: Vec<Value> = ran.out["finishes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|f| f["finishReason"].clone())
                        .collect();
                    want(reasons == [json!("tool-calls"), json!("stop")], || {
                        format!("finishes tool-calls then stop: {}", ran.out["finishes"])
                    })
                }
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_run_tools_do_not_make_the_client_post_again() {
    Case::of(&ALL, || vec![backend_tools("search the docs")], &["search the docs"])
        .one_request()
        .run()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tools_arrive_provider_executed_and_citations_as_sources() {
    Case::of(&ALL, || vec![server_tools("capital of France")], &["capital of France"])
        .one_request()
        .check(|client, ran, _, _| {
            if client == Client::AgUi {
                return Ok(());
            }
            let parts = ai_sdk_parts(&ran.out);
            want(
                parts
                    .iter()
                    .any(|p| matches!(p, Part::Source { url, .. } if url == SOURCE_URL)),
                || format!("a source-url part for {SOURCE_URL}"),
            )?;
            want(
                parts
                    .iter()
                    .any(|p| matches!(p, Part::Tool { server: true, name, .. } if name == "web_search")),
                || "web_search is providerExecuted".to_owned(),
            )
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagent_is_told_apart_from_its_parent_in_every_client() {
    Case::of(&ALL, || vec![subagent("research Paris")], &["research Paris"])
        .bounded()
        .check(|client, ran, _, served| {
            let (root, child) = (served[0].agent.clone(), served[0].child.clone());
            match client {
                Client::AgUi => {
                    let events: Vec<String> = ran.out["events"][0]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(str_of)
                        .collect();
                    let at = |t: &str| events.iter().position(|e| e == t);
                    want(
                        at("SUBAGENT_STARTED").is_some() && at("SUBAGENT_FINISHED").is_some(),
                        || format!("SUBAGENT_STARTED and SUBAGENT_FINISHED: {events:?}"),
                    )?;
                    want(at("SUBAGENT_FINISHED") < at("RUN_FINISHED"), || {
                        format!("the subagent finishes before the run: {events:?}")
                    })?;
                    let child_messages = ran.out["messages"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|m| m["subagentRunId"].is_string())
                        .count();
                    want(child_messages >= 2, || {
                        format!("the child's thinking and text carry its subagentRunId, {child_messages} messages do")
                    })
                }
                _ => {
                    let parts = ai_sdk_parts(&ran.out);
                    want(
                        parts.contains(&Part::Subagent {
                            agent: child.clone(),
                            parent: root.clone(),
                        }),
                        || format!("a data-agent part for {child}, parent {root}"),
                    )?;
                    want(
                        parts
                            .iter()
                            .any(|p| matches!(p, Part::Text { agent, .. } if *agent == child)),
                        || format!("a text part whose providerMetadata.gateway.agent is {child}"),
                    )
                }
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_failure_mid_run_ends_the_run_with_an_error_in_every_client() {
    Case::of(&ALL, || vec![failure("fail please")], &["fail please"])
        .failing()
        .check(|client, ran, setup, _| {
            match client {
                Client::AgUi => {
                    want(ran.out["errors"].as_array().is_some_and(Vec::is_empty), || {
                        format!("verifyEvents and the schema accept the stream: {}", ran.out["errors"])
                    })?;
                    let run_errors = ran.out["runErrors"].as_array().cloned().unwrap_or_default();
                    want(run_errors.len() == 1, || {
                        format!("one RUN_ERROR, got {}", ran.out["runErrors"])
                    })?;
                    want(run_errors[0]["message"].to_string().contains("rate limited"), || {
                        format!("RUN_ERROR says what failed: {}", run_errors[0])
                    })?;
                    let last = ran.out["events"][0].as_array().and_then(|e| e.last()).cloned();
                    want(last == Some(json!("RUN_ERROR")), || {
                        format!("RUN_ERROR ends the run: {}", ran.out["events"])
                    })?;
                }
                _ => {
                    want(ran.ok, || "the client ran to its end".to_owned())?;
                    want(ran.out["status"] == "error", || {
                        format!("status error, got {}", ran.out["status"])
                    })?;
                    let errors = ran.out["errors"].as_array().cloned().unwrap_or_default();
                    want(!errors.is_empty(), || "onError was called".to_owned())?;
                    want(errors.iter().any(|e| e.to_string().contains("rate limited")), || {
                        format!("the error says what failed: {errors:?}")
                    })?;
                }
            }
            want(setup.backend.problems().is_empty(), || {
                format!("backend: {:?}", setup.backend.problems())
            })
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ai_sdk_client_cut_mid_run_resumes_the_whole_message_from_the_chat_stream() {
    Case::of(
        &AI_SDK,
        || vec![slow("a slow answer", 20, Duration::from_millis(100))],
        &["a slow answer"],
    )
    .with(json!({"resumeAfterMs": 700}))
    .check(|_, ran, setup, served| {
        want(served.len() == 1, || {
            format!(
                "the backend runs the agent once (the resume reads the held stream): {:#?}",
                served_lines(served)
            )
        })?;
        let requests = ran.out["requests"].as_array().cloned().unwrap_or_default();
        let chat = ran.out["requests"][0]["body"]["id"].as_str().unwrap_or("").to_owned();
        let shape: Vec<(String, String, u64)> = requests
            .iter()
            .map(|r| {
                (
                    str_of(&r["method"]),
                    str_of(&r["url"]),
                    r["status"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        let stream = setup.url(&format!("/api/chat/{chat}/stream"));
        want(
            shape.len() == 2 && shape[0].0 == "POST" && shape[1] == ("GET".to_owned(), stream.clone(), 200),
            || format!("a POST, then GET {stream} answered 200: {shape:?}"),
        )?;
        let msgs = assistant_messages(&ran.out);
        let text: String = (0..20).map(|i| format!("piece{i} ")).collect();
        want(
            msgs.len() == 1
                && msgs[0]["parts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["text"] == json!(text)),
            || format!("one assistant message with the whole text {text:?}"),
        )
    })
    .await;
}

/// The value of the answer's header `name`.
fn header(parts: &http::response::Parts, name: &str) -> Option<String> {
    parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// The preflight of a page at `origin` for `POST /api/chat`, and its answer.
async fn preflight(setup: &Setup, origin: &str) -> (http::response::Parts, Vec<u8>) {
    let headers = [
        ("origin", origin),
        ("access-control-request-method", "POST"),
        ("access-control-request-headers", "content-type"),
    ];
    send("OPTIONS", &setup.url("/api/chat"), &headers, Vec::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_adapter_cannot_map_is_a_400_naming_the_field_and_nothing_reaches_the_backend() {
    let (_one, setup) = Setup::plain(None).await;
    let json_type = [("content-type", "application/json")];
    let cases: [(&str, &str, Option<&str>); 5] = [
        ("/api/chat", "this is not JSON", None),
        (
            "/api/chat",
            r#"{"id": "c1", "messages": "hello", "trigger": "submit-message"}"#,
            Some("messages"),
        ),
        (
            "/api/chat",
            r#"{"id": "c1", "trigger": "submit-message"}"#,
            Some("messages"),
        ),
        (
            "/agui",
            r#"{"threadId": "t1", "runId": "r1", "messages": {"role": "user"}}"#,
            Some("messages"),
        ),
        ("/agui", "[1, 2, 3]", None),
    ];
    let mut failures = Vec::new();
    for (path, body, field) in cases {
        let (parts, answer) = send("POST", &setup.url(path), &json_type, body.to_owned()).await;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let ty = header(&parts, "content-type").unwrap_or_default();
        let parsed: Option<Value> = serde_json::from_slice(&answer).ok();
        let ok = parts.status == 400
            && ty.contains("json")
            && parsed.as_ref().is_some_and(|v| v.get("error").is_some())
            && field.is_none_or(|f| text.contains(f));
        if !ok {
            failures.push(format!(
                "POST {path} {body:?}: {} {ty:?} {text} (want 400, a JSON body with \"error\"{})",
                parts.status,
                field.map(|f| format!(" naming {f:?}")).unwrap_or_default()
            ));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reached = setup.reached(false);
    if !reached.is_empty() {
        failures.push(format!("the backend was sent {reached:?}"));
    }
    assert!(failures.is_empty(), "{}\n{}", failures.join("\n"), setup.gw.log_tail());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preflight_of_a_mapped_path_is_the_backends_answer_for_its_run_path() {
    let page = "http://127.0.0.1:1";
    let (_one, setup) = Setup::plain(Some(Cors::legacy_app(page))).await;
    let mut failures = Vec::new();
    for (origin, allowed) in [(page, true), ("http://127.0.0.1:2", false)] {
        let (parts, body) = preflight(&setup, origin).await;
        let acao = header(&parts, "access-control-allow-origin");
        let want_status = if allowed { 200 } else { 400 };
        if parts.status != want_status || acao.as_deref() != allowed.then_some(origin) {
            failures.push(format!(
                "OPTIONS /api/chat from {origin}: {} ACAO {acao:?} {} (the backend answers {want_status}{})",
                parts.status,
                String::from_utf8_lossy(&body),
                if allowed {
                    " allowing it"
                } else {
                    " without allowing it"
                }
            ));
        }
    }
    let preflights = setup.reached(false);
    if preflights != ["OPTIONS /agent/run", "OPTIONS /agent/run"] {
        failures.push(format!(
            "the backend should see both preflights on the run path, saw {preflights:?}"
        ));
    }
    assert!(failures.is_empty(), "{}\n{}", failures.join("\n"), setup.gw.log_tail());
}

// ---------------------------------------------------------------- a useChat page in Chromium

/// The page's origin: the built page at `/app/use-chat.html`, and `204` to its `POST /report` (recorded).
async fn page_site(html: Vec<u8>) -> Emulator {
    Emulator::start(move |req| {
        let path = req.target.split('?').next().unwrap_or("");
        if path == "/report" {
            return vec![Step::head(204, &[], false)];
        }
        if path == "/app/use-chat.html" {
            let len = html.len().to_string();
            let head = [
                ("Content-Type", "text/html; charset=utf-8"),
                ("Content-Length", len.as_str()),
                ("Cache-Control", "no-store"),
            ];
            return vec![Step::head(200, &head, false), Step::WriteAll(html.clone())];
        }
        vec![Step::head(404, &[("Content-Length", "0")], false)]
    })
    .await
}

/// Builds the use-chat page with esbuild (tests/external/browser/use-chat/build.mjs); `None` when it cannot be
/// (a failure under CI).
fn build_page() -> Option<Vec<u8>> {
    if !available_or_skip(
        "esbuild, react and @ai-sdk/react",
        ["esbuild", "react", "react-dom", "@ai-sdk/react", "ai"]
            .iter()
            .all(|p| npm_package_installed(p)),
        "run .ci/external-clients.sh",
    ) {
        return None;
    }
    let out = temp_path("use-chat.html");
    let built = Command::new("node")
        .arg("tests/external/browser/use-chat/build.mjs")
        .arg(&out)
        .output()
        .expect("run build.mjs");
    assert!(
        built.status.success(),
        "build.mjs failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let html = std::fs::read(&out).expect("the built page");
    let _ = std::fs::remove_file(&out);
    Some(html)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_origin_use_chat_page_renders_a_subagent_and_answers_its_frontend_tool() {
    let Some(chromium) = chromium_or_skip() else {
        return;
    };
    if !node_clients_or_skip() {
        return;
    }
    let Some(html) = build_page() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let site = page_site(html).await;
    let origin = format!("http://{}", site.addr);
    let setup = Setup::start(
        vec![subagent_then_frontend_tool("weather")],
        Some(Cors::legacy_app(&origin)),
    )
    .await;
    let url = format!(
        "{origin}/app/use-chat.html?api={}&text=weather&timeout_ms=20000",
        setup.url("/api/chat")
    );
    let report = await_report(&chromium, &url, &site, Duration::from_secs(20), "the use-chat page").await;
    let served = setup.backend.served();
    let (root, child) = served
        .first()
        .map(|s| (s.agent.clone(), s.child.clone()))
        .unwrap_or_default();
    let parts = ai_sdk_parts(&report);
    let mut problems = Vec::new();
    if report["done"] != json!(true) || report["status"] != "ready" {
        problems.push(format!(
            "the page did not finish: done {} status {}",
            report["done"], report["status"]
        ));
    }
    if report["errors"].as_array().is_some_and(|e| !e.is_empty()) || !report["error"].is_null() {
        problems.push(format!("page errors: {} {}", report["errors"], report["error"]));
    }
    let console = report["console"].as_str().unwrap_or("").to_owned();
    if ["Uncaught", "CORS", "Failed to fetch", "ERR_"]
        .iter()
        .any(|e| console.contains(e))
    {
        problems.push("errors on the console".to_owned());
    }
    if served.len() != 2 || served[1].path != TOOL_RESULTS {
        problems.push(format!(
            "the backend should see a run then tool_results: {:#?}",
            served_lines(&served)
        ));
    } else if served[1].body["tool_results"].as_array().map_or(0, Vec::len) != 1
        || served[1].body["tool_results"][0]["tool_use_id"] != "toolu_loc"
        || norm(&served[1].body["tool_results"][0]["content"]) != location()
    {
        problems.push(format!(
            "tool_results should answer toolu_loc with {}: {}",
            location(),
            served[1].body
        ));
    }
    if !parts
        .iter()
        .any(|p| matches!(p, Part::Text { agent, text } if *agent == child && text.contains("your location")))
    {
        problems.push(format!("no text part of the child {child}"));
    }
    if !parts.contains(&Part::Subagent {
        agent: child.clone(),
        parent: root.clone(),
    }) {
        problems.push(format!("no data-agent part for {child}"));
    }
    if !parts
        .iter()
        .any(|p| matches!(p, Part::Tool { name, output: Some(o), .. } if name == FRONTEND_TOOL && *o == location()))
    {
        problems.push(format!("no {FRONTEND_TOOL} part with the output {}", location()));
    }
    if !parts
        .iter()
        .any(|p| matches!(p, Part::Text { agent, text } if *agent == root && text == "Sunny in Paris today."))
    {
        problems.push("no final text after the continuation".to_owned());
    }
    if let Err(why) = same_parts(&parts, &ai_sdk_view(&setup.backend.expected())) {
        problems.push(why);
    }
    let backend = setup.backend.problems();
    if !backend.is_empty() {
        problems.push(format!("the backend saw: {backend:?}"));
    }
    assert!(
        problems.is_empty(),
        "{}\nreport: {}\nconsole:\n{console}\n{}",
        problems.join("\n"),
        serde_json::to_string_pretty(&report).unwrap_or_default(),
        setup.evidence()
    );
}

// ---------------------------------------------------------------- the backend itself

/// The parts a translated legacy stream carries (the JSON envelopes, DESIGN 4), as [`AgentBackend::expected`]
/// writes them; awaited calls answered with [`location`].
fn envelope_parts(sse: &[u8], fallback: &str) -> Vec<Part> {
    let translated = sse_gateway::translate::translate_all(sse_gateway::translate::Options::default(), fallback, sse).0;
    let envs: Vec<Value> = sse_data(&translated)
        .iter()
        .map(|d| serde_json::from_str(d).unwrap_or(Value::String(d.clone())))
        .collect();
    let mut parts: Vec<Part> = Vec::new();
    let mut root: Option<String> = None;
    let extra = |b: &harness::legacy::Block, k: &str| {
        b.extras
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| str_of(v))
            .unwrap_or_default()
    };
    let answer = |parts: &mut Vec<Part>, id: &str, v: Value| {
        for p in parts.iter_mut() {
            if let Part::Tool { id: pid, output, .. } = p {
                if pid == id {
                    *output = Some(v.clone());
                }
            }
        }
    };
    for b in harness::legacy::blocks(&envs) {
        let agent = b.agent.clone();
        let json = || serde_json::from_str::<Value>(&b.content).unwrap_or(Value::String(b.content.clone()));
        match b.kind.as_str() {
            "meta_init" => {
                let parent = json()["parent_agent_uuid"].as_str().map(str::to_owned);
                match (&root, parent) {
                    (None, _) => root = Some(agent),
                    (Some(_), Some(parent)) => parts.push(Part::Subagent { agent, parent }),
                    _ => {}
                }
            }
            "thinking" => parts.push(Part::Thinking {
                agent,
                text: b.content.clone(),
            }),
            "text" => parts.push(Part::Text {
                agent,
                text: b.content.clone(),
            }),
            "citation" => parts.push(Part::Source {
                url: extra(&b, "url"),
                title: extra(&b, "title"),
                agent,
            }),
            "tool_call" | "server_tool_call" => parts.push(Part::Tool {
                agent,
                id: extra(&b, "id"),
                name: extra(&b, "name"),
                input: json(),
                output: None,
                server: b.kind == "server_tool_call",
            }),
            "tool_result" => answer(&mut parts, &extra(&b, "id"), Value::String(b.content.clone())),
            "server_tool_result" => answer(&mut parts, &extra(&b, "id"), json()),
            "awaiting_frontend_tools" => {
                for call in json().as_array().into_iter().flatten() {
                    answer(&mut parts, &str_of(&call["tool_use_id"]), location());
                }
            }
            _ => {}
        }
    }
    parts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripted_backend_streams_exactly_the_parts_it_promises_and_checks_continuity() {
    let runs = vec![
        thinking_and_text("a"),
        backend_tools("b"),
        subagent("c"),
        server_tools("d"),
        frontend_tool("e"),
        failure("f"),
        slow("g", 3, Duration::from_millis(5)),
        second_turn("h"),
    ];
    let backend = AgentBackend::start(runs, None).await;
    let post = |path: &str, body: Value| {
        let url = format!("{}{path}", backend.url());
        async move {
            send("POST", &url, &[("content-type", "application/json")], body.to_string())
                .await
                .1
        }
    };
    for (i, prompt) in ["a", "b", "c", "d", "e", "f", "g"].iter().enumerate() {
        let sse = post(RUN, json!({"user_prompt": prompt})).await;
        let served = backend.served();
        let got = envelope_parts(&sse, "unused");
        assert_eq!(got, served[i].parts, "run {prompt:?}: the stream's parts");
    }
    let first = backend.served()[0].agent.clone();
    post(RUN, json!({"user_prompt": "h", "agent_uuid": first})).await;
    let awaiting = backend.served()[4].agent.clone();
    let sse = post(
        TOOL_RESULTS,
        json!({"agent_uuid": awaiting, "tool_results": [{"tool_use_id": "toolu_loc", "content": "{\"city\": \"Paris\"}", "is_error": false}]}),
    )
    .await;
    let continuation = backend.served().last().expect("served").clone();
    assert_eq!(
        envelope_parts(&sse, &awaiting),
        continuation.parts,
        "the continuation's parts"
    );
    assert_eq!(backend.problems(), Vec::<String>::new(), "a well-behaved conversation");

    // What the backend refuses: an agent it never gave out, a second answer, an answer with a call not awaited.
    post(
        RUN,
        json!({"user_prompt": "h", "agent_uuid": "0a0a0a0a-0000-4000-8000-999999999999"}),
    )
    .await;
    post(TOOL_RESULTS, json!({"agent_uuid": awaiting, "tool_results": []})).await;
    let problems = backend.problems();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems[0].contains("never gave out") && problems[1].contains("awaits no frontend tool"),
        "{problems:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_with_a_file_reaches_the_backend_as_content_blocks() {
    let file = json!({"type": "file", "mediaType": "text/plain", "filename": "notes.txt",
                      "url": "data:text/plain;base64,aGVsbG8gd29ybGQ="});
    let whole = json!({"turns": [{"text": "describe this file", "files": [file]}]});
    Case::of(&AI_SDK, || vec![thinking_and_text("describe this file")], &[])
        .script(whole)
        .check(|_, _, _, served| {
            want(served.len() == 1, || format!("one run: {:#?}", served_lines(served)))?;
            let prompt = &served[0].body["user_prompt"];
            let blocks = prompt.as_array().cloned().unwrap_or_default();
            want(
                blocks.len() == 2
                    && blocks
                        .iter()
                        .any(|b| b["type"] == "text" && b["text"] == "describe this file"),
                || format!("user_prompt is the text and the file as two content blocks: {prompt}"),
            )
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_stream_route_answers_204_for_a_chat_with_no_stream() {
    let (_one, setup) = Setup::plain(None).await;
    let (parts, body) = get(&setup.url("/api/chat/no-such-chat/stream")).await;
    assert_eq!(
        parts.status,
        204,
        "a chat with no stream: {}\n{}",
        String::from_utf8_lossy(&body),
        setup.gw.log_tail()
    );
    assert!(setup.backend.recorded().is_empty(), "nothing reaches the backend");
}

/// DESIGN 5.3: the route replays the chat's *running* stream. A run the client read to its end is not offered again
/// (a page reloaded after it would show the message twice): the route answers 204 and the client shows nothing new.
/// (A client cut mid-run is resumed, even after the run ended: see the resume case above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_whose_run_was_read_to_its_end_is_not_replayed_by_the_stream_route() {
    if !node_clients_or_skip() {
        return;
    }
    let (_one, setup) = Setup::plain(None).await;
    let s = json!({"chatId": "chat-finished", "turns": [{"text": "hi"}]});
    let first = run_client(Client::Ai7, setup.url("/api/chat"), s.clone()).await;
    assert!(first.ok && first.out["status"] == "ready", "{}", first.show());
    let (parts, body) = send("GET", &setup.url("/api/chat/chat-finished/stream"), &[], Vec::new()).await;
    assert_eq!(
        parts.status,
        204,
        "{}\n{}",
        String::from_utf8_lossy(&body),
        setup.evidence()
    );
    assert_eq!(setup.backend.served().len(), 1, "the route never runs the agent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_after_a_frontend_tool_continues_the_same_agent_with_a_new_run() {
    Case::of(
        &ALL,
        || vec![frontend_tool("where am I"), second_turn("and now?")],
        &["where am I", "and now?"],
    )
    .check(|_, _, _, served| {
        let paths: Vec<&str> = served.iter().map(|s| s.path.as_str()).collect();
        want(paths == [RUN, TOOL_RESULTS, RUN], || {
            format!("run, tool_results, run: {:#?}", served_lines(served))
        })?;
        want(served[2].body["agent_uuid"] == json!(served[0].agent), || {
            format!(
                "the second turn continues agent {}: {}",
                served[0].agent, served[2].body
            )
        })?;
        want(served[2].body["user_prompt"] == "and now?", || {
            format!("the second turn's text: {}", served[2].body)
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_tool_that_fails_in_the_client_reaches_the_backend_as_an_error_result() {
    let denied = json!({"frontendTools": {FRONTEND_TOOL: {"error": "location permission denied"}}});
    Case::of(&ALL, || vec![frontend_tool("where am I")], &["where am I"])
        .with(denied)
        .answered_otherwise()
        .check(|_, _, _, served| {
            want(served.len() == 2 && served[1].path == TOOL_RESULTS, || {
                format!("one run, then one tool_results: {:#?}", served_lines(served))
            })?;
            let r = &served[1].body["tool_results"];
            want(
                r.as_array().map_or(0, Vec::len) == 1
                    && r[0]["tool_use_id"] == "toolu_loc"
                    && r[0]["is_error"] == true
                    && r[0]["content"]
                        .as_str()
                        .is_some_and(|c| c.contains("location permission denied")),
                || format!("toolu_loc with is_error true and the error text: {}", served[1].body),
            )
        })
        .await;
}

/// DESIGN §5.3: the gateway's own answers on a mapped path (the adapter's 400, the resume route's 204) carry the
/// backend's CORS answer for that origin, else the page sees "Failed to fetch" instead of the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_own_answers_on_a_mapped_path_carry_the_backends_cors_answer() {
    let page = "http://127.0.0.1:1";
    let (_one, setup) = Setup::plain(Some(Cors::legacy_app(page))).await;
    let (parts, _) = preflight(&setup, page).await;
    assert_eq!(parts.status, 200, "the preflight");
    let acao = |parts: &http::response::Parts| header(parts, "access-control-allow-origin");
    let mut failures = Vec::new();
    let bad = [("origin", page), ("content-type", "application/json")];
    let (parts, body) = send("POST", &setup.url("/api/chat"), &bad, r#"{"id": "c1", "messages": 5}"#).await;
    if parts.status != 400 || acao(&parts).as_deref() != Some(page) {
        failures.push(format!(
            "the adapter's 400 to {page}: {} ACAO {:?} {}",
            parts.status,
            acao(&parts),
            String::from_utf8_lossy(&body)
        ));
    }
    let no_stream_from = |origin: &str| {
        let (url, origin) = (setup.url("/api/chat/no-such-chat/stream"), origin.to_owned());
        async move { send("GET", &url, &[("origin", &origin)], Vec::new()).await.0 }
    };
    let parts = no_stream_from(page).await;
    if parts.status != 204 || acao(&parts).as_deref() != Some(page) {
        failures.push(format!(
            "the resume route's 204 to {page}: {} ACAO {:?}",
            parts.status,
            acao(&parts)
        ));
    }
    let parts = no_stream_from("http://127.0.0.1:2").await;
    if acao(&parts).is_some() {
        failures.push(format!(
            "an origin the backend does not allow got ACAO {:?}",
            acao(&parts)
        ));
    }
    assert!(failures.is_empty(), "{}\n{}", failures.join("\n"), setup.evidence());
}
