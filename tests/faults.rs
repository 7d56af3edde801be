//! Upstream fault injection against the real `sse-gateway` binary: resets mid-item, mid-CDATA and mid-UTF-8
//! character, a stalled upstream, a never-closing 1 GiB tag, and endings without `[DONE]`. Each faulted stream
//! must be well-formed JSON envelopes ending in an `error` envelope (open blocks closed first), while a second
//! stream served concurrently by the same process completes with exactly the expected content.

mod harness;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::legacy::fmt_escape;
use harness::prelude::*;

/// Keepalive interval the stall test configures, in seconds.
const KEEPALIVE_SECS: &str = "1";
/// Time the upstream waits before misbehaving, so the gateway has read (and translated) what came before.
const SETTLE: Duration = Duration::from_millis(500);

fn meta_init(agent: &str) -> Vec<u8> {
    normal_stream(agent, &[]).remove(0)
}

fn start_gateway(up: &Upstream) -> Process {
    Process::against(
        &up.url(),
        &[("SSE_GATEWAY__TRANSLATE__KEEPALIVE_INTERVAL_SECS", KEEPALIVE_SECS)],
    )
}

/// Fetches `path` through the gateway to the end of its body (which must end cleanly: last chunk received).
async fn fetch(gw: &Process, path: &str) -> Vec<u8> {
    let mut c = Client::open(gw.addr, path).await.expect("request the faulted stream");
    assert_eq!(c.status, 200, "{path}: status; head: {}", c.head);
    if let Err(e) = c.read_to_end(PATIENCE).await {
        panic!(
            "{path}: response did not end cleanly ({e}); got so far:\n{}\ngateway log:\n{}",
            String::from_utf8_lossy(&c.body),
            gw.log_tail()
        );
    }
    c.body
}

/// Runs the faulted stream(s) at `paths` (one after the other) while the control stream runs; returns the faulted
/// bodies.
async fn with_control(gw: &Process, paths: &[&str]) -> Vec<Vec<u8>> {
    let faulted = async {
        let mut bodies = Vec::new();
        for p in paths {
            bodies.push(fetch(gw, p).await);
        }
        bodies
    };
    let (bodies, control) = tokio::join!(faulted, run_control(gw.addr));
    if let Err(e) = control {
        panic!(
            "the concurrent stream was affected by the fault: {e}\ngateway log:\n{}",
            gw.log_tail()
        );
    }
    bodies
}

/// What a fault does on a connection once its text block is open.
type Fault = for<'a> fn(&'a mut UpConn) -> Pin<Box<dyn Future<Output = Result<(), Closed>> + Send + 'a>>;

/// An upstream beside the control stream whose other connections open a text block of `agent` with `deltas(n)`,
/// then run `fault`, then end as `ending` says.
async fn after_open_text(ending: Ending, agent: &'static str, n: usize, fault: Fault) -> Upstream {
    beside_control(move |conn| {
        conn.script(ending, async move |conn| {
            send_text_block_open(conn, true, agent, &deltas(n)).await?;
            fault(conn).await
        })
    })
    .await
}

/// The gateway against `up`; fetches the faulted stream at `path` beside the control stream, and returns the
/// gateway and the faulted stream's envelopes, which must end in an `upstream_error` (`what` names the fault).
async fn fetch_faulted(up: &Upstream, path: &str, what: &str) -> (Process, Vec<serde_json::Value>) {
    let gw = start_gateway(up);
    let bodies = with_control(&gw, &[path]).await;
    let envs = assert_ends_in_upstream_error(&bodies[0], what);
    (gw, envs)
}

/// After a faulted stream: no stream left open, and the fault counted as an upstream error.
async fn assert_counted(gw: &Process, upstream_errors: f64) {
    assert_eq!(
        gw.wait_no_active_streams(PATIENCE).await,
        0.0,
        "active_streams stays above 0"
    );
    let m = gw.metrics().await;
    let got = metric(&m, "sse_gateway_streams_total", &["outcome=\"upstream_error\""]);
    assert!(
        got >= upstream_errors,
        "streams_total{{outcome=upstream_error}} = {got}, want at least {upstream_errors}"
    );
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    memchr::memmem::find_iter(hay, needle).count()
}

