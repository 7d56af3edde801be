//! Issue 13, the client edge: request body timeouts, idle client connections, clients that leave with
//! pipelined bytes unread, upstream failures in the same read as data, `Content-Length` beside
//! `Transfer-Encoding`, and client faults kept out of the upstream error counts.

mod harness;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use harness::prelude::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bound on "closed promptly": far above the configured timeouts (1 s), far below the defaults the old code
/// fell back on (15 s keepalives, 60 s timeouts).
const PROMPTLY: Duration = Duration::from_secs(8);

fn client_errors(m: &str, kind: &str) -> f64 {
    metric(m, "sse_gateway_client_errors_total", &[&format!("kind=\"{kind}\"")])
}

fn upstream_errors(m: &str) -> f64 {
    metric(m, "sse_gateway_upstream_errors_total", &[])
}

/// The status code of a raw HTTP/1.1 response.
fn status_of(resp: &[u8]) -> Option<u16> {
    let line = resp.split(|&b| b == b'\r').next()?;
    std::str::from_utf8(line).ok()?.split(' ').nth(1)?.parse().ok()
}

/// The body of a raw response that carries `Content-Length` (the gateway's own error bodies do).
fn json_body(resp: &[u8]) -> serde_json::Value {
    let at = find(resp, b"\r\n\r\n").expect("a complete head") + 4;
    serde_json::from_slice(&resp[at..]).unwrap_or_else(|e| panic!("not a JSON body ({e}): {:?}", &resp[at..]))
}

/// The upstream's answer when its content does not matter: a 200 with a two-byte body.
fn small_answer() -> Vec<Step> {
    vec![
        Step::head(200, &[("Content-Length", "2")], false),
        Step::WriteAll(b"ok".to_vec()),
    ]
}

/// Reads a raw response to its end within [`PROMPTLY`]; `what` names the wait.
async fn answered(s: &mut TcpStream, what: &str) -> Vec<u8> {
    tokio::time::timeout(PROMPTLY, read_to_eof(s))
        .await
        .expect(what)
        .expect("read")
}

/// The request was the client's fault: `n` client errors of `kind`, and no upstream error.
async fn assert_client_fault(gw: &TestGateway, kind: &str, n: f64, why: &str) {
    let m = gw.metrics().await;
    assert_eq!(client_errors(&m, kind), n, "{why}");
    assert_eq!(upstream_errors(&m), 0.0, "{why}: not the upstream's");
}

/// An HTTP/2-only client.
fn h2_client() -> hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>()
}

/// An empty GET of `path` on the gateway.
fn empty_get(gw: &TestGateway, path: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(gw.url(path))
        .body(Full::new(Bytes::new()))
        .expect("request")
}

/// Awaits a fallible step within [`PATIENCE`]: `late` if it takes longer, `failed` if it fails.
async fn in_time<T, E: std::fmt::Debug>(
    step: impl std::future::Future<Output = Result<T, E>>,
    late: &str,
    failed: &str,
) -> T {
    tokio::time::timeout(PATIENCE, step).await.expect(late).expect(failed)
}

/// Reads from `s` until `done` holds for all that has come, each read within `within`; `what` names the wait.
async fn read_until(s: &mut TcpStream, within: Duration, done: impl Fn(&[u8]) -> bool, what: &str) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !done(&seen) {
        let n = tokio::time::timeout(within, s.read(&mut buf))
            .await
            .expect(what)
            .expect("read");
        assert!(n > 0, "{what}: closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    seen
}

/// Sends the raw `request` and asserts that its answer, read to the end, has status `want`; `name` names the case.
async fn assert_raw_status(addr: SocketAddr, request: &[u8], want: u16, name: &str) {
    let mut s = raw(addr, request).await;
    let resp = read_to_eof(&mut s).await.expect("answered");
    assert_eq!(
        status_of(&resp),
        Some(want),
        "{name}: {}",
        String::from_utf8_lossy(&resp)
    );
}

async fn gateway(up: &str, body_timeout: f64) -> TestGateway {
    TestGateway::start(up, |s| {
        s.server.body_read_timeout_secs = body_timeout;
        // Well above the body timeout: a 504 here would mean the stalled body was blamed on the upstream.
        s.upstream.response_timeout_secs = 30.0;
    })
    .await
}

// ------------------------------------------------------------------------------------------------------------
// 2 and 7: request bodies that stall or break are the client's fault: 408 / 400, counted as client errors.
// ------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_that_stalls_after_one_byte_gets_408_without_contacting_the_upstream() {
    let up = stalled_body_gets_408(
        Emulator::sse(vec![Step::EndChunks]).await,
        b"POST /agent/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
        "the stalled connection is answered and closed",
    )
    .await;
    assert!(up.recorded().is_empty(), "the upstream was contacted");
}

