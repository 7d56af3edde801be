//! Level 2, the server in-process: the gateway bound on ephemeral ports in this test's runtime, with its
//! settings tweaked in code.

use std::net::SocketAddr;

use sse_gateway::config::Settings;
use sse_gateway::proxy::accept::server::Gateway;
use tokio::sync::oneshot;

use super::client::get;
use super::upstream::{Emulator, Step};
use super::PATIENCE;

/// A gateway running in this process, on ephemeral ports.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestGateway {
    pub async fn start(upstream: &str, tweak: impl FnOnce(&mut Settings)) -> TestGateway {
        let mut s = Settings::default();
        s.server.listen = "127.0.0.1:0".into();
        s.server.admin_listen = "127.0.0.1:0".into();
        s.upstream.url = upstream.to_owned();
        tweak(&mut s);
        s.validate().expect("test settings are valid");
        let gw = Gateway::bind(s, prometheus::Registry::new())
            .await
            .expect("bind gateway");
        let (addr, admin) = (gw.local_addr(), gw.admin_addr());
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(gw.run(async move {
            let _ = rx.await;
        }));
        TestGateway {
            addr,
            admin,
            stop: Some(tx),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn metrics(&self) -> String {
        let (_, body) = get(&format!("http://{}/metrics", self.admin)).await;
        String::from_utf8(body).expect("utf-8 metrics")
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(PATIENCE, &mut self.task).await;
    }
}

/// An emulator answering every request with `steps`, and a gateway in front of it with `tweak`ed settings.
pub async fn gateway_with(steps: Vec<Step>, tweak: impl FnOnce(&mut Settings)) -> (Emulator, TestGateway) {
    let up = Emulator::always(steps).await;
    let gw = TestGateway::start(&up.url(), tweak).await;
    (up, gw)
}
