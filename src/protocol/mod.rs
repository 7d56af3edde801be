//! The envelope protocol's vocabulary, shared by every stage: the 13 envelope types, the fields each carries
//! (DESIGN 4's table), where each is cut, how its JSON payloads are written, and what counts as an identifier.

pub mod ids;

use std::fmt;

/// The 13 envelope types of the JSON protocol (DESIGN 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EnvelopeKind {
    MetaInit,
    Thinking,
    Text,
    Citation,
    ToolCall,
    ServerToolCall,
    ToolResult,
    ToolResultImage,
    ServerToolResult,
    AwaitingFrontendTools,
    MetaFiles,
    Error,
    MetaFinal,
}

impl EnvelopeKind {
    /// Every kind, in protocol order; `kind as usize` indexes this array.
    pub const ALL: [EnvelopeKind; 13] = [
        EnvelopeKind::MetaInit,
        EnvelopeKind::Thinking,
        EnvelopeKind::Text,
        EnvelopeKind::Citation,
        EnvelopeKind::ToolCall,
        EnvelopeKind::ServerToolCall,
        EnvelopeKind::ToolResult,
        EnvelopeKind::ToolResultImage,
        EnvelopeKind::ServerToolResult,
        EnvelopeKind::AwaitingFrontendTools,
        EnvelopeKind::MetaFiles,
        EnvelopeKind::Error,
        EnvelopeKind::MetaFinal,
    ];

    /// The `type` field's value.
    pub const fn as_str(self) -> &'static str {
        match self {
            EnvelopeKind::MetaInit => "meta_init",
            EnvelopeKind::Thinking => "thinking",
            EnvelopeKind::Text => "text",
            EnvelopeKind::Citation => "citation",
            EnvelopeKind::ToolCall => "tool_call",
            EnvelopeKind::ServerToolCall => "server_tool_call",
            EnvelopeKind::ToolResult => "tool_result",
            EnvelopeKind::ToolResultImage => "tool_result_image",
            EnvelopeKind::ServerToolResult => "server_tool_result",
            EnvelopeKind::AwaitingFrontendTools => "awaiting_frontend_tools",
            EnvelopeKind::MetaFiles => "meta_files",
            EnvelopeKind::Error => "error",
            EnvelopeKind::MetaFinal => "meta_final",
        }
    }

    /// Parses a `type` value; `None` for anything that is not one of the 13.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The fields this type carries after `type, agent, final, delta`, in order (DESIGN 4's table). The encoder
    /// writes exactly these, the tests check real output against them, and docs/TRANSLATION.md lists them.
    pub const fn extras(self) -> &'static [Field] {
        match self {
            EnvelopeKind::ToolCall
            | EnvelopeKind::ServerToolCall
            | EnvelopeKind::ToolResult
            | EnvelopeKind::ServerToolResult => &ID_NAME,
            EnvelopeKind::ToolResultImage => &IMAGE,
            EnvelopeKind::Citation => &CITATION,
            _ => &[],
        }
    }

    /// Where a block of this type is cut into envelopes.
    pub const fn split(self) -> Split {
        match self {
            EnvelopeKind::MetaInit
            | EnvelopeKind::AwaitingFrontendTools
            | EnvelopeKind::Error
            | EnvelopeKind::MetaFiles => Split::Native,
            _ => Split::Budget,
        }
    }

    /// How the native formatter writes this type's delta when it is a JSON document (DESIGN 4, "JSON text"):
    /// `None` for types whose delta is text. For `tool_result` it applies to structured content only, for `error`
    /// to a JSON error payload only.
    pub const fn json_text(self) -> Option<PyStyle> {
        match self {
            EnvelopeKind::MetaInit
            | EnvelopeKind::MetaFinal
            | EnvelopeKind::AwaitingFrontendTools
            | EnvelopeKind::ToolCall
            | EnvelopeKind::ServerToolCall => Some(PyStyle::Unicode),
            EnvelopeKind::ToolResult | EnvelopeKind::ServerToolResult | EnvelopeKind::Error => Some(PyStyle::Ascii),
            EnvelopeKind::MetaFiles => Some(PyStyle::CompactAscii),
            EnvelopeKind::Thinking | EnvelopeKind::Text | EnvelopeKind::Citation | EnvelopeKind::ToolResultImage => {
                None
            }
        }
    }
}

impl fmt::Display for EnvelopeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a block is cut into envelopes (DESIGN 4, "Size bound").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Every envelope's JSON object within the budget, escapes counted.
    Budget,
    /// Where the native formatter cuts: the delta's UTF-8 bytes *before* escaping against the budget minus the
    /// fixed part (the whole budget if that leaves under 64 bytes). Frontends read these types whole from one
    /// envelope, so their boundaries must match; a line may exceed the budget by its escapes (counted oversize).
    Native,
}

/// One field after `delta`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    /// Omitted when absent (or null, or an empty legacy attribute); a required field absent is written as `""`.
    pub optional: bool,
    /// A JSON number (legacy attributes carry it as text).
    pub number: bool,
}

const fn required(name: &'static str) -> Field {
    Field {
        name,
        optional: false,
        number: false,
    }
}

const fn optional(name: &'static str, number: bool) -> Field {
    Field {
        name,
        optional: true,
        number,
    }
}

const ID_NAME: [Field; 2] = [required("id"), required("name")];
const IMAGE: [Field; 4] = [
    required("id"),
    required("name"),
    required("src"),
    required("media_type"),
];
const CITATION: [Field; 9] = [
    required("citation_type"),
    optional("document_index", true),
    optional("document_title", false),
    optional("start_char_index", true),
    optional("end_char_index", true),
    optional("start_page_number", true),
    optional("end_page_number", true),
    optional("url", false),
    optional("title", false),
];

/// Which `json.dumps` call the native formatter makes for a payload (`envelope::pyjson` writes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyStyle {
    /// `json.dumps(v, ensure_ascii=False)`: non-ASCII characters as themselves.
    Unicode,
    /// `json.dumps(v)`: non-ASCII as `\uXXXX`.
    Ascii,
    /// `json.dumps(v, separators=(",", ":"))`: compact, non-ASCII as `\uXXXX`.
    CompactAscii,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        for k in EnvelopeKind::ALL {
            assert_eq!(EnvelopeKind::parse(k.as_str()), Some(k));
            assert_eq!(EnvelopeKind::ALL[k as usize], k);
        }
        assert_eq!(EnvelopeKind::parse("upstream_error"), None);
    }
}
