//! Issue 28, the WebSocket output (docs/WEBSOCKET.md), against the gateway in process with `tokio-tungstenite`'s
//! client (and raw TCP where a client must misbehave): a stream read whole, byte for byte as SSE readers get it,
//! then 1000; resume after a cut; cancel from the socket (4002, the upstream closed); `Origin` refused before the
//! upgrade and an allowed one let through; the `sse-gateway.auth` credential message (and its deadline, 1008); a
//! handshake that never ends, dropped by the header timeout; oversized (1009), binary and malformed (1003) client
//! messages; RFC 6455 with hand-written frames (the close handshake both ways, 1002 for broken framing and invalid
//! close codes, 1007 for invalid UTF-8, version and HTTP/1.0 handshakes refused, a ping before the auth message);
//! a slow reader batched, one that reads nothing closed as behind (and told so) while the gateway stays healthy,
//! one that floods pings and reads nothing closed with the gateway's memory bounded (the binary, for its RSS);
//! two thousand idle sockets all served; the session socket; two instances on one real `redis-server`; a silent
//! run kept by the gateway's pings and a client that never answers them closed 1008; a socket catching up on a
//! long held run that still hears the drain.
//!
//! The third-party clients (npm `ws`, PyPI `websockets`, Chromium) are in tests/websocket_clients.rs.

mod harness;

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use harness::prelude::*;
use harness::redis_server::RedisServer;
use harness::ws::{
    client_close, client_frame, connect, connect_with, describe, id_gaps, raw_read, raw_socket, read_to_close,
    read_until, run_answer, send_text, socket_events, sse_events, start_run, token_of, Got, RawEnd,
};
use sse_gateway::config::{Settings, StoreKind};
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// Bound on any single wait of these tests: reaching it is a failure.
const WAIT: Duration = Duration::from_secs(10);
/// A page's origin the operator allows, and another site.
const APP: &str = "http://127.0.0.1:5173";
const EVIL: &str = "http://evil.test";

/// The upstream of every test here: the runs of [`run_answer`], else 404.
async fn upstream() -> Emulator {
    Emulator::start(|r| run_answer(r).unwrap_or_else(|| Step::answer(404, &[("Content-Length", "0")], b""))).await
}

async fn setup(tweak: impl FnOnce(&mut Settings)) -> (Emulator, TestGateway) {
    let up = upstream().await;
    let gw = TestGateway::start(&up.url(), tweak).await;
    (up, gw)
}

/// A metric of the gateway's `/metrics`.
/// Asserts what the gateway's metric `name` (the series with `labels`) reads.
async fn assert_metric(gw: &TestGateway, family: &str, labels: &[&str], want: f64) {
    let name = format!("sse_gateway_{family}");
    assert_eq!(metric_of(gw, &name, labels).await, want, "{name} {labels:?}");
}

async fn metric_of(gw: &TestGateway, name: &str, labels: &[&str]) -> f64 {
    metric(&gw.metrics().await, name, labels)
}

/// Waits (bounded) until `name{labels}` is `want`; returns the last value seen.
async fn wait_metric(gw: &TestGateway, name: &str, labels: &[&str], want: impl Fn(f64) -> bool) -> f64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let v = metric_of(gw, name, labels).await;
        if want(v) || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads the socket and the SSE reader of the same run to their ends: the socket closes 1000 after the very
/// stream the SSE reader got.
async fn assert_whole_stream(ws: &mut harness::ws::Ws, sse: &mut Client, url: &str, what: &str) -> Got {
    let got = read_to_close(ws, WAIT).await;
    sse.read_to_end(WAIT).await.expect("the SSE reader's end");
    assert_eq!(got.close, Some(1000), "{what}: {}", got.ending());
    assert_same_stream(&got, &sse_events(&sse.body), token_of(url), what);
    got
}

/// Reads the socket to its close: `code`, and not one event before it.
async fn assert_closed_with_nothing(ws: &mut harness::ws::Ws, code: u16) {
    let got = read_to_close(ws, WAIT).await;
    assert_eq!((got.close, got.events().len()), (Some(code), 0), "{}", got.ending());
}

/// Asserts the socket got the stream `sse` got (same ids, in order, from `from`; envelopes byte for byte).
fn assert_same_stream(got: &Got, sse: &[(String, String)], token: &str, what: &str) {
    let ws = socket_events(got);
    assert!(!sse.is_empty(), "{what}: the SSE reader got nothing");
    if ws != sse {
        let at = ws
            .iter()
            .zip(sse)
            .position(|(a, b)| a != b)
            .unwrap_or(ws.len().min(sse.len()));
        panic!(
            "{what}: the socket's events differ from the SSE reader's: {} vs {} events; first difference at {at}: \
             socket {:?}, SSE {:?} ({})",
            ws.len(),
            sse.len(),
            ws.get(at),
            sse.get(at),
            got.ending()
        );
    }
    assert_eq!(id_gaps(&got.ids(), token, 1), None, "{what}");
}

