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
pub const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const X_STREAM_FORMAT: HeaderName = HeaderName::from_static("x-stream-format");
/// The request's choice of upstream dialect: the gateway's own, never forwarded (as `X-Stream-Format`).
pub const X_STREAM_DIALECT: HeaderName = HeaderName::from_static("x-stream-dialect");
pub const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");

/// A `Content-Length` item: decimal digits only (no sign, no space), within `u64`.
pub fn decimal(item: &[u8]) -> Option<u64> {
    if item.is_empty() || !item.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(item).ok()?.parse().ok()
}

/// Whether a `Transfer-Encoding` value's last coding is `chunked` (hyper's rule: a value that is not visible ASCII
/// is not).
pub fn ends_chunked(v: &HeaderValue) -> bool {
    v.to_str()
        .ok()
        .and_then(|v| v.rsplit(',').next())
        .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

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
/// `host` is what the client addressed (Host header or HTTP/2 authority). -For keeps every line the client sent,
/// joined in order, then the peer (nginx's `$proxy_add_x_forwarded_for`): a proxy in front that appends a line
/// of its own (HAProxy's `option forwardfor`) must not lose it to the client's. With `trust` false an earlier
/// proxy's -Proto/-Host are replaced by what this hop saw, and `Forwarded` and `X-Real-IP`, which this hop does
/// not write, are removed: only a load balancer you run may set them.
pub fn set_forwarded(headers: &mut HeaderMap, peer: IpAddr, host: Option<&str>, trust: bool) {
    let xff = forwarded_for(headers, peer);
    if let Ok(v) = HeaderValue::from_bytes(&xff) {
        headers.insert(X_FORWARDED_FOR, v);
    }
    if !trust {
        headers.remove(header::FORWARDED);
        headers.remove(X_REAL_IP);
    }
    if !(trust && headers.contains_key(&X_FORWARDED_PROTO)) {
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    }
    if !(trust && headers.contains_key(&X_FORWARDED_HOST)) {
        match host.and_then(|h| HeaderValue::from_str(h).ok()) {
            Some(v) => headers.insert(X_FORWARDED_HOST, v),
            None => headers.remove(X_FORWARDED_HOST),
        };
    }
}

/// Every X-Forwarded-For line of `headers` (trimmed, blank ones skipped), joined by ", " in order, then `peer`.
/// Bytes, not `str`: a line with obs-text is kept as sent rather than dropped.
pub fn forwarded_for(headers: &HeaderMap, peer: IpAddr) -> Vec<u8> {
    let peer = peer.to_string();
    let mut out = Vec::new();
    for line in headers.get_all(&X_FORWARDED_FOR) {
        let line = line.as_bytes().trim_ascii();
        if line.is_empty() {
            continue;
        }
        out.extend_from_slice(line);
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(peer.as_bytes());
    out
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

    /// A header map of `lines`, in order, a name given twice kept twice (as a client would send them).
    fn headers(lines: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in lines {
            h.append(*name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn strips_listed_and_standard_hop_by_hop() {
        let mut h = headers(&[
            ("connection", "close, X-Secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn forwarded_for_appends_and_proto_is_overwritten_unless_trusted() {
        let mut h = headers(&[("x-forwarded-for", "10.0.0.1"), ("x-forwarded-proto", "https")]);
        set_forwarded(&mut h, "127.0.0.1".parse().unwrap(), Some("example.test"), false);
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.test");
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        set_forwarded(&mut h, "127.0.0.1".parse().unwrap(), Some("other"), true);
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(h["x-forwarded-host"], "example.test");
    }

    #[test]
    fn every_forwarded_for_line_is_kept_in_order_then_the_peer() {
        let mut h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", " "),
            ("x-forwarded-for", "203.0.113.7, 10.0.0.2 "),
        ]);
        set_forwarded(&mut h, "10.0.0.9".parse().unwrap(), None, false);
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
        assert_eq!(h["x-forwarded-for"], "6.6.6.6, 203.0.113.7, 10.0.0.2, 10.0.0.9");
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        set_forwarded(&mut h, "::1".parse().unwrap(), None, false);
        assert_eq!(h["x-forwarded-for"].as_bytes(), b"caf\xe9, ::1");
    }

    #[test]
    fn forwarded_and_x_real_ip_pass_only_when_trusted() {
        let with = || headers(&[("forwarded", "for=6.6.6.6;proto=https"), ("x-real-ip", "6.6.6.6")]);
        let mut h = with();
        set_forwarded(&mut h, "127.0.0.1".parse().unwrap(), None, false);
        assert!(!h.contains_key("forwarded") && !h.contains_key("x-real-ip"), "{h:?}");
        let mut h = with();
        set_forwarded(&mut h, "127.0.0.1".parse().unwrap(), None, true);
        assert_eq!(h["forwarded"], "for=6.6.6.6;proto=https");
        assert_eq!(h["x-real-ip"], "6.6.6.6");
    }
}
