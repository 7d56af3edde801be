//! Issue 37, the stream inspector (DESIGN 6.2, docs/OPERATIONS.md): the real binary in front of the legacy-backend
//! emulator, its admin listener read with real HTTP clients: off by default, who may see it, its headers, its
//! records against what the client and the backend saw, its bounds (the feeds' cap, a feed that never reads),
//! and that it never holds an upstream.

mod harness;

use std::time::{Duration, Instant};

use harness::legacy::text_block;
use harness::prelude::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound on any single wait of these tests: reaching it is a failure.
const WAIT: Duration = Duration::from_secs(20);

/// `debug.token` of these tests (at least 32 characters).
const TOKEN: &str = "inspector-test-token-0123456789abcdef";

/// The headers a translating SSE client sends.
const SSE: [(&str, &str); 3] = [
    ("accept", "text/event-stream"),
    ("content-type", "application/json"),
    ("x-stream-format", "json"),
];

/// A legacy stream's events: a text block of `words` deltas, then `[DONE]`.
fn legacy_events(words: usize) -> Vec<Vec<u8>> {
    text_block((0..words).map(|i| format!("word{i} ")), &["[DONE]"])
}

/// The emulator's steps for `events` written at once.
fn quick(events: &[Vec<u8>]) -> Vec<Step> {
    vec![sse_head(), Step::WriteAll(events.concat()), Step::EndChunks]
}

/// A gateway with the inspector on (token set, content captured), plus `extra` settings.
fn inspected(upstream: &str, extra: &[(&str, &str)]) -> Process {
    let mut env = vec![
        ("SSE_GATEWAY__DEBUG__STREAMS", "true"),
        ("SSE_GATEWAY__DEBUG__TOKEN", TOKEN),
        ("SSE_GATEWAY__DEBUG__CAPTURE_CONTENT", "true"),
    ];
    env.extend_from_slice(extra);
    Process::against(upstream, &env)
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// `GET` on the admin listener with `headers`.
async fn admin(gw: &Process, path: &str, headers: &[(&str, &str)]) -> (http::response::Parts, Vec<u8>) {
    send("GET", &format!("http://{}{path}", gw.admin), headers, "").await
}

/// `GET` on the admin listener with the token.
async fn authed(gw: &Process, path: &str) -> (http::response::Parts, Vec<u8>) {
    let b = bearer();
    admin(gw, path, &[("authorization", &b)]).await
}

/// One whole run through the gateway: its response head and body.
async fn run(gw: &Process) -> (http::response::Parts, Vec<u8>) {
    send("POST", &format!("http://{}/agent/run", gw.addr), &SSE, "{}").await
}

/// The listed streams.
async fn listed(gw: &Process) -> Vec<Value> {
    let (parts, body) = authed(gw, "/debug/streams.json").await;
    assert_eq!(parts.status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).expect("streams.json is JSON");
    v["streams"].as_array().expect("a streams array").clone()
}

/// Waits until a listed stream satisfies `ok`; returns it.
async fn wait_listed(gw: &Process, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(s) = listed(gw).await.into_iter().find(|s| ok(s)) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "no such stream listed: {:?}",
            listed(gw).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The records of an NDJSON capture.
fn records(ndjson: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(ndjson)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect()
}

fn side<'a>(recs: &'a [Value], s: &str) -> Vec<&'a Value> {
    recs.iter().filter(|r| r["side"] == s).collect()
}

/// The data of each legacy event as the backend wrote it (`data: X\n\n`).
fn backend_data(events: &[Vec<u8>]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            let t = String::from_utf8_lossy(e);
            let line = t.strip_suffix("\n\n").expect("one event");
            line.strip_prefix("data: ").expect("a data line").to_owned()
        })
        .collect()
}

/// The inspector's headers on any of its answers: no caching, no sniffing, no CORS.
fn assert_inspector_headers(parts: &http::response::Parts, what: &str) {
    let h = &parts.headers;
    assert_eq!(
        h.get("cache-control").map(|v| v.as_bytes()),
        Some(b"no-store".as_ref()),
        "{what}"
    );
    assert_eq!(
        h.get("x-content-type-options").map(|v| v.as_bytes()),
        Some(b"nosniff".as_ref()),
        "{what}"
    );
    let cors: Vec<_> = h.keys().filter(|k| k.as_str().starts_with("access-control-")).collect();
    assert!(cors.is_empty(), "{what}: CORS headers {cors:?}");
}

