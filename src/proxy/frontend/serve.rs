//! A request on a frontend route, as `decide::handler` sees it: a turn's body read (bounded in size and time),
//! adapted and put in place of the client's, with what its response's encoder needs; the AI SDK's resume route
//! looked up; a preflight sent on as the run path's. Also the response-only encoding a request asks for with
//! `X-Stream-Format: ai-sdk | ag-ui`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use prometheus::{IntCounter, Registry};

use super::adapter::{self, BadBody, Remembered};
use super::chats::{self, Chats};
use super::routes::{Asked, Routes};
use crate::config::Frontend;
use crate::frontend::{Encoder, Protocol, Turn};
use crate::proxy::body::encode::Learn;
use crate::proxy::request::body::UpstreamBody;
use crate::proxy::request::headers::X_STREAM_FORMAT;
use crate::resume::redis::RedisStore;

/// Bytes of a frontend's request body read (a chat sends its whole history).
pub const MAX_BODY_BYTES: usize = 4 << 20;

label_enum! {
    /// What a frontend request became (`frontend_requests_total{outcome}`).
    pub enum Outcome {
        Run = "run",
        ToolResults = "tool_results",
        Resumed = "resumed",
        NoStream = "no_stream",
        BadBody = "bad_body",
        Encoded = "encoded",
    }
}

/// The frontends' routes, their chats, their counts.
pub struct Frontends {
    pub routes: Routes,
    pub chats: Arc<Chats>,
    /// By protocol, then `Outcome`.
    requests: [[IntCounter; Outcome::ALL.len()]; Protocol::ALL.len()],
}

/// What the handler does with a request.
pub enum Step {
    /// Not a frontend request (or a preflight, now for the run path): on as usual.
    Pass,
    /// Forward the rewritten request; encode its response with `Read`.
    Forward(Read),
    /// The body cannot be mapped: 400 naming the field, never forwarded.
    Bad(BadBody),
    /// The request body failed or stalled.
    BodyFailed(bool),
    /// The AI SDK's resume route: the chat's held stream (its URL path) read with `Read`, or none (204).
    Resume(Option<(String, Read)>),
}

/// What a response's encoder needs, and where what it learns goes.
pub struct Read {
    pub protocol: Protocol,
    pub turn: Turn,
    /// The chat (AI SDK `id`) or thread (AG-UI `threadId`) a turn's body named: a trace's `gen_ai.conversation.id`.
    pub conversation: Option<String>,
    chat: Option<([u8; 32], Arc<Chats>)>,
}

impl Read {
    /// A response-only encoding (`X-Stream-Format`): fresh ids, nothing remembered.
    pub fn fresh(protocol: Protocol) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self {
            protocol,
            turn: Turn {
                message_id: id.clone(),
                thread_id: id.clone(),
                run_id: id.clone(),
                prefix: id,
                ..Turn::default()
            },
            conversation: None,
            chat: None,
        }
    }

    pub fn encoder(&self) -> Encoder {
        Encoder::new(self.protocol, self.turn.clone())
    }

    /// At the stream's end: the chat continues its run's agent and remembers the calls it awaits; its stream is
    /// no longer running, so the resume route answers 204 (a page reloaded after the run does not get it again).
    pub fn learn(&self) -> Option<Learn> {
        let (key, chats) = self.chat.clone()?;
        Some(Box::new(move |agent: Option<&str>, awaited: Option<&[String]>| {
            chats.update(key, |c| {
                if let Some(a) = agent {
                    c.agent = Some(a.to_owned());
                }
                c.awaited = awaited.map(<[String]>::to_vec).unwrap_or_default();
                c.stream = None;
            });
        }))
    }

    /// The run is held as `stream` (its URL path): the resume route reads it from there.
    pub fn held(&self, stream: &str) {
        if let Some((key, chats)) = &self.chat {
            let turn = self.turn.clone();
            chats.update(*key, |c| {
                c.stream = Some(stream.to_owned());
                c.turn = Some(turn);
            });
        }
    }

    /// The response's headers for its protocol.
    pub fn set_headers(&self, h: &mut HeaderMap) {
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(X_STREAM_FORMAT, HeaderValue::from_static(self.protocol.as_str()));
        for (name, value) in self.protocol.headers() {
            h.insert(*name, HeaderValue::from_static(value));
        }
    }
}

impl Frontends {
    pub fn new(frontends: &[Frontend], mirror: Option<RedisStore>, registry: &Registry) -> prometheus::Result<Self> {
        let family = prometheus::IntCounterVec::new(
            prometheus::Opts::new(
                crate::telemetry::name("frontend_requests_total"),
                "Requests on [[frontend]] routes and X-Stream-Format encodings, by protocol and what they became.",
            ),
            &["protocol", "outcome"],
        )?;
        let family = crate::telemetry::register(registry, family)?;
        Ok(Self {
            routes: Routes::new(frontends),
            chats: Arc::new(Chats::new(mirror)),
            requests: Protocol::ALL.map(|p| Outcome::ALL.map(|o| family.with_label_values(&[p.as_str(), o.as_str()]))),
        })
    }

