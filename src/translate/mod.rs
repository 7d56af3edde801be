//! The sans-I/O pipeline: upstream bytes in, JSON-envelope SSE bytes out.
//!
//! `feed` accepts the upstream body split anywhere and appends to `out`
//! whatever is complete; `finish` flushes at end of input; `abort` ends the
//! stream after an upstream failure. Any split of the input gives the same
//! output. Nothing here does I/O or reads a clock. This is the facade over
//! the stages (`sse` decoding, `legacy` parsing, `envelope` writing); the
//! types they share live in `pipeline` and are re-exported here.

pub use crate::pipeline::{
    DataJoin, Dialect, Observer, Options, ParseErrorKind, Stats, StreamEnd, UnknownTags, DEFAULT_BUDGET,
    DEFAULT_JSON_SNIFF_BYTES, DEFAULT_MAX_ITEM_BYTES, DEFAULT_MAX_TEXT_EVENT_BYTES, MIN_BUDGET,
};

use crate::envelope::chunker::Sink;
use crate::legacy::Parser;
use crate::sse::{Decoder, DecoderOptions};

/// Input taken at a time by [`Translator::feed_bounded`]. An envelope repeats at most a few bounded
/// identifiers (`envelope::ids`), so one step's output is a bounded multiple of it, except where an item held
/// whole (at most `max_item_bytes`) ends in it.
pub const FEED_STEP: usize = 4 << 10;

/// One stream's translator.
pub struct Translator<O: Observer = Stats> {
    decoder: Decoder,
    parser: Parser,
    observer: O,
    /// The envelope budget, for the sink each call writes through.
    budget: usize,
    finished: bool,
}

impl Translator<Stats> {
    /// A translator counting into its own `Stats`.
    pub fn new(opts: Options, fallback_agent: &str) -> Self {
        Self::with_observer(opts, fallback_agent, Stats::default())
    }
}

impl<O: Observer> Translator<O> {
    /// `fallback_agent` names the stream's agent until a `meta_init` does; the caller checks it with
    /// `envelope::ids::is_valid` (every envelope repeats it).
    pub fn with_observer(opts: Options, fallback_agent: &str, observer: O) -> Self {
        let decoder = Decoder::new(DecoderOptions {
            line_ends: opts.line_ends,
            framing: opts.framing,
        });
        Self {
            decoder,
            budget: opts.budget,
            parser: Parser::new(opts, fallback_agent),
            observer,
            finished: false,
        }
    }

    /// Translates a prefix of `input` into `out`, stopping once `out` holds at least `limit` bytes; returns how
    /// many input bytes were taken (all of them when the output stays under `limit`). The caller feeds the rest
    /// later, so the output written for one upstream read is bounded whatever the input amplifies to: at most
    /// `limit` plus what one [`FEED_STEP`] of input produces (DESIGN 2: any split gives the same output).
    pub fn feed_bounded(&mut self, input: &[u8], out: &mut Vec<u8>, limit: usize) -> usize {
        let mut taken = 0;
        for step in input.chunks(FEED_STEP) {
            if out.len() >= limit {
                break;
            }
            self.feed(step, out);
            taken += step.len();
        }
        taken
    }

    /// Translates the next piece of the upstream body into `out`.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.finished {
            return;
        }
        self.stages(out, |decoder, parser, sink| {
            decoder.feed(input, &mut |ev| {
                sink.obs.sse(&ev);
                parser.on_sse(ev, sink)
            })
        });
    }

    /// End of the upstream body: flushes held bytes and closes open blocks.
    /// Returns how the stream ended.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> StreamEnd {
        if std::mem::replace(&mut self.finished, true) {
            return self.parser.end();
        }
        self.stages(out, |decoder, parser, sink| {
            decoder.finish(&mut |ev| {
                sink.obs.sse(&ev);
                parser.on_sse(ev, sink)
            });
            parser.finish(sink)
        })
    }

    /// The upstream failed mid-stream: closes open blocks and writes an
    /// `error` envelope whose delta is `{"type":"upstream_error",…}`.
    pub fn abort(&mut self, message: &str, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.stages(out, |_, parser, sink| parser.abort(message, sink));
    }

    /// Runs `f` over the stages with a sink writing into `out`.
    fn stages<R>(&mut self, out: &mut Vec<u8>, f: impl FnOnce(&mut Decoder, &mut Parser, &mut Sink<O>) -> R) -> R {
        let mut sink = Sink::new(out, &mut self.observer, self.budget);
        f(&mut self.decoder, &mut self.parser, &mut sink)
    }

    /// The agent of the current scope.
    pub fn agent(&self) -> &str {
        self.parser.agent()
    }

    /// The stream's own agent once a `meta_init` named it (`None` while it is the fallback by default).
    pub fn root_agent(&self) -> Option<&str> {
        self.parser.root_agent()
    }

    pub fn observer(&self) -> &O {
        &self.observer
    }

    pub fn observer_mut(&mut self) -> &mut O {
        &mut self.observer
    }

    /// Bytes held by this stream's buffers (for memory accounting).
    pub fn buffered_bytes(&self) -> usize {
        self.parser.buffered_bytes()
    }
}

/// Translates a whole recorded stream at once (the `translate` command).
pub fn translate_all(opts: Options, fallback_agent: &str, input: &[u8]) -> (Vec<u8>, Stats) {
    let mut t = Translator::new(opts, fallback_agent);
    let mut out = Vec::with_capacity(input.len() + input.len() / 2);
    t.feed(input, &mut out);
    t.finish(&mut out);
    (out, t.observer().clone())
}

#[cfg(test)]
mod tests;
