//! What can go wrong on a dedicated upstream connection, and how each failure is counted.

use crate::proxy::request::body::ClientBodyError;
use crate::proxy::upstream::kind::UpstreamErrorKind;
use std::io;
use thiserror::Error;

/// How a dedicated exchange failed.
#[derive(Debug, Error)]
pub enum Error {
    #[error("upstream connection: {0}")]
    Io(#[from] io::Error),
    /// The connection closed before the response (head or body) ended.
    #[error("upstream closed the connection before the response ended")]
    Incomplete,
    #[error("invalid response head: {0}")]
    Head(#[from] httparse::Error),
    #[error("response head over {} bytes", MAX_HEAD)]
    HeadTooLarge,
    #[error("invalid Content-Length")]
    ContentLength,
    #[error("invalid chunked body: {0}")]
    Chunk(&'static str),
    /// The request body sent more or less than its `Content-Length`.
    #[error("request body does not match its Content-Length")]
    BodyLength,
    /// The client's request body failed (the client's fault, marked by `ClientBody`).
    #[error("request body failed")]
    ClientBody(#[source] ClientBodyError),
}

impl Error {
    /// For `upstream_errors_total{kind}`: bad framing is a protocol error, a cut connection a reset.
    pub fn kind(&self) -> UpstreamErrorKind {
        match self {
            Error::Io(e) if e.kind() == io::ErrorKind::TimedOut => UpstreamErrorKind::Timeout,
            Error::Io(_) | Error::Incomplete | Error::ClientBody(_) => UpstreamErrorKind::Reset,
            Error::Head(_) | Error::HeadTooLarge | Error::ContentLength | Error::Chunk(_) | Error::BodyLength => {
                UpstreamErrorKind::Protocol
            }
        }
    }
}

/// Bytes a response head may take (hyper's client default), 1xx heads included.
pub const MAX_HEAD: usize = 8192 + 4096 * 100;