/// A page's CSP: nothing by default, no eval, no inline script.
fn assert_page_csp(parts: &http::response::Parts, what: &str) {
    let csp = parts
        .headers
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("{what}: no CSP"));
    assert!(csp.starts_with("default-src 'none'"), "{what}: {csp}");
    assert!(
        !csp.contains("unsafe-eval") && !csp.contains("unsafe-inline"),
        "{what}: {csp}"
    );
    assert!(
        !csp.contains("http:") && !csp.contains("https:") && !csp.contains('*'),
        "{what}: {csp}"
    );
}

// ------------------------------------------------------------------------------------------------------------
// Off by default; who may start it.
// ------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_serves_nothing_and_keeps_nothing() {
    let events = legacy_events(3);
    let up = Emulator::start(move |_| quick(&events)).await;
    let gw = Process::against(&up.url(), &[]);
    let (parts, _) = run(&gw).await;
    assert_eq!(parts.status, 200);
    for path in [
        "/debug/streams",
        "/debug/streams.json",
        "/debug/streams/1",
        "/debug/streams/1/events",
        "/debug/streams/1/capture.ndjson",
        "/debug/assets/inspector.js",
    ] {
        let b = bearer();
        let (parts, _) = admin(&gw, path, &[("authorization", &b)]).await;
        assert_eq!(parts.status, 404, "{path} served with [debug] streams off");
    }
    let metrics = gw.metrics().await;
    assert!(
        !metrics.contains("sse_gateway_debug_attach_total"),
        "the inspector's counter exists while it is off"
    );
    let (parts, _) = admin(&gw, "/metrics", &[]).await;
    assert_eq!(parts.status, 200, "/metrics unchanged");
}

#[test]
fn start_is_refused_naming_debug_token_off_loopback_without_one_or_with_a_short_one() {
    // Hold the port: a gateway that bound before validating would fail differently.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let cases: [(&str, &[(&str, &str)]); 3] = [
        ("0.0.0.0:0", &[]),
        ("[::]:0", &[]),
        ("127.0.0.1:0", &[("SSE_GATEWAY__DEBUG__TOKEN", "too-short-0123456789")]),
    ];
    for (admin, env) in cases {
        let mut cmd = harness::process::bin();
        cmd.args(["--listen", &addr, "--admin-listen", admin])
            .env("SSE_GATEWAY__UPSTREAM__URL", "http://127.0.0.1:9")
            .env("SSE_GATEWAY__DEBUG__STREAMS", "true");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{admin} {env:?}: {err}");
        assert!(
            err.contains("debug.token"),
            "{admin} {env:?}: does not name debug.token: {err}"
        );
    }
    // On loopback no token is needed; off loopback a long one is enough (checked, not started).
    for (admin, token) in [("127.0.0.2:0", ""), ("0.0.0.0:0", TOKEN)] {
        let out = harness::process::bin()
            .args(["--check-config", "--listen", &addr, "--admin-listen", admin])
            .env("SSE_GATEWAY__UPSTREAM__URL", "http://127.0.0.1:9")
            .env("SSE_GATEWAY__DEBUG__STREAMS", "true")
            .env("SSE_GATEWAY__DEBUG__TOKEN", token)
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{admin}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!printed.contains(TOKEN), "--check-config prints the token");
    }
    drop(held);
}

