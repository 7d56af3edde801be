//! Taps: what watches one translated stream beyond its counters (the run's trace, the stream inspector). A tap
//! sees the decoder's reports and each envelope as written, in stream order, on the stream's own task; with no
//! tap attached the translator's observer does one empty-vector check per call.

use crate::envelope::EnvelopeKind;
use crate::sse::SseEvent;
use crate::translate::{Dialect, ParseErrorKind};

/// How a translated run ended, as a tap is told once (before it is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// The upstream body ended after `[DONE]`.
    Done,
    /// The backend reported its own failure in the stream.
    BackendError,
    /// The upstream body ended without `[DONE]`.
    Cut,
    /// The upstream failed (connection lost, timeout); `kind` is the metric label of the failure.
    UpstreamFailed { kind: &'static str },
    /// Cut at the drain deadline.
    Drained,
    /// Nobody read on: the client left (no resumption) or the held run was cancelled.
    Cancelled,
}

impl RunEnd {
    /// Whether the run ended in an error (`error.type` on its trace).
    pub fn is_error(self) -> bool {
        !matches!(self, RunEnd::Done)
    }
}

/// A watcher of one translated stream. Every method has an empty default.
pub trait Tap: Send {
    /// Each report of the SSE decoder, before the parser reads it.
    fn sse(&mut self, _ev: &SseEvent<'_>) {}
    /// One envelope's SSE event as written (`data: {…}\n\n`).
    fn written(&mut self, _kind: EnvelopeKind, _event: &[u8]) {}
    /// The stream's dialect, once its first event settled it.
    fn dialect(&mut self, _dialect: Dialect) {}
    /// The upstream's input ended (its end, a failure, the drain): the envelopes written from here on close the
    /// run and are the gateway's own, not any event's.
    fn input_ended(&mut self) {}
    /// Bad input, answered by an `error` envelope.
    fn parse_error(&mut self, _kind: ParseErrorKind) {}
    /// The run ended; told once. A tap dropped untold was cancelled.
    fn ended(&mut self, _end: RunEnd) {}
}

/// The taps of one stream; told of the end once, as `Cancelled` when dropped untold.
#[derive(Default)]
pub struct Taps {
    taps: Vec<Box<dyn Tap>>,
    ended: bool,
}

impl Taps {
    pub fn push(&mut self, tap: Box<dyn Tap>) {
        self.taps.push(tap);
    }

    pub fn is_empty(&self) -> bool {
        self.taps.is_empty()
    }

    pub fn each(&mut self, mut f: impl FnMut(&mut dyn Tap)) {
        for t in &mut self.taps {
            f(t.as_mut());
        }
    }

    pub fn ended(&mut self, end: RunEnd) {
        if !std::mem::replace(&mut self.ended, true) {
            self.each(|t| t.ended(end));
        }
    }
}

impl Drop for Taps {
    fn drop(&mut self) {
        self.ended(RunEnd::Cancelled);
    }
}
