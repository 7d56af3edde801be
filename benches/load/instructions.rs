//! `instructions`: user-space instructions each proxy executes per event, counted by valgrind's callgrind.
//!
//! Timings on a shared machine move by 2× from one run to the next; executed instructions do not. This gives a
//! figure that an A/B of two builds can rely on where `latency` cannot. It leaves out the kernel's share
//! (sockets, wake-ups), which `latency` and `throughput` report as CPU time. The proxies run under callgrind
//! (about 50× slower), so the rate is low: each event is handled on its own, as at 1k ev/s.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use crate::client::{run_phase, Proto, Target};
use crate::procs::{self, Proc};
use crate::report::{n, verdict, Report};
use crate::Opts;

/// Streams and events per second in all: low enough that callgrind keeps up, so no events batch.
pub const STREAMS: usize = 20;
pub const RATE: f64 = 200.0;
/// Streams of the Redis store's count in the paced load's shape (`redis_store`): fewer, faster streams.
const PACED_STREAMS: usize = 4;

pub fn callgrind(dir: &Path) -> Vec<String> {
    vec![
        "valgrind".into(),
        "--tool=callgrind".into(),
        format!("--callgrind-out-file={}/callgrind.out.%p", dir.display()),
    ]
}

pub fn control(op: &str, pid: u32) -> Result<(), String> {
    let mut c = Command::new("callgrind_control");
    c.arg(op).arg(pid.to_string()).stderr(Stdio::null());
    procs::run_ok(&mut c, "valgrind", || format!("callgrind_control {op} {pid} failed"))
}

/// Instructions counted in `pid`'s newest dump (`callgrind.out.<pid>.<n>`, written by `callgrind_control -d`).
pub fn newest_dump(dir: &Path, pid: u32) -> Result<u64, String> {
    let prefix = format!("callgrind.out.{pid}.");
    let newest = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let k: u32 = name.strip_prefix(&prefix)?.parse().ok()?;
            Some((k, e.path()))
        })
        .max_by_key(|(k, _)| *k)
        .ok_or_else(|| format!("no callgrind dump for pid {pid} in {}", dir.display()))?;
    let text = std::fs::read_to_string(&newest.1).map_err(|e| e.to_string())?;
    text.lines()
        .find_map(|l| l.strip_prefix("summary: "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("{}: no summary line", newest.1.display()))
}

/// `t`'s instructions per event through `proc`: two phases, of `window` and twice that, each with `proc`'s counters
/// zeroed before and dumped after, so that stream set-up cancels out (per event = (instructions₂ − instructions₁) / (events₂ − events₁), NaN with no more events
/// in the second); and the table cells of the phases, `events₁, events₂ | instructions₁, instructions₂`.
async fn instructions_per_event(
    proc: &Proc,
    dir: &Path,
    t: &Target,
    streams: usize,
    window: Duration,
    rep: &mut Report,
    ok: &mut bool,
) -> Result<(f64, String), String> {
    // (instructions, events delivered) of each phase.
    let mut counted = [(0, 0); 2];
    for (phase, window) in [window, 2 * window].into_iter().enumerate() {
        control("-z", proc.pid())?;
        let plan = crate::scenarios::rated_plan(streams, RATE, window, Proto::H1);
        let r = run_phase(t, &plan, Arc::new(AtomicUsize::new(0))).await;
        crate::scenarios::report_failures(&r, t, &plan, rep, ok);
        control("-d", proc.pid())?;
        counted[phase] = (newest_dump(dir, proc.pid())?, r.events);
    }
    Ok(of_phases(counted))
}

/// From two phases' (instructions, events): instructions per event, (instructions₂ − instructions₁) /
/// (events₂ − events₁) (NaN with no more events in the second), and the table cells `events₁, events₂ |
/// instructions₁, instructions₂`.
pub fn of_phases([(i1, e1), (i2, e2)]: [(u64, u64); 2]) -> (f64, String) {
    let v = if e2 > e1 {
        (i2 as f64 - i1 as f64) / (e2 - e1) as f64
    } else {
        f64::NAN
    };
    let cells = format!(
        "{}, {} | {}, {}",
        n(e1 as f64),
        n(e2 as f64),
        n(i1 as f64),
        n(i2 as f64)
    );
    (v, cells)
}

