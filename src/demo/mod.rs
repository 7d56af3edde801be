//! The built-in backend for `--demo`: answers `POST /agent/run` on loopback with a realistic agent run, paced, in
//! the dialect `--demo-dialect` names: the legacy stream ([`legacy`]), cogency 3.3's events ([`cogency`]) or the
//! Claude Agent SDK's messages ([`agent_sdk`]) (DESIGN 3 and 3.7); and `POST /agent/tool_results` (`{agent_uuid,
//! tool_results}`, the frontend tools' answers, docs/FRONTENDS.md) with a short continuation, in the legacy
//! dialect only.

pub mod agent_sdk;
pub mod cogency;
pub mod legacy;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::time::Sleep;

use crate::translate::Dialect;

/// The frontend routes the demo serves when the config names none: `/api/chat` (AI SDK) and `/agui` (AG-UI), both
/// on the demo backend's run and tool-results paths.
pub fn frontends() -> Vec<crate::config::Frontend> {
    [("/api/chat", "ai-sdk"), ("/agui", "ag-ui")]
        .into_iter()
        .map(|(path, protocol)| crate::config::Frontend {
            path: path.into(),
            protocol: protocol.into(),
            run: "/agent/run".into(),
            tool_results: "/agent/tool_results".into(),
            agent_type: None,
        })
        .collect()
}

/// Pause between two events of the demo stream, so the stream visibly streams.
pub const EVENT_PAUSE: Duration = Duration::from_millis(40);
/// Largest request body the demo reads.
const MAX_BODY: usize = 64 << 10;

/// The dialect the demo backend speaks (`--demo-dialect`, default xml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DemoDialect {
    /// The legacy XML-in-SSE stream.
    #[default]
    Xml,
    /// cogency 3.3's JSON events.
    Cogency,
    /// Claude Agent SDK messages, partial messages on.
    AgentSdk,
}

impl DemoDialect {
    /// The translator's name for it.
    pub const fn dialect(self) -> Dialect {
        match self {
            DemoDialect::Xml => Dialect::Xml,
            DemoDialect::Cogency => Dialect::Cogency,
            DemoDialect::AgentSdk => Dialect::AgentSdk,
        }
    }

    /// Whether a translator set to `d` reads this demo's stream.
    pub fn read_by(self, d: Dialect) -> bool {
        d == Dialect::Auto || d == self.dialect()
    }

    /// The run's SSE events (`data: …\n\n` each) for `query`, by `agent` (the legacy agent id, the SDK session).
    fn stream(self, agent: &str, query: &str) -> Vec<String> {
        match self {
            DemoDialect::Xml => legacy::stream(agent, query),
            DemoDialect::Cogency => cogency::stream(query, unix_now()),
            DemoDialect::AgentSdk => agent_sdk::stream(agent),
        }
    }
}

/// Seconds since the epoch, in milliseconds (cogency's timestamps).
fn unix_now() -> f64 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    ms as f64 / 1000.0
}

/// Starts the demo backend speaking `dialect` on 127.0.0.1 (ephemeral port); returns its address. Runs until the
/// process ends.
pub async fn start(dialect: DemoDialect) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service_fn(move |r| answer(r, dialect)))
                    .await;
            });
        }
    });
    Ok(addr)
}

/// The commands printed at start-up, for a gateway listening on `public`: the run over SSE with curl, the same
/// run read again over a WebSocket (docs/WEBSOCKET.md) with PyPI `websockets`' own client, and the two frontend
/// paths the demo serves (`frontends()`, docs/FRONTENDS.md).
pub fn instructions(public: SocketAddr, dialect: DemoDialect) -> String {
    let host = if public.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], public.port()))
    } else {
        public
    };
    format!(
        "sse-gateway: demo backend running (no upstream configured), speaking {dialect}. Watch a translated \
         stream:\n  \
         curl -N -X POST http://{host}/agent/run -H 'content-type: application/json' \
         -d '{{\"query\":\"What is the weather in Paris?\"}}'\n\
         sse-gateway: the same stream untranslated: add -H 'X-Stream-Format: legacy'\n\
         sse-gateway: a run read over a WebSocket (pip install websockets):\n  \
         python3 -m websockets ws://{host}$(curl -sD - -o /dev/null -X POST http://{host}/agent/run -d '{{}}' \
         | sed -n 's/^x-gateway-stream: //ip' | tr -d '\\r')\n\
         sse-gateway: frontends (docs/FRONTENDS.md), unless [[frontend]] names others: a useChat app (AI SDK) \
         posts to http://{host}/api/chat, an AG-UI HttpAgent to http://{host}/agui; e.g.\n  \
         curl -N http://{host}/api/chat -H 'content-type: application/json' \
         -d '{{\"id\":\"c1\",\"messages\":[{{\"id\":\"u1\",\"role\":\"user\",\"parts\":[{{\"type\":\"text\",\"text\":\"Hi\"}}]}}]}}'",
        dialect = dialect.dialect().as_str(),
    )
}

/// A plain-text answer with `status`.
fn plain(status: StatusCode, text: &'static str) -> Response<DemoBody> {
    let mut r = Response::new(DemoBody::new([text], Duration::ZERO));
    *r.status_mut() = status;
    r
}

