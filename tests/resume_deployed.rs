//! Resumption where it is deployed (issue 26), over plain HTTP: the CORS answer of every response the gateway
//! writes itself (DESIGN 5.1: the backend's decision, kept with the stream, never widened; or the operator's
//! policy), a reconnect's preflight, tokens kept out of the logs, a single bound cookie, a path prefix that must
//! not hide the backend's paths, and an upstream's `no-store` kept. The same flows in a real browser are in
//! `tests/resume_clients.rs`.

mod harness;

use std::net::SocketAddr;
use std::time::Duration;

use harness::cors::assert_answer;
use harness::prelude::*;
use harness::ws::{connect, read_until, send_text};

/// The page's origin, which the backend allows with credentials.
const APP: &str = "http://127.0.0.1:5173";
/// An origin the backend does not allow.
const EVIL: &str = "http://evil.test";
const WAIT: Duration = Duration::from_secs(15);
/// The headers a Starlette `CORSMiddleware` with an explicit list allows.
const ALLOWED_HEADERS: [&str; 4] = ["accept", "accept-language", "content-language", "content-type"];

/// A backend with CORS as the legacy app's (Starlette's `CORSMiddleware`: one origin with credentials, every method,
/// an explicit header list): a preflight asking for another header is refused with 400; the run is an SSE stream
/// that stays open after its first events.
async fn backend(cache_control: Option<&'static str>) -> Emulator {
    Emulator::start(move |r| {
        let origin = r.header("origin").unwrap_or_default().to_owned();
        let allowed = origin == APP;
        let mut cors: Vec<(String, String)> = Vec::new();
        if allowed {
            cors.push(("access-control-allow-origin".into(), origin.clone()));
            cors.push(("access-control-allow-credentials".into(), "true".into()));
        }
        cors.push(("vary".into(), "Origin".into()));
        let pairs = |v: &[(String, String)]| v.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>();
        if r.method == "OPTIONS" {
            let asked = r
                .header("access-control-request-headers")
                .unwrap_or_default()
                .to_owned();
            let refused = asked
                .split(',')
                .map(|h| h.trim().to_ascii_lowercase())
                .any(|h| !h.is_empty() && !ALLOWED_HEADERS.contains(&h.as_str()));
            let mut h = pairs(&cors);
            h.push((
                "access-control-allow-methods".into(),
                "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT".into(),
            ));
            h.push((
                "access-control-allow-headers".into(),
                "Accept, Accept-Language, Content-Language, Content-Type".into(),
            ));
            h.push(("access-control-max-age".into(), "600".into()));
            h.push((
                "content-length".into(),
                if refused || !allowed { "22" } else { "2" }.into(),
            ));
            let (status, body): (u16, &[u8]) = if refused || !allowed {
                (400, b"Disallowed CORS headers")
            } else {
                (200, b"OK")
            };
            let body = &body[..if status == 400 { 22 } else { 2 }];
            return vec![
                Step::Head {
                    status,
                    headers: h,
                    chunked: false,
                },
                Step::write_all(body),
            ];
        }
        let mut h = pairs(&cors);
        h.push(("content-type".into(), "text/event-stream".into()));
        if let Some(cc) = cache_control {
            h.push(("cache-control".into(), cc.into()));
        }
        vec![
            Step::Head {
                status: 200,
                headers: h,
                chunked: true,
            },
            Step::write_all(b"data: <content-block-text>\n\ndata: one \n\ndata: two \n\n"),
            Step::AwaitClose,
        ]
    })
    .await
}

/// A raw request with `extra` headers and a small JSON body for POSTs; the response's head is read.
async fn open(addr: SocketAddr, method: &str, path: &str, extra: &[(&str, &str)]) -> Client {
    let body = if method == "POST" { r#"{"q":"why"}"# } else { "" };
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n");
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body);
    let mut c = Client::write(addr, req.as_bytes()).await.expect("connect");
    tokio::time::timeout(WAIT, c.read_head())
        .await
        .expect("a response head in time")
        .expect("a response head");
    c
}

/// Starts a run from `extra`'s origin and reads its first event; returns the client and the stream's URL.
async fn run(addr: SocketAddr, extra: &[(&str, &str)]) -> (Client, String) {
    let sse = [
        ("accept", "text/event-stream"),
        ("x-stream-format", "json"),
        ("x-agent-id", "agent-1"),
    ];
    let all: Vec<(&str, &str)> = sse.iter().chain(extra).copied().collect();
    let mut c = open(addr, "POST", "/agent/run", &all).await;
    assert_eq!(c.status, 200, "{}", c.head);
    let url = header_value(&c.head, "x-gateway-stream")
        .expect("a stream URL")
        .to_owned();
    c.read_until_contains(b"id: sg1-", WAIT).await.expect("a first event");
    (c, url)
}

fn token_of(url: &str) -> &str {
    url.rsplit('/').next().expect("a token")
}