pub async fn instructions(opts: &Opts, up: &[u16], rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("valgrind: {e} (apt-get install -y valgrind)"))?;
    if opts.readers.is_some() {
        // A socket against an SSE watcher (issue 38's socket reader).
        return crate::websocket::instructions(opts, up, rep, ok).await;
    }
    if opts.stores.as_ref().is_some_and(|s| s.iter().any(|s| s == "redis")) {
        // The Redis store against the memory store alone (what the `redis` scenario ends with).
        let redis = procs::start_redis()?;
        let (redis_env, memory_env) = crate::redis_scale::envs(redis.port);
        rep.line("## instructions: the Redis store against the memory store\n");
        return redis_store(opts, up, memory_env, redis_env, rep, ok).await;
    }
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 3.0 } else { 10.0 }));
    let dir = procs::scratch("callgrind");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;

    let wrapper = callgrind(&dir);
    let (nginx_dir, gateway_dir) = (dir.join("nginx"), dir.join("gateway"));
    let off_dir = dir.join("gateway-resume-off");
    let resume_off = crate::scenarios::resume_off_env();
    let under_callgrind = |dir, upstream, env| procs::Place {
        wrapper: &wrapper,
        dir,
        upstream,
        cpus: None,
        env,
    };
    let (nginx, h1, h2) = procs::spawn_nginx(&opts.nginx, &under_callgrind(&nginx_dir, up[1], &[]))?;
    let (gateway, port, _) = procs::spawn_gateway(&opts.gateway, &under_callgrind(&gateway_dir, up[2], &[]))?;
    // The same binary with `resume.enabled = false`, its own process (and upstream listener).
    let (gateway_off, port_off, _) =
        procs::spawn_gateway(&opts.gateway, &under_callgrind(&off_dir, up[3], &resume_off))?;
    let at = |a: u16| procs::addr(a);
    let runs = [
        (
            &nginx,
            Target {
                name: "nginx",
                addr: at(h1),
                h2_addr: at(h2),
                format: None,
                translated: false,
            },
        ),
        (
            &gateway,
            Target {
                name: "gateway",
                addr: at(port),
                h2_addr: at(port),
                format: None,
                translated: true,
            },
        ),
        (
            &gateway_off,
            Target {
                name: crate::scenarios::RESUME_OFF,
                addr: at(port_off),
                h2_addr: at(port_off),
                format: None,
                translated: true,
            },
        ),
        (
            &gateway,
            Target {
                name: "gateway-pass",
                addr: at(port),
                h2_addr: at(port),
                format: Some("legacy"),
                translated: false,
            },
        ),
    ];

    rep.line("## instructions: user-space instructions per event, under callgrind\n");
    rep.line(format!(
        "{STREAMS} streams over HTTP/1.1, {RATE:.0} events/s in all. Per proxy and mode, two phases of {:.0} s and \
         {:.0} s with the counters zeroed before and dumped after each (`callgrind_control`); per event = \
         (instructions₂ − instructions₁) / (events₂ − events₁), so stream set-up cancels out. The count is the \
         proxy process's own (nginx as one process, `master_process off`), user space only. `gateway` runs with its \
         defaults (resumption on: ids, held events); `{}` is the same binary in a process of its own with \
         `SSE_GATEWAY__RESUME__ENABLED=false`.\n",
        window.as_secs_f64(),
        2.0 * window.as_secs_f64(),
        crate::scenarios::RESUME_OFF
    ));
    rep.line("| target | instructions per event | events in the two phases | instructions in the two phases |");
    rep.line("|---|---|---|---|");
    let mut per_event = Vec::new();
    for (c, t) in &runs {
        let (v, phases) = instructions_per_event(c, &dir, t, STREAMS, window, rep, ok).await?;
        per_event.push(v);
        rep.line(format!("| {} | **{}** | {phases} |", t.name, n(v)));
    }
    rep.line(format!(
        "\n- gateway translating / nginx = {:.2}; gateway translating, resume off / nginx = {:.2}; gateway \
         pass-through / nginx = {:.2}",
        per_event[1] / per_event[0],
        per_event[2] / per_event[0],
        per_event[3] / per_event[0]
    ));
    // Resumption on against off in interleaved rounds (the first is the table's): off moves by ±5 % between
    // runs (the runtime's per-wake-up work), so one pair cannot decide a few percent; the median of the
    // same-round ratios can.
    let (mut on, mut off) = (vec![per_event[1]], vec![per_event[2]]);
    for _ in 1..opts.rounds.unwrap_or(1) {
        for (k, into) in [(1, &mut on), (2, &mut off)] {
            let (c, t) = &runs[k];
            into.push(instructions_per_event(c, &dir, t, STREAMS, window, rep, ok).await?.0);
        }
    }
    let on_off = crate::report::round_ratio(&on, &off);
    let excess = crate::report::median(on.iter().zip(&off).map(|(a, b)| a - b).collect());
    rep.line(format!(
        "- resume on / resume off (gateway translating), median of {} interleaved round(s) = {on_off:.3} \
         ({excess:+.0} instructions per event); on by round {}; off by round {}; target ≤ 1.1 (issue 15): {}; \
         ≤ 1.08 (issue 38): {}\n",
        on.len(),
        crate::report::by_round(&on, 0),
        crate::report::by_round(&off, 0),
        verdict(on_off <= 1.1),
        verdict(on_off <= 1.08)
    ));
    Ok(())
}

