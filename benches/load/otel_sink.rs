//! A trace collector for the `otel` scenario: answers every OTLP/HTTP export 200 on 127.0.0.1, decoding it (as a
//! collector would) to count the spans.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

pub struct Sink {
    pub addr: SocketAddr,
    exports: Arc<AtomicU64>,
    spans: Arc<AtomicU64>,
}

impl Sink {
    pub async fn start() -> Result<Sink, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let (exports, spans) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (e, s) = (Arc::clone(&exports), Arc::clone(&spans));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (e, s) = (Arc::clone(&e), Arc::clone(&s));
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let (e, s) = (Arc::clone(&e), Arc::clone(&s));
                        async move {
                            let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                            if let Ok(r) = ExportTraceServiceRequest::decode(&body[..]) {
                                let n: usize = r
                                    .resource_spans
                                    .iter()
                                    .flat_map(|rs| &rs.scope_spans)
                                    .map(|ss| ss.spans.len())
                                    .sum();
                                s.fetch_add(n as u64, Ordering::Relaxed);
                            }
                            e.fetch_add(1, Ordering::Relaxed);
                            Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::new())))
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), svc).await;
                });
            }
        });
        Ok(Sink { addr, exports, spans })
    }

    /// (exports, spans) received so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.exports.load(Ordering::Relaxed), self.spans.load(Ordering::Relaxed))
    }
}
