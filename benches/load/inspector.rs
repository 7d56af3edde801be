//! Issue 37's cost: the stream inspector's CPU per event, off against on with nobody watching and on with one live
//! feed open, the same paced streams through two fresh gateways of the same binary, rounds interleaved.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::{run_phase, Proto, Target};
use crate::procs;
use crate::report::{by_round, median, n, ratio_cell, round_ratio, verdict, Report};
use crate::scenarios::{order, rated_plan, report_failures};
use crate::Opts;

/// Streams and events per second each, as `cost` and `frontend`.
const PACED: (usize, f64) = (50, 400.0);

/// The gateways: `[debug]` off (the default), on without content, on with content.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Setting {
    Off,
    On,
    Content,
}

/// The rows: name, its gateway, whether one feed watches.
const ROWS: [(&str, Setting, bool); 4] = [
    ("gateway-inspector-off", Setting::Off, false),
    ("gateway-inspector-on", Setting::On, false),
    ("gateway-inspector-content", Setting::Content, false),
    ("gateway-inspector-content-watched", Setting::Content, true),
];

/// Watches one live stream of the gateway on `admin` (its first listed) through `/debug/streams/{id}/events`,
/// reading as fast as it comes, until `stop`; returns the bytes the feed delivered.
fn watch_one(admin: u16, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        let id = loop {
            if stop.load(Ordering::Acquire) || Instant::now() > deadline {
                return 0;
            }
            let live = procs::http_get(admin, "/debug/streams.json")
                .ok()
                .and_then(|page| serde_json::from_str::<serde_json::Value>(&page).ok())
                .and_then(|v| {
                    v["streams"]
                        .as_array()?
                        .iter()
                        .find(|s| s["state"] == "live")
                        .and_then(|s| s["id"].as_str().map(str::to_owned))
                });
            if let Some(id) = live {
                break id;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let Ok(mut s) = TcpStream::connect(procs::addr(admin)) else {
            return 0;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
        if write!(s, "GET /debug/streams/{id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
            return 0;
        }
        let (mut total, mut buf) = (0u64, vec![0u8; 64 << 10]);
        while !stop.load(Ordering::Acquire) {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => total += k as u64,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        total
    })
}

pub async fn inspector(opts: &Opts, up: &[u16], rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 }).max(1);
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.5 } else { 5.0 }));
    let (paced, per_stream_rate) = PACED;
    let plan = rated_plan(paced, paced as f64 * per_stream_rate, window, Proto::H1);
    let tck = procs::clk_tck();
    let on_env: Vec<(String, String)> = vec![("SSE_GATEWAY__DEBUG__STREAMS".into(), "true".into())];
    let content_env: Vec<(String, String)> = vec![
        ("SSE_GATEWAY__DEBUG__STREAMS".into(), "true".into()),
        ("SSE_GATEWAY__DEBUG__CAPTURE_CONTENT".into(), "true".into()),
    ];
    let start = |name: &str, port: u16, env: &[(String, String)]| {
        let dir = procs::scratch(name);
        procs::spawn_gateway(
            &opts.gateway,
            &procs::Place {
                wrapper: &[],
                dir: &dir,
                upstream: port,
                cpus: opts.proxy_cpus(),
                env,
            },
        )
    };
    let mut off = start("gateway-inspector-off", up[2], &[])?;
    let mut on = start("gateway-inspector-on", up[3], &on_env)?;
    let mut content = start(
        "gateway-inspector-content",
        up[crate::upstream::LISTENERS - 1],
        &content_env,
    )?;
    rep.line("## inspector: CPU per event with the stream inspector off, on, and watched (issue 37)\n");
    rep.line(format!(
        "{paced} streams over HTTP/1.1, each paced at {per_stream_rate:.0} events/s ({} events/s in all) by the legacy \
         upstream, through three fresh gateways of the same release binary: `[debug] streams = false` (the default), \
         `streams = true` (every event and envelope kept as a record in its stream's ring, counts and timings) \
         and `streams = true, capture_content = true` (content included); on the last, once with nobody watching \
         and once with one live feed \
         (`/debug/streams/{{id}}/events` of the first live stream, read as fast as it comes by a thread of the \
         driver). Per event = the gateway's user + system CPU over the whole phase (ramp, {:.1} s warm-up, {:.1} s \
         window) / stamped text deltas delivered; /proc ticks of 10 ms. {rounds} interleaved round(s) (A B C, C B \
         A, …); the ratio is the median over rounds of (row / off in the same round).\n",
        n(paced as f64 * per_stream_rate),
        plan.warm.as_secs_f64(),
        window.as_secs_f64(),
    ));
    let k = ROWS.len();
    let (mut cpu, mut user, mut rate, mut fed) = (
        vec![Vec::new(); k],
        vec![Vec::new(); k],
        vec![Vec::new(); k],
        vec![Vec::new(); k],
    );
    let mut failed = vec![0usize; k];
    for round in 0..rounds {
        for i in order(round, k) {
            let (name, setting, watched) = ROWS[i];
            let gw = match setting {
                Setting::Off => &off,
                Setting::On => &on,
                Setting::Content => &content,
            };
            let t = Target {
                name,
                addr: procs::addr(gw.1),
                h2_addr: procs::addr(gw.1),
                format: None,
                translated: true,
            };
            let stop = Arc::new(AtomicBool::new(false));
            let watcher = watched.then(|| watch_one(gw.2, Arc::clone(&stop)));
            let pid = gw.0.pid();
            let before = procs::usage(pid).ok_or("gateway usage")?;
            let r = run_phase(&t, &plan, Arc::new(AtomicUsize::new(0))).await;
            let used = procs::usage(pid).ok_or("gateway usage")?.since(before);
            stop.store(true, Ordering::Release);
            let bytes = watcher.map_or(0, |w| w.join().unwrap_or(0));
            report_failures(&r, &t, &plan, rep, ok);
            let per_event = 1e6 / r.events.max(1) as f64 / tck;
            cpu[i].push((used.user + used.system) as f64 * per_event);
            user[i].push(used.user as f64 * per_event);
            rate[i].push(r.rate());
            fed[i].push(bytes as f64);
            failed[i] += r.failed();
            if watched && bytes == 0 {
                *ok = false;
                rep.line(format!("**round {round}: the watcher read nothing from the feed**"));
            }
        }
        if !off.0.alive() || !on.0.alive() || !content.0.alive() {
            return Err("a gateway exited during the inspector scenario (see /tmp/sse-gateway-load-*)".into());
        }
    }
    rep.line("| gateway | CPU per event, µs (median) | / off | user, µs | by round | events/s delivered | feed bytes read | failed streams |");
    rep.line("|---|---|---|---|---|---|---|---|");
    for (i, (name, _, _)) in ROWS.iter().enumerate() {
        rep.line(format!(
            "| {name} | **{:.2}** | {} | {:.2} | {} | {} | {} | {} |",
            median(cpu[i].clone()),
            ratio_cell(i, &cpu[i], &cpu[0]),
            median(user[i].clone()),
            by_round(&cpu[i], 2),
            rate[i].iter().map(|r| n(*r)).collect::<Vec<_>>().join(", "),
            n(median(fed[i].clone())),
            failed[i]
        ));
    }
    rep.line("");
    let spread = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
        if v.is_empty() {
            0.0
        } else {
            hi - lo
        }
    };
    for i in 1..k {
        let diff = median(cpu[i].iter().zip(&cpu[0]).map(|(a, b)| a - b).collect());
        rep.line(format!(
            "- {} / off: {:.2} / {:.2} µs per event = {:.3}× ({diff:+.2} µs, median of same-round differences)",
            ROWS[i].0,
            median(cpu[i].clone()),
            median(cpu[0].clone()),
            round_ratio(&cpu[i], &cpu[0]),
        ));
    }
    rep.line(format!(
        "- noise: the off row's spread over rounds is {:.2} µs per event (10 ms ticks over the phase, a machine \
         shared with other builds); a difference within it is not a measured cost",
        spread(&cpu[0])
    ));
    rep.line(format!("- none dropped: {}\n", verdict(failed.iter().all(|f| *f == 0))));
    Ok(())
}
