//! The client's request body on its way upstream: a stall timeout, and failures marked as the client's.
//!
//! hyper's client reports a failed request body as its own error (the request to the upstream failed), so
//! without a mark a client's malformed or stalled upload would look like an upstream failure. The mark is
//! this module's error type in the error's source chain.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body::{Body, Frame};
use thiserror::Error;
use tokio::time::{Instant, Sleep};

use http_body_util::combinators::BoxBody;

label_enum! {
    /// The `kind` label of `client_errors_total`: requests that failed through the client's fault, kept apart
    /// from the upstream's so that no client can raise upstream-health alerts.
    pub enum ClientErrorKind {
        /// The request body broke its framing (answered 400).
        BadBody = "bad_body",
        /// The request body stalled past `server.body_read_timeout_secs` (answered 408).
        BodyTimeout = "body_timeout",
        /// The client closed its connection before its request body ended.
        BodyIncomplete = "body_incomplete",
        /// An HTTP/1.1 request with no `Host` header or more than one (answered 400).
        BadHost = "bad_host",
    }
}

/// Why the client's request body failed.
#[derive(Debug, Error)]
pub enum ClientBodyError {
    /// No byte of the body for `server.body_read_timeout_secs`.
    #[error("request body stalled for {0:?}")]
    Timeout(Duration),
    /// The body as hyper read it from the client failed (bad framing, or the client left mid-body).
    #[error("request body failed: {0}")]
    Failed(#[source] hyper::Error),
}

impl ClientBodyError {
    pub fn kind(&self) -> ClientErrorKind {
        match self {
            ClientBodyError::Timeout(_) => ClientErrorKind::BodyTimeout,
            ClientBodyError::Failed(e) if left_mid_body(e) => ClientErrorKind::BodyIncomplete,
            ClientBodyError::Failed(_) => ClientErrorKind::BadBody,
        }
    }
}

/// Whether a body error is the client's connection ending (as opposed to bytes that break the framing).
fn left_mid_body(e: &hyper::Error) -> bool {
    use std::io::ErrorKind::*;
    let io = std::iter::successors(e.source(), |&s| s.source()).find_map(|s| s.downcast_ref::<std::io::Error>());
    e.is_incomplete_message()
        || io.is_some_and(|io| {
            matches!(
                io.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
            )
        })
}

/// The status and error code the gateway answers a client fault with.
pub fn answer(kind: ClientErrorKind) -> (StatusCode, &'static str) {
    match kind {
        ClientErrorKind::BodyTimeout => (StatusCode::REQUEST_TIMEOUT, "request_body_timeout"),
        ClientErrorKind::BadBody | ClientErrorKind::BodyIncomplete => (StatusCode::BAD_REQUEST, "bad_request_body"),
        ClientErrorKind::BadHost => (StatusCode::BAD_REQUEST, "bad_host"),
    }
}

/// The client's fault, if an error (or one of its causes) is a request body failure.
pub fn client_fault(e: &(dyn StdError + 'static)) -> Option<ClientErrorKind> {
    std::iter::successors(Some(e), |&err| err.source())
        .find_map(|err| err.downcast_ref::<ClientBodyError>())
        .map(ClientBodyError::kind)
}

/// Whether the client's request body has failed, shared with the response body: once the upstream has answered,
/// hyper hands the response body only a generic error when the request body breaks, so the response side asks
/// here whose fault the broken exchange was. It also tells whether the upstream side is waiting for the client's
/// body right now: a response timeout then is the client's stall, not the upstream's slowness.
#[derive(Debug, Clone, Default)]
pub struct ClientFault(Arc<FaultState>);

#[derive(Debug, Default)]
struct FaultState {
    /// `kind as u8 + 1`, or 0 for none yet.
    kind: AtomicU8,
    /// The body was asked for data the client has not sent yet.
    waiting: AtomicBool,
}

impl ClientFault {
    /// Records the client's fault.
    pub fn mark(&self, kind: ClientErrorKind) {
        self.0.kind.store(kind as u8 + 1, Ordering::Relaxed);
    }

    /// The client's fault, if its request body failed.
    pub fn get(&self) -> Option<ClientErrorKind> {
        let marked = usize::from(self.0.kind.load(Ordering::Relaxed));
        ClientErrorKind::ALL.get(marked.checked_sub(1)?).copied()
    }

    /// Whether the upstream side is waiting for the client's body (it stalls mid-upload).
    pub fn waiting_for_client(&self) -> bool {
        self.0.waiting.load(Ordering::Relaxed)
    }

    fn set_waiting(&self, waiting: bool) {
        self.0.waiting.store(waiting, Ordering::Relaxed);
    }
}

/// The request body sent upstream: the client's body with a stall timeout, its errors marked.
pub struct ClientBody {
    inner: UpstreamBody,
    timeout: Duration,
    /// Armed when a poll finds no data: the stall clock runs only while the upstream side waits for the client
    /// (a slow upstream that stops polling the body must not count against the client).
    stall: Option<Pin<Box<Sleep>>>,
    armed: bool,
    fault: ClientFault,
}

impl ClientBody {
    pub fn new(inner: UpstreamBody, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stall: None,
            armed: false,
            fault: ClientFault::default(),
        }
    }

    /// The mark this body sets when it fails, for the response side.
    pub fn fault(&self) -> ClientFault {
        self.fault.clone()
    }

    /// Marks the fault for the response side and returns the error.
    fn failed(&self, e: ClientBodyError) -> ClientBodyError {
        self.fault.mark(e.kind());
        e
    }

    /// Whether the client has been silent past the timeout since this wait began.
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        let deadline = Instant::now() + self.timeout;
        let sleep = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            sleep.as_mut().reset(deadline);
            self.armed = true;
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        this.fault.set_waiting(polled.is_pending());
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                this.armed = false;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(this.failed(ClientBodyError::Failed(e))))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending if this.stalled(cx) => {
                let timeout = ClientBodyError::Timeout(this.timeout);
                Poll::Ready(Some(Err(this.failed(timeout))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    body_hints_from!(inner);
}

/// The client's body as the upstream request takes it: streamed as is, or a small body already read (sent
/// wrapped in a `ClientBody`).
pub type UpstreamBody = BoxBody<Bytes, hyper::Error>;

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A body that never yields.
    struct Silent;

    impl Body for Silent {
        type Data = Bytes;
        type Error = hyper::Error;

        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_body_fails_with_a_timeout_that_is_the_clients_fault() {
        let mut body = ClientBody::new(Silent.boxed(), Duration::from_secs(60));
        let e = body.frame().await.expect("a frame").expect_err("a timeout");
        assert!(matches!(e, ClientBodyError::Timeout(_)));
        let wrapped: Box<dyn StdError + Send + Sync> = Box::new(e);
        assert_eq!(client_fault(&*wrapped), Some(ClientErrorKind::BodyTimeout));
    }

    #[tokio::test(start_paused = true)]
    async fn the_stall_clock_starts_when_the_body_is_waited_for() {
        let full = http_body_util::Full::new(Bytes::from_static(b"x")).map_err(|never| match never {});
        let mut body = ClientBody::new(full.boxed(), Duration::from_secs(1));
        // Long after the body was made (an upstream slow to read it), data already there is no stall.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(body.frame().await.expect("a frame").is_ok());
        assert!(body.frame().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_the_upstream_waits_for_says_so_until_data_comes() {
        let mut silent = ClientBody::new(Silent.boxed(), Duration::from_secs(60));
        let fault = silent.fault();
        assert!(!fault.waiting_for_client());
        let waited = tokio::time::timeout(Duration::from_millis(10), silent.frame()).await;
        assert!(waited.is_err(), "no data yet");
        assert!(fault.waiting_for_client());
        let full = http_body_util::Full::new(Bytes::from_static(b"x")).map_err(|never| match never {});
        let mut body = ClientBody::new(full.boxed(), Duration::from_secs(60));
        let fault = body.fault();
        assert!(body.frame().await.expect("a frame").is_ok());
        assert!(!fault.waiting_for_client());
    }

    #[test]
    fn other_errors_are_not_the_clients() {
        let e = std::io::Error::other("connection refused");
        assert_eq!(client_fault(&e), None);
    }
}