// ------------------------------------------------------------------------------------------------------------
// Who may see it, and the headers of everything it answers.
// ------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_required_as_bearer_or_cookie_and_every_answer_has_the_inspector_headers() {
    let events = legacy_events(3);
    let up = Emulator::start(move |_| quick(&events)).await;
    let gw = inspected(&up.url(), &[]);
    run(&gw).await;
    let id = wait_listed(&gw, |s| s["state"] == "finished").await["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let paths = [
        "/debug/streams".to_owned(),
        "/debug/streams.json".to_owned(),
        format!("/debug/streams/{id}"),
        format!("/debug/streams/{id}/capture.ndjson"),
        format!("/debug/streams/{id}/events"),
    ];
    let origin = ("origin", "http://evil.example");
    for path in &paths {
        for headers in [
            vec![],
            vec![origin],
            vec![("authorization", "Bearer not-the-token-0123456789abcdef")],
        ] {
            let (parts, _) = admin(&gw, path, &headers).await;
            assert_eq!(parts.status, 401, "{path} {headers:?}");
            assert_inspector_headers(&parts, path);
        }
        for scheme in ["Bearer", "bearer", "BEARER"] {
            let auth = format!("{scheme} {TOKEN}");
            let (parts, _) = admin(&gw, path, &[("authorization", &auth), origin]).await;
            assert_eq!(parts.status, 200, "{path} with {scheme}");
            assert_inspector_headers(&parts, path);
            let is_page = parts
                .headers
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/html"));
            if is_page {
                assert_page_csp(&parts, path);
            }
        }
    }
    for asset in [
        "/debug/assets/inspector.js",
        "/debug/assets/inspector.css",
        "/debug/assets/icon.svg",
    ] {
        let (parts, _) = admin(&gw, asset, &[]).await;
        assert_eq!(parts.status, 200, "{asset}");
        assert_inspector_headers(&parts, asset);
    }

    // The browser's way: a page sends it to the form; the form's token comes back as a cookie for /debug/ only.
    let html = ("accept", "text/html,application/xhtml+xml");
    for path in [&paths[0], &paths[2]] {
        let (parts, _) = admin(&gw, path, &[html]).await;
        assert_eq!(parts.status, 303, "{path}");
        assert_eq!(
            parts.headers.get("location").map(|v| v.as_bytes()),
            Some(b"/debug/login".as_ref())
        );
        assert_inspector_headers(&parts, path);
    }
    let (parts, body) = admin(&gw, "/debug/login", &[html]).await;
    assert_eq!(parts.status, 200);
    assert_inspector_headers(&parts, "the token form");
    assert_page_csp(&parts, "the token form");
    let form = String::from_utf8_lossy(&body);
    assert!(
        form.contains(r#"action="/debug/login""#) && form.contains(r#"name="token""#),
        "{form}"
    );
    let url = format!("http://{}/debug/login", gw.admin);
    let form_type = [("content-type", "application/x-www-form-urlencoded")];
    let (parts, _) = send("POST", &url, &form_type, "token=wrong-token-0123456789abcdef0123").await;
    assert_eq!(parts.status, 401);
    assert!(parts.headers.get("set-cookie").is_none(), "a cookie for a wrong token");
    let (parts, _) = send("POST", &url, &form_type, format!("token={TOKEN}")).await;
    assert_eq!(parts.status, 303);
    assert_inspector_headers(&parts, "the form's answer");
    assert_eq!(
        parts.headers.get("location").map(|v| v.as_bytes()),
        Some(b"/debug/streams".as_ref())
    );
    let cookie = parts
        .headers
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("a cookie");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/debug/"] {
        assert!(cookie.split("; ").any(|a| a == attr), "{attr} missing: {cookie}");
    }
    let pair = cookie.split(';').next().expect("name=value");
    for path in &paths {
        let (parts, _) = admin(&gw, path, &[("cookie", pair)]).await;
        assert_eq!(parts.status, 200, "{path} with the cookie");
    }
    // /metrics, /healthz, /readyz unchanged: no token asked.
    for path in ["/metrics", "/healthz"] {
        assert_eq!(admin(&gw, path, &[]).await.0.status, 200, "{path}");
    }
}

