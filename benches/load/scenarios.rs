//! The scenarios of issue 5: latency, throughput, idle, large, scaling, and issue 16's `cost` (CPU per event
//! and memory per idle stream against nginx); each prints its markdown table. Since
//! issue 15 a second gateway process with resumption off (`gateway-resume-off`) runs beside the default one
//! (resumption on), so the cost of resumption is measured side by side; `resume` is in `crate::resume`.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::client::{histogram, run_phase, Kind, PhaseResult, Plan, Proto, Target};
use crate::procs::{self, Proc};
use crate::report::{by_round, median, ms, n, q, ratio_cell, round_ratio, us, verdict, Report};
use crate::Opts;

/// The processes under test and their addresses.
struct Env {
    _upstream: Proc,
    upstream_pid: u32,
    /// Upstream ports: direct, nginx, gateway.
    up: Vec<u16>,
    nginx: (Proc, u16, u16),
    /// The gateway with its defaults (resumption on).
    gateway: (Proc, u16, u16),
    /// The same binary with `resume.enabled = false`.
    gateway_off: (Proc, u16, u16),
    /// `--baseline`: the other binary, with its defaults.
    baseline: Option<(Proc, u16, u16)>,
    /// The `otel` scenario's gateway: its defaults, traces exported to a sink.
    traced: Option<(Proc, u16, u16)>,
    tck: f64,
}

/// A proxy run directly (no wrapper) in `dir`, in front of the upstream on port `upstream`, on the proxies' CPUs.
fn place<'a>(opts: &'a Opts, dir: &'a Path, upstream: u16, env: &'a [(String, String)]) -> procs::Place<'a> {
    procs::Place {
        wrapper: &[],
        dir,
        upstream,
        cpus: opts.proxy_cpus(),
        env,
    }
}

/// The target of the gateway translating with resumption off.
pub const RESUME_OFF: &str = "gateway-resume-off";
/// Targets by index: `gateway` is the gateway translating with its defaults (resumption on).
const NAMES: [&str; 7] = [
    "direct",
    "nginx",
    "gateway",
    "gateway-pass",
    RESUME_OFF,
    "gateway-baseline",
    "gateway-traced",
];
/// Index of `gateway` (translating, resumption on), `gateway-pass` and `gateway-resume-off` in `Env::targets`.
const GW: usize = 2;
const GW_PASS: usize = 3;
const GW_OFF: usize = 4;
/// Index of `gateway-baseline` (present with `--baseline`).
const BASELINE: usize = 5;
/// Index of `gateway-traced` (the `otel` scenario's gateway: its defaults, traces exported).
const TRACED: usize = 6;

/// The gateway's settings for `gateway-resume-off`.
pub fn resume_off_env() -> Vec<(String, String)> {
    vec![("SSE_GATEWAY__RESUME__ENABLED".into(), "false".into())]
}

impl Env {
    fn start(opts: &Opts) -> Result<Self, String> {
        let (upstream, up) = procs::spawn_upstream()?;
        let nginx = procs::spawn_nginx(&opts.nginx, &place(opts, &procs::scratch("nginx"), up[1], &[]))?;
        let gateway = procs::spawn_gateway(&opts.gateway, &place(opts, &procs::scratch("gateway"), up[2], &[]))?;
        let off = resume_off_env();
        let dir = procs::scratch("gateway-resume-off");
        let gateway_off = procs::spawn_gateway(&opts.gateway, &place(opts, &dir, up[3], &off))?;
        let baseline = match &opts.baseline {
            Some(bin) => Some(procs::spawn_gateway(
                bin,
                &place(opts, &procs::scratch("gateway-baseline"), up[4], &[]),
            )?),
            None => None,
        };
        Ok(Self {
            upstream_pid: upstream.pid(),
            _upstream: upstream,
            up,
            nginx,
            gateway,
            gateway_off,
            baseline,
            traced: None,
            tck: procs::clk_tck(),
        })
    }

    /// A fresh gateway (memory scenarios measure growth from a clean start): the one behind target `ti`
    /// (`GW_OFF`: resumption off; any other: the default one).
    fn restart_gateway(&mut self, opts: &Opts, tag: &str, ti: usize) -> Result<(), String> {
        let dir = procs::scratch(&format!("gateway-{tag}"));
        if ti == GW_OFF {
            let off = resume_off_env();
            self.gateway_off = procs::spawn_gateway(&opts.gateway, &place(opts, &dir, self.up[3], &off))?;
        } else {
            self.gateway = procs::spawn_gateway(&opts.gateway, &place(opts, &dir, self.up[2], &[]))?;
        }
        Ok(())
    }

    /// The gateway process behind target `ti`: (proc, public port, admin port).
    fn gateway_of(&self, ti: usize) -> &(Proc, u16, u16) {
        match (ti, &self.baseline) {
            (GW_OFF, _) => &self.gateway_off,
            (TRACED, _) if self.traced.is_some() => self.traced.as_ref().unwrap_or(&self.gateway),
            (BASELINE, Some(b)) => b,
            _ => &self.gateway,
        }
    }

    /// A fresh nginx (its idle row measures growth from a clean worker).
    fn restart_nginx(&mut self, opts: &Opts) -> Result<(), String> {
        let dir = procs::scratch("nginx-idle");
        self.nginx = procs::spawn_nginx(&opts.nginx, &place(opts, &dir, self.up[1], &[]))?;
        Ok(())
    }

    fn targets(&self) -> Vec<Target> {
        let up = procs::addr(self.up[0]);
        let gw = procs::addr(self.gateway.1);
        let mut targets = vec![
            Target {
                name: NAMES[0],
                addr: up,
                h2_addr: up,
                format: None,
                translated: false,
            },
            Target {
                name: NAMES[1],
                addr: procs::addr(self.nginx.1),
                h2_addr: procs::addr(self.nginx.2),
                format: None,
                translated: false,
            },
            Target {
                name: NAMES[2],
                addr: gw,
                h2_addr: gw,
                format: None,
                translated: true,
            },
            Target {
                name: NAMES[3],
                addr: gw,
                h2_addr: gw,
                format: Some("legacy"),
                translated: false,
            },
            Target {
                name: NAMES[GW_OFF],
                addr: procs::addr(self.gateway_off.1),
                h2_addr: procs::addr(self.gateway_off.1),
                format: None,
                translated: true,
            },
        ];
        if let Some(b) = &self.baseline {
            targets.push(Target {
                name: NAMES[BASELINE],
                addr: procs::addr(b.1),
                h2_addr: procs::addr(b.1),
                format: None,
                translated: true,
            });
        }
        targets
    }

    /// (name, pid) of every process whose CPU time is reported: upstream, nginx worker(s), the gateway behind
    /// target `ti`, client.
    fn pids(&self, ti: usize) -> Vec<(&'static str, Vec<u32>)> {
        let mut ng = procs::children(self.nginx.0.pid());
        ng.push(self.nginx.0.pid());
        vec![
            ("upstream", vec![self.upstream_pid]),
            ("nginx", ng),
            ("gateway", vec![self.gateway_of(ti).0.pid()]),
            ("client", vec![std::process::id()]),
        ]
    }

    /// What the processes of `pids(ti)` have used so far, by group.
    fn usage(&self, ti: usize) -> Vec<procs::Usage> {
        self.pids(ti)
            .iter()
            .map(|(_, ps)| {
                ps.iter()
                    .filter_map(|p| procs::usage(*p))
                    .fold(procs::Usage::default(), procs::Usage::plus)
            })
            .collect()
    }

    fn check_alive(&mut self) -> Result<(), String> {
        if !self.gateway.0.alive() {
            return Err("the gateway exited during the run (see its log under /tmp/sse-gateway-load-*)".into());
        }
        if !self.gateway_off.0.alive() {
            return Err(
                "the resume-off gateway exited during the run (see its log under /tmp/sse-gateway-load-*)".into(),
            );
        }
        if self.baseline.as_mut().is_some_and(|b| !b.0.alive()) {
            return Err("the baseline gateway exited during the run".into());
        }
        if !self.nginx.0.alive() {
            return Err("nginx exited during the run".into());
        }
        if !self._upstream.alive() {
            return Err("the upstream exited during the run".into());
        }
        Ok(())
    }
}

