//! An OTLP/HTTP traces receiver on 127.0.0.1: every export decoded with the official protobuf messages
//! (`opentelemetry-proto`), gzip or not; its answers scripted (a status with `Retry-After`, a hang, garbage).

use std::collections::VecDeque;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// How the receiver answers one export.
#[derive(Clone, Debug)]
pub enum Answer {
    Status(u16, Option<&'static str>),
    /// Never answers.
    Hang,
    /// 200 with a body that is not protobuf, and a wrong content type.
    Garbage,
}

/// A span as received, with its resource's attributes.
#[derive(Clone, Debug)]
pub struct Got {
    pub span: Span,
    pub resource: Vec<KeyValue>,
}

#[derive(Default)]
struct State {
    spans: Vec<Got>,
    /// When each export arrived, and whether it decoded.
    requests: Vec<(Instant, bool)>,
    /// Each export's `Content-Encoding: gzip`, and its `x-api-key` header.
    sent_as: Vec<(bool, Option<String>)>,
    script: VecDeque<Answer>,
    /// What every export past the script gets.
    then: Option<Answer>,
}

pub struct Collector {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Collector {
    /// Answers 200 to every export.
    pub async fn start() -> Collector {
        Self::scripted(Vec::new(), Answer::Status(200, None)).await
    }

    /// Answers the first exports with `script`, then every other with `then`.
    pub async fn scripted(script: Vec<Answer>, then: Answer) -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State {
            script: script.into(),
            then: Some(then),
            ..State::default()
        }));
        let st = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let st = Arc::clone(&st);
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let st = Arc::clone(&st);
                        async move { Ok::<_, hyper::Error>(receive(&st, req).await) }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), svc).await;
                });
            }
        });
        Collector { addr, state }
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<Got> {
        self.state.lock().expect("lock").spans.clone()
    }

    pub fn requests(&self) -> Vec<(Instant, bool)> {
        self.state.lock().expect("lock").requests.clone()
    }

    /// Each export's `Content-Encoding: gzip`, and its `x-api-key` header.
    pub fn sent_as(&self) -> Vec<(bool, Option<String>)> {
        self.state.lock().expect("lock").sent_as.clone()
    }

    /// Waits until a span satisfies `want`; all spans so far then.
    pub async fn wait_for(&self, what: &str, want: impl Fn(&Got) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + super::PATIENCE;
        loop {
            let spans = self.spans();
            if spans.iter().any(&want) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "no span {what} in {} received: {spans:#?}",
                spans.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn receive(st: &Arc<Mutex<State>>, req: hyper::Request<hyper::body::Incoming>) -> hyper::Response<Full<Bytes>> {
    let gzip = req
        .headers()
        .get("content-encoding")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
    let typed = req
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
    let path_ok = req.uri().path() == "/v1/traces";
    let api_key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let raw = if gzip {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_end(&mut out)
            .map(|_| out)
            .unwrap_or_default()
    } else {
        body.to_vec()
    };
    let decoded = ExportTraceServiceRequest::decode(&raw[..])
        .ok()
        .filter(|_| typed && path_ok);
    let answer = {
        let mut s = st.lock().expect("lock");
        s.requests.push((Instant::now(), decoded.is_some()));
        s.sent_as.push((gzip, api_key));
        let answer = s
            .script
            .pop_front()
            .or_else(|| s.then.clone())
            .unwrap_or(Answer::Status(200, None));
        if let (Some(req), Answer::Status(200, _)) = (&decoded, &answer) {
            for rs in &req.resource_spans {
                let resource = rs.resource.as_ref().map(|r| r.attributes.clone()).unwrap_or_default();
                for ss in &rs.scope_spans {
                    for span in &ss.spans {
                        s.spans.push(Got {
                            span: span.clone(),
                            resource: resource.clone(),
                        });
                    }
                }
            }
        }
        answer
    };
    match answer {
        Answer::Status(code, after) => {
            let mut r = hyper::Response::builder().status(code);
            if let Some(a) = after {
                r = r.header("retry-after", a);
            }
            r.header("content-type", "application/x-protobuf")
                .body(Full::new(Bytes::new()))
                .expect("answer")
        }
        Answer::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
        Answer::Garbage => hyper::Response::builder()
            .header("content-type", "text/html")
            .body(Full::new(Bytes::from_static(b"<html>not a collector</html>")))
            .expect("answer"),
    }
}

/// A span's attribute, as a string (ints and doubles written out).
pub fn attr(span: &Span, key: &str) -> Option<String> {
    attr_of(&span.attributes, key)
}

pub fn attr_of(attrs: &[KeyValue], key: &str) -> Option<String> {
    let v = attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()?;
    Some(match v {
        Any::StringValue(s) => s.clone(),
        Any::IntValue(i) => i.to_string(),
        Any::DoubleValue(d) => d.to_string(),
        Any::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
