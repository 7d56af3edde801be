//! Load harness (issue 5): the gateway side by side with the upstream direct and nginx, on 127.0.0.1 only.
//!
//! `cargo bench --bench load -- <latency|throughput|idle|large|scaling|resume|cost|all|instructions|redis|websocket|frontend|otel|inspector> [--quick] [options]`; see `usage()`.
//! Processes: this driver (the load client, one current-thread tokio runtime), the synthetic upstream (this
//! binary re-run as `__upstream`, its own current-thread runtime), nginx (one worker) and the gateway's release
//! binary (its default multi-thread runtime: 2 workers here). All share the machine's cores. Every phase is
//! bounded in streams and time; all children are ended when the driver exits.

#[path = "load/client.rs"]
mod client;
#[path = "load/common.rs"]
mod common;
#[path = "load/inspector.rs"]
mod inspector;
#[path = "load/instructions.rs"]
mod instructions;
#[path = "../tests/harness/metrics.rs"]
mod metrics;
#[path = "load/otel_sink.rs"]
mod otel_sink;
#[path = "load/procs.rs"]
mod procs;
#[path = "load/redis_scale.rs"]
mod redis_scale;
// The tests' Redis server (`procs::start_redis`); its `url` serves the tests only.
#[allow(dead_code)]
#[path = "../tests/harness/redis_server.rs"]
mod redis_server;
#[path = "load/report.rs"]
mod report;
#[path = "load/resume.rs"]
mod resume;
#[path = "load/scenarios.rs"]
mod scenarios;
#[path = "load/upstream.rs"]
mod upstream;
#[path = "load/websocket.rs"]
mod websocket;

use std::path::PathBuf;
use std::process::ExitCode;

/// Raises the soft open-files limit to the hard one (10,000 streams need ~10,000 descriptors per process).
pub fn raise_nofile() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0)
}

/// Command-line options of the driver.
#[derive(Clone, Debug)]
pub struct Opts {
    pub scenario: String,
    pub quick: bool,
    pub rounds: Option<usize>,
    pub secs: Option<f64>,
    pub gateway: PathBuf,
    /// `--baseline`: a second gateway binary, one more target (`gateway-baseline`).
    pub baseline: Option<PathBuf>,
    pub nginx: String,
    pub plot: PathBuf,
    pub out: Option<PathBuf>,
    pub idle_streams: Option<usize>,
    pub hold_secs: Option<f64>,
    pub counts: Option<Vec<usize>>,
    /// `--pin`: (CPUs of this driver and the upstream, CPUs of the proxy under test).
    pub pin: Option<(String, String)>,
    /// `--resume-streams`: streams of each `resume` phase.
    pub resume_streams: Option<usize>,
    /// `--stores`: the store cases `resume` measures (`resume::CASES`).
    pub stores: Option<Vec<String>>,
    /// `--readers`: `instructions` counts a socket against an SSE watcher (`sse,socket`).
    pub readers: Option<Vec<String>>,
}

impl Opts {
    pub fn proxy_cpus(&self) -> Option<&str> {
        self.pin.as_ref().map(|(_, proxy)| proxy.as_str())
    }
}

/// `--pin`'s split: CPU 0 for the load side, the rest for the proxy under test (which is then alone on them).
fn pin_split() -> Result<(String, String), String> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 {
        return Err("--pin needs at least 2 CPUs".into());
    }
    Ok(("0".into(), if n == 2 { "1".into() } else { format!("1-{}", n - 1) }))
}

