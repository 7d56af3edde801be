//! The stream inspector's tap (DESIGN 6.2): attached to a translated stream only while `[debug] streams` is on,
//! it assembles each upstream event's data (bounded), links each envelope to the event being read when it was
//! written, and hands both to the stream's `inspect::Watched`. Also what tells the list a held stream's readers.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::envelope::EnvelopeKind;
use crate::inspect::{Held, Inspector, State, Watched};
use crate::proxy::metrics::tap::{RunEnd, Tap};
use crate::resume::hub::Stream;
use crate::sse::SseEvent;
use crate::translate::{Dialect, ParseErrorKind};

/// Bytes of one event's data a raw record keeps (with `capture_content`); the rest is counted, marked truncated.
pub const MAX_RAW_DATA: usize = 64 << 10;

/// One stream's inspector tap.
pub struct InspectTap {
    inspector: Arc<Inspector>,
    watched: Arc<Watched>,
    /// The current event's data so far (kept only with `capture_content`, at most `MAX_RAW_DATA`).
    data: Vec<u8>,
    /// Its length, kept or not.
    len: usize,
    in_event: bool,
    /// The raw event envelopes are written for now (`None` before the first and after the input ended).
    current: Option<u64>,
    /// The seq the next dispatched event gets.
    next_raw: u64,
    input_ended: bool,
    seen_input: bool,
}

impl InspectTap {
    pub fn new(inspector: Arc<Inspector>, watched: Arc<Watched>) -> Self {
        Self {
            inspector,
            watched,
            data: Vec::new(),
            len: 0,
            in_event: false,
            current: None,
            next_raw: 0,
            input_ended: false,
            seen_input: false,
        }
    }

    fn piece(&mut self, p: &[u8]) {
        if !self.in_event {
            self.in_event = true;
            self.current = Some(self.next_raw);
        }
        if !self.seen_input {
            self.seen_input = true;
            self.watched.upstream_started();
        }
        self.len = self.len.saturating_add(p.len());
        if self.watched.capture() {
            let room = MAX_RAW_DATA.saturating_sub(self.data.len());
            self.data.extend_from_slice(&p[..p.len().min(room)]);
        }
    }

    fn reset(&mut self) {
        self.data.clear();
        self.len = 0;
        self.in_event = false;
    }
}

impl Tap for InspectTap {
    fn sse(&mut self, ev: &SseEvent<'_>) -> bool {
        match ev {
            SseEvent::Data(p) => self.piece(p),
            // WHATWG joins an event's data lines with LF.
            SseEvent::DataLine => self.piece(b"\n"),
            SseEvent::Dispatch { event_type, .. } => {
                let data = self.watched.capture().then_some(self.data.as_slice());
                let truncated = self.len > self.data.len();
                let seq = self
                    .watched
                    .raw(event_type, self.len, data, truncated && data.is_some());
                self.next_raw = seq + 1;
                self.current = Some(seq);
                self.reset();
            }
            SseEvent::Discard => {
                self.reset();
                self.current = None;
            }
        }
        true
    }

    fn written(&mut self, kind: EnvelopeKind, event: &[u8]) {
        let raw_seq = if self.input_ended { None } else { self.current };
        self.watched.envelope(kind, raw_seq, event);
    }

    fn input_ended(&mut self) {
        self.input_ended = true;
    }

    fn dialect(&mut self, dialect: Dialect) {
        self.watched.dialect(dialect);
    }

    fn parse_error(&mut self, _kind: ParseErrorKind) {
        self.watched.parse_error();
    }

    fn ended(&mut self, end: RunEnd) {
        let (state, why) = match end {
            RunEnd::Done => (State::Finished, None),
            RunEnd::Cancelled => (State::Cancelled, Some("cancelled")),
            RunEnd::BackendError => (State::Failed, Some("backend_error")),
            RunEnd::Cut => (State::Failed, Some("cut")),
            RunEnd::Drained => (State::Failed, Some("drained")),
            RunEnd::UpstreamFailed { kind } => (State::Failed, Some(kind)),
        };
        self.inspector.finish(&self.watched, state, why);
    }
}

