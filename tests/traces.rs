//! OpenTelemetry traces (issue 36, DESIGN 6.1), judged by what a collector receives: every export is decoded with
//! the official protobuf messages by a receiver on 127.0.0.1. A run with a subagent and tools, a backend's failure,
//! an upstream cut, a reconnect; the collector down, hanging, answering garbage or 503 then 200; the switches.

mod harness;

use std::time::Duration;

use harness::agent_backend::{failure, slow, subagent, AgentBackend, RUN};
use harness::otlp::{attr, attr_of, hex, Answer, Collector, Got};
use harness::prelude::*;
use harness::process::bin;

const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const INTERNAL: i32 = 1;
const STATUS_ERROR: i32 = 2;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traced(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".to_owned()),
        ("OTEL_SERVICE_NAME", "gw-under-test".to_owned()),
    ]
}

fn start(upstream: &str, env: &[(&'static str, String)]) -> Process {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Process::against(upstream, &env)
}

/// Runs `prompt` through the gateway with `headers`: the response's head and body.
async fn run(gw: &Process, prompt: &str, headers: &[(&str, &str)]) -> (http::response::Parts, String) {
    let mut h = vec![("content-type", "application/json"), ("accept", "text/event-stream")];
    h.extend_from_slice(headers);
    let body = serde_json::json!({ "user_prompt": prompt }).to_string();
    let (parts, body) = send("POST", &format!("http://{}{RUN}", gw.addr), &h, body).await;
    (parts, String::from_utf8_lossy(&body).into_owned())
}

fn named<'a>(spans: &'a [Got], name: &str, kind: i32) -> Vec<&'a Got> {
    spans
        .iter()
        .filter(|g| g.span.name == name && g.span.kind == kind)
        .collect()
}

fn events(g: &Got, name: &str) -> Vec<(String, String)> {
    g.span
        .events
        .iter()
        .filter(|e| e.name == name)
        .map(|e| {
            (
                attr_of(&e.attributes, "gen_ai.tool.call.id").unwrap_or_default(),
                attr_of(&e.attributes, "gen_ai.tool.name").unwrap_or_default(),
            )
        })
        .collect()
}

/// The span's only tool call and result events are `id`'s, named `name`.
fn assert_one_tool(g: &Got, id: &str, name: &str) {
    for event in ["gen_ai.tool.call", "gen_ai.tool.result"] {
        assert_eq!(events(g, event), [(id.to_owned(), name.to_owned())], "{event}");
    }
}

fn every_value(spans: &[Got]) -> String {
    format!("{spans:?}")
}