fn usage() -> &'static str {
    "usage: cargo bench --bench load -- <latency|throughput|idle|large|scaling|resume|cost|all|instructions|redis|websocket|frontend|otel|inspector> [options]
  --quick            short phases and small counts (CI smoke, < 3 minutes for `all`)
  --rounds N         interleaved rounds per target (A B A B ...)
  --secs S           measured window per phase, seconds
  --idle-streams N   streams held by `idle` (default 10000; 1000 with --quick) and by each memory row of
                     `cost` (default 1000; 500 with --quick)
  --hold S           seconds `idle` holds them (default 60; 3 with --quick); `cost`: default 5, 0.5 with --quick
  --counts A,B,..    stream counts of `scaling` (default 1,10,100,1000,10000; 1,10,100 with --quick)
  --resume-streams N streams of each `resume` phase (default 200; 50 with --quick)
  --stores A,B,..    store cases of `resume`: memory, redis (same instance), redis-other (reconnect to a
                     second instance); default memory. Redis cases start their own redis-server
                     (apt-get install -y redis-server) and are skipped without one
  --readers sse,socket  `instructions`: count a socket reader against an SSE watcher instead
  --gateway PATH     gateway binary (default target/release/sse-gateway)
  --baseline PATH    another gateway binary, run with its defaults as one more target, `gateway-baseline`
                     (translating, resumption on), beside the others in every round: a change measured
                     against its parent in one run
  --nginx PATH       nginx binary (default nginx)
  --plot PATH        PNG written by `scaling` (default benches/results/scaling.png;
                     target/load/scaling-quick.png with --quick)
  --out FILE         also append the markdown report to FILE
  --workers N        nginx `worker_processes N` and the gateway's `server.workers = N`, so both run N threads of
                     work (default: nginx 1, the gateway one per core)
  --pin              driver and upstream on CPU 0, nginx and the gateway on the other CPUs (taskset), so the
                     proxy under test has its cores to itself, as beside a real client and upstream
Every scenario but `scaling` also runs `gateway-resume-off`: the gateway with SSE_GATEWAY__RESUME__ENABLED=false
beside the default (resumption on), to report resumption's cost side by side.
`cost` (issue 16) gives nginx and the gateway side by side in one run: CPU per event (user+system of every
proxy process, and its user and system parts) at 50 streams × 400 ev/s paced over HTTP/1.1 (--secs: its window,
default 5), memory per idle stream over HTTP/1.1 and h2c (a fresh process per row), the ratios to nginx and the
verdicts (default 3 rounds).
`instructions` (not in `all`) counts the user-space instructions per event of nginx and the gateway under
valgrind's callgrind (apt-get install -y valgrind): a figure that holds still on a busy machine; --rounds N
measures resumption on and off N times interleaved and decides on the median of the same-round ratios; with
`--readers sse,socket`, instead, a socket reader against an SSE watcher per event delivered (issue 38); with
`--stores memory,redis`, instead, the gateway with the Redis store against the memory store (as `redis` ends)
`redis` (issue 26, not in `all`) runs two gateway instances on one redis-server (resume.store = \"redis\") beside a
memory-store gateway, all with resume.buffer_bytes = 64 KiB: Redis memory per held stream against buffer_bytes,
each instance's Redis connections with 0, 10, 50 (full: also 100) watchers on the second instance, events/s
through the store per instance (paced and at saturation, one instance and two at once) and CPU per event of the
gateway and of redis-server against the memory store (--rounds, --secs as in `cost`; --quick: < 2 minutes), then
with valgrind the gateway's instructions per event with each store
`websocket` (issue 28, not in `all`) measures the WebSocket output against SSE with the same gateway binary:
memory per idle socket against per idle SSE watcher (--idle-streams readers, default 1000, 500 with --quick,
10 per held stream, held --hold s, default 5, 1 with --quick; a fresh gateway per row) and CPU per event
delivered over a socket against over SSE (50 streams × 400 ev/s paced, --secs window), ratios and verdicts
(goal ≤ 1.0× on both; --rounds as in `cost`)
`frontend` (issue 35, not in `all`) runs the same paced streams as `cost` (50 × 400 ev/s over HTTP/1.1) through the
default gateway with the client asking `X-Stream-Format: json` (the envelope stream), `ai-sdk` and `ag-ui`, rounds
interleaved: the gateway's CPU per event of each and the ratios to json (bound: ≤ 1.10×); then, with valgrind,
the instructions per event of each under callgrind (--rounds, --secs as in `cost`)
`inspector` (issue 37, not in `all`) runs the same paced streams through two fresh gateways, `[debug] streams` off
and on (with capture_content), the second once unwatched and once with one live feed read: CPU per event of each,
ratios to off, rounds interleaved (--rounds, --secs as in `cost`)
exit status: 1 when a stream was dropped or a process failed; never because of a latency or throughput figure"
}

