//! Issue 28, the WebSocket output (docs/WEBSOCKET.md) read by clients no one here wrote: npm `ws` (driven by
//! tests/external/node/ws-client.mjs), PyPI `websockets` (tests/external/python/ws_client.py), both printing one JSON
//! line per thing that happened; and headless Chromium's own `WebSocket` in a page written as seed 004 writes its UI
//! (tests/external/browser/seed004.html, subprotocol `agent-sdk.v1`).
//!
//! Each client: reads a live stream whole (the envelopes byte for byte as the run's SSE reader got them, ids in
//! order) and the normal close 1000, after a cut resumes with `?last_event_id=` losing and repeating nothing;
//! cancels a run with `{"type":"cancel"}` (4002, the upstream sees its connection closed); is refused 403 before the
//! upgrade from another site's `Origin` and let through from an allowed one; reads a stream bound to
//! `Authorization` with the `sse-gateway.auth` credential message.
//!
//! Installed by `.ci/external-clients.sh`; a missing client skips its part with a note, except under `CI=true`.

mod harness;

use std::process::Command;
use std::time::Duration;

use harness::browser::{available_or_skip, chromium_or_skip, npm_package_installed};
use harness::pages::{await_report, static_answer};
use harness::prelude::*;
use harness::ws::{id_gaps, run_answer, socket_events, sse_events, start_run, token_of, Got};
use serde_json::{json, Value};

/// Bound on any single wait of these tests: reaching it is a failure.
const WAIT: Duration = Duration::from_secs(15);
const APP: &str = "http://127.0.0.1:5173";
const EVIL: &str = "http://evil.test";

/// One Chromium at a time, and one client process at a time: the machine has two cores.
static ONE_CLIENT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Debug, Clone, Copy)]
enum Ext {
    /// npm `ws` under node.
    NodeWs,
    /// PyPI `websockets` under python3.
    PythonWebsockets,
}

const CLIENTS: [Ext; 2] = [Ext::NodeWs, Ext::PythonWebsockets];

impl Ext {
    fn name(self) -> &'static str {
        match self {
            Ext::NodeWs => "npm ws",
            Ext::PythonWebsockets => "PyPI websockets",
        }
    }

    /// Whether the client is installed (else: skipped with a note, or a failure under CI).
    fn available(self) -> bool {
        let installed = match self {
            Ext::NodeWs => {
                Command::new("node")
                    .arg("--version")
                    .output()
                    .is_ok_and(|o| o.status.success())
                    && npm_package_installed("ws")
            }
            Ext::PythonWebsockets => Command::new("python3")
                .args(["-c", "import websockets.asyncio.client"])
                .output()
                .is_ok_and(|o| o.status.success()),
        };
        available_or_skip(self.name(), installed, "run .ci/external-clients.sh")
    }

    /// Runs the client on `url` with its options (see ws-client.mjs); returns the lines it printed.
    async fn run(self, url: &str, opts: Value) -> Vec<Value> {
        let mut cmd = match self {
            Ext::NodeWs => {
                let mut c = Command::new("node");
                c.arg("tests/external/node/ws-client.mjs");
                c
            }
            Ext::PythonWebsockets => {
                let mut c = Command::new("python3");
                c.arg("tests/external/python/ws_client.py");
                c
            }
        };
        cmd.arg(url).env("WS_OPTS", opts.to_string());
        let what = self.name();
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("client task")
            .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
        assert!(
            out.status.success(),
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what} printed {l:?}: {e}")))
            .collect()
    }
}

/// What a client printed, as a [`Got`]; and whether it cut the connection itself.
fn got_of(lines: &[Value]) -> (Got, bool) {
    let mut got = Got::default();
    let mut cut = false;
    for l in lines {
        match l["event"].as_str() {
            Some("message") => got.take_text(l["data"].as_str().expect("a text message")),
            Some("close") => got.close = l["code"].as_u64().and_then(|c| u16::try_from(c).ok()),
            Some("cut") => cut = true,
            Some("timeout") => got.timed_out = true,
            Some("refused") => got.dropped = Some(format!("refused {}", l["status"])),
            _ => {}
        }
    }
    (got, cut)
}

async fn upstream() -> Emulator {
    Emulator::start(|r| {
        let path = r.target.split('?').next().unwrap_or("");
        if path == "/report" {
            return vec![Step::head(204, &[], false)];
        }
        run_answer(r).unwrap_or_else(|| static_answer(path))
    })
    .await
}

