//! Per-request choice of wire format and of the upstream dialect, and which responses are translated.

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode, Uri};
use thiserror::Error;

use crate::config::StreamFormat;
use crate::frontend::Protocol;
use crate::proxy::request::headers::{X_STREAM_DIALECT, X_STREAM_FORMAT};
use crate::translate::Dialect;

label_enum! {
    /// What the gateway did with a response body; the `mode` label.
    pub enum Mode {
        Translate = "translate",
        Passthrough = "passthrough",
        Shadow = "shadow",
    }
}

/// The query parameter that chooses the format when the header is absent.
pub const QUERY_PARAM: &str = "stream_format";
/// The query parameter that chooses the dialect when the header is absent.
pub const DIALECT_PARAM: &str = "stream_dialect";

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum NegotiateError {
    #[error("X-Stream-Format must be json, legacy, ai-sdk or ag-ui")]
    BadHeader,
    #[error("stream_format must be json, legacy, ai-sdk or ag-ui")]
    BadQuery,
    #[error("X-Stream-Dialect must be auto, xml, raw, cogency or agent_sdk")]
    BadDialectHeader,
    #[error("stream_dialect must be auto, xml, raw, cogency or agent_sdk")]
    BadDialectQuery,
}

impl NegotiateError {
    /// The `error` code of the 400 answer.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadHeader | Self::BadQuery => "bad_stream_format",
            Self::BadDialectHeader | Self::BadDialectQuery => "bad_stream_dialect",
        }
    }
}

fn parse_format(v: &str) -> Option<StreamFormat> {
    // A frontend's protocol is the envelope stream encoded once more: translated.
    if v.eq_ignore_ascii_case("json") || Protocol::parse(v).is_some() {
        Some(StreamFormat::Json)
    } else if v.eq_ignore_ascii_case("legacy") {
        Some(StreamFormat::Legacy)
    } else {
        None
    }
}

/// A dialect's name, in any ASCII case (as the format's).
fn parse_dialect(v: &str) -> Option<Dialect> {
    Dialect::ALL.into_iter().find(|d| v.eq_ignore_ascii_case(d.as_str()))
}

/// The value of `header`, else of the query parameter `param`, parsed: `None` when neither is there, a bad value
/// the error of where it came from.
fn choice<T>(
    headers: &HeaderMap,
    uri: &Uri,
    (header, param): (&HeaderName, &str),
    parse: fn(&str) -> Option<T>,
    (bad_header, bad_query): (NegotiateError, NegotiateError),
) -> Result<Option<T>, NegotiateError> {
    if let Some(v) = headers.get(header) {
        return v
            .to_str()
            .ok()
            .and_then(|s| parse(s.trim()))
            .map(Some)
            .ok_or(bad_header);
    }
    let query = uri.query().unwrap_or("");
    for pair in query.split('&') {
        if let Some(v) = pair.strip_prefix(param).and_then(|r| r.strip_prefix('=')) {
            return parse(v).map(Some).ok_or(bad_query);
        }
    }
    Ok(None)
}

/// What the client asked for: the `X-Stream-Format` header, else `stream_format=` in the query, else the default.
pub fn requested(headers: &HeaderMap, uri: &Uri, default: StreamFormat) -> Result<StreamFormat, NegotiateError> {
    let asked = choice(
        headers,
        uri,
        (&X_STREAM_FORMAT, QUERY_PARAM),
        parse_format,
        (NegotiateError::BadHeader, NegotiateError::BadQuery),
    )?;
    Ok(asked.unwrap_or(default))
}

/// The frontend protocol the client asked its response in (`X-Stream-Format: ai-sdk | ag-ui`, else
/// `stream_format=`), keeping its request as it is (response-only encoding).
pub fn requested_protocol(headers: &HeaderMap, uri: &Uri) -> Option<Protocol> {
    choice(
        headers,
        uri,
        (&X_STREAM_FORMAT, QUERY_PARAM),
        Protocol::parse,
        (NegotiateError::BadHeader, NegotiateError::BadQuery),
    )
    .ok()
    .flatten()
}

/// The dialect the client named for its stream's translator: the `X-Stream-Dialect` header, else
/// `stream_dialect=` in the query; `None` when it named none (`translate.dialect` applies).
pub fn requested_dialect(headers: &HeaderMap, uri: &Uri) -> Result<Option<Dialect>, NegotiateError> {
    choice(
        headers,
        uri,
        (&X_STREAM_DIALECT, DIALECT_PARAM),
        parse_dialect,
        (NegotiateError::BadDialectHeader, NegotiateError::BadDialectQuery),
    )
}

/// Whether a response head is an event stream we can translate (uncompressed, with a body).
pub fn is_translatable(method: &Method, status: StatusCode, headers: &HeaderMap) -> bool {
    if method == Method::HEAD || !status.is_success() || status == StatusCode::NO_CONTENT {
        return false;
    }
    if !is_event_stream(headers) {
        return false;
    }
    // An encoded body is opaque to us: pass it through rather than translate garbage.
    match headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(enc) => enc.trim().eq_ignore_ascii_case("identity"),
    }
}

