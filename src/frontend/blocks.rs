//! What an encoder keeps between envelopes: the blocks open in the envelope stream (a block is the envelopes of one
//! type, agent and `id` up to its `final:true`), each with the id the protocol calls it by and, for the blocks a
//! protocol sends whole (tool input and output, errors), its text so far; ids already announced; and the `error`
//! held until the next envelope says whether the run goes on (DESIGN 5.3, "Which error ends the run"). Every
//! buffer is bounded.

use std::collections::VecDeque;

use super::envelope::Envelope;
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
    /// What the protocol calls it (a text part's id, a message id).
    pub out: String,
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

    pub fn get_mut(&mut self, at: usize) -> &mut Open {
        &mut self.open[at]
    }

    /// Opens a block for `env` called `<prefix>-<tag><n>`; returns where it is and the oldest block, closed to make
    /// room, if there was no room.
    pub fn open(&mut self, kind: EnvelopeKind, env: &Envelope<'_>, tag: &str) -> (usize, Option<Open>) {
        let evicted = (self.open.len() >= MAX_OPEN).then(|| self.open.remove(0));
        let out = self.make_id(tag);
        self.open.push(Open {
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

/// Reads one `error` envelope into its block: the error once its block is whole, and a block closed to make room.
pub fn error_piece(blocks: &mut Blocks, env: &Envelope<'_>) -> (Option<HeldError>, Option<Open>) {
    let (at, evicted) = match blocks.find(EnvelopeKind::Error, env) {
        Some(at) => (at, None),
        None => blocks.open(EnvelopeKind::Error, env, "e"),
    };
    blocks.get_mut(at).push(&env.delta);
    if !env.last {
        return (None, evicted);
    }
    let open = blocks.take(at);
    let held = HeldError {
        agent: open.agent,
        text: open.text,
    };
    (Some(held), evicted)
}
