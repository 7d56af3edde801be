//! Checks of faulted streams at the process level, and the "control" stream: a normal stream served beside a
//! fault, which must arrive complete and exact (tests/faults.rs, tests/stress.rs, benches/soak.rs).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::client::Client;
use super::legacy::fmt_escape;
use super::sse::{blocks, envelope_values, error_type, is_final, kind, parse_stream, Out};
use super::upstream::{UpConn, Upstream};
use super::PATIENCE;

/// [`assert_ends_in_error`], and that error is the gateway's `upstream_error` (not a parse error of the content).
pub fn assert_ends_in_upstream_error(bytes: &[u8], what: &str) -> Vec<Value> {
    let envs = assert_ends_in_error(bytes, what);
    let last = envs.last().expect("assert_ends_in_error found one");
    assert_eq!(error_type(last), "upstream_error", "{what}: {envs:?}");
    envs
}

/// Checks the shape every faulted stream must have: well-formed, its last envelope an `error` (final) with no
/// `[DONE]` after it, and no streamed text/thinking block still open when that error arrives. Returns the envelopes.
pub fn assert_ends_in_error(bytes: &[u8], what: &str) -> Vec<Value> {
    let events = parse_stream(bytes).unwrap_or_else(|e| panic!("{what}: malformed output: {e}"));
    let envs = envelope_values(&events);
    let last = envs
        .last()
        .unwrap_or_else(|| panic!("{what}: no envelope at all: {}", String::from_utf8_lossy(bytes)));
    assert_eq!(
        kind(last),
        "error",
        "{what}: the stream does not end in an error envelope; last events: {:?}",
        &events[events.len().saturating_sub(4)..]
    );
    assert!(is_final(last), "{what}: error envelope not final: {last}");
    let last_event = events
        .iter()
        .rev()
        .find(|e| !matches!(e, Out::Comment(_)))
        .expect("an event");
    assert!(
        matches!(last_event, Out::Envelope(_)),
        "{what}: something follows the error envelope: {last_event:?}"
    );
    // Streamed blocks open at the error (a text/thinking delta with no final marker after it).
    let mut open: Vec<(String, String)> = Vec::new();
    for v in &envs[..envs.len() - 1] {
        let k = kind(v);
        if k == "text" || k == "thinking" {
            let key = (k.to_owned(), v["agent"].as_str().unwrap_or("").to_owned());
            if is_final(v) {
                open.retain(|o| o != &key);
            } else if !open.contains(&key) {
                open.push(key);
            }
        }
    }
    assert!(
        open.is_empty(),
        "{what}: blocks {open:?} are still open when the error envelope arrives"
    );
    envs
}

/// A normal, complete legacy stream for `agent`: meta_init, a text block of `deltas`, a tool call, its result,
/// `[DONE]`; as SSE events (one element per event).
pub fn normal_stream(agent: &str, deltas: &[String]) -> Vec<Vec<u8>> {
    let meta = format!(
        "{{&quot;format&quot;: &quot;xml&quot;, &quot;user_query&quot;: &quot;q&quot;, &quot;agent_uuid&quot;: \
         &quot;{agent}&quot;, &quot;parent_agent_uuid&quot;: null, &quot;model&quot;: &quot;m&quot;}}"
    );
    let mut ev = vec![format!("data: <meta_init data=\"{meta}\"></meta_init>\n\n").into_bytes()];
    ev.push(b"data: <content-block-text>\n\n".to_vec());
    for d in deltas {
        ev.push(format!("data: {}\n\n", fmt_escape(d)).into_bytes());
    }
    ev.push(b"data: </content-block-text>\n\n".to_vec());
    ev.push(
        b"data: <content-block-tool_call id=\"call_1\" name=\"lookup\" arguments=\"{&quot;q&quot;: &quot;x&quot;}\"></content-block-tool_call>\n\n"
            .to_vec(),
    );
    ev.push(
        b"data: <content-block-tool_result id=\"call_1\" name=\"lookup\"><![CDATA[result body]]></content-block-tool_result>\n\n"
            .to_vec(),
    );
    ev.push(b"data: [DONE]\n\n".to_vec());
    ev
}

/// Serves `events` with `gap` between them (chunked), then ends the body; returns early if the gateway closes.
pub async fn serve_events(mut conn: UpConn, events: &[Vec<u8>], gap: Duration) {
    if conn.sse_head(true).await.is_err() {
        return;
    }
    for e in events {
        if conn.send(e).await.is_err() || conn.pause(gap).await.is_err() {
            return;
        }
    }
    if conn.end_chunks().await.is_ok() {
        conn.close().await;
    }
}

/// A concurrent "bystander" stream: checks that the gateway serves a normal stream correctly while a fault is
/// injected elsewhere. Its upstream path is `/control`; call `control_script` from the upstream's script for it.
pub fn control_deltas() -> Vec<String> {
    (0..40)
        .map(|i| format!("delta {i}: naïve café 日本語 🎉 a<b & \"q\" \\ back\nslash "))
        .collect()
}

pub async fn control_script(conn: UpConn) {
    let events = normal_stream("control-agent", &control_deltas());
    serve_events(conn, &events, Duration::from_millis(50)).await;
}

/// An upstream serving the control stream at `/control` ([`control_script`]) and `script` on every other path.
pub async fn beside_control<F, Fut>(script: F) -> Upstream
where
    F: Fn(UpConn) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let script = Arc::new(script);
    Upstream::start(move |conn| {
        let script = Arc::clone(&script);
        async move {
            if conn.path == "/control" {
                control_script(conn).await
            } else {
                script(conn).await
            }
        }
    })
    .await
}

/// Runs the control stream through the gateway and checks it arrived complete and exact.
pub async fn run_control(gw: SocketAddr) -> Result<(), String> {
    let mut c = Client::open(gw, "/control")
        .await
        .map_err(|e| format!("control: {e}"))?;
    if c.status != 200 {
        return Err(format!("control: status {}", c.status));
    }
    c.read_to_end(PATIENCE).await.map_err(|e| format!("control: {e}"))?;
    let events = parse_stream(&c.body).map_err(|e| format!("control: {e}"))?;
    if events.last() != Some(&Out::Done) {
        return Err(format!("control: stream does not end with [DONE]: {:?}", events.last()));
    }
    let got = blocks(&envelope_values(&events));
    let want_text: String = control_deltas().concat();
    let expected = vec![
        ("meta_init".to_owned(), "control-agent".to_owned(), None),
        ("text".to_owned(), "control-agent".to_owned(), Some(want_text)),
        (
            "tool_call".to_owned(),
            "control-agent".to_owned(),
            Some("{\"q\": \"x\"}".to_owned()),
        ),
        (
            "tool_result".to_owned(),
            "control-agent".to_owned(),
            Some("result body".to_owned()),
        ),
    ];
    if got.len() != expected.len() {
        return Err(format!("control: blocks {got:?}"));
    }
    for (g, (k, a, d)) in got.iter().zip(&expected) {
        if &g.0 != k || &g.1 != a || d.as_ref().is_some_and(|d| d != &g.2) {
            return Err(format!("control: block {g:?} != expected {k} {a} {d:?}"));
        }
    }
    Ok(())
}