/// Issue 35: the instructions per event of the one gateway (its defaults, under callgrind) with the client asking
/// `X-Stream-Format: json`, `ai-sdk` and `ag-ui` in turn, as `instructions` counts them; the ratios to `json`. The
/// dumps stay in the scratch directory for `callgrind_annotate` (where the encoding's instructions go).
pub async fn frontend(opts: &Opts, up: &[u16], rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    if !valgrind_or_skip(rep) {
        return Ok(());
    }
    let window = Duration::from_secs_f64(if opts.quick { 2.0 } else { 4.0 });
    let dir = procs::scratch("callgrind-frontend");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let wrapper = callgrind(&dir);
    let place = procs::Place {
        wrapper: &wrapper,
        dir: &dir.join("gateway"),
        upstream: up[crate::upstream::LISTENERS - 1],
        cpus: None,
        env: &[],
    };
    let (gateway, port, _) = procs::spawn_gateway(&opts.gateway, &place)?;
    let formats = ["json", "ai-sdk", "ag-ui"];
    rep.line(format!(
        "Instructions per event under callgrind (the gateway's user space only, its defaults): {STREAMS} streams over \
         HTTP/1.1, {RATE:.0} events/s in all, through one gateway process under callgrind, each format in two \
         phases of {:.0} s and {:.0} s, counters zeroed before and dumped after each; per event = (instructions₂ − \
         instructions₁) / (events₂ − events₁). Dumps: `{}` (pid {}).\n",
        window.as_secs_f64(),
        2.0 * window.as_secs_f64(),
        dir.display(),
        gateway.pid()
    ));
    rep.line("| X-Stream-Format | instructions per event | / json | events in the two phases | instructions in the two phases |");
    rep.line("|---|---|---|---|---|");
    let mut per_event: Vec<f64> = Vec::new();
    for format in formats {
        let t = Target {
            name: format,
            addr: procs::addr(port),
            h2_addr: procs::addr(port),
            format: Some(format),
            translated: true,
        };
        let (v, phases) = instructions_per_event(&gateway, &dir, &t, STREAMS, window, rep, ok).await?;
        per_event.push(v);
        let to_json = if per_event.len() == 1 {
            "1.00".to_owned()
        } else {
            format!("**{:.3}×**", v / per_event[0])
        };
        rep.line(format!("| {format} | **{}** | {to_json} | {phases} |", n(v)));
    }
    rep.line("");
    for (format, v) in formats.iter().zip(&per_event).skip(1) {
        let r = v / per_event[0];
        rep.line(format!(
            "- {format} / json, instructions per event: {} / {} = {r:.3}× ({:+.0} per event; target ≤ 1.10×: {})",
            n(*v),
            n(per_event[0]),
            v - per_event[0],
            verdict(r <= 1.10)
        ));
    }
    rep.line("");
    Ok(())
}

