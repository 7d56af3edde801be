//! What each legacy tag opens (DESIGN 3.2) and the rules that follow from it, in one table: the escape of its
//! attributes and body (3.3), whether it may stand alone as one event inside an open text block (3.6), and the
//! envelope type it becomes. Every other module asks this one.

use super::escape::Escape;
use crate::protocol::EnvelopeKind;

/// The legacy items, by what their tag opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemKind {
    /// `content-block-text` / `-thinking`: streamed model text.
    Streamed(EnvelopeKind),
    MetaInit,
    /// `meta_final`, `awaiting_frontend_tools`: content in the `data` attribute.
    DataAttribute(EnvelopeKind),
    /// `content-block-tool_call` / `-server_tool_call`: content in the `arguments` attribute.
    ToolCall(EnvelopeKind),
    /// `content-block-tool_result`: the client's result, CDATA or `<text>`/`<image>` children.
    ClientToolResult,
    /// `content-block-server_tool_result` and any `content-block-*_tool_result`.
    ServerToolResult,
    /// `content-block-error`, `content-block-meta_files`: a CDATA body.
    Body(EnvelopeKind),
    Citations,
    /// A tag the format does not have (counted; its content is text or dropped).
    Unknown,
}

impl ItemKind {
    /// The item a tag name opens.
    pub fn of(name: &str) -> Self {
        match name {
            "content-block-text" => ItemKind::Streamed(EnvelopeKind::Text),
            "content-block-thinking" => ItemKind::Streamed(EnvelopeKind::Thinking),
            "meta_init" => ItemKind::MetaInit,
            "meta_final" => ItemKind::DataAttribute(EnvelopeKind::MetaFinal),
            "awaiting_frontend_tools" => ItemKind::DataAttribute(EnvelopeKind::AwaitingFrontendTools),
            "content-block-tool_call" => ItemKind::ToolCall(EnvelopeKind::ToolCall),
            "content-block-server_tool_call" => ItemKind::ToolCall(EnvelopeKind::ServerToolCall),
            "content-block-tool_result" => ItemKind::ClientToolResult,
            "content-block-error" => ItemKind::Body(EnvelopeKind::Error),
            "content-block-meta_files" => ItemKind::Body(EnvelopeKind::MetaFiles),
            "citations" => ItemKind::Citations,
            n if n.starts_with("content-block-") && n.ends_with("_tool_result") => ItemKind::ServerToolResult,
            _ => ItemKind::Unknown,
        }
    }

    /// The tag name of an item whose content is all in its attributes (its close tag must follow); `None` for
    /// items with a body.
    pub fn attribute_item_name(self) -> Option<&'static str> {
        match self {
            ItemKind::MetaInit => Some("meta_init"),
            ItemKind::DataAttribute(EnvelopeKind::MetaFinal) => Some("meta_final"),
            ItemKind::DataAttribute(_) => Some("awaiting_frontend_tools"),
            ItemKind::ToolCall(EnvelopeKind::ToolCall) => Some("content-block-tool_call"),
            ItemKind::ToolCall(_) => Some("content-block-server_tool_call"),
            _ => None,
        }
    }

    /// The backslash escape its attribute values went through (DESIGN 3.3): none for the agent items and the
    /// client's tool result, the formatter's double escape for everything the formatter wrote.
    pub fn attribute_escape(self) -> Escape {
        match self {
            ItemKind::MetaInit | ItemKind::DataAttribute(_) | ItemKind::ClientToolResult => Escape::None,
            _ => Escape::Formatter,
        }
    }

    /// The backslash escape its body went through (DESIGN 3.3).
    pub fn body_escape(self) -> Escape {
        match self {
            ItemKind::ClientToolResult => Escape::Client,
            ItemKind::Body(EnvelopeKind::MetaFiles) => Escape::None,
            _ => Escape::Formatter,
        }
    }

    /// Whether an event that is exactly this one complete item is that item even inside an open text block
    /// (DESIGN 3.6: the backend can send an error, a tool call or result mid-block). Text blocks and unknown
    /// tags are text there.
    pub fn stands_alone_in_text(self) -> bool {
        !matches!(self, ItemKind::Streamed(_) | ItemKind::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_of_design_3_2_has_its_kind() {
        for (name, kind) in [
            ("content-block-text", ItemKind::Streamed(EnvelopeKind::Text)),
            ("meta_init", ItemKind::MetaInit),
            (
                "awaiting_frontend_tools",
                ItemKind::DataAttribute(EnvelopeKind::AwaitingFrontendTools),
            ),
            (
                "content-block-server_tool_call",
                ItemKind::ToolCall(EnvelopeKind::ServerToolCall),
            ),
            ("content-block-tool_result", ItemKind::ClientToolResult),
            ("content-block-server_tool_result", ItemKind::ServerToolResult),
            ("content-block-web_search_tool_result", ItemKind::ServerToolResult),
            ("content-block-meta_files", ItemKind::Body(EnvelopeKind::MetaFiles)),
            ("citations", ItemKind::Citations),
            ("chart", ItemKind::Unknown),
            ("content-block-tool_results", ItemKind::Unknown),
        ] {
            assert_eq!(ItemKind::of(name), kind, "{name}");
        }
    }

    #[test]
    fn attribute_items_name_their_own_close_tag() {
        for name in [
            "meta_init",
            "meta_final",
            "awaiting_frontend_tools",
            "content-block-tool_call",
            "content-block-server_tool_call",
        ] {
            assert_eq!(ItemKind::of(name).attribute_item_name(), Some(name));
        }
        assert_eq!(ItemKind::of("content-block-error").attribute_item_name(), None);
    }

    #[test]
    fn escapes_follow_design_3_3() {
        assert_eq!(ItemKind::of("meta_final").attribute_escape(), Escape::None);
        assert_eq!(
            ItemKind::of("content-block-tool_call").attribute_escape(),
            Escape::Formatter
        );
        assert_eq!(ItemKind::of("content-block-tool_result").body_escape(), Escape::Client);
        assert_eq!(ItemKind::of("content-block-meta_files").body_escape(), Escape::None);
        assert_eq!(ItemKind::of("content-block-error").body_escape(), Escape::Formatter);
    }
}