/// Everything measured for one target over the rounds of a scenario.
struct Acc {
    latency: Histogram<u64>,
    ttfb: Histogram<u64>,
    p99_rounds: Vec<f64>,
    p50_rounds: Vec<f64>,
    rates: Vec<f64>,
    events: u64,
    cpu: Vec<f64>,
    failed: usize,
    streams: usize,
}

impl Acc {
    fn new() -> Self {
        Self {
            latency: histogram(),
            ttfb: histogram(),
            p99_rounds: Vec::new(),
            p50_rounds: Vec::new(),
            rates: Vec::new(),
            events: 0,
            cpu: vec![0.0; 4],
            failed: 0,
            streams: 0,
        }
    }

    fn add(&mut self, r: &PhaseResult, cpu: &[f64]) {
        let _ = self.latency.add(&r.latency);
        let _ = self.ttfb.add(&r.ttfb);
        self.p99_rounds.push(q(&r.latency, 0.99));
        self.p50_rounds.push(q(&r.latency, 0.5));
        self.rates.push(r.rate());
        self.events += r.events;
        for (a, c) in self.cpu.iter_mut().zip(cpu) {
            *a += c;
        }
        self.failed += r.failed();
        self.streams += r.streams_ok + r.failed();
    }

    fn median_rate(&self) -> f64 {
        let mut v = self.rates.clone();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    /// CPU µs per delivered event, per process.
    fn cpu_per_event(&self) -> String {
        let ev = self.events.max(1) as f64;
        self.cpu
            .iter()
            .map(|c| format!("{:.2}", c * 1e6 / ev))
            .collect::<Vec<_>>()
            .join(" / ")
    }

    /// The proxy's (column 2: the gateway) CPU µs per delivered event.
    fn gateway_cpu_per_event(&self) -> f64 {
        self.cpu[2] * 1e6 / self.events.max(1) as f64
    }
}

/// Resume on / off: the gateway's CPU per event (target ≤ 1.1, issue 15), with the CPU clock's resolution in
/// mind (10 ms ticks: noisy when a phase has few events) and the machine's load.
fn resume_cpu_line(on: &Acc, off: &Acc) -> String {
    let (a, b) = (on.gateway_cpu_per_event(), off.gateway_cpu_per_event());
    let ratio = a / b.max(f64::MIN_POSITIVE);
    format!(
        "- resume on / resume off, gateway CPU per event: {a:.2} / {b:.2} µs = {ratio:.2} (target ≤ 1.1: {}; \
         wall-clock CPU on a shared machine, 10 ms ticks: `instructions` gives the steady figure)",
        verdict(ratio <= 1.1)
    )
}

/// The RSS of both gateways now (the resume-on one holds each stream's events, up to `resume.buffer_bytes`,
/// for `resume.retention_secs` after its end).
fn rss_line(env: &Env) -> String {
    let mib = |p: &Proc| procs::rss_kib(p.pid()).map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0));
    let page = procs::http_get(env.gateway.2, "/metrics").unwrap_or_default();
    let held = |name: &str, labels: &str| procs::metric(&page, name, labels).unwrap_or(-1.0);
    format!(
        "- gateway RSS at the end of the scenario: resume on {} MiB (holding {:.1} MiB of events, \
         `sse_gateway_resume_held_bytes`; streams live {}, retained {}), resume off {} MiB",
        mib(&env.gateway.0),
        held("sse_gateway_resume_held_bytes", "") / (1024.0 * 1024.0),
        held("sse_gateway_resume_streams", "state=\"live\""),
        held("sse_gateway_resume_streams", "state=\"retained\""),
        mib(&env.gateway_off.0)
    )
}

/// Runs one phase, with CPU accounting, failure printing and a liveness check.
async fn phase(
    env: &mut Env,
    t: &Target,
    plan: &Plan,
    rep: &mut Report,
    ok: &mut bool,
) -> Result<(PhaseResult, Spent), String> {
    let ti = NAMES.iter().position(|n| *n == t.name).unwrap_or(GW);
    let before = env.usage(ti);
    let r = run_phase(t, plan, Arc::new(AtomicUsize::new(0))).await;
    let used: Vec<procs::Usage> = env.usage(ti).into_iter().zip(before).map(|(a, b)| a.since(b)).collect();
    env.check_alive()?;
    report_failures(&r, t, plan, rep, ok);
    let secs = |ticks: u64| ticks as f64 / env.tck;
    let spent = Spent {
        cpu: used.iter().map(|u| secs(u.user + u.system)).collect(),
        system: used.iter().map(|u| secs(u.system)).collect(),
        faults: used.iter().map(|u| u.faults).collect(),
    };
    Ok((r, spent))
}

/// What each process group of `Env::pids` used over a phase: CPU seconds (user + system), of which system, and
/// minor page faults.
struct Spent {
    cpu: Vec<f64>,
    system: Vec<f64>,
    faults: Vec<u64>,
}

/// A line for the streams of a phase that failed, which also fails the run.
pub(crate) fn report_failures(r: &PhaseResult, t: &Target, plan: &Plan, rep: &mut Report, ok: &mut bool) {
    if r.failures.is_empty() {
        return;
    }
    *ok = false;
    rep.line(format!(
        "**{} of {} streams FAILED on {}** ({:?}{}, {} streams); first: {}",
        r.failures.len(),
        r.failures.len() + r.streams_ok,
        t.name,
        plan.kind,
        if plan.cut_at_end { " at saturation" } else { "" },
        plan.streams,
        r.failures.iter().take(3).cloned().collect::<Vec<_>>().join(" | ")
    ));
}

/// Round-robin order, reversed on odd rounds (A B C D, D C B A, …) so slow drift hits every target alike.
pub(crate) fn order(round: usize, n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    if round % 2 == 1 {
        v.reverse();
    }
    v
}

/// The scenarios `all` runs, in order.
const IN_ALL: [&str; 7] = ["latency", "throughput", "large", "scaling", "idle", "resume", "cost"];

