//! Issue 13 ("Hardening"), the edge and configuration items: client-supplied agent ids bounded, every
//! X-Forwarded-For line kept, forwarded headers stripped when untrusted, the client path confined under the
//! prefix, request ids of a safe charset, and configuration that fails closed (empty upstream, credentials,
//! self-pointing upstream, ceilings), checked through the gateway and through the real binary.

mod harness;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use harness::prelude::*;
use sse_gateway::envelope::ids;

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
    let mut c = harness::process::bin();
    c.env_remove("RUST_LOG");
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

/// A gateway process whose stdout and stderr are both collected; killed on drop.
struct Captured {
    child: std::process::Child,
    out: mpsc::Receiver<(bool, String)>,
    lines: Vec<(bool, String)>,
}

impl Captured {
    fn spawn(args: &[&str], env: &[(&str, &str)]) -> Captured {
        let mut c = bin();
        c.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("spawn sse-gateway");
        let (tx, out) = mpsc::channel();
        let pipe = |r: Box<dyn Read + Send>, is_err: bool, tx: mpsc::Sender<(bool, String)>| {
            std::thread::spawn(move || {
                for line in BufReader::new(r).lines().map_while(Result::ok) {
                    let _ = tx.send((is_err, line));
                }
            });
        };
        pipe(Box::new(child.stdout.take().expect("stdout")), false, tx.clone());
        pipe(Box::new(child.stderr.take().expect("stderr")), true, tx);
        Captured {
            child,
            out,
            lines: Vec::new(),
        }
    }

    /// Collects output until `done` holds for what was printed, or the process has exited and said all, or
    /// `PATIENCE` passes; returns (stdout, stderr) so far.
    fn until(&mut self, done: impl Fn(&str, &str) -> bool) -> (String, String) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let joined = |err: bool| {
                self.lines
                    .iter()
                    .filter(|(e, _)| *e == err)
                    .map(|(_, l)| format!("{l}\n"))
                    .collect::<String>()
            };
            let (o, e) = (joined(false), joined(true));
            if done(&o, &e) || Instant::now() > deadline {
                return (o, e);
            }
            match self.out.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => self.lines.push(line),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Both pipes closed: the process is gone and everything is read.
                Err(mpsc::RecvTimeoutError::Disconnected) => return (o, e),
            }
        }
    }

    /// Kills the process and returns everything it printed.
    fn stop(mut self) -> (String, String) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.until(|_, _| false)
    }
}

