//! Soak scenario: N minutes of streams opening and closing at a steady event rate through the real gateway binary,
//! every stream's content checked against what the upstream sent, RSS and fd count sampled for growth trends.
//!
//! `cargo bench --bench soak -- --minutes 5` (defaults: 5 minutes, 50 concurrent streams of 1-10 s, 2,000 events/s
//! in all). `--minutes 0.5` is the CI smoke (`.ci/stress.sh`). Run as a test (`cargo test --all-targets`), it does a
//! few seconds at a low rate. Exits non-zero when a stream lost or corrupted an envelope, RSS trends up or fds leak.

#[path = "../tests/harness/mod.rs"]
mod harness;

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::legacy::fmt_escape;
use harness::prelude::*;
use sse_gateway::translate::{translate_all, Options};

/// RSS and fd sampling period.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples before this are the ramp-up (streams start staggered) and not used for trends.
const RAMP_UP: Duration = Duration::from_secs(5);
/// Allowed rise of average RSS from the first to the last window.
const RSS_TREND_MIB: f64 = 8.0;
/// Allowed rise of average fd count from the first to the last window (streams come and go).
const FD_TREND: f64 = 20.0;
/// Fds above the idle baseline tolerated once every stream is closed.
const FD_SLACK: usize = 4;

#[derive(Debug, Clone)]
struct Args {
    minutes: f64,
    concurrency: usize,
    rate: f64,
    min_secs: f64,
    max_secs: f64,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let argv: Vec<String> = std::env::args().skip(1).collect();
        // Without --bench, cargo is running the bench targets as tests: a short smoke only.
        let test_mode = !argv.iter().any(|a| a == "--bench");
        let mut a = if test_mode {
            Args {
                minutes: 0.05,
                concurrency: 10,
                rate: 200.0,
                min_secs: 1.0,
                max_secs: 2.0,
            }
        } else {
            Args {
                minutes: 5.0,
                concurrency: 50,
                rate: 2000.0,
                min_secs: 1.0,
                max_secs: 10.0,
            }
        };
        let mut it = argv.iter();
        while let Some(flag) = it.next() {
            let mut value = |name: &str| -> Result<f64, String> {
                it.next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or(format!("{name} needs a non-negative number"))
            };
            match flag.as_str() {
                "--minutes" => a.minutes = value("--minutes")?,
                "--concurrency" => a.concurrency = value("--concurrency")?.max(1.0) as usize,
                "--rate" => a.rate = value("--rate")?.max(1.0),
                "--min-secs" => a.min_secs = value("--min-secs")?,
                "--max-secs" => a.max_secs = value("--max-secs")?,
                // cargo bench passes --bench (and maybe a filter): ignore anything else.
                _ => {}
            }
        }
        if a.max_secs < a.min_secs {
            return Err("--max-secs below --min-secs".into());
        }
        Ok(a)
    }

    /// Time between two events of one stream, so that `concurrency` streams make `rate` events/s.
    fn gap(&self) -> Duration {
        Duration::from_secs_f64(self.concurrency as f64 / self.rate)
    }
}

/// Words the generated content is made of: markup-looking text, escapes, entities, multi-byte characters.
const WORDS: &[&str] = &[
    "alpha",
    "beta",
    "<chart>",
    "a < b",
    "x > y",
    "&amp;",
    "&",
    "\"quoted\"",
    "'single'",
    "back\\slash",
    "\\n",
    "line\nbreak",
    "tab\tbed",
    "naïve",
    "café",
    "日本語",
    "中文",
    "🎉",
    "🚀",
    "e\u{301}",
    "{\"json\": 1}",
    "]]",
    "[DONE]",
    "<table>",
    "</b>",
    "CRLF\r\nhere",
    " ",
];