// ------------------------------------------------------------------------------------------------------------
// What it shows: the records against what the client and the backend saw.
// ------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capture_holds_the_envelopes_the_client_received_and_the_events_the_backend_sent() {
    let events = legacy_events(40);
    let sent = events.clone();
    let up = Emulator::start(move |_| quick(&sent)).await;
    let gw = inspected(&up.url(), &[]);
    let (parts, body) = run(&gw).await;
    assert_eq!(parts.status, 200);
    let got: Vec<Value> = envelopes(&body).into_iter().filter(|e| e != "[DONE]").collect();
    assert!(got.len() > 40, "the client read the run: {}", got.len());
    let s = wait_listed(&gw, |s| s["state"] == "finished").await;
    let id = s["id"].as_str().expect("an id");
    assert_eq!(
        s["envelopes"]["text"],
        got.iter().filter(|e| e["type"] == "text").count()
    );
    assert_eq!(s["path"], "/agent/run");
    assert_eq!(s["encoder"], "json");
    assert_eq!(s["dialect"], "xml");
    assert_eq!(s["raw_events"], events.len());

    let (parts, ndjson) = authed(&gw, &format!("/debug/streams/{id}/capture.ndjson")).await;
    assert_eq!(parts.status, 200);
    assert_eq!(
        parts.headers.get("content-type").map(|v| v.as_bytes()),
        Some(b"application/x-ndjson".as_ref())
    );
    let recs = records(&ndjson);
    let envs: Vec<Value> = side(&recs, "envelope").iter().map(|r| r["data"].clone()).collect();
    assert_eq!(envs, got, "the capture's envelopes are those the client received");
    let raws = side(&recs, "raw");
    let raw_data: Vec<String> = raws
        .iter()
        .map(|r| r["data"].as_str().expect("data").to_owned())
        .collect();
    assert_eq!(
        raw_data,
        backend_data(&events),
        "the capture's raw records are the backend's events"
    );
    for (i, r) in raws.iter().enumerate() {
        assert_eq!(r["seq"], i, "raw seqs count the events");
        assert_eq!(r["event"], "message");
        assert!(r["t_ms"].is_u64());
    }
    // Each envelope links the event it came from: a delta's envelope links the event carrying it.
    for r in side(&recs, "envelope") {
        assert!(r["t_ms"].is_u64());
        if let Some(raw) = r["raw_seq"].as_u64() {
            assert!(raw < raws.len() as u64, "{r}");
        }
        if r["data"]["type"] == "text" && r["data"]["final"] == false {
            let raw = r["raw_seq"].as_u64().expect("a delta links its event") as usize;
            let delta = r["data"]["delta"].as_str().expect("delta");
            assert!(raw_data[raw].contains(delta.trim_end()), "{r} links {}", raw_data[raw]);
        }
    }
    assert!(side(&recs, "gap").is_empty(), "nothing lost from a short run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_capture_content_records_carry_no_data() {
    let events = legacy_events(5);
    let up = Emulator::start(move |_| quick(&events)).await;
    let gw = inspected(&up.url(), &[("SSE_GATEWAY__DEBUG__CAPTURE_CONTENT", "false")]);
    run(&gw).await;
    let id = wait_listed(&gw, |s| s["state"] == "finished").await["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let (_, ndjson) = authed(&gw, &format!("/debug/streams/{id}/capture.ndjson")).await;
    let recs = records(&ndjson);
    assert!(side(&recs, "raw").len() == 8 && !side(&recs, "envelope").is_empty());
    for r in &recs {
        assert!(r.get("data").is_none(), "content without capture_content: {r}");
        assert!(r["bytes"].is_u64(), "counts kept: {r}");
    }
    assert!(
        !String::from_utf8_lossy(&ndjson).contains("word1"),
        "a delta's text in the capture"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_token_never_appears_whole_in_what_the_inspector_serves() {
    let events = legacy_events(5);
    let up = Emulator::start(move |_| quick(&events)).await;
    let gw = inspected(&up.url(), &[]);
    let (parts, _) = run(&gw).await;
    let url = parts
        .headers
        .get("x-gateway-stream")
        .and_then(|v| v.to_str().ok())
        .expect("a held stream's URL")
        .to_owned();
    let token = url.rsplit('/').next().expect("a token").to_owned();
    assert!(token.len() > 8, "{url}");
    let s = wait_listed(&gw, |s| s["state"] == "finished").await;
    assert_eq!(
        s["stream"].as_str(),
        Some(&token[..8]),
        "the token's first 8 characters name it"
    );
    let id = s["id"].as_str().expect("an id").to_owned();
    assert!(!token.contains(&id) || id.len() < 8);
    for path in [
        "/debug/streams".to_owned(),
        "/debug/streams.json".to_owned(),
        format!("/debug/streams/{id}"),
        format!("/debug/streams/{id}/capture.ndjson"),
        // The stream has ended: its feed sends everything, then ends.
        format!("/debug/streams/{id}/events"),
    ] {
        let (parts, body) = authed(&gw, &path).await;
        assert_eq!(parts.status, 200, "{path}");
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains(&token), "{path} shows the whole stream token");
        for (k, v) in &parts.headers {
            assert!(
                !v.to_str().unwrap_or("").contains(&token),
                "{path}: header {k} shows the token"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------------------------
// Bounds: the cap of feeds, a feed that never reads, grace.
// ------------------------------------------------------------------------------------------------------------

/// A run that writes `first` events, then waits until the gateway closes the upstream.
fn held_open(first: Vec<Vec<u8>>) -> Vec<Step> {
    vec![sse_head(), Step::WriteAll(first.concat()), Step::AwaitClose]
}

/// Opens a live feed of stream `id` on a raw connection: the connection and the response head read so far.
async fn open_feed(gw: &Process, id: &str) -> (tokio::net::TcpStream, String) {
    let mut s = tokio::net::TcpStream::connect(gw.admin).await.expect("connect");
    let req = format!(
        "GET /debug/streams/{id}/events HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {TOKEN}\r\n\r\n",
        gw.admin
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(WAIT, s.read(&mut buf))
            .await
            .expect("a head in time")
            .expect("read");
        assert!(n > 0, "closed before a head");
        head.extend_from_slice(&buf[..n]);
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feeds_past_max_inspectors_are_refused_with_429_and_each_attach_is_counted() {
    let up = Emulator::start(move |_| held_open(legacy_events(3)[..2].to_vec())).await;
    let gw = inspected(&up.url(), &[("SSE_GATEWAY__DEBUG__MAX_INSPECTORS", "2")]);
    let (body, _) = open_run(gw.addr, &SSE).await;
    let id = wait_listed(&gw, |s| s["state"] == "live").await["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let (feed_a, head_a) = open_feed(&gw, &id).await;
    let (_feed_b, head_b) = open_feed(&gw, &id).await;
    assert!(
        head_a.starts_with("HTTP/1.1 200") && head_b.starts_with("HTTP/1.1 200"),
        "{head_a}\n{head_b}"
    );
    let (parts, _) = authed(&gw, &format!("/debug/streams/{id}/events")).await;
    assert_eq!(parts.status, 429, "a third feed past max_inspectors = 2");
    assert_inspector_headers(&parts, "429");
    let s = wait_listed(&gw, |s| s["id"] == id.as_str()).await;
    assert_eq!(s["inspectors"], 2);
    authed(&gw, &format!("/debug/streams/{id}")).await;
    authed(&gw, &format!("/debug/streams/{id}/capture.ndjson")).await;
    assert_eq!(
        gw.metric("sse_gateway_debug_attach_total", &["kind=\"events\""]).await,
        2.0
    );
    assert_eq!(
        gw.metric("sse_gateway_debug_attach_total", &["kind=\"page\""]).await,
        1.0
    );
    assert_eq!(
        gw.metric("sse_gateway_debug_attach_total", &["kind=\"capture\""]).await,
        1.0
    );
    // A feed gone gives its place back.
    drop(feed_a);
    let deadline = Instant::now() + WAIT;
    loop {
        let (parts, _) = {
            let b = bearer();
            let url = format!("http://{}/debug/streams/{id}/events", gw.admin);
            let req = http::Request::get(url)
                .header("authorization", b)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .expect("request");
            let resp = tokio::time::timeout(WAIT, client().request(req))
                .await
                .expect("in time")
                .expect("resp");
            resp.into_parts()
        };
        if parts.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the place of a closed feed was not given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(body);
}

/// A big text block: `deltas` deltas of about 1 KiB, then `[DONE]`; as legacy bytes.
fn big_stream(deltas: usize) -> Vec<u8> {
    let mut s = b"data: <content-block-text>\n\n".to_vec();
    for i in 0..deltas {
        s.extend_from_slice(format!("data: {i:06}{}\n\n", "y".repeat(1014)).as_bytes());
    }
    s.extend_from_slice(b"data: </content-block-text>\n\ndata: [DONE]\n\n");
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_that_never_reads_is_cut_while_the_live_client_gets_its_whole_stream() {
    let legacy = big_stream(6000);
    let first_part = legacy[..4096].to_vec();
    let rest = legacy[4096..].to_vec();
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let up = Upstream::start(move |mut conn| {
        let (first_part, rest, mut go) = (first_part.clone(), rest.clone(), go_rx.clone());
        async move {
            let _ = conn.sse_head(true).await;
            let _ = conn.send(&first_part).await;
            // The rest once the feed is attached (and never reading).
            let _ = go.wait_for(|g| *g).await;
            let _ = conn.send(&rest).await;
            let _ = conn.end_chunks().await;
            conn.close().await;
        }
    })
    .await;
    let gw = inspected(&up.url(), &[("SSE_GATEWAY__DEBUG__RING_BYTES", "65536")]);
    let (mut body, mut got) = open_run(gw.addr, &SSE).await;
    let id = wait_listed(&gw, |s| s["state"] == "live").await["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    // A feed whose client reads nothing past its head: a small receive buffer so the gateway's writes stall soon.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.set_recv_buffer_size(4096).expect("rcvbuf");
    sock.connect(&gw.admin.into()).expect("connect");
    sock.set_nonblocking(true).expect("nonblocking");
    let mut feed = tokio::net::TcpStream::from_std(std::net::TcpStream::from(sock)).expect("tokio stream");
    let req = format!(
        "GET /debug/streams/{id}/events HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {TOKEN}\r\n\r\n",
        gw.admin
    );
    feed.write_all(req.as_bytes()).await.expect("write");
    wait_listed(&gw, |s| s["id"] == id.as_str() && s["inspectors"] == 1).await;
    go_tx.send(true).expect("go");

    // The live client reads its whole stream, unchanged.
    assert!(read_rest(&mut body, &mut got).await, "the client's stream was cut");
    let expected = sse_gateway::translate::translate_all(Default::default(), "x", &legacy).0;
    let got_envs: Vec<Value> = envelopes(&got).into_iter().map(strip_agent).collect();
    let want_envs: Vec<Value> = envelopes(&expected).into_iter().map(strip_agent).collect();
    assert_eq!(got_envs.len(), want_envs.len(), "the client got every envelope");
    assert!(
        got_envs == want_envs,
        "the client's envelopes differ from the translation"
    );

    // The feed fell behind the ring: its connection is closed (it reads to EOF soon), not waited for.
    let s = wait_listed(&gw, |s| s["id"] == id.as_str() && s["state"] == "finished").await;
    assert!(
        s["records_kept_from"].as_u64().unwrap_or(0) > 0,
        "the ring moved on: {s}"
    );
    let mut read = 0usize;
    let mut buf = vec![0u8; 64 << 10];
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            match feed.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the feed that never read is still open");
    assert!(
        read < got.len() * 2,
        "the feed was sent everything ({read} bytes): not cut"
    );
    assert_eq!(wait_listed(&gw, |s| s["id"] == id.as_str()).await["inspectors"], 0);
}

/// An envelope without its `agent` (the fallback agent differs between the gateway and the reference).
fn strip_agent(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("agent");
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inspector_does_not_keep_an_upstream_in_grace() {
    let mut up = Emulator::start(move |_| held_open(legacy_events(3)[..2].to_vec())).await;
    let gw = inspected(&up.url(), &[("SSE_GATEWAY__RESUME__GRACE_SECS", "1")]);
    let (body, _) = open_run(gw.addr, &SSE).await;
    let s = wait_listed(&gw, |s| s["state"] == "live").await;
    assert_eq!(s["readers"], 1, "the client reads: {s}");
    let id = s["id"].as_str().expect("an id").to_owned();
    let (mut feed, head) = open_feed(&gw, &id).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let s = wait_listed(&gw, |s| s["id"] == id.as_str() && s["inspectors"] == 1).await;
    assert_eq!(s["readers"], 1, "an inspector is not a reader: {s}");
    let left = Instant::now();
    drop(body);
    // Grace is 1 s: the upstream goes then, whatever the inspector.
    let closed = tokio::time::timeout(WAIT, up.closed.recv())
        .await
        .expect("the upstream closed in time");
    assert!(closed.is_some());
    assert!(
        left.elapsed() < Duration::from_secs(10),
        "upstream kept {:?}",
        left.elapsed()
    );
    let s = wait_listed(&gw, |s| s["id"] == id.as_str() && s["state"] != "live").await;
    assert_ne!(s["state"], "finished", "{s}");
    // The feed sees the end.
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(WAIT, async {
        while !got.windows(10).any(|w| w == b"event: end") {
            match feed.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        String::from_utf8_lossy(&got).contains("event: end"),
        "the feed was not told the end: {}",
        String::from_utf8_lossy(&got)
    );
}

// ------------------------------------------------------------------------------------------------------------
// The page in a real browser.
// ------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_in_chromium_lists_the_run_and_shows_both_columns_growing_live_with_no_error_and_no_other_origin() {
    let Some(chromium) = harness::browser::chromium_or_skip() else {
        return;
    };
    if !harness::node::node_with_or_skip("node with ws", &["ws"]) {
        return;
    }
    // A run of about 8 s: the page opens while it streams.
    let events = legacy_events(160);
    let up = Emulator::start(move |_| paced(events.clone(), Duration::from_millis(50))).await;
    let gw = inspected(&up.url(), &[]);
    let (mut body, mut got) = open_run(gw.addr, &SSE).await;
    let client = tokio::spawn(async move {
        let whole = read_rest(&mut body, &mut got).await;
        (whole, got)
    });
    let origin = format!("http://{}", gw.admin);
    let mut cmd = std::process::Command::new("node");
    cmd.arg("tests/external/node/inspector-page.mjs")
        .arg(&chromium)
        .arg(&origin)
        .arg(TOKEN);
    let ran = tokio::task::spawn_blocking(move || harness::node::run(cmd, Duration::from_secs(90)))
        .await
        .expect("node ran");
    assert!(
        ran.status.is_some_and(|s| s.success()),
        "the page driver failed: {}",
        ran.stderr
    );
    let page: Value = serde_json::from_str(ran.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", ran.stdout));
    assert!(page.get("failure").is_none(), "{page:#}");
    assert_eq!(page["form"], "/debug/login", "{page:#}");
    assert_eq!(page["cookieVisibleToScript"], "", "the cookie is HttpOnly");
    let (first, second, last) = (&page["first"], &page["second"], &page["last"]);
    assert_eq!(
        first["ended"], false,
        "the page opened once the run had ended: {page:#}"
    );
    for col in ["raw", "envelopes"] {
        assert!(first[col].as_u64() > Some(0), "{col} empty: {page:#}");
        assert!(
            second[col].as_u64() > first[col].as_u64(),
            "{col} did not grow live: {page:#}"
        );
    }
    assert!(
        last["links"].as_u64() > Some(0),
        "no envelope links its event: {page:#}"
    );
    assert_eq!(last["raw"], 160 + 3, "every legacy event shown: {page:#}");
    let errors = page["errors"].as_array().expect("errors");
    assert!(errors.is_empty(), "console errors: {errors:#?}");
    let requests = page["requests"].as_array().expect("requests");
    assert!(requests.len() > 3, "{requests:?}");
    for r in requests {
        let url = r.as_str().expect("a URL");
        assert!(
            url.starts_with(&format!("{origin}/")),
            "a request to another origin: {url}"
        );
    }
    let (whole, got) = client.await.expect("client");
    assert!(whole, "the client's stream was cut");
    let envs = envelopes(&got).into_iter().filter(|e| e != "[DONE]").count() as u64;
    assert_eq!(
        last["envelopes"].as_u64(),
        Some(envs),
        "the page shows every envelope the client got: {page:#}"
    );
    assert_eq!(
        gw.metric("sse_gateway_debug_attach_total", &["kind=\"events\""]).await,
        1.0
    );
}
