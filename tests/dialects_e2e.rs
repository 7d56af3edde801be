//! Issue 29 end to end: the `cogency` and `agent_sdk` dialects (DESIGN 3.7) through the real binary, in front of a
//! backend emulator on 127.0.0.1 that serves each recorded fixture of tests/fixtures/dialects byte for byte (in
//! random pieces, so the gateway sees them split anywhere).
//!
//! - Every fixture's translated stream, reassembled block by block, equals its `<name>.expected.json` (the schema
//!   is in tests/fixtures/dialects/README.md): read by our strict reader under `auto` and under the dialect the
//!   request names, and read by the legacy web app's own client, npm `@microsoft/fetch-event-source` under node,
//!   JSON-parsing each message as the app does (tests/external/node/dialect-client.mjs; installed by
//!   `.ci/external-clients.sh`, skipped with a note when missing, except under `CI=true`).
//! - Inputs that are not the dialect, or not whole (`other_*` under `auto`, `fixed_<dialect>_*` under their dialect), get
//!   a counted `error` envelope per bad event and a clean end.
//! - Resumption: a client cut mid-stream reconnects with `Last-Event-ID` and gets the rest exactly once, with the
//!   ids and envelopes a fresh read of the same run gets.
//! - The per-request dialect (`X-Stream-Dialect`, `stream_dialect=`): it overrides `translate.dialect` both ways, a
//!   bad value is a counted 400 that never reaches the upstream, and the header is not forwarded.
//! - `--demo-dialect cogency|agent_sdk`: the binary with no upstream serves a translated run of that dialect.

mod harness;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::blocks;
use harness::node::node_with_or_skip;
use harness::prelude::*;
use harness::sse::{clip, split_id};
use serde_json::{json, Value};

/// The fallback agent every request names (`X-Agent-Id`): the root agent of a stream that names none.
const AGENT: &str = "root-agent";
/// Bound on any single wait of these tests: reaching it is a failure.
const WAIT: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------------------------------------------------
// The fixtures and the emulator serving them.
// ------------------------------------------------------------------------------------------------------------

/// One recorded upstream body and the blocks its translation must carry.
#[derive(Clone)]
struct Fixture {
    name: String,
    sse: Vec<u8>,
    expected: Vec<Value>,
}

impl Fixture {
    /// The dialect its prefix names (`other_*`: none).
    fn dialect(&self) -> Option<&'static str> {
        if self.name.starts_with("cogency") {
            Some("cogency")
        } else if self.name.starts_with("agent_sdk") {
            Some("agent_sdk")
        } else {
            None
        }
    }

    /// Where the emulator serves it.
    fn path(&self) -> String {
        format!("/fx/{}", self.name)
    }

    /// The SSE events of its body, each with its blank line (a truncated tail is the last piece).
    fn events(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = &self.sse[..];
        while let Some(end) = find(rest, b"\n\n") {
            out.push(rest[..end + 2].to_vec());
            rest = &rest[end + 2..];
        }
        if !rest.is_empty() {
            out.push(rest.to_vec());
        }
        out
    }
}

/// The fixtures whose names start with one of `prefixes`, by name.
fn fixtures(prefixes: &[&str]) -> Vec<Fixture> {
    blocks::names()
        .into_iter()
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .map(|name| Fixture {
            sse: blocks::input(&name),
            expected: blocks::expected(&name),
            name,
        })
        .collect()
}

/// The dialect fixtures proper (the issue's three families).
fn dialect_fixtures() -> Vec<Fixture> {
    let all = fixtures(&["cogency_", "cogency30_", "agent_sdk_"]);
    assert!(all.len() >= 20, "the fixtures are missing: {}", all.len());
    all
}

