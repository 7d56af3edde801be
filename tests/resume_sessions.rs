//! Sessions (every stream of a binding, for a session socket) across two gateway instances on one real
//! `redis-server`: a session on B lists the stream A holds, is told of the streams B and A start afterwards,
//! each once, and of nothing from another binding.

#[path = "harness/redis_server.rs"]
#[allow(dead_code)] // pause/resume are for the store's stall tests
mod redis_server;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis_server::RedisServer;
use sse_gateway::config::{Resume, StoreKind};
use sse_gateway::resume::metrics::{End, ResumeMetrics};
use sse_gateway::resume::sessions::{Listed, Session, SessionLimits};
use sse_gateway::resume::Resumer;

/// Bound on anything a test waits for: reaching it is a failure.
const PATIENCE: Duration = Duration::from_secs(10);

const LIMITS: SessionLimits = SessionLimits {
    max_sessions: 8,
    max_listed: 32,
};

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {PATIENCE:?}"))
}

async fn next(s: &mut Session) -> Option<sse_gateway::resume::id::Token> {
    within("the next start", s.next_start()).await
}

async fn instance(server: &RedisServer) -> Arc<Resumer> {
    let cfg = Resume {
        store: StoreKind::Redis,
        redis_url: server.url(),
        binding_key: "k".repeat(32),
        ..Resume::default()
    };
    let metrics = Arc::new(ResumeMetrics::register(&prometheus::Registry::new()).unwrap());
    Resumer::start(&cfg, metrics).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_one_instance_sees_every_stream_of_its_binding_on_both() {
    let Some(server) = RedisServer::start() else { return };
    let (a, b) = (instance(&server).await, instance(&server).await);
    let (mine, other) = ([1; 32], [2; 32]);

    // Held on A before the session opens: one ended, one live, and another binding's.
    let done = a.create(mine, "agent", None).unwrap();
    done.finish(&[], End::Completed);
    // Listed by creation time (µs): apart.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let held = a.create(mine, "agent", None).unwrap();
    let _not_mine = a.create(other, "agent", None).unwrap();
    // A's writer stores them in its own time: B lists them once they are there.
    let mut session = within("B lists A's streams", async {
        loop {
            let s = b.session(mine, LIMITS).await.unwrap();
            if s.listed().len() == 2 && s.listed()[0].ended {
                return s;
            }
            eprintln!("listed so far: {:?}", s.listed());
            drop(s);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        session.listed(),
        [
            Listed {
                token: done.token,
                ended: true
            },
            Listed {
                token: held.token,
                ended: false
            }
        ]
    );

    // Started afterwards, on B (told as it is created) and on A (told through Redis); each told once, and
    // nothing of another binding on either instance.
    let on_b = b.create(mine, "agent", None).unwrap();
    assert_eq!(next(&mut session).await, Some(on_b.token), "B's own start");
    let _other_a = a.create(other, "agent", None).unwrap();
    let on_a = a.create(mine, "agent", None).unwrap();
    assert_eq!(next(&mut session).await, Some(on_a.token), "A's start, through Redis");
    let _other_b = b.create(other, "agent", None).unwrap();
    let last = a.create(mine, "agent", None).unwrap();
    // B published its own start too, and A's second start came after A's other-binding one: had either been
    // told, it would come before this one.
    assert_eq!(next(&mut session).await, Some(last.token), "nothing else between");
    assert_eq!(b.metrics.sessions.get(), 1);

    // A session on A is told of B's starts the same way.
    let mut on_a_session = a.session(mine, LIMITS).await.unwrap();
    assert!(
        on_a_session.listed().iter().any(|l| l.token == on_b.token),
        "A lists B's stream"
    );
    let from_b = b.create(mine, "agent", None).unwrap();
    assert_eq!(next(&mut on_a_session).await, Some(from_b.token), "A told of B's start");
    assert_eq!(
        next(&mut session).await,
        Some(from_b.token),
        "B's own, once (its publish skipped)"
    );
}