pub async fn run(opts: &Opts, nofile: u64) -> Result<bool, String> {
    let mut rep = Report::default();
    let mut env = Env::start(opts)?;
    let mut ok = true;
    rep.line(format!(
        "# sse-gateway load harness: `{}`{}\n",
        opts.scenario,
        if opts.quick { " (quick)" } else { "" }
    ));
    // `--workers N` (inherited by the processes the harness starts).
    let workers = std::env::var(procs::WORKERS_ENV).ok();
    rep.line(format!(
        "Processes: driver/client pid {} (current-thread tokio), upstream pid {} (current-thread tokio, own process), \
         nginx master pid {} (worker_processes {}), gateway pid {} (release, server.workers {}; resumption \
         on, the default), gateway-resume-off pid {} (same binary, `SSE_GATEWAY__RESUME__ENABLED=false`){}. \
         Open-files limit {nofile}. All on 127.0.0.1, {}.\n",
        std::process::id(),
        env.upstream_pid,
        env.nginx.0.pid(),
        workers.as_deref().unwrap_or("1"),
        env.gateway.0.pid(),
        workers.as_deref().unwrap_or("0 (one per core, the default)"),
        env.gateway_off.0.pid(),
        match (&env.baseline, &opts.baseline) {
            (Some(b), Some(bin)) => format!(
                ", gateway-baseline pid {} (`{}`, its defaults)",
                b.0.pid(),
                bin.display()
            ),
            _ => String::new(),
        },
        match &opts.pin {
            Some((load, proxy)) =>
                format!("pinned: driver and upstream on CPU {load}, nginx and gateway on CPU {proxy}"),
            None => format!(
                "sharing {} cores",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            ),
        }
    ));
    // `instructions` is not part of `all`: it needs valgrind, and its phases run the proxies 50× slower; nor is
    // `redis`: it needs redis-server, and `resume` already runs the Redis store in `all`.
    let one = opts.scenario.as_str();
    if !(one == "all"
        || ["instructions", "redis", "websocket", "frontend", "otel", "inspector"].contains(&one)
        || IN_ALL.contains(&one))
    {
        return Err(format!("unknown scenario {one:?}"));
    }
    let names = if one == "all" { IN_ALL.to_vec() } else { vec![one] };
    for name in names {
        rep.line(format!("<!-- {name}: load average at start {} -->", loadavg()));
        match name {
            "latency" => latency(opts, &mut env, &mut rep, &mut ok).await?,
            "throughput" => throughput(opts, &mut env, &mut rep, &mut ok).await?,
            "large" => large(opts, &mut env, &mut rep, &mut ok).await?,
            "scaling" => scaling(opts, &mut env, &mut rep, &mut ok).await?,
            "idle" => idle(opts, &mut env, &mut rep, &mut ok).await?,
            "cost" => cost(opts, &mut env, &mut rep, &mut ok).await?,
            "resume" => crate::resume::resume(opts, &env.up, &mut rep, &mut ok).await?,
            "redis" => crate::redis_scale::redis(opts, &env.up, &mut rep, &mut ok).await?,
            "websocket" => crate::websocket::websocket(opts, &env.up, &mut rep, &mut ok).await?,
            "frontend" => frontend(opts, &mut env, &mut rep, &mut ok).await?,
            "inspector" => crate::inspector::inspector(opts, &env.up, &mut rep, &mut ok).await?,
            "otel" => otel(opts, &mut env, &mut rep, &mut ok).await?,
            _ => crate::instructions::instructions(opts, &env.up, &mut rep, &mut ok).await?,
        }
    }
    if let Some(path) = &opts.out {
        use std::io::Write;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let _ = f.write_all(rep.text.as_bytes());
    }
    Ok(ok)
}

pub(crate) fn rated_plan(streams: usize, total_rate: f64, window: Duration, proto: Proto) -> Plan {
    Plan {
        kind: Kind::Rated,
        streams,
        interval_us: (streams as f64 * 1e6 / total_rate).round() as u64,
        ramp_per_sec: 2000.0,
        warm: Duration::from_millis(500),
        window,
        cut_at_end: false,
        large_bytes: 0,
        proto,
        grace: Duration::from_secs(15),
    }
}

pub(crate) fn saturation_plan(streams: usize, window: Duration, proto: Proto) -> Plan {
    Plan {
        interval_us: 0,
        cut_at_end: true,
        warm: Duration::from_millis(700),
        ..rated_plan(streams, 1.0, window, proto)
    }
}

const CPU_HEAD: &str = "CPU µs/event: upstream / nginx / gateway / client";

async fn latency(opts: &Opts, env: &mut Env, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 8 });
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.5 } else { 3.0 }));
    rep.line("## latency: added per-event latency, 100 streams over HTTP/1.1\n");
    rep.line(format!(
        "Each delta is stamped with the upstream's send time; latency = client receive − stamp (same clock). \
         {rounds} interleaved round(s) per target, {:.0} s window each; the table pools all rounds. \
         \"Added\" = target percentile − direct percentile of the same round (events are not paired), median \
         over rounds.\n",
        window.as_secs_f64()
    ));
    let targets = env.targets();
    for rate in [1000.0, 10000.0] {
        let plan = rated_plan(100, rate, window, Proto::H1);
        let mut acc: Vec<Acc> = (0..targets.len()).map(|_| Acc::new()).collect();
        for round in 0..rounds {
            for i in order(round, targets.len()) {
                let (r, spent) = phase(env, &targets[i], &plan, rep, ok).await?;
                acc[i].add(&r, &spent.cpu);
            }
        }
        rep.line(format!(
            "### {} events/s in all (100 streams × {} ev/s)\n",
            n(rate),
            rate / 100.0
        ));
        rep.line(format!(
            "| target | events | p50 µs | p99 µs | p99.9 µs | max µs | p99 by round µs | TTFB p50/p99 ms | {CPU_HEAD} | failed streams |"
        ));
        rep.line("|---|---|---|---|---|---|---|---|---|---|");
        for (t, a) in targets.iter().zip(&acc) {
            let h = &a.latency;
            rep.line(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |",
                t.name,
                n(h.len() as f64),
                us(q(h, 0.5)),
                us(q(h, 0.99)),
                us(q(h, 0.999)),
                us(h.max() as f64),
                a.p99_rounds.iter().map(|v| us(*v)).collect::<Vec<_>>().join(", "),
                ms(q(&a.ttfb, 0.5)),
                ms(q(&a.ttfb, 0.99)),
                a.cpu_per_event(),
                a.failed
            ));
        }
        // Added latency per round (target − direct of the same round: the machine's load drifts between
        // rounds), then the median over rounds: one stalled round does not decide the figure.
        let added = |i: usize, p99: bool| -> f64 {
            let r = |a: &Acc| {
                if p99 {
                    a.p99_rounds.clone()
                } else {
                    a.p50_rounds.clone()
                }
            };
            let (t, d) = (r(&acc[i]), r(&acc[0]));
            median(t.iter().zip(&d).map(|(a, b)| a - b).collect())
        };
        let pooled = |i: usize, qq: f64| q(&acc[i].latency, qq) - q(&acc[0].latency, qq);
        rep.line("");
        rep.line("Added latency, median over rounds of (target − direct in the same round); pooled percentiles in brackets:\n");
        for (label, p99, qq) in [("p50", false, 0.5), ("p99", true, 0.99)] {
            let g = added(2, p99);
            let ng = added(1, p99);
            let ratio = if g < 0.0 {
                "n/a: the gateway's added latency is < 0, below the noise".to_string()
            } else if ng > 0.0 {
                format!("{:.2} (target ≤ 1.2: {})", g / ng, verdict(g <= 1.2 * ng))
            } else {
                "n/a: nginx's added latency is ≤ 0, below the noise".into()
            };
            rep.line(format!(
                "- added {label}: gateway translating {} µs [{}], gateway translating resume off {} µs [{}], \
                 gateway pass-through {} µs [{}], nginx {} µs [{}]; translating / nginx = {ratio}",
                us(g),
                us(pooled(2, qq)),
                us(added(GW_OFF, p99)),
                us(pooled(GW_OFF, qq)),
                us(added(3, p99)),
                us(pooled(3, qq)),
                us(ng),
                us(pooled(1, qq)),
            ));
        }
        rep.line(resume_cpu_line(&acc[GW], &acc[GW_OFF]));
        if rate >= 10000.0 {
            let g = added(2, true);
            let v = if g < 0.0 {
                "inconclusive: negative, the noise exceeds the effect"
            } else {
                verdict(g <= 100_000.0)
            };
            rep.line(format!(
                "- target p99 added (gateway translating − direct) ≤ 100 µs at 10k ev/s: {} µs → {v}",
                us(g)
            ));
        }
        rep.line("");
    }
    rep.line(rss_line(env));
    rep.line(format!(
        "\nTranslation time inside the gateway over the whole scenario (`sse_gateway_event_translation_seconds`): {}\n",
        translation_histogram(env.gateway.2)
    ));
    Ok(())
}