/// An emulator serving each fixture on its [`Fixture::path`] (query ignored), in random pieces; 404 otherwise.
async fn serving(fixtures: &[Fixture]) -> Emulator {
    let by_path: Vec<(String, Vec<u8>)> = fixtures.iter().map(|f| (f.path(), f.sse.clone())).collect();
    Emulator::start(move |req| {
        let path = req.target.split('?').next().unwrap_or("");
        match by_path.iter().find(|(p, _)| p == path) {
            Some((_, sse)) => vec![sse_head(), Step::Write(sse.clone()), Step::EndChunks],
            None => Step::answer(404, &[], b"no such fixture"),
        }
    })
    .await
}

// ------------------------------------------------------------------------------------------------------------
// Reading the gateway: a raw client and our strict reader.
// ------------------------------------------------------------------------------------------------------------

/// A raw HTTP/1.1 POST as a translating SSE client sends it (fetch-event-source's headers, the fallback agent),
/// `extra` added, the run's body `{}`.
fn request_bytes(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nHost: gateway\r\naccept: text/event-stream\r\ncontent-type: application/json\r\n\
         x-agent-id: {AGENT}\r\n"
    );
    for (k, v) in extra {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("Connection: close\r\nContent-Length: 2\r\n\r\n{}");
    r.into_bytes()
}