/// `otel`'s deterministic half: instructions per event under callgrind of the gateway with traces off and with
/// traces exported to `sink` (issue 36: at most 5 % more).
pub async fn otel(opts: &Opts, up: &[u16], sink: &str, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    if !valgrind_or_skip(rep) {
        return Ok(());
    }
    let window = Duration::from_secs_f64(if opts.quick { 2.0 } else { 4.0 });
    let traced = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), sink.to_owned()),
        ("OTEL_SERVICE_NAME".to_owned(), "sse-gateway-load".to_owned()),
        // Batches wait past the phases: an export every 5 s falls in one phase or the other and would not cancel.
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "600000".to_owned()),
    ];
    let per_event = per_case(
        opts,
        up,
        "otel",
        (
            "Instructions per event under callgrind (the gateway's user space only, its defaults, resumption on; \
             the traced gateway's batches held past the phases, so the per-event cost of its taps is what is \
             counted)",
            ": the per-stream cost (spans made, exported) is in both phases and cancels, what is left is the \
             per-event cost of the run's tap.",
        ),
        "traces",
        &[("off", Vec::new()), ("exported", traced)],
        STREAMS,
        window,
        rep,
        ok,
    )
    .await?;
    let r = per_event[1] / per_event[0];
    rep.line(format!(
        "\n- exported / off, instructions per event: {r:.3}× ({:+.0} per event; target ≤ 1.05×: {})\n",
        per_event[1] - per_event[0],
        verdict(r <= 1.05)
    ));
    Ok(())
}