fn parse_args() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut o = Opts {
        scenario: String::new(),
        quick: false,
        rounds: None,
        secs: None,
        gateway: PathBuf::from("target/release/sse-gateway"),
        baseline: None,
        nginx: "nginx".into(),
        plot: PathBuf::from("benches/results/scaling.png"),
        out: None,
        idle_streams: None,
        hold_secs: None,
        counts: None,
        pin: None,
        resume_streams: None,
        stores: None,
        readers: None,
    };
    let mut plot_set = false;
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--quick" => o.quick = true,
            "--full" => o.quick = false,
            "--rounds" => o.rounds = Some(val("--rounds")?.parse().map_err(|e| format!("--rounds: {e}"))?),
            "--secs" => o.secs = Some(val("--secs")?.parse().map_err(|e| format!("--secs: {e}"))?),
            "--idle-streams" => {
                o.idle_streams = Some(
                    val("--idle-streams")?
                        .parse()
                        .map_err(|e| format!("--idle-streams: {e}"))?,
                )
            }
            "--counts" => {
                let v = val("--counts")?;
                let c: Result<Vec<usize>, _> = v.split(',').map(str::parse).collect();
                o.counts = Some(c.map_err(|e| format!("--counts: {e}"))?);
            }
            "--resume-streams" => {
                o.resume_streams = Some(
                    val("--resume-streams")?
                        .parse()
                        .map_err(|e| format!("--resume-streams: {e}"))?,
                )
            }
            "--stores" => o.stores = Some(val("--stores")?.split(',').map(str::to_owned).collect()),
            "--readers" => o.readers = Some(val("--readers")?.split(',').map(str::to_owned).collect()),
            "--hold" => o.hold_secs = Some(val("--hold")?.parse().map_err(|e| format!("--hold: {e}"))?),
            "--gateway" => o.gateway = PathBuf::from(val("--gateway")?),
            "--baseline" => o.baseline = Some(PathBuf::from(val("--baseline")?)),
            "--nginx" => o.nginx = val("--nginx")?,
            "--plot" => {
                o.plot = PathBuf::from(val("--plot")?);
                plot_set = true;
            }
            "--out" => o.out = Some(PathBuf::from(val("--out")?)),
            "--pin" => o.pin = Some(pin_split()?),
            "--workers" => {
                let n: usize = val("--workers")?.parse().map_err(|e| format!("--workers: {e}"))?;
                // Inherited by every gateway the harness starts; nginx's config reads it too.
                std::env::set_var(procs::WORKERS_ENV, n.max(1).to_string());
            }
            "-h" | "--help" => return Err(String::new()),
            s if !s.starts_with('-') && o.scenario.is_empty() => o.scenario = s.to_owned(),
            s => return Err(format!("unknown argument {s:?}")),
        }
    }
    if o.scenario.is_empty() {
        return Err(String::new());
    }
    if o.quick && !plot_set {
        // A smoke run must not overwrite the committed plot.
        o.plot = PathBuf::from("target/load/scaling-quick.png");
    }
    Ok(o)
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("__upstream") {
        return upstream::main();
    }
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs bench targets without --bench: this is a load harness, not a test.
        eprintln!("load: a load harness; run it with benches/run-load.sh or `cargo bench --bench load -- ...`");
        return ExitCode::SUCCESS;
    }
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("load: {e}");
            }
            eprintln!("{}", usage());
            return ExitCode::from(2);
        }
    };
    if let Some((load, _)) = &opts.pin {
        if let Err(e) = procs::pin_self(load) {
            eprintln!("load: {e}");
            return ExitCode::FAILURE;
        }
    }
    let limit = raise_nofile();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("load: runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(scenarios::run(&opts, limit)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("load: FAILED: streams were dropped or failed (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("load: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
