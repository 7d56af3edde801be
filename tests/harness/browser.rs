//! Headless Chromium (Debian's `chromium`) for the real-browser tests: found on the machine, started on one page
//! with a fresh profile and nothing but loopback, killed with its whole process group on drop. Also the rule the
//! external-client tests share: a missing client skips the test with a note, except under `CI=true`, where it
//! fails.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether this is a CI run (`CI=true` or `CI=1`), where a missing external client is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// `true` when `what` is available; otherwise fails under CI, or prints why the test is skipped and returns `false`.
pub fn available_or_skip(what: &str, available: bool, hint: &str) -> bool {
    if !available {
        assert!(!in_ci(), "{what} is not installed ({hint})");
        eprintln!("skipping: {what} is not installed ({hint})");
    }
    available
}

/// The Chromium binary: `$CHROMIUM` if set, else Debian's `/usr/bin/chromium` (or `chromium-browser`).
pub fn chromium_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Chromium, or `None` when the test is to be skipped (never under CI).
pub fn chromium_or_skip() -> Option<PathBuf> {
    let path = chromium_path();
    available_or_skip(
        "chromium",
        path.is_some(),
        "the Debian package `chromium`: run .ci/external-clients.sh",
    )
    .then_some(path?)
}

/// Whether npm package `name` is installed; otherwise fails under CI, or says why the test is skipped.
pub fn npm_package_or_skip(name: &str) -> bool {
    available_or_skip(
        name,
        npm_package_installed(name),
        "npm package: run .ci/external-clients.sh",
    )
}

/// Where the npm packages of the external-client tests are installed (by `.ci/external-clients.sh`).
pub const NODE_MODULES: &str = "tests/external/node/node_modules";

/// Whether the npm package `name` is installed under [`NODE_MODULES`].
pub fn npm_package_installed(name: &str) -> bool {
    Path::new(NODE_MODULES).join(name).join("package.json").exists()
}

/// A headless Chromium showing one page; killed (with every process it started) on drop.
pub struct Chromium {
    child: Child,
    profile: PathBuf,
    /// Chromium's stderr, with the page's console messages.
    pub log: PathBuf,
}

impl Chromium {
    /// Starts `chromium` (from [`chromium_path`]) headless on `url`, with a new empty profile, no proxy, and no
    /// background traffic (this machine's network is closed: only loopback is used).
    pub fn open(bin: &Path, url: &str) -> Chromium {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let base = std::env::temp_dir().join(format!("sse-gw-chromium-{}-{n}", std::process::id()));
        let profile = base.join("profile");
        std::fs::create_dir_all(&profile).expect("create chromium profile dir");
        let log = base.join("chromium.log");
        let stderr = std::fs::File::create(&log).expect("create chromium log");
        let mut cmd = Command::new(bin);
        cmd.args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--disable-background-timer-throttling",
            "--disable-renderer-backgrounding",
            "--disable-backgrounding-occluded-windows",
            "--no-proxy-server",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        // Its own process group, so that drop can end the browser and every process it started.
        .process_group(0);
        let child = cmd.spawn().expect("spawn chromium");
        Chromium {
            child,
            profile: base,
            log,
        }
    }

    /// The page's console messages and errors Chromium logged (its `CONSOLE` and `ERROR` lines), last `max`.
    pub fn console(&self, max: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.contains("CONSOLE")
                    || l.contains("Uncaught")
                    || (l.contains(":ERROR:") && !l.contains(":ERROR:dbus/"))
            })
            .collect();
        lines[lines.len().saturating_sub(max)..].join("\n")
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let pid = self.child.id();
        // The group's id is the browser's pid (`process_group(0)`).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