/// Opens a run: the request sent, the response head read.
async fn open(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Client {
    let mut c = Client::write(addr, &request_bytes(path, extra)).await.expect("connect");
    tokio::time::timeout(WAIT, c.read_head())
        .await
        .expect("a response head in time")
        .expect("a response head");
    c
}

/// One whole run as read: status, head, body. `Err` when the body did not end cleanly (its last chunk) in time.
async fn whole(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Result<(u16, String, Vec<u8>), String> {
    let mut c = open(addr, path, extra).await;
    c.read_to_end(WAIT).await?;
    Ok((c.status, c.head, c.body))
}

/// A translated run read strictly ([`parse_stream`]: every line a comment or `data:`, every envelope with its
/// four fields, ids consecutive): its envelopes, and whether it ended with `[DONE]`.
async fn translated(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Result<(Vec<Value>, bool), String> {
    let (status, head, body) = whole(addr, path, extra).await?;
    if status != 200 {
        return Err(format!(
            "status {status}: {}",
            clip(&String::from_utf8_lossy(&body), 300)
        ));
    }
    if header_value(&head.to_ascii_lowercase(), "x-stream-format") != Some("json") {
        return Err(format!("not translated: {head}"));
    }
    let events = parse_stream(&body)?;
    let data: Vec<&Out> = events.iter().filter(|e| !matches!(e, Out::Comment(_))).collect();
    if let Some(at) = data.iter().position(|e| **e == Out::Done) {
        if at + 1 != data.len() {
            return Err("events after [DONE]".to_owned());
        }
    }
    Ok((envelope_values(&events), data.last() == Some(&&Out::Done)))
}

// ------------------------------------------------------------------------------------------------------------
// Reassembly and the comparison with expected.json (tests/fixtures/dialects/README.md).
// ------------------------------------------------------------------------------------------------------------

/// Every block the stream opened was closed (`final:true`): reassembly alone would not tell.
fn all_closed(envelopes: &[Value]) -> Result<(), String> {
    let mut open: Vec<(&Value, &Value, Option<&Value>)> = Vec::new();
    for v in envelopes.iter().filter(|v| kind(v) != "tool_result_image") {
        let key = (&v["type"], &v["agent"], v.get("id"));
        if !open.contains(&key) {
            open.push(key);
        }
        if is_final(v) {
            open.retain(|k| *k != key);
        }
    }
    match open.first() {
        None => Ok(()),
        Some(k) => Err(format!("a block never closed (no final:true): {k:?}")),
    }
}

/// Compares a stream's envelopes with expected blocks (tests/harness/blocks.rs; the root agent is whatever the
/// translator calls the first block's); `Err` says where they first differ.
fn compare(envelopes: &[Value], expected: &[Value]) -> Result<(), String> {
    all_closed(envelopes)?;
    let (got, _) = blocks::reassemble(envelopes);
    let root = got
        .first()
        .and_then(|b| b["agent"].as_str())
        .unwrap_or(AGENT)
        .to_owned();
    blocks::compare("stream", &got, expected, &root)
}

/// A fixture's run as read, against its expected blocks: the blocks, and `[DONE]` at a clean end (the blocks end
/// with `meta_final`: the gateway writes the frontends' usual end, since neither dialect's backend sends one).
fn check_run(f: &Fixture, envelopes: &[Value], done: bool) -> Result<(), String> {
    compare(envelopes, &f.expected)?;
    if blocks::ends_done(&f.expected) && !done {
        return Err("a clean end without [DONE]".to_owned());
    }
    Ok(())
}

/// Panics with every failure, one paragraph each, if there is any.
fn assert_none_failed(what: &str, failures: &[String], of: usize) {
    assert!(
        failures.is_empty(),
        "{what}: {} of {of} failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// ------------------------------------------------------------------------------------------------------------
// 1. Every fixture through the binary, reassembled against expected.json.
// ------------------------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_translates_to_its_expected_blocks_under_auto_and_under_its_named_dialect() {
    let all = dialect_fixtures();
    let up = serving(&all).await;
    let gw = Process::against(&up.url(), &[]);
    let mut failures = Vec::new();
    for f in &all {
        let named = f.dialect().expect("a dialect fixture");
        for extra in [vec![], vec![("x-stream-dialect", named)]] {
            let read = translated(gw.addr, &f.path(), &extra).await;
            if let Err(why) = read.and_then(|(envs, done)| check_run(f, &envs, done)) {
                let how = if extra.is_empty() { "auto" } else { named };
                failures.push(format!("{} ({how}): {why}", f.name));
            }
        }
    }
    assert_none_failed("fixtures through the gateway", &failures, all.len() * 2);
}

/// The output of `node dialect-client.mjs AGENT URL…`: one JSON line per URL, or `None` when node or the package is
/// missing (a failure under CI). The client is killed if it outlives `WAIT`.
fn web_app_reads(urls: &[String]) -> Option<Vec<Value>> {
    if !node_with_or_skip(
        "node with @microsoft/fetch-event-source",
        &["@microsoft/fetch-event-source"],
    ) {
        return None;
    }
    let mut cmd = Command::new("node");
    cmd.arg("tests/external/node/dialect-client.mjs").arg(AGENT).args(urls);
    let ran = harness::node::run(cmd, WAIT);
    let status = ran
        .status
        .unwrap_or_else(|| panic!("the node client did not finish within {WAIT:?}"));
    assert!(status.success(), "the node client failed: {}", ran.stderr);
    let out = ran.stdout;
    Some(
        out.lines()
            .map(|l| serde_json::from_str(l).expect("one JSON line per URL"))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_apps_own_client_reads_every_fixture_as_its_expected_blocks() {
    let all = dialect_fixtures();
    let up = serving(&all).await;
    let gw = Process::against(&up.url(), &[]);
    let urls: Vec<String> = all.iter().map(|f| format!("http://{}{}", gw.addr, f.path())).collect();
    let Some(reads) = tokio::task::spawn_blocking(move || web_app_reads(&urls))
        .await
        .expect("join")
    else {
        return;
    };
    assert_eq!(reads.len(), all.len(), "one read per URL");
    let mut failures = Vec::new();
    for (f, read) in all.iter().zip(&reads) {
        assert_eq!(read["url"], json!(format!("http://{}{}", gw.addr, f.path())));
        let result = match read["error"].as_str() {
            Some(e) => Err(format!("the client failed: {e}")),
            None => {
                let envs = read["envelopes"].as_array().cloned().unwrap_or_default();
                check_run(f, &envs, read["done"] == json!(true))
            }
        };
        if let Err(why) = result {
            failures.push(format!("{}: {why}", f.name));
        }
    }
    assert_none_failed("fixtures read by fetch-event-source", &failures, all.len());
}

// ------------------------------------------------------------------------------------------------------------
// 2. Not the dialect, or not whole: a counted error envelope per bad event, and a clean end.
// ------------------------------------------------------------------------------------------------------------

/// The readings of the inputs that are not a dialect's run, whole: the `other_` fixtures under `auto`, each with its
/// own expectation, and the `fixed_<dialect>_` ones under that dialect (bad events in every position, the streams
/// of no dialect read as one).
fn other_readings() -> Vec<(Fixture, Option<&'static str>)> {
    let others = fixtures(&["other_"]);
    assert!(others.len() >= 4, "the other_ fixtures are missing");
    let mut readings: Vec<(Fixture, Option<&str>)> = others.into_iter().map(|f| (f, None)).collect();
    for dialect in ["cogency", "agent_sdk"] {
        let fixed = fixtures(&[&format!("fixed_{dialect}_")]);
        assert!(fixed.len() >= 4, "the fixed_{dialect}_ fixtures are missing");
        readings.extend(fixed.into_iter().map(|f| (f, Some(dialect))));
    }
    readings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_that_are_not_the_dialect_or_not_whole_end_cleanly_with_the_counted_error() {
    let readings = other_readings();
    let served: Vec<Fixture> = readings.iter().map(|(f, _)| f.clone()).collect();
    let up = serving(&served).await;
    // The translator's own answer (`translate.require_done` off): exactly the fixture's blocks. Under the default
    // the daemon also says that a run cut short did not end as its dialect ends: one `upstream_error` more
    // (docs/TRANSLATION.md, "The run's end"); a stream `auto` refused is its one error.
    for require_done in [false, true] {
        let env = [(
            "SSE_GATEWAY__TRANSLATE__REQUIRE_DONE",
            if require_done { "true" } else { "false" },
        )];
        let gw = Process::against(&up.url(), &env);
        let mut failures = Vec::new();
        let mut errors_sent = 0.0;
        for (f, dialect) in &readings {
            let extra: Vec<(&str, &str)> = dialect.iter().map(|d| ("x-stream-dialect", *d)).collect();
            // A run ends as its dialect ends one, or with the backend's `[DONE]`, bad events or not.
            let ends = blocks::ends_done(&f.expected) || f.sse.ends_with(b"data: [DONE]\n\n");
            let refused = f.name == "other_json_shape";
            let mut expected = f.expected.clone();
            if require_done && !ends && !refused {
                expected.push(json!({"kind": "error", "agent": "$root", "format": "gateway", "content": null}));
            }
            let how = format!(
                "{} ({}, require_done {require_done})",
                f.name,
                dialect.unwrap_or("auto")
            );
            match translated(gw.addr, &f.path(), &extra).await {
                Ok((envs, done)) => {
                    errors_sent += count_parse_errors(&envs);
                    let last = envs.last().map(error_type).unwrap_or_default();
                    let want_last = if require_done && !refused {
                        "upstream_error"
                    } else {
                        "parse_error"
                    };
                    let result = compare(&envs, &expected).and_then(|()| {
                        if done != ends {
                            Err(format!("[DONE] at the end: {done}, expected {ends}"))
                        } else if !ends && last != want_last {
                            Err(format!("the last error is {last:?}, not {want_last}"))
                        } else {
                            Ok(())
                        }
                    });
                    if let Err(why) = result {
                        failures.push(format!("{how}: {why}"));
                    }
                }
                Err(why) => failures.push(format!("{how}: {why}")),
            }
        }
        assert_none_failed("inputs that are not the dialect", &failures, readings.len());
        assert!(errors_sent >= 1.0, "no parse_error envelope was sent");
        let counted = gw.metric("sse_gateway_parse_errors_total", &[]).await;
        assert_eq!(counted, errors_sent, "every parse_error envelope is counted");
    }
}

/// How many of `envs` are `error` envelopes of type `parse_error`.
fn count_parse_errors(envs: &[Value]) -> f64 {
    envs.iter()
        .filter(|e| kind(e) == "error" && error_type(e) == "parse_error")
        .count() as f64
}

// ------------------------------------------------------------------------------------------------------------
// 3. Resumption: cut mid-stream, reconnect with Last-Event-ID.
// ------------------------------------------------------------------------------------------------------------

/// One event of the gateway's output: its id's position and its data (comments left out).
fn positions(body: &[u8]) -> Vec<(u64, String)> {
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    let mut rest: &str = &text;
    while let Some(end) = rest.find("\n\n") {
        let event = &rest[..end];
        rest = &rest[end + 2..];
        let id = event.lines().find_map(|l| l.strip_prefix("id: "));
        let data = event.lines().find_map(|l| l.strip_prefix("data: "));
        if let Some(data) = data {
            let id = id.unwrap_or_else(|| panic!("an event without an id: {event:?}"));
            let (_, seq) = split_id(id).unwrap_or_else(|| panic!("not one of our ids: {id}"));
            out.push((seq, data.to_owned()));
        }
    }
    out
}

/// Reads until the body holds at least `n` complete events.
async fn read_events(c: &mut Client, n: usize) -> Result<(), String> {
    let deadline = Instant::now() + WAIT;
    while positions(&c.body).len() < n {
        if c.ended {
            return Err(format!("the stream ended before {n} events"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("fewer than {n} events within {WAIT:?}"));
        }
        let _ = tokio::time::timeout(left, c.read_some(64 << 10)).await;
    }
    Ok(())
}

/// A fixture served paced, one event per `gap`, so that a client can leave in the middle of it.
async fn paced_fixture(f: &Fixture, gap: Duration) -> Emulator {
    let steps = paced(f.events(), gap);
    Emulator::always(steps).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_mid_dialect_stream_resumes_with_the_rest_exactly_once_and_the_ids_of_a_fresh_read() {
    let chosen = ["cogency30_long_respond", "agent_sdk_partial_on"];
    for f in dialect_fixtures()
        .into_iter()
        .filter(|f| chosen.contains(&f.name.as_str()))
    {
        let n = f.events().len();
        assert!(n >= 20, "{}: too short to cut ({n} events)", f.name);
        let up = paced_fixture(&f, Duration::from_millis(25)).await;
        let gw = Process::against(&up.url(), &[("SSE_GATEWAY__RESUME__GRACE_SECS", "5")]);
        // A fresh read of the same run, for reference (the upstream serves it again).
        let fresh = tokio::spawn({
            let addr = gw.addr;
            async move { whole(addr, "/fresh", &[]).await }
        });
        let mut c = open(gw.addr, "/agent/run", &[]).await;
        assert_eq!(c.status, 200, "{}: {}", f.name, c.head);
        assert!(
            header_value(&c.head.to_ascii_lowercase(), "x-gateway-stream").is_some(),
            "{}: not resumable: {}",
            f.name,
            c.head
        );
        // Leave after a few events, while the upstream is still sending.
        read_events(&mut c, 6)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let first = positions(&c.body);
        let last = first.last().expect("events").0;
        let token_of = |body: &[u8]| {
            let text = String::from_utf8_lossy(body);
            let id = text
                .lines()
                .find_map(|l| l.strip_prefix("id: "))
                .expect("an id")
                .to_owned();
            split_id(&id).expect("our id").0.to_owned()
        };
        let token = token_of(&c.body);
        c.disconnect(true);
        assert!(
            up.conn("/agent/run").is_some_and(|l| !l.done),
            "{}: the upstream ended before the reconnect: not a cut mid-stream",
            f.name
        );
        let last_id = format!("sg1-{token}-{last}");
        let (status, _, rest) = whole(gw.addr, "/agent/run", &[("last-event-id", &last_id)])
            .await
            .unwrap_or_else(|e| panic!("{}: the reconnect: {e}", f.name));
        assert_eq!(status, 200, "{}: the reconnect", f.name);
        assert_eq!(token_of(&rest), token, "{}: the reconnect is the same stream", f.name);
        let rest = positions(&rest);
        assert_eq!(
            rest.first().map(|e| e.0),
            Some(last + 1),
            "{}: the rest starts right after the last id",
            f.name
        );
        let mut joined = first.clone();
        joined.extend(rest);
        let (status, _, fresh_body) = tokio::time::timeout(WAIT, fresh)
            .await
            .expect("the fresh read in time")
            .expect("join")
            .unwrap_or_else(|e| panic!("{}: the fresh read: {e}", f.name));
        assert_eq!(status, 200);
        let fresh = positions(&fresh_body);
        assert_eq!(
            joined, fresh,
            "{}: the cut and resumed read differs from a fresh one",
            f.name
        );
        // And what both read is the fixture's translation.
        let envs: Vec<Value> = fresh
            .iter()
            .filter(|(_, d)| d != "[DONE]")
            .map(|(_, d)| serde_json::from_str(d).expect("an envelope"))
            .collect();
        let done = fresh.last().is_some_and(|(_, d)| d == "[DONE]");
        check_run(&f, &envs, done).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let runs = up.recorded().iter().filter(|r| r.target == "/agent/run").count();
        assert_eq!(runs, 1, "{}: the reconnect went upstream", f.name);
    }
}

// ------------------------------------------------------------------------------------------------------------
// 4. The per-request dialect.
// ------------------------------------------------------------------------------------------------------------

/// The fixture the per-request tests serve.
fn call_result() -> Fixture {
    fixtures(&["cogency_call_result"]).remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_cogency_is_translated_as_cogency_under_a_gateway_fixed_to_xml() {
    let f = call_result();
    let up = serving(std::slice::from_ref(&f)).await;
    let gw = Process::against(&up.url(), &[("SSE_GATEWAY__TRANSLATE__DIALECT", "xml")]);
    // The gateway is fixed to xml: unnamed, the stream is not read as cogency.
    let (envs, _) = translated(gw.addr, &f.path(), &[]).await.expect("a translated stream");
    assert!(
        compare(&envs, &f.expected).is_err() && count_parse_errors(&envs) >= 1.0,
        "under translate.dialect = xml an unnamed cogency stream must not translate: {envs:?}"
    );
    for (path, extra) in [
        (f.path(), vec![("x-stream-dialect", "cogency")]),
        (f.path(), vec![("X-Stream-Dialect", "Cogency")]),
        (format!("{}?stream_dialect=cogency", f.path()), vec![]),
        // The header wins over the query.
        (
            format!("{}?stream_dialect=xml", f.path()),
            vec![("x-stream-dialect", "cogency")],
        ),
    ] {
        let (envs, done) = translated(gw.addr, &path, &extra)
            .await
            .unwrap_or_else(|e| panic!("{path} {extra:?}: {e}"));
        check_run(&f, &envs, done).unwrap_or_else(|e| panic!("{path} {extra:?}: {e}"));
    }
    // The choice is the gateway's own: never forwarded (the query string is, unchanged).
    let recorded = up.recorded();
    assert!(
        recorded.iter().all(|r| r.header("x-stream-dialect").is_none()),
        "{recorded:?}"
    );
    assert!(recorded.iter().any(|r| r.target.ends_with("?stream_dialect=cogency")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_xml_on_a_cogency_stream_gets_the_counted_error_and_a_clean_end() {
    let f = call_result();
    let up = serving(std::slice::from_ref(&f)).await;
    let gw = Process::against(&up.url(), &[]);
    // Unnamed, `auto` reads it as cogency.
    let (envs, done) = translated(gw.addr, &f.path(), &[]).await.expect("auto");
    check_run(&f, &envs, done).expect("auto reads the cogency stream");
    let before = gw.metric("sse_gateway_parse_errors_total", &[]).await;
    // `translated` checks the clean end: the response's last chunk, every event whole.
    let (envs, _) = translated(gw.addr, &f.path(), &[("x-stream-dialect", "xml")])
        .await
        .expect("a translated stream with a clean end");
    assert!(!envs.is_empty());
    for e in &envs {
        assert_eq!(
            kind(e),
            "error",
            "only error envelopes: nothing of the stream read as xml: {e}"
        );
        assert!(
            matches!(error_type(e).as_str(), "parse_error" | "upstream_error"),
            "{e}"
        );
    }
    let sent = count_parse_errors(&envs);
    assert!(sent >= 1.0, "{envs:?}");
    let counted = gw.metric("sse_gateway_parse_errors_total", &[]).await - before;
    assert_eq!(counted, sent, "each parse_error envelope counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_dialect_is_a_counted_400_that_never_reaches_the_upstream() {
    let f = call_result();
    let up = serving(std::slice::from_ref(&f)).await;
    let gw = Process::against(&up.url(), &[]);
    let cases = [
        (f.path(), vec![("x-stream-dialect", "html")]),
        (f.path(), vec![("x-stream-dialect", "")]),
        (f.path(), vec![("x-stream-dialect", "agent-sdk")]),
        // A bad header is refused even when the query names a good one.
        (
            format!("{}?stream_dialect=cogency", f.path()),
            vec![("x-stream-dialect", "json")],
        ),
        (format!("{}?stream_dialect=yaml", f.path()), vec![]),
        // Refused whether or not the response would be translated.
        (
            f.path(),
            vec![("x-stream-dialect", "nope"), ("x-stream-format", "legacy")],
        ),
    ];
    for (path, extra) in &cases {
        let (status, head, body) = whole(gw.addr, path, extra).await.expect("an answer");
        assert_eq!(status, 400, "{path} {extra:?}: {head}");
        let v: Value = serde_json::from_slice(&body).expect("a JSON body");
        assert_eq!(v["error"], "bad_stream_dialect", "{path} {extra:?}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| m.contains("agent_sdk")), "{v}");
    }
    assert!(up.recorded().is_empty(), "a refused request reached the upstream");
    let m = gw.metrics().await;
    let refused = metric(
        &m,
        "sse_gateway_requests_total",
        &["mode=\"passthrough\"", "status_class=\"4xx\""],
    );
    assert_eq!(refused, cases.len() as f64, "every refusal counted");
}

// ------------------------------------------------------------------------------------------------------------
// 5. The demo backend in each new dialect.
// ------------------------------------------------------------------------------------------------------------

/// The binary with no upstream and `--demo-dialect dialect`: one run's envelopes, after `[DONE]`.
async fn demo_run(dialect: &str) -> (Vec<Value>, Arc<std::sync::Mutex<Vec<String>>>) {
    // No upstream: the demo backend.
    let gw = Process::start(&["--demo-dialect", dialect], &[]);
    let (status, _, body) = whole(gw.addr, "/agent/run", &[])
        .await
        .unwrap_or_else(|e| panic!("{dialect}: {e}\n{}", gw.log_tail()));
    assert_eq!(status, 200, "{dialect}");
    let events = parse_stream(&body).unwrap_or_else(|e| panic!("{dialect}: {e}"));
    let data: Vec<&Out> = events.iter().filter(|e| !matches!(e, Out::Comment(_))).collect();
    assert_eq!(data.last(), Some(&&Out::Done), "{dialect}: the run ends with [DONE]");
    (envelope_values(&events), Arc::clone(&gw.stdout_lines))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_serves_a_translated_run_in_cogency_and_in_agent_sdk() {
    for (dialect, kinds, agents) in [
        (
            "cogency",
            &[
                "meta_init",
                "thinking",
                "tool_call",
                "tool_result",
                "text",
                "meta_final",
            ][..],
            1,
        ),
        (
            "agent_sdk",
            &[
                "meta_init",
                "thinking",
                "text",
                "tool_call",
                "tool_result",
                "meta_final",
            ][..],
            2,
        ),
    ] {
        let (envs, stdout) = demo_run(dialect).await;
        let seen: BTreeSet<&str> = envs.iter().map(kind).collect();
        for k in kinds {
            assert!(seen.contains(k), "{dialect}: the demo run lacks {k}: {seen:?}");
        }
        assert!(!seen.contains("error"), "{dialect}: translated with errors: {envs:?}");
        assert_eq!(kind(&envs[0]), "meta_init", "{dialect}");
        assert_eq!(kind(envs.last().expect("envelopes")), "meta_final", "{dialect}");
        let who: BTreeSet<&str> = envs.iter().filter_map(|e| e["agent"].as_str()).collect();
        assert_eq!(who.len(), agents, "{dialect}: agents {who:?}");
        let printed = stdout.lock().expect("lock").join("\n");
        assert!(printed.contains(&format!("speaking {dialect}")), "{printed}");
    }
}

// ------------------------------------------------------------------------------------------------------------
// The comparison itself: it accepts a known translation and catches what it is there to catch.
// ------------------------------------------------------------------------------------------------------------

#[test]
fn the_comparison_accepts_a_known_translation_and_catches_each_kind_of_difference() {
    // A multimodal tool result as the xml dialect translates it (tests/fixtures/xml_tool_result_multimodal.jsonl).
    let text = std::fs::read_to_string("tests/fixtures/xml_tool_result_multimodal.jsonl").expect("fixture");
    let envs: Vec<Value> = text
        .lines()
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).expect("an envelope"))
        .collect();
    let image = |src: &str, media: &str| {
        json!({"kind": "tool_result_image", "agent": "$root", "id": "toolu_05", "name": "screenshot", "src": src,
               "media_type": media, "format": "text", "content": ""})
    };
    let expected = vec![
        json!({"kind": "meta_init", "agent": "$root", "format": "json", "content": {"format": "json",
               "user_query": "What's <new> & \"next\"?", "agent_uuid": "agent-1", "parent_agent_uuid": null,
               "model": "claude-x"}}),
        json!({"kind": "tool_call", "agent": "$root", "id": "toolu_05", "name": "screenshot", "format": "json",
               "content": {}}),
        json!({"kind": "tool_result", "agent": "$root", "id": "toolu_05", "name": "screenshot", "format": "text",
               "content": "Two shots:\nsee below"}),
        image("https://img.example.com/a.png?w=1&h=2", "image/png"),
        image("data:image/jpeg;base64,/9j/4AAQ", "image/jpeg"),
    ];
    compare(&envs, &expected).expect("the known translation");
    let changed = |at: usize, f: &dyn Fn(&mut Value)| {
        let mut e = envs.clone();
        f(&mut e[at]);
        compare(&e, &expected)
    };
    assert!(
        changed(2, &|v| v["delta"] = json!("Two shots:\nsee belov")).is_err(),
        "a byte of text"
    );
    assert!(changed(1, &|v| v["id"] = json!("toolu_06")).is_err(), "an id");
    assert!(
        changed(1, &|v| v["delta"] = json!("{\"a\": 1}")).is_err(),
        "a JSON value"
    );
    let renamed: Vec<Value> = envs
        .iter()
        .map(|v| {
            let mut v = v.clone();
            v["agent"] = json!("agent-2");
            v
        })
        .collect();
    assert!(
        compare(&renamed, &expected).is_ok(),
        "the root is whatever the stream calls it"
    );
    assert!(changed(1, &|v| v["agent"] = json!("agent-2")).is_err(), "an agent");
    assert!(changed(5, &|v| v["final"] = json!(false)).is_err(), "a block left open");
    assert!(
        changed(3, &|v| v["media_type"] = json!("image/gif")).is_err(),
        "an image's field"
    );
    let mut swapped = envs.clone();
    swapped.swap(3, 4);
    assert!(compare(&swapped, &expected).is_err(), "the images' order");
    let mut extra = envs.clone();
    let parse_error = r#"{"type":"parse_error","kind":"unexpected","message":"m"}"#;
    extra.push(json!({"type": "error", "agent": "agent-1", "final": true, "delta": parse_error}));
    assert!(compare(&extra, &expected).is_err(), "a block more");
    assert!(compare(&envs[..5], &expected).is_err(), "the last envelope missing");
    let mut gateway = expected.clone();
    gateway.push(json!({"kind": "error", "agent": "$root", "format": "gateway", "content": null}));
    assert!(
        compare(&extra, &gateway).is_ok(),
        "a gateway error's content is not compared"
    );
}