async fn throughput(opts: &Opts, env: &mut Env, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 });
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 2.0 } else { 5.0 }));
    rep.line("## throughput: events/s at saturation, 100 streams over HTTP/1.1\n");
    rep.line(format!(
        "The upstream sends each stream's deltas as fast as the path reads them; events counted at the client \
         over a {:.0} s window after {} ms of warm-up; median of {rounds} interleaved round(s). \
         Upstream, proxy and client share the 2 cores, so this is the saturation of the whole chain.\n",
        window.as_secs_f64(),
        700
    ));
    let targets = env.targets();
    let plan = saturation_plan(100, window, Proto::H1);
    let mut acc: Vec<Acc> = (0..targets.len()).map(|_| Acc::new()).collect();
    for round in 0..rounds {
        for i in order(round, targets.len()) {
            let (r, spent) = phase(env, &targets[i], &plan, rep, ok).await?;
            acc[i].add(&r, &spent.cpu);
        }
    }
    rep.line(format!("| target | events/s (median) | by round | {CPU_HEAD} |"));
    rep.line("|---|---|---|---|");
    for (t, a) in targets.iter().zip(&acc) {
        rep.line(format!(
            "| {} | {} | {} | {} |",
            t.name,
            n(a.median_rate()),
            a.rates.iter().map(|r| n(*r)).collect::<Vec<_>>().join(", "),
            a.cpu_per_event()
        ));
    }
    let ratio = acc[2].median_rate() / acc[1].median_rate().max(1.0);
    rep.line(format!(
        "\n- gateway translating / nginx = {ratio:.2} (target ≥ 0.8: {}); gateway pass-through / nginx = {:.2}",
        verdict(ratio >= 0.8),
        acc[3].median_rate() / acc[1].median_rate().max(1.0)
    ));
    rep.line(format!(
        "- resume on / resume off, events/s at saturation: {:.2}",
        acc[GW].median_rate() / acc[GW_OFF].median_rate().max(1.0)
    ));
    rep.line(resume_cpu_line(&acc[GW], &acc[GW_OFF]));
    rep.line(format!("{}\n", rss_line(env)));
    Ok(())
}

/// Samples the summed RSS (KiB) of `pids` every `every` until `stop` is set; returns the maximum.
async fn rss_peak(pids: Vec<u32>, every: Duration, stop: Arc<AtomicUsize>) -> u64 {
    let mut peak = 0;
    while stop.load(Ordering::Relaxed) == 0 {
        peak = peak.max(rss_sum(&pids));
        tokio::time::sleep(every).await;
    }
    peak.max(rss_sum(&pids))
}

fn rss_sum(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| procs::rss_kib(*p)).sum()
}

/// A few short streams through a fresh gateway (the one behind target `ti`) so lazily built state exists before
/// the baseline is taken.
async fn warm_gateway(env: &mut Env, ti: usize, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let ti = if ti == GW_OFF { GW_OFF } else { GW };
    let t = env.targets()[ti].clone();
    let plan = rated_plan(10, 1000.0, Duration::from_millis(300), Proto::H1);
    phase(env, &t, &plan, rep, ok).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(())
}