/// The events of a `POST /agent/tool_results` continuation for `body`: the legacy dialect's, else the message of
/// the 404 (the other dialects' backends continue a run their own way).
pub fn tool_results_stream(dialect: DemoDialect, body: &[u8]) -> Result<Vec<String>, &'static str> {
    #[derive(Deserialize)]
    struct Continue {
        #[serde(default)]
        tool_results: Vec<legacy::ToolResult>,
    }
    if dialect != DemoDialect::Xml {
        return Err(
            "the demo backend answers POST /agent/tool_results in its xml dialect only \
             (--demo-dialect xml, the default)\n",
        );
    }
    let asked: Continue = serde_json::from_slice(body).unwrap_or(Continue {
        tool_results: Vec::new(),
    });
    Ok(legacy::continuation(&asked.tool_results))
}

async fn answer(req: Request<Incoming>, dialect: DemoDialect) -> Result<Response<DemoBody>, Infallible> {
    let path = req.uri().path();
    let continuing = path == "/agent/tool_results";
    if req.method() != Method::POST || !(continuing || path == "/agent/run") {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            "the demo backend answers POST /agent/run and POST /agent/tool_results\n",
        ));
    }
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let events = if continuing {
        match tool_results_stream(dialect, &body) {
            Ok(events) => events,
            Err(why) => return Ok(plain(StatusCode::NOT_FOUND, why)),
        }
    } else {
        let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let query = parsed["query"].as_str().unwrap_or("What is the weather in Paris?");
        let agent = parsed["agent_uuid"]
            .as_str()
            .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned);
        dialect.stream(&agent, query)
    };
    let mut r = Response::new(DemoBody::new(events, EVENT_PAUSE));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    Ok(r)
}

/// The demo's response body: events handed out one per pause.
pub struct DemoBody {
    events: VecDeque<Bytes>,
    pause: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl DemoBody {
    fn new(events: impl IntoIterator<Item = impl Into<Bytes>>, pause: Duration) -> Self {
        Self {
            events: events.into_iter().map(Into::into).collect(),
            pause,
            sleep: None,
        }
    }
}

impl Body for DemoBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if let Some(s) = this.sleep.as_mut() {
            if s.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
        match this.events.pop_front() {
            None => Poll::Ready(None),
            Some(e) => {
                if !this.pause.is_zero() {
                    this.sleep = Some(Box::pin(tokio::time::sleep(this.pause)));
                }
                Poll::Ready(Some(Ok(Frame::data(e))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::translate::{translate_all, Options};

    /// The envelopes of `events` translated as the gateway does for a request naming `agent`.
    fn envelopes(events: &[String], agent: &str) -> Vec<Value> {
        let opts = Options {
            dialect: Dialect::Xml,
            ..Options::default()
        };
        let (out, _) = translate_all(opts, agent, events.concat().as_bytes());
        String::from_utf8(out)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::from(d)))
            .collect()
    }

    #[test]
    fn tool_results_continue_the_named_agent_with_text_then_meta_final_and_done() {
        let body = json!({"agent_uuid": "agent-7", "tool_results": [
            {"tool_use_id": "f1", "content": "{\"city\": \"Paris\"}", "is_error": false},
            {"tool_use_id": "f2", "content": "denied </content-block-text>", "is_error": true}
        ]});
        let events = tool_results_stream(DemoDialect::Xml, body.to_string().as_bytes()).unwrap();
        let envs = envelopes(&events, "agent-7");
        let kinds: Vec<&str> = envs.iter().map(|e| e["type"].as_str().unwrap_or("[DONE]")).collect();
        assert_eq!(
            kinds.first(),
            Some(&"text"),
            "no meta_init in a continuation: {kinds:?}"
        );
        assert_eq!(kinds[kinds.len() - 2..], ["meta_final", "[DONE]"], "{kinds:?}");
        assert!(kinds[..kinds.len() - 2].iter().all(|k| *k == "text"), "{kinds:?}");
        assert!(
            envs[..envs.len() - 1].iter().all(|e| e["agent"] == "agent-7"),
            "{envs:?}"
        );
        let text: String = envs
            .iter()
            .filter(|e| e["type"] == "text")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert!(text.contains("f1 returned") && text.contains("Paris"), "{text}");
        assert!(text.contains("\nThanks: the tool call f2 failed with"), "{text}");
        let meta_final: Value = serde_json::from_str(envs[envs.len() - 2]["delta"].as_str().unwrap()).unwrap();
        assert_eq!(meta_final["stop_reason"], "end_turn");
    }

    #[test]
    fn tool_results_are_the_xml_dialects_only_and_a_bad_body_still_ends_the_run() {
        assert!(tool_results_stream(DemoDialect::Cogency, b"{}").is_err());
        assert!(tool_results_stream(DemoDialect::AgentSdk, b"{}").is_err());
        let events = tool_results_stream(DemoDialect::Xml, b"not json").unwrap();
        let envs = envelopes(&events, "a");
        assert_eq!(envs.last().and_then(Value::as_str), Some("[DONE]"));
        assert!(envs.iter().all(|e| e["type"] != "error"), "{envs:?}");
    }

    #[test]
    fn the_instructions_name_the_two_frontend_paths() {
        let said = instructions(SocketAddr::from(([0, 0, 0, 0], 8080)), DemoDialect::Xml);
        assert!(
            said.contains("curl -N -X POST http://127.0.0.1:8080/agent/run"),
            "{said}"
        );
        assert!(said.contains("http://127.0.0.1:8080/api/chat"), "{said}");
        assert!(said.contains("http://127.0.0.1:8080/agui"), "{said}");
    }
}
