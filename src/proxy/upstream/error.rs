//! Why an upstream stream failed, as it travels up the stack: classified for `upstream_errors_total{kind}`,
//! described for the error envelope, and turned into the error that aborts a client response.

use std::borrow::Cow;
use std::io::ErrorKind;

use thiserror::Error;

use crate::proxy::upstream::dedicated;
use crate::proxy::upstream::kind::UpstreamErrorKind;

/// The description of an idle timeout, in the error envelope and as the abort's error.
pub const IDLE_MESSAGE: &str = "upstream sent nothing within upstream.idle_timeout_secs";

/// The description of an upstream that closed mid-response, on either kind of connection.
const CLOSED_EARLY: &str = "upstream connection closed before the response ended";

/// An upstream stream's failure.
#[derive(Debug, Error)]
pub enum StreamError {
    /// A pooled upstream body failed (reset, early close, bad framing, timeout).
    #[error(transparent)]
    Upstream(#[from] hyper::Error),
    /// A dedicated connection failed.
    #[error(transparent)]
    Connection(#[from] dedicated::error::Error),
    /// The upstream sent nothing for `upstream.idle_timeout_secs`.
    #[error("{IDLE_MESSAGE}")]
    IdleTimeout,
}

impl StreamError {
    /// For `upstream_errors_total{kind}`.
    pub fn kind(&self) -> UpstreamErrorKind {
        match self {
            StreamError::Upstream(e) => body_error_kind(e),
            StreamError::Connection(e) => e.kind(),
            StreamError::IdleTimeout => UpstreamErrorKind::Timeout,
        }
    }

    /// A short, payload-free description for the error envelope.
    pub fn message(&self) -> Cow<'static, str> {
        match self {
            StreamError::Upstream(e) if e.is_incomplete_message() => CLOSED_EARLY.into(),
            StreamError::Connection(dedicated::error::Error::Incomplete) => CLOSED_EARLY.into(),
            StreamError::Upstream(e) if e.is_timeout() => "upstream timed out".into(),
            StreamError::Upstream(_) | StreamError::Connection(_) => {
                format!("upstream connection failed: {self}").into()
            }
            StreamError::IdleTimeout => IDLE_MESSAGE.into(),
        }
    }

    /// The error a client response is aborted with: hyper's own, or the idle timeout's description.
    pub fn into_body_error(self) -> BodyError {
        match self {
            StreamError::IdleTimeout => IDLE_MESSAGE.into(),
            e => Box::new(e),
        }
    }

    /// Logs the failure in the request's span.
    pub fn log(&self, span: &tracing::Span) {
        match self {
            StreamError::IdleTimeout => tracing::warn!(parent: span, "upstream idle timeout"),
            e => {
                tracing::warn!(parent: span, error = %crate::telemetry::error_chain(e), "upstream body failed mid-stream")
            }
        }
    }
}

/// How an upstream body failed, for `upstream_errors_total{kind}`: bad framing (hyper reports it as an I/O error
/// of kind InvalidData or InvalidInput) is a protocol error, a timeout
/// a timeout, anything else (reset, early close) a reset.
fn body_error_kind(e: &hyper::Error) -> UpstreamErrorKind {
    if e.is_timeout() {
        return UpstreamErrorKind::Timeout;
    }
    let bad_framing = std::iter::successors(std::error::Error::source(e), |&err| err.source())
        .filter_map(|err| err.downcast_ref::<std::io::Error>())
        .any(|io| matches!(io.kind(), ErrorKind::InvalidData | ErrorKind::InvalidInput));
    if e.is_parse() || bad_framing {
        UpstreamErrorKind::Protocol
    } else {
        UpstreamErrorKind::Reset
    }
}

/// Error type of response bodies: an upstream failure in a pass-through body aborts the client response.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_timeout_is_a_timeout_described_without_payload() {
        let e = StreamError::IdleTimeout;
        assert_eq!(e.kind(), UpstreamErrorKind::Timeout);
        assert_eq!(e.message(), IDLE_MESSAGE);
        assert_eq!(e.into_body_error().to_string(), IDLE_MESSAGE);
    }
}
