//! Issue 13 ("Hardening"), the edge and configuration items: client-supplied agent ids bounded, every
//! X-Forwarded-For line kept, forwarded headers stripped when untrusted, the client path confined under the
//! prefix, request ids of a safe charset, and configuration that fails closed (empty upstream, credentials,
//! self-pointing upstream, ceilings), checked through the gateway and through the real binary.

mod gateway_support;
use gateway_support as support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sse_gateway::envelope::ids;
use support::*;

/// A stream with no `meta_init` (a resumed run): every envelope carries the fallback agent.
fn resumed_run() -> Vec<Step> {
    vec![
        sse_head(),
        Step::WriteAll(b"data: <content-block-text>\n\n".to_vec()),
        Step::WriteAll(b"data: resumed\n\n".to_vec()),
        Step::WriteAll(b"data: </content-block-text>\n\n".to_vec()),
        Step::WriteAll(b"data: [DONE]\n\n".to_vec()),
        Step::EndChunks,
    ]
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sse-gateway"));
    c.env_remove("SSE_GATEWAY__UPSTREAM__URL").env_remove("RUST_LOG");
    c
}

/// Runs `sse-gateway ARGS --check-config` (with `env`); returns (exit code, stdout, stderr).
fn check_config(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut c = bin();
    c.args(args).arg("--check-config");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run sse-gateway --check-config");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts a configuration is refused the way every bad one is: exit 2, one line on stderr naming `key`.
#[allow(dead_code)]
fn assert_refused(args: &[&str], env: &[(&str, &str)], key: &str) -> String {
    let (code, _, err) = check_config(args, env);
    assert_eq!(code, Some(2), "{args:?} {env:?}: exit status (stderr: {err})");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?} {env:?}: {err}");
    assert!(
        err.contains(key),
        "{args:?} {env:?}: message does not name {key}: {err}"
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_agent_ids_that_are_too_long_or_unsafe_are_replaced_by_a_fresh_uuid_and_counted() {
    let up = Emulator::start(|_| resumed_run()).await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let huge = "a".repeat(60_000);
    let agents_of = |body: &[u8]| -> Vec<String> {
        let text = String::from_utf8_lossy(body);
        for line in text.lines() {
            let payload = line.strip_prefix("data: ").unwrap_or(line);
            assert!(payload.len() <= 2048, "a {}-byte line", line.len());
        }
        envelopes(body)
            .iter()
            .filter_map(|e| e.get("agent").and_then(|a| a.as_str()).map(str::to_owned))
            .collect()
    };
    let assert_fresh_uuid = |agents: &[String], what: &str| {
        assert!(!agents.is_empty(), "{what}: no envelopes");
        let first = uuid::Uuid::parse_str(&agents[0]).unwrap_or_else(|_| panic!("{what}: not a UUID: {}", agents[0]));
        assert_eq!(first.get_version_num(), 4, "{what}");
        assert!(agents.iter().all(|a| *a == agents[0]), "{what}: one agent per stream");
    };

    // A 60,000-byte header id, no body id.
    let (parts, body) = send("POST", &gw.url("/agent/run"), &[("x-agent-id", &huge)], "{}").await;
    assert_eq!(parts.status, 200);
    assert_fresh_uuid(&agents_of(&body), "long header");
    // A body id with a quote and a newline, and the long header: both refused.
    let (parts, body) = send(
        "POST",
        &gw.url("/agent/tool_results"),
        &[("content-type", "application/json"), ("x-agent-id", &huge)],
        r#"{"agent_uuid":"evil\",\n\"x","results":[]}"#,
    )
    .await;
    assert_eq!(parts.status, 200);
    assert_fresh_uuid(&agents_of(&body), "bad body and header");
    // A refused body id falls back to a valid header id.
    let (_, body) = send(
        "POST",
        &gw.url("/agent/tool_results"),
        &[("content-type", "application/json"), ("x-agent-id", "from-header")],
        format!(r#"{{"agent_uuid":"{}"}}"#, "b".repeat(ids::MAX_ID_BYTES + 1)),
    )
    .await;
    let agents = agents_of(&body);
    assert!(
        !agents.is_empty() && agents.iter().all(|a| a == "from-header"),
        "{agents:?}"
    );

    let m = gw.metrics().await;
    let rejected = |s: &str| {
        metric(
            &m,
            "sse_gateway_rejected_agent_ids_total",
            &[&format!("source=\"{s}\"")],
        )
    };
    assert_eq!(
        (rejected("header"), rejected("body")),
        (2.0, 2.0),
        "refusals counted by source"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_x_forwarded_for_line_reaches_the_upstream_in_order_and_untrusted_forwarded_headers_do_not() {
    let up = Emulator::start(|_| vec![Step::head(200, &[("Content-Length", "0")], false)]).await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    // What a client behind HAProxy's `option forwardfor` looks like: its own forged line, then HAProxy's.
    let (parts, _) = send(
        "GET",
        &gw.url("/x"),
        &[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.7"),
            ("forwarded", "for=6.6.6.6"),
            ("x-real-ip", "6.6.6.6"),
        ],
        "",
    )
    .await;
    assert_eq!(parts.status, 200);
    let rec = up.recorded().pop().expect("the request reached the upstream");
    let xff: Vec<&str> = rec
        .headers
        .iter()
        .filter(|(k, _)| k == "x-forwarded-for")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        xff,
        ["6.6.6.6, 203.0.113.7, 127.0.0.1"],
        "one line: every address in order, then the peer"
    );
    assert_eq!(rec.header("forwarded"), None, "Forwarded passed untrusted");
    assert_eq!(rec.header("x-real-ip"), None, "X-Real-IP passed untrusted");
    gw.stop().await;
}
