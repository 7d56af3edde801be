//! node for the external-client tests: whether it is installed with the npm packages a test needs, and a script run
//! with its pipes read while it runs (its output can be larger than a pipe holds) and killed if it outlives a bound.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::browser::{available_or_skip, npm_package_installed};

/// node with every one of `packages` under [`super::browser::NODE_MODULES`], or a skip (a failure under CI); `what`
/// names them in the note.
pub fn node_with_or_skip(what: &str, packages: &[&str]) -> bool {
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let installed = packages.iter().all(|p| npm_package_installed(p));
    available_or_skip(what, node && installed, "run .ci/external-clients.sh")
}

/// What a node script printed, and how it ended: `status` is `None` when it outlived its bound and was killed.
pub struct Output {
    pub stdout: String,
    pub stderr: String,
    pub status: Option<ExitStatus>,
}

/// Runs `cmd` (a `node` command line) with no stdin, reading its stdout and stderr while it runs; kills it if it is
/// still running after `wait`.
pub fn run(mut cmd: Command, wait: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn node");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().expect("stdout")));
    let err = pipe(Box::new(child.stderr.take().expect("stderr")));
    let deadline = Instant::now() + wait;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        stdout: out.join().expect("stdout"),
        stderr: err.join().expect("stderr"),
        status,
    }
}
