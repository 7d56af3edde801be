//! The escapes the backend applies, per item kind (DESIGN 3.3), undone.
//!
//! - Formatter items: `\` was doubled, then newlines became `\n`. Undo in one
//!   left-to-right pass: `\\` → `\`, `\n` → LF, any other `\x` kept.
//! - Client tool results: newlines became `\n`, backslashes not doubled.
//!   Undo: `\n` → LF only.
//! - Attribute values: HTML-escaped; undone by quick-xml, which knows the XML
//!   entities and numeric references and never expands anything else.
//!
//! The streaming forms keep a trailing lone `\` until the next piece shows
//! what follows it.

use std::borrow::Cow;

use memchr::memchr;

/// Which backslash escape an item went through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escape {
    /// Double escape of formatter items.
    Formatter,
    /// Newline-only escape of client tool results.
    Client,
    /// No backslash escape (meta_init, meta_final, meta_files, …).
    None,
}

/// Incremental backslash unescaper.
#[derive(Debug, Clone)]
pub struct Unescaper {
    escape: Escape,
    /// A `\` ended the previous piece.
    pending: bool,
}

impl Unescaper {
    pub fn new(escape: Escape) -> Self {
        Self { escape, pending: false }
    }

    /// Unescapes `piece`, appending to `out`.
    pub fn push(&mut self, piece: &[u8], out: &mut Vec<u8>) {
        if self.escape == Escape::None {
            out.extend_from_slice(piece);
            return;
        }
        let mut i = 0;
        if self.pending {
            let Some(&next) = piece.first() else { return };
            self.pending = false;
            i = self.pair(next, out);
        }
        while let Some(off) = memchr(b'\\', &piece[i..]) {
            let bs = i + off;
            out.extend_from_slice(&piece[i..bs]);
            let Some(&next) = piece.get(bs + 1) else {
                self.pending = true;
                return;
            };
            i = bs + 1 + self.pair(next, out);
        }
        out.extend_from_slice(&piece[i..]);
    }

    /// Writes what `\` followed by `next` stands for; returns how many bytes
    /// of `next` that used (0 when `next` is to be scanned again).
    fn pair(&self, next: u8, out: &mut Vec<u8>) -> usize {
        match (self.escape, next) {
            (_, b'n') => {
                out.push(b'\n');
                1
            }
            (Escape::Formatter, b'\\') => {
                out.push(b'\\');
                1
            }
            (Escape::Formatter, x) => {
                out.extend_from_slice(&[b'\\', x]);
                1
            }
            // Client (and None, never reached): a backslash is itself.
            _ => {
                out.push(b'\\');
                0
            }
        }
    }

    /// Whether `piece` would come out unchanged (no backslash in it, none
    /// pending), so a caller may skip the copy.
    pub fn is_identity(&self, piece: &[u8]) -> bool {
        self.escape == Escape::None || (!self.pending && memchr(b'\\', piece).is_none())
    }

    /// End of the content: a lone trailing `\` stands for itself.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if std::mem::take(&mut self.pending) {
            out.push(b'\\');
        }
    }
}

/// Undoes a backslash escape on a complete value.
pub fn unescape_all(escape: Escape, raw: &[u8]) -> Cow<'_, [u8]> {
    if escape == Escape::None || memchr(b'\\', raw).is_none() {
        return Cow::Borrowed(raw);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut u = Unescaper::new(escape);
    u.push(raw, &mut out);
    u.finish(&mut out);
    Cow::Owned(out)
}

/// Why an attribute value could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AttrError {
    #[error("attribute value is not UTF-8")]
    Utf8,
    #[error("{0}")]
    Entity(String),
}

/// Decodes an attribute value: the backslash escape first (it was applied
/// last), then HTML entities.
pub fn attr_value(escape: Escape, raw: &[u8]) -> Result<String, AttrError> {
    let unescaped = unescape_all(escape, raw);
    let s = std::str::from_utf8(&unescaped).map_err(|_| AttrError::Utf8)?;
    quick_xml::escape::unescape(s)
        .map(Cow::into_owned)
        .map_err(|e| AttrError::Entity(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn streamed(escape: Escape, pieces: &[&[u8]]) -> Vec<u8> {
        let mut u = Unescaper::new(escape);
        let mut out = Vec::new();
        for p in pieces {
            u.push(p, &mut out);
        }
        u.finish(&mut out);
        out
    }

    #[test]
    fn formatter_escape_is_undone_left_to_right() {
        assert_eq!(&*unescape_all(Escape::Formatter, br"a\\nb"), br"a\nb");
        assert_eq!(&*unescape_all(Escape::Formatter, br"a\nb"), b"a\nb");
        assert_eq!(&*unescape_all(Escape::Formatter, br"\\\n"), b"\\\n");
        assert_eq!(&*unescape_all(Escape::Formatter, br"\t\"), br"\t\");
    }

    #[test]
    fn client_escape_only_turns_backslash_n_into_newline() {
        assert_eq!(&*unescape_all(Escape::Client, br"a\\nb"), b"a\\\nb");
        assert_eq!(&*unescape_all(Escape::Client, br"C:\dir\n"), b"C:\\dir\n");
    }

    #[test]
    fn every_split_unescapes_alike() {
        for escape in [Escape::Formatter, Escape::Client] {
            let input: &[u8] = br"x\\\n\\y\nz\q\";
            let whole = streamed(escape, &[input]);
            for i in 0..=input.len() {
                for j in i..=input.len() {
                    assert_eq!(
                        streamed(escape, &[&input[..i], &input[i..j], &input[j..]]),
                        whole,
                        "{i} {j}"
                    );
                }
            }
        }
    }

    #[test]
    fn attributes_decode_backslashes_then_entities() {
        assert_eq!(
            attr_value(Escape::Formatter, br"{&quot;a&quot;:&quot;x\\ny&quot;}").unwrap(),
            r#"{"a":"x\ny"}"#
        );
        assert_eq!(attr_value(Escape::None, b"&#x27;&amp;&lt;&#60;").unwrap(), "'&<<");
        assert!(matches!(attr_value(Escape::None, b"&nbsp;"), Err(AttrError::Entity(_))));
    }
}