async fn large(opts: &Opts, env: &mut Env, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 });
    let bytes: u64 = 100 << 20;
    let decoded = crate::upstream::large_decoded_len(bytes);
    env.restart_gateway(opts, "large", GW)?;
    env.restart_gateway(opts, "large-resume-off", GW_OFF)?;
    warm_gateway(env, GW, rep, ok).await?;
    warm_gateway(env, GW_OFF, rep, ok).await?;
    rep.line("## large: a 100 MiB client tool result, one stream\n");
    rep.line(format!(
        "The upstream sends `<content-block-tool_result>` with a CDATA body of {} legacy bytes in 32 KiB SSE \
         events ({} bytes once `\\n` escapes are decoded). MB/s = decoded tool-result bytes / (request → last \
         byte), 1 MB = 10^6 B; the client checks the reassembled length. Gateway RSS sampled every 10 ms, \
         growth = peak − before the phase (fresh gateway process). {rounds} interleaved round(s).\n",
        n(bytes as f64),
        n(decoded as f64)
    ));
    let targets = env.targets();
    let plan = Plan {
        kind: Kind::Large,
        streams: 1,
        interval_us: 0,
        ramp_per_sec: 1000.0,
        warm: Duration::ZERO,
        window: Duration::ZERO,
        cut_at_end: false,
        large_bytes: bytes,
        proto: Proto::H1,
        grace: Duration::from_secs(60),
    };
    let mut rows: Vec<Vec<(f64, u64)>> = vec![Vec::new(); targets.len()];
    for round in 0..rounds {
        for i in order(round, targets.len()) {
            let pid = env.gateway_of(i).0.pid();
            let base = procs::rss_kib(pid).unwrap_or(0);
            let stop = Arc::new(AtomicUsize::new(0));
            let sampler = tokio::spawn(rss_peak(vec![pid], Duration::from_millis(10), Arc::clone(&stop)));
            let (r, _) = phase(env, &targets[i], &plan, rep, ok).await?;
            stop.store(1, Ordering::Relaxed);
            let peak = sampler.await.unwrap_or(0);
            let mbps = r.large_decoded as f64 / r.large_elapsed.as_secs_f64() / 1e6;
            rows[i].push((mbps, peak.saturating_sub(base)));
        }
    }
    rep.line("| target | MB/s by round | gateway RSS growth by round (MiB) |");
    rep.line("|---|---|---|");
    for (t, r) in targets.iter().zip(&rows) {
        let gw = t.name.starts_with("gateway");
        rep.line(format!(
            "| {} | {} | {} |",
            t.name,
            r.iter().map(|(m, _)| format!("{m:.0}")).collect::<Vec<_>>().join(", "),
            if gw {
                r.iter()
                    .map(|(_, g)| format!("{:.1}", *g as f64 / 1024.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            } else {
                "—".into()
            }
        ));
    }
    let best = rows[2].iter().map(|r| r.0).fold(0.0, f64::max);
    let median = {
        let mut v: Vec<f64> = rows[2].iter().map(|r| r.0).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let growth = rows[2].iter().map(|r| r.1).max().unwrap_or(0) as f64 / 1024.0;
    rep.line(format!(
        "\n- gateway translating: median {median:.0} MB/s (best {best:.0}); target ≥ 200 MB/s: {}",
        verdict(median >= 200.0)
    ));
    rep.line(format!(
        "- gateway RSS growth, worst round: {growth:.1} MiB; target < 32 MiB: {}\n",
        verdict(growth < 32.0)
    ));
    Ok(())
}

/// One idle measurement: `streams` idle streams through a fresh process of target `ti` over `proto`, held
/// `hold` after the ramp and `warm`.
struct IdleSpec {
    ti: usize,
    proto: Proto,
    streams: usize,
    hold: Duration,
    warm: Duration,
}

/// What one idle measurement found.
struct IdleRow {
    result: PhaseResult,
    /// RSS (KiB) of the fresh process after warm-up, and its peak during the hold.
    base: u64,
    peak: u64,
    /// RSS growth per stream, KiB.
    per: f64,
    /// The gateway's `sse_gateway_active_streams{mode="translate"}` and the process's descriptors at mid-hold.
    active: f64,
    fds: usize,
    /// Kernel TCP memory growth at mid-hold, KiB per stream (all four sockets of a stream).
    tcp_kib: f64,
}

/// Runs one idle measurement (`idle` and `cost`): a fresh process (nginx, or the gateway behind the target,
/// warmed by 10 short streams), RSS baseline, the streams held while the RSS peak is sampled every 250 ms,
/// descriptors and kernel TCP memory at mid-hold. Failed streams are reported and fail the run.
async fn idle_row(
    opts: &Opts,
    env: &mut Env,
    spec: &IdleSpec,
    rep: &mut Report,
    ok: &mut bool,
) -> Result<IdleRow, String> {
    let (ti, proto, streams, hold) = (spec.ti, spec.proto, spec.streams, spec.hold);
    // nginx: its workers (all of them with `--workers N`), not the master; the master when it serves alone.
    let pids = if ti == 1 {
        env.restart_nginx(opts)?;
        let master = env.nginx.0.pid();
        Some(procs::children(master))
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| vec![master])
    } else {
        env.restart_gateway(opts, &format!("idle-{}-{}", proto.label(), ti), ti)?;
        warm_gateway(env, ti, rep, ok).await?;
        vec![env.gateway_of(ti).0.pid()]
    };
    let pid = pids[0];
    let admin = env.gateway_of(ti).2;
    let base = rss_sum(&pids);
    let tcp0 = tcp_mem_pages();
    let plan = Plan {
        kind: Kind::Idle,
        streams,
        interval_us: 1000,
        ramp_per_sec: 2000.0,
        warm: spec.warm,
        window: hold,
        cut_at_end: false,
        large_bytes: 0,
        proto,
        grace: Duration::from_secs(30),
    };
    let t = env.targets()[ti].clone();
    let stop = Arc::new(AtomicUsize::new(0));
    let sampler = tokio::spawn(rss_peak(pids, Duration::from_millis(250), Arc::clone(&stop)));
    let mid = Duration::from_secs_f64(streams as f64 / plan.ramp_per_sec) + plan.warm + hold / 2;
    let probe = tokio::spawn(async move {
        tokio::time::sleep(mid).await;
        let page = tokio::task::spawn_blocking(move || procs::http_get(admin, "/metrics"))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let active = procs::metric(&page, "sse_gateway_active_streams", "mode=\"translate\"").unwrap_or(-1.0);
        (active, procs::fds(pid).unwrap_or(0), tcp_mem_pages())
    });
    let result = run_phase(&t, &plan, Arc::new(AtomicUsize::new(0))).await;
    stop.store(1, Ordering::Relaxed);
    let peak = sampler.await.unwrap_or(0);
    let (active, fds, tcp_mid) = probe.await.unwrap_or((-1.0, 0, 0));
    env.check_alive()?;
    report_failures(&result, &t, &plan, rep, ok);
    let _ = result.keepalives;
    let page_kib = 4.0;
    Ok(IdleRow {
        per: peak.saturating_sub(base) as f64 / streams as f64,
        tcp_kib: tcp_mid.saturating_sub(tcp0) as f64 * page_kib / streams as f64,
        result,
        base,
        peak,
        active,
        fds,
    })
}

async fn idle(opts: &Opts, env: &mut Env, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let streams = opts.idle_streams.unwrap_or(if opts.quick { 1000 } else { 10_000 });
    let hold = Duration::from_secs_f64(opts.hold_secs.unwrap_or(if opts.quick { 3.0 } else { 60.0 }));
    rep.line(format!(
        "## idle: {} concurrent idle translated streams held {:.0} s\n",
        n(streams as f64),
        hold.as_secs_f64()
    ));
    rep.line(
        "Each stream gets `meta_init`, an open text block and one delta, then nothing until the hold ends \
         (the gateway sends its `: keepalive` comments), then the block closes and `[DONE]`; every stream must \
         end complete. Fresh gateway process per row; RSS baseline after 10 warm-up streams; peak RSS sampled \
         every 250 ms (the nginx row: its worker's RSS). Rows: translated (the target), pass-through (same \
         proxy without the translator), translated over HTTP/1.1, nginx over h2c and over HTTP/1.1; `gateway` has resumption on (the \
         default: each stream's events held, with ids), `gateway-resume-off` is the same binary with \
         `SSE_GATEWAY__RESUME__ENABLED=false`, in the same legs. `--rounds N` repeats the rows N times \
         (interleaved). The open-files limit here is 20,000 per process (hard, no CAP_SYS_RESOURCE), and an HTTP/1.1 \
         stream costs the gateway two descriptors (client + upstream), so 10,000 streams arrive as h2c \
         (100 streams per connection, 100 connections); the HTTP/1.1 run is capped at 9,000 streams.\n",
    );
    // (target index, client leg, streams): translated h2c is the target's figure; pass-through isolates the
    // translator's share; HTTP/1.1 adds a downstream connection per stream; nginx is the reference on both legs.
    let h1 = if opts.quick { 500 } else { streams.min(9000) };
    let rounds = opts.rounds.unwrap_or(1);
    let one = [
        (GW, Proto::H2(100), streams),
        (GW_OFF, Proto::H2(100), streams),
        (3, Proto::H2(100), streams),
        (GW, Proto::H1, h1),
        (GW_OFF, Proto::H1, h1),
        (1, Proto::H2(100), streams),
        (1, Proto::H1, h1),
    ];
    let mut runs = Vec::new();
    for round in 0..rounds {
        // Odd rounds in reverse, so drift does not favour one row.
        let mut r = one.to_vec();
        if round % 2 == 1 {
            r.reverse();
        }
        runs.extend(r);
    }
    // Per stream (KiB) by (target, client leg): resumption's cost is on − off.
    let mut per_stream: Vec<((usize, &'static str), Vec<f64>)> = Vec::new();
    rep.line("| target | client leg | streams | held | completed | RSS before → peak (MiB) | per stream (KiB) | gateway active_streams at mid-hold | fds at mid-hold | kernel TCP mem growth (KiB/stream, all 4 sockets) |");
    rep.line("|---|---|---|---|---|---|---|---|---|---|");
    let mut worst_per = 0.0f64;
    let mut all_done = true;
    for (ti, proto, streams) in runs {
        let spec = IdleSpec {
            ti,
            proto,
            streams,
            hold,
            warm: Duration::from_secs(1),
        };
        let row = idle_row(opts, env, &spec, rep, ok).await?;
        all_done &= row.result.failures.is_empty();
        if ti == GW {
            worst_per = worst_per.max(row.per);
        }
        let key = (ti, proto.label());
        match per_stream.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(row.per),
            None => per_stream.push((key, vec![row.per])),
        }
        rep.line(format!(
            "| {} | {} | {} | {:.0} s | {} | {:.1} → {:.1} | {:.1} | {} | {} | {:.1} |",
            env.targets()[ti].name,
            proto.label(),
            n(streams as f64),
            hold.as_secs_f64(),
            n(row.result.streams_ok as f64),
            row.base as f64 / 1024.0,
            row.peak as f64 / 1024.0,
            row.per,
            row.active,
            row.fds,
            row.tcp_kib
        ));
    }
    rep.line(format!(
        "\n- none dropped: {}; gateway memory per stream ≤ 16 KiB: worst {worst_per:.1} KiB → {}",
        if all_done { "MET" } else { "MISSED" },
        verdict(worst_per <= 16.0)
    ));
    for leg in ["h2c", "h1"] {
        let of = |ti: usize| {
            per_stream
                .iter()
                .find(|(k, _)| *k == (ti, leg))
                .map(|(_, v)| median(v.clone()))
        };
        if let (Some(on), Some(off)) = (of(GW), of(GW_OFF)) {
            let d = on - off;
            rep.line(format!(
                "- resume on − resume off, {leg}: {on:.1} − {off:.1} = {d:+.1} KiB per idle stream{}; target ≤ +4 KiB \
                 (issue 15): {}",
                if rounds > 1 { " (medians over rounds)" } else { "" },
                verdict(d <= 4.0)
            ));
        }
    }
    let gib = |kib: f64| kib * 1e6 / 1024.0 / 1024.0;
    let need = gib(worst_per);
    let fit = if need < 30.0 {
        format!("fits that box's RAM with about {:.0} GiB to spare", 30.0 - need)
    } else {
        format!("does not fit that box's 32 GB: {need:.1} GiB for the gateway alone")
    };
    rep.line(format!(
        "- paper projection for 1,000,000 streams: {worst_per:.1} KiB × 10^6 ≈ {need:.1} GiB of gateway RSS \
         (user space only), which {fit}. Pushpin's published figure is 1M concurrent connections on one 8-core / \
         32 GB server (≈ 32 KiB per connection all in). On top come kernel socket memory for 2 × 10^6 TCP \
         sockets (idle sockets with empty queues cost little; a few KiB each once buffers fill), 2 × 10^6 \
         descriptors (this machine allows 20,000 per process; the default fs.nr_open is 1,048,576, so a raised \
         nr_open or several processes), and 10^6 upstream connections (the gateway speaks HTTP/1.1 upstream, one \
         connection per stream: about 28k ephemeral ports per upstream address, so many upstream addresses).\n"
    ));
    Ok(())
}

/// `cost`'s rows: (target index, label) — nginx, then the gateway passing through and translating.
const COST_ROWS: [(usize, &str); 4] = [
    (1, "nginx (translates nothing)"),
    (GW_PASS, "gateway, pass-through (`gateway-pass`)"),
    (GW, "gateway, translating (`gateway`, resumption on: the default)"),
    (GW_OFF, "gateway, translating, resumption off (`gateway-resume-off`)"),
];

/// Issue 16's table in one run: CPU per event of every proxy process at a paced load (50 streams × 400 ev/s
/// over HTTP/1.1) and memory per idle open stream over HTTP/1.1 and h2c (a fresh process per measurement),
/// nginx and the gateway side by side, with the ratios to nginx and the verdicts against the targets.
async fn cost(opts: &Opts, env: &mut Env, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 }).max(1);
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.5 } else { 5.0 }));
    let streams = opts.idle_streams.unwrap_or(if opts.quick { 500 } else { 1000 });
    let hold = Duration::from_secs_f64(opts.hold_secs.unwrap_or(if opts.quick { 0.5 } else { 5.0 }));
    let (paced, per_stream_rate) = (50, 400.0);
    rep.line("## cost: CPU per event and memory per idle stream, against nginx (issue 16)\n");
    let targets = env.targets();
    let mut rows = COST_ROWS.to_vec();
    if env.baseline.is_some() {
        rows.push((
            BASELINE,
            "gateway, translating, `--baseline` binary (`gateway-baseline`; CPU only)",
        ));
    }
    let plan = rated_plan(paced, paced as f64 * per_stream_rate, window, Proto::H1);
    rep.line(format!(
        "CPU: {paced} streams over HTTP/1.1, each paced at {per_stream_rate:.0} events/s ({} events/s in all) by the \
         legacy upstream, which writes each event as its own chunk (like uvicorn); per event = user + system CPU \
         of every process of the proxy (nginx: master and worker; the gateway: its one process) over the whole \
         phase (ramp, {:.1} s warm-up, {:.1} s window) / events delivered; /proc ticks of 10 ms. Memory: \
         {} idle streams per row, held {:.1} s, HTTP/1.1 clients sending `Accept: text/event-stream` and h2c \
         clients (100 streams per connection); a fresh process per row (the gateway warmed by 10 short streams), \
         per stream = (peak RSS − RSS before) / streams (nginx: its workers, summed). nginx: `proxy_pass` with \
         `proxy_buffering off` and upstream keepalive. {rounds} interleaved round(s) (A B … B A); the table gives \
         the median over rounds, and the ratio is the median over rounds of (row / nginx in the same round). \
         Saturation throughput (issue 16: not lower than before) is `throughput`'s figure.\n",
        n(paced as f64 * per_stream_rate),
        plan.warm.as_secs_f64(),
        window.as_secs_f64(),
        n(streams as f64),
        hold.as_secs_f64()
    ));
    // Per row: CPU µs per event, events/s delivered in the window, by round.
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    // Of which system (kernel) time: the part that the proxy's own code does not execute.
    let mut system: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    // Minor page faults per 1,000 events: new memory touched (held events fill their buffers).
    let mut faults: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut rate: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut failed = vec![0usize; rows.len()];
    for round in 0..rounds {
        for k in order(round, rows.len()) {
            let ti = rows[k].0;
            let (r, spent) = phase(env, &targets[ti], &plan, rep, ok).await?;
            // `Env::pids`'s groups: upstream, nginx, the gateway behind the target, client.
            let col = if ti == 1 { 1 } else { 2 };
            let per_event = 1e6 / r.events.max(1) as f64;
            cpu[k].push(spent.cpu[col] * per_event);
            system[k].push(spent.system[col] * per_event);
            faults[k].push(spent.faults[col] as f64 * 1e3 / r.events.max(1) as f64);
            rate[k].push(r.rate());
            failed[k] += r.failed();
        }
    }
    // Per (row, protocol): KiB per idle stream by round.
    let legs = [Proto::H1, Proto::H2(100)];
    let mut mem: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); legs.len()]; rows.len()];
    let mut one = Vec::new();
    for (l, _) in legs.iter().enumerate() {
        // Not the `--baseline` row: its CPU is what it is there for.
        for k in 0..COST_ROWS.len() {
            one.push((k, l));
        }
    }
    for round in 0..rounds {
        let mut runs = one.clone();
        if round % 2 == 1 {
            runs.reverse();
        }
        for (k, l) in runs {
            let spec = IdleSpec {
                ti: rows[k].0,
                proto: legs[l],
                streams,
                hold,
                warm: Duration::from_secs_f64(if opts.quick { 0.3 } else { 1.0 }),
            };
            let row = idle_row(opts, env, &spec, rep, ok).await?;
            mem[k][l].push(row.per);
            failed[k] += row.result.failed();
        }
    }
    // User time by row and round: the part the proxy's own code executes.
    let user: Vec<Vec<f64>> = cpu
        .iter()
        .zip(&system)
        .map(|(c, s)| c.iter().zip(s).map(|(c, s)| c - s).collect())
        .collect();
    // The median over rounds of (row / nginx in the same round).
    let ratio = |v: &[f64], ng: &[f64]| median(v.iter().zip(ng).map(|(a, b)| a / b.max(f64::MIN_POSITIVE)).collect());
    let list = |v: &[f64], digits: usize| v.iter().map(|x| format!("{x:.digits$}")).collect::<Vec<_>>().join(", ");
    rep.line(
        "| | CPU per event, µs (all proxy processes, user+system) | of which user / system, µs | memory per idle \
         stream, HTTP/1.1 (KiB) | memory per idle stream, h2c (KiB) |",
    );
    rep.line("|---|---|---|---|---|");
    for (k, (_, label)) in rows.iter().enumerate() {
        let cell = |v: &[f64], ng: &[f64]| {
            if v.is_empty() {
                "—".to_owned()
            } else if k == 0 {
                format!("{:.1}", median(v.to_vec()))
            } else {
                format!("{:.1} ({:.2}×)", median(v.to_vec()), ratio(v, ng))
            }
        };
        rep.line(format!(
            "| {label} | {} | {:.1} / {:.1} | {} | {} |",
            cell(&cpu[k], &cpu[0]),
            median(user[k].clone()),
            median(system[k].clone()),
            cell(&mem[k][0], &mem[0][0]),
            cell(&mem[k][1], &mem[0][1])
        ));
    }
    rep.line("\nBy round:\n");
    rep.line(format!(
        "| target | CPU µs/event | of which system | page faults per 1,000 events | events/s delivered (offered {}) | \
         KiB/stream h1 | KiB/stream h2c | failed streams |",
        n(paced as f64 * per_stream_rate)
    ));
    rep.line("|---|---|---|---|---|---|---|---|");
    for (k, (ti, _)) in rows.iter().enumerate() {
        rep.line(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            targets[*ti].name,
            list(&cpu[k], 1),
            list(&system[k], 1),
            list(&faults[k], 0),
            rate[k].iter().map(|r| n(*r)).collect::<Vec<_>>().join(", "),
            list(&mem[k][0], 1),
            list(&mem[k][1], 1),
            failed[k]
        ));
    }
    // Rows by target (all of `COST_ROWS` are there).
    let row = |target: usize| rows.iter().position(|(ti, _)| *ti == target).unwrap_or(0);
    let gw = row(GW);
    rep.line("");
    for (l, leg) in ["HTTP/1.1", "h2c"].iter().enumerate() {
        let r = ratio(&mem[gw][l], &mem[0][l]);
        rep.line(format!(
            "- memory per idle stream, gateway translating / nginx, {leg}: {:.1} / {:.1} KiB = {r:.2}× \
             (target ≤ 1.0×: {})",
            median(mem[gw][l].clone()),
            median(mem[0][l].clone()),
            verdict(r <= 1.0)
        ));
    }
    let r = ratio(&cpu[gw], &cpu[0]);
    rep.line(format!(
        "- CPU per event, gateway translating / nginx, {paced} streams × {per_stream_rate:.0} ev/s: {:.1} / {:.1} µs = \
         {r:.2}× (target ≤ 1.1×: {}; wall-clock CPU on a shared machine: `instructions` gives the steady figure)",
        median(cpu[gw].clone()),
        median(cpu[0].clone()),
        verdict(r <= 1.1)
    ));
    // Where the translating gateway's excess over nginx goes, step by step, each the median over rounds of the
    // difference in the same round: the 1.1× target leaves a tenth of nginx's figure for all three steps.
    let diff = |v: &[Vec<f64>], hi: usize, lo: usize| median(v[hi].iter().zip(&v[lo]).map(|(a, b)| a - b).collect());
    let part = |hi: usize, lo: usize| format!("{:+.1} µs (user {:+.1})", diff(&cpu, hi, lo), diff(&user, hi, lo));
    let (pass, off) = (row(GW_PASS), row(GW_OFF));
    rep.line(format!(
        "- the translating gateway's excess over nginx, by step (µs per event, median of same-round differences): \
         proxying (pass-through − nginx) {}, translating (resume off − pass-through) {}, resumption (translating − \
         resume off) {}; the 1.1× target leaves {:.1} µs for all three",
        part(pass, 0),
        part(off, pass),
        part(gw, off),
        0.1 * median(cpu[0].clone())
    ));
    rep.line(format!("- none dropped: {}\n", verdict(failed.iter().all(|f| *f == 0))));
    Ok(())
}

