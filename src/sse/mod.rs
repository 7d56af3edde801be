//! Server-Sent Events on the wire: `decoder` turns upstream bytes into event
//! data pieces, `encoder` frames envelopes as `data: …\n\n`.

pub mod decoder;
pub mod encoder;

pub use decoder::{Decoder, DecoderOptions, Framing, LineEnds, SseEvent};