/// Between 1 and `max - 1` random words.
fn words(rng: &mut fastrand::Rng, max: usize) -> String {
    let n = rng.usize(1..max);
    (0..n)
        .map(|_| WORDS[rng.usize(..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A client tool result's escape: CR/CRLF → LF, LF → `\n`, `]]>` split across CDATA sections; no backslashes
/// doubled (so the generated content holds none: that escape is lossy by design).
fn escape_tool_result(s: &str) -> String {
    s.replace("\r\n", "\n")
        .replace('\r', "\n")
        .replace('\n', "\\n")
        .replace("]]>", "]]]]><![CDATA[>")
}

/// One soak stream: its legacy events and the blocks (type, content) the client must reassemble.
struct Script {
    events: Vec<Vec<u8>>,
    expected: Vec<(String, Option<String>)>,
    agent: String,
}

/// Generates a stream of about `n` events from `seed`: meta_init, then rounds of a thinking block, a text block,
/// a tool call and its result, then `[DONE]`.
fn script(seed: u64, n: usize) -> Script {
    let mut rng = fastrand::Rng::with_seed(seed);
    let agent = format!("soak-{seed:x}");
    let meta = format!(
        "{{&quot;format&quot;: &quot;xml&quot;, &quot;user_query&quot;: &quot;soak&quot;, &quot;agent_uuid&quot;: \
         &quot;{agent}&quot;, &quot;parent_agent_uuid&quot;: null, &quot;model&quot;: &quot;m&quot;}}"
    );
    let mut events = vec![format!("data: <meta_init data=\"{meta}\"></meta_init>\n\n").into_bytes()];
    let mut expected = vec![("meta_init".to_owned(), None)];
    let mut round = 0;
    while events.len() < n.max(8) {
        for block in ["thinking", "text"] {
            let deltas: Vec<String> = (0..rng.usize(2..12)).map(|_| words(&mut rng, 12)).collect();
            events.push(format!("data: <content-block-{block}>\n\n").into_bytes());
            for d in &deltas {
                events.push(format!("data: {}\n\n", fmt_escape(d)).into_bytes());
            }
            events.push(format!("data: </content-block-{block}>\n\n").into_bytes());
            expected.push((block.to_owned(), Some(deltas.concat())));
        }
        let id = format!("call_{seed:x}_{round}");
        let args = format!("{{\"q\": \"w{}\", \"n\": {}}}", rng.u32(..), rng.u8(..));
        let attr = args.replace('&', "&amp;").replace('"', "&quot;");
        events.push(
            format!("data: <content-block-tool_call id=\"{id}\" name=\"lookup\" arguments=\"{attr}\"></content-block-tool_call>\n\n")
                .into_bytes(),
        );
        expected.push(("tool_call".to_owned(), Some(args)));
        let result = words(&mut rng, 40).replace('\\', "/") + " ]]> end";
        events.push(
            format!(
                "data: <content-block-tool_result id=\"{id}\" name=\"lookup\"><![CDATA[{}]]></content-block-tool_result>\n\n",
                escape_tool_result(&result)
            )
            .into_bytes(),
        );
        expected.push((
            "tool_result".to_owned(),
            Some(result.replace("\r\n", "\n").replace('\r', "\n")),
        ));
        round += 1;
    }
    events.push(b"data: [DONE]\n\n".to_vec());
    Script {
        events,
        expected,
        agent,
    }
}

/// Parses `/soak/{seed}/{events}/{gap_us}`.
fn parse_path(path: &str) -> Option<(u64, usize, Duration)> {
    let mut p = path.strip_prefix("/soak/")?.split('/');
    let seed = p.next()?.parse().ok()?;
    let n = p.next()?.parse().ok()?;
    let gap = Duration::from_micros(p.next()?.parse().ok()?);
    Some((seed, n, gap))
}

/// The upstream side: the seed's events at a steady pace, one per tick.
async fn serve(mut conn: UpConn, sent: Arc<AtomicU64>) {
    let Some((seed, n, gap)) = parse_path(&conn.path) else {
        return control_script(conn).await;
    };
    let s = script(seed, n);
    let ok = async {
        conn.sse_head(true).await?;
        let mut tick = tokio::time::interval(gap);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for e in &s.events {
            tick.tick().await;
            conn.send(e).await?;
            sent.fetch_add(1, Ordering::Relaxed);
        }
        conn.end_chunks().await
    }
    .await;
    if ok.is_ok() {
        conn.close().await;
    }
}

/// What one client checked.
struct Checked {
    envelopes: usize,
    bytes: usize,
}

/// Runs one stream through the gateway and checks it envelope for envelope.
async fn run_stream(gw: std::net::SocketAddr, seed: u64, n: usize, gap: Duration) -> Result<Checked, String> {
    let path = format!("/soak/{seed}/{n}/{}", gap.as_micros());
    let s = script(seed, n);
    let limit = gap * (s.events.len() as u32 + 10) + PATIENCE;
    let mut c = Client::open(gw, &path).await.map_err(|e| format!("{path}: {e}"))?;
    if c.status != 200 {
        return Err(format!("{path}: status {}", c.status));
    }
    c.read_to_end(limit).await.map_err(|e| format!("{path}: {e}"))?;
    let events = parse_stream(&c.body).map_err(|e| format!("{path}: {e}"))?;
    if events.last() != Some(&Out::Done) {
        return Err(format!("{path}: no [DONE] at the end"));
    }
    let envs = envelope_values(&events);
    // 1. Exactly the envelopes the translator makes of the whole stream at once: none lost, none altered.
    let whole: Vec<u8> = s.events.concat();
    let want = translate_all(Options::default(), "fallback", &whole).0;
    let want_envs = envelope_values(&parse_stream(&want).map_err(|e| format!("{path}: reference: {e}"))?);
    if envs != want_envs {
        let at = harness::diff::first_difference(&envs, &want_envs);
        return Err(format!(
            "{path}: {} envelopes, want {}; first difference at {at}: got {:?} want {:?}",
            envs.len(),
            want_envs.len(),
            envs.get(at),
            want_envs.get(at)
        ));
    }
    // 2. The content the upstream meant, block by block.
    let got = blocks(&envs);
    if got.len() != s.expected.len() {
        return Err(format!("{path}: {} blocks, want {}", got.len(), s.expected.len()));
    }
    for ((k, a, d), (wk, wd)) in got.iter().zip(&s.expected) {
        if k != wk || *a != s.agent || wd.as_ref().is_some_and(|wd| wd != d) {
            return Err(format!("{path}: block {k}/{a} {d:?}, want {wk}/{} {wd:?}", s.agent));
        }
    }
    Ok(Checked {
        envelopes: envs.len(),
        bytes: c.body.len(),
    })
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    t: f64,
    rss_kib: u64,
    fds: usize,
    active: f64,
    events: u64,
    streams: u64,
}

fn avg(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    match rt.block_on(soak(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn soak(args: Args) -> Result<(), String> {
    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let gap = args.gap();
    println!(
        "soak: {:.2} min, {} concurrent streams of {}-{} s, {} events/s in all ({gap:?} between a stream's events)",
        args.minutes, args.concurrency, args.min_secs, args.max_secs, args.rate
    );
    let sent = Arc::new(AtomicU64::new(0));
    let s2 = Arc::clone(&sent);
    let up = Upstream::start(move |conn| serve(conn, Arc::clone(&s2))).await;
    // Ended streams are held for resumption (`resume.retention_secs`, 300 s by default): a short retention lets
    // what they hold plateau within the run, so a growing RSS still means a leak; after the run, all of it must go.
    let gw = Process::against(&up.url(), &[("SSE_GATEWAY__RESUME__RETENTION_SECS", RETENTION_SECS)]);
    run_control(gw.addr).await.map_err(|e| format!("warm-up: {e}"))?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fd_baseline = gw.fds();
    let rss_baseline = gw.rss_kib();
    println!(
        "gateway pid {}: baseline RSS {} KiB, {fd_baseline} fds",
        gw.pid(),
        rss_baseline
    );

    let streams_ok = Arc::new(AtomicU64::new(0));
    let envelopes_ok = Arc::new(AtomicU64::new(0));
    let bytes_ok = Arc::new(AtomicU64::new(0));
    let failures: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let start = Instant::now();
    let mut slots = Vec::new();
    for slot in 0..args.concurrency {
        let (args, streams_ok, envelopes_ok, bytes_ok, failures) = (
            args.clone(),
            Arc::clone(&streams_ok),
            Arc::clone(&envelopes_ok),
            Arc::clone(&bytes_ok),
            Arc::clone(&failures),
        );
        let addr = gw.addr;
        slots.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(0x50a4 + slot as u64);
            // Staggered start, so streams do not all begin and end together.
            tokio::time::sleep(gap.mul_f64(rng.f64() * 40.0)).await;
            let mut i = 0u64;
            while start.elapsed() < total {
                let secs = args.min_secs + rng.f64() * (args.max_secs - args.min_secs);
                let n = ((secs / gap.as_secs_f64()) as usize).max(8);
                let seed = ((slot as u64) << 32) | i;
                i += 1;
                match run_stream(addr, seed, n, gap).await {
                    Ok(c) => {
                        streams_ok.fetch_add(1, Ordering::Relaxed);
                        envelopes_ok.fetch_add(c.envelopes as u64, Ordering::Relaxed);
                        bytes_ok.fetch_add(c.bytes as u64, Ordering::Relaxed);
                    }
                    Err(e) => failures.lock().expect("lock").push(e),
                }
            }
        }));
    }

    // Sampling.
    let mut samples = Vec::new();
    let mut next = start;
    println!(
        "{:>7} {:>9} {:>5} {:>7} {:>9} {:>8}",
        "t (s)", "RSS MiB", "fds", "active", "events/s", "streams"
    );
    let mut last_events = 0;
    loop {
        let active = gw.metric("sse_gateway_active_streams", &[]).await;
        let s = Sample {
            t: start.elapsed().as_secs_f64(),
            rss_kib: gw.rss_kib(),
            fds: gw.fds(),
            active,
            events: sent.load(Ordering::Relaxed),
            streams: streams_ok.load(Ordering::Relaxed),
        };
        let rate = (s.events - last_events) as f64 / SAMPLE_EVERY.as_secs_f64();
        last_events = s.events;
        println!(
            "{:>7.0} {:>9.1} {:>5} {:>7} {:>9.0} {:>8}",
            s.t,
            s.rss_kib as f64 / 1024.0,
            s.fds,
            s.active,
            if samples.is_empty() { 0.0 } else { rate },
            s.streams
        );
        samples.push(s);
        if slots.iter().all(|t| t.is_finished()) {
            break;
        }
        next += SAMPLE_EVERY;
        while Instant::now() < next && !slots.iter().all(|t| t.is_finished()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for t in slots {
        t.await.map_err(|e| format!("client slot panicked: {e}"))?;
    }
    let elapsed = start.elapsed();

    // After the run: no stream left, fds back to the baseline.
    let active_after = gw.wait_no_active_streams(Duration::from_secs(10)).await;
    let fds_after = gw
        .wait_fds_at_most(fd_baseline + FD_SLACK, Duration::from_secs(10))
        .await;
    let rss_after = gw.rss_kib();
    let held_after = wait_nothing_held(&gw).await;

    // Trends over the sampling while the load ran: the ramp-up (streams start staggered) and the drain after the
    // load are left out.
    let loaded: Vec<Sample> = samples
        .iter()
        .copied()
        .filter(|s| s.t >= RAMP_UP.as_secs_f64() - 0.5 && s.t <= total.as_secs_f64() + 0.5)
        .collect();
    let span = loaded.last().map_or(0.0, |l| l.t) - loaded.first().map_or(0.0, |f| f.t);
    let window = (span / 4.0).clamp(SAMPLE_EVERY.as_secs_f64(), 60.0);
    let t0 = loaded.first().map_or(0.0, |f| f.t);
    let t1 = loaded.last().map_or(0.0, |l| l.t);
    let first: Vec<&Sample> = loaded.iter().filter(|s| s.t <= t0 + window + 0.5).collect();
    let last: Vec<&Sample> = loaded.iter().filter(|s| s.t >= t1 - window - 0.5).collect();
    let steady_rate = match (loaded.first(), loaded.last()) {
        (Some(f), Some(l)) if l.t > f.t => (l.events - f.events) as f64 / (l.t - f.t),
        _ => 0.0,
    };
    let rss_first = avg(first.iter().map(|s| s.rss_kib as f64 / 1024.0));
    let rss_last = avg(last.iter().map(|s| s.rss_kib as f64 / 1024.0));
    let fd_first = avg(first.iter().map(|s| s.fds as f64));
    let fd_last = avg(last.iter().map(|s| s.fds as f64));
    let rss_peak = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    let failures = failures.lock().expect("lock").clone();
    let events = sent.load(Ordering::Relaxed);
    let streams = streams_ok.load(Ordering::Relaxed);

    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!(
        "| duration | {:.1} s (load {:.1} s) |",
        elapsed.as_secs_f64(),
        total.as_secs_f64()
    );
    println!("| streams completed and verified | {streams} |");
    println!("| streams failed | {} |", failures.len());
    println!(
        "| upstream events sent | {events} ({:.0}/s) |",
        events as f64 / elapsed.as_secs_f64()
    );
    println!("| steady event rate (after ramp-up, before drain) | {steady_rate:.0}/s |");
    println!("| envelopes verified | {} |", envelopes_ok.load(Ordering::Relaxed));
    println!(
        "| bytes to clients | {:.1} MiB |",
        bytes_ok.load(Ordering::Relaxed) as f64 / 1048576.0
    );
    println!(
        "| RSS baseline / peak / after | {:.1} / {:.1} / {:.1} MiB |",
        rss_baseline as f64 / 1024.0,
        rss_peak as f64 / 1024.0,
        rss_after as f64 / 1024.0
    );
    println!("| RSS first {window:.0} s avg / last {window:.0} s avg | {rss_first:.1} / {rss_last:.1} MiB (limit +{RSS_TREND_MIB}) |");
    println!("| fds first / last window avg | {fd_first:.1} / {fd_last:.1} (limit +{FD_TREND}) |");
    println!("| fds baseline / after | {fd_baseline} / {fds_after} (limit +{FD_SLACK}) |");
    println!("| active streams after | {active_after} |");
    println!("| bytes held for resumption after retention | {held_after} |");

    let mut problems = Vec::new();
    if !failures.is_empty() {
        problems.push(format!(
            "{} streams failed, e.g.:\n  {}",
            failures.len(),
            failures[..failures.len().min(5)].join("\n  ")
        ));
    }
    if streams == 0 {
        problems.push("no stream completed".into());
    }
    if rss_last > rss_first + RSS_TREND_MIB {
        problems.push(format!(
            "RSS trend: last window {rss_last:.1} MiB > first {rss_first:.1} MiB + {RSS_TREND_MIB}"
        ));
    }
    if fd_last > fd_first + FD_TREND {
        problems.push(format!(
            "fd trend: last window {fd_last:.1} > first {fd_first:.1} + {FD_TREND}"
        ));
    }
    if fds_after > fd_baseline + FD_SLACK {
        problems.push(format!("fd leak: {fds_after} open after the run, {fd_baseline} before"));
    }
    if active_after != 0.0 {
        problems.push(format!("active_streams {active_after} after the run"));
    }
    if held_after != 0.0 {
        problems.push(format!(
            "resume_held_bytes {held_after} after the run and its retention: held streams leak"
        ));
    }
    if problems.is_empty() {
        println!("\nsoak: PASSED");
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// `resume.retention_secs` of the soak's gateway.
const RETENTION_SECS: &str = "2";

/// Polls until the gateway holds no event for resumption (the run's streams past their retention); returns the last
/// `resume_held_bytes` seen.
async fn wait_nothing_held(gw: &Process) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let held = gw.metric("sse_gateway_resume_held_bytes", &[]).await;
        if held == 0.0 || Instant::now() > deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