#[tokio::test]
async fn a_run_with_a_subagent_and_tools_is_one_trace_under_the_client_s_traceparent() {
    let backend = AgentBackend::start(vec![subagent("research")], None).await;
    let collector = Collector::start().await;
    let gw = start(&backend.url(), &traced(&collector.endpoint()));
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let (parts, body) = run(
        &gw,
        "research",
        &[
            ("traceparent", &traceparent),
            ("authorization", "Bearer sekrit-token"),
            ("last-event-id", "sg1-x-1"),
        ],
    )
    .await;
    assert_eq!(parts.status, 200);
    assert!(body.contains("data: [DONE]"), "{body}");
    let served = backend.served();
    let (root, child) = (served[0].agent.clone(), served[0].child.clone());

    collector
        .wait_for("invoke_agent (client)", |g| {
            g.span.name == "invoke_agent" && g.span.kind == CLIENT
        })
        .await;
    let spans = collector
        .wait_for("POST /* (server)", |g| g.span.name == "POST /*")
        .await;
    let server = named(&spans, "POST /*", SERVER);
    assert_eq!(server.len(), 1, "{spans:#?}");
    let server = &server[0].span;
    // The client's context continued.
    assert_eq!(hex(&server.trace_id), TRACE_ID);
    assert_eq!(hex(&server.parent_span_id), CLIENT_SPAN);
    assert_eq!(attr(server, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(attr(server, "url.scheme").as_deref(), Some("http"));
    assert_eq!(attr(server, "url.path").as_deref(), Some(RUN));
    assert_eq!(attr(server, "http.route").as_deref(), Some("/*"));
    assert_eq!(attr(server, "http.response.status_code").as_deref(), Some("200"));
    assert_ne!(server.status.as_ref().map_or(0, |s| s.code), STATUS_ERROR);
    assert_eq!(
        attr_of(&named(&spans, "POST /*", SERVER)[0].resource, "service.name").as_deref(),
        Some("gw-under-test")
    );

    let runs = named(&spans, "invoke_agent", CLIENT);
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let run = &runs[0];
    assert_eq!(run.span.trace_id, server.trace_id);
    assert_eq!(
        run.span.parent_span_id, server.span_id,
        "the run is under the request's span"
    );
    assert_eq!(
        attr(&run.span, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(attr(&run.span, "gen_ai.agent.id").as_deref(), Some(root.as_str()));
    assert_eq!(attr(&run.span, "gen_ai.provider.name").as_deref(), Some("anthropic"));
    let ttfc: f64 = attr(&run.span, "gen_ai.response.time_to_first_chunk")
        .expect("time to first chunk")
        .parse()
        .expect("a double");
    let ttfe: f64 = attr(&run.span, "sse_gateway.time_to_first_envelope")
        .expect("time to first envelope")
        .parse()
        .expect("a double");
    assert!(ttfc > 0.0 && ttfc <= ttfe, "{ttfc} {ttfe}");
    assert!(attr(&run.span, "sse_gateway.envelopes.text").is_some_and(|n| n != "0"));
    assert_eq!(attr(&run.span, "error.type"), None);
    assert_one_tool(run, "toolu_spawn", "spawn_subagent");

    // One INTERNAL span for the subagent's scope, under the run, with its own tool.
    let subs = named(&spans, "invoke_agent", INTERNAL);
    assert_eq!(subs.len(), 1, "{spans:#?}");
    let sub = subs[0];
    assert_eq!(sub.span.parent_span_id, run.span.span_id);
    assert_eq!(attr(&sub.span, "gen_ai.agent.id").as_deref(), Some(child.as_str()));
    assert_one_tool(sub, "toolu_lookup", "lookup");

    // The upstream got the gateway's own context (the run span), not the client's header.
    let recorded = backend.recorded();
    let sent = recorded[0].header("traceparent").expect("a traceparent upstream");
    assert_eq!(sent, format!("00-{TRACE_ID}-{}-01", hex(&run.span.span_id)));

    // No content, no credential, no Last-Event-ID.
    let all = every_value(&spans);
    for secret in ["research", "Paris", "sekrit", "sg1-x-1", "population"] {
        assert!(!all.contains(secret), "{secret} in the spans");
    }
}

#[tokio::test]
async fn content_is_captured_only_when_asked() {
    let backend = AgentBackend::start(vec![subagent("capture me")], None).await;
    let collector = Collector::start().await;
    let mut env = traced(&collector.endpoint());
    env.push(("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true".into()));
    let gw = start(&backend.url(), &env);
    let (_, body) = run(&gw, "capture me", &[]).await;
    assert!(body.contains("[DONE]"));
    let spans = collector
        .wait_for("the run", |g| g.span.name == "invoke_agent" && g.span.kind == CLIENT)
        .await;
    let run = named(&spans, "invoke_agent", CLIENT)[0];
    let input = attr(&run.span, "gen_ai.input.messages").expect("the user's query");
    assert!(input.contains("capture me"), "{input}");
    let sub = collector.wait_for("the subagent", |g| g.span.kind == INTERNAL).await;
    let all = every_value(&sub);
    assert!(all.contains("Paris population"), "the tool's arguments: {all}");
}

#[tokio::test]
async fn a_backend_error_and_an_upstream_cut_end_the_run_span_with_error_type() {
    let backend = AgentBackend::start(vec![failure("fail")], None).await;
    let collector = Collector::start().await;
    let gw = start(&backend.url(), &traced(&collector.endpoint()));
    let (_, body) = run(&gw, "fail", &[]).await;
    assert!(body.contains("RateLimitError"), "{body}");
    let spans = collector
        .wait_for("the failed run", |g| {
            g.span.name == "invoke_agent" && attr(&g.span, "error.type").is_some()
        })
        .await;
    let run_span = &named(&spans, "invoke_agent", CLIENT)[0].span;
    assert_eq!(attr(run_span, "error.type").as_deref(), Some("RateLimitError"));
    assert_eq!(run_span.status.as_ref().map(|s| s.code), Some(STATUS_ERROR));
    // The request itself succeeded (200): its span is not an error.
    let server = &named(&spans, "POST /*", SERVER)[0].span;
    assert_ne!(server.status.as_ref().map_or(0, |s| s.code), STATUS_ERROR);

    // The upstream resets the connection mid-stream.
    let cut = Emulator::start(|_| {
        vec![
            sse_head(),
            Step::WriteAll(b"data: <content-block-text>\n\ndata: half\n\n".to_vec()),
            Step::Reset,
        ]
    })
    .await;
    let collector = Collector::start().await;
    let gw = start(&cut.url(), &traced(&collector.endpoint()));
    let _ = run(&gw, "cut", &[]).await;
    let spans = collector
        .wait_for("the cut run", |g| {
            g.span.name == "invoke_agent" && attr(&g.span, "error.type").is_some()
        })
        .await;
    let run_span = &named(&spans, "invoke_agent", CLIENT)[0].span;
    assert_eq!(attr(run_span, "error.type").as_deref(), Some("upstream_error"));

    // No upstream at all: the request's span is a 502 (an error), the run's says why.
    let collector = Collector::start().await;
    let gw = start("http://127.0.0.1:9", &traced(&collector.endpoint()));
    let (parts, _) = run(&gw, "nobody", &[]).await;
    assert_eq!(parts.status, 502);
    let spans = collector.wait_for("the 502", |g| g.span.kind == SERVER).await;
    let server = &named(&spans, "POST /*", SERVER)[0].span;
    assert_eq!(attr(server, "http.response.status_code").as_deref(), Some("502"));
    assert_eq!(server.status.as_ref().map(|s| s.code), Some(STATUS_ERROR));
    let spans = collector.wait_for("the failed run", |g| g.span.kind == CLIENT).await;
    let run_span = &named(&spans, "invoke_agent", CLIENT)[0].span;
    assert_eq!(attr(run_span, "error.type").as_deref(), Some("upstream_error"));
}

#[tokio::test]
async fn a_reconnect_s_span_links_to_the_run_it_reads() {
    let backend = AgentBackend::start(vec![slow("slow", 20, Duration::from_millis(50))], None).await;
    let collector = Collector::start().await;
    let gw = start(&backend.url(), &traced(&collector.endpoint()));
    let (parts, body) = run(&gw, "slow", &[]).await;
    assert!(body.contains("[DONE]"));
    let url = parts
        .headers
        .get("x-gateway-stream")
        .expect("a held stream")
        .to_str()
        .expect("ascii")
        .to_owned();
    let token = url.rsplit('/').next().expect("token").to_owned();
    let (again, replay) = send(
        "GET",
        &format!("http://{}{url}", gw.addr),
        &[("accept", "text/event-stream")],
        "",
    )
    .await;
    assert_eq!(again.status, 200);
    assert!(String::from_utf8_lossy(&replay).contains("piece19"));
    let spans = collector
        .wait_for("the reconnect", |g| {
            g.span.kind == SERVER && g.span.name.starts_with("GET ")
        })
        .await;
    let spans = collector
        .wait_for("the run", |g| g.span.name == "invoke_agent")
        .await
        .into_iter()
        .chain(spans)
        .collect::<Vec<_>>();
    let run_span = &named(&spans, "invoke_agent", CLIENT)[0].span;
    let reconnect = spans
        .iter()
        .find(|g| g.span.kind == SERVER && g.span.name.starts_with("GET "))
        .expect("GET");
    assert!(reconnect.span.name.ends_with("/{token}"), "{}", reconnect.span.name);
    assert_ne!(
        reconnect.span.trace_id, run_span.trace_id,
        "a new request, its own trace"
    );
    assert!(
        reconnect
            .span
            .links
            .iter()
            .any(|l| l.span_id == run_span.span_id && l.trace_id == run_span.trace_id),
        "{:?}",
        reconnect.span.links
    );
    let path = attr(&reconnect.span, "url.path").expect("url.path");
    assert!(
        path.ends_with("/<redacted>") && !every_value(&spans).contains(&token),
        "{path}"
    );
}

#[tokio::test]
async fn a_collector_down_hanging_or_answering_garbage_changes_nothing_for_clients() {
    let backend = AgentBackend::start(vec![subagent("a"), subagent("b"), subagent("c"), subagent("d")], None).await;
    let reference = start(&backend.url(), &[]);
    let (_, want) = run(&reference, "a", &[]).await;
    let count = |s: &str| s.matches("\n\n").count();
    let hanging = Collector::scripted(Vec::new(), Answer::Hang).await;
    let garbage = Collector::scripted(Vec::new(), Answer::Garbage).await;
    for (prompt, endpoint, collector) in [
        ("b", "http://127.0.0.1:9".to_owned(), None),
        ("c", hanging.endpoint(), Some(&hanging)),
        ("d", garbage.endpoint(), Some(&garbage)),
    ] {
        let mut env = traced(&endpoint);
        env.push(("OTEL_EXPORTER_OTLP_TIMEOUT", "200".into()));
        let gw = start(&backend.url(), &env);
        for _ in 0..3 {
            let (parts, got) = run(&gw, prompt, &[]).await;
            assert_eq!(parts.status, 200, "{endpoint}");
            assert!(got.contains("data: [DONE]\n"), "{endpoint}: {got}");
            assert_eq!(
                count(&got),
                count(&want),
                "{endpoint}: the same stream as without traces"
            );
        }
        assert_eq!(gw.metric("sse_gateway_active_streams", &[]).await, 0.0);
        if let Some(c) = collector {
            let deadline = std::time::Instant::now() + harness::PATIENCE;
            while c.requests().is_empty() {
                assert!(std::time::Instant::now() < deadline, "{endpoint}: the exporter tried");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Still serving while its exporter waits or fails.
        let (parts, _) = run(&gw, prompt, &[]).await;
        assert_eq!(parts.status, 200);
    }
}

#[tokio::test]
async fn a_503_with_retry_after_is_retried_and_the_spans_arrive() {
    let backend = AgentBackend::start(vec![subagent("retry")], None).await;
    let collector = Collector::scripted(vec![Answer::Status(503, Some("1"))], Answer::Status(200, None)).await;
    let gw = start(&backend.url(), &traced(&collector.endpoint()));
    let (_, body) = run(&gw, "retry", &[]).await;
    assert!(body.contains("[DONE]"));
    collector.wait_for("the run", |g| g.span.name == "invoke_agent").await;
    let requests = collector.requests();
    assert!(requests.len() >= 2, "{requests:?}");
    assert!(
        requests.iter().all(|(_, decoded)| *decoded),
        "every export is OTLP protobuf"
    );
    let waited = requests[1].0 - requests[0].0;
    assert!(
        waited >= Duration::from_millis(950),
        "Retry-After: 1 honoured ({waited:?})"
    );
    assert_eq!(gw.metric("sse_gateway_otel_spans_dropped_total", &[]).await, 0.0);
}

#[tokio::test]
async fn a_full_queue_drops_spans_and_counts_them_and_gzip_is_sent_when_asked() {
    let backend = AgentBackend::start((0..6).map(|i| subagent(&format!("q{i}"))).collect(), None).await;
    let hanging = Collector::scripted(Vec::new(), Answer::Hang).await;
    let mut env = traced(&hanging.endpoint());
    env.push(("OTEL_BSP_MAX_QUEUE_SIZE", "2".into()));
    let gw = start(&backend.url(), &env);
    for i in 0..6 {
        let (_, body) = run(&gw, &format!("q{i}"), &[]).await;
        assert!(body.contains("[DONE]"));
    }
    let dropped = gw
        .metric("sse_gateway_otel_spans_dropped_total", &["reason=\"queue_full\""])
        .await;
    assert!(dropped > 0.0, "spans dropped and counted: {dropped}");

    let backend = AgentBackend::start(vec![subagent("zip")], None).await;
    let collector = Collector::start().await;
    let mut env = traced(&collector.endpoint());
    env.push(("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip".into()));
    env.push(("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=abc%20def".into()));
    let gw = start(&backend.url(), &env);
    let _ = run(&gw, "zip", &[]).await;
    collector
        .wait_for("a gzipped export", |g| g.span.name == "invoke_agent")
        .await;
    let sent_as = collector.sent_as();
    assert!(
        sent_as
            .iter()
            .all(|(gzip, key)| *gzip && key.as_deref() == Some("abc def")),
        "every export gzipped, with the %-decoded header: {sent_as:?}"
    );
}

#[tokio::test]
async fn an_incoming_traceparent_is_only_linked_when_the_gateway_faces_the_public() {
    let backend = AgentBackend::start(vec![subagent("public")], None).await;
    let collector = Collector::start().await;
    let mut env = traced(&collector.endpoint());
    env.push(("SSE_GATEWAY__TELEMETRY__INCOMING_TRACE", "link".into()));
    let gw = start(&backend.url(), &env);
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let _ = run(&gw, "public", &[("traceparent", &traceparent)]).await;
    let spans = collector.wait_for("the request", |g| g.span.kind == SERVER).await;
    let server = &named(&spans, "POST /*", SERVER)[0].span;
    assert_ne!(hex(&server.trace_id), TRACE_ID, "a new root");
    assert!(server.parent_span_id.is_empty());
    assert!(server
        .links
        .iter()
        .any(|l| hex(&l.trace_id) == TRACE_ID && hex(&l.span_id) == CLIENT_SPAN));
}

#[tokio::test]
async fn without_an_endpoint_or_when_disabled_nothing_is_sent() {
    let backend = AgentBackend::start(vec![subagent("x"), subagent("y")], None).await;
    let collector = Collector::start().await;
    // Disabled although an endpoint is given.
    let mut env = traced(&collector.endpoint());
    env.push(("OTEL_SDK_DISABLED", "true".into()));
    let gw = start(&backend.url(), &env);
    let _ = run(&gw, "x", &[]).await;
    // No endpoint: the client's traceparent goes on untouched, as for any proxy.
    let plain = start(&backend.url(), &[("OTEL_SERVICE_NAME", "x".into())]);
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let _ = run(&plain, "y", &[("traceparent", &traceparent)]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(collector.requests().is_empty());
    assert!(
        !plain.metrics().await.contains("otel_spans_dropped"),
        "no exporter registered"
    );
    let recorded = backend.recorded();
    assert_eq!(
        recorded.last().and_then(|r| r.header("traceparent")),
        Some(traceparent.as_str())
    );
}

#[test]
fn grpc_and_bad_otel_values_are_refused_at_start_naming_the_variable() {
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "lots"),
        ("OTEL_TRACES_SAMPLER", "coin_flip"),
    ] {
        let out = bin()
            .args(["--upstream", "http://127.0.0.1:9", "--check-config"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            .env(var, value)
            .output()
            .expect("run the gateway");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {err}");
        assert!(err.contains(var), "{var}: {err}");
    }
}

#[tokio::test]
async fn a_frontend_s_thread_is_the_run_s_conversation_and_its_path_the_route() {
    let backend = AgentBackend::start(vec![subagent("hello thread")], None).await;
    let collector = Collector::start().await;
    let config = std::env::temp_dir().join(format!("sse-gw-traces-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        "[[frontend]]\npath = \"/agui\"\nprotocol = \"ag-ui\"\nrun = \"/agent/run\"\ntool_results = \"/agent/tool_results\"\n",
    )
    .expect("config");
    let env = traced(&collector.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let gw = Process::start(
        &["--upstream", &backend.url(), "--config", config.to_str().expect("path")],
        &env,
    );
    let input = serde_json::json!({
        "threadId": "thread-42", "runId": "run-1", "state": {}, "tools": [], "context": [], "forwardedProps": {},
        "messages": [{"id": "m1", "role": "user", "content": "hello thread"}],
    });
    let (parts, body) = send(
        "POST",
        &format!("http://{}/agui", gw.addr),
        &[("content-type", "application/json"), ("accept", "text/event-stream")],
        input.to_string(),
    )
    .await;
    let _ = std::fs::remove_file(&config);
    assert_eq!(parts.status, 200);
    assert!(String::from_utf8_lossy(&body).contains("RUN_FINISHED"));
    let spans = collector.wait_for("the run", |g| g.span.kind == CLIENT).await;
    let run_span = &named(&spans, "invoke_agent", CLIENT)[0].span;
    assert_eq!(attr(run_span, "gen_ai.conversation.id").as_deref(), Some("thread-42"));
    let spans = collector.wait_for("the request", |g| g.span.kind == SERVER).await;
    let server = &named(&spans, "POST /agui", SERVER)[0].span;
    assert_eq!(attr(server, "http.route").as_deref(), Some("/agui"));
    assert_eq!(run_span.parent_span_id, server.span_id);
}
