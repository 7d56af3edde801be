//! Translator settings: one `Options` value with a documented default per field, and the enums it names.

use serde::{Deserialize, Serialize};

use crate::sse::{Framing, LineEnds};

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

/// Which upstream dialect to expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// Told from the first event: XML items (with raw-dialect JSON model events wherever they appear),
    /// cogency events or Agent SDK messages.
    #[default]
    Auto,
    /// XML items only: JSON model events are bad input.
    Xml,
    /// Raw dialect (DESIGN 3.4).
    Raw,
    /// cogency's JSON events (DESIGN 3.7).
    Cogency,
    /// Claude Agent SDK messages (DESIGN 3.7).
    AgentSdk,
}

impl Dialect {
    /// Every dialect, in the order the docs list them.
    pub const ALL: [Dialect; 5] = [
        Dialect::Auto,
        Dialect::Xml,
        Dialect::Raw,
        Dialect::Cogency,
        Dialect::AgentSdk,
    ];

    /// The name in config, on the command line and in a request.
    pub const fn as_str(self) -> &'static str {
        match self {
            Dialect::Auto => "auto",
            Dialect::Xml => "xml",
            Dialect::Raw => "raw",
            Dialect::Cogency => "cogency",
            Dialect::AgentSdk => "agent_sdk",
        }
    }

    /// Parses a name (`None` for anything else).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.as_str() == s)
    }
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

/// Translator settings. Each field's default is in its doc line, and `Default` is the one place it is set; the
/// daemon's `[translate]` table holds these fields under the same names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    /// `upstream_error` envelope (default false; not a key: the daemon sets
    /// it from its own `translate.require_done`, whose default is true).
    #[serde(skip)]
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
