//! Encoding for a frontend (DESIGN 5.3): the held envelope stream read as the client's protocol asks
//! (`frontend::Encoder`), above `Hold` so what is held stays envelopes and every reader (the first, a resumed
//! chat) encodes for itself. Without an encoder the layer passes frames on untouched. When the stream ends it tells
//! `Learn` what the next turn needs (the run's agent, the calls it awaits).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::frontend::Encoder;
use crate::proxy::base::drain::DrainCut;
use crate::proxy::body::layer::{Drain, Ending, Layer, Polled, Totals};

/// Told once, when the stream ends: the run's root agent and the calls it ended awaiting.
pub type Learn = Box<dyn FnOnce(Option<&str>, Option<&[String]>) + Send>;

/// The frontend's encoding of layer `L`.
pub struct Encode<L> {
    inner: L,
    encoder: Option<Box<Encoder>>,
    learn: Option<Learn>,
    ended: bool,
}

impl<L> Encode<L> {
    /// No encoding: frames pass on untouched.
    pub fn none(inner: L) -> Self {
        Self {
            inner,
            encoder: None,
            learn: None,
            ended: false,
        }
    }

    /// Encodes from now on (set before the first frame is read).
    pub fn set(&mut self, encoder: Encoder, learn: Option<Learn>) {
        self.encoder = Some(Box::new(encoder));
        self.learn = learn;
    }

    pub fn inner_mut(&mut self) -> &mut L {
        &mut self.inner
    }

    /// The stream ended: the protocol's end, and what the next turn needs, told once.
    fn end(&mut self) -> Option<Bytes> {
        self.ended = true;
        let encoder = self.encoder.as_mut()?;
        let mut out = Vec::new();
        encoder.finish(&mut out);
        if let Some(learn) = self.learn.take() {
            learn(encoder.root_agent(), encoder.awaited());
        }
        (!out.is_empty()).then(|| Bytes::from(out))
    }
}

impl<L: Layer> Body for Encode<L> {
    type Data = Bytes;
    type Error = crate::proxy::upstream::error::StreamError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        if this.encoder.is_none() {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let Ok(data) = frame.into_data() else {
                        // Trailers: nothing of the envelope stream.
                        continue;
                    };
                    // Chunks are about as long as the envelopes they come from: one allocation per frame.
                    let mut out = Vec::with_capacity(data.len() + data.len() / 4 + 64);
                    if let Some(encoder) = this.encoder.as_mut() {
                        encoder.frame(&data, &mut out);
                    }
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                    }
                }
                Poll::Ready(None) => return Poll::Ready(this.end().map(|b| Ok(Frame::data(b)))),
                Poll::Ready(Some(Err(e))) => {
                    // The failure was said in-band (the gateway's last envelope); the client connection ends.
                    this.ended = true;
                    if let Some(learn) = this.learn.take() {
                        let encoder = this.encoder.as_ref();
                        learn(encoder.and_then(|e| e.root_agent()), encoder.and_then(|e| e.awaited()));
                    }
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self.encoder {
            None => self.inner.is_end_stream(),
            Some(_) => self.ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.encoder {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

impl<L: Layer> Drain for Encode<L> {
    /// The stream's last frame (the draining envelope) encoded, with the protocol's end after it.
    fn cut_for_drain(&mut self) -> DrainCut {
        let cut = self.inner.cut_for_drain();
        if self.encoder.is_none() || self.ended {
            return cut;
        }
        match cut {
            DrainCut::Final(last) => {
                let mut out = Vec::new();
                if let Some(encoder) = self.encoder.as_mut() {
                    encoder.frame(&last, &mut out);
                }
                if let Some(end) = self.end() {
                    out.extend_from_slice(&end);
                }
                DrainCut::Final(Bytes::from(out))
            }
            other => other,
        }
    }
}

impl<L: Layer> Layer for Encode<L> {
    fn ending(&mut self) -> Ending {
        self.inner.ending()
    }

    fn totals(&self) -> Totals {
        self.inner.totals()
    }

    fn agent(&self) -> Option<&str> {
        self.inner.agent()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::frontend::{Protocol, Turn};
    use crate::proxy::body::script::{data, Script, Step};

    #[tokio::test]
    async fn held_frames_come_out_as_the_protocol_and_the_next_turn_learns_the_agent() {
        let frames = Script::new([
            data("retry: 1000\nid: sg1-x-1\ndata: {\"type\":\"meta_init\",\"agent\":\"a1\",\"final\":true,\"delta\":\"{}\"}\n\n"),
            data("id: sg1-x-2\ndata: {\"type\":\"text\",\"agent\":\"a1\",\"final\":true,\"del"),
            data("ta\":\"hi\"}\n\nid: sg1-x-3\ndata: {\"type\":\"meta_final\",\"agent\":\"a1\",\"final\":true,\"delta\":\"{}\"}\n\ndata: [DONE]\n\n"),
            Step::End,
        ]);
        let mut e = Encode::none(frames);
        let learned = std::sync::Arc::new(std::sync::Mutex::new(None));
        let l = std::sync::Arc::clone(&learned);
        let turn = Turn {
            message_id: "m".into(),
            prefix: "p".into(),
            ..Turn::default()
        };
        e.set(
            Encoder::new(Protocol::AiSdk, turn),
            Some(Box::new(move |agent, _| {
                *l.lock().unwrap() = agent.map(str::to_owned);
            })),
        );
        let Ok(collected) = e.collect().await else {
            panic!("the body failed")
        };
        let body = collected.to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.starts_with("data: {\"type\":\"start\""), "{text}");
        assert!(text.contains("\"delta\":\"hi\""), "{text}");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert!(!text.contains("id: "), "{text}");
        assert_eq!(learned.lock().unwrap().as_deref(), Some("a1"));
    }
}