/// `Content-Type: text/event-stream` (parameters ignored).
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(is_event_stream_type)
}

/// A media type (no parameters) naming `text/event-stream`.
fn is_event_stream_type(media: &str) -> bool {
    media.trim().eq_ignore_ascii_case("text/event-stream")
}

/// Whether the request's `Accept` lists `text/event-stream` (not with `q=0`): EventSource and the SSE client
/// libraries send it, so the response is most likely a long event stream.
pub fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.split_once('=').is_some_and(|(k, v)| {
                    k.trim().eq_ignore_ascii_case("q") && v.trim().parse::<f32>().is_ok_and(|q| q == 0.0)
                })
            });
            is_event_stream_type(media) && !refused
        })
}

/// The body mode for a response: translated event streams for JSON requests (or shadowed), else pass-through.
pub fn body_mode(wants: StreamFormat, shadow: bool, translatable: bool) -> Mode {
    match (translatable, wants, shadow) {
        (true, StreamFormat::Json, false) => Mode::Translate,
        (true, StreamFormat::Json, true) => Mode::Shadow,
        _ => Mode::Passthrough,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    fn accept(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn an_event_stream_is_expected_when_accept_lists_it() {
        assert!(accepts_event_stream(&accept(&["text/event-stream"])));
        assert!(accepts_event_stream(&accept(&[
            "application/json, Text/Event-Stream;q=0.5"
        ])));
        assert!(accepts_event_stream(&accept(&[
            "application/json",
            "text/event-stream"
        ])));
        assert!(!accepts_event_stream(&accept(&[])));
        assert!(!accepts_event_stream(&accept(&["*/*"])));
        assert!(!accepts_event_stream(&accept(&["application/json"])));
        assert!(!accepts_event_stream(&accept(&["text/event-stream; q=0"])));
        assert!(!accepts_event_stream(&accept(&["text/event-streams"])));
    }

    #[test]
    fn header_beats_query_beats_default() {
        let mut h = HeaderMap::new();
        let u = uri("/agent/run?a=1&stream_format=legacy");
        assert_eq!(requested(&h, &u, StreamFormat::Json), Ok(StreamFormat::Legacy));
        h.insert(X_STREAM_FORMAT, HeaderValue::from_static("JSON"));
        assert_eq!(requested(&h, &u, StreamFormat::Legacy), Ok(StreamFormat::Json));
        assert_eq!(
            requested(&HeaderMap::new(), &uri("/x"), StreamFormat::Legacy),
            Ok(StreamFormat::Legacy)
        );
        assert_eq!(
            requested(&HeaderMap::new(), &uri("/x?stream_format=xml"), StreamFormat::Json),
            Err(NegotiateError::BadQuery)
        );
        // A parameter that merely starts with the name is not it.
        assert_eq!(
            requested(&HeaderMap::new(), &uri("/x?stream_formats=legacy"), StreamFormat::Json),
            Ok(StreamFormat::Json)
        );
    }

    #[test]
    fn a_dialect_is_named_by_header_else_query_in_any_case_and_a_bad_one_is_refused() {
        let none = HeaderMap::new();
        assert_eq!(requested_dialect(&none, &uri("/x")), Ok(None));
        assert_eq!(
            requested_dialect(&none, &uri("/x?a=1&stream_dialect=agent_sdk")),
            Ok(Some(Dialect::AgentSdk))
        );
        for d in Dialect::ALL {
            let mut h = HeaderMap::new();
            h.insert(
                X_STREAM_DIALECT,
                HeaderValue::from_str(&d.as_str().to_uppercase()).unwrap(),
            );
            // The header wins over the query.
            assert_eq!(requested_dialect(&h, &uri("/x?stream_dialect=bogus")), Ok(Some(d)));
        }
        let mut h = HeaderMap::new();
        h.insert(X_STREAM_DIALECT, HeaderValue::from_static(" cogency "));
        assert_eq!(requested_dialect(&h, &uri("/x")), Ok(Some(Dialect::Cogency)));
        h.insert(X_STREAM_DIALECT, HeaderValue::from_static("json"));
        let e = requested_dialect(&h, &uri("/x")).unwrap_err();
        assert_eq!(
            (e.clone(), e.code()),
            (NegotiateError::BadDialectHeader, "bad_stream_dialect")
        );
        assert_eq!(
            requested_dialect(&none, &uri("/x?stream_dialect=")),
            Err(NegotiateError::BadDialectQuery)
        );
        assert_eq!(
            requested_dialect(&none, &uri("/x?stream_dialects=xml")),
            Ok(None),
            "a parameter that merely starts with the name is not it"
        );
    }

    #[test]
    fn only_plain_successful_event_streams_translate() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        assert!(is_translatable(&Method::POST, StatusCode::OK, &h));
        assert!(!is_translatable(&Method::HEAD, StatusCode::OK, &h));
        assert!(!is_translatable(&Method::GET, StatusCode::BAD_GATEWAY, &h));
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(!is_translatable(&Method::GET, StatusCode::OK, &h));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.remove(header::CONTENT_ENCODING);
        assert!(!is_translatable(&Method::GET, StatusCode::OK, &h));
    }
}
