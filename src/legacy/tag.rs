//! Markup tokens of the legacy format: finding where a tag ends in a byte
//! stream, and reading its name and attributes (attributes via quick-xml).

use quick_xml::events::BytesStart;
use quick_xml::parser::{ElementParser, Parser as _};

use super::escape::{attr_value, AttrError, Escape};

/// Incremental search for the `>` that ends a tag, outside quoted values: quick-xml's own `ElementParser`, fed
/// only the bytes it has not seen (it keeps the quote state between calls).
#[derive(Debug, Clone)]
pub struct TagScan {
    parser: ElementParser,
    scanned: usize,
}

impl Default for TagScan {
    fn default() -> Self {
        Self {
            parser: ElementParser::Outside,
            scanned: 0,
        }
    }
}

impl TagScan {
    /// `tag` starts at its `<`. Returns the tag's length (through `>`) once
    /// complete.
    pub fn end(&mut self, tag: &[u8]) -> Option<usize> {
        // Clamped: the caller may have dropped bytes it had shown us.
        let from = self.scanned.clamp(1, tag.len().max(1));
        self.scanned = tag.len();
        self.parser.feed(tag.get(from..)?).map(|i| from + i + 1)
    }
}

/// A complete tag, read once: its kind, name, length in the input, and its attributes decoded with the escape
/// the reader chose for that name.
#[derive(Debug)]
pub struct ReadTag {
    pub kind: TagKind,
    pub name: String,
    pub len: usize,
    pub attrs: Result<Vec<(String, String)>, TagError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagKind {
    Open,
    Close,
    /// `<name …/>`
    Empty,
}

/// A complete tag.
#[derive(Debug)]
pub struct Tag<'a> {
    pub kind: TagKind,
    pub name: &'a str,
    /// Everything between `<` and `>` (or `/>`), name included.
    content: &'a str,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TagError {
    #[error("a DOCTYPE or other declaration is not allowed")]
    Declaration,
    #[error("malformed tag")]
    Malformed,
    #[error("tag is not UTF-8")]
    Utf8,
    #[error("attribute {name}: {source}")]
    Attribute { name: String, source: AttrError },
    #[error("bad attribute: {0}")]
    AttributeSyntax(String),
}

impl<'a> Tag<'a> {
    /// Reads a complete tag `<…>`.
    pub fn parse(raw: &'a [u8]) -> Result<Self, TagError> {
        let inner = raw
            .strip_prefix(b"<")
            .and_then(|r| r.strip_suffix(b">"))
            .ok_or(TagError::Malformed)?;
        if inner.first() == Some(&b'!') || inner.first() == Some(&b'?') {
            return Err(TagError::Declaration);
        }
        let (kind, inner) = if let Some(rest) = inner.strip_prefix(b"/") {
            (TagKind::Close, rest)
        } else if let Some(rest) = inner.strip_suffix(b"/") {
            (TagKind::Empty, rest)
        } else {
            (TagKind::Open, inner)
        };
        let content = std::str::from_utf8(inner).map_err(|_| TagError::Utf8)?;
        let name_len = content
            .find(|c: char| c.is_ascii_whitespace() || c == '/')
            .unwrap_or(content.len());
        let name = &content[..name_len];
        if name.is_empty() || name.contains(['<', '>', '"', '\'', '=']) {
            return Err(TagError::Malformed);
        }
        if kind == TagKind::Close && !content[name_len..].trim().is_empty() {
            return Err(TagError::Malformed);
        }
        Ok(Self { kind, name, content })
    }

    /// The attributes, in order, with values decoded (`escape` first, then
    /// entities).
    pub fn attributes(&self, escape: Escape) -> Result<Vec<(String, String)>, TagError> {
        let start = BytesStart::from_content(self.content, self.name.len());
        let mut out = Vec::new();
        for attr in start.attributes().with_checks(true) {
            let attr = attr.map_err(|e| TagError::AttributeSyntax(e.to_string()))?;
            let key = String::from_utf8_lossy(attr.key.as_ref()).into_owned();
            let value = attr_value(escape, &attr.value).map_err(|source| TagError::Attribute {
                name: key.clone(),
                source,
            })?;
            out.push((key, value));
        }
        Ok(out)
    }
}

/// An opening tag whose attributes were decoded: what an item is built from.
#[derive(Debug)]
pub struct Element {
    pub name: String,
    pub attrs: Vec<(String, String)>,
}

impl Element {
    /// The value of attribute `key`, if present.
    pub fn attr(&self, key: &str) -> Option<&str> {
        attr(&self.attrs, key)
    }
}

/// Looks up an attribute by name.
pub fn attr<'v>(attrs: &'v [(String, String)], name: &str) -> Option<&'v str> {
    attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_end_skips_quoted_gt_and_resumes() {
        let tag = br#"<a x="1>2" y='>'>rest"#;
        let mut scan = TagScan::default();
        assert_eq!(scan.end(&tag[..8]), None);
        assert_eq!(scan.end(&tag[..15]), None);
        assert_eq!(scan.end(tag), Some(17));
    }

    #[test]
    fn tags_parse_with_their_attributes() {
        let t = Tag::parse(br#"<content-block-tool_call id="t1" name="f" arguments="{&quot;a&quot;:1}">"#).unwrap();
        assert_eq!((t.kind, t.name), (TagKind::Open, "content-block-tool_call"));
        let attrs = t.attributes(Escape::Formatter).unwrap();
        assert_eq!(attr(&attrs, "arguments"), Some(r#"{"a":1}"#));
        assert_eq!(Tag::parse(b"</x>").unwrap().kind, TagKind::Close);
        assert_eq!(Tag::parse(b"<image src=\"a\" />").unwrap().kind, TagKind::Empty);
        assert_eq!(Tag::parse(b"<!DOCTYPE x>").unwrap_err(), TagError::Declaration);
        assert!(Tag::parse(br#"<x a="&custom;">"#)
            .unwrap()
            .attributes(Escape::None)
            .is_err());
        assert!(Tag::parse(br#"<x a="1" a="2">"#)
            .unwrap()
            .attributes(Escape::None)
            .is_err());
    }
}
