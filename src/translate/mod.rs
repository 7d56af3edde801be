//! The sans-I/O pipeline: upstream bytes in, JSON-envelope SSE bytes out.
//!
//! `feed` accepts the upstream body split anywhere and appends to `out`
//! whatever is complete; `finish` flushes at end of input; `abort` ends the
//! stream after an upstream failure. Any split of the input gives the same
//! output. Nothing here does I/O or reads a clock.

mod stats;

pub use stats::{Observer, ParseErrorKind, Stats};

/// How the upstream stream ended, as far as its content tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// `[DONE]` was the last item.
    Done,
    /// The backend reported a failure (its error JSON).
    Failed,
    /// Neither: the stream was cut short.
    Cut,
}

use serde::{Deserialize, Serialize};

use crate::legacy::Parser;
use crate::sse::{Decoder, DecoderOptions, Framing, LineEnds};

/// Which upstream dialect to expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// XML items, plus raw-dialect JSON model events wherever they appear.
    #[default]
    Auto,
    /// XML items only: JSON model events are bad input.
    Xml,
    /// Raw dialect (DESIGN 3.4).
    Raw,
}

/// How the `data:` lines of one event are joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataJoin {
    /// No separator: a proxy that split an item across lines added nothing
    /// (DESIGN 3.1).
    #[default]
    Concat,
    /// WHATWG: a line feed between lines.
    Newline,
}

/// What happens to the content of an unknown tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownTags {
    /// Passed on as text (of the enclosing block, or a text block of its own).
    #[default]
    Text,
    /// Dropped (still counted).
    Drop,
}

/// Default byte budget of one envelope's JSON object.
pub const DEFAULT_BUDGET: usize = 2048;
/// Smallest budget that leaves room for the fixed fields of every envelope.
pub const MIN_BUDGET: usize = 256;
/// Default bound on one buffered item (a tag's attributes, a citation, a
/// raw-dialect JSON event).
pub const DEFAULT_MAX_ITEM_BYTES: usize = 16 << 20;
/// Default bound on one text event held until it completes (a complete item
/// interrupting a text block is recognised up to this size).
pub const DEFAULT_MAX_TEXT_EVENT_BYTES: usize = 64 << 10;
/// Default prefix of a client tool result inspected to tell JSON from text.
pub const DEFAULT_JSON_SNIFF_BYTES: usize = 8 << 10;

/// Translator settings. Each field's default is in its doc line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Max bytes of one envelope's JSON object (default 2048).
    pub budget: usize,
    /// Upstream dialect (default auto).
    pub dialect: Dialect,
    /// Line ends (default legacy: LF and CRLF only).
    pub line_ends: LineEnds,
    /// Event framing (default current; `UnescapedNewlines` for the old dialect).
    pub framing: Framing,
    /// Join of `data:` lines within one event (default concat).
    pub data_join: DataJoin,
    /// Rewrite `meta_init.format` from xml/raw to json (default true).
    pub rewrite_format: bool,
    /// Keep the backend's traceback in failure envelopes (default false).
    pub include_traceback: bool,
    /// Unknown tags' content: text or drop (default text).
    pub unknown_tags: UnknownTags,
    /// Bound on one buffered item (default 16 MiB).
    pub max_item_bytes: usize,
    /// Bound on one text event held until it completes (default 64 KiB);
    /// a larger event is streamed before it ends.
    pub max_text_event_bytes: usize,
    /// Client tool results up to this size are checked for JSON whole;
    /// larger ones by whether this much of them parses as the start of a
    /// JSON value (default 8 KiB).
    pub json_sniff_bytes: usize,
    /// An input that ends without `[DONE]` or a backend failure gets an
    /// `upstream_error` envelope (default false; the daemon sets it).
    pub require_done: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            budget: DEFAULT_BUDGET,
            dialect: Dialect::Auto,
            line_ends: LineEnds::Legacy,
            framing: Framing::Current,
            data_join: DataJoin::Concat,
            rewrite_format: true,
            include_traceback: false,
            unknown_tags: UnknownTags::Text,
            max_item_bytes: DEFAULT_MAX_ITEM_BYTES,
            max_text_event_bytes: DEFAULT_MAX_TEXT_EVENT_BYTES,
            json_sniff_bytes: DEFAULT_JSON_SNIFF_BYTES,
            require_done: false,
        }
    }
}

/// Input taken at a time by [`Translator::feed_bounded`]. An envelope repeats at most a few bounded
/// identifiers (`envelope::ids`), so one step's output is a bounded multiple of it, except where an item held
/// whole (at most `max_item_bytes`) ends in it.
pub const FEED_STEP: usize = 4 << 10;

/// One stream's translator.
pub struct Translator<O: Observer = Stats> {
    decoder: Decoder,
    parser: Parser,
    observer: O,
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
        let Self {
            decoder,
            parser,
            observer,
            ..
        } = self;
        decoder.feed(input, &mut |ev| parser.on_sse(ev, out, observer));
    }

    /// End of the upstream body: flushes held bytes and closes open blocks.
    /// Returns how the stream ended.
    pub fn finish(&mut self, out: &mut Vec<u8>) -> StreamEnd {
        if std::mem::replace(&mut self.finished, true) {
            return self.parser.end();
        }
        let Self {
            decoder,
            parser,
            observer,
            ..
        } = self;
        decoder.finish(&mut |ev| parser.on_sse(ev, out, observer));
        parser.finish(out, observer)
    }

    /// The upstream failed mid-stream: closes open blocks and writes an
    /// `error` envelope whose delta is `{"type":"upstream_error",…}`.
    pub fn abort(&mut self, message: &str, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.parser.abort(message, out, &mut self.observer);
    }

    /// The agent of the current scope.
    pub fn agent(&self) -> &str {
        self.parser.agent()
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