impl Drop for Captured {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts a configuration is refused the way every bad one is: exit 2, one line on stderr naming `key`.
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
    let (up, gw) = gateway_with(vec![Step::head(200, &[("Content-Length", "0")], false)], |_| {}).await;
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

#[test]
fn an_empty_upstream_is_a_config_error_not_the_demo() {
    assert_refused(&["--upstream", ""], &[], "upstream.url");
    assert_refused(&[], &[("SSE_GATEWAY__UPSTREAM__URL", "")], "upstream.url");
    // Not only under --check-config: the daemon itself stops before binding (a held port would make a
    // gateway that went on to start the demo fail differently, with exit 1).
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let out = bin()
        .args(["--upstream", "", "--listen", &addr, "--admin-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("upstream.url"));
    // An absent upstream is still the demo.
    let (code, printed, _) = check_config(&[], &[]);
    assert_eq!(code, Some(0));
    assert!(printed.contains("url = \"\""), "{printed}");
}

#[test]
fn credentials_in_the_upstream_url_are_refused_and_never_printed() {
    for url in ["http://user:s3cret@127.0.0.1:9", "http://s3cret@127.0.0.1:9/api"] {
        let err = assert_refused(&["--upstream", url], &[], "upstream.url");
        assert!(!err.contains("s3cret"), "the secret echoed: {err}");
        let (_, out, err) = check_config(&[], &[("SSE_GATEWAY__UPSTREAM__URL", url)]);
        assert!(!out.contains("s3cret") && !err.contains("s3cret"), "{out}{err}");
    }
}

#[test]
fn the_demo_binds_loopback_by_default_and_warns_that_it_is_the_demo() {
    // The public listener is left to its default; whether port 8080 is free on this machine or not, the address
    // the gateway chose is in its banner or in its bind error.
    let mut gw = Captured::spawn(&["--admin-listen", "127.0.0.1:0"], &[]);
    let (out, err) = gw.until(|o, e| o.contains("proxy listening on") || e.contains("cannot listen on"));
    let (out, err) = if out.contains("proxy listening on") {
        // Running: wait for the curl line that follows the banner, so the WARN line before it is in too.
        let _ = gw.until(|o, _| o.contains("curl -N"));
        gw.stop()
    } else {
        (out, err)
    };
    assert!(
        out.contains("proxy listening on http://127.0.0.1:8080") || err.contains("cannot listen on 127.0.0.1:8080"),
        "demo mode did not choose 127.0.0.1:8080:\n{out}{err}"
    );
    let warn = err
        .lines()
        .find(|l| l.contains("WARN") && l.contains("built-in demo backend"))
        .unwrap_or_else(|| panic!("no WARN line naming the built-in demo backend:\n{err}"));
    assert!(warn.contains("not a real upstream"), "{warn}");
}

/// The public address a gateway process printed in its banner.
fn public_addr(out: &str) -> std::net::SocketAddr {
    out.lines()
        .find(|l| l.contains("proxy listening on"))
        .and_then(|l| l.rsplit("http://").next()?.parse().ok())
        .unwrap_or_else(|| panic!("no banner: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_request_id_that_could_forge_log_fields_never_reaches_the_log() {
    let up = Emulator::start(|_| resumed_run()).await;
    let mut gw = Captured::spawn(
        &[
            "--upstream",
            &up.url(),
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[("RUST_LOG", "sse_gateway=debug")],
    );
    let (out, err) = gw.until(|o, _| o.contains("admin listening on"));
    let addr = public_addr(&format!("{out}{err}"));
    let forged = "x method=DELETE path=/admin\tid=forged";
    let mut conn = raw(
        addr,
        format!(
            "POST /agent/run HTTP/1.1\r\nHost: gw\r\nX-Request-Id: {forged}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
        )
        .as_bytes(),
    )
    .await;
    let resp = String::from_utf8_lossy(&read_to_eof(&mut conn).await.expect("response in time")).into_owned();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let echoed = resp
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap_or_else(|| panic!("no X-Request-Id in {resp}"));
    assert!(
        !echoed.is_empty() && echoed.bytes().all(|b| b.is_ascii_alphanumeric()),
        "replaced by a fresh id: {echoed:?}"
    );
    assert_eq!(
        up.recorded()[0].header("x-request-id"),
        Some(echoed),
        "the upstream gets the same id"
    );
    // The request's span shows up in the stream-end line; it must carry the fresh id, nothing forged.
    let (_, err) = gw.until(|_, e| e.contains(echoed) && e.contains("completed"));
    assert!(
        err.contains(&format!("id={echoed}")),
        "the span's id is the fresh one:\n{err}"
    );
    for fragment in ["method=DELETE", "path=/admin", "id=forged", "id=x "] {
        assert!(!err.contains(fragment), "forged field {fragment:?} in the log:\n{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_sees_the_client_path_normalized_under_the_prefix() {
    let up = Emulator::start(|_| vec![Step::head(200, &[("Content-Length", "0")], false)]).await;
    let gw = TestGateway::start(&format!("{}/api/v1", up.url()), |_| {}).await;
    for (request_line, want) in [
        ("GET /../../admin HTTP/1.1", "/api/v1/admin"),
        (
            "GET /a/%2e%2E/%2E./.%2e/admin?next=../x HTTP/1.1",
            "/api/v1/admin?next=../x",
        ),
        ("OPTIONS * HTTP/1.1", "/api/v1"),
    ] {
        let before = up.recorded().len();
        let mut conn = raw(
            gw.addr,
            format!("{request_line}\r\nHost: gw\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        let resp = read_to_eof(&mut conn).await.expect("response in time");
        assert!(
            resp.starts_with(b"HTTP/1.1 200"),
            "{request_line}: {}",
            String::from_utf8_lossy(&resp)
        );
        let rec = up.recorded();
        assert_eq!(rec.len(), before + 1, "{request_line}");
        assert_eq!(rec[before].target, want, "{request_line}");
    }
    gw.stop().await;
}

#[test]
fn self_pointing_upstreams_shared_listeners_and_values_past_their_ceiling_exit_2_naming_the_key() {
    // The upstream is the gateway itself: the public port (default 0.0.0.0:8080), the admin port, port 80.
    assert_refused(&["--upstream", "http://127.0.0.1:8080"], &[], "upstream.url");
    assert_refused(&["--upstream", "http://localhost:9090/api"], &[], "upstream.url");
    assert_refused(
        &["--upstream", "http://127.0.0.1", "--listen", "0.0.0.0:80"],
        &[],
        "upstream.url",
    );
    assert_refused(
        &["--listen", "127.0.0.1:7000", "--admin-listen", "127.0.0.1:7000"],
        &[],
        "server.admin_listen",
    );
    assert_refused(&["--admin-listen", "127.0.0.1:8080"], &[], "server.admin_listen");
    for (key, env, value) in [
        (
            "translate.max_item_bytes",
            "SSE_GATEWAY__TRANSLATE__MAX_ITEM_BYTES",
            "1073741825",
        ),
        (
            "translate.agent_body_max_bytes",
            "SSE_GATEWAY__TRANSLATE__AGENT_BODY_MAX_BYTES",
            "16777217",
        ),
        ("translate.budget", "SSE_GATEWAY__TRANSLATE__BUDGET", "1048577"),
        (
            "translate.max_text_event_bytes",
            "SSE_GATEWAY__TRANSLATE__MAX_TEXT_EVENT_BYTES",
            "16777217",
        ),
        (
            "translate.json_sniff_bytes",
            "SSE_GATEWAY__TRANSLATE__JSON_SNIFF_BYTES",
            "16777217",
        ),
        (
            "translate.keepalive_interval_secs",
            "SSE_GATEWAY__TRANSLATE__KEEPALIVE_INTERVAL_SECS",
            "0.5",
        ),
    ] {
        assert_refused(&[], &[(env, value)], key);
    }
    // The ceilings themselves, a keepalive of 0 (off), and an upstream on another host's same port pass.
    let (code, _, err) = check_config(
        &["--upstream", "http://10.0.0.5:8080"],
        &[
            ("SSE_GATEWAY__TRANSLATE__MAX_ITEM_BYTES", "1073741824"),
            ("SSE_GATEWAY__TRANSLATE__AGENT_BODY_MAX_BYTES", "16777216"),
            ("SSE_GATEWAY__TRANSLATE__BUDGET", "1048576"),
            ("SSE_GATEWAY__TRANSLATE__KEEPALIVE_INTERVAL_SECS", "0"),
        ],
    );
    assert_eq!(code, Some(0), "{err}");
}