#[tokio::test]
async fn every_answer_the_gateway_writes_carries_the_backends_cors_to_the_origin_it_allowed_only() {
    let up = backend(None).await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let addr = gw.addr;
    let from_app = [("origin", APP)];

    // The reconnect's preflight asks for last-event-id: the backend is asked without it, and the answer gets it.
    let pre = open(
        addr,
        "OPTIONS",
        "/agent/run",
        &[
            ("origin", APP),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "content-type,last-event-id"),
        ],
    )
    .await;
    assert_eq!(pre.status, 200, "{}", pre.head);
    let allowed = header_value(&pre.head, "access-control-allow-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(
        allowed.contains("last-event-id") && allowed.contains("content-type"),
        "{}",
        pre.head
    );
    let seen = up
        .recorded()
        .into_iter()
        .find(|r| r.method == "OPTIONS")
        .expect("preflight forwarded");
    assert_eq!(seen.header("access-control-request-headers"), Some("content-type"));

    // The run: the backend's answer, with X-Gateway-Stream exposed to the page.
    let (first, url) = run(addr, &from_app).await;
    let token = token_of(&url).to_owned();
    let (c, _) = run(addr, &from_app).await;
    assert!(
        header_value(&c.head, "access-control-expose-headers").is_some_and(|v| v.contains("x-gateway-stream")),
        "{}",
        c.head
    );

    // The reconnect, answered by the gateway: the backend's answer for that origin, and nothing for another.
    let last = format!("sg1-{token}-1");
    let sse = [("accept", "text/event-stream"), ("last-event-id", last.as_str())];
    let resumed = open(addr, "POST", "/agent/run", &[sse.as_slice(), &from_app].concat()).await;
    assert_answer(&resumed, 200, Some(APP), "the reconnect from the page's origin");
    assert_eq!(
        header_value(&resumed.head, "access-control-allow-credentials"),
        Some("true")
    );
    assert!(
        header_value(&resumed.head, "access-control-expose-headers").is_some_and(|v| v.contains("x-gateway-stream"))
    );
    drop(resumed);
    let stranger = open(
        addr,
        "POST",
        "/agent/run",
        &[sse.as_slice(), &[("origin", EVIL)]].concat(),
    )
    .await;
    assert_eq!(
        header_value(&stranger.head, "access-control-allow-origin"),
        None,
        "{}",
        stranger.head
    );
    drop(stranger);

    // A watcher, a stream URL's preflight, an unknown stream and a DELETE, from the page's origin.
    let watcher = open(addr, "GET", &url, &from_app).await;
    assert_answer(&watcher, 200, Some(APP), "a watcher from the page's origin");
    drop(watcher);
    let preflight = |origin| {
        [
            ("origin", origin),
            ("access-control-request-method", "DELETE"),
            ("access-control-request-headers", "last-event-id"),
        ]
    };
    let pre = open(addr, "OPTIONS", &url, &preflight(APP)).await;
    assert_answer(&pre, 204, Some(APP), "a stream URL's preflight from the page's origin");
    assert_eq!(header_value(&pre.head, "access-control-allow-methods"), Some("DELETE"));
    assert_eq!(
        header_value(&pre.head, "access-control-allow-credentials"),
        Some("true")
    );
    let refused = open(addr, "OPTIONS", &url, &preflight(EVIL)).await;
    assert_answer(&refused, 403, None, "a stream URL's preflight from another origin");
    let unknown = format!("sg1-{}-1", "0".repeat(32));
    let gone = open(
        addr,
        "POST",
        "/agent/run",
        &[("origin", APP), ("last-event-id", unknown.as_str())],
    )
    .await;
    assert_answer(&gone, 410, Some(APP), "an unknown stream from the page's origin");
    let deleted = open(addr, "DELETE", &url, &from_app).await;
    assert_answer(&deleted, 204, Some(APP), "a DELETE from the page's origin");
    assert_eq!(
        header_value(&deleted.head, "access-control-allow-credentials"),
        Some("true")
    );

    let runs = up.recorded().iter().filter(|r| r.method == "POST").count();
    assert_eq!(runs, 2, "reconnects, watchers and DELETE never reach the backend");
    drop((first, c));
    gw.stop().await;
}

#[tokio::test]
async fn an_operators_policy_lets_a_page_read_the_gateways_answers_when_the_backend_sends_no_cors() {
    // A backend without any CORS: only the operator's policy can let the page read the gateway's answers.
    let up = Emulator::sse(vec![
        Step::write_all(b"data: <content-block-text>\n\n"),
        Step::AwaitClose,
    ])
    .await;
    let gw = TestGateway::start(&up.url(), |s| {
        s.cors.allow_origins = vec![APP.into()];
        s.cors.allow_credentials = true;
    })
    .await;
    let unknown = format!("sg1-{}-1", "0".repeat(32));
    for (origin, want) in [(APP, Some(APP)), (EVIL, None)] {
        let gone = open(
            gw.addr,
            "POST",
            "/run",
            &[("origin", origin), ("last-event-id", unknown.as_str())],
        )
        .await;
        assert_answer(&gone, 410, want, origin);
    }
    let url = format!("/_gateway/streams/{}", "0".repeat(32));
    let pre = open(
        gw.addr,
        "OPTIONS",
        &url,
        &[("origin", APP), ("access-control-request-method", "DELETE")],
    )
    .await;
    assert_answer(&pre, 204, Some(APP), "a stream URL's preflight from the page's origin");
    gw.stop().await;
}

