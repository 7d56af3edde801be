//! Client faults against the real `sse-gateway` binary: 1,000 clients hanging up at random points (upstreams
//! released within 1 s, no fd or stream leak), slow and stopped readers (bounded memory, backpressure reaching the
//! upstream), and slowloris clients (cut off by the header timeout while a normal client is served).

mod harness;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use harness::legacy::fmt_escape;
use harness::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Resumption's grace period off: a client's hang-up then drops its upstream at once, as before resumption.
const NO_GRACE: (&str, &str) = ("SSE_GATEWAY__RESUME__GRACE_SECS", "0");

/// A text delta event of about 1 KiB (escaped newline, multi-byte characters).
fn delta_event(i: u64) -> Vec<u8> {
    let d = format!(
        "event {i:06}: {} ünïcödé 日本語 🎉\n",
        "lorem ipsum dolor sit amet ".repeat(36)
    );
    format!("data: {}\n\n", fmt_escape(&d)).into_bytes()
}

/// An endless (bounded by `limit`) translated stream: a text delta every `gap` until the gateway hangs up.
async fn endless(conn: UpConn, gap: Duration, limit: Duration) {
    let start = Instant::now();
    conn.script(Ending::Close, async |conn| {
        open_text_block(conn, "agent-endless").await?;
        let mut i = 0;
        while start.elapsed() < limit {
            conn.send(&delta_event(i)).await?;
            conn.pause(gap).await?;
            i += 1;
        }
        conn.send(b"data: </content-block-text>\n\ndata: [DONE]\n\n").await?;
        conn.end_chunks().await
    })
    .await
}

/// Head, meta_init of `agent` and the start of a text block.
async fn open_text_block(conn: &mut UpConn, agent: &str) -> Result<(), Closed> {
    conn.sse_head(true).await?;
    conn.send(&normal_stream(agent, &[]).remove(0)).await?;
    conn.send(b"data: <content-block-text>\n\n").await
}

/// When a client hangs up.
#[derive(Debug, Clone, Copy)]
enum HangUp {
    /// Right after sending the request.
    Request,
    /// After the response head.
    Head,
    /// After this many body bytes.
    Bytes(usize),
}