/// One gateway process under callgrind per case (`name`, its settings), each in front of the last upstream
/// listener in turn, `streams` streams sharing [`RATE`]: how they were counted (between `about`'s two parts), then the table of their instructions per
/// event (the first case the one the others are divided by) under a header whose first column is `what`; the
/// per-event figures in the cases' order.
#[allow(clippy::too_many_arguments)]
async fn per_case(
    opts: &Opts,
    up: &[u16],
    scenario: &str,
    about: (&str, &str),
    what: &str,
    cases: &[(&'static str, Vec<(String, String)>)],
    streams: usize,
    window: Duration,
    rep: &mut Report,
    ok: &mut bool,
) -> Result<Vec<f64>, String> {
    rep.line(format!(
        "{}: {streams} streams over HTTP/1.1, {RATE:.0} events/s in all, one gateway process under callgrind per \
         case, two phases of {:.0} s and {:.0} s, counters zeroed before and dumped after each; per event = \
         (instructions₂ − instructions₁) / (events₂ − events₁){}\n",
        about.0,
        window.as_secs_f64(),
        2.0 * window.as_secs_f64(),
        about.1
    ));
    let first = cases.first().map_or("", |c| c.0);
    rep.line(format!(
        "| {what} | instructions per event | / {first} | events in the two phases | instructions in the two phases |"
    ));
    rep.line("|---|---|---|---|---|");
    let mut per_event: Vec<f64> = Vec::new();
    for (name, env) in cases {
        let dir = procs::scratch(&format!("callgrind-{scenario}-{name}"));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let wrapper = callgrind(&dir);
        let place = procs::Place {
            wrapper: &wrapper,
            dir: &dir.join("gateway"),
            upstream: up[crate::upstream::LISTENERS - 1],
            cpus: None,
            env,
        };
        let (gateway, port, _) = procs::spawn_gateway(&opts.gateway, &place)?;
        let t = Target {
            name,
            addr: procs::addr(port),
            h2_addr: procs::addr(port),
            format: None,
            translated: true,
        };
        let (v, phases) = instructions_per_event(&gateway, &dir, &t, streams, window, rep, ok).await?;
        per_event.push(v);
        let ratio = if per_event.len() == 1 {
            "1.00".to_owned()
        } else {
            format!("**{:.3}×**", v / per_event[0])
        };
        rep.line(format!("| {name} | **{}** | {ratio} | {phases} |", n(v)));
    }
    Ok(per_event)
}

/// `redis`'s deterministic half (issue 38): instructions per event under callgrind of the gateway with the memory
/// store and with the Redis store on `redis_port` (`store_env`: its settings besides the store's), the latter with
/// its default write linger (at this rate about one event a round) and with a 100 ms one (about one event per
/// stream a round); then both stores in the paced load's shape (a few events per stream a round, the per-stream
/// work of each second spread over many events).
pub async fn redis_store(
    opts: &Opts,
    up: &[u16],
    memory_env: Vec<(String, String)>,
    redis_env: Vec<(String, String)>,
    rep: &mut Report,
    ok: &mut bool,
) -> Result<(), String> {
    if !valgrind_or_skip(rep) {
        return Ok(());
    }
    let window = Duration::from_secs_f64(if opts.quick { 2.0 } else { 4.0 });
    let mut lingering = redis_env.clone();
    lingering.push(("SSE_GATEWAY__RESUME__REDIS_WRITE_LINGER_MS".into(), "100".into()));
    let per_event = per_case(
        opts,
        up,
        "redis",
        (
            "### Instructions per event, Redis store against memory store\n\nUnder callgrind (the gateway's user \
             space only; `redis-server`'s work is not counted)",
            ". `redis` has the default write linger (5 ms: about one event a round at this rate), \
             `redis-linger-100` (a 100 ms linger) about one event per stream a round. At 10 events/s a stream, a \
             stream's work of each second (its heartbeat's commands, its owner's remote-state poll) weighs 40 times \
             what it does per event at the paced 50 × 400 ev/s load: the table after this one has that load's \
             shape.",
        ),
        "store",
        &[
            ("memory", memory_env.clone()),
            ("redis", redis_env.clone()),
            ("redis-linger-100", lingering),
        ],
        STREAMS,
        window,
        rep,
        ok,
    )
    .await?;
    rep.line(format!(
        "\n- Redis store / memory store, instructions per event: {:.3}× ({:+.0}) with the default linger, {:.3}× \
         ({:+.0}) with 100 ms\n",
        per_event[1] / per_event[0],
        per_event[1] - per_event[0],
        per_event[2] / per_event[0],
        per_event[2] - per_event[0],
    ));
    // The paced load's rounds: 50 streams × 400 ev/s with the 5 ms linger are about 150 events a round, 3 a
    // stream. Here: PACED_STREAMS streams share RATE, their writer lingering for about 3 events of each.
    let per_stream = RATE / PACED_STREAMS as f64;
    let linger_ms = (3.0 * 1000.0 / per_stream).round();
    let mut paced = redis_env;
    paced.push((
        "SSE_GATEWAY__RESUME__REDIS_WRITE_LINGER_MS".into(),
        format!("{linger_ms}"),
    ));
    let per_event = per_case(
        opts,
        up,
        "redis-paced",
        (
            &format!(
                "### Instructions per event in the paced load's shape\n\nThe same count with {PACED_STREAMS} \
                 streams of {per_stream:.0} events/s each and the Redis store's write linger at {linger_ms} ms: \
                 about 3 events per stream a round, as the paced 50 × 400 ev/s load's rounds hold, and a stream's \
                 work of each second spread over {per_stream:.0} events"
            ),
            ".",
        ),
        "store",
        &[("memory", memory_env), ("redis-paced", paced)],
        PACED_STREAMS,
        window,
        rep,
        ok,
    )
    .await?;
    rep.line(format!(
        "\n- Redis store / memory store in the paced shape, instructions per event: {:.3}× ({:+.0})\n",
        per_event[1] / per_event[0],
        per_event[1] - per_event[0],
    ));
    Ok(())
}

/// Whether valgrind can be run; says so in the report when not.
fn valgrind_or_skip(rep: &mut Report) -> bool {
    let installed = Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        rep.line("(instructions per event skipped: no valgrind; apt-get install -y valgrind)\n");
    }
    installed
}