/// The formats `frontend` asks the default gateway for, as `X-Stream-Format` (`json` first: the others' ratios are
/// to it), with their targets' names.
const FRONTEND_FORMATS: [(&str, &str); 3] = [
    ("json", "gateway-json"),
    ("ai-sdk", "gateway-ai-sdk"),
    ("ag-ui", "gateway-ag-ui"),
];

/// Issue 35's cost: the same paced upstream streams (50 × 400 ev/s over HTTP/1.1, as `cost`) through the one default
/// gateway (resumption on), the client asking `X-Stream-Format: json` (the envelope stream), `ai-sdk` and `ag-ui`,
/// rounds interleaved; the gateway's CPU per event of each and the ratios to `json`; then, where valgrind is
/// installed, the instructions per event of each under callgrind (`instructions::frontend`), the steady figure.
async fn frontend(opts: &Opts, env: &mut Env, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 }).max(1);
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.5 } else { 5.0 }));
    let (paced, per_stream_rate) = (50, 400.0);
    let plan = rated_plan(paced, paced as f64 * per_stream_rate, window, Proto::H1);
    let gw = procs::addr(env.gateway.1);
    let targets: Vec<Target> = FRONTEND_FORMATS
        .iter()
        .map(|&(format, name)| Target {
            name,
            addr: gw,
            h2_addr: gw,
            format: Some(format),
            translated: true,
        })
        .collect();
    rep.line("## frontend: CPU per event of the envelope stream encoded for a frontend (issue 35)\n");
    rep.line(format!(
        "{paced} streams over HTTP/1.1, each paced at {per_stream_rate:.0} events/s ({} events/s in all) by the legacy \
         upstream, through the one gateway with its defaults (resumption on), the client sending \
         `X-Stream-Format: json | ai-sdk | ag-ui` (response-only encoding: the same upstream request, the held \
         envelopes encoded per read). Per event = the gateway's user + system CPU over the whole phase (ramp, \
         {:.1} s warm-up, {:.1} s window) / stamped text deltas delivered; /proc ticks of 10 ms. {rounds} \
         interleaved round(s) (A B C, C B A, …); the ratio is the median over rounds of (row / json in the same \
         round). Issue 35's bound: encoding adds at most 10 % CPU per event.\n",
        n(paced as f64 * per_stream_rate),
        plan.warm.as_secs_f64(),
        window.as_secs_f64(),
    ));
    let k = targets.len();
    let (mut cpu, mut user, mut bytes, mut rate) = (
        vec![Vec::new(); k],
        vec![Vec::new(); k],
        vec![Vec::new(); k],
        vec![Vec::new(); k],
    );
    let mut failed = vec![0usize; k];
    for round in 0..rounds {
        for i in order(round, k) {
            let (r, spent) = phase(env, &targets[i], &plan, rep, ok).await?;
            // `Env::pids`'s groups: upstream, nginx, the gateway, client.
            let per_event = 1e6 / r.events.max(1) as f64;
            cpu[i].push(spent.cpu[2] * per_event);
            user[i].push((spent.cpu[2] - spent.system[2]) * per_event);
            bytes[i].push(r.bytes as f64 / r.events.max(1) as f64);
            rate[i].push(r.rate());
            failed[i] += r.failed();
        }
    }
    rep.line("| X-Stream-Format | gateway CPU per event, µs (median) | / json | user, µs | by round | bytes to the client per event | events/s delivered | failed streams |");
    rep.line("|---|---|---|---|---|---|---|---|");
    for (i, (format, _)) in FRONTEND_FORMATS.iter().enumerate() {
        rep.line(format!(
            "| {format} | **{:.2}** | {} | {:.2} | {} | {:.0} | {} | {} |",
            median(cpu[i].clone()),
            ratio_cell(i, &cpu[i], &cpu[0]),
            median(user[i].clone()),
            by_round(&cpu[i], 2),
            median(bytes[i].clone()),
            rate[i].iter().map(|r| n(*r)).collect::<Vec<_>>().join(", "),
            failed[i]
        ));
    }
    rep.line("");
    for i in 1..k {
        let r = round_ratio(&cpu[i], &cpu[0]);
        let diff = median(cpu[i].iter().zip(&cpu[0]).map(|(a, b)| a - b).collect());
        rep.line(format!(
            "- {} / json, gateway CPU per event: {:.2} / {:.2} µs = {r:.3}× ({diff:+.2} µs, median of same-round \
             differences; target ≤ 1.10×: {}; wall-clock CPU on a shared machine, 10 ms ticks)",
            FRONTEND_FORMATS[i].0,
            median(cpu[i].clone()),
            median(cpu[0].clone()),
            verdict(r <= 1.10)
        ));
    }
    rep.line(format!("- none dropped: {}\n", verdict(failed.iter().all(|f| *f == 0))));
    crate::instructions::frontend(opts, &env.up, rep, ok).await
}

