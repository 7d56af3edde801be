//! The threads client connections are served on: `server.workers` of them, each a single-threaded runtime.
//!
//! A connection, its upstream connection, its timers and the tasks it spawns stay on the thread it was handed
//! to, as in nginx's worker processes: an event wakes that thread and no other. On tokio's multi-thread
//! scheduler the worker woken by a socket woke a parked sibling to share the work, for every batch of events,
//! and paced streams paid it in futex calls and context switches (~3 µs of system time per event on 2 cores).
//! Accepting stays on the main runtime; a connection goes to the worker with the fewest open connections. As with
//! nginx, the streams of one HTTP/2 connection share its worker: a load balancer multiplexing every stream over
//! a single h2c connection uses one core (open a few connections, or use HTTP/1.1).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// Serves one accepted connection on the worker's runtime.
pub type Job = Box<dyn FnOnce(TcpStream) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

struct Worker {
    jobs: mpsc::UnboundedSender<(std::net::TcpStream, Job)>,
    /// Connections open on it.
    open: Arc<AtomicUsize>,
}

/// The worker threads, stopped when dropped (their connections are then dropped with their runtimes).
pub struct Workers {
    workers: Vec<Worker>,
    _stop: watch::Sender<()>,
}

impl Workers {
    /// Starts `n` worker threads (at least one).
    pub fn start(n: usize) -> std::io::Result<Self> {
        let (stop, stopped) = watch::channel(());
        let workers = (0..n.max(1))
            .map(|i| {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let (jobs, mut rx) = mpsc::unbounded_channel::<(std::net::TcpStream, Job)>();
                let open = Arc::new(AtomicUsize::new(0));
                let mut stopped = stopped.clone();
                let count = Arc::clone(&open);
                std::thread::Builder::new()
                    .name(format!("sse-gateway-worker-{i}"))
                    .spawn(move || {
                        runtime.block_on(async move {
                            let serve = async {
                                while let Some((stream, job)) = rx.recv().await {
                                    let count = Open(Arc::clone(&count));
                                    tokio::spawn(async move {
                                        // Registered with this thread's reactor, so its readiness wakes this thread.
                                        if let Ok(stream) = TcpStream::from_std(stream) {
                                            job(stream).await;
                                        }
                                        drop(count);
                                    });
                                }
                                // No more connections: the open ones run on (draining) until the stop.
                                std::future::pending::<()>().await;
                            };
                            tokio::select! {
                                () = serve => {}
                                _ = stopped.changed() => {}
                            }
                        });
                    })?;
                Ok(Worker { jobs, open })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Self { workers, _stop: stop })
    }

    /// Hands `stream` to the worker with the fewest open connections, which runs `job` on it.
    pub fn serve(&self, stream: TcpStream, job: Job) {
        let Some(worker) = self.workers.iter().min_by_key(|w| w.open.load(Ordering::Relaxed)) else {
            return;
        };
        // Deregistered from this runtime's reactor, to be registered with the worker's.
        let Ok(stream) = stream.into_std() else {
            return;
        };
        // Counted now, so a burst of accepts spreads before the workers have picked them up.
        worker.open.fetch_add(1, Ordering::Relaxed);
        if worker.jobs.send((stream, job)).is_err() {
            worker.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// One open connection on a worker (counted by `Workers::serve`), uncounted when dropped.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;
    use tokio::sync::oneshot;

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

    /// A job that reports the thread it runs on, then holds its connection until `release` is dropped.
    fn holding(seen: mpsc::UnboundedSender<String>, release: watch::Receiver<()>) -> Job {
        Box::new(move |stream| {
            Box::pin(async move {
                let name = std::thread::current().name().unwrap_or("").to_owned();
                let _ = seen.send(name);
                let mut release = release;
                let _ = release.changed().await;
                drop(stream);
            })
        })
    }

    #[tokio::test]
    async fn connections_run_on_the_worker_with_the_fewest_open() {
        let workers = Workers::start(2).unwrap();
        let (servers, _clients) = accepted(6).await;
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let (release_tx, release) = watch::channel(());
        for s in servers {
            workers.serve(s, holding(seen_tx.clone(), release.clone()));
        }
        let mut names = Vec::new();
        for _ in 0..6 {
            names.push(seen.recv().await.unwrap());
        }
        names.sort();
        assert_eq!(
            names,
            ["sse-gateway-worker-0", "sse-gateway-worker-0", "sse-gateway-worker-0"]
                .into_iter()
                .chain(["sse-gateway-worker-1"; 3])
                .collect::<Vec<_>>()
        );
        // Released, each worker's count goes back to zero.
        drop(release_tx);
        for _ in 0..200 {
            if workers.workers.iter().all(|w| w.open.load(Ordering::Relaxed) == 0) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("open counts stayed above zero after the connections ended");
    }

    #[tokio::test]
    async fn dropping_the_workers_drops_what_still_runs_on_them() {
        let workers = Workers::start(1).unwrap();
        let (mut servers, _clients) = accepted(1).await;
        let (started_tx, started) = oneshot::channel::<()>();
        let (gone_tx, gone) = oneshot::channel::<()>();
        workers.serve(
            servers.remove(0),
            Box::new(move |_stream| {
                Box::pin(async move {
                    // Dropped (never sent) when the worker's runtime drops this future.
                    let _gone = gone_tx;
                    let _ = started_tx.send(());
                    std::future::pending::<()>().await;
                })
            }),
        );
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