#[tokio::test]
async fn a_bound_cookie_survives_the_other_cookies_rotating() {
    let up = backend(None).await;
    let gw = TestGateway::start(&up.url(), |s| {
        s.resume.bind_headers = vec!["cookie:session".into()];
    })
    .await;
    let (c, url) = run(gw.addr, &[("cookie", "session=s1; csrf=a")]).await;
    let token = token_of(&url);
    let last = format!("sg1-{token}-1");
    let resume = |cookie: &'static str| {
        let last = last.clone();
        async move {
            open(
                gw.addr,
                "POST",
                "/agent/run",
                &[("cookie", cookie), ("last-event-id", last.as_str())],
            )
            .await
            .status
        }
    };
    assert_eq!(resume("csrf=b; session=s1").await, 200, "the csrf cookie rotated");
    assert_eq!(resume("session=s2; csrf=a").await, 404, "another session");
    assert_eq!(resume("csrf=a").await, 404, "no session");
    drop(c);
    gw.stop().await;
}

#[tokio::test]
async fn a_path_prefix_never_hides_the_backends_paths_under_it() {
    let up = backend(None).await;
    let gw = TestGateway::start(&up.url(), |s| s.resume.path_prefix = "/agent".into()).await;
    let (c, url) = run(gw.addr, &[]).await;
    assert!(url.starts_with("/agent/"), "{url}");
    assert_eq!(up.recorded().len(), 1, "/agent/run reached the backend");
    let watcher = open(gw.addr, "GET", &url, &[]).await;
    assert_eq!(watcher.status, 200, "the stream's own URL is the gateway's");
    assert_eq!(up.recorded().len(), 1);
    drop((c, watcher));
    gw.stop().await;
}

#[tokio::test]
async fn an_upstreams_no_store_is_kept_on_its_translated_stream() {
    let up = backend(Some("private, no-store")).await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let (c, _) = run(gw.addr, &[]).await;
    assert_eq!(
        header_value(&c.head, "cache-control"),
        Some("private, no-store"),
        "{}",
        c.head
    );
    drop(c);
    gw.stop().await;
    let up = backend(None).await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let (c, _) = run(gw.addr, &[]).await;
    assert_eq!(header_value(&c.head, "cache-control"), Some("no-cache"), "{}", c.head);
    drop(c);
    gw.stop().await;
}

#[tokio::test]
async fn a_streams_token_is_in_no_log_line_at_any_level() {
    let up = backend(None).await;
    let gw = Process::against(&up.url(), &[("RUST_LOG", "trace")]);
    let (c, url) = run(gw.addr, &[]).await;
    let token = token_of(&url).to_owned();
    let last = format!("sg1-{token}-1");
    drop(open(gw.addr, "GET", &url, &[]).await);
    drop(open(gw.addr, "POST", "/agent/run", &[("last-event-id", last.as_str())]).await);
    drop(
        open(
            gw.addr,
            "OPTIONS",
            &url,
            &[("origin", APP), ("access-control-request-method", "GET")],
        )
        .await,
    );
    let deleted = open(gw.addr, "DELETE", &url, &[]).await;
    assert_eq!(deleted.status, 204);
    drop(c);

    // A socket on a stream bound to a credential, which comes in its first message: the messages sent carry the
    // token in their ids, the one received carries the credential; neither may reach a log line.
    const SECRET: &str = "Bearer socket-secret-6f1d2c";
    let (bound, bound_url) = run(gw.addr, &[("authorization", SECRET)]).await;
    let bound_token = token_of(&bound_url).to_owned();
    let offer = [("Sec-WebSocket-Protocol", "sse-gateway.v1, sse-gateway.auth")];
    let mut ws = connect(gw.addr, &bound_url, &offer).await;
    send_text(&mut ws, &format!(r#"{{"type":"auth","authorization":"{SECRET}"}}"#)).await;
    let got = read_until(&mut ws, WAIT, |g| g.events().len() >= 2).await;
    assert_eq!(got.events().len(), 2, "{}", got.ending());
    drop((ws, bound));

    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = std::fs::read_to_string(&gw.log).expect("the gateway's log");
    assert!(
        log.contains("/_gateway/streams/<redacted>"),
        "the watcher's request is logged, redacted"
    );
    for secret in [token.as_str(), bound_token.as_str(), SECRET, "socket-secret"] {
        assert!(!log.contains(secret), "{secret} leaked into the log:\n{}", {
            log.lines()
                .filter(|l| l.contains(secret))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        });
    }
}