// ---- a stream, whole, resumed, cancelled ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_reads_the_whole_stream_as_sse_readers_do_then_1000() {
    let (up, gw) = setup(|_| {}).await;
    let (mut sse, url) = start_run(gw.addr, "/run/40", &[]).await;
    let mut ws = connect(gw.addr, &url, &[]).await;
    let got = read_to_close(&mut ws, WAIT).await;
    let mid_run = !up.conn("/run/40").expect("the run's connection").done || got.msgs.len() > 1;
    sse.read_to_end(WAIT).await.expect("the SSE reader's end");
    assert_eq!(got.close, Some(1000), "{}", got.ending());
    assert!(mid_run, "the socket opened after the run ended");
    assert_same_stream(
        &got,
        &sse_events(&sse.body),
        token_of(&url),
        "a socket on a live stream",
    );
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "sse_gateway_websocket_closes_total", &["code=\"1000\""]),
        1.0
    );
    assert_eq!(metric(&m, "sse_gateway_websocket_sockets", &[]), 0.0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_cut_mid_run_resumes_after_its_last_id_losing_and_repeating_nothing() {
    let (_up, gw) = setup(|_| {}).await;
    let (mut sse, url) = start_run(gw.addr, "/run/40", &[]).await;
    let token = token_of(&url).to_owned();
    let mut first = connect(gw.addr, &url, &[]).await;
    let before = read_until(&mut first, WAIT, |g| g.events().len() >= 8).await;
    assert!(
        before.close.is_none() && before.events().len() >= 8,
        "{}",
        before.ending()
    );
    // A cut: the connection dropped, no close handshake.
    drop(first);
    let last = before.last_id().expect("an id");
    let mut second = connect(gw.addr, &format!("{url}?last_event_id={last}"), &[]).await;
    let after = read_to_close(&mut second, WAIT).await;
    assert_eq!(after.close, Some(1000), "{}", after.ending());
    sse.read_to_end(WAIT).await.expect("the SSE reader's end");
    let joined = Got {
        msgs: before.msgs.into_iter().chain(after.msgs).collect(),
        ..Got::default()
    };
    assert_same_stream(&joined, &sse_events(&sse.body), &token, "two sockets, cut and resumed");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_from_the_socket_ends_the_run_4002_and_closes_the_upstream() {
    let (mut up, gw) = setup(|_| {}).await;
    let (mut sse, url) = start_run(gw.addr, "/hold", &[]).await;
    let mut ws = connect(gw.addr, &url, &[]).await;
    let early = read_until(&mut ws, WAIT, |g| !g.events().is_empty()).await;
    assert!(!early.events().is_empty(), "{}", early.ending());
    send_text(&mut ws, r#"{"type":"cancel"}"#).await;
    let got = read_to_close(&mut ws, WAIT).await;
    assert_eq!(got.close, Some(4002), "{}", got.ending());
    let closed = tokio::time::timeout(WAIT, up.closed.recv()).await;
    assert!(
        matches!(closed, Ok(Some(_))),
        "the upstream did not see its connection closed"
    );
    // The SSE reader of the run is told too.
    sse.read_to_end(WAIT).await.expect("the SSE reader's end");
    assert!(
        String::from_utf8_lossy(&sse.body).contains("stream_cancelled"),
        "{}",
        String::from_utf8_lossy(&sse.body)
    );
    gw.stop().await;
}

/// A socket on a run gone silent is kept by the gateway's pings (issue 38: the ping timer is polled only when it
/// or the client woke the socket, so each tick must arm the next): a client that answers them is pinged again
/// after each interval of silence (its pong is heard: the next ping comes on the tick after the one that finds a
/// whole interval since) and stays open; one that never answers is closed 1008 once the pong timeout has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_run_is_pinged_again_and_again_and_a_client_that_never_pongs_is_closed_1008() {
    let (_up, gw) = setup(|s| {
        s.websocket.ping_interval_secs = 1.0;
        s.websocket.pong_timeout_secs = 1.0;
        // The run never ends: the stop cuts it at once.
        s.server.drain_timeout_secs = 0.5;
    })
    .await;
    let (_sse, url) = start_run(gw.addr, "/hold", &[]).await;
    // Never writes: no pong, nothing else heard.
    let mut mute = raw_socket(gw.addr, &url, &[], None).await.expect("a socket");
    let mute = tokio::spawn(async move { raw_read(&mut mute, Duration::from_secs(8), |e| e.close.is_some()).await });
    // tokio-tungstenite answers each ping as it reads.
    let mut ws = connect(gw.addr, &url, &[]).await;
    let (mut pings, mut closed) = (0, None);
    let until = tokio::time::Instant::now() + Duration::from_millis(4500);
    while let Ok(Some(msg)) = tokio::time::timeout_at(until, ws.next()).await {
        match msg {
            Ok(Message::Ping(_)) => pings += 1,
            Ok(Message::Close(c)) => closed = Some(c),
            Ok(_) => {}
            Err(e) => panic!("the answering socket failed after {pings} pings: {}", describe(&e)),
        }
    }
    assert!(closed.is_none(), "the answering socket was closed: {closed:?}");
    assert!(pings >= 2, "{pings} pings in 4.5 s at a 1 s interval");
    // Already closed: its ping came at about 2 s, its close a tick later.
    let mute = mute.await.expect("the mute reader");
    assert_eq!(mute.close, Some(1008), "the mute socket: {mute:?}");
    assert!(mute.opcodes.contains(&0x9), "closed without a ping first: {mute:?}");
    assert_metric(&gw, "websocket_limited_total", &["limit=\"pong_timeout\""], 1.0).await;
    drop(ws);
    gw.stop().await;
}

// ---- who may open one ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_origin_is_refused_403_before_the_upgrade_and_an_allowed_one_passes() {
    let (_up, gw) = setup(|s| s.websocket.allow_origins = vec![APP.into()]).await;
    let (mut sse, url) = start_run(gw.addr, "/run/10", &[]).await;
    match connect_with(gw.addr, &url, &[("Origin", EVIL)], None).await {
        Err(WsError::Http(resp)) => {
            assert_eq!(resp.status(), 403);
            let body = String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned();
            assert!(body.contains("origin_refused"), "{body}");
        }
        Err(e) => panic!("refused otherwise than 403: {}", describe(&e)),
        Ok(_) => panic!("a socket from {EVIL} was upgraded"),
    }
    let mut ws = connect(gw.addr, &url, &[("Origin", APP)]).await;
    assert_whole_stream(&mut ws, &mut sse, &url, "the allowed origin's socket").await;
    assert_metric(&gw, "websocket_refused_total", &["reason=\"origin\""], 1.0).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_bound_to_authorization_is_read_with_the_auth_message_and_its_deadline_is_1008() {
    // A JWT's size: the credential message is read over several of the socket's 128-byte reads.
    let jwt = format!("eyJhbGciOiJSUzI1NiJ9.{}.{}", "a".repeat(700), "s".repeat(342));
    let auth = format!("Bearer {jwt}");
    let auth = auth.as_str();
    let (_up, gw) = setup(|s| s.websocket.auth_timeout_secs = 0.5).await;
    let (mut sse, url) = start_run(gw.addr, "/run/10", &[("Authorization", auth)]).await;
    let offer = [("Sec-WebSocket-Protocol", "sse-gateway.v1, sse-gateway.auth")];

    // The credential as the first message: the stream, whole.
    let mut ws = connect(gw.addr, &url, &offer).await;
    send_text(&mut ws, &format!(r#"{{"type":"auth","authorization":"{auth}"}}"#)).await;
    assert_whole_stream(&mut ws, &mut sse, &url, "the socket with the credential message").await;

    // Another credential, or none at all: no such stream for that binding.
    let mut wrong = connect(gw.addr, &url, &offer).await;
    send_text(&mut wrong, r#"{"type":"auth","authorization":"Bearer someone-else"}"#).await;
    assert_closed_with_nothing(&mut wrong, 4001).await;
    let mut bare = connect(gw.addr, &url, &[]).await;
    assert_closed_with_nothing(&mut bare, 4001).await;

    // The offer, then silence: closed for policy once auth_timeout_secs passed.
    let mut silent = connect(gw.addr, &url, &offer).await;
    assert_closed_with_nothing(&mut silent, 1008).await;
    assert_metric(&gw, "websocket_limited_total", &["limit=\"auth_timeout\""], 1.0).await;
    gw.stop().await;
}

// ---- misbehaving clients ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_a_handshake_is_dropped_by_the_header_timeout() {
    let (_up, gw) = setup(|s| s.server.header_read_timeout_secs = 0.5).await;
    let (_sse, url) = start_run(gw.addr, "/hold", &[]).await;
    let half = format!(
        "GET {url} HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Ver"
    );
    let mut s = raw(gw.addr, half.as_bytes()).await;
    let got = tokio::time::timeout(WAIT, read_to_eof(&mut s)).await;
    let Ok(Some(bytes)) = got else {
        panic!("the gateway kept a half-sent handshake open for {WAIT:?}")
    };
    assert!(
        !bytes.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    assert_eq!(metric_of(&gw, "sse_gateway_websocket_sockets", &[]).await, 0.0);
    let _ = s.shutdown().await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_binary_and_malformed_client_messages_close_1009_and_1003() {
    let (_up, gw) = setup(|s| s.websocket.max_message_bytes = 64).await;
    let (_sse, url) = start_run(gw.addr, "/hold", &[]).await;

    // A ping is answered, and the socket goes on.
    let mut ws = connect(gw.addr, &url, &[]).await;
    send_text(&mut ws, r#"{"type":"ping"}"#).await;
    let got = read_until(&mut ws, WAIT, |g| g.msgs.iter().any(|m| m.kind() == "pong")).await;
    assert!(got.msgs.iter().any(|m| m.kind() == "pong"), "{}", got.ending());

    let cases: [(&str, Message, u16); 4] = [
        (
            "a text message over max_message_bytes",
            Message::Text("x".repeat(200).into()),
            1009,
        ),
        ("a binary message", Message::Binary(vec![1, 2, 3].into()), 1003),
        (
            "a text message that is not JSON",
            Message::Text("cancel please".into()),
            1003,
        ),
        (
            "an unknown message type",
            Message::Text(r#"{"type":"subscribe"}"#.into()),
            1003,
        ),
    ];
    for (what, msg, code) in cases {
        let mut ws = connect(gw.addr, &url, &[]).await;
        let _ = ws.send(msg).await;
        let got = read_to_close(&mut ws, WAIT).await;
        assert_eq!(got.close, Some(code), "{what}: {}", got.ending());
    }
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "sse_gateway_websocket_closes_total", &["code=\"1009\""]),
        1.0
    );
    assert_eq!(
        metric(&m, "sse_gateway_websocket_closes_total", &["code=\"1003\""]),
        3.0
    );
    gw.stop().await;
}

// ---- the protocol (RFC 6455), with hand-written frames ----

/// A raw socket on a run that never ends (`/hold`) of `gw`.
async fn raw_on_hold(gw: &TestGateway) -> (Client, tokio::net::TcpStream) {
    let (sse, url) = start_run(gw.addr, "/hold", &[]).await;
    let tcp = raw_socket(gw.addr, &url, &[], None).await.expect("a socket");
    (sse, tcp)
}

/// Sends `bytes` on a raw socket and reads what the gateway answers until it closes the connection.
async fn answer_to(tcp: &mut tokio::net::TcpStream, bytes: &[u8]) -> RawEnd {
    tcp.write_all(bytes).await.expect("write");
    raw_read(tcp, WAIT, |_| false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_close_frame_gets_a_close_frame_back_and_an_invalid_code_gets_1002() {
    let (_up, gw) = setup(|_| {}).await;
    let cases: [(&str, Vec<u8>, u16); 5] = [
        ("a normal close", client_close(1000), 1000),
        ("going away", client_close(1001), 1001),
        ("1005, which is never sent", client_close(1005), 1002),
        ("999, below the codes", client_close(999), 1002),
        ("a one-byte close payload", client_frame(0x88, &[3], true), 1002),
    ];
    for (what, frame, want) in cases {
        let (_sse, mut tcp) = raw_on_hold(&gw).await;
        let end = answer_to(&mut tcp, &frame).await;
        assert_eq!(
            (end.close, end.ended, end.timed_out),
            (Some(want), true, false),
            "{what}: {end:?}"
        );
    }
    // A library client sees a clean close: its close answered before the TCP close.
    let (_sse, url) = start_run(gw.addr, "/hold", &[]).await;
    let mut ws = connect(gw.addr, &url, &[]).await;
    ws.close(None).await.expect("close sent");
    let got = read_to_close(&mut ws, WAIT).await;
    assert_eq!(
        (got.close, got.dropped.as_deref()),
        (Some(1005), Some("EOF")),
        "{}",
        got.ending()
    );
    gw.stop().await;
}

/// A client's ping mid-run is answered with its payload (tungstenite's pong, written through the socket's one
/// byte queue), and the socket stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_ping_mid_run_gets_its_pong_and_the_socket_stays_open() {
    let (_up, gw) = setup(|_| {}).await;
    let (_sse, mut tcp) = raw_on_hold(&gw).await;
    for payload in [&b"first"[..], b"second"] {
        tcp.write_all(&client_frame(0x89, payload, true)).await.expect("write");
        let end = raw_read(&mut tcp, WAIT, |e| !e.pongs.is_empty()).await;
        assert_eq!(end.pongs, [payload.to_vec()], "{end:?}");
        assert_eq!((end.close, end.ended, end.timed_out), (None, false, false), "{end:?}");
    }
    drop(tcp);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_errors_close_1002_and_invalid_utf8_closes_1007() {
    let (_up, gw) = setup(|_| {}).await;
    let ping = |n: usize| vec![b'p'; n];
    let text = br#"{"type":"ping"}"#;
    // Masked frames one after the other: (first byte, payload) each.
    let frames = |each: &[(u8, &[u8])]| {
        each.iter()
            .flat_map(|&(first, p)| client_frame(first, p, true))
            .collect()
    };
    let masked = |first: u8, payload: &[u8]| frames(&[(first, payload)]);
    let cases: [(&str, Vec<u8>, u16); 10] = [
        ("an unmasked frame", client_frame(0x81, text, false), 1002),
        ("a reserved bit", masked(0x81 | 0x40, text), 1002),
        ("a reserved data opcode", masked(0x83, b"x"), 1002),
        ("a reserved control opcode", masked(0x8B, b"x"), 1002),
        ("a ping over 125 bytes", masked(0x89, &ping(126)), 1002),
        ("a fragmented ping", masked(0x09, &ping(4)), 1002),
        ("a continuation with nothing to continue", masked(0x80, b"x"), 1002),
        (
            "a new message inside a fragmented one",
            frames(&[(0x01, b"{\"type\""), (0x81, b"x")]),
            1002,
        ),
        (
            "invalid UTF-8 in a text frame",
            masked(0x81, b"{\"type\":\"\xff\xfe\"}"),
            1007,
        ),
        (
            "invalid UTF-8 across fragments",
            frames(&[(0x01, b"{\"a\":\"\xe2\x82"), (0x80, b"\x28\"}")]),
            1007,
        ),
    ];
    for (what, frame, want) in cases {
        let (_sse, mut tcp) = raw_on_hold(&gw).await;
        let end = answer_to(&mut tcp, &frame).await;
        assert_eq!((end.close, end.timed_out), (Some(want), false), "{what}: {end:?}");
    }
    let m = gw.metrics().await;
    for (code, closes) in [(1002, 8.0), (1007, 2.0), (1008, 0.0)] {
        let label = format!("code=\"{code}\"");
        let got = metric(&m, "sse_gateway_websocket_closes_total", &[&label]);
        assert_eq!(got, closes, "closes with {code}");
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_version_is_told_version_13_and_an_http_1_0_upgrade_is_refused() {
    let (_up, gw) = setup(|_| {}).await;
    let (_sse, url) = start_run(gw.addr, "/hold", &[]).await;
    let answer = raw_socket(gw.addr, &url, &["Sec-WebSocket-Version: 8"], None)
        .await
        .expect_err("version 8 was upgraded");
    let head = answer.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 400"), "{answer}");
    assert!(head.contains("\r\nsec-websocket-version: 13\r\n"), "{answer}");

    // HTTP/1.0 has no Upgrade (RFC 6455 §4.1 asks for HTTP/1.1 or later).
    let req = format!(
        "GET {url} HTTP/1.0\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    let mut s = raw(gw.addr, req.as_bytes()).await;
    let got = tokio::time::timeout(WAIT, read_to_eof(&mut s)).await;
    let Ok(Some(bytes)) = got else {
        panic!("no answer to an HTTP/1.0 upgrade")
    };
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.starts_with("HTTP/1.1 400") || text.starts_with("HTTP/1.0 400"),
        "{text}"
    );
    assert_eq!(metric_of(&gw, "sse_gateway_websocket_sockets", &[]).await, 0.0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_ping_before_the_auth_message_is_answered_and_not_taken_for_it() {
    const AUTH: &str = "Bearer user-1";
    let (_up, gw) = setup(|_| {}).await;
    let (mut sse, url) = start_run(gw.addr, "/run/10", &[("Authorization", AUTH)]).await;
    let offer = [("Sec-WebSocket-Protocol", "sse-gateway.v1, sse-gateway.auth")];
    let mut ws = connect(gw.addr, &url, &offer).await;
    ws.send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .expect("ping");
    let pong = tokio::time::timeout(WAIT, async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Pong(p))) => return Ok(p),
                Some(Ok(_)) => {}
                other => return Err(format!("{other:?}")),
            }
        }
    })
    .await
    .expect("a pong in time");
    assert_eq!(pong.as_deref(), Ok(&b"are you there"[..]));
    send_text(&mut ws, &format!(r#"{{"type":"auth","authorization":"{AUTH}"}}"#)).await;
    assert_whole_stream(&mut ws, &mut sse, &url, "the socket that pinged before its credential").await;
    gw.stop().await;
}

// ---- backpressure ----

/// Deltas of the slow readers' run: about 8 MB, more than the kernel's socket buffers hold (tcp_wmem's 4 MiB
/// ceiling and a 4 KiB receive buffer), so that the gateway's writes stay pending while the client reads nothing.
const BIG: usize = 8000;

/// Settings where a stream of [`BIG`] deltas is held whole.
fn hold_big(s: &mut Settings) {
    s.resume.buffer_bytes = 32 << 20;
}

/// A gateway with `websocket.max_queued_bytes = max_queued` holding a big run, the run's SSE reader, and a
/// socket on it whose receive buffer is 4 KiB (it reads only when the test says).
async fn big_run_with_slow_socket(max_queued: usize) -> (Emulator, TestGateway, Client, String, harness::ws::Ws) {
    let (up, gw) = setup(|s| {
        hold_big(s);
        s.websocket.max_queued_bytes = max_queued;
    })
    .await;
    let (sse, url) = start_run(gw.addr, &format!("/big/{BIG}"), &[]).await;
    let (ws, _) = connect_with(gw.addr, &url, &[], Some(4096))
        .await
        .expect("a socket with a small receive buffer");
    (up, gw, sse, url, ws)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_what_queued_as_batches_and_loses_nothing() {
    let (_up, gw, mut sse, url, mut ws) = big_run_with_slow_socket(16 << 20).await;
    // The socket reads nothing until the run ended and the SSE reader has it all.
    sse.read_to_end(Duration::from_secs(30))
        .await
        .expect("the SSE reader's end");
    let batches_meanwhile = metric_of(&gw, "sse_gateway_websocket_batches_total", &[]).await;
    let got = read_to_close(&mut ws, Duration::from_secs(30)).await;
    assert_eq!(got.close, Some(1000), "{}", got.ending());
    assert!(
        got.batches >= 1 && got.msgs.iter().any(|m| m.batched),
        "no batch: {}",
        got.ending()
    );
    assert_same_stream(&got, &sse_events(&sse.body), token_of(&url), "the slow reader");
    let batches = metric_of(&gw, "sse_gateway_websocket_batches_total", &[]).await;
    assert!(
        batches >= 1.0 && batches >= batches_meanwhile,
        "websocket_batches_total {batches}"
    );
    assert!(
        metric_of(&gw, "sse_gateway_websocket_batched_messages_total", &[]).await
            >= got.msgs.iter().filter(|m| m.batched).count() as f64
    );
    gw.stop().await;
}

/// The socket polls its streams before the drain and the client's messages (issue 38: one poll an event), but not
/// for ever: a socket catching up on a long held run, whose next frame is always ready, still hears the drain
/// within a few frames (`FAIR_TURN`) and closes 1001 long before the run's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_catching_up_on_a_long_held_run_still_hears_the_drain() {
    const LONG: usize = 24_000;
    let (_up, gw) = setup(|s| {
        s.resume.buffer_bytes = 64 << 20;
        s.resume.max_total_bytes = 128 << 20;
    })
    .await;
    let (mut sse, url) = start_run(gw.addr, &format!("/big/{LONG}"), &[]).await;
    sse.read_to_end(Duration::from_secs(30))
        .await
        .expect("the SSE reader's end");
    let mut ws = connect(gw.addr, &url, &[]).await;
    let first = read_until(&mut ws, WAIT, |g| !g.events().is_empty()).await;
    assert!(!first.events().is_empty(), "{}", first.ending());
    let stopping = tokio::spawn(gw.stop());
    let got = read_to_close(&mut ws, Duration::from_secs(30)).await;
    let read = first.events().len() + got.events().len();
    assert_eq!(got.close, Some(1001), "read {read} events: {}", got.ending());
    assert!(
        read < LONG,
        "the whole run was read ({read} events) before the drain was heard"
    );
    let _ = stopping.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_closed_past_max_queued_bytes_and_the_gateway_stays_healthy() {
    let (_up, gw, mut sse, url, mut stuck) = big_run_with_slow_socket(4096).await;
    let closed = wait_metric(&gw, "sse_gateway_websocket_closes_total", &["code=\"4003\""], |v| {
        v >= 1.0
    })
    .await;
    assert_eq!(closed, 1.0, "the socket that reads nothing was not closed as behind");
    assert_metric(&gw, "websocket_limited_total", &["limit=\"queue_full\""], 1.0).await;
    // What the client finds once it reads, even a while after the gateway gave up on it: part of the stream, then
    // 4003 (the close frame waits behind what the socket could not take, past the queue's bound).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = read_to_close(&mut stuck, WAIT).await;
    assert!(!got.timed_out, "{}", got.ending());
    assert_eq!(got.close, Some(4003), "{}", got.ending());
    assert!(got.events().len() < BIG, "{}", got.ending());
    assert_eq!(id_gaps(&got.ids(), token_of(&url), 1), None);

    // The run and the gateway went on: the SSE reader got it all, and a new socket reads a new run whole.
    sse.read_to_end(Duration::from_secs(30))
        .await
        .expect("the SSE reader's end");
    assert!(sse_events(&sse.body).len() > BIG);
    let (mut sse2, url2) = start_run(gw.addr, "/run/10", &[]).await;
    let mut ws = connect(gw.addr, &url2, &[]).await;
    assert_whole_stream(&mut ws, &mut sse2, &url2, "a socket after the stuck one").await;
    assert_eq!(
        wait_metric(&gw, "sse_gateway_websocket_sockets", &[], |v| v == 0.0).await,
        0.0
    );
    gw.stop().await;
}

/// Pings of 125 bytes (the most a control frame carries), masked as a client sends them, `n` in a row.
fn pings(n: usize) -> Vec<u8> {
    client_frame(0x89, &[b'p'; 125], true).repeat(n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_floods_pings_and_reads_nothing_is_closed_4003_and_the_gateway_stays_small() {
    // The gateway as its own process, so that its resident memory is its own.
    const FLOOD: usize = 64 << 20;
    const MAX_QUEUED: usize = 256 << 10;
    let up = upstream().await;
    let gw = Process::against(
        &up.url(),
        &[("SSE_GATEWAY__WEBSOCKET__MAX_QUEUED_BYTES", &MAX_QUEUED.to_string())],
    );
    let (_sse, url) = start_run(gw.addr, "/hold", &[]).await;
    // A receive window of 4 KiB that the client never reads: the pongs owed to it stay with the gateway.
    let mut tcp = raw_socket(gw.addr, &url, &[], Some(4096)).await.expect("a socket");
    let before = gw.rss_kib();
    let rss = RssSampler::start(gw.pid(), Duration::from_millis(5));
    let chunk = pings(8192);
    let mut sent = 0;
    let mut stopped = None;
    while sent < FLOOD {
        match tokio::time::timeout(WAIT, tcp.write_all(&chunk)).await {
            Ok(Ok(())) => sent += chunk.len(),
            Ok(Err(e)) => {
                stopped = Some(e.to_string());
                break;
            }
            Err(_) => {
                stopped = Some(format!("a write blocked for {WAIT:?}"));
                break;
            }
        }
    }
    let closes = ("sse_gateway_websocket_closes_total", ["code=\"4003\""]);
    let deadline = Instant::now() + WAIT;
    while gw.metric(closes.0, &closes.1).await < 1.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let peak = rss.stop();
    let grew_mib = peak.saturating_sub(before) as f64 / 1024.0;
    eprintln!(
        "{} MiB of pings sent ({stopped:?}); the gateway grew {grew_mib:.1} MiB",
        sent >> 20
    );
    assert_eq!(
        gw.metric(closes.0, &closes.1).await,
        1.0,
        "the flooding socket was not closed as behind\n{}",
        gw.log_tail()
    );
    assert_eq!(
        gw.metric("sse_gateway_websocket_limited_total", &["limit=\"queue_full\""])
            .await,
        1.0
    );
    // Without the bound, the pongs owed grow the gateway about one byte per byte sent (64 MiB here).
    assert!(
        grew_mib < 16.0,
        "the gateway grew {grew_mib:.1} MiB under {} MiB of pings",
        sent >> 20
    );
}

// ---- many sockets ----

/// Idle sockets held open at once: two per socket of this process's descriptors (client and gateway side).
const IDLE: usize = 2000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_sockets_are_all_served_and_counted() {
    let (_lim, _) = rlimit::getrlimit(rlimit::Resource::NOFILE).expect("getrlimit");
    let want = (IDLE as u64) * 2 + 512;
    if rlimit::increase_nofile_limit(want).unwrap_or(0) < want {
        panic!(
            "this process may open {} descriptors, fewer than {want}",
            rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap().0
        );
    }
    let (mut up, gw) = setup(|s| {
        s.resume.max_watchers_per_stream = IDLE + 16;
        s.websocket.max_sockets = IDLE + 16;
    })
    .await;
    let (_sse, url) = start_run(gw.addr, "/hold", &[]).await;
    let started = Instant::now();
    let mut readers = tokio::task::JoinSet::new();
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..IDLE {
        let mut ws = connect(gw.addr, &url, &[]).await;
        let first_tx = first_tx.clone();
        readers.spawn(async move {
            // Served at once: the held events; then idle until the run ends.
            let early = read_until(&mut ws, WAIT, |g| !g.events().is_empty()).await;
            let _ = first_tx.send(i);
            let rest = read_to_close(&mut ws, Duration::from_secs(40)).await;
            (early, rest)
        });
    }
    drop(first_tx);
    let mut served = 0;
    while served < IDLE {
        match tokio::time::timeout(WAIT, first_rx.recv()).await {
            Ok(Some(_)) => served += 1,
            _ => break,
        }
    }
    assert_eq!(served, IDLE, "sockets that got the held events");
    assert_eq!(
        metric_of(&gw, "sse_gateway_websocket_sockets", &["kind=\"stream\""]).await,
        IDLE as f64
    );
    // All of them still served: the run's cancellation reaches every one.
    let token = token_of(&url).to_owned();
    let (parts, _) = send("DELETE", &gw.url(&url), &[], bytes::Bytes::new()).await;
    assert_eq!(parts.status, 204);
    assert!(tokio::time::timeout(WAIT, up.closed.recv()).await.is_ok());
    let mut codes = std::collections::BTreeMap::new();
    while let Some(r) = readers.join_next().await {
        let (early, rest) = r.expect("reader task");
        assert_eq!(early.events()[0].id(), Some(format!("sg1-{token}-1").as_str()));
        *codes.entry(rest.close).or_insert(0) += 1;
    }
    assert_eq!(
        codes,
        [(Some(4002), IDLE)].into_iter().collect(),
        "close codes of the idle sockets"
    );
    assert_eq!(
        wait_metric(&gw, "sse_gateway_websocket_sockets", &[], |v| v == 0.0).await,
        0.0
    );
    eprintln!("{IDLE} sockets opened, served and closed in {:?}", started.elapsed());
    gw.stop().await;
}

// ---- the session ----

/// Reads a session socket until `streams` streams ended on it (bounded).
async fn read_session(ws: &mut harness::ws::Ws, streams: usize) -> Got {
    read_until(ws, WAIT, |g| {
        g.msgs.iter().filter(|m| m.kind() == "stream_end").count() >= streams
    })
    .await
}

/// What the session got of stream `token`: `stream_start` first, its events with ids from 1 byte-equal to the
/// SSE reader's, `stream_end` `completed` last.
fn assert_session_carried(got: &Got, token: &str, sse: &[(String, String)]) {
    let of: Vec<&harness::ws::Msg> = got
        .msgs
        .iter()
        .filter(|m| m.value["stream"].as_str() == Some(token))
        .collect();
    let kinds: Vec<&str> = of.iter().map(|m| m.kind()).collect();
    assert!(
        kinds.first() == Some(&"stream_start") && kinds.last() == Some(&"stream_end"),
        "stream {token} on the session: {kinds:?} ({})",
        got.ending()
    );
    assert_eq!(of[0].value["url"], format!("/_gateway/streams/{token}"));
    assert_eq!(of.last().map(|m| m.value["outcome"].clone()), Some("completed".into()));
    let only = Got {
        msgs: of.into_iter().cloned().collect(),
        ..Got::default()
    };
    assert_same_stream(&only, sse, token, "a stream on the session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_carries_the_bindings_new_streams_with_start_and_end_and_no_other() {
    let (_up, gw) = setup(|_| {}).await;
    let mine = [("Cookie", "sid=user-1")];
    let mut session = connect(gw.addr, "/_gateway/streams", &mine).await;
    let (mut a, url_a) = start_run(gw.addr, "/run/12/a", &mine).await;
    let (mut other, url_o) = start_run(gw.addr, "/run/12/o", &[("Cookie", "sid=user-2")]).await;
    let (mut b, url_b) = start_run(gw.addr, "/run/12/b", &mine).await;
    let got = read_session(&mut session, 2).await;
    for c in [&mut a, &mut b, &mut other] {
        c.read_to_end(WAIT).await.expect("a run's end");
    }
    assert!(got.close.is_none(), "the session closed: {}", got.ending());
    assert_session_carried(&got, token_of(&url_a), &sse_events(&a.body));
    assert_session_carried(&got, token_of(&url_b), &sse_events(&b.body));
    let foreign = token_of(&url_o);
    assert!(
        !got.msgs.iter().any(|m| m.value["stream"].as_str() == Some(foreign)),
        "the session carried another binding's stream"
    );
    gw.stop().await;
}

// ---- two instances on one Redis ----

const KEY: &str = "websocket-instances-test-binding-key-0123456789";

/// Two gateways sharing `redis`.
async fn two_instances(redis: &RedisServer, up: &Emulator) -> (TestGateway, TestGateway) {
    let shared = |s: &mut Settings| {
        s.resume.store = StoreKind::Redis;
        s.resume.redis_url = redis.url();
        s.resume.binding_key = KEY.into();
    };
    (
        TestGateway::start(&up.url(), shared).await,
        TestGateway::start(&up.url(), shared).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_on_instance_b_reads_a_stream_that_a_holds() {
    let Some(redis) = RedisServer::start() else { return };
    let up = upstream().await;
    let (a, b) = two_instances(&redis, &up).await;
    let (mut sse, url) = start_run(a.addr, "/run/40", &[]).await;
    redis.wait_visible(token_of(&url), WAIT).await;
    let mut ws = connect(b.addr, &url, &[]).await;
    assert_whole_stream(&mut ws, &mut sse, &url, "a socket on B").await;
    assert_eq!(up.recorded().len(), 1, "the run went upstream once");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_instance_b_sees_a_stream_started_on_a() {
    let Some(redis) = RedisServer::start() else { return };
    let up = upstream().await;
    let (a, b) = two_instances(&redis, &up).await;
    let mine = [("Cookie", "sid=user-1")];
    let mut session = connect(b.addr, "/_gateway/streams", &mine).await;
    let (mut sse, url) = start_run(a.addr, "/run/20", &mine).await;
    let got = read_session(&mut session, 1).await;
    sse.read_to_end(WAIT).await.expect("the SSE reader's end on A");
    assert_session_carried(&got, token_of(&url), &sse_events(&sse.body));
    a.stop().await;
    b.stop().await;
}
