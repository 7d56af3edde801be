//! Third-party SSE clients (npm `eventsource-parser` under node, Python `httpx-sse`) read the gateway's
//! translated stream and must see the same envelopes we expect. Installed by `.ci/external-clients.sh`; when
//! CI=true a missing client is a failure, elsewhere the check is skipped with a note.

mod harness;

use std::process::Command;

use harness::legacy::{assert_blocks, blocks, corpus};
use harness::prelude::*;
use sse_gateway::translate::{translate_all, Options};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// Runs `cmd` (which prints one data payload per line) or reports why it cannot run.
fn run_client(what: &str, available: bool, mut cmd: Command) -> Option<Vec<String>> {
    if !available {
        assert!(!in_ci(), "{what} is not installed (run .ci/external-clients.sh)");
        eprintln!("skipping {what}: not installed (run .ci/external-clients.sh)");
        return None;
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        String::from_utf8(out.stdout)
            .expect("utf-8")
            .lines()
            .map(str::to_owned)
            .collect(),
    )
}

fn node_available() -> bool {
    Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
        && std::path::Path::new("tests/external/node/node_modules/eventsource-parser/package.json").exists()
}

fn python_available() -> bool {
    Command::new("python3")
        .args(["-c", "import httpx, httpx_sse"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventsource_parser_and_httpx_sse_see_the_expected_envelopes() {
    let sc = corpus().remove(1);
    let stream = sc.stream.clone();
    let up = Emulator::start(move |_| vec![sse_head(), Step::Write(stream.clone()), Step::EndChunks]).await;
    let gw = TestGateway::start(&up.url(), |s| s.translate.agent_header = "x-agent-id".into()).await;
    let url = gw.url("/agent/run");
    let expected: Vec<String> = sse_data(&translate_all(Options::default(), "unused", &sc.stream).0);
    assert!(!expected.is_empty());

    let mut node = Command::new("node");
    node.args(["tests/external/node/client.mjs", &url]);
    let mut python = Command::new("python3");
    python.args(["tests/external/python/client.py", &url]);
    let clients = [
        ("node eventsource-parser", node_available(), node),
        ("python httpx-sse", python_available(), python),
    ];
    for (what, available, cmd) in clients {
        let Some(lines) = tokio::task::spawn_blocking(move || run_client(what, available, cmd))
            .await
            .unwrap()
        else {
            continue;
        };
        // The fallback agent is a fresh UUID per request, but the scenario names its agents in meta_init.
        assert_eq!(lines, expected, "{what} saw different events");
        let envs: Vec<serde_json::Value> = lines
            .iter()
            .map(|l| {
                if l == "[DONE]" {
                    l.clone().into()
                } else {
                    serde_json::from_str(l).expect("JSON")
                }
            })
            .collect();
        assert_blocks(&blocks(&envs), &sc.expected);
    }
    gw.stop().await;
}
