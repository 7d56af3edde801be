//! The WebSocket handshake on the gateway's own paths (`<prefix>` and `<prefix>/<token>`): checked (RFC 6455
//! §4.2.1, `Origin` as DESIGN §5.2 says, the socket cap, the subprotocol), answered with `101`, and the socket
//! served on the upgraded connection by a task of its own.

use std::collections::HashMap;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use crate::cors::Cors;
use crate::proxy::base::drain::DrainSignal;
use crate::proxy::base::held::ClientStream;
use crate::proxy::body::stack::ResponseBody;
use crate::proxy::request::body::UpstreamBody;
use crate::proxy::socket::cap::Sockets;
use crate::proxy::socket::messages::Subprotocol;
use crate::proxy::socket::metrics::Refused;
use crate::proxy::socket::serve::{self, Binding, Shared, Target};
use crate::proxy::socket::wire::Upgrading;
use crate::resume::id::{EventId, Token};

/// Why a handshake is answered without an upgrade; the edge writes it as its JSON error.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: &'static str,
    /// Answered with `Sec-WebSocket-Version: 13`: the version the gateway speaks (RFC 6455 §4.2.2).
    pub tell_version: bool,
}

impl Refusal {
    /// The headers the refusal's answer carries besides the JSON error.
    pub fn headers(&self) -> impl Iterator<Item = (header::HeaderName, HeaderValue)> {
        self.tell_version
            .then(|| (header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13")))
            .into_iter()
    }
}

/// Whether a request asks for a WebSocket (`GET` with `Upgrade: websocket` and `Connection: upgrade`).
pub fn is_websocket<B>(req: &Request<B>) -> bool {
    let has_token = |name: header::HeaderName, token: &str| {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    req.method() == Method::GET && has_token(header::UPGRADE, "websocket") && has_token(header::CONNECTION, "upgrade")
}

/// What the socket reads, from the path and query; `None` when the path is not the gateway's.
fn target(prefix: &str, stream: Option<Token>, path: &str, query: Option<&str>) -> Option<Target> {
    let ids = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter_map(|kv| kv.split_once('='))
        .collect::<Vec<_>>();
    if let Some(token) = stream {
        let mut after = 0;
        for (k, v) in &ids {
            match *k {
                "last_event_id" => {
                    if let Some(id) = EventId::parse(v).filter(|id| id.token == token) {
                        after = id.seq;
                    }
                }
                "after" => after = v.parse().unwrap_or(after),
                _ => {}
            }
        }
        return Some(Target::Stream(token, after));
    }
    if path == prefix {
        let positions: HashMap<Token, u64> = ids
            .iter()
            .filter(|(k, _)| *k == "last_event_id")
            .filter_map(|(_, v)| EventId::parse(v))
            .map(|id| (id.token, id.seq))
            .take(1024)
            .collect();
        return Some(Target::Session(positions));
    }
    None
}

/// Answers a WebSocket handshake on one of the gateway's paths; `None` when the path is not one (the request
/// goes on as any other).
pub async fn accept(
    req: &mut Request<UpstreamBody>,
    shared: &Arc<Shared>,
    sockets: &Arc<Sockets>,
    cors: &Cors,
    allow_origins: &[String],
) -> Option<Result<Response<ResponseBody>, Refusal>> {
    let r = &shared.resumer;
    let path = req.uri().path();
    let token = r.stream_token(path);
    let target = target(&r.prefix, token, path, req.uri().query())?;
    Some(answer(req, shared, sockets, cors, allow_origins, target).await)
}

async fn answer(
    req: &mut Request<UpstreamBody>,
    shared: &Arc<Shared>,
    sockets: &Arc<Sockets>,
    cors: &Cors,
    allow_origins: &[String],
    target: Target,
) -> Result<Response<ResponseBody>, Refusal> {
    let metrics = &shared.metrics;
    let refuse = |why: Refused, status, code, message| {
        metrics.refuse(why);
        Refusal {
            status,
            code,
            message,
            tell_version: false,
        }
    };
    // RFC 6455 §4.1: an HTTP/1.1 (or later) GET; HTTP/1.0 has no Upgrade, and HTTP/2 upgrades otherwise (RFC 8441).
    if req.version() != Version::HTTP_11 {
        return Err(refuse(
            Refused::Handshake,
            StatusCode::BAD_REQUEST,
            "bad_websocket_handshake",
            "a WebSocket handshake is an HTTP/1.1 request",
        ));
    }
    let h = req.headers();
    if h.get(header::SEC_WEBSOCKET_VERSION).is_none_or(|v| v != "13") {
        return Err(Refusal {
            tell_version: true,
            ..refuse(
                Refused::Handshake,
                StatusCode::BAD_REQUEST,
                "bad_websocket_handshake",
                "the gateway speaks WebSocket version 13 (Sec-WebSocket-Version: 13)",
            )
        });
    }
    let Some(key) = h.get(header::SEC_WEBSOCKET_KEY).filter(|k| k.len() == 24).cloned() else {
        return Err(refuse(
            Refused::Handshake,
            StatusCode::BAD_REQUEST,
            "bad_websocket_handshake",
            "a WebSocket handshake needs a Sec-WebSocket-Key",
        ));
    };
    let offers = h
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok());
    let Ok(chosen) = Subprotocol::choose(offers) else {
        return Err(refuse(
            Refused::Handshake,
            StatusCode::BAD_REQUEST,
            "unsupported_subprotocol",
            "the gateway speaks sse-gateway.v1 and agent-sdk.v1",
        ));
    };
    origin_allowed(h, &target, shared, cors, allow_origins)
        .await
        .then_some(())
        .ok_or_else(|| {
            refuse(
                Refused::Origin,
                StatusCode::FORBIDDEN,
                "origin_refused",
                "this origin may not open a socket on the gateway",
            )
        })?;
    let r = &shared.resumer;
    let offers = h
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok());
    let wants_auth = Subprotocol::auth_offered(offers);
    let binding = if wants_auth && r.binds_authorization() && !h.contains_key(header::AUTHORIZATION) {
        Binding::AwaitAuth(Box::new(h.clone()))
    } else {
        if matches!(target, Target::Session(_)) && !r.has_bound_values(h) {
            return Err(refuse(
                Refused::NoBinding,
                StatusCode::FORBIDDEN,
                "no_binding",
                "a session needs the bound headers or cookies of resume.bind_headers",
            ));
        }
        Binding::Known(r.binding(h))
    };
    let Some(reserved) = sockets.reserve() else {
        return Err(refuse(
            Refused::Sockets,
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_sockets",
            "websocket.max_sockets are open; try again later",
        ));
    };
    // Both given by the gateway's own connections to every request they carry (the connection is open while its
    // request is handled).
    let ext = req.extensions();
    let (Some(DrainSignal(drain)), Some(tcp)) = (
        ext.get::<DrainSignal>().cloned(),
        ext.get::<ClientStream>().and_then(|s| s.0.upgrade()),
    ) else {
        return Err(refuse(
            Refused::Handshake,
            StatusCode::BAD_REQUEST,
            "bad_websocket_handshake",
            "this connection cannot be upgraded",
        ));
    };
    let upgrading = Upgrading {
        on: hyper::upgrade::on(&mut *req),
        tcp,
    };
    let (shared, proto) = (Arc::clone(shared), chosen.unwrap_or(Subprotocol::Gateway));
    tokio::spawn(serve::serve(upgrading, reserved, shared, proto, target, binding, drain));
    let mut resp = Response::new(ResponseBody::full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let out = resp.headers_mut();
    out.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    out.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        out.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    if let Some(p) = chosen {
        out.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(p.name()));
    }
    Ok(resp)
}

/// `Origin` as DESIGN §5.2 says: none (not a browser), one the operator lists, or one the backend allowed.
async fn origin_allowed(h: &HeaderMap, target: &Target, shared: &Shared, cors: &Cors, allow: &[String]) -> bool {
    let Some(origin) = h.get(header::ORIGIN) else {
        return true;
    };
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    if allow.iter().any(|a| a == "*" || a == origin) {
        return true;
    }
    // A page served through the gateway itself: the same site, whatever a backend's CORS says.
    let host = h.get(header::HOST).and_then(|v| v.to_str().ok());
    if origin
        .split_once("://")
        .zip(host)
        .is_some_and(|((_, authority), host)| authority.eq_ignore_ascii_case(host))
    {
        return true;
    }
    let r = &shared.resumer;
    let grant = match target {
        Target::Stream(token, _) => match (r.hub.get(token), r.hub.mirror()) {
            (Some(stream), _) => stream.cors.as_deref().cloned(),
            (None, Some(store)) => store.cors(&token.hex()).await.ok().flatten(),
            (None, None) => None,
        },
        Target::Session(_) => None,
    };
    cors.socket_allows(origin, grant.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(c: char) -> Token {
        Token::parse(&c.to_string().repeat(32)).unwrap()
    }

    #[test]
    fn the_position_comes_from_the_query() {
        let t = tok('a');
        let id = format!("sg1-{}-7", t.hex());
        match target("/s", Some(t), "/s/x", Some(&format!("last_event_id={id}"))) {
            Some(Target::Stream(got, 7)) => assert_eq!(got, t),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            target("/s", Some(t), "/s/x", Some("after=3")),
            Some(Target::Stream(_, 3))
        ));
        // Another stream's id says nothing of this one.
        let other = format!("last_event_id=sg1-{}-9", tok('b').hex());
        assert!(matches!(
            target("/s", Some(t), "/s/x", Some(&other)),
            Some(Target::Stream(_, 0))
        ));
    }

    #[test]
    fn the_prefix_is_the_session_with_a_position_per_stream() {
        let q = format!(
            "last_event_id=sg1-{}-2&last_event_id=sg1-{}-5",
            tok('a').hex(),
            tok('b').hex()
        );
        match target("/s", None, "/s", Some(&q)) {
            Some(Target::Session(p)) => {
                assert_eq!(p.get(&tok('a')), Some(&2));
                assert_eq!(p.get(&tok('b')), Some(&5));
            }
            other => panic!("{other:?}"),
        }
        assert!(target("/s", None, "/s/other", None).is_none());
    }

    #[test]
    fn only_a_get_with_both_upgrade_headers_is_a_websocket() {
        let req = |m: Method, up: &str, conn: &str| {
            Request::builder()
                .method(m)
                .header(header::UPGRADE, up)
                .header(header::CONNECTION, conn)
                .body(())
                .unwrap()
        };
        assert!(is_websocket(&req(Method::GET, "websocket", "keep-alive, Upgrade")));
        assert!(!is_websocket(&req(Method::POST, "websocket", "upgrade")));
        assert!(!is_websocket(&req(Method::GET, "h2c", "upgrade")));
        assert!(!is_websocket(&req(Method::GET, "websocket", "keep-alive")));
    }
}
