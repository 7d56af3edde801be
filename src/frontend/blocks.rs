//! What an encoder keeps between envelopes: the blocks open in the envelope stream (a block is the envelopes of one
//! type, agent and `id` up to its `final:true`), each with the id the protocol calls it by and, for the blocks a
//! protocol sends whole (tool input and output, errors), its text so far; ids already announced; and the `error`
//! held until the next envelope says whether the run goes on (DESIGN 5.3, "Which error ends the run"). Every
//! buffer is bounded.

use std::collections::VecDeque;

use super::envelope::Envelope;
use super::turn::Turn;
use crate::protocol::EnvelopeKind;

/// Blocks open at once; one more closes the oldest (the envelope stream never holds this many).
pub const MAX_OPEN: usize = 64;
/// Text kept for one block sent whole (a tool's input or output, an error); past it the block is sent as cut.
pub const MAX_BUFFER: usize = 4 << 20;
/// Tool call ids remembered as announced.
pub const MAX_REMEMBERED: usize = 1024;

/// One open block.
#[derive(Debug)]
pub struct Open {
    pub kind: EnvelopeKind,
    pub agent: String,
    pub id: String,
    /// `name` of its first envelope.
    pub name: String,
    /// What the protocol calls it (a text part's id, a message id), and that as a JSON string literal.
    pub out: String,
    pub quoted: String,
    /// Its text so far, for a block sent whole.
    pub text: String,
    /// The text passed `MAX_BUFFER`: what was kept is all there is.
    pub cut: bool,
    /// A tool result's images (`src`, `media_type`), in order.
    pub images: Vec<(String, String)>,
    /// Nothing of it is written (a call the client already holds).
    pub quiet: bool,
}

impl Open {
    /// Keeps `delta`, up to `MAX_BUFFER` in all.
    pub fn push(&mut self, delta: &str) {
        let room = MAX_BUFFER.saturating_sub(self.text.len());
        if delta.len() <= room {
            self.text.push_str(delta);
            return;
        }
        let mut end = room;
        while !delta.is_char_boundary(end) {
            end -= 1;
        }
        self.text.push_str(&delta[..end]);
        self.cut = true;
    }
}

/// The open blocks of one stream, and the ids the encoder makes up.
#[derive(Debug)]
pub struct Blocks {
    open: Vec<Open>,
    made: u64,
    prefix: String,
}

impl Blocks {
    pub fn new(prefix: &str) -> Self {
        Self {
            open: Vec::new(),
            made: 0,
            prefix: prefix.to_owned(),
        }
    }

    /// A new id, `<prefix>-<tag><n>`: unique in the stream, and across the thread with a unique prefix.
    pub fn make_id(&mut self, tag: &str) -> String {
        self.made += 1;
        format!("{}-{tag}{}", self.prefix, self.made)
    }

    /// The open block `env` continues.
    pub fn find(&self, kind: EnvelopeKind, env: &Envelope<'_>) -> Option<usize> {
        self.open
            .iter()
            .position(|o| o.kind == kind && o.agent == env.agent && o.id == env.id)
    }

    /// The open streamed block (`text`, `thinking`) of `agent`.
    pub fn find_streamed(&self, kind: EnvelopeKind, agent: &str) -> Option<&Open> {
        self.open
            .iter()
            .find(|o| o.kind == kind && o.agent == agent && o.id.is_empty())
    }

    pub fn get_mut(&mut self, at: usize) -> &mut Open {
        &mut self.open[at]
    }

    /// Opens a block for `env` called `<prefix>-<tag><n>`; returns where it is and the oldest block, closed to make
    /// room, if there was no room.
    pub fn open(&mut self, kind: EnvelopeKind, env: &Envelope<'_>, tag: &str) -> (usize, Option<Open>) {
        let evicted = (self.open.len() >= MAX_OPEN).then(|| self.open.remove(0));
        let out = self.make_id(tag);
        let quoted = serde_json::to_string(&out).unwrap_or_default();
        self.open.push(Open {
            quoted,
            kind,
            agent: env.agent.to_string(),
            id: env.id.to_string(),
            name: env.name.to_string(),
            out,
            text: String::new(),
            cut: false,
            images: Vec::new(),
            quiet: false,
        });
        (self.open.len() - 1, evicted)
    }

    /// Reads one envelope of a block the protocol sends whole: its text kept; the block once its last envelope
    /// came, and a block closed to make room.
    pub fn collect(&mut self, kind: EnvelopeKind, env: &Envelope<'_>, tag: &str) -> (Option<Open>, Option<Open>) {
        let (at, evicted) = match self.find(kind, env) {
            Some(at) => (at, None),
            None => self.open(kind, env, tag),
        };
        self.get_mut(at).push(&env.delta);
        (env.last.then(|| self.take(at)), evicted)
    }

    /// Closes the block at `at`.
    pub fn take(&mut self, at: usize) -> Open {
        self.open.remove(at)
    }

    /// Closes every block of `agent` (`None`: every block), oldest first.
    pub fn take_all(&mut self, agent: Option<&str>) -> Vec<Open> {
        self.take_where(|o| agent.is_none_or(|a| o.agent == a))
    }

