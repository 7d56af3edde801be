//! Level 3, the real process: the `sse-gateway` binary as a subprocess on ephemeral loopback ports (optionally
//! under `ulimit`), its start-up handshake, its /metrics, file descriptors and memory.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::http_get;
use super::metrics::metric;
use super::PATIENCE;

/// The binary this test target was built with.
pub const BIN: &str = env!("CARGO_BIN_EXE_sse-gateway");

/// The binary, for one-shot runs (`--check-config`, `translate`), without an upstream URL from the environment.
pub fn bin() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("SSE_GATEWAY__UPSTREAM__URL");
    c
}

/// A gateway binary run as a subprocess; killed on drop.
pub struct Process {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub stdout_lines: Arc<Mutex<Vec<String>>>,
    /// Where its stderr (the logs) goes, for evidence when a test fails.
    pub log: PathBuf,
}

impl Process {
    /// Starts the binary with `args` (ports 0 unless given) and waits for its banner.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> Process {
        Self::spawn(Command::new(BIN), args, env)
    }

    /// Like [`Process::start`], with the open-file limit (`ulimit -n`) set to `limit` for the gateway only.
    pub fn start_with_fd_limit(limit: u32, args: &[&str], env: &[(&str, &str)]) -> Process {
        Self::start_with_ulimit(&format!("-n {limit}"), args, env)
    }

    /// Like [`Process::start`], under `ulimit LIMIT` (e.g. `-v 1048576`) for the gateway only: a shell lowers
    /// its own limit and then execs the binary, so the test process keeps its own.
    pub fn start_with_ulimit(limit: &str, args: &[&str], env: &[(&str, &str)]) -> Process {
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &format!("ulimit {limit} && exec \"$0\" \"$@\""), BIN]);
        Self::spawn(cmd, args, env)
    }

    /// Starts the binary against `upstream` with extra `SSE_GATEWAY__…` settings (and none from the
    /// environment), logging at `warn`.
    pub fn against(upstream: &str, env: &[(&str, &str)]) -> Process {
        Self::against_bin(BIN.as_ref(), upstream, env)
    }

    /// [`Process::against`], with the binary `bin`.
    pub fn against_bin(bin: &Path, upstream: &str, env: &[(&str, &str)]) -> Process {
        let mut cmd = Command::new(bin);
        for (k, _) in std::env::vars() {
            if k.starts_with("SSE_GATEWAY__") {
                cmd.env_remove(k);
            }
        }
        cmd.env("RUST_LOG", "warn");
        Self::spawn(cmd, &["--upstream", upstream], env)
    }

    /// Runs `cmd` (the binary, or a wrapper that execs it) with `args` and waits for the banner.
    fn spawn(mut cmd: Command, args: &[&str], env: &[(&str, &str)]) -> Process {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let log = std::env::temp_dir().join(format!("sse-gw-test-{}-{n}.log", std::process::id()));
        let stderr = std::fs::File::create(&log).expect("create gateway log");
        cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn sse-gateway");
        let stdout = child.stdout.take().expect("stdout");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                l2.lock().expect("lock").push(line);
            }
        });
        let (addr, admin) = addresses(&rx, PATIENCE);
        Process {
            child,
            addr,
            admin,
            stdout_lines: lines,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size in KiB (VmRSS).
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.pid())
    }

    /// Open file descriptors (entries of /proc/PID/fd).
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The admin /metrics text.
    pub async fn metrics(&self) -> String {
        let (status, body) = http_get(self.admin, "/metrics").await;
        assert_eq!(status, 200, "GET /metrics");
        String::from_utf8(body).expect("utf-8 metrics")
    }

    /// Sum of a metric's samples whose line contains every label fragment.
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric(&self.metrics().await, name, labels)
    }

    /// Polls until `sse_gateway_active_streams` is 0; returns the last value seen.
    pub async fn wait_no_active_streams(&self, within: Duration) -> f64 {
        let deadline = Instant::now() + within;
        loop {
            let v = self.metric("sse_gateway_active_streams", &[]).await;
            if v == 0.0 || Instant::now() > deadline {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls until the fd count is at most `limit`; returns the last count seen.
    pub async fn wait_fds_at_most(&self, limit: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let n = self.fds();
            if n <= limit || Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of the gateway's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// Waits for the exit status, at most `PATIENCE`.
    pub fn wait(&mut self) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The start-up handshake: the gateway prints its public and admin addresses on stdout once both listeners are
/// bound. Reads the child's stdout lines until both "proxy listening on" and "admin listening on" have appeared;
/// returns (public, admin). Panics if they do not within `patience`.
pub fn addresses(lines: &Receiver<String>, patience: Duration) -> (SocketAddr, SocketAddr) {
    let (mut addr, mut admin) = (None, None);
    let deadline = Instant::now() + patience;
    while addr.is_none() || admin.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left).expect("gateway printed its addresses");
        let parse = |l: &str| l.rsplit("http://").next().and_then(|a| a.parse::<SocketAddr>().ok());
        if line.contains("proxy listening on") {
            addr = parse(&line);
        } else if line.contains("admin listening on") {
            admin = parse(&line);
        }
    }
    (addr.expect("addr"), admin.expect("admin"))
}

pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Samples a process's RSS every `every` in a background thread; `stop()` returns the peak in KiB.
pub struct RssSampler {
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    pub fn start(pid: u32, every: Duration) -> RssSampler {
        let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (Arc::clone(&peak), Arc::clone(&stop));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(every);
            }
        });
        RssSampler {
            peak,
            stop,
            thread: Some(thread),
        }
    }

    pub fn peak_kib(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    pub fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak_kib()
    }
}

/// An upstream whose run sends one text item and then never ends, and a gateway before it whose drain deadline is
/// one second: a stream open on it is ended only by the drain.
pub async fn stuck_run_with_a_short_drain() -> (super::upstream::Emulator, Process) {
    use super::upstream::{Emulator, Step};
    let up = Emulator::sse(vec![
        Step::write_all(b"data: <content-block-text>still going</content-block-text>\n\n"),
        // Never ends: only the drain deadline stops it.
        Step::Hang,
    ])
    .await;
    let gw = Process::start(
        &["--upstream", &up.url()],
        &[("SSE_GATEWAY__SERVER__DRAIN_TIMEOUT_SECS", "1")],
    );
    (up, gw)
}
