//! Header rewriting at the proxy boundary: hop-by-hop removal (RFC 9110 §7.6.1) and X-Forwarded-*.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Hop-by-hop fields named by RFC 9110 §7.6.1 (plus the obsolete ones proxies still see); they describe one
/// connection and are never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const X_STREAM_FORMAT: HeaderName = HeaderName::from_static("x-stream-format");
pub const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// Removes the hop-by-hop fields and every field the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Collect first: the names listed in Connection are removed along with Connection itself.
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Sets X-Forwarded-For (appending the peer), -Proto and -Host for the upstream.
///
/// `host` is what the client addressed (Host header or HTTP/2 authority). With `trust` false an earlier
/// proxy's -Proto/-Host are replaced by what this hop saw; -For is always appended to, as is customary.
pub fn set_forwarded(headers: &mut HeaderMap, peer: IpAddr, host: Option<&str>, trust: bool) {
    let peer = peer.to_string();
    let xff = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) if !prev.trim().is_empty() => format!("{prev}, {peer}"),
        _ => peer,
    };
    if let Ok(v) = HeaderValue::from_str(&xff) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if !(trust && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if !(trust && headers.contains_key(&X_FORWARDED_HOST)) {
        match host.and_then(|h| HeaderValue::from_str(h).ok()) {
            Some(v) => {
                headers.insert(X_FORWARDED_HOST, v);
            }
            None => {
                headers.remove(X_FORWARDED_HOST);
            }
        }
    }
}

/// The host the client addressed: the URI authority (HTTP/2, absolute-form) or the Host header.
pub fn client_host<B>(req: &http::Request<B>) -> Option<String> {
    if let Some(a) = req.uri().authority() {
        return Some(a.as_str().to_owned());
    }
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_listed_and_standard_hop_by_hop() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("close, X-Secret"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("x-kept", HeaderValue::from_static("yes"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn forwarded_for_appends_and_proto_is_overwritten_unless_trusted() {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        set_forwarded(&mut h, "127.0.0.1".parse().unwrap(), Some("example.test"), false);
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.test");
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        set_forwarded(&mut h, "127.0.0.1".parse().unwrap(), Some("other"), true);
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "example.test");
    }
}