/// Per request path: when the client hung up, at which point, and whether with a reset.
type HangUps = Arc<Mutex<HashMap<String, (Instant, HangUp, bool)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_clients_hanging_up_at_random_points_release_upstreams_within_1s_and_leak_nothing() {
    const CLIENTS: usize = 1000;
    const CONCURRENCY: usize = 200;
    const CLOSE_BOUND: Duration = Duration::from_secs(1);
    let up = beside_control(|conn| endless(conn, Duration::from_millis(100), Duration::from_secs(30))).await;
    // No grace period: resumable streams release their upstream with their client, as before resumption.
    let gw = Process::against(&up.url(), &[NO_GRACE]);
    // Warm up (runtime threads, upstream client), then take the baseline.
    run_control(gw.addr).await.expect("warm-up stream");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fd_baseline = gw.fds();

    let disconnects: HangUps = Arc::default();
    let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut tasks = Vec::new();
    let started = Instant::now();
    for i in 0..CLIENTS {
        let plan = match rng.u8(0..10) {
            0 => HangUp::Request,
            1 => HangUp::Head,
            _ => HangUp::Bytes(rng.usize(1..6000)),
        };
        let rst = rng.bool();
        let (sem, disconnects, addr) = (Arc::clone(&sem), Arc::clone(&disconnects), gw.addr);
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.expect("semaphore");
            let path = format!("/c/{i}");
            let mut c = Client::send(addr, &path).await.map_err(|e| format!("{path}: {e}"))?;
            match plan {
                HangUp::Request => {}
                HangUp::Head => c.read_head().await.map_err(|e| format!("{path}: head: {e}"))?,
                HangUp::Bytes(n) => {
                    c.read_head().await.map_err(|e| format!("{path}: head: {e}"))?;
                    c.read_until_len(n, PATIENCE)
                        .await
                        .map_err(|e| format!("{path}: {e}"))?;
                }
            }
            // The time is taken just before the close, so the bound measured is the gateway's, not ours.
            disconnects
                .lock()
                .expect("lock")
                .insert(path, (Instant::now(), plan, rst));
            c.disconnect(rst);
            Ok::<_, String>(())
        }));
    }
    for t in tasks {
        t.await.expect("client task").expect("client");
    }
    println!("{CLIENTS} clients done in {:.1} s", started.elapsed().as_secs_f64());

    // Every upstream connection gets closed; each within CLOSE_BOUND of its client's hang-up.
    let deadline = Instant::now() + Duration::from_secs(10);
    while up
        .logs()
        .iter()
        .any(|c| c.path.starts_with("/c/") && c.closed.is_none())
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let disconnects = disconnects.lock().expect("lock").clone();
    let logs: Vec<ConnLog> = up.logs().into_iter().filter(|c| c.path.starts_with("/c/")).collect();
    let mut late = Vec::new();
    let mut worst = Duration::ZERO;
    let mut all = Vec::new();
    for c in &logs {
        let (gone, plan, rst) = disconnects[&c.path];
        match c.closed {
            None => late.push(format!("{} ({plan:?}, rst {rst}): never closed", c.path)),
            Some(closed) => {
                let after = closed.saturating_duration_since(gone);
                worst = worst.max(after);
                all.push((after, plan, rst));
                if after > CLOSE_BOUND {
                    late.push(format!(
                        "{} ({plan:?}, rst {rst}): closed {after:?} after the client",
                        c.path
                    ));
                }
            }
        }
    }
    all.sort_by_key(|a| std::cmp::Reverse(a.0));
    let median = all.get(all.len() / 2).map(|a| a.0).unwrap_or_default();
    println!(
        "{} upstream connections for {CLIENTS} clients; upstream close after the client hung up: median {median:?}, \
         slowest {worst:?}; slowest five {:?}",
        logs.len(),
        &all[..all.len().min(5)]
    );
    assert!(
        late.is_empty(),
        "{} upstream connections outlived their client:\n{}",
        late.len(),
        late.join("\n")
    );
    // Clients that waited for the head or body always reached the upstream.
    let reached = disconnects
        .iter()
        .filter(|(_, (_, p, _))| !matches!(p, HangUp::Request))
        .count();
    assert!(logs.len() >= reached, "{} upstream connections < {reached}", logs.len());

    assert_eq!(
        gw.wait_no_active_streams(Duration::from_secs(10)).await,
        0.0,
        "active_streams does not return to 0"
    );
    let fds = gw.wait_fds_at_most(fd_baseline + 4, Duration::from_secs(10)).await;
    println!("gateway fds: baseline {fd_baseline}, after {fds}");
    assert!(
        fds <= fd_baseline + 4,
        "fd leak: {fds} open vs {fd_baseline} at the start"
    );
    let m = gw.metrics().await;
    let gone = metric(&m, "sse_gateway_streams_total", &["outcome=\"client_gone\""]);
    assert!(
        gone >= reached as f64 * 0.9,
        "streams_total{{client_gone}} = {gone}, {reached} clients hung up"
    );
    // And the gateway still serves.
    run_control(gw.addr).await.expect("a stream after the storm");
}

