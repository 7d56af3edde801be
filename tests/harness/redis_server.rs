//! A real `redis-server` (Debian's package) on a free loopback port, without persistence, killed on drop.
//! Missing: `start` returns `None` with a note, or fails the test under CI=true (CI installs it).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a starting server may take to answer PING.
const STARTUP: Duration = Duration::from_secs(10);

/// A `redis-server` child process.
pub struct RedisServer {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

impl RedisServer {
    /// Starts one, or `None` (skip, with a note) when `redis-server` is not installed and CI is unset.
    pub fn start() -> Option<Self> {
        let installed = Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !installed {
            assert!(
                !in_ci(),
                "redis-server is not installed (.ci/run installs it with apt-get)"
            );
            eprintln!("skipping: redis-server is not installed (apt-get install redis-server)");
            return None;
        }
        // The free port is found by binding and releasing it: another process may take it meanwhile, so try
        // a few.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let child = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .args(["--loglevel", "warning", "--daemonize", "no"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let mut server = RedisServer {
                child: Some(child),
                port,
            };
            if server.wait_ready() {
                return Some(server);
            }
            server.kill();
        }
        panic!("redis-server did not start");
    }

    /// Its URL for the `redis` crate.
    /// A connection to look at what the store holds.
    #[allow(dead_code)] // Not every test crate that includes this file by path looks into the store.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::open(self.url()).expect("redis url");
        let connect = client.get_multiplexed_async_connection();
        tokio::time::timeout(STARTUP, connect)
            .await
            .expect("a redis connection within the startup bound")
            .expect("redis connection")
    }

    /// Waits (at most `within`) until the store knows stream `token`: the owner's writes are asynchronous by
    /// design.
    #[allow(dead_code)]
    pub async fn wait_visible(&self, token: &str, within: Duration) {
        let mut conn = self.connection().await;
        let meta = format!("sse-gateway:{{{token}}}:meta");
        let deadline = Instant::now() + within;
        loop {
            let exists: bool = redis::cmd("EXISTS")
                .arg(&meta)
                .query_async(&mut conn)
                .await
                .expect("EXISTS");
            if exists {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "stream {token} not in Redis within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it at once (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops it (SIGSTOP): it keeps its connections and data but answers nothing until [`RedisServer::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let Some(child) = self.child.as_ref() else { return };
        let ok = Command::new("kill")
            .arg(sig)
            .arg(child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} redis-server");
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + STARTUP;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if child.try_wait().ok().flatten().is_some() {
                    return false;
                }
            }
            if ping(self.port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

/// Whether a server on `port` answers `PING` with `+PONG`.
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One Stream entry as `XRANGE` returns it: its id and its fields.
#[allow(dead_code)]
pub type RawEntry = (String, Vec<(String, Vec<u8>)>);

/// The events (seq, bytes) Redis holds for stream `token`, read as any reader would: an entry `0-<last>` holds
/// one event (field `e`) or several (fields `es`), the last of them `last`.
#[allow(dead_code)]
pub async fn stored_events(conn: &mut redis::aio::MultiplexedConnection, token: &str) -> Vec<(u64, Vec<u8>)> {
    let reply: Vec<RawEntry> = redis::cmd("XRANGE")
        .arg(format!("sse-gateway:{{{token}}}:events"))
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .expect("XRANGE");
    reply
        .into_iter()
        .flat_map(|(id, fields)| {
            let last: u64 = id
                .strip_prefix("0-")
                .and_then(|s| s.parse().ok())
                .expect("entry id 0-<seq>");
            let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
            assert!(
                names == ["e"] || (names.len() > 1 && names.iter().all(|k| *k == "es")),
                "entry {id}: fields {names:?}"
            );
            let first = last + 1 - fields.len() as u64;
            (first..).zip(fields.into_iter().map(|(_, v)| v)).collect::<Vec<_>>()
        })
        .collect()
}
