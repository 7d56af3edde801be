//! The frontends at the edge, without a real client (issue 35): the `[[frontend]]` routes refused at start with the
//! key named (an unknown protocol, overlapping paths, a path under the resumption prefix); a request body over the
//! adapter's bound or one it cannot map answered 400, counted, never forwarded; `X-Stream-Format: ai-sdk | ag-ui`
//! encoding the response of a request that keeps its legacy body.

mod harness;

use harness::prelude::*;
use harness::process::bin;
use serde_json::Value;

/// Runs `--check-config` with `config` as the config file: exit status and stderr.
fn check(config: &str) -> (Option<i32>, String) {
    let path = std::env::temp_dir().join(format!(
        "sse-gw-frontends-edge-{}-{}.toml",
        std::process::id(),
        config.len()
    ));
    std::fs::write(&path, config).expect("config");
    let out = bin()
        .args(["--config", path.to_str().expect("path"), "--check-config"])
        .output()
        .expect("run the gateway");
    let _ = std::fs::remove_file(&path);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn route(path: &str, protocol: &str) -> String {
    format!("[[frontend]]\npath = \"{path}\"\nprotocol = \"{protocol}\"\nrun = \"/agent/run\"\ntool_results = \"/agent/tool_results\"\n")
}

#[test]
fn bad_frontend_routes_are_refused_at_start_naming_the_key() {
    let cases = [
        (route("/api/chat", "vercel"), "frontend.protocol"),
        (route("api/chat", "ai-sdk"), "frontend.path"),
        (
            route("/api/chat", "ai-sdk") + &route("/api/chat/x", "ag-ui"),
            "frontend.path",
        ),
        (
            route("/api/chat", "ai-sdk") + &route("/api/chat", "ag-ui"),
            "frontend.path",
        ),
        (route("/_gateway/streams/chat", "ai-sdk"), "frontend.path"),
        (
            route("/api/chat", "ai-sdk").replace("/agent/run", "agent run"),
            "frontend.run",
        ),
        (route("/api/chat", "ai-sdk") + "colour = \"red\"\n", "colour"),
    ];
    for (config, key) in cases {
        let (code, err) = check(&config);
        assert_eq!(code, Some(2), "{config}\n{err}");
        assert!(err.contains(key), "{config}: the message names {key}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
    let (code, err) = check(&(route("/api/chat", "ai-sdk") + &route("/agui", "ag-ui")));
    assert_eq!(code, Some(0), "{err}");
}

/// A legacy run: meta_init, a text block, meta_final, [DONE].
fn legacy_run() -> Vec<Step> {
    let init = "{&quot;format&quot;: &quot;xml&quot;, &quot;user_query&quot;: &quot;q&quot;, &quot;agent_uuid&quot;: &quot;agent-1&quot;, &quot;parent_agent_uuid&quot;: null}";
    let events = [
        format!("<meta_init data=\"{init}\"></meta_init>"),
        "<content-block-text>".to_owned(),
        "Hello".to_owned(),
        "</content-block-text>".to_owned(),
        "<meta_final data=\"{}\"></meta_final>".to_owned(),
        "[DONE]".to_owned(),
    ];
    let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    vec![sse_head(), Step::Write(body.into_bytes()), Step::EndChunks]
}

fn chunks(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("a JSON chunk"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_stream_format_encodes_a_legacy_requests_response_for_either_frontend() {
    let up = Emulator::start(|_| legacy_run()).await;
    let gw = Process::against(&up.url(), &[]);
    let url = format!("http://{}/agent/run", gw.addr);
    for (format, first, text_type) in [
        ("ai-sdk", "start", "text-delta"),
        ("ag-ui", "RUN_STARTED", "TEXT_MESSAGE_CONTENT"),
    ] {
        let (parts, body) = send("POST", &url, &[("x-stream-format", format)], "{\"user_prompt\": \"q\"}").await;
        assert_eq!(parts.status, 200);
        let h = |n: &str| parts.headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
        assert_eq!(h("x-stream-format").as_deref(), Some(format));
        assert_eq!(h("content-type").as_deref(), Some("text/event-stream"));
        let cs = chunks(&body);
        assert_eq!(cs[0]["type"], first, "{format}: {cs:#?}");
        let text: String = cs
            .iter()
            .filter(|c| c["type"] == text_type)
            .map(|c| c["delta"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(text, "Hello", "{format}");
        let sent = up
            .recorded()
            .last()
            .map(|r| String::from_utf8_lossy(&r.body).into_owned());
        assert_eq!(
            sent.as_deref(),
            Some("{\"user_prompt\": \"q\"}"),
            "the request body as it was"
        );
        let forwarded = up
            .recorded()
            .last()
            .and_then(|r| r.header("x-stream-format").map(str::to_owned));
        assert_eq!(forwarded, None, "X-Stream-Format is the gateway's, not the backend's");
    }
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "sse_gateway_frontend_requests_total", &["outcome=\"encoded\""]),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_bound_or_not_mappable_is_400_counted_and_never_forwarded() {
    let up = Emulator::start(|_| legacy_run()).await;
    let config = std::env::temp_dir().join(format!("sse-gw-frontends-edge-{}.toml", std::process::id()));
    std::fs::write(&config, route("/api/chat", "ai-sdk")).expect("config");
    let gw = Process::start(
        &["--config", config.to_str().expect("path"), "--upstream", &up.url()],
        &[],
    );
    let url = format!("http://{}/api/chat", gw.addr);
    let json = [("content-type", "application/json")];
    // A turn the adapter would map, but over the bound: refused for its size alone (no field named).
    let text = "x".repeat(5 << 20);
    let huge = format!(
        "{{\"id\": \"c\", \"messages\": [{{\"id\": \"u\", \"role\": \"user\", \"parts\": [{{\"type\": \"text\", \"text\": \"{text}\"}}]}}]}}"
    );
    let (parts, body) = send("POST", &url, &json, huge).await;
    assert_eq!(parts.status, 400, "a body over 4 MiB");
    let answer: Value = serde_json::from_slice(&body).expect("a JSON answer");
    assert!(
        answer.get("field").is_none(),
        "refused for its size, not mapped: {answer}"
    );
    let (parts, body) = send("POST", &url, &json, "{\"id\": \"c\", \"messages\": 3}").await;
    assert_eq!(parts.status, 400);
    let answer: Value = serde_json::from_slice(&body).expect("a JSON answer");
    assert_eq!(answer["field"], "messages", "{answer}");
    assert_eq!(answer["error"], "bad_request_body");
    assert!(up.recorded().is_empty(), "nothing reached the backend");
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "sse_gateway_frontend_requests_total", &["outcome=\"bad_body\""]),
        1.0
    );
    let _ = std::fs::remove_file(&config);
}

/// What drain gives the envelope stream it gives the frontends' streams: a stream open at the drain deadline ends
/// with the gateway's `gateway_draining` error as the protocol ends a failed run (AI SDK: `error`, then `[DONE]`;
/// AG-UI: `RUN_ERROR`), and a complete body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frontend_stream_open_at_the_drain_deadline_ends_as_the_protocol_ends_a_failed_run() {
    for format in ["ai-sdk", "ag-ui"] {
        let (_up, mut gw) = stuck_run_with_a_short_drain().await;
        // The first chunks come before the drain starts.
        let (mut body, mut got) = open_run(gw.addr, &[("x-stream-format", format)]).await;
        gw.signal("TERM");
        let clean = read_rest(&mut body, &mut got).await;
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(clean, "{format}: cut, not ended: {text}");
        let cs = chunks(&got);
        let last = cs.last().expect("chunks");
        match format {
            "ai-sdk" => {
                assert_eq!(last["type"], "error", "{text}");
                assert!(
                    last["errorText"]
                        .as_str()
                        .is_some_and(|t| t.contains("gateway_draining")),
                    "{text}"
                );
                assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            }
            _ => {
                assert_eq!(last["type"], "RUN_ERROR", "{text}");
                assert_eq!(last["code"], "gateway_draining", "{text}");
            }
        }
        let status = tokio::task::spawn_blocking(move || gw.wait()).await.expect("join");
        assert_eq!(status.and_then(|s| s.code()), Some(0), "exit status");
    }
}