/// Floods a text block at full speed (1 KiB deltas) up to `total` body bytes, or until the gateway hangs up.
async fn flood(conn: UpConn, total: u64) {
    conn.script(Ending::Close, async |conn| {
        open_text_block(conn, "agent-flood").await?;
        let event = format!("data: {}\\n\n\n", "y".repeat(1020));
        let batch = event.repeat(64).into_bytes();
        let mut sent = 0;
        while sent < total {
            conn.send(&batch).await?;
            sent += batch.len() as u64;
        }
        conn.send(b"data: </content-block-text>\n\ndata: [DONE]\n\n").await?;
        conn.end_chunks().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_stopped_readers_keep_memory_bounded_and_push_back_on_the_upstream() {
    const TOTAL: u64 = 256 << 20;
    const TRICKLERS: usize = 4;
    const STOPPED: usize = 4;
    const OBSERVE: Duration = Duration::from_secs(4);
    let up = beside_control(|conn| flood(conn, TOTAL)).await;
    let gw = Process::against(&up.url(), &[]);
    run_control(gw.addr).await.expect("warm-up stream");
    let baseline = gw.rss_kib();
    let sampler = RssSampler::start(gw.pid(), Duration::from_millis(25));

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..TRICKLERS {
        let (addr, stop) = (gw.addr, Arc::clone(&stop));
        readers.push(tokio::spawn(async move {
            // One byte per 10 ms, straight from the socket.
            let mut c = Client::open(addr, &format!("/trickle/{i}")).await.expect("open");
            let mut byte = [0u8; 1];
            let mut got = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match c.stream.read(&mut byte).await {
                    Ok(1) => got += 1,
                    _ => break,
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (c, got)
        }));
    }
    let mut stopped = Vec::new();
    for i in 0..STOPPED {
        // Reads the head and the first bytes, then nothing.
        let mut c = Client::open(gw.addr, &format!("/stopped/{i}")).await.expect("open");
        c.read_until_len(4096, PATIENCE).await.expect("first bytes");
        stopped.push(c);
    }
    // Meanwhile a normal stream is served normally.
    run_control(gw.addr)
        .await
        .expect("a normal stream beside the slow readers");
    tokio::time::sleep(OBSERVE).await;

    let now = Instant::now();
    let logs: Vec<ConnLog> = up.logs().into_iter().filter(|c| c.path != "/control").collect();
    assert_eq!(logs.len(), TRICKLERS + STOPPED);
    let peak = sampler.peak_kib();
    let growth_mib = peak.saturating_sub(baseline) as f64 / 1024.0;
    for c in &logs {
        let blocked = c.write_started.map(|t| now.saturating_duration_since(t));
        println!(
            "{}: upstream wrote {:.1} MiB, current write blocked for {blocked:?}",
            c.path,
            c.written as f64 / 1048576.0
        );
    }
    println!("RSS baseline {baseline} KiB, peak {peak} KiB, growth {growth_mib:.1} MiB");
    for c in &logs {
        assert!(
            c.written < TOTAL,
            "{}: no backpressure, the upstream wrote everything",
            c.path
        );
        let blocked = c.write_started.map(|t| now.saturating_duration_since(t));
        assert!(
            blocked.is_some_and(|b| b > Duration::from_secs(1)),
            "{}: the upstream's writes are not blocked (blocked for {blocked:?})",
            c.path
        );
    }
    assert!(
        growth_mib < 32.0,
        "gateway RSS grew {growth_mib:.1} MiB with slow readers"
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        let (c, got) = r.await.expect("reader");
        assert!(got > 0, "a trickling reader got nothing");
        c.disconnect(true);
    }
    for c in stopped {
        c.disconnect(true);
    }
    sampler.stop();
    assert_eq!(gw.wait_no_active_streams(Duration::from_secs(10)).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_clients_are_cut_off_by_the_header_timeout_while_others_are_served() {
    const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
    const EACH: usize = 20;
    let up = Upstream::start(control_script).await;
    let gw = Process::against(&up.url(), &[("SSE_GATEWAY__SERVER__HEADER_READ_TIMEOUT_SECS", "2")]);
    // Both kinds on the wire at once: half a request line then silence, and a head trickled a byte at a time.
    let mut cut = Vec::new();
    for i in 0..EACH * 2 {
        let addr = gw.addr;
        cut.push(tokio::spawn(async move {
            let start = Instant::now();
            let mut s = TcpStream::connect(addr).await.expect("connect");
            let trickle = i % 2 == 1;
            let mut buf = [0u8; 1024];
            let mut answer = Vec::new();
            if trickle {
                let head =
                    b"POST /agent/run HTTP/1.1\r\nHost: gateway\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
                for b in head.iter() {
                    if s.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    // Any answer or a close ends the trickle.
                    match tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
                        Ok(Ok(0)) | Ok(Err(_)) => return (trickle, start.elapsed(), answer),
                        Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                        Err(_) => {}
                    }
                }
            } else {
                s.write_all(b"POST /agent/r").await.expect("write");
            }
            // Wait (bounded) for the gateway to close the connection.
            let wait = async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buf[..n]),
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(15), wait).await;
            (trickle, start.elapsed(), answer)
        }));
    }
    // A normal client is served in full while they hang on.
    tokio::time::sleep(Duration::from_millis(200)).await;
    run_control(gw.addr)
        .await
        .expect("a normal client beside the slowloris ones");
    let mut times = Vec::new();
    for t in cut {
        let (trickle, after, answer) = t.await.expect("slowloris task");
        let what = if trickle {
            "trickled head"
        } else {
            "half a request line"
        };
        times.push((what, after.as_millis()));
        assert!(
            after >= HEADER_TIMEOUT - Duration::from_millis(500) && after <= HEADER_TIMEOUT + Duration::from_secs(6),
            "{what}: cut off after {after:?} with a {HEADER_TIMEOUT:?} header timeout; got {:?}",
            String::from_utf8_lossy(&answer)
        );
        assert!(
            answer.is_empty() || answer.starts_with(b"HTTP/1.1 408") || answer.starts_with(b"HTTP/1.1 400"),
            "{what}: unexpected answer {:?}",
            String::from_utf8_lossy(&answer)
        );
    }
    println!("slowloris connections cut off after (ms): {times:?}");
    // The gateway still serves afterwards.
    run_control(gw.addr).await.expect("served after the slowloris clients");
}

/// Head, meta_init and an open text block with one delta, then silence (a model thinking) until the gateway hangs
/// up, at most `limit`.
async fn then_silence(conn: UpConn, limit: Duration) {
    conn.script(Ending::Reset, async |conn| {
        conn.sse_head(true).await?;
        conn.send(&normal_stream("agent-idle", &[]).remove(0)).await?;
        conn.send(b"data: <content-block-text>\n\ndata: first delta\n\n")
            .await?;
        conn.stall(limit).await
    })
    .await
}

/// After 1.5 s: the upstream connections of the clients that hung up (path, when, with a reset) that the gateway did
/// not close within 1 s of the client; the others' close times are printed.
async fn closed_late(up: &Upstream, gone: &[(String, Instant, bool)]) -> Vec<String> {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut late = Vec::new();
    for (path, at, rst) in gone {
        let c = up.conn(path).expect("upstream connection");
        match c.closed {
            Some(t) if t.saturating_duration_since(*at) <= Duration::from_secs(1) => {
                println!("{path} (rst {rst}): upstream closed {:?} after the client", t - *at)
            }
            Some(t) => late.push(format!("{path} (rst {rst}): closed {:?} after the client", t - *at)),
            None => late.push(format!(
                "{path} (rst {rst}): still open {:?} after the client left",
                at.elapsed()
            )),
        }
    }
    late
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hang_up_while_the_upstream_is_silent_releases_it_within_1s() {
    // Nothing is being written when the client leaves, so only a read of the client socket can notice. Keepalives
    // are left at their default (15 s), so they cannot be what notices.
    const CLIENTS: usize = 20;
    let up = beside_control(|conn| then_silence(conn, Duration::from_secs(20))).await;
    // No grace period: resumable streams release their upstream with their client, as before resumption.
    let gw = Process::against(&up.url(), &[NO_GRACE]);
    let mut gone = Vec::new();
    for i in 0..CLIENTS {
        let path = format!("/idle/{i}");
        let mut c = Client::open(gw.addr, &path).await.expect("open");
        c.read_until_contains(b"first delta", PATIENCE)
            .await
            .expect("first delta");
        gone.push((path, Instant::now(), i % 2 == 0));
        c.disconnect(i % 2 == 0);
    }
    let late = closed_late(&up, &gone).await;
    assert!(late.is_empty(), "upstreams outlived their client:\n{}", late.join("\n"));
    assert_eq!(gw.wait_no_active_streams(Duration::from_secs(5)).await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hang_up_before_the_upstream_answers_releases_it_within_1s() {
    // The upstream takes its time before the response head (a backend queueing the run): a client that leaves
    // meanwhile must not keep the upstream request alive until the response timeout.
    const CLIENTS: usize = 20;
    let up = Upstream::start(|mut conn| async move {
        if conn.pause(Duration::from_secs(20)).await.is_ok() {
            conn.reset();
        }
    })
    .await;
    let gw = Process::against(&up.url(), &[]);
    let mut gone = Vec::new();
    for i in 0..CLIENTS {
        let path = format!("/slow-head/{i}");
        let c = Client::send(gw.addr, &path).await.expect("send");
        up.wait_conn(&path).await;
        gone.push((path, Instant::now(), i % 2 == 0));
        c.disconnect(i % 2 == 0);
    }
    let late = closed_late(&up, &gone).await;
    assert!(
        late.is_empty(),
        "upstream requests outlived their client:\n{}",
        late.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_cancelled_at_random_points_release_upstreams_within_1s() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    const STREAMS: usize = 200;
    const CONCURRENCY: usize = 50;
    let up = Upstream::start(|conn| async move {
        if conn.path.starts_with("/silent/") {
            return then_silence(conn, Duration::from_secs(20)).await;
        }
        endless(conn, Duration::from_millis(40), Duration::from_secs(30)).await;
    })
    .await;
    // No grace period: resumable streams release their upstream with their client, as before resumption.
    let gw = Process::against(&up.url(), &[NO_GRACE]);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut rng = fastrand::Rng::with_seed(0x2);
    let mut tasks = Vec::new();
    for i in 0..STREAMS {
        // Every fifth stream is cancelled while its upstream is silent.
        let silent = i % 5 == 0;
        let want = if silent { 1 } else { rng.usize(1..6000) };
        let (client, sem, addr) = (client.clone(), Arc::clone(&sem), gw.addr);
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.expect("semaphore");
            let path = if silent {
                format!("/silent/{i}")
            } else {
                format!("/h2/{i}")
            };
            let req = http::Request::post(format!("http://{addr}{path}"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(b"{}")))
                .expect("request");
            let resp = tokio::time::timeout(PATIENCE, client.request(req))
                .await
                .map_err(|_| format!("{path}: no response"))?
                .map_err(|e| format!("{path}: {e}"))?;
            let mut body = resp.into_body();
            let mut got = 0;
            while got < want {
                match tokio::time::timeout(PATIENCE, body.frame()).await {
                    Ok(Some(Ok(f))) => got += f.data_ref().map_or(0, |d| d.len()),
                    other => return Err(format!("{path}: body ended early: {other:?}")),
                }
            }
            let at = Instant::now();
            drop(body); // RST_STREAM(CANCEL) on the shared connection.
            Ok::<_, String>((path, at))
        }));
    }
    let mut gone = Vec::new();
    for t in tasks {
        gone.push(t.await.expect("task").expect("stream"));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut late = Vec::new();
    let mut worst = Duration::ZERO;
    for (path, at) in &gone {
        let c = up.conn(path).expect("upstream connection");
        match c.closed {
            Some(t) => {
                let after = t.saturating_duration_since(*at);
                worst = worst.max(after);
                if after > Duration::from_secs(1) {
                    late.push(format!("{path}: closed {after:?} after the cancel"));
                }
            }
            None => late.push(format!("{path}: still open {:?} after the cancel", at.elapsed())),
        }
    }
    println!("{STREAMS} h2 streams cancelled; slowest upstream close {worst:?} after the cancel");
    assert!(
        late.is_empty(),
        "{} upstreams outlived their stream:\n{}",
        late.len(),
        late.join("\n")
    );
    assert_eq!(gw.wait_no_active_streams(Duration::from_secs(5)).await, 0.0);
}
