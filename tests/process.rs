//! The `sse-gateway` binary as a subprocess: drain on SIGTERM, bounded memory, config layering and exits,
//! `--check-config`, the `translate` command and the demo.

mod harness;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use harness::legacy::corpus;
use harness::prelude::*;
use harness::process::bin;
use http_body_util::BodyExt;
use sse_gateway::translate::{translate_all, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_an_open_stream_then_exits_0() {
    let mut events = Vec::new();
    for i in 0..8 {
        events.push(format!("data: <content-block-text>part {i}</content-block-text>\n\n"));
    }
    events.push("data: [DONE]\n\n".into());
    let whole: Vec<u8> = events.concat().into_bytes();
    let expected = translate_all(Options::default(), "drain", &whole).0;
    let up = Emulator::start(move |_| {
        let mut steps = vec![sse_head()];
        for e in &events {
            steps.push(Step::WriteAll(e.clone().into_bytes()));
            steps.push(Step::Pause(Duration::from_millis(150)));
        }
        steps.push(Step::EndChunks);
        steps
    })
    .await;
    let mut gw = Process::start(&["--upstream", &up.url()], &[]);
    let (mut body, mut got) = open_run(gw.addr, &[("x-agent-id", "drain")]).await;

    gw.signal("TERM");
    // Readiness turns false at once (the admin port stays up while draining) ...
    let mut ready = 200;
    for _ in 0..200 {
        ready = get(&format!("http://{}/readyz", gw.admin)).await.0.status.as_u16();
        if ready == 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(ready, 503, "readyz still ready after SIGTERM");
    // ... and no new connections are accepted.
    assert!(
        tokio::net::TcpStream::connect(gw.addr).await.is_err(),
        "still accepting"
    );
    // The open stream runs to its end.
    while let Some(frame) = tokio::time::timeout(PATIENCE, body.frame()).await.unwrap() {
        got.extend_from_slice(&frame.unwrap().into_data().unwrap_or_default());
    }
    assert_eq!(
        String::from_utf8_lossy(&without_ids(&got)),
        String::from_utf8_lossy(&expected)
    );
    let status = tokio::task::spawn_blocking(move || gw.wait()).await.unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "exit status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_memory_stays_bounded_and_backpressure_reaches_the_upstream() {
    slow_client(b"", (2, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_on_a_dedicated_connection_memory_stays_bounded_and_backpressure_reaches_the_upstream() {
    slow_client(b"Accept: text/event-stream\r\n", (1, 1)).await;
}

/// A client that sends its request (with `extra` header lines) and then reads nothing, while the upstream
/// floods 100 MB: the gateway's RSS must stay bounded and the upstream must be held back. With the warm-up
/// request, `(pooled, dedicated)` requests went upstream.
async fn slow_client(extra: &[u8], (pooled, dedicated): (usize, usize)) {
    const TOTAL: u64 = 100 * 1024 * 1024;
    let up = Emulator::start(|r| {
        if r.target == "/warm" {
            return vec![
                sse_head(),
                Step::WriteAll(b"data: [DONE]\n\n".to_vec()),
                Step::EndChunks,
            ];
        }
        vec![
            sse_head(),
            Step::WriteAll(b"data: <content-block-text>\n\n".to_vec()),
            Step::Flood { total: TOTAL },
            Step::EndChunks,
        ]
    })
    .await;
    let gw = Process::start(&["--upstream", &up.url()], &[]);
    let _ = send("POST", &format!("http://{}/warm", gw.addr), &[], "{}").await;
    let before = gw.rss_kib();
    // A client that sends its request and then reads nothing.
    let request = [
        &b"POST /agent/run HTTP/1.1\r\nHost: x\r\n"[..],
        extra,
        b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    ]
    .concat();
    let _client = raw(gw.addr, &request).await;
    // Wait until the upstream cannot write any more (backpressure) or has sent everything.
    let deadline = Instant::now() + PATIENCE;
    let mut last = 0;
    let mut still_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = up.flooded.load(Ordering::Relaxed);
        if now != last {
            last = now;
            still_since = Instant::now();
        } else if now > 0 && still_since.elapsed() > Duration::from_millis(700) {
            break;
        }
        if now >= TOTAL || Instant::now() > deadline {
            break;
        }
    }
    let after = gw.rss_kib();
    let growth_mib = after.saturating_sub(before) as f64 / 1024.0;
    println!(
        "RSS before {before} KiB, after {after} KiB, growth {growth_mib:.1} MiB; upstream wrote {:.1} MiB",
        last as f64 / 1048576.0
    );
    assert!(growth_mib < 32.0, "gateway RSS grew {growth_mib:.1} MiB");
    assert!(
        last < TOTAL,
        "no backpressure: the upstream wrote all {TOTAL} bytes to a client reading nothing"
    );
    let (_, m) = get(&format!("http://{}/metrics", gw.admin)).await;
    assert_upstream_connections(&String::from_utf8_lossy(&m), pooled, dedicated);
}

/// The binary with `before`, then `file`, then `after` as its arguments.
fn on_file(before: &[&str], file: &std::path::Path, after: &[&str]) -> Command {
    let mut c = bin();
    c.args(before).arg(file).args(after);
    c
}

/// Runs `c`, asserts that it exits 0 (showing its stderr when not) and returns its stdout.
fn succeeds(c: &mut Command) -> Vec<u8> {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

#[test]
fn config_layers_file_then_env_then_flags() {
    let dir = std::env::temp_dir().join(format!("sse-gw-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("gw.toml");
    std::fs::write(
        &file,
        "[server]\nlisten = \"127.0.0.1:7001\"\ndrain_timeout_secs = 5\n[translate]\nbudget = 4096\nshadow = true\n",
    )
    .unwrap();
    let stdout = succeeds(
        on_file(&["--config"], &file, &["--check-config", "--listen", "127.0.0.1:7003"])
            .env("SSE_GATEWAY__TRANSLATE__BUDGET", "3000")
            .env("SSE_GATEWAY__SERVER__LISTEN", "127.0.0.1:7002")
            .env("SSE_GATEWAY__UPSTREAM__URL", "http://127.0.0.1:9999/api"),
    );
    let text = String::from_utf8(stdout).unwrap();
    let v: toml::Value = toml::from_str(&text).expect("--check-config prints TOML");
    assert_eq!(v["server"]["listen"].as_str(), Some("127.0.0.1:7003"), "flag wins");
    assert_eq!(v["server"]["drain_timeout_secs"].as_float(), Some(5.0), "file value");
    assert_eq!(v["translate"]["budget"].as_integer(), Some(3000), "env beats file");
    assert_eq!(v["translate"]["shadow"].as_bool(), Some(true), "file value");
    assert_eq!(v["upstream"]["url"].as_str(), Some("http://127.0.0.1:9999/api"));
    assert_eq!(
        v["server"]["admin_listen"].as_str(),
        Some("127.0.0.1:9090"),
        "built-in default"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_config_prints_every_key_of_the_committed_defaults() {
    let out = bin().arg("--check-config").output().unwrap();
    assert!(out.status.success());
    let printed: toml::Value = toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    // Every key in config/default.toml is documented there, commented out with its default.
    let committed = std::fs::read_to_string("config/default.toml").unwrap();
    let uncommented: String = committed
        .lines()
        .map(|l| l.strip_prefix("# ").filter(|r| r.contains(" = ")).unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect();
    let documented: toml::Value = toml::from_str(&uncommented).expect("defaults file parses uncommented");
    assert_eq!(
        printed, documented,
        "config/default.toml and the built-in defaults disagree"
    );
}

#[test]
fn bad_config_exits_2_with_one_line_naming_the_key() {
    // Hold the port: a gateway that bound before validating would fail differently (exit 1).
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    for (env, key) in [
        (("SSE_GATEWAY__TRANSLATE__BUDGET", "12"), "translate.budget"),
        (("SSE_GATEWAY__TRANSLATE__BUDGET", "lots"), "translate.budget"),
        (("SSE_GATEWAY__TRANSLATE__DIALECT", "html"), "translate.dialect"),
        (("SSE_GATEWAY__TRANSLATE__NO_SUCH_KEY", "1"), "translate.no_such_key"),
        (("SSE_GATEWAY__UPSTREAM__URL", "ftp://x"), "upstream.url"),
        (("SSE_GATEWAY__SERVER__ADMIN_LISTEN", "nowhere"), "server.admin_listen"),
        (
            ("SSE_GATEWAY__TRANSLATE__KEEPALIVE_INTERVAL_SECS", "-1"),
            "translate.keepalive_interval_secs",
        ),
    ] {
        let out = bin().args(["--listen", &addr]).env(env.0, env.1).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{env:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{env:?}: {err}");
        assert!(err.contains(key), "{env:?}: message does not name {key}: {err}");
    }
    let out = bin().args(["--config", "/nonexistent/gw.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    drop(held);
}

#[test]
fn translate_command_converts_a_file_or_stdin() {
    let sc = corpus().remove(1);
    let expected = translate_all(Options::default(), "offline", &sc.stream).0;
    let path = std::env::temp_dir().join(format!("sse-gw-translate-{}.sse", std::process::id()));
    std::fs::write(&path, &sc.stream).unwrap();
    let stdout = succeeds(&mut on_file(
        &["translate"],
        &path,
        &["--agent-id", "offline", "--dialect", "auto"],
    ));
    assert_eq!(String::from_utf8_lossy(&stdout), String::from_utf8_lossy(&expected));
    let mut child = bin()
        .args(["translate", "--agent-id", "offline", "--budget", "2048"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&sc.stream).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, expected);
    // Bad input is not an I/O error: error envelopes, exit 0.
    let mut child = bin()
        .args(["translate", "--dialect", "xml"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"data: <content-block-tool_result id=\"x\"><![CDATA[oops\n\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(envelopes(&out.stdout).iter().any(|e| e["type"] == "error"));
    // A missing file is.
    let out = bin().args(["translate", "/nonexistent/x.sse"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_mode_serves_a_translated_legacy_stream() {
    let gw = Process::start(&["--demo"], &[]);
    // The curl line follows the banner.
    let deadline = Instant::now() + PATIENCE;
    let printed = loop {
        let printed = gw.stdout_lines.lock().unwrap().join("\n");
        if printed.contains("curl -N -X POST") || Instant::now() > deadline {
            break printed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(printed.contains("curl -N -X POST"), "{printed}");
    let (parts, body) = send(
        "POST",
        &format!("http://{}/agent/run", gw.addr),
        &[("content-type", "application/json")],
        r#"{"query":"hello"}"#,
    )
    .await;
    assert_eq!(parts.status, 200);
    let envs = envelopes(&body);
    let kinds: std::collections::BTreeSet<String> = envs
        .iter()
        .filter_map(|e| e.get("type").and_then(|t| t.as_str()).map(str::to_owned))
        .collect();
    for k in [
        "meta_init",
        "thinking",
        "text",
        "citation",
        "tool_call",
        "server_tool_call",
        "tool_result",
        "server_tool_result",
        "meta_final",
    ] {
        assert!(kinds.contains(k), "demo stream lacks {k}: {kinds:?}");
    }
    assert!(!kinds.contains("error"), "demo stream translated with errors: {envs:?}");
    let agents: std::collections::BTreeSet<&str> = envs.iter().filter_map(|e| e.get("agent")?.as_str()).collect();
    assert_eq!(agents.len(), 2, "main agent and one subagent: {agents:?}");
    assert_eq!(envs.last().and_then(|e| e.as_str()), Some("[DONE]"));
}

/// One admin connection kept open (HTTP/1.1 keep-alive) and reused: it costs the gateway no new file descriptor
/// per request, so readiness can be read while the gateway has none left.
struct AdminConn(hyper::client::conn::http1::SendRequest<http_body_util::Empty<Bytes>>);

impl AdminConn {
    async fn open(addr: std::net::SocketAddr) -> AdminConn {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        AdminConn(sender)
    }

    /// Status and body of `GET path`.
    async fn get(&mut self, path: &str) -> (u16, String) {
        let fut = async {
            self.0.ready().await.unwrap();
            let req = http::Request::get(path)
                .header("host", "admin")
                .body(http_body_util::Empty::new())
                .unwrap();
            let resp = self.0.send_request(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        };
        tokio::time::timeout(PATIENCE, fut).await.expect("admin answer in time")
    }

    /// Polls `/readyz` until it answers `want`; returns the last status seen.
    async fn await_readyz(&mut self, want: u16) -> u16 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let status = self.get("/readyz").await.0;
            if status == want || Instant::now() > deadline {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Issue 13: a gateway out of file descriptors cannot take new connections, so a load balancer must stop sending
/// it any: `/readyz` turns 503 while accept fails with EMFILE, and 200 again once a connection is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_503_while_accept_runs_out_of_file_descriptors_and_200_after() {
    /// Far below what the test process may open, far above what the gateway needs to start (about a dozen).
    const FD_LIMIT: u32 = 64;
    let gw = Process::start_with_fd_limit(
        FD_LIMIT,
        &["--upstream", "http://127.0.0.1:1"],
        // Idle connections must stay open for the whole test, holding their descriptors.
        &[
            ("SSE_GATEWAY__SERVER__HEADER_READ_TIMEOUT_SECS", "600"),
            ("SSE_GATEWAY__SERVER__IDLE_TIMEOUT_SECS", "600"),
        ],
    );
    let mut admin = AdminConn::open(gw.admin).await;
    // The banner is printed just before serving starts.
    assert_eq!(admin.await_readyz(200).await, 200, "ready after start");

    // Idle connections until the gateway has no descriptor left: the connects still succeed (the kernel's
    // backlog completes them), the gateway's accepts fail. It cannot accept more than FD_LIMIT, so a few dozen
    // more are sure to wait in the backlog, and few enough to fit there (a connect past a full backlog hangs).
    let mut held = Vec::new();
    let mut status = 200;
    while held.len() < FD_LIMIT as usize + 32 {
        for _ in 0..8 {
            held.push(tokio::net::TcpStream::connect(gw.addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        status = admin.get("/readyz").await.0;
        if status == 503 {
            break;
        }
    }
    if status != 503 {
        status = admin.await_readyz(503).await;
    }
    assert_eq!(status, 503, "/readyz still 200 with {} connections open", held.len());
    let (_, metrics) = admin.get("/metrics").await;
    assert!(
        metric(&metrics, "sse_gateway_ready", &[]) == 0.0,
        "ready gauge still 1:\n{metrics}"
    );
    assert!(
        metric(&metrics, "sse_gateway_accept_errors_total", &["kind=\"emfile\""]) >= 1.0,
        "accept errors not counted:\n{metrics}"
    );

    // Descriptors free again: the next accept succeeds and readiness returns.
    drop(held);
    assert_eq!(
        admin.await_readyz(200).await,
        200,
        "/readyz not 200 again after the connections closed"
    );
    let (_, metrics) = admin.get("/metrics").await;
    assert_eq!(metric(&metrics, "sse_gateway_ready", &[]), 1.0);
}

/// Issue 13: a translated stream still open at the drain deadline ends with an `error` envelope
/// (`gateway_draining`, so the client knows to reconnect) and a complete chunked body, not a cut connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translated_stream_cut_at_the_drain_deadline_ends_with_a_gateway_draining_envelope() {
    let (_up, mut gw) = stuck_run_with_a_short_drain().await;
    let agent = ("x-agent-id", "cut-agent");
    let (mut translated, mut got) = open_run(gw.addr, &[agent, ("x-stream-format", "json")]).await;
    let (mut legacy, _) = open_run(gw.addr, &[agent, ("x-stream-format", "legacy")]).await;

    gw.signal("TERM");
    let clean_end = read_rest(&mut translated, &mut got).await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(clean_end, "the translated response was cut, not ended: {text}");
    let last = sse_data(&got).pop().unwrap_or_default();
    assert!(
        last.starts_with(
            r#"{"type":"error","agent":"cut-agent","final":true,"delta":"{\"type\":\"gateway_draining\",\"message\":\""#
        ),
        "last event is not the gateway_draining envelope: {text}"
    );
    let envelope: serde_json::Value = serde_json::from_str(&last).unwrap();
    let delta: serde_json::Value = serde_json::from_str(envelope["delta"].as_str().unwrap()).unwrap();
    assert_eq!(delta["type"], "gateway_draining");
    assert!(delta["message"].as_str().is_some_and(|m| !m.is_empty()));

    // A pass-through stream cannot say so in-band: it is cut, and sees no envelope.
    let mut rest = Vec::new();
    let legacy_end = loop {
        match tokio::time::timeout(PATIENCE, legacy.frame()).await.unwrap() {
            Some(Ok(f)) => rest.extend_from_slice(&f.into_data().unwrap_or_default()),
            Some(Err(_)) => break "cut",
            None => break "ended",
        }
    };
    assert_eq!(
        legacy_end,
        "cut",
        "pass-through stream: {}",
        String::from_utf8_lossy(&rest)
    );
    assert!(!String::from_utf8_lossy(&rest).contains("gateway_draining"));

    let status = tokio::task::spawn_blocking(move || gw.wait()).await.unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "exit status");
}

/// A load balancer restart sends every resumable stream's reconnect at once: the public listener queues far more
/// than std's 128 (overflowing clients wait out a one-second SYN retransmission). Read from `ss`, whose `Send-Q`
/// of a listening socket is its backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_public_listener_queues_a_reconnect_storm() {
    let Ok(ss) = Command::new("ss").arg("-V").output() else {
        assert!(std::env::var_os("CI").is_none(), "ss (iproute2) is missing");
        eprintln!("skipped: ss (iproute2) is not installed");
        return;
    };
    assert!(ss.status.success());
    let up = Emulator::sse(Vec::new()).await;
    let gw = Process::against(&up.url(), &[]);
    let port = gw.addr.port().to_string();
    let out = Command::new("ss")
        .args(["-ltnH", "sport", "=", &format!(":{port}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let backlog: u32 = text
        .split_whitespace()
        .nth(2)
        .and_then(|q| q.parse().ok())
        .unwrap_or_else(|| panic!("no listening socket on :{port} in {text:?}"));
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096);
    assert_eq!(backlog, 4096.min(somaxconn), "listen backlog");
}