    /// Closes every block `pick` names, oldest first.
    pub fn take_where(&mut self, pick: impl Fn(&Open) -> bool) -> Vec<Open> {
        let (taken, kept) = std::mem::take(&mut self.open).into_iter().partition(|o| pick(o));
        self.open = kept;
        taken
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    pub fn buffered(&self) -> usize {
        self.open
            .iter()
            .map(|o| o.text.capacity() + o.images.iter().map(|(s, m)| s.len() + m.len()).sum::<usize>())
            .sum()
    }
}

/// Ids remembered, at most `MAX_REMEMBERED` (the oldest forgotten).
#[derive(Debug, Default)]
pub struct Seen {
    ids: VecDeque<String>,
}

impl Seen {
    pub fn of(ids: &[String]) -> Self {
        let mut seen = Self::default();
        for id in ids {
            seen.insert(id);
        }
        seen
    }

    pub fn contains(&self, id: &str) -> bool {
        self.ids.iter().any(|i| i == id)
    }

    pub fn insert(&mut self, id: &str) {
        if self.contains(id) {
            return;
        }
        if self.ids.len() == MAX_REMEMBERED {
            self.ids.pop_front();
        }
        self.ids.push_back(id.to_owned());
    }
}

/// An `error` block, whole, held until the next envelope: content after it means the run goes on (a recoverable
/// error); the run's end, or the stream's, means it ended the run.
#[derive(Debug)]
pub struct HeldError {
    pub agent: String,
    pub text: String,
}

/// What each protocol's writer is (`ai_sdk`, `ag_ui`; `encoder::Encoder` drives one): held events in, its chunks
/// out, and what it keeps of the run.
pub trait Writer: std::fmt::Debug + Send {
    /// One held event's data: an envelope's JSON text, or `[DONE]`.
    fn event(&mut self, data: &[u8], out: &mut Vec<u8>);
    /// The held stream ended.
    fn finish(&mut self, out: &mut Vec<u8>);
    /// Its open blocks and what it keeps of the run.
    fn kept(&self) -> &Kept;
}

/// What every writer keeps: its open blocks, the tool calls the message holds, and what it keeps of the run.
#[derive(Debug)]
pub struct Kept {
    pub blocks: Blocks,
    /// Tool calls announced (the request's, and this read's).
    pub announced: Seen,
    pub reading: Reading,
    /// The run has ended for the client: nothing more is written.
    pub done: bool,
}

impl Kept {
    pub fn new(turn: &Turn) -> Self {
        Self {
            blocks: Blocks::new(&turn.prefix),
            announced: Seen::of(&turn.known_tools),
            reading: Reading::default(),
            done: false,
        }
    }

    pub fn buffered(&self) -> usize {
        self.blocks.buffered() + self.reading.buffered()
    }
}

/// What both encoders keep of the run beyond its blocks: its root agent, the `error` held, the calls it ended
/// awaiting.
#[derive(Debug, Default)]
pub struct Reading {
    pub root: Option<String>,
    pub held: Option<HeldError>,
    pub awaited: Option<Vec<String>>,
}

/// What the envelope after a held `error` says of it.
pub enum Settled {
    Nothing,
    /// Content followed: the run goes on.
    Recoverable(HeldError),
    /// The root's `meta_final` followed: the error ended the run.
    Terminal(HeldError),
}

impl Reading {
    /// The stream's root agent: the first envelope's, or the continued agent's when a continuation starts without
    /// its `meta_init`.
    pub fn root(&mut self, turn: &Turn, env: &Envelope<'_>) -> String {
        self.root
            .get_or_insert_with(|| match (&turn.agent, env.kind) {
                (Some(agent), k) if k != EnvelopeKind::MetaInit => agent.clone(),
                _ => env.agent.to_string(),
            })
            .clone()
    }

    /// Settles the held error by the envelope after it.
    pub fn settle(&mut self, env: &Envelope<'_>, root: &str) -> Settled {
        match self.held.take() {
            None => Settled::Nothing,
            Some(held) if env.agent == root && env.kind == EnvelopeKind::MetaFinal => Settled::Terminal(held),
            Some(held) => Settled::Recoverable(held),
        }
    }

    pub fn buffered(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.text.capacity())
    }
}

impl HeldError {
    /// The value a recoverable error is sent as: its agent and the error (JSON where it is).
    pub fn value(&self) -> serde_json::Value {
        serde_json::json!({"agent": self.agent, "error": &*super::envelope::json_or_text(&self.text)})
    }
}

/// Reads one `error` envelope into its block: the error once its block is whole, and a block closed to make room.
pub fn error_piece(blocks: &mut Blocks, env: &Envelope<'_>) -> (Option<HeldError>, Option<Open>) {
    let (whole, evicted) = blocks.collect(EnvelopeKind::Error, env, "e");
    let held = whole.map(|open| HeldError {
        agent: open.agent,
        text: open.text,
    });
    (held, evicted)
}