/// Sends `request`, whose body stalls, to a gateway in front of `up` with a 1 s body timeout: it must be answered
/// within [`PROMPTLY`] with 408 `request_body_timeout` and counted as the client's fault, not the upstream's.
/// Returns `up` for the caller's own checks.
async fn stalled_body_gets_408(up: Emulator, request: &[u8], why: &str) -> Emulator {
    let gw = gateway(&up.url(), 1.0).await;
    let mut s = raw(gw.addr, request).await;
    let resp = answered(&mut s, why).await;
    assert_eq!(status_of(&resp), Some(408), "{}", String::from_utf8_lossy(&resp));
    assert_eq!(json_body(&resp)["error"], "request_body_timeout");
    assert_client_fault(&gw, "body_timeout", 1.0, "a stalled client is not an upstream timeout").await;
    gw.stop().await;
    up
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_stalls_past_the_response_timeout_is_the_clients_408_not_an_upstream_504() {
    // The upstream waits for the whole body before it answers; the client stalls mid-body for longer than
    // upstream.response_timeout_secs (1 s) but within server.body_read_timeout_secs (30 s).
    let up = Emulator::sse(vec![Step::EndChunks]).await;
    let gw = TestGateway::start(&up.url(), |s| {
        s.server.body_read_timeout_secs = 30.0;
        s.upstream.response_timeout_secs = 1.0;
    })
    .await;
    let mut s = raw(
        gw.addr,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 100\r\n\r\n0123456789",
    )
    .await;
    let resp = answered(&mut s, "answered at the response timeout").await;
    assert_eq!(status_of(&resp), Some(408), "{}", String::from_utf8_lossy(&resp));
    assert_eq!(json_body(&resp)["error"], "request_body_timeout");
    assert_client_fault(&gw, "body_timeout", 1.0, "the upstream waited for the client's body").await;
    gw.stop().await;
}

/// A request body that sends what is put in its channel, never ending while the sender lives.
struct Stalling(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for Stalling {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.get_mut().0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// A body that sends `first` and then nothing; it stays open while the returned sender lives.
fn stalling_body(first: &'static [u8]) -> (Stalling, tokio::sync::mpsc::Sender<Bytes>) {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.try_send(Bytes::from_static(first));
    (Stalling(rx), tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_that_stalls_on_http2_gets_408() {
    let up = Emulator::sse(vec![Step::EndChunks]).await;
    let gw = gateway(&up.url(), 1.0).await;
    let (body, _keep_open) = stalling_body(b"{");
    let stream = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
        .await
        .expect("h2 handshake");
    tokio::spawn(conn);
    let req = http::Request::post(gw.url("/agent/run"))
        .header("content-type", "application/json")
        .header("content-length", "100")
        .body(body)
        .expect("request");
    let resp = tokio::time::timeout(PROMPTLY, sender.send_request(req))
        .await
        .expect("answered while the body stalls")
        .expect("response");
    assert_eq!(resp.status(), 408);
    assert!(up.recorded().is_empty(), "the upstream was contacted");
    assert_client_fault(&gw, "body_timeout", 1.0, "a stalled HTTP/2 body").await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_that_stalls_mid_way_gets_408_not_504() {
    stalled_body_gets_408(
        Emulator::start(|_| small_answer()).await,
        b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n0123456789",
        "the stalled request is answered and closed",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_chunked_body_gets_400_and_is_not_an_upstream_error() {
    let up = Emulator::start(|_| small_answer()).await;
    let gw = gateway(&up.url(), 10.0).await;
    for (path, extra) in [("/upload", ""), ("/stream", "Accept: text/event-stream\r\n")] {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Type: application/octet-stream\r\n\
             Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ-not-a-size\r\n"
        );
        let mut s = raw(gw.addr, req.as_bytes()).await;
        let resp = answered(&mut s, "answered and closed").await;
        assert_eq!(
            status_of(&resp),
            Some(400),
            "{path}: {}",
            String::from_utf8_lossy(&resp)
        );
        assert_eq!(json_body(&resp)["error"], "bad_request_body", "{path}");
    }
    assert_client_fault(
        &gw,
        "bad_body",
        2.0,
        "a client's bad body is not an upstream protocol error",
    )
    .await;
    gw.stop().await;
}

/// An upstream that answers an event stream at once, before the request body has ended, and keeps reading it.
async fn answers_before_the_body_ends() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
                let event = b"data: <content-block-text>\n\n";
                let chunk = format!("{:x}\r\n", event.len());
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(chunk.as_bytes()).await;
                let _ = s.write_all(event).await;
                let _ = s.write_all(b"\r\n").await;
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_body_that_breaks_after_the_response_began_is_the_clients_fault() {
    let up = answers_before_the_body_ends().await;
    let gw = gateway(&format!("http://{up}"), 10.0).await;
    for (path, extra) in [("/upload", ""), ("/stream", "Accept: text/event-stream\r\n")] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\n{extra}Content-Type: application/octet-stream\r\n\
             Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
        );
        let mut s = raw(gw.addr, head.as_bytes()).await;
        // The response has begun before the body breaks.
        let began = |seen: &[u8]| String::from_utf8_lossy(seen).contains("200");
        read_until(&mut s, PROMPTLY, began, &format!("{path}: the response began")).await;
        s.write_all(b"ZZ-not-a-size\r\n").await.expect("write");
        let _ = tokio::time::timeout(PROMPTLY, read_to_eof(&mut s)).await;
    }
    let deadline = tokio::time::Instant::now() + PROMPTLY;
    let mut m = gw.metrics().await;
    while client_errors(&m, "bad_body") < 2.0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        m = gw.metrics().await;
    }
    assert_eq!(
        client_errors(&m, "bad_body"),
        2.0,
        "both broken exchanges are the client's"
    );
    assert_eq!(upstream_errors(&m), 0.0, "and none is the upstream's");
    gw.stop().await;
}

// ------------------------------------------------------------------------------------------------------------
// 3: idle client connections are closed; open streams are not.
// ------------------------------------------------------------------------------------------------------------

async fn idle_gateway(up: &str) -> TestGateway {
    TestGateway::start(up, |s| {
        s.server.idle_timeout_secs = 1.0;
        // Far above the idle timeout, so that it is not what closes a kept-alive HTTP/1.1 connection.
        s.server.header_read_timeout_secs = 60.0;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout() {
    let up = Emulator::start(|_| small_answer()).await;
    let gw = idle_gateway(&up.url()).await;
    let stream = TcpStream::connect(gw.addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        // The client answers the gateway's PINGs and sends its own: liveness is not activity.
        .keep_alive_interval(Duration::from_millis(300))
        .keep_alive_while_idle(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .handshake(TokioIo::new(stream))
        .await
        .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let resp = in_time(sender.send_request(empty_get(&gw, "/x")), "answered", "response").await;
    assert_eq!(resp.status(), 200);
    let _ = resp.into_body().collect().await;
    let ended = tokio::time::timeout(PROMPTLY, conn).await;
    assert!(
        ended.is_ok(),
        "the idle HTTP/2 connection is still open {PROMPTLY:?} later"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http1_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let up = Emulator::start(|_| small_answer()).await;
    let gw = idle_gateway(&up.url()).await;
    let mut s = raw(gw.addr, b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let got = answered(&mut s, "the idle keep-alive connection is still open").await;
    assert_eq!(status_of(&got), Some(200), "{}", String::from_utf8_lossy(&got));
    gw.stop().await;
}

fn slow_stream() -> Vec<Step> {
    let mut steps = vec![sse_head(), Step::WriteAll(b"data: <content-block-text>\n\n".to_vec())];
    for i in 0..3 {
        steps.push(Step::Pause(Duration::from_millis(1200)));
        steps.push(Step::WriteAll(format!("data: part {i}\n\n").into_bytes()));
    }
    steps.push(Step::WriteAll(
        b"data: </content-block-text>\n\ndata: [DONE]\n\n".to_vec(),
    ));
    steps.push(Step::EndChunks);
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_open_longer_than_the_idle_timeout_are_not_cut_on_http1_or_http2() {
    let up = Emulator::start(|_| slow_stream()).await;
    let gw = TestGateway::start(&up.url(), |s| {
        s.server.idle_timeout_secs = 1.0;
        s.translate.keepalive_interval_secs = 0.0;
    })
    .await;
    let (parts, body) = send("POST", &gw.url("/agent/run"), &[("x-agent-id", "a")], "{}").await;
    assert_eq!(parts.status, 200);
    assert_eq!(
        envelopes(&body).last(),
        Some(&serde_json::json!("[DONE]")),
        "HTTP/1.1 stream cut"
    );
    let h2 = h2_client();
    let req = http::Request::post(gw.url("/agent/run"))
        .header("x-agent-id", "a")
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let resp = in_time(h2.request(req), "in time", "response").await;
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = in_time(resp.into_body().collect(), "in time", "the HTTP/2 stream ends cleanly")
        .await
        .to_bytes();
    assert_eq!(
        envelopes(&body).last(),
        Some(&serde_json::json!("[DONE]")),
        "HTTP/2 stream cut"
    );
    gw.stop().await;
}

// ------------------------------------------------------------------------------------------------------------
// 4: a client that leaves with pipelined bytes unread.
// ------------------------------------------------------------------------------------------------------------

async fn pipelined_client_leaves(first_request_headers: &str) {
    let mut up = Emulator::open_until_closed().await;
    // No grace period: a translated stream's upstream is then dropped with its client, as without resumption.
    let gw = TestGateway::start(&up.url(), |s| s.resume.grace_secs = 0.0).await;
    let two = format!(
        "GET /agent/run HTTP/1.1\r\nHost: x\r\n{first_request_headers}\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n"
    );
    let head_ok = |c: &Client| assert_eq!(c.status, 200, "{}", c.head);
    let who = "the pipelining client";
    assert_leaving_closes_upstream(&mut up, gw.addr, two.as_bytes(), head_ok, PROMPTLY, who).await;
    assert_eq!(up.recorded().len(), 1, "the second request must not go upstream");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelining_client_that_leaves_mid_translated_stream_drops_the_upstream() {
    pipelined_client_leaves("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelining_client_that_leaves_mid_pass_through_stream_drops_the_upstream() {
    pipelined_client_leaves("Accept: text/event-stream\r\nX-Stream-Format: legacy\r\n").await;
}

// ------------------------------------------------------------------------------------------------------------
// 5 and 6: a raw upstream that writes a whole response in one write.
// ------------------------------------------------------------------------------------------------------------

/// An upstream that answers every connection with `response`, written at once after the request head.
async fn raw_upstream(response: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let response = response.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while find(&head, b"\r\n\r\n").is_none() {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(&response).await;
                // Closing with the request's body possibly unread: a reset, as a crashing backend sends.
                let _ = s.set_zero_linger();
            });
        }
    });
    addr
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut c = format!("{:x}\r\n", data.len()).into_bytes();
    c.extend_from_slice(data);
    c.extend_from_slice(b"\r\n");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_on_a_dedicated_connection_delivers_the_head_and_complete_events_before_an_upstream_abort() {
    let events: &[&[u8]] = &[b"data: one\n\n", b"data: two\n\n", b"data: three\n\n"];
    let mut response =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for e in events {
        response.extend_from_slice(&chunk(e));
    }
    response.extend_from_slice(b"ZZ-not-a-chunk-size\r\n");
    let up = raw_upstream(response).await;
    let gw = TestGateway::start(&format!("http://{up}"), |_| {}).await;
    let want: Vec<u8> = events.concat();
    let mut failures = Vec::new();
    for i in 0..20 {
        let mut s = raw(
            gw.addr,
            b"GET /events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nX-Stream-Format: legacy\r\n\r\n",
        )
        .await;
        let got = read_to_eof(&mut s).await.expect("the aborted response is closed");
        let whole = find(&got, b"\r\n\r\n").map(|at| dechunk_partial(&got[at + 4..]));
        if status_of(&got) != Some(200) || whole.as_deref() != Some(&want[..]) {
            failures.push(format!("run {i}: {:?}", String::from_utf8_lossy(&got)));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 20 runs lost the head or events:\n{}",
        failures.len(),
        failures.join("\n")
    );
    gw.stop().await;
}

/// The complete chunks of a chunked body that was cut (no last chunk).
fn dechunk_partial(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = find(b, b"\r\n") {
        let Some(n) = std::str::from_utf8(&b[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s, 16).ok())
        else {
            break;
        };
        if n == 0 || b.len() < eol + 2 + n + 2 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_response_with_content_length_and_chunked_encoding_is_not_truncated() {
    let body: Vec<u8> = (0..256u32).map(|i| b'a' + (i % 26) as u8).collect();
    let mut response = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 5\r\n\
Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        .to_vec();
    response.extend_from_slice(&chunk(&body));
    response.extend_from_slice(b"0\r\n\r\n");
    let up = raw_upstream(response).await;
    let gw = TestGateway::start(&format!("http://{up}"), |_| {}).await;
    for accept in ["*/*", "text/event-stream"] {
        let (parts, got) = send("GET", &gw.url("/file"), &[("accept", accept)], Bytes::new()).await;
        assert_eq!(parts.status, 200, "{accept}");
        assert_ne!(
            parts.headers.get("content-length").map(|v| v.as_bytes()),
            Some(&b"5"[..]),
            "{accept}: the conflicting Content-Length was passed on"
        );
        assert_eq!(got, body, "{accept}: body");
    }
    gw.stop().await;
}

// ------------------------------------------------------------------------------------------------------------
// Lower-priority items: a GET's chunked body, Host header count, an unsolicited 101.
// ------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_with_a_chunked_body_forwards_the_body() {
    let up = Emulator::start(|_| small_answer()).await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let req = b"GET /search HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
    assert_raw_status(gw.addr, req, 200, "a chunked GET").await;
    let rec = up.recorded();
    assert_eq!(rec.len(), 1);
    assert_eq!(String::from_utf8_lossy(&rec[0].body), "hello world");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_1_requests_without_exactly_one_host_get_400() {
    let up = Emulator::start(|_| small_answer()).await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    for (name, req) in [
        ("no Host", &b"GET /x HTTP/1.1\r\nConnection: close\r\n\r\n"[..]),
        (
            "two Host lines",
            &b"GET /x HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\nConnection: close\r\n\r\n"[..],
        ),
    ] {
        assert_raw_status(gw.addr, req, 400, name).await;
    }
    assert!(up.recorded().is_empty(), "a request with a bad Host went upstream");
    assert_eq!(client_errors(&gw.metrics().await, "bad_host"), 2.0);
    // HTTP/1.0 may omit it.
    assert_raw_status(gw.addr, b"GET /x HTTP/1.0\r\n\r\n", 200, "HTTP/1.0").await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsolicited_101_from_the_upstream_is_502_for_http2_clients() {
    let up =
        raw_upstream(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n".to_vec())
            .await;
    let gw = TestGateway::start(&format!("http://{up}"), |_| {}).await;
    let h2 = h2_client();
    let resp = in_time(h2.request(empty_get(&gw, "/ws")), "in time", "a response").await;
    assert_eq!(resp.status(), 502);
    let m = gw.metrics().await;
    assert_eq!(
        metric(&m, "sse_gateway_upstream_errors_total", &["kind=\"protocol\""]),
        1.0
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_upstream_max_connections_get_503_and_a_slot_frees_when_its_response_ends() {
    let up = Emulator::start(|r| {
        if r.target == "/hold" {
            vec![sse_head(), Step::WriteAll(b"data: hi\n\n".to_vec()), Step::Hang]
        } else {
            small_answer()
        }
    })
    .await;
    let gw = TestGateway::start(&up.url(), |s| s.upstream.max_connections = 1).await;
    let mut held = raw(
        gw.addr,
        b"GET /hold HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nX-Stream-Format: legacy\r\n\r\n",
    )
    .await;
    read_until(&mut held, PATIENCE, |got| find(got, b"\r\n\r\n").is_some(), "a head").await;
    let (parts, body) = send("GET", &gw.url("/other"), &[], Bytes::new()).await;
    assert_eq!(parts.status, 503, "{}", String::from_utf8_lossy(&body));
    let json: serde_json::Value = serde_json::from_slice(&body).expect("a JSON error body");
    assert_eq!(json["error"], "upstream_busy");
    assert_eq!(
        metric(&gw.metrics().await, "sse_gateway_upstream_rejected_total", &[]),
        1.0
    );
    drop(held);
    // The slot comes back once the held stream's body is dropped (client gone).
    let mut status = 0;
    for _ in 0..100 {
        status = send("GET", &gw.url("/other"), &[], Bytes::new())
            .await
            .0
            .status
            .as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 200, "the slot was not released");
    gw.stop().await;
}