/// `otel`: CPU per event with traces exported against the same build with traces off (issue 36's bound: at most
/// 5 % more). The collector is a sink in this driver answering every export 200 (its CPU is the client's).
async fn otel(opts: &Opts, env: &mut Env, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 }).max(1);
    let window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.5 } else { 5.0 }));
    let (paced, per_stream_rate) = (50, 400.0);
    let plan = rated_plan(paced, paced as f64 * per_stream_rate, window, Proto::H1);
    let sink = crate::otel_sink::Sink::start().await?;
    let traced_env = vec![
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            format!("http://{}", sink.addr),
        ),
        ("OTEL_SERVICE_NAME".to_owned(), "sse-gateway-load".to_owned()),
    ];
    let dir = procs::scratch("gateway-traced");
    env.traced = Some(procs::spawn_gateway(
        &opts.gateway,
        &place(opts, &dir, env.up[2], &traced_env),
    )?);
    let target = |name: &'static str, port: u16| Target {
        name,
        addr: procs::addr(port),
        h2_addr: procs::addr(port),
        format: None,
        translated: true,
    };
    let traced_port = env.traced.as_ref().map_or(env.gateway.1, |t| t.1);
    let targets = [target(NAMES[GW], env.gateway.1), target(NAMES[TRACED], traced_port)];
    rep.line("## otel: CPU per event with OpenTelemetry traces exported (issue 36)\n");
    rep.line(format!(
        "{paced} streams over HTTP/1.1, each paced at {per_stream_rate:.0} events/s ({} events/s in all), each stream \
         one run (a SERVER span and an `invoke_agent` span), through two gateways of this build with their defaults \
         (resumption on): traces off, and traces exported (OTLP/HTTP protobuf, default batching) to a sink in this \
         driver. Per event = the gateway's user + system CPU over the whole phase / text deltas delivered; /proc \
         ticks of 10 ms. {rounds} interleaved round(s); the ratio is the median over rounds of (traced / off in the \
         same round). Issue 36's bound: at most 1.05×.\n",
        n(paced as f64 * per_stream_rate),
    ));
    let (mut cpu, mut failed) = (vec![Vec::new(); 2], [0usize; 2]);
    for round in 0..rounds {
        for i in order(round, 2) {
            let (r, spent) = phase(env, &targets[i], &plan, rep, ok).await?;
            cpu[i].push(spent.cpu[2] * 1e6 / r.events.max(1) as f64);
            failed[i] += r.failed();
        }
    }
    let ratio = median(
        cpu[1]
            .iter()
            .zip(&cpu[0])
            .map(|(a, b)| a / b.max(f64::MIN_POSITIVE))
            .collect(),
    );
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(", ");
    rep.line("| traces | gateway CPU per event, µs (median) | / off | by round | failed streams |");
    rep.line("|---|---|---|---|---|");
    rep.line(format!(
        "| off | **{:.2}** | 1.00 | {} | {} |",
        median(cpu[0].clone()),
        list(&cpu[0]),
        failed[0]
    ));
    rep.line(format!(
        "| exported | **{:.2}** | **{ratio:.3}×** | {} | {} |",
        median(cpu[1].clone()),
        list(&cpu[1]),
        failed[1]
    ));
    let (exports, spans) = sink.counts();
    rep.line(format!(
        "\n- the sink received {exports} exports, {spans} spans; dropped by the gateway: {}",
        env.traced
            .as_ref()
            .and_then(|t| procs::http_get(t.2, "/metrics").ok())
            .and_then(|page| procs::metric(&page, "sse_gateway_otel_spans_dropped_total", ""))
            .unwrap_or(0.0)
    ));
    rep.line(format!(
        "- traced / off, gateway CPU per event: {ratio:.3}× (target ≤ 1.05×: {}; wall-clock CPU on a shared \
         machine, 10 ms ticks)\n",
        verdict(ratio <= 1.05)
    ));
    env.traced = None;
    crate::instructions::otel(opts, &env.up, &format!("http://{}", sink.addr), rep, ok).await
}