fn ws_url(gw: &TestGateway, path: &str) -> String {
    format!("ws://{}{path}", gw.addr)
}

/// Asserts the socket got what the run's SSE reader got: the same ids in order from 1 and the same envelopes.
fn assert_same_stream(got: &Got, sse: &[(String, String)], token: &str, what: &str) {
    let ws = socket_events(got);
    assert!(!sse.is_empty(), "{what}: the SSE reader got nothing");
    let at = ws.iter().zip(sse).position(|(a, b)| a != b);
    assert!(
        ws.len() == sse.len() && at.is_none(),
        "{what}: {} events, the SSE reader {}; first difference at {at:?} ({})",
        ws.len(),
        sse.len(),
        got.ending()
    );
    assert_eq!(id_gaps(&got.ids(), token, 1), None, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_clients_read_a_stream_whole_and_resume_after_a_cut() {
    let _one = ONE_CLIENT.lock().await;
    let up = upstream().await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    for client in CLIENTS.into_iter().filter(|c| c.available()) {
        let what = client.name();
        // Whole.
        let (mut sse, url) = start_run(gw.addr, "/run/30", &[]).await;
        let (got, _) = got_of(&client.run(&ws_url(&gw, &url), json!({})).await);
        sse.read_to_end(WAIT).await.expect("the SSE reader's end");
        assert_eq!(got.close, Some(1000), "{what}: {}", got.ending());
        assert_same_stream(&got, &sse_events(&sse.body), token_of(&url), what);

        // Cut after a few messages, then resumed after the last id it got.
        let (mut sse, url) = start_run(gw.addr, "/run/150", &[]).await;
        let (before, cut) = got_of(&client.run(&ws_url(&gw, &url), json!({"cutAfter": 4})).await);
        assert!(cut && before.close.is_none(), "{what}: not cut: {}", before.ending());
        let last = before.last_id().expect("an id before the cut");
        let resumed = format!("{url}?last_event_id={last}");
        let (after, _) = got_of(&client.run(&ws_url(&gw, &resumed), json!({})).await);
        sse.read_to_end(WAIT).await.expect("the SSE reader's end");
        assert_eq!(after.close, Some(1000), "{what}: {}", after.ending());
        let joined = Got {
            msgs: before.msgs.into_iter().chain(after.msgs).collect(),
            ..Got::default()
        };
        assert_same_stream(
            &joined,
            &sse_events(&sse.body),
            token_of(&url),
            &format!("{what}, cut and resumed"),
        );
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_clients_cancel_a_run_4002_and_the_upstream_is_closed() {
    let _one = ONE_CLIENT.lock().await;
    let mut up = upstream().await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    for client in CLIENTS.into_iter().filter(|c| c.available()) {
        let what = client.name();
        let (mut sse, url) = start_run(gw.addr, "/hold", &[]).await;
        let opts = json!({"sendAfter": [{"after": 1, "data": "{\"type\":\"cancel\"}"}]});
        let (got, _) = got_of(&client.run(&ws_url(&gw, &url), opts).await);
        assert_eq!(got.close, Some(4002), "{what}: {}", got.ending());
        assert!(
            matches!(tokio::time::timeout(WAIT, up.closed.recv()).await, Ok(Some(_))),
            "{what}: the upstream did not see its connection closed"
        );
        sse.read_to_end(WAIT).await.expect("the SSE reader's end");
        assert!(
            String::from_utf8_lossy(&sse.body).contains("stream_cancelled"),
            "{what}"
        );
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_clients_are_refused_from_another_site_and_let_through_from_an_allowed_origin() {
    let _one = ONE_CLIENT.lock().await;
    let up = upstream().await;
    let gw = TestGateway::start(&up.url(), |s| s.websocket.allow_origins = vec![APP.into()]).await;
    for client in CLIENTS.into_iter().filter(|c| c.available()) {
        let what = client.name();
        let (mut sse, url) = start_run(gw.addr, "/run/10", &[]).await;
        let lines = client.run(&ws_url(&gw, &url), json!({"origin": EVIL})).await;
        let refused: Vec<&Value> = lines.iter().filter(|l| l["event"] == "refused").collect();
        assert!(
            refused.len() == 1
                && refused[0]["status"] == 403
                && refused[0]["body"]
                    .as_str()
                    .is_some_and(|b| b.contains("origin_refused"))
                && !lines.iter().any(|l| l["event"] == "open"),
            "{what} from {EVIL}: {lines:?}"
        );
        let (got, _) = got_of(&client.run(&ws_url(&gw, &url), json!({"origin": APP})).await);
        sse.read_to_end(WAIT).await.expect("the SSE reader's end");
        assert_eq!(got.close, Some(1000), "{what} from {APP}: {}", got.ending());
        assert_same_stream(&got, &sse_events(&sse.body), token_of(&url), what);
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn third_party_clients_read_a_stream_bound_to_authorization_with_the_auth_message() {
    const AUTH: &str = "Bearer user-1";
    let _one = ONE_CLIENT.lock().await;
    let up = upstream().await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    for client in CLIENTS.into_iter().filter(|c| c.available()) {
        let what = client.name();
        let (mut sse, url) = start_run(gw.addr, "/run/10", &[("Authorization", AUTH)]).await;
        let opts = json!({
            "protocols": ["sse-gateway.v1", "sse-gateway.auth"],
            "sendOnOpen": [json!({"type": "auth", "authorization": AUTH}).to_string()],
        });
        let lines = client.run(&ws_url(&gw, &url), opts).await;
        let opened = lines.iter().find(|l| l["event"] == "open").cloned();
        assert_eq!(
            opened.map(|o| o["protocol"].clone()),
            Some(json!("sse-gateway.v1")),
            "{what}: {lines:?}"
        );
        let (got, _) = got_of(&lines);
        sse.read_to_end(WAIT).await.expect("the SSE reader's end");
        assert_eq!(got.close, Some(1000), "{what}: {}", got.ending());
        assert_same_stream(&got, &sse_events(&sse.body), token_of(&url), what);
    }
    gw.stop().await;
}

/// A free port on 127.0.0.1 (bound and released: the page's origin must be known before the gateway starts).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_shows_a_run_in_a_seed_004_ui_over_agent_sdk_v1() {
    let Some(chromium) = chromium_or_skip() else { return };
    let _one = ONE_CLIENT.lock().await;
    let up = upstream().await;
    let port = free_port();
    // The page is served through the gateway, and opens its socket there: the operator lists that origin.
    let origin = format!("http://127.0.0.1:{port}");
    let allowed = origin.clone();
    let gw = TestGateway::start(&up.url(), move |s| {
        s.server.listen = format!("127.0.0.1:{port}");
        s.websocket.allow_origins = vec![allowed];
    })
    .await;
    let page = format!("{origin}/app/seed004.html?timeout_ms=15000");
    let report = await_report(&chromium, &page, &up, WAIT, "the seed-004 page").await;

    let shown = &report["shown"];
    let msgs: Vec<Value> = report["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| serde_json::from_str(e["data"].as_str().unwrap_or("null")).unwrap_or(Value::Null))
        .collect();
    let types: Vec<&str> = msgs.iter().map(|m| m["type"].as_str().unwrap_or("?")).collect();
    let context = format!("report {report:#}");
    assert_eq!(report["done"], json!(true), "{context}");
    assert_eq!(report["protocol"], "agent-sdk.v1", "{context}");
    assert_eq!(report["close"]["code"], 1000, "{context}");
    assert_eq!(
        shown["output"], "Let me search for that.Found three answers.",
        "{context}"
    );
    assert_eq!(shown["status"], "complete: end_turn", "{context}");
    assert_eq!(
        shown["tools"],
        json!([
            "tool_use toolu_1 search {\"q\":\"rust websockets\"}",
            "tool_result toolu_1 3 results found"
        ]),
        "{context}"
    );
    // The seed's order: the text as it streams, the tool's use then result, more text, the end last.
    let first_tool = types.iter().position(|t| *t == "agent:tool_use");
    let result = types.iter().position(|t| *t == "agent:tool_result");
    assert!(
        first_tool.is_some() && first_tool < result && types.last() == Some(&"agent:complete"),
        "{types:?}"
    );
    // Every message is the seed's `{type, payload, timestamp, sessionId}`, sessionId the stream's token.
    let stream = report["opens"][0]["stream"].as_str().unwrap_or("");
    for m in &msgs {
        assert!(
            m["payload"].is_object() && m["timestamp"].is_u64() && m["sessionId"].as_str() == Some(token_of(stream)),
            "{m} (stream {stream})"
        );
    }
    assert!(report["errors"].as_array().is_some_and(Vec::is_empty), "{context}");
    gw.stop().await;
}