/// A held stream as the list sees it (weakly: the list never keeps a stream, nor its upstream, alive).
pub struct HeldRun(pub Weak<Stream>);

impl Held for HeldRun {
    fn readers(&self) -> usize {
        self.0.upgrade().map_or(0, |s| s.readers())
    }

    fn grace_left(&self) -> Option<Duration> {
        let deadline = self.0.upgrade()?.grace_deadline()?;
        Some(deadline.saturating_duration_since(Instant::now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Debug;
    use crate::proxy::metrics::translator::{StreamObserver, TranslatorMetrics};
    use crate::translate::{Options, Translator};
    use prometheus::Registry;
    use serde_json::Value;

    /// A translated run tapped for an inspector capturing content: its records once it ended.
    fn records(legacy: &[u8], require_done: bool) -> Vec<Value> {
        let debug = Debug {
            streams: true,
            capture_content: true,
            ..Debug::default()
        };
        let inspector = Arc::new(Inspector::register(&debug, &Registry::new()).unwrap());
        let watched = inspector.open("/run", "json");
        let metrics = Arc::new(TranslatorMetrics::register(&Registry::new()).unwrap());
        let mut observer = StreamObserver::new(metrics);
        observer.tap(Box::new(InspectTap::new(Arc::clone(&inspector), Arc::clone(&watched))));
        let opts = Options {
            require_done,
            ..Options::default()
        };
        let mut t = Translator::with_observer(opts, "agent-1", observer);
        let mut out = Vec::new();
        // Split mid-event: an event's data arrives in pieces.
        for piece in legacy.chunks(7) {
            t.feed(piece, &mut out);
        }
        t.observer_mut().input_ended();
        t.finish(&mut out);
        t.observer_mut().ended(RunEnd::Cut);
        assert_eq!(watched.state(), State::Failed);
        watched
            .read(0, usize::MAX)
            .records
            .iter()
            .map(|r| serde_json::from_slice(r).unwrap())
            .collect()
    }

    #[test]
    fn each_envelope_links_the_event_it_came_from_and_the_gateways_own_link_none() {
        let legacy = b"data: <content-block-text>\n\ndata: hello\n\ndata: </content-block-text>\n\n";
        let recs = records(legacy, true);
        let raws: Vec<&Value> = recs.iter().filter(|r| r["side"] == "raw").collect();
        let data: Vec<&str> = raws.iter().map(|r| r["data"].as_str().unwrap()).collect();
        assert_eq!(data, ["<content-block-text>", "hello", "</content-block-text>"]);
        let envs: Vec<&Value> = recs.iter().filter(|r| r["side"] == "envelope").collect();
        let delta = envs.iter().find(|e| e["data"]["delta"] == "hello").expect("the delta");
        assert_eq!(delta["raw_seq"], 1, "the delta links the event that carried it");
        let close = envs
            .iter()
            .find(|e| e["data"]["type"] == "text" && e["data"]["final"] == true)
            .expect("the block's close");
        assert_eq!(close["raw_seq"], 2, "the close links the closing tag's event");
        // No [DONE]: the gateway ends the run with its own error envelope, written after the input ended.
        let last = envs.last().expect("envelopes");
        assert_eq!(last["data"]["type"], "error");
        assert_eq!(last["raw_seq"], Value::Null, "{last}");
    }

    #[test]
    fn an_events_lines_are_joined_with_lf_and_its_data_kept_only_up_to_the_bound() {
        let big = "x".repeat(MAX_RAW_DATA + 10);
        let legacy = format!("data: a\ndata: b\n\ndata: {big}\n\ndata: [DONE]\n\n");
        let recs = records(legacy.as_bytes(), false);
        let raws: Vec<&Value> = recs.iter().filter(|r| r["side"] == "raw").collect();
        assert_eq!(raws[0]["data"], "a\nb");
        assert_eq!(raws[1]["bytes"], MAX_RAW_DATA + 10);
        assert_eq!(raws[1]["data"].as_str().map(str::len), Some(MAX_RAW_DATA));
        assert_eq!(raws[1]["truncated"], true);
    }
}