/// The gateway's own per-frame translation time (upstream frame in → translated frame out), from its
/// `sse_gateway_event_translation_seconds` histogram: what the translator costs, without the scheduling.
fn translation_histogram(admin: u16) -> String {
    let Ok(page) = procs::http_get(admin, "/metrics") else {
        return "metrics unavailable".into();
    };
    let total = procs::metric(&page, "sse_gateway_event_translation_seconds_count", "").unwrap_or(0.0);
    let mut parts = Vec::new();
    for l in page
        .lines()
        .filter(|l| l.starts_with("sse_gateway_event_translation_seconds_bucket"))
    {
        let le = l.split("le=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("");
        let (Ok(secs), Some(c)) = (
            le.parse::<f64>(),
            l.rsplit(' ').next().and_then(|c| c.parse::<f64>().ok()),
        ) else {
            continue;
        };
        if secs <= 0.003 {
            parts.push(format!("≤ {:.0} µs: {:.2} %", secs * 1e6, 100.0 * c / total.max(1.0)));
        }
    }
    format!("{} frames; {}", n(total), parts.join(", "))
}

/// After a phase with thousands of connections, a pause so their closes (FIN, TIME_WAIT) are done before the
/// next phase opens as many again.
async fn settle(streams: usize) {
    if streams >= 1000 {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The first three fields of /proc/loadavg (other work on the machine shows here).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Kernel TCP memory in pages (the `mem` field of /proc/net/sockstat).
fn tcp_mem_pages() -> u64 {
    std::fs::read_to_string("/proc/net/sockstat")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("TCP:"))?;
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|w| *w == "mem")?;
            f.get(i + 1)?.parse().ok()
        })
        .unwrap_or(0)
}

async fn scaling(opts: &Opts, env: &mut Env, rep: &mut Report, ok: &mut bool) -> Result<(), String> {
    let default: &[usize] = if opts.quick {
        &[1, 10, 100]
    } else {
        &[1, 10, 100, 1000, 10_000]
    };
    let counts = opts.counts.as_deref().unwrap_or(default);
    let lat_window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.0 } else { 4.0 }));
    let thr_window = Duration::from_secs_f64(opts.secs.unwrap_or(if opts.quick { 1.0 } else { 3.0 }));
    rep.line("## scaling: latency and throughput against concurrent streams\n");
    rep.line(format!(
        "Latency at an offered 100 ev/s per stream, at most 10,000 ev/s in all ({:.0} s window); throughput \
         at saturation ({:.0} s window). One interleaved round per count. 10,000 streams use h2c on the client \
         leg (100 streams per connection) because of the 20,000 open-files limit; the other counts HTTP/1.1.\n",
        lat_window.as_secs_f64(),
        thr_window.as_secs_f64()
    ));
    // Not `gateway-resume-off`: `latency`, `throughput`, `idle` and `instructions` compare resumption on and off.
    let mut targets = env.targets();
    targets.truncate(4);
    rep.line("| streams | client leg | offered ev/s | target | p50 µs | p99 µs | max µs | TTFB p99 ms | events/s at saturation | failed |");
    rep.line("|---|---|---|---|---|---|---|---|---|---|");
    let mut dat =
        String::from("# streams then per target (direct nginx gateway gateway-pass): p50_us p99_us events_per_s\n");
    for (k, &count) in counts.iter().enumerate() {
        let proto = if count > 1000 { Proto::H2(100) } else { Proto::H1 };
        let rate = (count as f64 * 100.0).min(10_000.0);
        let lat = rated_plan(count, rate, lat_window, proto);
        let sat = saturation_plan(count, thr_window, proto);
        let mut res: Vec<Option<(PhaseResult, PhaseResult)>> = (0..targets.len()).map(|_| None).collect();
        for i in order(k, targets.len()) {
            let (a, _) = phase(env, &targets[i], &lat, rep, ok).await?;
            settle(count).await;
            let (b, _) = phase(env, &targets[i], &sat, rep, ok).await?;
            settle(count).await;
            res[i] = Some((a, b));
        }
        dat.push_str(&count.to_string());
        for (t, r) in targets.iter().zip(&res) {
            let Some((a, b)) = r else { continue };
            rep.line(format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                n(count as f64),
                proto.label(),
                n(rate),
                t.name,
                us(q(&a.latency, 0.5)),
                us(q(&a.latency, 0.99)),
                us(a.latency.max() as f64),
                ms(q(&a.ttfb, 0.99)),
                n(b.rate()),
                a.failed() + b.failed()
            ));
            // No events in the window: a gap in the plot (NaN), not a point at 1.
            let rate = if b.rate() > 0.0 {
                format!("{:.0}", b.rate())
            } else {
                "NaN".into()
            };
            dat.push_str(&format!(
                " {:.1} {:.1} {rate}",
                q(&a.latency, 0.5) / 1000.0,
                q(&a.latency, 0.99) / 1000.0
            ));
        }
        dat.push('\n');
    }
    let dat_path = opts.plot.with_extension("dat");
    if let Some(dir) = opts.plot.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&dat_path, &dat).map_err(|e| format!("{}: {e}", dat_path.display()))?;
    let title = format!(
        "sse-gateway load harness: scaling ({} cores shared by client, upstream and proxy)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    match crate::report::plot(&dat_path, &opts.plot, &NAMES[..4], &title) {
        Ok(()) => rep.line(format!(
            "\nPlot: `{}` (data `{}`).\n",
            opts.plot.display(),
            dat_path.display()
        )),
        Err(e) => rep.line(format!("\nPlot not drawn: {e} (data in `{}`).\n", dat_path.display())),
    }
    let _ = Instant::now();
    Ok(())
}
