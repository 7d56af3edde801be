//! The checks of the `edge` fuzz target (the HTTP edge the gateway owns: agent ids from headers and JSON bodies,
//! the upstream path under the prefix, forwarded-header rewriting), shared with `tests/fuzz_regressions.rs`
//! (which includes this file by path), so a saved input replays exactly as the fuzzer saw it.
//!
//! Input layout (see fuzz/README.md): byte 0 flags (bit 0 trust forwarded headers, bit 1 IPv6 peer, bit 2 JSON
//! Content-Type, bit 3 a 64-byte body bound instead of 64 KiB), byte 1 the peer's last octet, then five fields
//! separated by 0xFF bytes (which no header value or UTF-8 text holds): the upstream path prefix, the client's
//! path and query, the X-Forwarded-For lines (separated by `\n`), the agent header's value, the request body.
//!
//! Asserts: no panic; an agent id taken from the request is non-empty and passes `ids::is_valid`, and a valid
//! header id is never refused; the upstream path starts with the prefix, then `/` (or nothing, for `OPTIONS *`),
//! has no `.` or `..` segment (dots also as `%2e`), and is a valid path-and-query; X-Forwarded-For becomes one
//! line holding every input address in order, then the peer; untrusted `Forwarded` and `X-Real-IP` are gone.

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use sse_gateway::config::UpstreamTarget;
use sse_gateway::envelope::ids;
use sse_gateway::proxy::request::{agent, headers};
use sse_gateway::proxy::upstream::pool;

const HEADER: usize = 2;
const AGENT_HEADER: HeaderName = HeaderName::from_static("x-agent-id");

/// Runs every check on one fuzz input; panics on a violation.
pub fn check(data: &[u8]) {
    if data.len() < HEADER {
        return;
    }
    let (flags, octet) = (data[0], data[1]);
    let mut fields = data[HEADER..].split(|&b| b == 0xFF);
    let mut next = || fields.next().unwrap_or_default();
    let (prefix, path, xff, agent_value, body) = (next(), next(), next(), next(), next());
    check_agent(flags, agent_value, body);
    check_path(prefix, path);
    let peer = if flags & 2 != 0 {
        IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(octet)])
    } else {
        IpAddr::from([192, 0, 2, octet])
    };
    check_forwarded(xff, peer, flags & 1 != 0);
}

fn check_agent(flags: u8, agent_value: &[u8], body: &[u8]) {
    let mut h = HeaderMap::new();
    let header_value = HeaderValue::from_bytes(agent_value).ok();
    if let Some(v) = &header_value {
        h.insert(AGENT_HEADER, v.clone());
    }
    if flags & 4 != 0 {
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    h.insert(http::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let max = if flags & 8 != 0 { 64 } else { 64 << 10 };
    let choice = agent::from_request(&h, body, &AGENT_HEADER, max);
    match &choice.agent {
        Some(id) => assert!(
            !id.is_empty() && ids::is_valid(id),
            "extracted agent id fails ids::is_valid: {id:?}"
        ),
        None => {
            // Nothing taken: then the header held no usable id either.
            let usable = header_value
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .is_some_and(|s| !s.is_empty() && ids::is_valid(s));
            assert!(!usable, "a valid header id was refused: {header_value:?}");
        }
    }
}

/// Whether a path segment is `.` or `..` once `%2e`/`%2E` are read as dots (written apart from the library's own
/// test, so a bug there is not repeated here).
fn is_dot_segment(seg: &str) -> bool {
    let decoded = seg.replace("%2e", ".").replace("%2E", ".");
    decoded == "." || decoded == ".."
}

fn check_path(prefix: &[u8], path: &[u8]) {
    let (Ok(prefix), Ok(pq)) = (std::str::from_utf8(prefix), std::str::from_utf8(path)) else {
        return;
    };
    let Ok(target) = UpstreamTarget::parse(&format!("http://127.0.0.1:9{prefix}")) else {
        return;
    };
    // What hyper hands the gateway is always a valid path-and-query.
    let Ok(pq) = pq.parse::<PathAndQuery>() else {
        return;
    };
    let out = pool::upstream_path(&target.prefix, pq.as_str());
    let rest = out
        .strip_prefix(target.prefix.as_str())
        .unwrap_or_else(|| panic!("{out:?} is not under the prefix {:?}", target.prefix));
    let asterisk = pq.path() == "*";
    assert!(
        rest.starts_with('/') || (asterisk && (rest.is_empty() || rest.starts_with('?') || rest == "*")),
        "{out:?} leaves the prefix {:?} at its last segment",
        target.prefix
    );
    let path_part = out.split('?').next().unwrap_or_default();
    assert!(
        !path_part.split('/').any(is_dot_segment),
        "dot segment in the upstream path {out:?} (client {pq:?})"
    );
    assert!(out.parse::<PathAndQuery>().is_ok(), "not a path-and-query: {out:?}");
}

/// The comma-separated entries of X-Forwarded-For values, trimmed, empty ones skipped.
fn entries<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<Vec<u8>> {
    values
        .flat_map(|v| v.split(|&b| b == b','))
        .map(|e| e.trim_ascii().to_vec())
        .filter(|e| !e.is_empty())
        .collect()
}

fn check_forwarded(xff: &[u8], peer: IpAddr, trust: bool) {
    let mut h = HeaderMap::new();
    for line in xff.split(|&b| b == b'\n') {
        if let Ok(v) = HeaderValue::from_bytes(line) {
            h.append(headers::X_FORWARDED_FOR, v);
        }
    }
    let mut want = entries(h.get_all(headers::X_FORWARDED_FOR).iter().map(HeaderValue::as_bytes));
    want.push(peer.to_string().into_bytes());
    h.insert(http::header::FORWARDED, HeaderValue::from_static("for=198.51.100.1"));
    h.insert(headers::X_REAL_IP, HeaderValue::from_static("198.51.100.1"));
    headers::set_forwarded(&mut h, peer, Some("gw.test"), trust);
    let lines: Vec<&[u8]> = h
        .get_all(headers::X_FORWARDED_FOR)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    assert_eq!(lines.len(), 1, "X-Forwarded-For is one line: {lines:?}");
    let got = entries(lines.into_iter());
    assert_eq!(got, want, "X-Forwarded-For lost, reordered or invented an address");
    if !trust {
        assert!(
            !h.contains_key(http::header::FORWARDED) && !h.contains_key(headers::X_REAL_IP),
            "untrusted Forwarded / X-Real-IP passed"
        );
    }
}