    pub fn count(&self, protocol: Protocol, outcome: Outcome) {
        self.requests[protocol as usize][outcome as usize].inc();
    }

    /// Decides a request on a frontend route: `binding` is the hash of the client's bound headers (who may
    /// continue or resume a chat).
    pub async fn step(&self, req: &mut Request<UpstreamBody>, binding: [u8; 32], body_timeout: Duration) -> Step {
        let path = req.uri().path().to_owned();
        let Some((route, protocol, asked)) = self.routes.find(req.method(), &path) else {
            return Step::Pass;
        };
        match asked {
            Asked::Other => Step::Pass,
            Asked::Preflight => {
                // The backend answers for its run path, as it would for the legacy app.
                if let Ok(uri) = route.run.parse::<Uri>() {
                    *req.uri_mut() = uri;
                }
                Step::Pass
            }
            Asked::Resume(id) => {
                let key = chats::key(&binding, &route.path, id);
                let found = self.chats.find(&key).await.and_then(|c| Some((c.stream?, c.turn?)));
                let Some((stream, turn)) = found else {
                    self.count(protocol, Outcome::NoStream);
                    return Step::Resume(None);
                };
                self.count(protocol, Outcome::Resumed);
                let read = Read {
                    protocol,
                    turn,
                    conversation: None,
                    chat: Some((key, Arc::clone(&self.chats))),
                };
                Step::Resume(Some((stream, read)))
            }
            Asked::Turn => self.turn(req, route, protocol, binding, body_timeout).await,
        }
    }

    async fn turn(
        &self,
        req: &mut Request<UpstreamBody>,
        route: &Frontend,
        protocol: Protocol,
        binding: [u8; 32],
        body_timeout: Duration,
    ) -> Step {
        let body = std::mem::replace(req.body_mut(), Full::new(Bytes::new()).map_err(|n| match n {}).boxed());
        let read = tokio::time::timeout(body_timeout, Limited::new(body, MAX_BODY_BYTES).collect()).await;
        let bytes = match read {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) => return Step::BodyFailed(e.downcast_ref::<http_body_util::LengthLimitError>().is_some()),
            Err(_) => return Step::BodyFailed(false),
        };
        let body = match adapter::parse(&bytes) {
            Ok(body) => body,
            Err(bad) => {
                self.count(protocol, Outcome::BadBody);
                return Step::Bad(bad);
            }
        };
        // What the store remembers of the chat the body names (AG-UI's agent and awaited calls).
        let key = adapter::conversation(&body, protocol).map(|id| chats::key(&binding, &route.path, &id));
        let remembered = match key {
            Some(k) => self.chats.find(&k).await,
            None => None,
        };
        let remembered = remembered.map(|c| Remembered {
            agent: c.agent,
            awaited: c.awaited,
        });
        let mut fresh = || uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let adapted = match adapter::adapt(route, protocol, &body, remembered.as_ref(), &mut fresh) {
            Ok(a) => a,
            Err(bad) => {
                self.count(protocol, Outcome::BadBody);
                return Step::Bad(bad);
            }
        };
        let outcome = if adapted.continuation {
            Outcome::ToolResults
        } else {
            Outcome::Run
        };
        self.count(protocol, outcome);
        if let Ok(uri) = adapted.path.parse::<Uri>() {
            *req.uri_mut() = uri;
        }
        let h = req.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert(header::ACCEPT, HeaderValue::from_static("text/event-stream"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(adapted.body.len()));
        h.remove(header::TRANSFER_ENCODING);
        h.remove(X_STREAM_FORMAT);
        *req.body_mut() = Full::new(Bytes::from(adapted.body)).map_err(|n| match n {}).boxed();
        let key = chats::key(&binding, &route.path, &adapted.chat);
        Step::Forward(Read {
            protocol,
            turn: adapted.turn,
            conversation: Some(adapted.chat),
            chat: Some((key, Arc::clone(&self.chats))),
        })
    }
}

/// Who is asking, when resumption (which hashes the bound headers with its key) is off: the same headers,
/// `Authorization` and `Cookie`, hashed unkeyed.
pub fn unbound(headers: &HeaderMap) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for name in [header::AUTHORIZATION, header::COOKIE] {
        for v in headers.get_all(&name) {
            h.update(name.as_str().as_bytes());
            h.update(b":");
            h.update(v.as_bytes());
            h.update(b"\n");
        }
    }
    *h.finalize().as_bytes()
}