fn text_of(envs: &[serde_json::Value]) -> String {
    envs.iter().filter(|v| kind(v) == "text").map(delta).collect()
}

fn deltas(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("chunk {i} with ünïcödé 日本 and a \\ and\nnewline; "))
        .collect()
}

/// Head (`chunked` or close-delimited body), meta_init of `agent`, and a text block left open after deltas `ds`.
async fn send_text_block_open(conn: &mut UpConn, chunked: bool, agent: &str, ds: &[String]) -> Result<(), Closed> {
    conn.sse_head(chunked).await?;
    conn.send(&meta_init(agent)).await?;
    conn.send(b"data: <content-block-text>\n\n").await?;
    for d in ds {
        conn.send(format!("data: {}\n\n", fmt_escape(d)).as_bytes()).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reset_mid_item_closes_blocks_and_ends_with_upstream_error() {
    let up = beside_control(|conn| {
        conn.script(Ending::Reset, async |conn| {
            if conn.path == "/tag" {
                // A tool call tag cut inside its attributes, after a complete text block.
                send_text_block_open(conn, true, "agent-tag", &deltas(3)).await?;
                conn.send(b"data: </content-block-text>\n\n").await?;
                conn.send(b"data: <content-block-tool_call id=\"call_9\" name=\"lookup\" argum")
                    .await?;
            } else {
                // A thinking block left open; the cut falls inside its closing tag.
                conn.sse_head(true).await?;
                conn.send(&meta_init("agent-close")).await?;
                conn.send(b"data: <content-block-thinking>\n\n").await?;
                conn.send(b"data: pondering\n\n").await?;
                conn.send(b"data: </content-block-thin").await?;
            }
            conn.pause(SETTLE).await
        })
    })
    .await;
    let gw = start_gateway(&up);
    let bodies = with_control(&gw, &["/tag", "/close-tag"]).await;

    let envs = assert_ends_in_upstream_error(&bodies[0], "reset inside a tag");
    assert_eq!(text_of(&envs), deltas(3).concat(), "text before the cut");
    assert!(
        !envs.iter().any(|v| kind(v) == "tool_call"),
        "a half-received tool call must not be emitted: {envs:?}"
    );

    let envs = assert_ends_in_upstream_error(&bodies[1], "reset inside a closing tag");
    let thinking: String = envs.iter().filter(|v| kind(v) == "thinking").map(delta).collect();
    assert_eq!(thinking, "pondering", "{envs:?}");
    assert_counted(&gw, 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reset_mid_cdata_ends_with_upstream_error() {
    let up = after_open_text(Ending::Reset, "agent-cdata", 2, |conn| Box::pin(async move {
        conn.send(b"data: </content-block-text>\n\n").await?;
        conn.send(b"data: <content-block-tool_call id=\"call_1\" name=\"lookup\" arguments=\"{}\"></content-block-tool_call>\n\n").await?;
        // A tool result whose CDATA never ends: cut inside the content, then inside a `]]` that could be its end.
        conn.send(b"data: <content-block-tool_result id=\"call_1\" name=\"lookup\"><![CDATA[first part of the result, ")
            .await?;
        conn.send(b"more of it ]]").await?;
        conn.pause(SETTLE).await
    }))
    .await;
    let (gw, envs) = fetch_faulted(&up, "/cdata", "reset inside CDATA").await;
    assert_eq!(text_of(&envs), deltas(2).concat());
    // Whatever part of the result went out is a prefix of what was sent (the daemon closes the cut result with a
    // final chunk, as it closes open blocks; the error envelope after it says the stream was cut).
    let result: String = envs.iter().filter(|v| kind(v) == "tool_result").map(delta).collect();
    assert!(
        "first part of the result, more of it ]]".starts_with(&result),
        "tool result content {result:?} is not what the upstream sent"
    );
    assert_counted(&gw, 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_reset_mid_utf8_character_ends_with_upstream_error() {
    let up = after_open_text(Ending::Reset, "agent-utf8", 4, |conn| {
        Box::pin(async move {
            // "日本語": the event is cut after the first byte of 語 (E8 AA 9E).
            let mut ev = "data: 日本".as_bytes().to_vec();
            ev.push(0xE8);
            conn.send(&ev).await?;
            conn.pause(SETTLE).await
        })
    })
    .await;
    // parse_stream (inside) checks the whole output is UTF-8.
    let (gw, envs) = fetch_faulted(&up, "/utf8", "reset inside a UTF-8 character").await;
    let text = text_of(&envs);
    let sent = deltas(4).concat();
    assert!(
        text == sent || text == format!("{sent}日本"),
        "text must be what was sent, up to the last whole character: {text:?}"
    );
    assert!(!text.contains('\u{FFFD}'), "replacement character in {text:?}");
    assert_counted(&gw, 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_stalled_after_headers_gets_keepalives_then_ends_with_error() {
    // What the daemon implements: `: keepalive` comments after each keepalive interval of silence, and no idle
    // timeout on the upstream body (no such setting exists): a stalled upstream keeps the stream open, visibly.
    const STALL: Duration = Duration::from_millis(3_600);
    // The stall "forever" is bounded: after it the upstream dies, and the stream must end with an error.
    let up = after_open_text(Ending::Reset, "agent-stall", 1, |conn| {
        Box::pin(async move { conn.stall(STALL).await })
    })
    .await;
    let gw = start_gateway(&up);
    let control = tokio::spawn(run_control(gw.addr));
    let mut c = Client::open(gw.addr, "/stall").await.expect("open");
    assert_eq!(c.status, 200);
    c.read_until_contains(b"chunk 0", PATIENCE).await.expect("first delta");
    let stall_start = Instant::now();
    let mut arrivals = Vec::new();
    let mut seen = 0;
    let deadline = Instant::now() + PATIENCE;
    while !c.ended && Instant::now() < deadline {
        let r = tokio::time::timeout(Duration::from_millis(200), c.read_some(64 << 10)).await;
        let n = count(&c.body, b": keepalive\n");
        for _ in seen..n {
            arrivals.push(stall_start.elapsed());
        }
        seen = n;
        if let Ok(Ok(0)) = r {
            if !c.ended {
                break;
            }
        }
    }
    control
        .await
        .expect("join")
        .expect("the concurrent stream was affected");
    println!("keepalives at {arrivals:?} after the upstream stalled");
    assert!(
        arrivals.len() >= 2,
        "a stalled upstream must not leave the client in silence: {} keepalives in {STALL:?} at a 1 s interval",
        arrivals.len()
    );
    for w in arrivals.windows(2) {
        let gap = w[1].saturating_sub(w[0]);
        assert!(
            gap >= Duration::from_millis(500) && gap <= Duration::from_millis(2_500),
            "keepalive gap {gap:?} is far from the configured 1 s: {arrivals:?}"
        );
    }
    assert!(c.ended, "the stream did not end after the upstream died");
    let envs = assert_ends_in_upstream_error(&c.body, "stall then reset");
    assert_eq!(text_of(&envs), deltas(1).concat());
    assert!(gw.metric("sse_gateway_keepalives_total", &[]).await >= 2.0);
    assert_counted(&gw, 1.0).await;
}

/// The `/warm` stream, fetched before a baseline is taken.
async fn warm_script(conn: UpConn) {
    serve_events(conn, &normal_stream("warm", &deltas(2)), Duration::ZERO).await
}

/// Sends `total` bytes of `byte`, generated on the fly from one 256 KiB buffer (the upstream never holds them all);
/// adds what it sent to `sent`.
async fn send_filler(conn: &mut UpConn, byte: u8, total: u64, sent: &AtomicU64) -> Result<(), Closed> {
    let block = vec![byte; 256 << 10];
    let mut left = total;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        conn.send(&block[..n]).await?;
        left -= n as u64;
        sent.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(())
}

/// Fetches `/warm`, takes the gateway's RSS as the baseline, then runs the faulted streams at `paths` beside the
/// control stream while sampling it; returns the faulted bodies and the RSS growth (MiB) at the peak.
async fn with_control_sampled(gw: &Process, paths: &[&str], what: &str) -> (Vec<Vec<u8>>, f64) {
    let _ = fetch(gw, "/warm").await;
    let baseline = gw.rss_kib();
    let sampler = RssSampler::start(gw.pid(), Duration::from_millis(25));
    let bodies = with_control(gw, paths).await;
    let peak = sampler.stop();
    let growth_mib = peak.saturating_sub(baseline) as f64 / 1024.0;
    println!("{what}: RSS baseline {baseline} KiB, peak {peak} KiB, growth {growth_mib:.1} MiB");
    (bodies, growth_mib)
}

/// Size of the never-closing attribute: 1 GiB (the debug binary translates it in about 10 s on 2 cores);
/// `SSE_GW_FLOOD_MIB` overrides it.
fn flood_size() -> u64 {
    std::env::var("SSE_GW_FLOOD_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(1 << 30, |mib| mib << 20)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_never_closing_1gib_attribute_keeps_memory_bounded_and_yields_one_error() {
    let total = flood_size();
    let sent = Arc::new(AtomicU64::new(0));
    let sent2 = Arc::clone(&sent);
    let up = beside_control(move |conn| {
        let sent = Arc::clone(&sent2);
        async move {
            if conn.path == "/warm" {
                return warm_script(conn).await;
            }
            conn.script(Ending::Reset, async |conn| {
                conn.sse_head(true).await?;
                conn.send(&meta_init("agent-flood")).await?;
                conn.send(b"data: <meta_init data=\"").await?;
                send_filler(conn, b'x', total, &sent).await?;
                // The event ends with the tag still open; the stream goes on and then the upstream dies.
                conn.send(b"\n\n").await?;
                conn.send(b"data: <content-block-text>after the flood</content-block-text>\n\n")
                    .await?;
                conn.pause(SETTLE).await
            })
            .await
        }
    })
    .await;
    let gw = Process::against(&up.url(), &[]);
    let started = Instant::now();
    let (bodies, growth_mib) = with_control_sampled(&gw, &["/flood"], "flood").await;
    let elapsed = started.elapsed();
    println!(
        "flood: {} MiB in {:.1} s ({:.0} MiB/s)",
        total >> 20,
        elapsed.as_secs_f64(),
        total as f64 / 1048576.0 / elapsed.as_secs_f64()
    );
    assert_eq!(
        sent.load(Ordering::Relaxed),
        total,
        "the upstream did not get to send it all"
    );
    assert!(
        growth_mib < 64.0,
        "gateway RSS grew {growth_mib:.1} MiB on a never-closing tag"
    );

    let envs = assert_ends_in_error(&bodies[0], "never-closing attribute");
    let errors: Vec<_> = envs.iter().filter(|v| kind(v) == "error").collect();
    println!(
        "flood: error envelopes {:?}",
        errors.iter().map(|v| delta(v)).collect::<Vec<_>>()
    );
    let about_tag: Vec<_> = errors.iter().filter(|v| error_type(v) == "parse_error").collect();
    assert_eq!(
        about_tag.len(),
        1,
        "exactly one error envelope about the oversized tag, got {errors:?}"
    );
    let pos_err = envs.iter().position(|v| error_type(v) == "parse_error").unwrap();
    let pos_after = envs.iter().position(|v| delta(v) == "after the flood");
    assert!(
        pos_after.is_some_and(|p| p > pos_err),
        "the stream must go on after the oversized tag: {envs:?}"
    );
    assert_eq!(error_type(envs.last().unwrap()), "upstream_error");
    assert_eq!(errors.len(), 2, "one parse error, one upstream error: {errors:?}");
    assert_counted(&gw, 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_clean_close_without_done_ends_with_error() {
    // The body ends properly (last chunk, or FIN of a close-delimited body) but the legacy stream was not finished:
    // no `[DONE]`, a text block still open. The client must learn the stream was cut, not see a normal end.
    let up = beside_control(|conn| {
        let chunked = conn.path == "/chunked";
        conn.script(Ending::Close, async move |conn| {
            send_text_block_open(conn, chunked, "agent-nodone", &deltas(3)).await?;
            conn.pause(SETTLE).await?;
            if chunked {
                conn.end_chunks().await?;
            }
            Ok(())
        })
    })
    .await;
    let gw = start_gateway(&up);
    let bodies = with_control(&gw, &["/chunked", "/close-delimited"]).await;
    // Both bodies are checked before failing, so a failure names every case that fails.
    let mut failed = Vec::new();
    for (body, what) in bodies.iter().zip(["chunked body ended", "close-delimited body ended"]) {
        let r = std::panic::catch_unwind(|| {
            let envs = assert_ends_in_upstream_error(body, what);
            assert_eq!(text_of(&envs), deltas(3).concat(), "{what}");
        });
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            failed.push(msg);
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    assert_counted(&gw, 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_fin_inside_chunked_body_ends_with_upstream_error() {
    // The connection closes cleanly (FIN) but the chunked body was not finished: the HTTP body is truncated.
    let up = after_open_text(Ending::Close, "agent-fin", 3, |conn| {
        Box::pin(async move { conn.pause(SETTLE).await })
    })
    .await;
    let (gw, envs) = fetch_faulted(&up, "/fin", "FIN inside a chunked body").await;
    assert_eq!(text_of(&envs), deltas(3).concat());
    assert_counted(&gw, 1.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_never_ending_text_event_and_cdata_keep_memory_bounded() {
    // The other two never-closing shapes, 20 MiB each (above the 16 MiB item bound): a text delta event that never ends (one endless `data:`
    // line inside an open text block) and a tool result whose CDATA never ends.
    const TOTAL: u64 = 20 << 20;
    let up = beside_control(|conn| async move {
        if conn.path == "/warm" {
            return warm_script(conn).await;
        }
        let cdata = conn.path == "/cdata";
        conn.script(Ending::Reset, async move |conn| {
            conn.sse_head(true).await?;
            conn.send(&meta_init("agent-endless")).await?;
            if cdata {
                conn.send(b"data: <content-block-tool_result id=\"call_1\" name=\"lookup\"><![CDATA[")
                    .await?;
            } else {
                conn.send(b"data: <content-block-text>\n\ndata: ").await?;
            }
            send_filler(conn, b'z', TOTAL, &AtomicU64::new(0)).await?;
            conn.pause(SETTLE).await
        })
        .await
    })
    .await;
    let gw = start_gateway(&up);
    let what = "never-ending text event and CDATA";
    let (bodies, growth_mib) = with_control_sampled(&gw, &["/text", "/cdata"], what).await;
    assert!(growth_mib < 64.0, "gateway RSS grew {growth_mib:.1} MiB");
    for (body, what) in bodies.iter().zip(["endless text event", "endless CDATA"]) {
        let envs = assert_ends_in_upstream_error(body, what);
        let out: usize = envs.iter().map(|v| delta(v).len()).sum();
        println!(
            "{what}: {} envelopes, {out} delta bytes, errors {:?}",
            envs.len(),
            envs.iter()
                .filter(|v| kind(v) == "error")
                .map(error_type)
                .collect::<Vec<_>>()
        );
    }
    assert_counted(&gw, 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_garbage_chunk_framing_mid_body_ends_with_upstream_error() {
    // Not a reset but a protocol error: an invalid chunk-size line in the middle of the body.
    let up = after_open_text(Ending::Close, "agent-garbage", 2, |conn| {
        Box::pin(async move {
            conn.raw(b"zz-not-a-chunk-size\r\nnonsense\r\n").await?;
            conn.pause(SETTLE).await
        })
    })
    .await;
    let (gw, envs) = fetch_faulted(&up, "/garbage", "garbage chunk framing").await;
    assert_eq!(text_of(&envs), deltas(2).concat());
    assert_counted(&gw, 1.0).await;
    let m = gw.metrics().await;
    let kinds: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("sse_gateway_upstream_errors_total{"))
        .collect();
    println!("upstream error counters after a framing error: {kinds:?}");
    let count = |kind: &str| {
        kinds
            .iter()
            .find(|l| l.contains(&format!("kind=\"{kind}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!((count("protocol"), count("reset")), (1.0, 0.0), "{kinds:?}");
}
