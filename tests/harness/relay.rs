//! A TCP relay on 127.0.0.1 between a client (a browser) and the gateway that cuts the client's connection in the
//! middle of an event stream, as a network change or a load balancer restart would, while the gateway keeps running.
//!
//! The relay copies bytes both ways without parsing HTTP, except that it watches the responses for an event-stream
//! head (`content-type: text/event-stream`). On each connection where it sees one, it takes the next length from its
//! plan: after that many response bytes past the head's `Content-Type` line it stops forwarding, closes its side to
//! the gateway and resets the client's connection. Once the plan is used up it only relays. Pages, scripts and
//! other responses are never cut.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use super::upstream::find;

/// What marks an event-stream response head (matched on lower-cased bytes).
const SSE_HEAD: &[u8] = b"\r\ncontent-type: text/event-stream";

/// One cut the relay made.
#[derive(Debug, Clone)]
pub struct Cut {
    /// Response bytes forwarded past the head's `Content-Type` line before the cut.
    pub after: usize,
    pub at: Instant,
    /// The relay's connection number (from 0, in accept order).
    pub conn: usize,
}

#[derive(Default)]
struct State {
    plan: VecDeque<usize>,
    cuts: Vec<Cut>,
    connections: usize,
    streams: usize,
}

/// The relay; stops (and drops every relayed connection) when dropped.
pub struct CuttingRelay {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl CuttingRelay {
    /// Listens on an ephemeral loopback port and relays every connection to `target`, cutting event streams after
    /// `plan[0]`, `plan[1]`, … bytes (one length per event-stream response, in order).
    pub async fn start(target: SocketAddr, plan: &[usize]) -> CuttingRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let state = Arc::new(Mutex::new(State {
            plan: plan.iter().copied().collect(),
            ..State::default()
        }));
        let st = Arc::clone(&state);
        let task = tokio::spawn(async move {
            // Dropped with the accept loop, which aborts every connection's task.
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((client, _)) = accepted else {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        };
                        let n = {
                            let mut s = st.lock().expect("lock");
                            s.connections += 1;
                            s.connections - 1
                        };
                        conns.spawn(relay(client, target, n, Arc::clone(&st)));
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        CuttingRelay { addr, state, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The cuts made so far.
    pub fn cuts(&self) -> Vec<Cut> {
        self.state.lock().expect("lock").cuts.clone()
    }

    /// Lengths of the plan not used yet.
    pub fn unused(&self) -> Vec<usize> {
        self.state.lock().expect("lock").plan.iter().copied().collect()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.lock().expect("lock").connections
    }

    /// Event-stream responses seen so far.
    pub fn streams(&self) -> usize {
        self.state.lock().expect("lock").streams
    }
}

impl Drop for CuttingRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where a connection's response direction is.
enum Down {
    /// Looking for an event-stream head; the last bytes seen, lower-cased.
    Sniffing(Vec<u8>),
    /// In an event stream to be cut after this many more bytes.
    Counting { left: usize, planned: usize },
    /// Relaying only.
    Passing,
}

async fn relay(mut client: TcpStream, target: SocketAddr, conn: usize, state: Arc<Mutex<State>>) {
    let Ok(mut server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cbuf, mut sbuf) = (vec![0u8; 16 << 10], vec![0u8; 16 << 10]);
    let mut client_open = true;
    let mut down = Down::Sniffing(Vec::new());
    loop {
        tokio::select! {
            r = client.read(&mut cbuf), if client_open => match r {
                Ok(0) | Err(_) => {
                    client_open = false;
                    let _ = server.shutdown().await;
                }
                Ok(n) => {
                    if server.write_all(&cbuf[..n]).await.is_err() {
                        return;
                    }
                }
            },
            r = server.read(&mut sbuf) => {
                let n = match r {
                    Ok(0) | Err(_) => {
                        let _ = client.shutdown().await;
                        return;
                    }
                    Ok(n) => n,
                };
                let (forward, cut) = plan_chunk(&mut down, &sbuf[..n], &state);
                if client.write_all(&sbuf[..forward]).await.is_err() {
                    return;
                }
                if let Some(after) = cut {
                    state.lock().expect("lock").cuts.push(Cut { after, at: Instant::now(), conn });
                    // Let the client read what it was sent, then reset its connection; the gateway sees its
                    // client go away (FIN) when `server` drops.
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    let _ = client.set_zero_linger();
                    return;
                }
            }
        }
    }
}

/// How many bytes of `data` to forward, and whether to cut after them (with the planned length).
fn plan_chunk(down: &mut Down, data: &[u8], state: &Mutex<State>) -> (usize, Option<usize>) {
    let n = data.len();
    match down {
        Down::Passing => (n, None),
        Down::Counting { left, planned } => {
            if n >= *left {
                (*left, Some(*planned))
            } else {
                *left -= n;
                (n, None)
            }
        }
        Down::Sniffing(window) => {
            let start = window.len();
            window.extend(data.iter().map(u8::to_ascii_lowercase));
            let Some(p) = find(window, SSE_HEAD) else {
                let keep = window.len().saturating_sub(SSE_HEAD.len());
                window.drain(..keep);
                return (n, None);
            };
            // Where the marker ends in `data` (it was not complete before this read, so it ends in it).
            let end = (p + SSE_HEAD.len()).saturating_sub(start);
            let next = {
                let mut s = state.lock().expect("lock");
                s.streams += 1;
                s.plan.pop_front()
            };
            let Some(planned) = next else {
                *down = Down::Passing;
                return (n, None);
            };
            if n - end >= planned {
                return (end + planned, Some(planned));
            }
            *down = Down::Counting {
                left: planned - (n - end),
                planned,
            };
            (n, None)
        }
    }
}
