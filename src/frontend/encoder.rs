//! The encoder of a read, whichever its protocol: one envelope in, the protocol's chunks out.

use super::ag_ui::AgUi;
use super::ai_sdk::AiSdk;
use super::blocks::Writer;
use super::turn::{Protocol, Turn};

/// Bytes of an unfinished held event kept between frames (held frames hold whole events; this only bounds a
/// malformed one).
pub const MAX_PARTIAL: usize = 1 << 20;

/// An encoder of one protocol for one read of one stream.
#[derive(Debug)]
pub struct Encoder {
    inner: Box<dyn Writer>,
    /// The start of an event whose frame ended before its blank line.
    partial: Vec<u8>,
}

impl Encoder {
    pub fn new(protocol: Protocol, turn: Turn) -> Self {
        let inner: Box<dyn Writer> = match protocol {
            Protocol::AiSdk => Box::new(AiSdk::new(turn)),
            Protocol::AgUi => Box::new(AgUi::new(turn)),
        };
        Self {
            inner,
            partial: Vec::new(),
        }
    }

    /// A frame of held events as the gateway's SSE encoder wrote them (`id:`, `data:`, `retry:` lines, comments,
    /// a blank line after each event): each event's data encoded; the rest is the envelope stream's own framing.
    pub fn frame(&mut self, frame: &[u8], out: &mut Vec<u8>) {
        if self.partial.is_empty() {
            // The usual case: whole events, read in place.
            let whole = memchr::memmem::rfind(frame, b"\n\n").map_or(0, |end| end + 2);
            self.events(&frame[..whole], out);
            self.keep(&frame[whole..]);
            return;
        }
        let mut pending = std::mem::take(&mut self.partial);
        pending.extend_from_slice(frame);
        let whole = memchr::memmem::rfind(&pending, b"\n\n").map_or(0, |end| end + 2);
        self.events(&pending[..whole], out);
        self.keep(&pending[whole..]);
    }

    /// Keeps the start of an unfinished event, unless it outgrew `MAX_PARTIAL` (dropped: not one of ours).
    fn keep(&mut self, tail: &[u8]) {
        self.partial.clear();
        if tail.len() <= MAX_PARTIAL {
            self.partial.extend_from_slice(tail);
        }
    }

    /// Whole events: each `data:` line (the gateway writes one per event) encoded.
    fn events(&mut self, text: &[u8], out: &mut Vec<u8>) {
        for line in text.split(|&b| b == b'\n') {
            if let Some(data) = line.strip_prefix(b"data:") {
                let data = data.strip_prefix(b" ").unwrap_or(data);
                self.event(data, out);
            }
        }
    }

    /// The stream's root agent, once known (the agent a next turn continues).
    pub fn root_agent(&self) -> Option<&str> {
        self.inner.kept().reading.root.as_deref()
    }

    /// The calls the run ended awaiting (`awaiting_frontend_tools`), if it did.
    pub fn awaited(&self) -> Option<&[String]> {
        self.inner.kept().reading.awaited.as_deref()
    }

    /// One held event's data: an envelope's JSON text, or `[DONE]`. Anything else is skipped.
    pub fn event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        self.inner.event(data, out);
    }

    /// The held stream ended: whatever the protocol needs to end the run (an error if the run did not end).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.inner.finish(out);
    }

    /// The run has ended for the client: nothing more will be written.
    pub fn is_done(&self) -> bool {
        self.inner.kept().done
    }

    /// Bytes this encoder holds (open blocks' buffers, the held error), for memory accounting.
    pub fn buffered(&self) -> usize {
        self.partial.capacity() + self.inner.kept().buffered()
    }
}
