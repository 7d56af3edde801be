//! The encoder of a read, whichever its protocol: one envelope in, the protocol's chunks out.

use super::ag_ui::AgUi;
use super::ai_sdk::AiSdk;
use super::turn::{Protocol, Turn};

/// An encoder of one protocol for one read of one stream.
#[derive(Debug)]
pub enum Encoder {
    AiSdk(Box<AiSdk>),
    AgUi(Box<AgUi>),
}

impl Encoder {
    pub fn new(protocol: Protocol, turn: Turn) -> Self {
        match protocol {
            Protocol::AiSdk => Encoder::AiSdk(Box::new(AiSdk::new(turn))),
            Protocol::AgUi => Encoder::AgUi(Box::new(AgUi::new(turn))),
        }
    }

    /// One held event's data: an envelope's JSON text, or `[DONE]`. Anything else is skipped.
    pub fn event(&mut self, data: &[u8], out: &mut Vec<u8>) {
        match self {
            Encoder::AiSdk(e) => e.event(data, out),
            Encoder::AgUi(e) => e.event(data, out),
        }
    }

    /// The held stream ended: whatever the protocol needs to end the run (an error if the run did not end).
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        match self {
            Encoder::AiSdk(e) => e.finish(out),
            Encoder::AgUi(e) => e.finish(out),
        }
    }

    /// The run has ended for the client: nothing more will be written.
    pub fn is_done(&self) -> bool {
        match self {
            Encoder::AiSdk(e) => e.is_done(),
            Encoder::AgUi(e) => e.is_done(),
        }
    }

    /// Bytes this encoder holds (open blocks' buffers, the held error), for memory accounting.
    pub fn buffered(&self) -> usize {
        match self {
            Encoder::AiSdk(e) => e.buffered(),
            Encoder::AgUi(e) => e.buffered(),
        }
    }
}
