//! The request head written and the response head read, with the framing each implies (RFC 9112 §6.1–6.3).
//!
//! Sans-I/O. The request's framing follows hyper's client, so a request goes upstream the same on either
//! connection: a `Transfer-Encoding` given wins (ending in `chunked`), then a valid `Content-Length`, then the
//! body's exact size, else chunked (GET, HEAD: no body).

use bytes::{BufMut, Bytes};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Version};

use crate::proxy::request::headers;
use crate::proxy::upstream::dedicated::error::Error;
use crate::proxy::upstream::dedicated::framing::{Chunked, Framing};

/// Header fields a response head may have (hyper's default).
const MAX_HEADERS: usize = 100;

/// How the request body is framed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// Exactly this many bytes (0: no body).
    Length(u64),
    Chunked,
}

/// Writes the request head into `out`, settling the framing headers first. `exact` is the body's exact size
/// when it knows it; `empty` whether it has ended already.
pub fn encode_request(
    method: &Method,
    target: &str,
    headers: &mut HeaderMap,
    exact: Option<u64>,
    empty: bool,
    out: &mut Vec<u8>,
) -> BodyFraming {
    let framing = request_framing(method, headers, exact, empty);
    out.reserve(64 + target.len() + headers.len() * 32);
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers.iter() {
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
    framing
}

fn request_framing(method: &Method, h: &mut HeaderMap, exact: Option<u64>, empty: bool) -> BodyFraming {
    if empty {
        h.remove(header::TRANSFER_ENCODING);
        return BodyFraming::Length(0);
    }
    if h.contains_key(header::TRANSFER_ENCODING) {
        if !ends_chunked(h) {
            h.append(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        }
        h.remove(header::CONTENT_LENGTH);
        return BodyFraming::Chunked;
    }
    match content_length(h) {
        Ok(Some(n)) => return BodyFraming::Length(n),
        Ok(None) => {}
        Err(_) => {
            h.remove(header::CONTENT_LENGTH);
        }
    }
    if let Some(n) = exact {
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
        BodyFraming::Length(n)
    } else if matches!(*method, Method::GET | Method::HEAD) {
        BodyFraming::Length(0)
    } else {
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        BodyFraming::Chunked
    }
}

/// Whether the last transfer coding is `chunked`.
fn ends_chunked(h: &HeaderMap) -> bool {
    h.get_all(header::TRANSFER_ENCODING)
        .iter()
        .next_back()
        .is_some_and(headers::ends_chunked)
}

/// The `Content-Length`: every value (and every comma-separated item) the same decimal number.
fn content_length(h: &HeaderMap) -> Result<Option<u64>, Error> {
    let mut found = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        for item in v.as_bytes().split(|&b| b == b',') {
            let item = item.trim_ascii();
            let n = headers::decimal(item).ok_or(Error::ContentLength)?;
            if found.is_some_and(|f| f != n) {
                return Err(Error::ContentLength);
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// A response head parsed from the start of `buf`: the head, its length in bytes, and how its body is framed.
/// `Ok(None)`: the head is not complete yet. Informational (1xx) heads other than 101 are skipped, as hyper does.
pub fn parse_response(method: &Method, mut buf: &[u8]) -> Result<Option<(Response<()>, usize, Framing)>, Error> {
    let mut skipped = 0;
    loop {
        let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut headers);
        let httparse::Status::Complete(len) = parsed.parse(buf)? else {
            return Ok(None);
        };
        let code = parsed.code.unwrap_or_default();
        if (100..200).contains(&code) && code != 101 {
            buf = &buf[len..];
            skipped += len;
            continue;
        }
        let mut resp = Response::new(());
        *resp.status_mut() = StatusCode::from_u16(code).map_err(|_| Error::Head(httparse::Error::Status))?;
        *resp.version_mut() = if parsed.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        };
        if let Some(reason) = parsed.reason.filter(|r| Some(*r) != resp.status().canonical_reason()) {
            if let Ok(r) = hyper::ext::ReasonPhrase::try_from(Bytes::copy_from_slice(reason.as_bytes())) {
                resp.extensions_mut().insert(r);
            }
        }
        let map = resp.headers_mut();
        map.reserve(parsed.headers.len());
        for h in parsed.headers.iter() {
            let name =
                HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| Error::Head(httparse::Error::HeaderName))?;
            let value = HeaderValue::from_bytes(h.value).map_err(|_| Error::Head(httparse::Error::HeaderValue))?;
            map.append(name, value);
        }
        let framing = response_framing(method, resp.status(), resp.headers())?;
        return Ok(Some((resp, skipped + len, framing)));
    }
}

fn response_framing(method: &Method, status: StatusCode, h: &HeaderMap) -> Result<Framing, Error> {
    if *method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::End);
    }
    if h.contains_key(header::TRANSFER_ENCODING) {
        // Anything but a final `chunked` is read to the close (RFC 9112 §6.3, point 4).
        return Ok(if ends_chunked(h) {
            Framing::Chunked(Chunked::default())
        } else {
            Framing::Close
        });
    }
    Ok(match content_length(h)? {
        Some(0) => Framing::End,
        Some(n) => Framing::Length(n),
        None => Framing::Close,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, headers: &[(&str, &str)], exact: Option<u64>, empty: bool) -> (String, BodyFraming) {
        let mut h = HeaderMap::new();
        for (n, v) in headers {
            h.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let mut out = Vec::new();
        let f = encode_request(&method, "/run?x=1", &mut h, exact, empty, &mut out);
        (String::from_utf8(out).unwrap(), f)
    }

    #[test]
    fn a_request_head_is_written_with_the_framing_hyper_would_choose() {
        let (head, f) = request(
            Method::POST,
            &[("host", "up"), ("x-a", "1"), ("x-a", "2")],
            Some(5),
            false,
        );
        assert_eq!(
            head,
            "POST /run?x=1 HTTP/1.1\r\nhost: up\r\nx-a: 1\r\nx-a: 2\r\ncontent-length: 5\r\n\r\n"
        );
        assert_eq!(f, BodyFraming::Length(5));
        let (head, f) = request(Method::POST, &[("content-length", "7")], None, false);
        assert!(head.contains("content-length: 7\r\n"));
        assert_eq!(f, BodyFraming::Length(7));
        let (head, f) = request(Method::POST, &[("content-length", "7")], None, true);
        assert!(
            head.contains("content-length: 7\r\n") && f == BodyFraming::Length(0),
            "an ended body: none sent"
        );
        let (head, f) = request(Method::POST, &[], None, false);
        assert!(head.contains("transfer-encoding: chunked\r\n"));
        assert_eq!(f, BodyFraming::Chunked);
        let (head, f) = request(Method::GET, &[], None, false);
        assert!(!head.contains("transfer-encoding") && f == BodyFraming::Length(0));
        let (head, f) = request(
            Method::GET,
            &[("transfer-encoding", "gzip"), ("content-length", "3")],
            None,
            false,
        );
        assert!(
            head.contains("transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n"),
            "{head}"
        );
        assert!(!head.contains("content-length") && f == BodyFraming::Chunked);
        let (head, _) = request(Method::PUT, &[("content-length", "1, 2")], Some(4), false);
        assert!(
            head.contains("content-length: 4\r\n") && !head.contains("1, 2"),
            "an invalid length replaced"
        );
    }

    fn response(head: &str) -> Result<Option<(Response<()>, usize, Framing)>, Error> {
        parse_response(&Method::POST, head.as_bytes())
    }

    #[test]
    fn a_response_head_and_its_framing() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n";
        let (resp, len, framing) = response(raw).unwrap().unwrap();
        assert_eq!((resp.status(), resp.version()), (StatusCode::OK, Version::HTTP_11));
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert_eq!(&raw[len..], "5\r\n");
        assert!(matches!(framing, Framing::Chunked(_)));
        let cases = [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                "chunked",
            ),
            ("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "close"),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
                "length 5",
            ),
            ("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "end"),
            ("HTTP/1.0 200 OK\r\n\r\n", "close"),
            ("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", "end"),
            ("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", "end"),
        ];
        for (raw, want) in cases {
            let (_, _, f) = response(raw).unwrap().unwrap();
            let got = match f {
                Framing::Chunked(_) => "chunked".to_string(),
                Framing::Close => "close".into(),
                Framing::End => "end".into(),
                Framing::Length(n) => format!("length {n}"),
                Framing::Failed(why) => format!("failed: {why}"),
            };
            assert_eq!(got, want, "{raw:?}");
        }
        let (_, _, f) = parse_response(&Method::HEAD, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(f.is_end(), "a HEAD response has no body");
    }

    #[test]
    fn informational_heads_are_skipped_but_101_is_kept() {
        let raw =
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\n\r\nx";
        let (resp, len, _) = response(raw).unwrap().unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED);
        assert_eq!(&raw[len..], "x");
        assert!(response("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 2").unwrap().is_none());
        let (resp, _, f) = response("HTTP/1.1 101 Switching Protocols\r\n\r\n").unwrap().unwrap();
        assert!(resp.status() == StatusCode::SWITCHING_PROTOCOLS && f.is_end());
    }

    #[test]
    fn a_custom_reason_is_kept_for_the_client() {
        let (resp, _, _) = response("HTTP/1.1 200 Fine Thanks\r\n\r\n").unwrap().unwrap();
        let reason = resp.extensions().get::<hyper::ext::ReasonPhrase>().expect("kept");
        assert_eq!(reason.as_bytes(), b"Fine Thanks");
        let (resp, _, _) = response("HTTP/1.1 200 OK\r\n\r\n").unwrap().unwrap();
        assert!(resp.extensions().get::<hyper::ext::ReasonPhrase>().is_none());
    }

    #[test]
    fn bad_heads_are_errors() {
        for raw in [
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
            "SSH-2.0-OpenSSH\r\n\r\n",
        ] {
            assert!(response(raw).is_err(), "{raw:?}");
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        assert!(
            response(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")).is_err(),
            "too many fields"
        );
    }
}
