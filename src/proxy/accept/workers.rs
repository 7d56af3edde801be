//! The threads client connections are served on: `server.workers` of them, each a single-threaded runtime.
//!
//! A connection, its upstream connection, its timers and the tasks it spawns stay on the thread it was handed
//! to, as in nginx's worker processes: an event wakes that thread and no other. On tokio's multi-thread
//! scheduler the worker woken by a socket woke a parked sibling to share the work, for every batch of events,
//! and paced streams paid it in futex calls and context switches (~3 µs of system time per event on 2 cores).
//! Accepting stays on the main runtime; a connection goes to the worker with the fewest open connections (an
//! upgraded WebSocket counted as one to its close, `Open::here`). As with nginx, the streams of one HTTP/2
//! connection share its worker: a load balancer multiplexing every stream over a single h2c connection uses one
//! core (open a few connections, or use HTTP/1.1).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::proxy::base::held::{self, Open};

/// A connection's whole life on a worker, from registering its socket there on.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Worker {
    jobs: mpsc::UnboundedSender<Job>,
    /// Connections open on it (or on their way to it).
    open: Arc<AtomicUsize>,
}

/// The worker threads. Dropping it closes their queues, which stops them: the connections still open there
/// are dropped with their runtimes.
pub struct Workers {
    workers: Vec<Worker>,
}

impl Workers {
    /// Starts `n` worker threads (at least one).
    pub fn start(n: usize) -> std::io::Result<Self> {
        let workers = (0..n.max(1))
            .map(|i| {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let (jobs, mut rx) = mpsc::unbounded_channel::<Job>();
                let open = Arc::<AtomicUsize>::default();
                let counted = Arc::clone(&open);
                std::thread::Builder::new()
                    .name(format!("sse-gateway-worker-{i}"))
                    .spawn(move || {
                        held::count_here(&counted);
                        runtime.block_on(async move {
                            while let Some(job) = rx.recv().await {
                                tokio::spawn(job);
                            }
                        });
                    })?;
                Ok(Worker { jobs, open })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Self { workers })
    }

    /// Runs `serve` on `stream` on the worker with the fewest open connections.
    pub fn serve<F>(&self, stream: TcpStream, serve: impl FnOnce(TcpStream) -> F + Send + 'static)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(worker) = self.workers.iter().min_by_key(|w| w.open.load(Ordering::Relaxed)) else {
            return;
        };
        // Deregistered from this runtime's reactor, to be registered with the worker's.
        let Ok(stream) = stream.into_std() else {
            return;
        };
        // Counted now, so a burst of accepts spreads before the workers have picked them up; uncounted when the
        // job ends or is dropped unrun.
        let open = Open::on(&worker.open);
        let _ = worker.jobs.send(Box::pin(async move {
            let _open = open;
            // Registered on first poll, so with the worker's reactor: its readiness wakes the worker's thread.
            if let Ok(stream) = TcpStream::from_std(stream) {
                serve(stream).await;
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;
    use tokio::sync::{oneshot, watch};

    /// `n` accepted server-side streams (their clients kept open in the returned vector).
    async fn accepted(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut servers, mut clients) = (Vec::new(), Vec::new());
        for _ in 0..n {
            clients.push(TcpStream::connect(addr).await.unwrap());
            servers.push(listener.accept().await.unwrap().0);
        }
        (servers, clients)
    }

    /// Serves a connection by reporting the thread it runs on, then holding it until `release` is dropped.
    fn holding(
        seen: mpsc::UnboundedSender<String>,
        mut release: watch::Receiver<()>,
    ) -> impl FnOnce(TcpStream) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + 'static {
        move |stream| {
            Box::pin(async move {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                let _ = seen.send(name);
                let _ = release.changed().await;
                drop(stream);
            })
        }
    }

    #[tokio::test]
    async fn connections_run_on_the_worker_with_the_fewest_open() {
        let workers = Workers::start(2).unwrap();
        let (mut servers, _clients) = accepted(4).await;
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let (release_tx, release) = watch::channel(());
        let counts = |w: &Workers| {
            w.workers
                .iter()
                .map(|w| w.open.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        // Held on worker 0; then one that ends at once on worker 1.
        workers.serve(servers.remove(0), holding(seen_tx.clone(), release.clone()));
        let (ended, ends_now) = watch::channel(());
        drop(ended);
        workers.serve(servers.remove(0), holding(seen_tx.clone(), ends_now));
        // The two threads report in either order.
        let mut first = [seen.recv().await.unwrap(), seen.recv().await.unwrap()];
        first.sort();
        assert_eq!(first, ["sse-gateway-worker-0", "sse-gateway-worker-1"]);
        wait_for(|| counts(&workers) == [1, 0]).await;
        // Worker 1 has fewer now: the next goes there (taking turns would pick worker 0), the one after to 0.
        for want in ["sse-gateway-worker-1", "sse-gateway-worker-0"] {
            workers.serve(servers.remove(0), holding(seen_tx.clone(), release.clone()));
            assert_eq!(seen.recv().await.unwrap(), want);
        }
        assert_eq!(counts(&workers), [2, 1]);
        // Released, each worker's count goes back to zero.
        drop(release_tx);
        wait_for(|| counts(&workers) == [0, 0]).await;
    }

    /// An upgraded socket outlives the job its connection came in on: counted by `Open::here`, its worker keeps
    /// its count after the job ends, and the next connection goes to the other worker (uncounted, every socket
    /// went to the first).
    #[tokio::test]
    async fn a_connection_counted_here_keeps_its_worker_counted_after_its_job_ends() {
        assert!(Open::here().is_none(), "off the workers nothing is counted");
        let workers = Workers::start(2).unwrap();
        let (mut servers, _clients) = accepted(2).await;
        let counts = |w: &Workers| {
            w.workers
                .iter()
                .map(|w| w.open.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        let (held_tx, held) = oneshot::channel::<Option<Open>>();
        workers.serve(servers.remove(0), move |_stream| async move {
            let _ = held_tx.send(Open::here());
        });
        let held = held.await.unwrap();
        assert!(held.is_some(), "a worker's job counts here");
        // The job has ended; what it counted stays until dropped.
        wait_for(|| counts(&workers) == [1, 0]).await;
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let (release_tx, release) = watch::channel(());
        workers.serve(servers.remove(0), holding(seen_tx, release));
        assert_eq!(seen.recv().await.unwrap(), "sse-gateway-worker-1");
        drop(held);
        drop(release_tx);
        wait_for(|| counts(&workers) == [0, 0]).await;
    }

    /// Waits (up to 2 s) until `done` holds.
    async fn wait_for(mut done: impl FnMut() -> bool) {
        for _ in 0..200 {
            if done() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("still not so after 2 s");
    }

    #[tokio::test]
    async fn dropping_the_workers_drops_what_still_runs_on_them() {
        let workers = Workers::start(1).unwrap();
        let (mut servers, _clients) = accepted(1).await;
        let (started_tx, started) = oneshot::channel::<()>();
        let (gone_tx, gone) = oneshot::channel::<()>();
        workers.serve(servers.remove(0), move |_stream| async move {
            // Dropped (never sent) when the worker's runtime drops this future.
            let _gone = gone_tx;
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        started.await.unwrap();
        drop(workers);
        let dropped = tokio::time::timeout(std::time::Duration::from_secs(5), gone).await;
        assert!(
            matches!(dropped, Ok(Err(_))),
            "the held connection was not dropped: {dropped:?}"
        );
    }

    #[test]
    fn zero_workers_still_starts_one() {
        assert_eq!(Workers::start(0).unwrap().workers.len(), 1);
    }
}
