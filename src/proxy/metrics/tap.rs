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
    /// Each report of the SSE decoder, before the parser reads it, while some tap of the stream wants them; returns
    /// whether this one still does (the trace times only the first report, the inspector records them all).
    fn sse(&mut self, _ev: &SseEvent<'_>) -> bool {
        false
    }
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

/// The taps of one stream; told of the end once, as `Cancelled` when dropped untold. One pointer while empty (the
/// usual case: every stream's observer holds one).
#[derive(Default)]
pub struct Taps(Option<Box<Attached>>);

struct Attached {
    taps: Vec<Box<dyn Tap>>,
    ended: bool,
    /// Whether a tap still wants the decoder's reports (once none does, each report costs one branch).
    sse: bool,
}

impl Taps {
    pub fn push(&mut self, tap: Box<dyn Tap>) {
        self.0
            .get_or_insert_with(|| {
                Box::new(Attached {
                    taps: Vec::with_capacity(1),
                    ended: false,
                    sse: true,
                })
            })
            .taps
            .push(tap);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub fn each(&mut self, mut f: impl FnMut(&mut dyn Tap)) {
        if let Some(a) = &mut self.0 {
            for t in &mut a.taps {
                f(t.as_mut());
            }
        }
    }

    /// Passes a decoder report on, while a tap wants them.
    pub fn sse(&mut self, ev: &SseEvent<'_>) {
        if let Some(a) = self.0.as_mut().filter(|a| a.sse) {
            let mut wanted = false;
            for t in &mut a.taps {
                wanted |= t.sse(ev);
            }
            a.sse = wanted;
        }
    }

    pub fn ended(&mut self, end: RunEnd) {
        if let Some(a) = &mut self.0 {
            if !std::mem::replace(&mut a.ended, true) {
                for t in &mut a.taps {
                    t.ended(end);
                }
            }
        }
    }
}

impl Drop for Taps {
    fn drop(&mut self) {
        self.ended(RunEnd::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    struct Told(Arc<Mutex<Vec<RunEnd>>>);

    impl Tap for Told {
        fn ended(&mut self, end: RunEnd) {
            self.0.lock().expect("lock").push(end);
        }
    }

    #[test]
    fn a_tap_is_told_the_end_once_and_cancelled_when_dropped_untold() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let mut taps = Taps::default();
        taps.push(Box::new(Told(Arc::clone(&told))));
        taps.ended(RunEnd::Done);
        taps.ended(RunEnd::Cut);
        drop(taps);
        assert_eq!(*told.lock().expect("lock"), [RunEnd::Done]);
        let mut taps = Taps::default();
        taps.push(Box::new(Told(Arc::clone(&told))));
        drop(taps);
        assert_eq!(told.lock().expect("lock").last(), Some(&RunEnd::Cancelled));
        assert_eq!(std::mem::size_of::<Taps>(), std::mem::size_of::<usize>());
    }

    /// Wants the decoder's reports until it has seen `wanted` of them.
    struct Counting(Arc<Mutex<u32>>, u32);

    impl Tap for Counting {
        fn sse(&mut self, _ev: &SseEvent<'_>) -> bool {
            let mut n = self.0.lock().expect("lock");
            *n += 1;
            *n < self.1
        }
    }

    #[test]
    fn reports_stop_once_no_tap_wants_them_and_go_on_while_one_does() {
        let (a, b) = (Arc::new(Mutex::new(0)), Arc::new(Mutex::new(0)));
        let mut taps = Taps::default();
        taps.push(Box::new(Counting(Arc::clone(&a), 1)));
        for _ in 0..5 {
            taps.sse(&SseEvent::DataLine);
        }
        assert_eq!(*a.lock().expect("lock"), 1);
        let mut taps = Taps::default();
        taps.push(Box::new(Counting(Arc::clone(&a), 1)));
        taps.push(Box::new(Counting(Arc::clone(&b), 3)));
        for _ in 0..5 {
            taps.sse(&SseEvent::DataLine);
        }
        assert_eq!(*b.lock().expect("lock"), 3, "the second tap wanted three");
    }
}
