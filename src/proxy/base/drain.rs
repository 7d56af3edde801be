//! The drain deadline: what a response still open when `server.drain_timeout_secs` runs out does before exit.
//!
//! A translated stream can say why it ends: it gets one `error` envelope (delta `gateway_draining`) and a clean
//! end of body, so the client knows to reconnect (to another instance) rather than treat the answer as complete
//! or the connection as broken. A pass-through stream cannot say anything in-band: it is aborted, as a cut
//! connection would be.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use thiserror::Error;
use tokio::sync::watch;

use crate::envelope::write_gateway_error;

/// The `message` of the `gateway_draining` delta: payload-free, the same for every stream.
pub const DRAINING_MESSAGE: &str = "the gateway is shutting down and closed this stream; reconnect to continue";

/// The drain signal, carried in a request's extensions to what outlives its response (an upgraded socket): it
/// turns true when the drain starts, and the gateway waits for every holder to drop it.
#[derive(Clone)]
pub struct DrainSignal(pub watch::Receiver<bool>);

/// What a response body does at the drain deadline.
pub enum DrainCut {
    /// A translated stream: its last frame (the `gateway_draining` envelope); the body ends after it.
    Final(Bytes),
    /// A stream that cannot say so in-band: the response is aborted.
    Abort,
    /// Nothing to cut (a small body made by the gateway, or a stream that already ended).
    Nothing,
}

/// The error a pass-through response is aborted with at the drain deadline.
#[derive(Debug, Error)]
#[error("drain timeout reached: stream closed")]
pub struct DrainTimeout;

/// A future that resolves once the drain deadline has been signalled on `cut` (never, if its sender goes away
/// without signalling: that is a gateway that stopped without a drain deadline).
pub type Deadline = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

pub fn deadline(mut cut: watch::Receiver<bool>) -> Deadline {
    Box::pin(async move {
        if cut.wait_for(|reached| *reached).await.is_err() {
            std::future::pending::<()>().await;
        }
    })
}

/// Writes the `gateway_draining` envelope of `agent`'s stream: the same shape as the translator's
/// `upstream_error` envelopes (an `error` envelope, `final: true`, its delta compact JSON with `type` first).
/// Returns the size of its JSON object.
pub fn write_draining_envelope(out: &mut Vec<u8>, agent: &str, message: &str) -> usize {
    write_gateway_error(out, agent, "gateway_draining", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::{Options, Translator};

    #[test]
    fn the_draining_envelope_is_shaped_like_the_translators_upstream_error() {
        let mut t = Translator::new(Options::default(), "agent-1");
        let mut upstream_error = Vec::new();
        t.abort("a message", &mut upstream_error);
        let mut draining = Vec::new();
        let n = write_draining_envelope(&mut draining, t.agent(), "a message");
        let draining = String::from_utf8(draining).unwrap();
        assert_eq!(
            draining,
            String::from_utf8(upstream_error)
                .unwrap()
                .replace("upstream_error", "gateway_draining")
        );
        assert_eq!(n, draining.len() - "data: ".len() - "\n\n".len());
        assert!(draining.starts_with(
            r#"data: {"type":"error","agent":"agent-1","final":true,"delta":"{\"type\":\"gateway_draining\",\"message\":\"a message\"}"#
        ));
    }
}
