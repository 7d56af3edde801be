//! The frontends' protocols (DESIGN 5.3): the envelope stream encoded once more, for the clients teams build with.
//! Each encoder is a reader of held envelopes: one envelope in, its protocol's chunks out, as the stream is read
//! (a first read, a reconnect and a resumed chat alike); sans-I/O like the translator. `turn` is what a read is
//! (the protocol, the ids the request gave), `envelope` reads a held
//! event back, `blocks` tracks what each block has open and holds an `error` until the next envelope says whether
//! the run goes on; `ai_sdk` (the UI Message Stream, v1) and `ag_ui` (AG-UI 1.0) write their protocols. A third
//! protocol is one more file beside them, a variant of [`Protocol`] and of [`Encoder`] (`encoder`).

pub mod turn;
pub mod envelope;
pub mod blocks;
pub mod ai_sdk;
pub mod ag_ui;
pub mod encoder;

pub use encoder::Encoder;
pub use turn::{Protocol, Turn};

#[cfg(test)]
mod tests;
