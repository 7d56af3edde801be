//! The proxy end to end, in process: a real gateway on 127.0.0.1 in front of the upstream emulator.

// The core's own emitter and scenario generator (tests/harness/core), reused for the end-to-end corpus.
mod harness;

use std::time::Duration;

use bytes::Bytes;
use harness::client::assert_same_bytes;
use harness::legacy::{assert_blocks, blocks, corpus};
use harness::prelude::*;
use http_body_util::BodyExt;
use sse_gateway::config::StreamFormat;
use sse_gateway::translate::{translate_all, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn sse_script(body: Vec<u8>) -> Vec<Step> {
    vec![sse_head(), Step::Write(body), Step::EndChunks]
}

/// An upstream answering `<prefix><i>` with `streams[i]` as an SSE body (the first for any other target), and a
/// gateway in front of it.
async fn serving_streams(prefix: &'static str, streams: Vec<Vec<u8>>) -> (Emulator, TestGateway) {
    let up = Emulator::start(move |r| {
        let i: usize = r.target.trim_start_matches(prefix).parse().unwrap_or(0);
        sse_script(streams[i].clone())
    })
    .await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    (up, gw)
}

/// The `Accept` an SSE client sends (EventSource, httpx-sse): such requests get a dedicated upstream connection.
const ACCEPT_SSE: (&str, &str) = ("accept", "text/event-stream");
/// An upstream's event-stream response header.
const EVENT_STREAM: (&str, &str) = ("Content-Type", "text/event-stream");

/// Checks how many requests went upstream on each kind of connection.
async fn assert_connections(gw: &TestGateway, pooled: usize, dedicated: usize) {
    assert_upstream_connections(&gw.metrics().await, pooled, dedicated);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_translation_matches_the_contract_block_by_block() {
    corpus_end_to_end(&[], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_on_dedicated_connections_matches_the_contract_block_by_block() {
    corpus_end_to_end(&[ACCEPT_SSE], true).await;
}

/// The scenario corpus through the gateway with `headers`; every request must go on a dedicated connection, or
/// every one on a pooled one.
async fn corpus_end_to_end(headers: &[(&str, &str)], dedicated: bool) {
    let scenarios = corpus();
    let streams: Vec<Vec<u8>> = scenarios.iter().map(|s| s.stream.clone()).collect();
    let (_up, gw) = serving_streams("/run/", streams).await;
    for (i, sc) in scenarios.iter().enumerate() {
        let mut h = vec![("x-agent-id", "fallback")];
        h.extend_from_slice(headers);
        let (parts, body) = send("POST", &gw.url(&format!("/run/{i}")), &h, "{}").await;
        assert_eq!(parts.status, 200, "{}", sc.name);
        assert_eq!(parts.headers["content-type"], "text/event-stream", "{}", sc.name);
        // Whatever the split the emulator chose, the bytes equal translating the whole stream at once.
        let (whole, _) = translate_all(Options::default(), "fallback", &sc.stream);
        assert_eq!(
            String::from_utf8_lossy(&without_ids(&body)),
            String::from_utf8_lossy(&whole),
            "{}: gateway output differs from translate_all",
            sc.name
        );
        let envs = envelopes(&body);
        for e in &envs {
            if let Some(o) = e.as_object() {
                let keys: Vec<&str> = o.keys().map(String::as_str).take(4).collect();
                assert_eq!(keys, ["type", "agent", "final", "delta"], "{}: field order", sc.name);
                let json_len = serde_json::to_string(e).map(|s| s.len()).unwrap_or(0);
                if o["type"] != "citation" {
                    assert!(json_len <= 2048, "{}: envelope over budget: {json_len}", sc.name);
                }
            }
        }
        println!("scenario {}: {} envelopes", sc.name, envs.len());
        assert_blocks(&blocks(&envs), &sc.expected);
    }
    let m = gw.metrics().await;
    assert!(metric(&m, "sse_gateway_envelopes_total", &["type=\"text\""]) > 0.0);
    assert_eq!(
        metric(
            &m,
            "sse_gateway_streams_total",
            &["mode=\"translate\"", "outcome=\"completed\""]
        ),
        scenarios.len() as f64
    );
    let n = scenarios.len();
    assert_connections(&gw, if dedicated { 0 } else { n }, if dedicated { n } else { 0 }).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_requests_stay_in_the_pool_when_configured() {
    let stream = b"data: <content-block-text>\n\ndata: hi\n\ndata: </content-block-text>\n\ndata: [DONE]\n\n".to_vec();
    let up = Emulator::start(move |_| sse_script(stream.clone())).await;
    let gw = TestGateway::start(&up.url(), |s| {
        s.upstream.stream_connections = sse_gateway::config::UpstreamConnection::Pooled;
    })
    .await;
    let (parts, body) = send("POST", &gw.url("/agent/run"), &[ACCEPT_SSE], "{}").await;
    assert_eq!(parts.status, 200);
    let text: String = envelopes(&body)
        .iter()
        .filter(|e| e["type"] == "text")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(text, "hi");
    assert_connections(&gw, 1, 0).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_generated_corpus_of_the_core_in_both_dialects() {
    use harness::core::emitter::{emit, EmitOpts};
    use harness::core::envelopes::{check, FALLBACK};
    use harness::{core::gen, rng::Rng};
    const SCENARIOS: u64 = 24;
    let mut streams = Vec::new();
    let mut expected = Vec::new();
    for seed in 0..SCENARIOS {
        let raw = seed % 2 == 1;
        let items = gen::scenario(&mut Rng::new(seed), raw);
        let eo = EmitOpts {
            fragment: if seed % 3 == 0 { 0.0 } else { 0.35 },
            ..EmitOpts::default()
        };
        let em = emit(&items, &eo, FALLBACK, seed);
        streams.push(em.sse);
        expected.push(em.expected);
    }
    let (_up, gw) = serving_streams("/gen/", streams).await;
    for (i, want) in expected.iter().enumerate() {
        let (parts, body) = send("POST", &gw.url(&format!("/gen/{i}")), &[("x-agent-id", FALLBACK)], "{}").await;
        assert_eq!(parts.status, 200);
        if let Err(e) = check(want, &without_ids(&body), 2048) {
            panic!("generated scenario {i}: {e}\n{}", String::from_utf8_lossy(&body));
        }
    }
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_client_gets_a_translated_stream() {
    let stream = corpus().remove(0).stream;
    let expected = translate_all(Options::default(), "a", &stream).0;
    let (_up, gw) = gateway_with(sse_script(stream.clone()), |_| {}).await;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<http_body_util::Full<Bytes>>();
    let req = http::Request::post(gw.url("/agent/run"))
        .header("x-agent-id", "a")
        .body(http_body_util::Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = tokio::time::timeout(PATIENCE, client.request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(without_ids(&body), expected);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn translated_response_headers_are_streaming_safe() {
    let head = [EVENT_STREAM, ("Content-Length", "24"), ("Cache-Control", "private")];
    let (up, gw) = gateway_with(Step::answer(200, &head, b"data: [DONE]\n\ndata: x\n\n"), |_| {}).await;
    let (parts, _) = send("GET", &gw.url("/s"), &[], Bytes::new()).await;
    let h = &parts.headers;
    assert!(h.get("content-length").is_none(), "{h:?}");
    assert_eq!(h["cache-control"], "no-cache");
    assert_eq!(h["x-accel-buffering"], "no");
    assert!(h.get("content-encoding").is_none());
    assert_eq!(up.recorded()[0].header("accept-encoding"), Some("identity"));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_event_stream_responses_pass_through_byte_identical() {
    let json = br#"{"ok":true,"items":[1,2,3],"text":"data: not an event"}"#.to_vec();
    let mut rng = fastrand::Rng::with_seed(42);
    let binary: Vec<u8> = (0..10 * 1024 * 1024).map(|_| rng.u8(..)).collect();
    let (j, b) = (json.clone(), binary.clone());
    let up = Emulator::start(move |r| match r.target.as_str() {
        "/json" => vec![
            Step::Head {
                status: 201,
                headers: vec![
                    ("Content-Type".into(), "application/json".into()),
                    ("Content-Length".into(), j.len().to_string()),
                    ("X-Custom".into(), "kept".into()),
                ],
                chunked: false,
            },
            Step::WriteAll(j.clone()),
        ],
        _ => vec![
            Step::head(200, &[("Content-Type", "application/octet-stream")], true),
            Step::WriteAll(b.clone()),
            Step::EndChunks,
        ],
    })
    .await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let (parts, body) = send("GET", &gw.url("/json"), &[("accept-encoding", "gzip")], Bytes::new()).await;
    assert_eq!(parts.status, 201);
    assert_eq!(parts.headers["x-custom"], "kept");
    assert_eq!(parts.headers["content-length"], json.len().to_string());
    assert_eq!(body, json);
    let (parts, body) = send("GET", &gw.url("/bin"), &[], Bytes::new()).await;
    assert_eq!(parts.status, 200);
    assert_same_bytes(&body, &binary, "10 MB binary");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_format_requests_get_the_original_stream() {
    let stream = corpus().remove(1).stream;
    let (up, gw) = gateway_with(sse_script(stream.clone()), |_| {}).await;
    let (parts, body) = send(
        "POST",
        &gw.url("/agent/run"),
        &[("x-stream-format", "legacy"), ("accept-encoding", "gzip")],
        "{}",
    )
    .await;
    assert_eq!(parts.status, 200);
    assert!(body == stream, "legacy stream altered");
    // The negotiation header is the gateway's; the client's Accept-Encoding is kept for pass-through.
    let rec = &up.recorded()[0];
    assert_eq!(rec.header("x-stream-format"), None);
    assert_eq!(rec.header("accept-encoding"), Some("gzip"));
    // The query parameter works the same, and default_format = legacy flips the default.
    let (_, body) = send("POST", &gw.url("/agent/run?stream_format=legacy"), &[], "{}").await;
    assert!(body == stream);
    gw.stop().await;
    let gw = TestGateway::start(&up.url(), |s| s.translate.default_format = StreamFormat::Legacy).await;
    let (_, body) = send("POST", &gw.url("/agent/run"), &[], "{}").await;
    assert!(body == stream);
    let (parts, _) = send("POST", &gw.url("/agent/run"), &[("x-stream-format", "yaml")], "{}").await;
    assert_eq!(parts.status, 400);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_counts_translation_but_sends_original_bytes() {
    let stream = corpus().remove(0).stream;
    let (_up, gw) = gateway_with(sse_script(stream.clone()), |s| s.translate.shadow = true).await;
    let (_, body) = send("POST", &gw.url("/agent/run"), &[], "{}").await;
    assert!(body == stream, "shadow mode altered the stream");
    let m = gw.metrics().await;
    assert_eq!(
        metric(
            &m,
            "sse_gateway_streams_total",
            &["mode=\"shadow\"", "outcome=\"completed\""]
        ),
        1.0
    );
    assert!(
        metric(&m, "sse_gateway_envelopes_total", &[]) > 0.0,
        "shadow translation not counted"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_minus_hop_by_hop_are_preserved_both_ways() {
    let head = [
        ("Content-Type", "text/plain"),
        ("X-Upstream", "u"),
        ("Set-Cookie", "a=1"),
        ("Keep-Alive", "timeout=5"),
        ("X-Hop", "drop"),
        ("Connection", "X-Hop"),
    ];
    let (up, gw) = gateway_with(Step::answer(200, &head, b"hello"), |_| {}).await;
    let sent = [
        ("x-client", "c"),
        ("authorization", "Bearer t"),
        ("connection", "x-drop-me"),
        ("x-drop-me", "1"),
        ("te", "trailers"),
        ("proxy-authorization", "secret"),
        ("x-forwarded-for", "10.1.1.1"),
        ("x-request-id", "req-123"),
    ];
    let (parts, body) = send("GET", &gw.url("/h?q=1"), &sent, Bytes::new()).await;
    assert_eq!(body, b"hello");
    let h = &parts.headers;
    assert_eq!(h["x-upstream"], "u");
    assert_eq!(h["set-cookie"], "a=1");
    assert_eq!(h["x-request-id"], "req-123");
    assert!(h.get("x-hop").is_none() && h.get("keep-alive").is_none(), "{h:?}");
    let rec = &up.recorded()[0];
    assert_eq!(rec.target, "/h?q=1");
    assert_eq!(rec.header("x-client"), Some("c"));
    assert_eq!(rec.header("authorization"), Some("Bearer t"));
    assert_eq!(rec.header("x-drop-me"), None);
    assert_eq!(rec.header("te"), None);
    assert_eq!(rec.header("proxy-authorization"), None);
    assert_eq!(rec.header("x-forwarded-for"), Some("10.1.1.1, 127.0.0.1"));
    assert_eq!(rec.header("x-forwarded-proto"), Some("http"));
    assert_eq!(rec.header("x-forwarded-host"), Some(gw.addr.to_string().as_str()));
    assert_eq!(rec.header("host"), Some(up.addr.to_string().as_str()));
    assert_eq!(rec.header("x-request-id"), Some("req-123"));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_forwards_to_a_host_named_in_the_request() {
    let (up, gw) = gateway_with(vec![Step::head(200, &[], false)], |_| {}).await;
    // Pooled, then dedicated: either way the upstream gets the origin form and its own Host.
    let requests: [&[u8]; 2] = [
        b"GET http://evil.invalid/steal HTTP/1.1\r\nHost: evil.invalid\r\nConnection: close\r\n\r\n",
        b"GET http://evil.invalid/steal?x=1 HTTP/1.1\r\nHost: evil.invalid\r\nAccept: text/event-stream\r\n\
         Connection: close\r\n\r\n",
    ];
    for (i, request) in requests.into_iter().enumerate() {
        let mut s = raw(gw.addr, request).await;
        let resp = read_to_eof(&mut s).await.expect("response");
        assert!(resp.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&resp));
        let rec = &up.recorded()[i];
        assert_eq!(rec.target, ["/steal", "/steal?x=1"][i]);
        assert_eq!(rec.header("host"), Some(up.addr.to_string().as_str()));
    }
    assert_connections(&gw, 1, 1).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_stream_through_unchanged() {
    upload_through(&[], (1, 0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_stream_through_unchanged_on_dedicated_connections() {
    upload_through(&[ACCEPT_SSE], (0, 1)).await;
}

/// A 20 MB multipart upload with `headers` arrives unchanged, on `(pooled, dedicated)` connections.
async fn upload_through(headers: &[(&str, &str)], (pooled, dedicated): (usize, usize)) {
    let up = Emulator::start(|r| {
        vec![
            Step::head(200, &[("Content-Type", "text/plain")], false),
            Step::WriteAll(r.body.len().to_string().into_bytes()),
        ]
    })
    .await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let mut rng = fastrand::Rng::with_seed(3);
    let body: Vec<u8> = (0..20 * 1024 * 1024).map(|_| rng.u8(..)).collect();
    let mut h = vec![("content-type", "multipart/form-data; boundary=x")];
    h.extend_from_slice(headers);
    let (parts, resp) = send("POST", &gw.url("/upload"), &h, body.clone()).await;
    assert_eq!(parts.status, 200);
    assert_eq!(resp, body.len().to_string().as_bytes());
    assert!(up.recorded()[0].body == body, "upload altered");
    assert_connections(&gw, pooled, dedicated).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_runs_take_the_agent_from_the_json_body_then_the_header() {
    // No meta_init (a resumed run): envelopes carry the fallback agent.
    let stream =
        b"data: <content-block-text>\n\ndata: resumed\n\ndata: </content-block-text>\n\ndata: [DONE]\n\n".to_vec();
    let (up, gw) = gateway_with(sse_script(stream.clone()), |_| {}).await;
    let agent_of = |body: &[u8]| -> Vec<String> {
        envelopes(body)
            .iter()
            .filter_map(|e| e.get("agent").and_then(|a| a.as_str()).map(str::to_owned))
            .collect()
    };
    let (_, body) = send(
        "POST",
        &gw.url("/agent/tool_results"),
        &[("content-type", "application/json"), ("x-agent-id", "from-header")],
        r#"{"agent_uuid":"from-body","results":[]}"#,
    )
    .await;
    let agents = agent_of(&body);
    assert!(
        !agents.is_empty() && agents.iter().all(|a| a == "from-body"),
        "{agents:?}"
    );
    assert_eq!(up.recorded()[0].body, br#"{"agent_uuid":"from-body","results":[]}"#);
    let (_, body) = send("POST", &gw.url("/x"), &[("x-agent-id", "from-header")], "not json").await;
    let agents = agent_of(&body);
    assert!(
        !agents.is_empty() && agents.iter().all(|a| a == "from-header"),
        "{agents:?}"
    );
    let (_, body) = send("POST", &gw.url("/x"), &[], "").await;
    let agents = agent_of(&body);
    assert!(
        !agents.is_empty() && agents.iter().all(|a| uuid::Uuid::parse_str(a).is_ok()),
        "{agents:?}"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_unreachable_upstream_is_502_json() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let gw = TestGateway::start(&format!("http://127.0.0.1:{port}"), |_| {}).await;
    assert_json_failures(gw, (502, "upstream_unreachable"), Some("application/json"), "connect").await;
}

/// A run on a pooled, then on a dedicated connection is answered `status` with a JSON body naming `error` (and the
/// content type `content_type`, when given); both count as upstream errors of `kind`.
async fn assert_json_failures(gw: TestGateway, (status, error): (u16, &str), content_type: Option<&str>, kind: &str) {
    for headers in [&[][..], &[ACCEPT_SSE][..]] {
        let (parts, body) = send("POST", &gw.url("/agent/run"), headers, "{}").await;
        assert_eq!(parts.status, status, "{headers:?}");
        if let Some(content_type) = content_type {
            assert_eq!(parts.headers["content-type"], content_type);
        }
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON body");
        assert_eq!(v["error"], error, "{headers:?}");
    }
    let m = gw.metrics().await;
    let errors = metric(&m, "sse_gateway_upstream_errors_total", &[&format!("kind=\"{kind}\"")]);
    assert_eq!(errors, 2.0);
    assert_connections(&gw, 1, 1).await;
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_slow_upstream_head_is_504_json() {
    let (_up, gw) = gateway_with(vec![Step::Hang], |s| s.upstream.response_timeout_secs = 0.3).await;
    assert_json_failures(gw, (504, "upstream_timeout"), None, "timeout").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mid_stream_reset_ends_with_an_upstream_error_envelope() {
    let up = Emulator::sse(vec![
        Step::Write(b"data: <content-block-text>\n\ndata: partial answer\n\ndata: more".to_vec()),
        Step::Pause(Duration::from_millis(50)),
        Step::Reset,
    ])
    .await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let envs = run_envelopes(&gw, &[("x-agent-id", "a1")]).await;
    let last = envs.last().expect("some envelopes");
    assert_eq!(last["type"], "error", "{envs:?}");
    assert_eq!(last["final"], true);
    assert_upstream_error(last);
    // The open text block was closed before the error.
    assert!(
        envs.iter().any(|e| e["type"] == "text" && e["final"] == true),
        "text block not closed: {envs:?}"
    );
    assert_cut_counted(&gw.metrics().await, "reset", true);
    gw.stop().await;
}

/// The envelopes of a run through `gw` with `headers`, which must be answered 200.
async fn run_envelopes(gw: &TestGateway, headers: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let (parts, body) = send("POST", &gw.url("/agent/run"), headers, "{}").await;
    assert_eq!(parts.status, 200);
    envelopes(&body)
}

/// `env`'s delta is the JSON of an `upstream_error`.
fn assert_upstream_error(env: &serde_json::Value) {
    let delta: serde_json::Value = serde_json::from_str(env["delta"].as_str().unwrap()).unwrap();
    assert_eq!(delta["type"], "upstream_error");
}

/// `envs` are a text delta, the text block's close and a final error envelope, an `upstream_error`.
fn assert_text_closed_by_upstream_error(envs: &[serde_json::Value]) {
    let kinds: Vec<_> = envs
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["final"] == true))
        .collect();
    assert_eq!(kinds, [("text", false), ("text", true), ("error", true)], "{envs:?}");
    assert_upstream_error(&envs[2]);
}

/// In `/metrics` after a stream the upstream cut: one upstream error of `kind` and, when `stream_counted` is given,
/// one translated stream whose outcome is `upstream_error`.
fn assert_cut_counted(m: &str, kind: &str, stream_counted: bool) {
    let kind = format!("kind=\"{kind}\"");
    assert_eq!(metric(m, "sse_gateway_upstream_errors_total", &[&kind]), 1.0);
    if stream_counted {
        let outcome = ["mode=\"translate\"", "outcome=\"upstream_error\""];
        assert_eq!(metric(m, "sse_gateway_streams_total", &outcome), 1.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_upstream_closing_without_done_ends_with_an_upstream_error_envelope() {
    let up = Emulator::sse(vec![
        Step::Write(b"data: <content-block-text>\n\ndata: cut here\n\n".to_vec()),
        // A clean end of the body, but no [DONE].
        Step::EndChunks,
    ])
    .await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    assert_text_closed_by_upstream_error(&run_envelopes(&gw, &[]).await);
    assert_cut_counted(&gw.metrics().await, "truncated", true);
    gw.stop().await;
}

/// An SSE upstream that writes `first`, is silent for `silence`, then writes `rest` (if any) and ends its body.
async fn silent_after(first: &[u8], silence: Duration, rest: &[u8]) -> Emulator {
    let mut steps = vec![Step::write_all(first), Step::Pause(silence)];
    if !rest.is_empty() {
        steps.push(Step::write_all(rest));
    }
    steps.push(Step::EndChunks);
    Emulator::sse(steps).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_upstream_silent_past_the_idle_timeout_ends_with_an_upstream_error_envelope() {
    let opened = b"data: <content-block-text>\n\ndata: thinking about it\n\n";
    let up = silent_after(opened, Duration::from_secs(5), b"").await;
    let gw = TestGateway::start(&up.url(), |s| s.upstream.idle_timeout_secs = 0.5).await;
    let started = std::time::Instant::now();
    let envs = run_envelopes(&gw, &[]).await;
    // Ended by the timeout, not by the upstream's end 5 s later.
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_text_closed_by_upstream_error(&envs);
    assert_cut_counted(&gw.metrics().await, "timeout", false);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_client_hang_up_closes_the_upstream_within_a_second() {
    let mut up = Emulator::open_until_closed().await;
    // No grace period: the upstream goes with its client, as before resumption.
    let gw = TestGateway::start(&up.url(), |s| s.resume.grace_secs = 0.0).await;
    let request = b"POST /agent/run HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    let head_ok = |c: &Client| assert!(c.head.starts_with("HTTP/1.1 200"), "{}", c.head);
    assert_leaving_closes_upstream(&mut up, gw.addr, request, head_ok, Duration::from_secs(1), "the client").await;
    // The outcome is recorded once the body adapter is dropped.
    let mut m = String::new();
    for _ in 0..100 {
        m = gw.metrics().await;
        if metric(&m, "sse_gateway_streams_total", &["outcome=\"client_gone\""]) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(&m, "sse_gateway_streams_total", &["outcome=\"client_gone\""]),
        1.0
    );
    assert_eq!(metric(&m, "sse_gateway_client_disconnects_total", &[]), 1.0);
    assert_eq!(metric(&m, "sse_gateway_active_streams", &[]), 0.0);
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_slowloris_half_request_line_is_cut_off() {
    let (up, gw) = gateway_with(vec![], |s| s.server.header_read_timeout_secs = 0.5).await;
    let mut half_line = raw(gw.addr, b"GET /agent/ru").await;
    let mut nothing = raw(gw.addr, b"").await;
    let mut h2_preface_start = raw(gw.addr, b"PRI * HTTP/2").await;
    let mut half_headers = raw(gw.addr, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ").await;
    for (name, s) in [
        ("half request line", &mut half_line),
        ("no bytes", &mut nothing),
        ("partial h2 preface", &mut h2_preface_start),
        ("half headers", &mut half_headers),
    ] {
        assert!(read_to_eof(s).await.is_some(), "{name}: connection not closed");
    }
    assert!(up.recorded().is_empty());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_oversized_request_head_is_refused() {
    let (up, gw) = gateway_with(vec![Step::head(200, &[], false)], |s| s.server.max_header_bytes = 16384).await;
    let big = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(64 * 1024));
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let _ = s.write_all(big.as_bytes()).await;
    let resp = read_to_eof(&mut s).await.expect("closed");
    assert!(
        resp.is_empty() || resp.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    assert!(up.recorded().is_empty());
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_connect_is_refused() {
    let (up, gw) = gateway_with(vec![Step::head(200, &[], false)], |_| {}).await;
    let mut s = raw(
        gw.addr,
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    )
    .await;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(PATIENCE, s.read(&mut buf)).await.unwrap().unwrap();
    let resp = String::from_utf8_lossy(&buf[..n]);
    assert!(resp.starts_with("HTTP/1.1 405"), "{resp}");
    assert!(up.recorded().is_empty(), "CONNECT reached the upstream");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_redirects_are_passed_back_not_followed() {
    let up = Emulator::start(|_| {
        vec![Step::head(
            302,
            &[("Location", "/elsewhere"), ("Content-Length", "0")],
            false,
        )]
    })
    .await;
    let gw = TestGateway::start(&up.url(), |_| {}).await;
    let (parts, _) = send("GET", &gw.url("/old"), &[], Bytes::new()).await;
    assert_eq!(parts.status, 302);
    assert_eq!(parts.headers["location"], "/elsewhere");
    let rec = up.recorded();
    assert_eq!(rec.len(), 1, "redirect followed: {rec:?}");
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_translated_streams_get_keepalive_comments() {
    // Silent for 2.5 × the shortest interval validation allows (1 s).
    let (opened, closed) = (
        b"data: <content-block-text>\n\n",
        b"data: </content-block-text>\n\ndata: [DONE]\n\n",
    );
    let up = silent_after(opened, Duration::from_millis(2500), closed).await;
    let gw = TestGateway::start(&up.url(), |s| s.translate.keepalive_interval_secs = 1.0).await;
    let (_, body) = send("POST", &gw.url("/agent/run"), &[], "{}").await;
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains(": keepalive\n\n"), "{text}");
    let m = gw.metrics().await;
    assert!(metric(&m, "sse_gateway_keepalives_total", &[]) >= 1.0);
    gw.stop().await;
    // Disabled with 0; pass-through streams never get them.
    let gw = TestGateway::start(&up.url(), |s| s.translate.keepalive_interval_secs = 0.0).await;
    let (_, body) = send("POST", &gw.url("/agent/run"), &[], "{}").await;
    assert!(!String::from_utf8_lossy(&body).contains("keepalive"));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_and_every_metric_family() {
    let stream = corpus().remove(0).stream;
    let (_up, gw) = gateway_with(sse_script(stream.clone()), |_| {}).await;
    let (_, _) = send("POST", &gw.url("/agent/run"), &[], "{}").await;
    let (p, _) = get(&format!("http://{}/healthz", gw.admin)).await;
    assert_eq!(p.status, 200);
    let (p, _) = get(&format!("http://{}/readyz", gw.admin)).await;
    assert_eq!(p.status, 200);
    let m = gw.metrics().await;
    for name in [
        "requests_total",
        "streams_total",
        "active_streams",
        "stream_duration_seconds_count",
        "upstream_ttfb_seconds_count",
        "downstream_ttfb_seconds_count",
        "event_translation_seconds_count",
        "envelopes_total",
        "envelope_bytes_count",
        "oversize_envelopes_total",
        "block_chunks_count",
        "items_total",
        "fragmented_items_total",
        "item_upstream_events_count",
        "parse_errors_total",
        "unknown_tags_total",
        "scope_conflicts_total",
        "upstream_errors_total",
        "client_disconnects_total",
        "keepalives_total",
        "bytes_in_total",
        "bytes_out_total",
        "ready",
        "draining",
    ] {
        assert!(
            m.lines().any(|l| l.starts_with(&format!("sse_gateway_{name}"))),
            "metric {name} missing"
        );
    }
    assert_eq!(metric(&m, "sse_gateway_ready", &[]), 1.0);
    assert_eq!(
        metric(
            &m,
            "sse_gateway_requests_total",
            &["mode=\"translate\"", "status_class=\"2xx\""]
        ),
        1.0
    );
    assert!(metric(&m, "sse_gateway_items_total", &[]) > 0.0);
    assert!(metric(&m, "sse_gateway_bytes_out_total", &["mode=\"translate\""]) > 0.0);
    gw.stop().await;
}

/// The `sse_gateway_*` series the Grafana dashboard's queries and the Prometheus rules' expressions name, as
/// written (`_bucket` of a histogram, `_total` of a counter). Recorded names (`sse_gateway:…`) are not matched.
fn deployed_series() -> std::collections::BTreeSet<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut exprs = Vec::new();
    fn targets(panels: &serde_json::Value, exprs: &mut Vec<String>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                exprs.extend(t["expr"].as_str().map(str::to_owned));
            }
            targets(&p["panels"], exprs);
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("grafana/dashboard.json")).unwrap()).unwrap();
    targets(&dashboard["panels"], &mut exprs);
    // The rules' `expr:` values, inline or a block scalar (the lines indented under the key); not their
    // annotations, whose prose may name families loosely.
    let rules = std::fs::read_to_string(root.join("prometheus/rules/sse-gateway.rules.yml")).unwrap();
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some((indent, value)) = line.split_once("expr:") else {
            continue;
        };
        if !indent.trim().is_empty() {
            continue;
        }
        exprs.push(value.to_owned());
        while let Some(more) = lines.next_if(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent.len()) {
            exprs.push(more.to_owned());
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for e in &exprs {
        for (i, _) in e.match_indices("sse_gateway_") {
            let name: String = e[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// A gateway nobody has used yet exposes every series the dashboard and the alert rules query: a labelled family
/// whose children appeared only at their first increment would leave panels on "No data" and rules unevaluated
/// on a fresh instance (issue 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_gateway_exposes_every_series_the_dashboard_and_rules_query() {
    let names = deployed_series();
    assert!(names.len() > 40, "read only {names:?} from deploy/");
    let (_up, gw) = gateway_with(sse_script(Vec::new()), |_| {}).await;
    let m = gw.metrics().await;
    let exposed: std::collections::BTreeSet<&str> = m
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let missing: Vec<&String> = names.iter().filter(|n| !exposed.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "not in a fresh gateway's /metrics: {missing:?}");
    gw.stop().await;
}

/// Plain HTTP/1.1 requests are served on the gateway's own path (proxy/http1.rs), without hyper's connection
/// buffers; a request with `TE: trailers` (a hop-by-hop field the upstream never sees) is one hyper serves. For
/// each kind of response (a translated stream, a legacy one passed through, an upstream's error passed on, the
/// gateway's own error) both get the same head (but its date) and the same body. Which requests are plain is
/// pinned by `proxy::http1`'s unit tests (`TE` is among those that are not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_hyper_served_requests_get_the_same_response() {
    let stream = corpus()[0].stream.clone();
    let up = Emulator::start(move |r| {
        if r.target == "/missing" {
            Step::answer(404, &[("content-type", "application/json")], b"{\"detail\":\"no\"}")
        } else {
            sse_script(stream.clone())
        }
    })
    .await;
    // Without resumption: its stream ids differ from one request to the next.
    let gw = TestGateway::start(&up.url(), |s| s.resume.enabled = false).await;
    let without_date = |head: &str| {
        head.split("\r\n")
            .filter(|l| !l.to_ascii_lowercase().starts_with("date:"))
            .collect::<Vec<_>>()
            .join("\r\n")
    };
    for (path, fields) in [
        ("/run", "Accept: text/event-stream\r\nX-Stream-Format: json\r\n"),
        ("/run", "Accept: text/event-stream\r\nX-Stream-Format: legacy\r\n"),
        ("/missing", "Accept: text/event-stream\r\n"),
        ("/run", "X-Stream-Format: bogus\r\n"),
    ] {
        let base = format!(
            "POST {path} HTTP/1.1\r\nHost: gateway\r\n{fields}X-Request-Id: same\r\nX-Agent-Id: fallback\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n"
        );
        let mut got = Vec::new();
        for extra in ["", "TE: trailers\r\n"] {
            let mut c = Client::write(gw.addr, format!("{base}{extra}\r\n{{}}").as_bytes())
                .await
                .unwrap();
            c.read_head().await.unwrap();
            c.read_to_end(PATIENCE).await.unwrap();
            got.push((without_date(&c.head), c.body));
        }
        assert!(got[0].0.contains("HTTP/1.1 "), "{path} {fields:?}: {}", got[0].0);
        assert_eq!(got[0].0, got[1].0, "{path} {fields:?}: heads differ");
        assert!(!got[0].1.is_empty(), "{path} {fields:?}: no body");
        assert_same_bytes(&got[0].1, &got[1].1, &format!("{path} {fields:?}: body"));
    }
}
